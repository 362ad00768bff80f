// SPDX-License-Identifier: MIT
//
// Memory windows (IBTA 10.6.7, ibv_alloc_mw(3)) through public verbs, in one
// process: two sroce devices on the in-memory wire (127.0.1.31 and
// 127.0.1.32).  A window grants a peer part of an MR, with its own rkey and
// access: type 1 bound by ibv_bind_mw() and unbound by a bind of length 0,
// type 2 bound by a BIND_MW work request and invalidated by LOCAL_INV.  Each
// case checks the bytes that land, and that what the window does not grant
// is refused with a remote access error and changes nothing.
#include "rc_pair.hpp"

#include <chrono>
#include <memory>
#include <thread>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("mw0", "127.0.1.31", "mw1", "127.0.1.32", g_ctx));

constexpr size_t kWin = 4096;
using MwPtr = std::unique_ptr<ibv_mw, int (*)(ibv_mw *)>;

class Mw : public ::testing::Test {
  protected:
    void SetUp() override {
        PairOpts o;
        o.b_access = kAllAccess | IBV_ACCESS_MW_BIND;
        // A refused access fails the requester at once, with no retries.
        o.retry_cnt = 1;
        adjust(o);
        ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o));
        mem = std::make_unique<Buf>(p.b.pd, 3 * kWin, kAllAccess | IBV_ACCESS_MW_BIND);
        src = std::make_unique<Buf>(p.a.pd, kWin);
        back = std::make_unique<Buf>(p.a.pd, kWin);
        ASSERT_TRUE(mem->ok() && src->ok() && back->ok());
        mem->set(0);
        src->fill(7);
    }

    virtual void adjust(PairOpts &) {}

    // The window over mem's middle kWin bytes.
    uint64_t win() const { return mem->addr(kWin); }

    // A type 2 bind on B's QP; the window's new rkey.
    uint32_t bind2(ibv_mw *mw, unsigned access, size_t len = kWin) {
        std::vector<ibv_sge> none;
        ibv_send_wr wr = send_wr(11, IBV_WR_BIND_MW, none);
        wr.bind_mw.mw = mw;
        wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
        wr.bind_mw.bind_info = {mem->mr(), win(), len, access};
        EXPECT_EQ(post(p.b.qp, wr), 0);
        expect_one(p.b.scq, {11, IBV_WC_SUCCESS, IBV_WC_BIND_MW, p.b.qpn()});
        EXPECT_EQ(mw->rkey, wr.bind_mw.rkey);
        return wr.bind_mw.rkey;
    }

    // A WRITE of `len` bytes to raddr through rkey; its completion status.
    ibv_wc_status write(uint64_t id, uint64_t raddr, uint32_t rkey, size_t len = 256) {
        EXPECT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_WRITE, {src->sge(0, len)}, raddr, rkey), 0);
        std::vector<ibv_wc> wc = poll_n(p.a.scq, 1);
        if (wc.size() != 1) return IBV_WC_GENERAL_ERR;
        EXPECT_EQ(wc[0].wr_id, id);
        return wc[0].status;
    }

    ibv_wc_status read(uint64_t id, uint64_t raddr, uint32_t rkey, size_t len = 256) {
        back->set(0);
        EXPECT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_READ, {back->sge(0, len)}, raddr, rkey), 0);
        std::vector<ibv_wc> wc = poll_n(p.a.scq, 1);
        if (wc.size() != 1) return IBV_WC_GENERAL_ERR;
        EXPECT_EQ(wc[0].wr_id, id);
        return wc[0].status;
    }

    // Nothing outside [kWin + off, kWin + off + len) of mem was written.
    ::testing::AssertionResult only_written(size_t off, size_t len) {
        std::vector<uint8_t> zero(3 * kWin, 0);
        Pair::sync_with(p.b);
        if (auto r = same_bytes(mem->data(), zero.data(), kWin + off); !r) return r;
        size_t end = kWin + off + len;
        return same_bytes(mem->data() + end, zero.data(), 3 * kWin - end);
    }

    Pair p;
    std::unique_ptr<Buf> mem, src, back;
};

// A type 2 window: WRITE and READ through its rkey land exactly in it, the
// MR's own range beyond it is refused through the window's rkey, and after
// LOCAL_INV the rkey is refused too.
TEST_F(Mw, Type2WindowGrantsItsRangeUntilInvalidated) {
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    uint32_t rkey = bind2(mw.get(), IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_EQ(write(1, win() + 100, rkey), IBV_WC_SUCCESS);
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(mem->data() + kWin + 100, src->data(), 256));
    EXPECT_TRUE(only_written(100, 256));
    ASSERT_EQ(read(2, win() + 100, rkey), IBV_WC_SUCCESS);
    EXPECT_TRUE(same_bytes(back->data(), src->data(), 256));

    std::vector<ibv_sge> none;
    ibv_send_wr inv = send_wr(12, IBV_WR_LOCAL_INV, none);
    inv.invalidate_rkey = rkey;
    ASSERT_EQ(post(p.b.qp, inv), 0);
    expect_one(p.b.scq, {12, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, p.b.qpn()});
    EXPECT_EQ(write(3, win() + 1000, rkey), IBV_WC_REM_ACCESS_ERR);
    EXPECT_TRUE(only_written(100, 256)) << "a WRITE through an invalidated window landed";
}

// The window's bounds, not the MR's: a WRITE that starts inside the window
// and runs past its end is refused whole, though the MR covers it.
TEST_F(Mw, WriteCrossingTheWindowsEndIsRefusedWhole) {
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    uint32_t rkey = bind2(mw.get(), IBV_ACCESS_REMOTE_WRITE);
    EXPECT_EQ(write(1, win() + kWin - 128, rkey), IBV_WC_REM_ACCESS_ERR);
    EXPECT_TRUE(only_written(0, 0)) << "part of a refused WRITE landed";
}

// The window's access, not the MR's: a window bound for READ only refuses a
// WRITE through its rkey, though the MR grants remote write.
TEST_F(Mw, ReadOnlyWindowRefusesWrites) {
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    mem->word(kWin) = 0x1122334455667788ull;
    uint32_t rkey = bind2(mw.get(), IBV_ACCESS_REMOTE_READ);
    ASSERT_EQ(read(1, win(), rkey, 8), IBV_WC_SUCCESS);
    uint64_t got;
    std::memcpy(&got, back->data(), 8);
    EXPECT_EQ(got, 0x1122334455667788ull);
    EXPECT_EQ(write(2, win(), rkey), IBV_WC_REM_ACCESS_ERR);
    Pair::sync_with(p.b);
    EXPECT_EQ(mem->word(kWin), 0x1122334455667788ull);
}

// A type 1 window: bound by ibv_bind_mw() and usable by any QP of the PD,
// unbound by a bind of length 0, after which its rkey is refused.
TEST_F(Mw, Type1WindowBoundAndUnboundByTheVerb) {
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_1), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    ibv_mw_bind bind{};
    bind.wr_id = 21;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info = {mem->mr(), win(), kWin, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(ibv_bind_mw(p.b.qp, mw.get(), &bind), 0);
    expect_one(p.b.scq, {21, IBV_WC_SUCCESS, IBV_WC_BIND_MW, p.b.qpn()});
    uint32_t rkey = mw->rkey;
    ASSERT_EQ(write(1, win() + 512, rkey), IBV_WC_SUCCESS);
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(mem->data() + kWin + 512, src->data(), 256));

    ibv_mw_bind unbind{};
    unbind.wr_id = 22;
    unbind.send_flags = IBV_SEND_SIGNALED;
    unbind.bind_info = {mem->mr(), 0, 0, 0};
    ASSERT_EQ(ibv_bind_mw(p.b.qp, mw.get(), &unbind), 0);
    expect_one(p.b.scq, {22, IBV_WC_SUCCESS, IBV_WC_BIND_MW, p.b.qpn()});
    EXPECT_EQ(write(2, win() + 2048, mw->rkey), IBV_WC_REM_ACCESS_ERR);
    EXPECT_TRUE(only_written(512, 256)) << "a WRITE through an unbound window landed";
}

// A bind onto an MR registered without IBV_ACCESS_MW_BIND fails with
// IBV_WC_MW_BIND_ERR, and the window grants nothing.
TEST_F(Mw, BindOntoAnMrWithoutMwBindFails) {
    Buf plain(p.b.pd, kWin);
    ASSERT_TRUE(plain.ok());
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    std::vector<ibv_sge> none;
    ibv_send_wr wr = send_wr(31, IBV_WR_BIND_MW, none);
    wr.bind_mw.mw = mw.get();
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = {plain.mr(), plain.addr(), kWin, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(post(p.b.qp, wr), 0);
    std::vector<ibv_wc> wc = poll_n(p.b.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 31u);
    EXPECT_EQ(wc[0].status, IBV_WC_MW_BIND_ERR) << ibv_wc_status_str(wc[0].status);
}

// A bind waits in the send queue behind a SEND that the peer answers with
// RNR NAK (its 655 ms timer, min_rnr_timer 0).  Its MR is deregistered
// meanwhile: when its turn comes the bind fails, as with any MR that does not
// allow it, and reads nothing of the MR that was (fuzz_rx found the read,
// under ASan).
class MwLate : public Mw {
    void adjust(PairOpts &o) override { o.min_rnr_timer = 0; }
};

TEST_F(MwLate, ABindWhoseMrIsGoneWhenItsTurnComesFails) {
    std::vector<uint8_t> region(kWin);
    ibv_mr *mr = ibv_reg_mr(p.b.pd, region.data(), region.size(),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    ASSERT_NE(mr, nullptr);
    MwPtr mw(ibv_alloc_mw(p.b.pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
    ASSERT_NE(mw, nullptr);
    // No receive at A: the SEND is refused with RNR NAK, and B waits.
    ASSERT_EQ(post_send(p.b.qp, 41, {mem->sge(0, 64)}), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<ibv_sge> none;
    ibv_send_wr wr = send_wr(42, IBV_WR_BIND_MW, none);
    wr.bind_mw.mw = mw.get();
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = {mr, uint64_t(uintptr_t(region.data())), kWin, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(post(p.b.qp, wr), 0);
    ASSERT_EQ(ibv_dereg_mr(mr), 0);
    ASSERT_EQ(post_recv(p.a.qp, 43, {back->sge(0, 64)}), 0);
    std::vector<ibv_wc> wc = poll_n(p.b.scq, 2, std::chrono::seconds(5));
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_EQ(wc[0].wr_id, 41u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[0].status);
    EXPECT_EQ(wc[1].wr_id, 42u);
    EXPECT_EQ(wc[1].status, IBV_WC_MW_BIND_ERR) << ibv_wc_status_str(wc[1].status);
}

} // namespace
