// SPDX-License-Identifier: MIT
//
// UD, UC, shared receive queues, XRC and memory windows under the engine's fault injector
// (SROCE_FAULT: each NIC drops, duplicates or reorders what it receives).
// The reliable ones (RC on an SRQ, XRC) must deliver every message exactly
// once and in order; the unreliable ones may lose messages (UD, UC) or see
// a datagram twice (UD, and a UC message whose only packet is duplicated),
// but whatever they report must be a whole, byte-exact message, and the QPs
// stay operational.  Each case opens its own contexts on 127.0.1.17 and
// 127.0.1.18, addresses no other test uses.
#include "qp_kinds.hpp"

#include <map>
#include <random>

using namespace rctest;
using namespace qpkinds;

namespace {

ibv_device *g_dev[2];

const std::string &devices() {
    static const std::string err = find_devices("dgf0", "127.0.1.17", "dgf1", "127.0.1.18", g_dev);
    return err;
}

struct FaultCase {
    const char *name;
    const char *spec;
};

void PrintTo(const FaultCase &c, std::ostream *os) {
    *os << c.name << " (" << c.spec << ")";
}

struct ContextCloser {
    ibv_context *ctx;
    ~ContextCloser() {
        if (ctx) {
            EXPECT_EQ(ibv_close_device(ctx), 0);
        }
    }
};

class DatagramFaults : public ::testing::TestWithParam<FaultCase> {
  protected:
    void SetUp() override {
        ASSERT_EQ(devices(), "");
        setenv("SROCE_FAULT", GetParam().spec, 1);
        ca_.ctx = open_device(g_dev[0]);
        cb_.ctx = open_device(g_dev[1]);
        unsetenv("SROCE_FAULT");
        ASSERT_NE(ca_.ctx, nullptr);
        ASSERT_NE(cb_.ctx, nullptr);
        a_ = std::make_unique<End>(ca_.ctx);
        b_ = std::make_unique<End>(cb_.ctx);
    }
    void TearDown() override {
        a_.reset();
        b_.reset();
    }
    // Declared first: the contexts close after the objects in them.
    ContextCloser ca_{nullptr}, cb_{nullptr};
    std::unique_ptr<End> a_, b_;
};

// Message `seq` is `len(seq)` bytes of a pattern seeded by seq.
size_t msg_len(uint32_t seq, size_t max) {
    return 1 + (seq * 2654435761u) % max;
}

// Every message the receiver reports is whole and byte-exact; returns how
// many distinct ones arrived.
::testing::AssertionResult check_received(const std::vector<ibv_wc> &wcs, const Buf &dst,
                                          size_t slot, size_t grh, size_t max, size_t *distinct) {
    std::map<uint32_t, int> seen;
    std::vector<uint8_t> want(max);
    for (const ibv_wc &wc : wcs) {
        if (wc.status != IBV_WC_SUCCESS)
            return ::testing::AssertionFailure() << "status " << ibv_wc_status_str(wc.status);
        uint32_t seq = ntohl(wc.imm_data);
        size_t len = msg_len(seq, max);
        if (wc.byte_len != grh + len)
            return ::testing::AssertionFailure()
                   << "message " << seq << ": byte_len " << wc.byte_len << " != " << grh + len;
        fill_pattern(want.data(), len, seq);
        const uint8_t *got = dst.data() + size_t(wc.wr_id) * slot + grh;
        if (auto r = same_bytes(got, want.data(), len); !r) return r << " (message " << seq << ")";
        seen[seq]++;
    }
    *distinct = seen.size();
    return ::testing::AssertionSuccess();
}

TEST_P(DatagramFaults, UdDeliversWholeDatagramsOnly) {
    End &a = *a_, &b = *b_;
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    constexpr uint32_t kMsgs = 600, kMax = 1000, kSlot = kMax + 40, kRecvs = 48;
    Buf src(a.pd, kMax), dst(b.pd, size_t(kRecvs) * kSlot);
    ibv_ah *ah = a.ah(b.gid);
    std::vector<ibv_wc> got;
    auto repost = [&](uint64_t slot) {
        ASSERT_EQ(post_recv(qb, slot, {dst.sge(size_t(slot) * kSlot, kSlot)}), 0);
    };
    for (uint64_t s = 0; s < kRecvs; s++)
        repost(s);
    size_t distinct = 0;
    for (uint32_t seq = 0; seq < kMsgs; seq++) {
        size_t len = msg_len(seq, kMax);
        fill_pattern(src.data(), len, seq);
        ASSERT_EQ(
            post_ud(qa, seq, ah, qb->qp_num, kQkey, {src.sge(0, len)}, IBV_WR_SEND_WITH_IMM, seq),
            0);
        ASSERT_EQ(poll_n(a.scq, 1).size(), 1u);
        // Take what arrived, check it at once and give its buffer back.
        for (const ibv_wc &wc : drain(b.rcq, seq % 8 ? 0ms : 2ms)) {
            size_t d = 0;
            ASSERT_TRUE(check_received({wc}, dst, kSlot, 40, kMax, &d));
            got.push_back(wc);
            repost(wc.wr_id);
        }
    }
    for (const ibv_wc &wc : drain(b.rcq, 50ms)) {
        size_t d = 0;
        ASSERT_TRUE(check_received({wc}, dst, kSlot, 40, kMax, &d));
        got.push_back(wc);
    }
    std::map<uint32_t, int> seen;
    for (const ibv_wc &wc : got)
        seen[ntohl(wc.imm_data)]++;
    distinct = seen.size();
    EXPECT_GT(distinct, kMsgs / 2) << "too few datagrams arrived";
    EXPECT_EQ(qp_state(qb), IBV_QPS_RTS);
    std::printf("UD: %zu of %u datagrams arrived (%zu completions)\n", distinct, kMsgs, got.size());
}

TEST_P(DatagramFaults, UcReportsOnlyWholeMessages) {
    End &a = *a_, &b = *b_;
    ibv_qp *qa = a.qp(IBV_QPT_UC), *qb = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, false));
    constexpr uint32_t kMsgs = 300, kMax = 5000, kSlots = 32;
    Buf src(a.pd, kMax), dst(b.pd, size_t(kSlots) * kMax), mem(b.pd, size_t(kSlots) * kMax);
    std::vector<ibv_wc> sends, writes;
    for (uint64_t s = 0; s < kSlots; s++)
        ASSERT_EQ(post_recv(qb, s, {dst.sge(size_t(s) * kMax, kMax)}), 0);
    auto collect = [&](Clock::duration wait) {
        for (const ibv_wc &wc : drain(b.rcq, wait)) {
            if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                // The write went to the slot its immediate names; the WQE
                // only carried the notification.
                ibv_wc w = wc;
                w.wr_id = ntohl(wc.imm_data) % kSlots;
                w.byte_len = uint32_t(msg_len(ntohl(wc.imm_data), kMax));
                size_t d;
                ASSERT_TRUE(check_received({w}, mem, kMax, 0, kMax, &d));
                writes.push_back(w);
            } else {
                size_t d;
                ASSERT_TRUE(check_received({wc}, dst, kMax, 0, kMax, &d));
                sends.push_back(wc);
            }
            ASSERT_EQ(post_recv(qb, wc.wr_id, {dst.sge(size_t(wc.wr_id) * kMax, kMax)}), 0);
        }
    };
    for (uint32_t seq = 0; seq < kMsgs; seq++) {
        size_t len = msg_len(seq, kMax);
        fill_pattern(src.data(), len, seq);
        if (seq % 2)
            ASSERT_EQ(post_send_imm(qa, seq, {src.sge(0, len)}, seq), 0);
        else
            ASSERT_EQ(post_rdma(qa, seq, IBV_WR_RDMA_WRITE_WITH_IMM, {src.sge(0, len)},
                                mem.addr(size_t(seq % kSlots) * kMax), mem.rkey(),
                                IBV_SEND_SIGNALED, seq),
                      0);
        ASSERT_EQ(poll_n(a.scq, 1).size(), 1u);
        // One message at a time in each slot: wait for it (or its loss).
        ASSERT_NO_FATAL_FAILURE(collect(2ms));
    }
    ASSERT_NO_FATAL_FAILURE(collect(50ms));
    EXPECT_GT(sends.size() + writes.size(), kMsgs / 3) << "too few messages arrived";
    EXPECT_EQ(qp_state(qb), IBV_QPS_RTS);
    std::printf("UC: %zu sends and %zu writes of %u messages arrived whole\n", sends.size(),
                writes.size(), kMsgs);
}

// RC QPs on one SRQ, and XRC into two SRQs: reliable, so exactly once and
// in order per sender.
TEST_P(DatagramFaults, SrqAndXrcDeliverEverythingOnce) {
    End &a = *a_, &b = *b_;
    constexpr uint32_t kMsgs = 400, kMax = 3000, kSlots = 64;
    ibv_srq *srq = b.srq(kSlots);
    ibv_qp *a1 = a.qp(IBV_QPT_RC), *b1 = b.qp(IBV_QPT_RC, srq);
    ibv_qp *a2 = a.qp(IBV_QPT_RC), *b2 = b.qp(IBV_QPT_RC, srq);
    ASSERT_NO_FATAL_FAILURE(connect(a1, a, b1, b, true));
    ASSERT_NO_FATAL_FAILURE(connect(a2, a, b2, b, true));
    Buf src(a.pd, 2 * kMax), dst(b.pd, size_t(kSlots) * kMax);
    for (uint64_t s = 0; s < kSlots; s++)
        ASSERT_EQ(post_srq(srq, s, {dst.sge(size_t(s) * kMax, kMax)}), 0);
    uint32_t next[2] = {0, 1};
    uint32_t expect[2] = {0, 1};
    size_t received = 0;
    // Senders alternate; message seq goes to QP seq % 2.
    for (uint32_t seq = 0; seq < kMsgs; seq++) {
        int q = seq % 2;
        size_t len = msg_len(seq, kMax);
        uint8_t *buf = src.data() + size_t(q) * kMax;
        fill_pattern(buf, len, seq);
        ASSERT_EQ(post_send_imm(q ? a2 : a1, seq, {src.sge(size_t(q) * kMax, len)}, seq), 0);
        ASSERT_EQ(poll_n(a.scq, 1).size(), 1u) << "message " << seq << " not acknowledged";
        next[q] += 2;
        for (const ibv_wc &wc : poll_n(b.rcq, 1)) {
            size_t d;
            ASSERT_TRUE(check_received({wc}, dst, kMax, 0, kMax, &d));
            int from = wc.qp_num == b2->qp_num;
            EXPECT_EQ(ntohl(wc.imm_data), expect[from]) << "out of order or twice";
            expect[from] += 2;
            received++;
            ASSERT_EQ(post_srq(srq, wc.wr_id, {dst.sge(size_t(wc.wr_id) * kMax, kMax)}), 0);
        }
    }
    EXPECT_EQ(received, size_t(kMsgs));
    EXPECT_TRUE(drain(b.rcq, 20ms).empty()) << "a message arrived twice";

    Xrc x;
    ASSERT_NO_FATAL_FAILURE(x.make(a, b, b.rcq, kSlots));
    ibv_srq *xsrq = x.srq;
    uint32_t srqn = x.srqn;
    ibv_qp *ini = x.send_qp, *tgt = x.recv_qp;
    ASSERT_NO_FATAL_FAILURE(connect(ini, a, tgt, b, true));
    for (uint64_t s = 0; s < kSlots; s++)
        ASSERT_EQ(post_srq(xsrq, s, {dst.sge(size_t(s) * kMax, kMax)}), 0);
    for (uint32_t seq = 0; seq < kMsgs / 2; seq++) {
        size_t len = msg_len(seq, kMax);
        fill_pattern(src.data(), len, seq);
        std::vector<ibv_sge> sg{src.sge(0, len)};
        ibv_send_wr wr = send_wr(seq, IBV_WR_SEND_WITH_IMM, sg);
        wr.imm_data = htonl(seq);
        wr.qp_type.xrc.remote_srqn = srqn;
        ibv_send_wr *bad = nullptr;
        ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
        ASSERT_EQ(poll_n(a.scq, 1).size(), 1u);
        std::vector<ibv_wc> wc = poll_n(b.rcq, 1);
        ASSERT_EQ(wc.size(), 1u) << "XRC message " << seq << " lost";
        size_t d;
        ASSERT_TRUE(check_received(wc, dst, kMax, 0, kMax, &d));
        EXPECT_EQ(ntohl(wc[0].imm_data), seq);
        EXPECT_EQ(wc[0].qp_num, tgt->qp_num);
        ASSERT_EQ(post_srq(xsrq, wc[0].wr_id, {dst.sge(size_t(wc[0].wr_id) * kMax, kMax)}), 0);
    }
    EXPECT_TRUE(drain(b.rcq, 20ms).empty()) << "an XRC message arrived twice";
    x.destroy();
}

// RC through a type 2 memory window: every write and read lands exactly
// once through the window's rkey, a duplicated SEND WITH INVALIDATE is
// acknowledged again rather than invalidating twice (which would fail the
// QP), and once invalidated the rkey is refused.
TEST_P(DatagramFaults, RcThroughAWindowThenInvalidated) {
    End &a = *a_, &b = *b_;
    constexpr uint32_t kMsgs = 200;
    constexpr size_t kWin = 4096;
    ibv_qp *qa = a.qp(IBV_QPT_RC), *qb = b.qp(IBV_QPT_RC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, true));
    Buf src(a.pd, kWin), back(a.pd, kWin), rx(b.pd, 64);
    Buf mem(b.pd, 2 * kWin, kAllAccess | IBV_ACCESS_MW_BIND);
    ASSERT_TRUE(mem.ok());
    mem.set(0);
    std::unique_ptr<ibv_mw, int (*)(ibv_mw *)> mw(ibv_alloc_mw(b.pd, IBV_MW_TYPE_2),
                                                  ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    std::vector<ibv_sge> none;
    ibv_send_wr bind = send_wr(1, IBV_WR_BIND_MW, none);
    bind.bind_mw.mw = mw.get();
    bind.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    bind.bind_mw.bind_info = {mem.mr(), mem.addr(kWin / 2), kWin,
                              IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    ASSERT_EQ(post(qb, bind), 0);
    expect_one(b.scq, {1, IBV_WC_SUCCESS, IBV_WC_BIND_MW, qb->qp_num});
    const uint32_t rkey = bind.bind_mw.rkey;
    ASSERT_EQ(mw->rkey, rkey);
    const uint64_t win = mem.addr(kWin / 2);

    for (uint32_t seq = 0; seq < kMsgs; seq++) {
        size_t len = msg_len(seq, kWin), off = (seq * 131u) % (kWin - len + 1);
        fill_pattern(src.data(), len, seq);
        ASSERT_EQ(post_rdma(qa, 2 * seq, IBV_WR_RDMA_WRITE, {src.sge(0, len)}, win + off, rkey), 0);
        back.set(0);
        ASSERT_EQ(post_rdma(qa, 2 * seq + 1, IBV_WR_RDMA_READ, {back.sge(0, len)}, win + off, rkey),
                  0);
        std::vector<ibv_wc> wc = poll_n(a.scq, 2);
        ASSERT_EQ(wc.size(), 2u) << "message " << seq;
        expect_wc(wc[0], {2 * seq, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, qa->qp_num});
        expect_wc(wc[1], {2 * seq + 1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, qa->qp_num, int64_t(len)});
        ASSERT_TRUE(same_bytes(mem.data() + kWin / 2 + off, src.data(), len)) << seq;
        ASSERT_TRUE(same_bytes(back.data(), src.data(), len)) << seq;
    }
    // Nothing outside the window was touched.
    std::vector<uint8_t> zero(kWin / 2, 0);
    EXPECT_TRUE(same_bytes(mem.data(), zero.data(), kWin / 2));
    EXPECT_TRUE(same_bytes(mem.data() + kWin / 2 + kWin, zero.data(), kWin / 2));

    ASSERT_EQ(post_recv(qb, 7, {rx.sge(0, 64)}), 0);
    std::vector<ibv_sge> eight{src.sge(0, 8)};
    ibv_send_wr inv = send_wr(8, IBV_WR_SEND_WITH_INV, eight);
    inv.invalidate_rkey = rkey;
    ASSERT_EQ(post(qa, inv), 0);
    expect_one(a.scq, {8, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    std::vector<ibv_wc> got = poll_n(b.rcq, 1);
    ASSERT_EQ(got.size(), 1u);
    expect_wc(got[0], {7, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 8, IBV_WC_WITH_INV});
    EXPECT_EQ(got[0].invalidated_rkey, rkey);
    EXPECT_TRUE(drain(b.rcq, 20ms).empty()) << "the invalidating send arrived twice";
    EXPECT_EQ(qp_state(qb), IBV_QPS_RTS);

    std::vector<uint8_t> before(mem.data(), mem.data() + 2 * kWin);
    ASSERT_EQ(post_rdma(qa, 9, IBV_WR_RDMA_WRITE, {src.sge(0, 64)}, win, rkey), 0);
    // The NAK moves the responder to error; should the fault injector lose
    // that NAK (dropped, or held back for reordering behind packets that never
    // come), the retries meet a QP in error and the requester gives up.
    got = poll_n(a.scq, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].wr_id, 9u);
    EXPECT_TRUE(got[0].status == IBV_WC_REM_ACCESS_ERR || got[0].status == IBV_WC_RETRY_EXC_ERR)
        << ibv_wc_status_str(got[0].status);
    EXPECT_TRUE(same_bytes(mem.data(), before.data(), before.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Faults, DatagramFaults,
    ::testing::Values(FaultCase{"drop", "drop=0.05,seed=3"}, FaultCase{"dup", "dup=0.05,seed=4"},
                      FaultCase{"reorder", "reorder=0.05,seed=5"},
                      FaultCase{"all", "drop=0.03,dup=0.03,reorder=0.03,seed=6"}),
    [](const ::testing::TestParamInfo<FaultCase> &i) { return std::string(i.param.name); });

} // namespace
