// SPDX-License-Identifier: MIT
//
// Write-commit (docs/design.md §3: commit, immediate, ordered) through public
// verbs, in one process: devices on 127.0.1.11 / 127.0.1.12 (used by no other
// test).  Every test runs three times: with the native opcodes (the peer
// declared IBV_COMMIT_CAP_NATIVE, or the two QPs agreed on them through ECE
// as librdmacm drives it) and with the IBTA fallback sequences, which must
// keep exactly the same promises.  The engine's test persistence hook shows
// what was made durable, and when.
#include "persist_log.hpp"

#include <infiniband/verbs_ext.h>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];

// The IBTA path must stay one: two sroce ends that announce themselves agree
// on native commits in their first packets (test_wire_announce covers that).
[[maybe_unused]] const int g_quiet = setenv("SROCE_ANNOUNCE", "0", 1);

PersistLog g_log;

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new DevicePairEnv(
        "cm0", "127.0.1.11", "cm1", "127.0.1.12", g_ctx,
        [] { sroce_set_persist_hook(&PersistLog::hook, &g_log); },
        [] { sroce_set_persist_hook(nullptr, nullptr); }));

constexpr unsigned kFlushAccess = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;

// How the initiator learns that its peer executes native commits.
enum class Path { ibta, declared, ece };

// What librdmacm does with ECE: the active side's offer travels in REQ, the
// passive side keeps what it shares with it and answers in REP, and the
// active side takes the answer.
void negotiate_ece(ibv_qp *active, ibv_qp *passive) {
    ibv_ece req{}, rep{};
    ASSERT_EQ(ibv_query_ece(active, &req), 0);
    ASSERT_EQ(ibv_set_ece(passive, &req), 0);
    ASSERT_EQ(ibv_query_ece(passive, &rep), 0);
    ASSERT_EQ(ibv_set_ece(active, &rep), 0);
}

[[maybe_unused]] void PrintTo(Path p, std::ostream *os) {
    *os << (p == Path::ibta ? "ibta" : p == Path::declared ? "declared" : "ece");
}

class Commit : public ::testing::TestWithParam<Path> {
  protected:
    void make(unsigned b_access = kAllAccess | kFlushAccess) {
        PairOpts o;
        o.qp_ex = true;
        o.extra_send_ops = IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
        o.sq_sig_all = false;
        o.b_access = b_access;
        ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o));
        ibv_commit_caps caps{};
        ASSERT_EQ(ibv_query_commit_caps(g_ctx[1], &caps), 0);
        if (GetParam() == Path::declared) {
            ASSERT_EQ(ibv_qp_set_commit_peer(p.a.qp, caps.flags), 0);
        } else if (GetParam() == Path::ece) {
            ASSERT_NO_FATAL_FAILURE(negotiate_ece(p.a.qp, p.b.qp));
        }
        g_log.clear();
    }
    // One signaled write-commit of src[off, off+len) to raddr.
    int commit(Buf &src, size_t off, size_t len, uint64_t raddr, uint32_t rkey, uint32_t flags,
               uint64_t id, const uint32_t *imm = nullptr) {
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = id;
        q->wr_flags = IBV_SEND_SIGNALED;
        int rc = imm ? ibv_wr_rdma_write_commit_imm(q, rkey, raddr, flags, htonl(*imm))
                     : ibv_wr_rdma_write_commit(q, rkey, raddr, flags);
        if (rc) {
            ibv_wr_abort(q);
            return rc;
        }
        ibv_wr_set_sge(q, src.lkey(), src.addr(off), uint32_t(len));
        return ibv_wr_complete(q);
    }
    Pair p;
};

TEST(CommitCaps, DeviceReportsWhatItCanDo) {
    ibv_commit_caps caps{};
    ASSERT_EQ(ibv_query_commit_caps(g_ctx[0], &caps), 0);
    EXPECT_EQ(caps.flags & (IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED | IBV_COMMIT_CAP_IMMED |
                            IBV_COMMIT_CAP_FLUSH),
              uint32_t(IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED | IBV_COMMIT_CAP_IMMED |
                       IBV_COMMIT_CAP_FLUSH));
    EXPECT_TRUE(caps.flags & IBV_COMMIT_CAP_ANY_PEER);
    EXPECT_EQ(caps.atomicity_unit, 8u);
    EXPECT_TRUE(caps.persistence_methods & IBV_COMMIT_METHOD_MSYNC);
    EXPECT_TRUE(caps.persistence_methods & IBV_COMMIT_METHOD_FENCE);
    ibv_commit_caps bad{};
    bad.comp_mask = 1;
    EXPECT_EQ(ibv_query_commit_caps(g_ctx[0], &bad), EINVAL);
}

TEST(CommitCaps, QpWithoutTheSendOpHasNoCommitVerbs) {
    Pair q;
    PairOpts o;
    o.qp_ex = true;
    o.connect = false;
    ASSERT_NO_FATAL_FAILURE(q.setup(g_ctx[0], g_ctx[1], o));
    // rc_pair creates QPs with every send op but write-commit.
    errno = 0;
    EXPECT_EQ(ibv_qp_to_commit_ops(q.a.qpx), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    ibv_wr_start(q.a.qpx);
    EXPECT_EQ(ibv_wr_rdma_write_commit(q.a.qpx, 1, 0, 0), EOPNOTSUPP);
    ibv_wr_abort(q.a.qpx);
}

// sroce's ECE: vendor ID 0xFFFFFF, options the IBV_COMMIT_CAP_* flags of a
// reliable QP under the tag 0x5C in the top byte (docs/connection-manager.md).
// ECE is exchanged before the QPs connect.
void unconnected(Pair &q) {
    PairOpts o;
    o.connect = false;
    ASSERT_NO_FATAL_FAILURE(q.setup(g_ctx[0], g_ctx[1], o));
}

TEST(Ece, OffersTheCommitCapabilitiesOfReliableQps) {
    Pair q;
    ASSERT_NO_FATAL_FAILURE(unconnected(q));
    ibv_ece ece{};
    ASSERT_EQ(ibv_query_ece(q.a.qp, &ece), 0);
    EXPECT_EQ(ece.vendor_id, 0xFFFFFFu);
    EXPECT_EQ(ece.options, 0x5C000000u | IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED |
                               IBV_COMMIT_CAP_IMMED | IBV_COMMIT_CAP_FLUSH |
                               IBV_COMMIT_CAP_SELECTIVE_REPEAT);
    EXPECT_EQ(ece.comp_mask, 0u);

    ibv_cq *cq = ibv_create_cq(g_ctx[0], 4, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap = {1, 1, 1, 1, 0};
    ibv_qp *ud = ibv_create_qp(q.a.pd, &ia);
    ASSERT_NE(ud, nullptr);
    ASSERT_EQ(ibv_query_ece(ud, &ece), 0);
    EXPECT_EQ(ece.vendor_id, 0xFFFFFFu);
    EXPECT_EQ(ece.options, 0u) << "a UD QP has nothing to negotiate";
    ibv_destroy_qp(ud);
    ibv_destroy_cq(cq);
}

TEST(Ece, KeepsWhatBothSidesShareAndRefusesOtherVendors) {
    Pair q;
    ASSERT_NO_FATAL_FAILURE(unconnected(q));
    ibv_ece ece{};
    // Another vendor's options are no business of this provider's...
    ece.vendor_id = 0x02c9;
    ece.options = 0x5C00000F;
    errno = 0;
    EXPECT_EQ(ibv_set_ece(q.a.qp, &ece), EINVAL);
    EXPECT_EQ(errno, EINVAL);
    ece.vendor_id = 0;
    EXPECT_EQ(ibv_set_ece(q.a.qp, &ece), EOPNOTSUPP) << "as libibverbs answers vendor ID 0";
    ece.vendor_id = 0xFFFFFF;
    ece.comp_mask = 1;
    EXPECT_EQ(ibv_set_ece(q.a.qp, &ece), EINVAL);
    // ...nothing agreed yet, so the QP still offers everything.
    ASSERT_EQ(ibv_query_ece(q.a.qp, &ece), 0);
    EXPECT_EQ(ece.options, 0x5C00002Fu);

    struct Case {
        uint32_t peer, agreed;
    } cases[] = {
        {0x5C000001, 0x5C000001}, // native only
        {0x5C0000FF, 0x5C00002F}, // bits sroce does not know are dropped
        {0x5C000020, 0x5C000020}, // selective repeat only: IBTA sequences for commits
        {0x0000000F, 0},          // untagged: another implementation's options
        {0x5D00000F, 0},          // another tag
        {0x5C000000, 0},          // tagged but nothing in common
        {0, 0},                   // what librdmacm sets for a peer without ECE
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.peer);
        ece = {};
        ece.vendor_id = 0xFFFFFF;
        ece.options = c.peer;
        ASSERT_EQ(ibv_set_ece(q.a.qp, &ece), 0);
        ece = {};
        ASSERT_EQ(ibv_query_ece(q.a.qp, &ece), 0);
        EXPECT_EQ(ece.vendor_id, 0xFFFFFFu);
        EXPECT_EQ(ece.options, c.agreed);
    }
}

TEST_P(Commit, CompletesOnlyWhenTheWriteIsDurable) {
    make();
    FileMr dst(p.b.pd, 1 << 20, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok()) << std::strerror(errno);
    Buf src(p.a.pd, 1 << 20);
    src.fill(5);
    for (size_t len : {size_t(1), size_t(64), size_t(4096), size_t(300001)}) {
        SCOPED_TRACE(len);
        g_log.clear();
        ASSERT_EQ(commit(src, 0, len, dst.addr(4096), dst.rkey(), 0, len), 0);
        expect_one(p.a.scq,
                   {len, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), int64_t(len)});
        EXPECT_TRUE(g_log.covers(dst.data() + 4096, len));
        Pair::sync_with(p.b);
        EXPECT_TRUE(same_bytes(dst.data() + 4096, src.data(), len));
    }
}

// "...and all earlier writes on the same QP to the same R_Key", and nothing
// of other R_Keys.
TEST_P(Commit, CoversEarlierWritesToTheRkeyOnly) {
    make();
    FileMr r1(p.b.pd, 65536, kAllAccess | kFlushAccess),
        r2(p.b.pd, 65536, kAllAccess | kFlushAccess);
    ASSERT_TRUE(r1.ok() && r2.ok());
    Buf src(p.a.pd, 65536);
    src.fill(9);
    ASSERT_EQ(post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 1000)}, r1.addr(0), r1.rkey(), 0),
              0);
    ASSERT_EQ(
        post_rdma(p.a.qp, 2, IBV_WR_RDMA_WRITE, {src.sge(0, 3000)}, r1.addr(20000), r1.rkey(), 0),
        0);
    ASSERT_EQ(post_rdma(p.a.qp, 3, IBV_WR_RDMA_WRITE, {src.sge(0, 500)}, r2.addr(0), r2.rkey(), 0),
              0);
    ASSERT_EQ(commit(src, 100, 64, r1.addr(40000), r1.rkey(), 0, 4), 0);
    expect_one(p.a.scq, {4, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 64});
    EXPECT_TRUE(g_log.covers(r1.data(), 1000));
    EXPECT_TRUE(g_log.covers(r1.data() + 20000, 3000));
    EXPECT_TRUE(g_log.covers(r1.data() + 40000, 64));
    EXPECT_FALSE(g_log.touches(r2.data(), 65536)) << "a commit on one rkey persisted another";
}

// Earlier writes are kept for a commit as places in the MR, not as host
// addresses: after rereg_mr moves the translation, the commit persists what
// the MR maps now and never flushes memory that is no longer the MR's.
TEST_P(Commit, PersistsThroughTheMappingTheMrHasNow) {
    make();
    FileMr r1(p.b.pd, 65536, kAllAccess | kFlushAccess), moved(65536);
    ASSERT_TRUE(r1.ok() && moved.data());
    Buf src(p.a.pd, 65536);
    src.fill(4);
    ASSERT_EQ(post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 1000)}, r1.addr(0), r1.rkey()),
              0);
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn(), 1000});
    ASSERT_EQ(
        ibv_rereg_mr(r1.mr(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, moved.data(), 65536, 0), 0);
    g_log.clear();
    ASSERT_EQ(commit(src, 0, 64, moved.addr(40000), r1.rkey(), 0, 2), 0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 64});
    EXPECT_TRUE(g_log.covers(moved.data() + 40000, 64));
    EXPECT_FALSE(g_log.touches(r1.data(), 65536)) << "a commit flushed the MR's old mapping";
}

// IMMED: the target learns, through a receive completion carrying the
// immediate data, that the write is durable.
TEST_P(Commit, ImmediateArrivesOnlyAfterDurability) {
    make();
    FileMr dst(p.b.pd, 65536, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 65536);
    src.fill(13);
    Buf rbuf(p.b.pd, 64);
    ASSERT_EQ(post_recv(p.b.qp, 77, {rbuf.sge(0, 64)}), 0);
    uint32_t imm = 0xC0FFEE;
    ASSERT_EQ(commit(src, 0, 10000, dst.addr(0), dst.rkey(), 0, 5, &imm), 0);
    std::vector<ibv_wc> rc = poll_n(p.b.rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].wr_id, 77u);
    EXPECT_EQ(rc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_TRUE(rc[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(ntohl(rc[0].imm_data), imm);
    EXPECT_EQ(rc[0].byte_len, 0u) << "the same on the native and the IBTA path";
    // By the time the target sees the immediate, the data is durable.
    EXPECT_TRUE(g_log.covers(dst.data(), 10000));
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 10000));
    expect_one(p.a.scq, {5, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 10000});
}

// ORDERED: earlier writes to the rkey are durable before this write's data
// is placed.  The persistence hook samples the commit word each time it
// persists something: when the log record became durable, the commit word
// must not yet have been written.
TEST_P(Commit, OrderedMakesEarlierWritesDurableBeforePlacing) {
    make();
    FileMr log(p.b.pd, 1 << 20, kAllAccess | kFlushAccess);
    ASSERT_TRUE(log.ok());
    Buf src(p.a.pd, 1 << 20);
    src.fill(17);
    auto *word = reinterpret_cast<uint64_t *>(log.data());
    for (uint64_t round = 1; round <= 10; round++) {
        SCOPED_TRACE(round);
        {
            std::lock_guard<std::mutex> g(g_log.mu);
            g_log.events.clear();
            g_log.probe_at = word;
        }
        size_t off = 4096 * round * 8;
        ASSERT_EQ(post_rdma(p.a.qp, round, IBV_WR_RDMA_WRITE, {src.sge(off, 20000)}, log.addr(off),
                            log.rkey(), 0),
                  0);
        Buf rec(p.a.pd, 8);
        rec.word(0) = round;
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = 100 + round;
        q->wr_flags = IBV_SEND_SIGNALED;
        ASSERT_EQ(ibv_wr_rdma_write_commit(q, log.rkey(), log.addr(0), IBV_WRITE_COMMIT_ORDERED),
                  0);
        ibv_wr_set_sge(q, rec.lkey(), rec.addr(), 8);
        ASSERT_EQ(ibv_wr_complete(q), 0);
        expect_one(p.a.scq, {100 + round, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 8});
        std::lock_guard<std::mutex> g(g_log.mu);
        bool saw_record = false;
        for (const PersistLog::Event &e : g_log.events) {
            if (e.lo <= uintptr_t(log.data() + off) &&
                e.hi >= uintptr_t(log.data() + off + 20000)) {
                saw_record = true;
                EXPECT_EQ(e.probe, round - 1) << "the commit word was placed before the record "
                                                 "it orders after was durable";
                break;
            }
        }
        EXPECT_TRUE(saw_record);
        g_log.probe_at = nullptr;
    }
}

// The control for the test above: without ORDERED the commit word may be
// placed before the record is durable, and the probe does see that, so the
// ordered test cannot pass vacuously.
TEST_P(Commit, WithoutOrderedTheProbeSeesTheWordPlacedFirst) {
    make();
    FileMr log(p.b.pd, 1 << 20, kAllAccess | kFlushAccess);
    ASSERT_TRUE(log.ok());
    Buf src(p.a.pd, 1 << 20);
    auto *word = reinterpret_cast<uint64_t *>(log.data());
    {
        std::lock_guard<std::mutex> g(g_log.mu);
        g_log.events.clear();
        g_log.probe_at = word;
    }
    ASSERT_EQ(post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(65536, 20000)}, log.addr(65536),
                        log.rkey(), 0),
              0);
    Buf rec(p.a.pd, 8);
    rec.word(0) = 42;
    ASSERT_EQ(commit(rec, 0, 8, log.addr(0), log.rkey(), 0, 2), 0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 8});
    std::lock_guard<std::mutex> g(g_log.mu);
    bool placed_first = false;
    for (const PersistLog::Event &e : g_log.events)
        if (e.lo <= uintptr_t(log.data() + 65536) && e.hi >= uintptr_t(log.data() + 85536))
            placed_first |= e.probe == 42;
    EXPECT_TRUE(placed_first);
    g_log.probe_at = nullptr;
}

TEST_P(Commit, GlobalVisibilityOnVolatileMemory) {
    make();
    Buf dst(p.b.pd, 8192, kAllAccess | IBV_ACCESS_FLUSH_GLOBAL);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 8192);
    src.fill(23);
    ASSERT_EQ(commit(src, 0, 8192, dst.addr(), dst.rkey(), IBV_WRITE_COMMIT_GLOBAL, 6), 0);
    expect_one(p.a.scq, {6, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 8192});
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 8192));
}

// Persistence asked of memory registered for global visibility only: the
// same Remote Access Error on both paths, and exactly one completion.
TEST_P(Commit, PersistentCommitToAGlobalOnlyMrIsRemoteAccessError) {
    make();
    Buf dst(p.b.pd, 8192, kAllAccess | IBV_ACCESS_FLUSH_GLOBAL);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 64);
    ASSERT_EQ(commit(src, 0, 64, dst.addr(), dst.rkey(), 0, 7), 0);
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 7u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_TRUE(drain(p.a.scq, 100ms).empty()) << "one commit, one completion";
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_ERR);
}

TEST_P(Commit, TargetQpWithoutFlushAccessIsInvalidRequest) {
    make(kAllAccess);
    FileMr dst(p.b.pd, 8192, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 64);
    ASSERT_EQ(commit(src, 0, 64, dst.addr(), dst.rkey(), 0, 8), 0);
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_TRUE(drain(p.a.scq, 100ms).empty());
}

TEST_P(Commit, UnknownFlagsFailTheBatch) {
    make();
    Buf src(p.a.pd, 64);
    ibv_qp_ex *q = p.a.qpx;
    ibv_wr_start(q);
    ASSERT_EQ(ibv_wr_rdma_write_commit(q, 1, 0, 1u << 7), 0);
    ibv_wr_set_sge(q, src.lkey(), src.addr(), 64);
    EXPECT_EQ(ibv_wr_complete(q), EINVAL);
    EXPECT_TRUE(drain(p.a.scq, 50ms).empty());
}

TEST_P(Commit, ManyCommitsInFlight) {
    make();
    FileMr dst(p.b.pd, 1 << 20, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 1 << 20);
    src.fill(31);
    for (uint64_t i = 0; i < 32; i++) {
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = i;
        q->wr_flags = IBV_SEND_SIGNALED;
        ASSERT_EQ(ibv_wr_rdma_write_commit(q, dst.rkey(), dst.addr(i * 8192), 0), 0);
        ibv_wr_set_sge(q, src.lkey(), src.addr(i * 8192), 8192);
        ASSERT_EQ(ibv_wr_complete(q), 0);
    }
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 32);
    ASSERT_EQ(wc.size(), 32u);
    for (uint64_t i = 0; i < 32; i++)
        expect_wc(wc[i], {i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 8192});
    EXPECT_TRUE(g_log.covers(dst.data(), 32 * 8192));
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 32 * 8192));
}

// IBV_ACCESS_UNCACHED: writes and commits land byte-exact through the
// non-temporal placement path, and the commit still makes them durable.
TEST_P(Commit, UncachedRegionTakesWritesAndCommits) {
    make();
    FileMr dst(p.b.pd, 1 << 20, kAllAccess | kFlushAccess | IBV_ACCESS_UNCACHED);
    ASSERT_TRUE(dst.ok()) << std::strerror(errno);
    Buf src(p.a.pd, 1 << 20);
    src.fill(37);
    ASSERT_EQ(
        post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(1, 70001)}, dst.addr(3), dst.rkey(), 0),
        0);
    ASSERT_EQ(commit(src, 100000, 5000, dst.addr(100000), dst.rkey(), 0, 2), 0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 5000});
    EXPECT_TRUE(g_log.covers(dst.data() + 3, 70001));
    EXPECT_TRUE(g_log.covers(dst.data() + 100000, 5000));
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data() + 3, src.data() + 1, 70001));
    EXPECT_TRUE(same_bytes(dst.data() + 100000, src.data() + 100000, 5000));
}

// ATOMIC WRITE is ordered after earlier writes but is not itself a flush:
// nothing becomes durable until a FLUSH or a commit asks for it.
TEST_P(Commit, AtomicWriteIsNotItselfAFlush) {
    make();
    FileMr dst(p.b.pd, 65536, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 4096);
    src.fill(41);
    ASSERT_EQ(
        post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 4096)}, dst.addr(8192), dst.rkey(), 0),
        0);
    uint64_t v = 7;
    ibv_qp_ex *q = p.a.qpx;
    ibv_wr_start(q);
    q->wr_id = 2;
    q->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(q, dst.rkey(), dst.addr(0), &v);
    ASSERT_EQ(ibv_wr_complete(q), 0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE, p.a.qpn()});
    EXPECT_FALSE(g_log.touches(dst.data(), 65536));
    // The next commit to the rkey makes both durable.
    ASSERT_EQ(commit(src, 0, 8, dst.addr(16), dst.rkey(), 0, 3), 0);
    expect_one(p.a.scq, {3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, p.a.qpn(), 8});
    EXPECT_TRUE(g_log.covers(dst.data() + 8192, 4096));
    EXPECT_TRUE(g_log.covers(dst.data(), 8)) << "the ATOMIC WRITE is an earlier write too";
    EXPECT_TRUE(g_log.covers(dst.data() + 16, 8));
}

INSTANTIATE_TEST_SUITE_P(Paths, Commit, ::testing::Values(Path::declared, Path::ece, Path::ibta),
                         [](const ::testing::TestParamInfo<Path> &i) {
                             return i.param == Path::ibta       ? "ibta_fallback"
                                    : i.param == Path::declared ? "native"
                                                                : "native_by_ece";
                         });

} // namespace
