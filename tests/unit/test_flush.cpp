// SPDX-License-Identifier: MIT
//
// IBTA FLUSH and ATOMIC WRITE (Annex A19) through public verbs, in one
// process: two sroce devices on 127.0.1.5 / 127.0.1.6 (used by no other
// test).  Each promise of docs/design.md §3 about these two verbs has a test here,
// the negative ones included.
#include "persist_log.hpp"

#include <fcntl.h>
#include <infiniband/verbs_ext.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("fl0", "127.0.1.5", "fl1", "127.0.1.6", g_ctx));

constexpr unsigned kFlushAccess = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;

class Flush : public ::testing::Test {
  protected:
    void make(unsigned b_access = kAllAccess | kFlushAccess) {
        PairOpts o;
        o.qp_ex = true;
        o.sq_sig_all = false;
        o.b_access = b_access;
        ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o));
    }
    // WRITE of `src` to raddr, then FLUSH, as one ibv_wr_* batch.
    int write_then_flush(Buf &src, size_t len, uint64_t raddr, uint32_t rkey, uint64_t flush_addr,
                         size_t flush_len, uint8_t type, uint8_t level) {
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = 1;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(q, rkey, raddr);
        ibv_wr_set_sge(q, src.lkey(), src.addr(), uint32_t(len));
        q->wr_id = 2;
        ibv_wr_flush(q, rkey, flush_addr, flush_len, type, level);
        return ibv_wr_complete(q);
    }
    // One signaled ATOMIC WRITE / FLUSH as its own ibv_wr_* batch.
    int atomic_write(uint64_t id, uint32_t rkey, uint64_t raddr, uint64_t value) {
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = id;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_write(q, rkey, raddr, &value);
        return ibv_wr_complete(q);
    }
    int flush(uint64_t id, uint32_t rkey, uint64_t raddr, size_t len, uint8_t type, uint8_t level) {
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = id;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_flush(q, rkey, raddr, len, type, level);
        return ibv_wr_complete(q);
    }
    // The status of the next send completion (failing the test if none comes).
    ibv_wc_status next_status() {
        std::vector<ibv_wc> wc = poll_n(p.a.scq, 1);
        EXPECT_EQ(wc.size(), 1u);
        return wc.empty() ? ibv_wc_status(-1) : wc[0].status;
    }
    Pair p;
};

TEST(FlushCaps, DeviceReportsFlushAndAtomicWrite) {
    ibv_device_attr_ex a{};
    ASSERT_EQ(ibv_query_device_ex(g_ctx[0], nullptr, &a), 0);
    EXPECT_TRUE(a.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_GLOBAL);
    EXPECT_TRUE(a.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_PERSISTENT);
    EXPECT_TRUE(a.device_cap_flags_ex & IB_UVERBS_DEVICE_ATOMIC_WRITE);
}

// Programs built against rdma-core >= 45 read wr_flush right after
// wr_atomic_write, and librpma probes it for NULL.
TEST_F(Flush, QpExHasWrFlushWhereUpstreamPutsIt) {
    make();
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
    ibv_qp_ex *x = p.a.qpx;
    auto *atomic_write = &x->wr_atomic_write;
#else
    // The system's ibv_qp_ex ends earlier; verbs_ext.h describes the rest.
    auto *x = reinterpret_cast<ibv_qp_ex_flush *>(p.a.qpx);
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
    auto *atomic_write = &x->qpx.wr_atomic_write;
#else
    auto *atomic_write = &x->wr_atomic_write;
#endif
#endif
    EXPECT_NE(reinterpret_cast<void *>(x->wr_flush), nullptr);
    EXPECT_NE(reinterpret_cast<void *>(*atomic_write), nullptr);
    EXPECT_EQ(reinterpret_cast<char *>(&x->wr_flush) - reinterpret_cast<char *>(atomic_write),
              ptrdiff_t(sizeof(void *)));
}

TEST_F(Flush, PersistentRegistrationNeedsDurableMemory) {
    make();
    Buf anon(nullptr, 4096);
    errno = 0;
    EXPECT_EQ(ibv_reg_mr(p.b.pd, anon.data(), 4096, int(kAllAccess | IBV_ACCESS_FLUSH_PERSISTENT)),
              nullptr);
    EXPECT_EQ(errno, EINVAL);
    FileMr shm(4096, "/dev/shm"); // tmpfs: volatile
    ASSERT_NE(shm.data(), nullptr);
    errno = 0;
    EXPECT_EQ(shm.reg(p.b.pd, kAllAccess | IBV_ACCESS_FLUSH_PERSISTENT), nullptr);
    EXPECT_EQ(errno, EINVAL);
    FileMr file(4096);
    ASSERT_NE(file.data(), nullptr);
    EXPECT_NE(file.reg(p.b.pd, kAllAccess | IBV_ACCESS_FLUSH_PERSISTENT), nullptr)
        << std::strerror(errno);
    // Global visibility needs no durable medium.
    ibv_mr *g = ibv_reg_mr(p.b.pd, anon.data(), 4096, int(kAllAccess | IBV_ACCESS_FLUSH_GLOBAL));
    ASSERT_NE(g, nullptr);
    ibv_dereg_mr(g);
}

TEST_F(Flush, WriteThenPersistentFlushOfTheRange) {
    make();
    FileMr dst(1 << 20);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess | IBV_ACCESS_FLUSH_PERSISTENT), nullptr);
    Buf src(p.a.pd, 300000);
    src.fill(7);
    ASSERT_EQ(write_then_flush(src, 300000, dst.addr(4096), dst.mr()->rkey, dst.addr(4096), 300000,
                               IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE),
              0);
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 2);
    ASSERT_EQ(wc.size(), 2u);
    expect_wc(wc[0], {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    expect_wc(wc[1], {2, IBV_WC_SUCCESS, IBV_WC_FLUSH, p.a.qpn()});
    std::vector<uint8_t> f = dst.file_bytes(4096, 300000);
    EXPECT_TRUE(same_bytes(f.data(), src.data(), 300000));
}

TEST_F(Flush, FlushOfTheWholeMrCoversEveryEarlierWrite) {
    make();
    FileMr dst(65536);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess | kFlushAccess), nullptr);
    Buf src(p.a.pd, 65536);
    src.fill(11);
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(post_rdma(p.a.qp, uint64_t(10 + i), IBV_WR_RDMA_WRITE,
                            {src.sge(size_t(i) * 8192, 8192)}, dst.addr(size_t(i) * 8192),
                            dst.mr()->rkey, 0),
                  0);
    // With IBV_FLUSH_MR the address and length are ignored.
    ASSERT_EQ(
        flush(99, dst.mr()->rkey, 0, 0, IBV_FLUSH_PERSISTENT | IBV_FLUSH_GLOBAL, IBV_FLUSH_MR), 0);
    expect_one(p.a.scq, {99, IBV_WC_SUCCESS, IBV_WC_FLUSH, p.a.qpn()});
    std::vector<uint8_t> f = dst.file_bytes(0, 65536);
    EXPECT_TRUE(same_bytes(f.data(), src.data(), 65536));
}

TEST_F(Flush, GlobalVisibilityFlushOfVolatileMemory) {
    make();
    Buf dst(p.b.pd, 8192, kAllAccess | IBV_ACCESS_FLUSH_GLOBAL);
    ASSERT_TRUE(dst.ok());
    Buf src(p.a.pd, 8192);
    src.fill(3);
    ASSERT_EQ(write_then_flush(src, 8192, dst.addr(), dst.rkey(), dst.addr(), 8192,
                               IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE),
              0);
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 2);
    ASSERT_EQ(wc.size(), 2u);
    expect_wc(wc[1], {2, IBV_WC_SUCCESS, IBV_WC_FLUSH, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 8192));
}

TEST_F(Flush, MrWithoutFlushAccessIsRemoteAccessError) {
    make();
    FileMr dst(8192);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess), nullptr); // no FLUSH access
    Buf src(p.a.pd, 64);
    ASSERT_EQ(write_then_flush(src, 64, dst.addr(), dst.mr()->rkey, dst.addr(), 64,
                               IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE),
              0);
    std::vector<ibv_wc> wc = poll_n(p.a.scq, 2);
    ASSERT_EQ(wc.size(), 2u);
    expect_wc(wc[0], {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    EXPECT_EQ(wc[1].wr_id, 2u);
    EXPECT_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_ERR);
}

TEST_F(Flush, GlobalOnlyMrRefusesPersistentFlush) {
    make();
    FileMr dst(8192);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess | IBV_ACCESS_FLUSH_GLOBAL), nullptr);
    ASSERT_EQ(flush(5, dst.mr()->rkey, dst.addr(), 64, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE), 0);
    EXPECT_EQ(next_status(), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Flush, QpWithoutFlushAccessIsInvalidRequest) {
    make(kAllAccess); // B's QP lacks the FLUSH access flags
    FileMr dst(8192);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess | kFlushAccess), nullptr);
    ASSERT_EQ(flush(5, dst.mr()->rkey, dst.addr(), 64, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE), 0);
    EXPECT_EQ(next_status(), IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(Flush, RangeOutsideTheMrIsRemoteAccessError) {
    make();
    FileMr dst(8192);
    ASSERT_NE(dst.reg(p.b.pd, kAllAccess | kFlushAccess), nullptr);
    ASSERT_EQ(flush(5, dst.mr()->rkey, dst.addr(4096), 8192, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE),
              0);
    EXPECT_EQ(next_status(), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Flush, BadPlacementOrSelectivityFailsTheBatch) {
    make();
    ibv_qp_ex *q = p.a.qpx;
    ibv_wr_start(q);
    ibv_wr_flush(q, 1, 0, 8, 0 /* no placement type */, IBV_FLUSH_RANGE);
    EXPECT_EQ(ibv_wr_complete(q), EINVAL);
    ibv_wr_start(q);
    ibv_wr_flush(q, 1, 0, 8, IBV_FLUSH_GLOBAL, 7);
    EXPECT_EQ(ibv_wr_complete(q), EINVAL);
    // FLUSH has no ibv_send_wr fields: it is only posted through ibv_wr_flush.
    std::vector<ibv_sge> none;
    ibv_send_wr wr = send_wr(1, IBV_WR_FLUSH, none);
    EXPECT_EQ(post(p.a.qp, wr), EINVAL);
    EXPECT_TRUE(drain(p.a.scq, 50ms).empty());
}

TEST_F(Flush, AtomicWriteStoresEightBytes) {
    make();
    Buf dst(p.b.pd, 64);
    dst.set(0);
    uint64_t v = 0x1122334455667788ull;
    ASSERT_EQ(atomic_write(7, dst.rkey(), dst.addr(8), v), 0);
    expect_one(p.a.scq, {7, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_EQ(dst.word(8), v);
    EXPECT_TRUE(all_bytes(dst.data(), 8, 0));
    EXPECT_TRUE(all_bytes(dst.data() + 16, 48, 0));
}

TEST_F(Flush, AtomicWriteThroughPostSend) {
    make();
    Buf dst(p.b.pd, 64);
    dst.set(0);
    Buf src(p.a.pd, 8);
    src.word(0) = 0xCAFEF00DDEADBEEFull;
    ASSERT_EQ(post_rdma(p.a.qp, 8, IBV_WR_ATOMIC_WRITE, {src.sge(0, 8)}, dst.addr(16), dst.rkey()),
              0);
    src.word(0) = 0; // the value was taken when posted
    expect_one(p.a.scq, {8, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_EQ(dst.word(16), 0xCAFEF00DDEADBEEFull);
    // Anything but 8 bytes is not an ATOMIC WRITE.
    EXPECT_EQ(post_rdma(p.a.qp, 9, IBV_WR_ATOMIC_WRITE, {src.sge(0, 4)}, dst.addr(16), dst.rkey()),
              EINVAL);
}

TEST_F(Flush, MisalignedAtomicWriteIsInvalidRequest) {
    make();
    Buf dst(p.b.pd, 64);
    ASSERT_EQ(atomic_write(3, dst.rkey(), dst.addr(4), 1), 0);
    EXPECT_EQ(next_status(), IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(Flush, AtomicWriteWithoutRemoteWriteIsRemoteAccessError) {
    make();
    Buf dst(p.b.pd, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_EQ(atomic_write(4, dst.rkey(), dst.addr(0), 1), 0);
    EXPECT_EQ(next_status(), IBV_WC_REM_ACCESS_ERR);
}

// The log-append pattern: records by RDMA WRITE, then a commit flag by ATOMIC
// WRITE.  The flag is placed after every earlier write, so whoever sees it
// also sees the records; a FLUSH afterwards makes both durable.
TEST_F(Flush, AtomicWriteIsOrderedAfterEarlierWrites) {
    make();
    FileMr log(1 << 20);
    ASSERT_NE(log.reg(p.b.pd, kAllAccess | kFlushAccess), nullptr);
    Buf rec(p.a.pd, 1 << 20);
    rec.fill(21);
    for (uint64_t round = 1; round <= 20; round++) {
        size_t off = size_t(round) * 4096 * 8;
        ASSERT_EQ(post_rdma(p.a.qp, round, IBV_WR_RDMA_WRITE, {rec.sge(off, 4096 * 7)},
                            log.addr(off), log.mr()->rkey, 0),
                  0);
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = 1000 + round;
        q->wr_flags = 0;
        ibv_wr_atomic_write(q, log.mr()->rkey, log.addr(0), &round);
        q->wr_id = 2000 + round;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_flush(q, log.mr()->rkey, log.addr(0), 8, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE);
        ASSERT_EQ(ibv_wr_complete(q), 0);
        // The target watches the flag: once it shows `round`, the records
        // written before it must be there in full.
        auto end = Clock::now() + kDeadline;
        while (__atomic_load_n(reinterpret_cast<uint64_t *>(log.data()), __ATOMIC_ACQUIRE) != round)
            ASSERT_LT(Clock::now(), end);
        EXPECT_TRUE(same_bytes(log.data() + off, rec.data() + off, 4096 * 7));
        expect_one(p.a.scq, {2000 + round, IBV_WC_SUCCESS, IBV_WC_FLUSH, p.a.qpn()});
    }
}

} // namespace
