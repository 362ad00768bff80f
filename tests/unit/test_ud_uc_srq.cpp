// SPDX-License-Identifier: MIT
//
// UD, UC, shared receive queues and XRC through public verbs, in one
// process: two sroce devices on loopback (127.0.1.15 and 127.0.1.16, used by
// no other test).  Data is compared byte for byte; completions, GRHs, async
// events and error codes are checked field by field.
#include "qp_kinds.hpp"

#include <infiniband/tm_types.h>

#include <fcntl.h>
#include <poll.h>

using namespace rctest;
using namespace qpkinds;

namespace {

ibv_context *g_ctx[2];

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("uds0", "127.0.1.15", "uds1", "127.0.1.16", g_ctx));

class Ud : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(g_ctx[0] && g_ctx[1]); }
    End a{g_ctx[0]}, b{g_ctx[1]};
};

// ---------------------------------------------------------------------------
// UD

TEST_F(Ud, SendsArriveBehindARoceV2Grh) {
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    const uint32_t mtu = active_mtu(g_ctx[1]);
    ASSERT_NE(mtu, 0u);
    Buf src(a.pd, mtu), dst(b.pd, 3 * (mtu + 40));
    src.fill(7);
    dst.set(0);
    const size_t sizes[3] = {0, 17, mtu};
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(post_recv(qb, 10 + i, {dst.sge(size_t(i) * (mtu + 40), mtu + 40)}), 0);
    // DSCP 10 with ECT(0), and a TTL of 9: what the receiver's GRH shows.
    ibv_ah *ah = a.ah(b.gid, 0x2A, 9);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(
            post_ud(qa, 1 + i, ah, qb->qp_num, kQkey,
                    sizes[i] ? std::vector<ibv_sge>{src.sge(0, sizes[i])} : std::vector<ibv_sge>{},
                    i == 1 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, 0xABCD),
            0);
    std::vector<ibv_wc> sc = poll_n(a.scq, 3);
    ASSERT_EQ(sc.size(), 3u);
    for (int i = 0; i < 3; i++)
        expect_wc(sc[i], {uint64_t(1 + i), IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    std::vector<ibv_wc> rc = poll_n(b.rcq, 3);
    ASSERT_EQ(rc.size(), 3u);
    for (int i = 0; i < 3; i++) {
        SCOPED_TRACE(i);
        unsigned flags = IBV_WC_GRH | (i == 1 ? IBV_WC_WITH_IMM : 0);
        expect_wc(rc[i], {uint64_t(10 + i), IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num,
                          int64_t(40 + sizes[i]), flags, 0xABCD});
        EXPECT_EQ(rc[i].src_qp, qa->qp_num);
        // The SL of a RoCE UD completion names the header type, as RNICs
        // report it: UCX's UD transport reads it to find the addresses.
        EXPECT_EQ(rc[i].sl, 2) << "RDMA_NETWORK_IPV4";
        const uint8_t *grh = dst.data() + size_t(i) * (mtu + 40);
        auto be16 = [](const uint8_t *p) { return uint32_t(p[0] << 8 | p[1]); };
        // RoCEv2 over IPv4: 20 zero bytes, then the packet's IPv4 header.
        EXPECT_TRUE(all_bytes(grh, 20, 0));
        EXPECT_EQ(grh[20], 0x45);
        EXPECT_EQ(grh[20 + 1], 0x2A) << "TOS: the sender's traffic class";
        EXPECT_EQ(be16(grh + 20 + 2),
                  20 + 8 + 12 + 8 + (i == 1 ? 4 : 0) + sizes[i] + (4 - sizes[i] % 4) % 4 + 4)
            << "total length: IP, UDP, BTH, DETH, immediate, data, pad, ICRC";
        EXPECT_EQ(grh[20 + 8], 9) << "TTL: the sender's hop limit";
        EXPECT_EQ(grh[20 + 9], 17); // UDP
        uint32_t sum = 0;
        for (int k = 0; k < 20; k += 2)
            sum += be16(grh + 20 + k);
        EXPECT_EQ((sum & 0xFFFF) + (sum >> 16), 0xFFFFu) << "header checksum";
        EXPECT_EQ(std::memcmp(grh + 32, a.gid.raw + 12, 4), 0) << "source address";
        EXPECT_EQ(std::memcmp(grh + 36, b.gid.raw + 12, 4), 0) << "destination address";
        EXPECT_TRUE(same_bytes(grh + 40, src.data(), sizes[i]));
    }
    // The receiver answers through an address handle built from the
    // completion and its GRH.
    ibv_ah *back = ibv_create_ah_from_wc(
        b.pd, &rc[2], reinterpret_cast<ibv_grh *>(dst.data() + 2 * (mtu + 40)), 1);
    ASSERT_NE(back, nullptr) << std::strerror(errno);
    b.ahs.push_back(back);
    Buf reply(b.pd, 64), got(a.pd, 64 + 40);
    reply.fill(9);
    ASSERT_EQ(post_recv(qa, 20, {got.sge(0, 64 + 40)}), 0);
    ASSERT_EQ(post_ud(qb, 21, back, rc[2].src_qp, kQkey, {reply.sge(0, 64)}), 0);
    expect_one(a.rcq, {20, IBV_WC_SUCCESS, IBV_WC_RECV, qa->qp_num, 104, IBV_WC_GRH});
    expect_one(b.scq, {21, IBV_WC_SUCCESS, IBV_WC_SEND, qb->qp_num});
    EXPECT_TRUE(same_bytes(got.data() + 40, reply.data(), 64));
}

TEST_F(Ud, WrongQkeyIsDroppedAndAControlledQkeyMeansTheQpsOwn) {
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    Buf src(a.pd, 64), dst(b.pd, 2 * 104);
    src.fill(3);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 104)}), 0);
    ASSERT_EQ(post_recv(qb, 2, {dst.sge(104, 104)}), 0);
    ibv_ah *ah = a.ah(b.gid);
    ASSERT_EQ(post_ud(qa, 1, ah, qb->qp_num, kQkey + 1, {src.sge(0, 64)}), 0);
    expect_one(a.scq, {1, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    EXPECT_TRUE(drain(b.rcq, 100ms).empty()) << "a datagram with the wrong Q_Key was received";
    // The high bit asks for the sending QP's Q_Key, which matches.
    ASSERT_EQ(post_ud(qa, 2, ah, qb->qp_num, 0x80000000u, {src.sge(0, 64)}), 0);
    expect_one(a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    expect_one(b.rcq, {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 104, IBV_WC_GRH});
}

TEST_F(Ud, MessageLimitsAndReceiveTooSmall) {
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    const uint32_t mtu = active_mtu(g_ctx[0]);
    ASSERT_NE(mtu, 0u);
    Buf src(a.pd, mtu + 1), dst(b.pd, 400);
    src.fill(5);
    ibv_ah *ah = a.ah(b.gid);
    // One datagram is one packet: more than the MTU is refused at posting.
    EXPECT_EQ(post_ud(qa, 1, ah, qb->qp_num, kQkey, {src.sge(0, mtu + 1)}), EINVAL);
    // READ and WRITE do not exist on UD.
    EXPECT_EQ(post_ud(qa, 1, ah, qb->qp_num, kQkey, {src.sge(0, 8)}, IBV_WR_RDMA_WRITE), EINVAL);
    // A receive too small for GRH + payload completes in error; the QP lives on.
    ASSERT_EQ(post_recv(qb, 5, {dst.sge(0, 100)}), 0);
    ASSERT_EQ(post_recv(qb, 6, {dst.sge(100, 300)}), 0);
    ASSERT_EQ(post_ud(qa, 2, ah, qb->qp_num, kQkey, {src.sge(0, 200)}), 0);
    ASSERT_EQ(post_ud(qa, 3, ah, qb->qp_num, kQkey, {src.sge(0, 200)}), 0);
    std::vector<ibv_wc> rc = poll_n(b.rcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    expect_wc(rc[0], {5, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, qb->qp_num});
    expect_wc(rc[1], {6, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 240, IBV_WC_GRH});
    EXPECT_EQ(qp_state(qb), IBV_QPS_RTS);
    EXPECT_TRUE(same_bytes(dst.data() + 140, src.data(), 200));
    EXPECT_EQ(poll_n(a.scq, 2).size(), 2u);
}

TEST_F(Ud, QpExWorkRequestsWithUdAddress) {
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_UD;
    ia.send_cq = a.scq;
    ia.recv_cq = a.rcq;
    ia.cap = {16, 16, 1, 1, 64};
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.pd = a.pd;
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    ia.sq_sig_all = 1;
    ibv_qp *qa = ibv_create_qp_ex(g_ctx[0], &ia);
    ASSERT_NE(qa, nullptr) << std::strerror(errno);
    a.qps.push_back(qa);
    // RDMA operations cannot be enabled on a UD QP.
    ia.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE;
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(g_ctx[0], &ia), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    ibv_qp *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    Buf dst(b.pd, 200);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 100)}), 0);
    ASSERT_EQ(post_recv(qb, 2, {dst.sge(100, 100)}), 0);
    ibv_qp_ex *x = ibv_qp_to_qp_ex(qa);
    ibv_ah *ah = a.ah(b.gid);
    char msg[] = "datagram";
    ibv_wr_start(x);
    x->wr_id = 7;
    x->wr_flags = IBV_SEND_INLINE;
    ibv_wr_send(x);
    ibv_wr_set_ud_addr(x, ah, qb->qp_num, kQkey);
    ibv_wr_set_inline_data(x, msg, sizeof msg);
    x->wr_id = 8;
    ibv_wr_send_imm(x, htonl(99));
    ibv_wr_set_ud_addr(x, ah, qb->qp_num, kQkey);
    ibv_wr_set_inline_data(x, msg, 4);
    ASSERT_EQ(ibv_wr_complete(x), 0);
    std::vector<ibv_wc> rc = poll_n(b.rcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    expect_wc(rc[0], {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 40 + sizeof msg, IBV_WC_GRH});
    expect_wc(rc[1],
              {2, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 44, IBV_WC_GRH | IBV_WC_WITH_IMM, 99});
    EXPECT_STREQ(reinterpret_cast<const char *>(dst.data() + 40), "datagram");
    EXPECT_EQ(poll_n(a.scq, 2).size(), 2u);
}

TEST_F(Ud, StateTransitionsFollowTheUdTable) {
    ibv_qp *q = a.qp(IBV_QPT_UD);
    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_INIT;
    x.port_num = 1;
    x.qp_access_flags = 0;
    // UD's INIT needs a Q_Key and takes no access flags.
    EXPECT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
    EXPECT_EQ(ibv_modify_qp(q, &x,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                IBV_QP_ACCESS_FLAGS),
              EINVAL);
    x.qkey = kQkey;
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
              0);
    x = {};
    x.qp_state = IBV_QPS_RTR;
    x.path_mtu = IBV_MTU_1024;
    EXPECT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PATH_MTU), EINVAL) << "no path on UD";
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE), 0);
    x.qp_state = IBV_QPS_RTS;
    EXPECT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE), EINVAL) << "RTS needs the SQ PSN";
    x.qkey = 0x42;
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_QKEY), 0);
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibv_query_qp(q, &got, IBV_QP_QKEY | IBV_QP_STATE, &init), 0);
    EXPECT_EQ(got.qkey, 0x42u);
    EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(init.qp_type, IBV_QPT_UD);
}

// ---------------------------------------------------------------------------
// UC

TEST_F(Ud, UcCarriesMultiPacketSendsAndWrites) {
    ibv_qp *qa = a.qp(IBV_QPT_UC), *qb = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, false));
    const size_t len = 5 * 1024 + 3;
    Buf src(a.pd, len), dst(b.pd, len), mem(b.pd, len);
    src.fill(11);
    dst.set(0);
    mem.set(0);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, len)}), 0);
    ASSERT_EQ(post_recv(qb, 2, {}), 0);
    ASSERT_EQ(post_send_imm(qa, 1, {src.sge(0, len)}, 5), 0);
    ASSERT_EQ(post_rdma(qa, 2, IBV_WR_RDMA_WRITE_WITH_IMM, {src.sge(0, len)}, mem.addr(),
                        mem.rkey(), IBV_SEND_SIGNALED, 6),
              0);
    std::vector<ibv_wc> sc = poll_n(a.scq, 2);
    ASSERT_EQ(sc.size(), 2u);
    expect_wc(sc[0], {1, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    expect_wc(sc[1], {2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, qa->qp_num});
    std::vector<ibv_wc> rc = poll_n(b.rcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    expect_wc(rc[0],
              {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, int64_t(len), IBV_WC_WITH_IMM, 5});
    expect_wc(rc[1], {2, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, qb->qp_num, int64_t(len),
                      IBV_WC_WITH_IMM, 6});
    EXPECT_EQ(rc[0].src_qp, qa->qp_num);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), len));
    EXPECT_TRUE(same_bytes(mem.data(), src.data(), len));
    // UC has no READ and no atomics.
    EXPECT_EQ(post_rdma(qa, 3, IBV_WR_RDMA_READ, {src.sge(0, 8)}, mem.addr(), mem.rkey()), EINVAL);
    EXPECT_EQ(
        post_atomic(qa, 4, IBV_WR_ATOMIC_FETCH_AND_ADD, src.sge(0, 8), mem.addr(), mem.rkey(), 1),
        EINVAL);
}

// Nothing acknowledges UC: a WQE that failed its local checks behind one
// already sent must still complete, in order, and fail the QP.
TEST_F(Ud, UcLocalErrorBehindASentWqeCompletes) {
    ibv_qp *qa = a.qp(IBV_QPT_UC), *qb = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, false));
    Buf src(a.pd, 64), dst(b.pd, 64);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 64)}), 0);
    std::vector<ibv_sge> good{src.sge(0, 64)}, bad{src.sge(0, 64)};
    bad[0].lkey ^= 0x00FF0000u;
    ibv_send_wr wr[2] = {send_wr(1, IBV_WR_SEND, good), send_wr(2, IBV_WR_SEND, bad)};
    wr[0].next = &wr[1];
    ibv_send_wr *badwr = nullptr;
    ASSERT_EQ(ibv_post_send(qa, wr, &badwr), 0);
    std::vector<ibv_wc> sc = poll_n(a.scq, 2);
    ASSERT_EQ(sc.size(), 2u);
    expect_wc(sc[0], {1, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    expect_wc(sc[1], {2, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND, qa->qp_num});
    EXPECT_EQ(qp_state(qa), IBV_QPS_ERR);
    expect_one(b.rcq, {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 64});
    // IBTA defines no UC SEND WITH INVALIDATE.
    ibv_qp *qc = a.qp(IBV_QPT_UC), *qd = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qc, a, qd, b, false));
    ibv_send_wr inv = send_wr(3, IBV_WR_SEND_WITH_INV, good);
    inv.invalidate_rkey = 0x1234;
    EXPECT_EQ(post(qc, inv), EINVAL);
}

TEST_F(Ud, UcBadRkeyLosesTheMessageNotTheQp) {
    ibv_qp *qa = a.qp(IBV_QPT_UC), *qb = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, false));
    Buf src(a.pd, 256), mem(b.pd, 256);
    src.fill(13);
    mem.set(0);
    ASSERT_EQ(
        post_rdma(qa, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 256)}, mem.addr(), mem.rkey() ^ 0x100), 0);
    ASSERT_EQ(post_rdma(qa, 2, IBV_WR_RDMA_WRITE, {src.sge(0, 256)}, mem.addr(), mem.rkey()), 0);
    // A send behind the writes: once it is received the writes before it
    // have been executed (UC keeps a QP's messages in order).
    ASSERT_EQ(post_recv(qb, 3, {mem.sge(0, 0)}), 0);
    ASSERT_EQ(post_send(qa, 3, {}), 0);
    ASSERT_EQ(poll_n(a.scq, 3).size(), 3u);
    expect_one(b.rcq, {3, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 0});
    // The second write landed, so the first one was dropped rather than the QP failed.
    EXPECT_EQ(qp_state(qb), IBV_QPS_RTS);
    EXPECT_TRUE(same_bytes(mem.data(), src.data(), 256));
}

// ---------------------------------------------------------------------------
// Shared receive queues

TEST_F(Ud, SrqFeedsSeveralQps) {
    ibv_srq *srq = b.srq(16);
    ibv_qp *a1 = a.qp(IBV_QPT_RC), *a2 = a.qp(IBV_QPT_RC);
    ibv_qp *b1 = b.qp(IBV_QPT_RC, srq), *b2 = b.qp(IBV_QPT_RC, srq);
    ASSERT_NO_FATAL_FAILURE(connect(a1, a, b1, b, true));
    ASSERT_NO_FATAL_FAILURE(connect(a2, a, b2, b, true));
    Buf src(a.pd, 4096), dst(b.pd, 8 * 512);
    src.fill(17);
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(post_srq(srq, 100 + i, {dst.sge(size_t(i) * 512, 512)}), 0);
    // A QP on an SRQ has no receive queue of its own.
    EXPECT_EQ(post_recv(b1, 1, {dst.sge(0, 8)}), EINVAL);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(post_send(a1, 1 + i, {src.sge(size_t(i) * 100, 100 + i)}), 0);
        ASSERT_EQ(post_send(a2, 11 + i, {src.sge(size_t(i) * 100, 200 + i)}), 0);
    }
    ASSERT_EQ(poll_n(a.scq, 8).size(), 8u);
    std::vector<ibv_wc> rc = poll_n(b.rcq, 8);
    ASSERT_EQ(rc.size(), 8u);
    std::vector<uint64_t> ids;
    int from1 = 0, from2 = 0;
    for (const ibv_wc &wc : rc) {
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
        ids.push_back(wc.wr_id);
        int slot = int(wc.wr_id - 100);
        bool one = wc.qp_num == b1->qp_num;
        EXPECT_TRUE(one || wc.qp_num == b2->qp_num);
        int k = one ? from1++ : from2++;
        uint32_t want = uint32_t((one ? 100 : 200) + k);
        EXPECT_EQ(wc.byte_len, want);
        Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, b1});
        EXPECT_TRUE(
            same_bytes(dst.data() + size_t(slot) * 512, src.data() + size_t(k) * 100, want));
    }
    std::sort(ids.begin(), ids.end());
    for (int i = 0; i < 8; i++)
        EXPECT_EQ(ids[size_t(i)], uint64_t(100 + i)) << "each SRQ WQE used once";
    EXPECT_EQ(from1, 4);
    EXPECT_EQ(from2, 4);
}

TEST_F(Ud, SrqLimitEventAndQueries) {
    ibv_srq *srq = b.srq(8);
    ibv_srq_attr sa{};
    ASSERT_EQ(ibv_query_srq(srq, &sa), 0);
    EXPECT_EQ(sa.max_wr, 8u);
    EXPECT_EQ(sa.max_sge, 2u);
    EXPECT_EQ(sa.srq_limit, 0u);
    sa.srq_limit = 9;
    EXPECT_EQ(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL) << "limit above max_wr";
    ibv_qp *qa = a.qp(IBV_QPT_RC), *qb = b.qp(IBV_QPT_RC, srq);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, true));
    Buf src(a.pd, 64), dst(b.pd, 8 * 64);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(post_srq(srq, uint64_t(i), {dst.sge(size_t(i) * 64, 64)}), 0);
    sa.srq_limit = 3;
    ASSERT_EQ(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), 0);
    ASSERT_EQ(post_send(qa, 1, {src.sge(0, 8)}), 0); // leaves 3: not below the limit
    ASSERT_EQ(poll_n(b.rcq, 1).size(), 1u);
    ibv_async_event ev{};
    EXPECT_FALSE(next_event(g_ctx[1], &ev, 100)) << "event " << ev.event_type << " too early";
    ASSERT_EQ(post_send(qa, 2, {src.sge(0, 8)}), 0); // leaves 2
    ASSERT_EQ(poll_n(b.rcq, 1).size(), 1u);
    ASSERT_TRUE(next_event(g_ctx[1], &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
    EXPECT_EQ(ev.element.srq, srq);
    ASSERT_EQ(ibv_query_srq(srq, &sa), 0);
    EXPECT_EQ(sa.srq_limit, 0u) << "the limit disarms when it fires";
    // A QP still attached keeps its SRQ alive.
    EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
    // Resizing keeps what is posted.
    sa.max_wr = 32;
    ASSERT_EQ(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR), 0);
    ASSERT_EQ(ibv_query_srq(srq, &sa), 0);
    EXPECT_EQ(sa.max_wr, 32u);
    ASSERT_EQ(post_send(qa, 3, {src.sge(0, 8)}), 0);
    std::vector<ibv_wc> rc = poll_n(b.rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].wr_id, 2u);
    // An SRQ QP that fails says when it will consume nothing more.
    ASSERT_EQ(to_state(qb, IBV_QPS_ERR), 0);
    ASSERT_TRUE(next_event(g_ctx[1], &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
    EXPECT_EQ(ev.element.qp, qb);
    // The SRQ's remaining WQE stays for other QPs: nothing is flushed.
    EXPECT_TRUE(drain(b.rcq, 20ms).empty());
}

// ---------------------------------------------------------------------------
// XRC

TEST_F(Ud, XrcSendsReachTheNamedSrq) {
    ibv_cq *xcq = ibv_create_cq(g_ctx[1], 64, nullptr, nullptr, 0);
    ASSERT_NE(xcq, nullptr);
    Xrc x;
    ASSERT_NO_FATAL_FAILURE(x.make(a, b, xcq, 16));
    ibv_srq *second = x.xrc_srq(b, xcq, 16);
    ASSERT_NE(second, nullptr) << std::strerror(errno);
    ibv_srq *srqs[2] = {x.srq, second};
    uint32_t srqn[2] = {x.srqn, 0};
    ASSERT_EQ(ibv_get_srq_num(second, &srqn[1]), 0);
    EXPECT_NE(srqn[0], srqn[1]);
    // The domain is in use.
    EXPECT_EQ(ibv_close_xrcd(x.xrcd), EBUSY);
    ibv_qp *ini = x.send_qp, *tgt = x.recv_qp;
    ASSERT_NO_FATAL_FAILURE(connect(ini, a, tgt, b, true));
    // Attributes of the other half of the pair are ignored, as the kernel's
    // uverbs does (perftest sets them on both).
    ibv_qp_attr extra{};
    extra.max_dest_rd_atomic = 4;
    extra.min_rnr_timer = 1;
    EXPECT_EQ(ibv_modify_qp(ini, &extra, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), 0)
        << "a send QP's responder attributes are dropped, not refused";
    extra = {};
    extra.qp_state = IBV_QPS_RTS;
    extra.retry_cnt = 7;
    EXPECT_EQ(ibv_modify_qp(tgt, &extra, IBV_QP_STATE | IBV_QP_RETRY_CNT), 0);

    Buf src(a.pd, 256), dst(b.pd, 2 * 256), mem(b.pd, 64);
    src.fill(23);
    mem.set(0);
    ASSERT_EQ(post_srq(srqs[0], 50, {dst.sge(0, 256)}), 0);
    ASSERT_EQ(post_srq(srqs[1], 51, {dst.sge(256, 256)}), 0);
    for (int i = 1; i >= 0; i--) {
        std::vector<ibv_sge> sg{src.sge(0, size_t(100 + i))};
        ibv_send_wr wr = send_wr(uint64_t(i), IBV_WR_SEND, sg);
        wr.qp_type.xrc.remote_srqn = srqn[i];
        ibv_send_wr *bad = nullptr;
        ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
    }
    std::vector<ibv_sge> sg{src.sge(0, 64)};
    ibv_send_wr wr = send_wr(9, IBV_WR_RDMA_WRITE, sg);
    wr.wr.rdma.remote_addr = mem.addr();
    wr.wr.rdma.rkey = mem.rkey();
    wr.qp_type.xrc.remote_srqn = srqn[0];
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
    ASSERT_EQ(poll_n(a.scq, 3).size(), 3u);
    std::vector<ibv_wc> rc = poll_n(xcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    expect_wc(rc[0], {51, IBV_WC_SUCCESS, IBV_WC_RECV, tgt->qp_num, 101});
    expect_wc(rc[1], {50, IBV_WC_SUCCESS, IBV_WC_RECV, tgt->qp_num, 100});
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, tgt});
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 100));
    EXPECT_TRUE(same_bytes(dst.data() + 256, src.data(), 101));
    EXPECT_TRUE(same_bytes(mem.data(), src.data(), 64));
    EXPECT_TRUE(drain(b.rcq).empty());

    EXPECT_EQ(ibv_destroy_srq(second), 0);
    x.destroy();
    EXPECT_EQ(ibv_destroy_cq(xcq), 0);
}

// ---------------------------------------------------------------------------
// Tag matching

// A TMH (and RVH) at the start of a send buffer, as a tag-matching sender
// writes them.
void put_tmh(uint8_t *p, uint8_t op, uint32_t ctx, uint64_t tag) {
    std::memset(p, 0, 16);
    p[0] = op;
    uint32_t c = htonl(ctx);
    std::memcpy(p + 4, &c, 4);
    for (int i = 0; i < 8; i++)
        p[8 + i] = uint8_t(tag >> (56 - 8 * i));
}

struct TmCqe {
    uint64_t wr_id;
    ibv_wc_status status;
    ibv_wc_opcode opcode;
    unsigned flags;
    uint32_t byte_len;
    ibv_wc_tm_info tm;
};

std::vector<TmCqe> poll_tm(ibv_cq_ex *cq, size_t n, Clock::duration within = kDeadline) {
    std::vector<TmCqe> out;
    auto end = Clock::now() + within;
    ibv_poll_cq_attr pa{};
    while (out.size() < n && Clock::now() < end) {
        if (ibv_start_poll(cq, &pa) != 0) continue;
        do {
            TmCqe c{cq->wr_id,
                    cq->status,
                    ibv_wc_read_opcode(cq),
                    ibv_wc_read_wc_flags(cq),
                    ibv_wc_read_byte_len(cq),
                    {}};
            ibv_wc_read_tm_info(cq, &c.tm);
            out.push_back(c);
        } while (out.size() < n && ibv_next_poll(cq) == 0);
        ibv_end_poll(cq);
    }
    return out;
}

TEST_F(Ud, TagMatchingEagerUnexpectedNoTagAndRendezvous) {
    ibv_device_attr_ex dx{};
    ASSERT_EQ(ibv_query_device_ex(g_ctx[1], nullptr, &dx), 0);
    ASSERT_TRUE(dx.tm_caps.flags & IBV_TM_CAP_RC);
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 64;
    ca.wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_TM_INFO;
    ibv_cq_ex *tcq = ibv_create_cq_ex(g_ctx[1], &ca);
    ASSERT_NE(tcq, nullptr) << std::strerror(errno);
    ibv_srq_init_attr_ex sa{};
    sa.attr = {16, 1, 0};
    sa.comp_mask =
        IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    sa.srq_type = IBV_SRQT_TM;
    sa.pd = b.pd;
    sa.cq = ibv_cq_ex_to_cq(tcq);
    sa.tm_cap = {4, 4};
    ibv_srq *srq = ibv_create_srq_ex(g_ctx[1], &sa);
    ASSERT_NE(srq, nullptr) << std::strerror(errno);
    b.srqs.push_back(srq);
    ibv_qp *qa = a.qp(IBV_QPT_RC), *qb = b.qp(IBV_QPT_RC, srq);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, true));
    constexpr size_t kLen = 200;
    Buf src(a.pd, 4 * kLen), tagged(b.pd, 2 * kLen), plain(b.pd, 4 * kLen), fin(a.pd, 64);
    src.fill(61);
    tagged.set(0);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(post_srq(srq, uint64_t(100 + i), {plain.sge(size_t(i) * kLen, kLen)}), 0);
    ASSERT_EQ(post_recv(qa, 7, {fin.sge(0, 64)}), 0);
    // Two tagged buffers; the second is removed again.
    ibv_ops_wr op{};
    ibv_sge s0 = tagged.sge(0, kLen), s1 = tagged.sge(kLen, kLen);
    op.wr_id = 1;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED;
    op.tm.add = {11, &s0, 1, 0x5000, 0xFFFF};
    ibv_ops_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    uint32_t h0 = op.tm.handle;
    op.wr_id = 2;
    op.tm.add = {12, &s1, 1, 0x6000, 0xFFFF};
    ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    op.wr_id = 3;
    op.opcode = IBV_WR_TAG_DEL;
    ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), EINVAL) << "deleted twice";
    std::vector<TmCqe> ops = poll_tm(tcq, 3);
    ASSERT_EQ(ops.size(), 3u);
    EXPECT_EQ(ops[0].opcode, IBV_WC_TM_ADD);
    EXPECT_EQ(ops[2].opcode, IBV_WC_TM_DEL);
    EXPECT_NE(h0, op.tm.handle);

    // EAGER matching tag 0x5000 (and only the low 16 bits count): its data,
    // without the TMH, land in the tagged buffer.
    put_tmh(src.data(), IBV_TMH_EAGER, 0xC0FFEE, 0xAB5000);
    ASSERT_EQ(post_send(qa, 1, {src.sge(0, kLen)}), 0);
    // EAGER with a tag no buffer has, and NO_TAG: ordinary receives, whole.
    put_tmh(src.data() + kLen, IBV_TMH_EAGER, 1, 0x6000);
    ASSERT_EQ(post_send(qa, 2, {src.sge(kLen, kLen)}), 0);
    put_tmh(src.data() + 2 * kLen, IBV_TMH_NO_TAG, 2, 0);
    ASSERT_EQ(post_send(qa, 3, {src.sge(2 * kLen, kLen)}), 0);
    ASSERT_EQ(poll_n(a.scq, 3).size(), 3u);
    std::vector<TmCqe> rc = poll_tm(tcq, 3);
    ASSERT_EQ(rc.size(), 3u);
    EXPECT_EQ(rc[0].wr_id, 11u);
    EXPECT_EQ(rc[0].opcode, IBV_WC_TM_RECV);
    EXPECT_EQ(rc[0].flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID),
              unsigned(IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
    EXPECT_EQ(rc[0].byte_len, kLen - 16);
    EXPECT_EQ(rc[0].tm.tag, 0xAB5000u);
    EXPECT_EQ(rc[0].tm.priv, 0xC0FFEEu);
    EXPECT_EQ(rc[1].wr_id, 100u);
    EXPECT_EQ(rc[1].opcode, IBV_WC_TM_RECV);
    EXPECT_EQ(rc[1].flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u) << "unexpected";
    EXPECT_EQ(rc[1].byte_len, kLen);
    EXPECT_EQ(rc[2].wr_id, 101u);
    EXPECT_EQ(rc[2].opcode, IBV_WC_TM_NO_TAG);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    EXPECT_TRUE(same_bytes(tagged.data(), src.data() + 16, kLen - 16));
    EXPECT_TRUE(same_bytes(plain.data(), src.data() + kLen, kLen));
    EXPECT_TRUE(same_bytes(plain.data() + kLen, src.data() + 2 * kLen, kLen));

    // RNDV: the match is reported, the data are READ from the sender's
    // buffer, and a FIN tells the sender so.
    op = {};
    op.wr_id = 4;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED;
    op.tm.add = {13, &s0, 1, 0x7000, 0xFFFF};
    ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    ASSERT_EQ(poll_tm(tcq, 1).size(), 1u);
    uint8_t *req = src.data() + 3 * kLen;
    put_tmh(req, IBV_TMH_RNDV, 9, 0x7000);
    uint64_t va = src.addr(0);
    uint32_t rk = htonl(src.rkey()), len = htonl(uint32_t(kLen));
    for (int i = 0; i < 8; i++)
        req[16 + i] = uint8_t(va >> (56 - 8 * i));
    std::memcpy(req + 24, &rk, 4);
    std::memcpy(req + 28, &len, 4);
    tagged.set(0);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    ASSERT_EQ(post_send(qa, 4, {src.sge(3 * kLen, 32)}), 0);
    ASSERT_EQ(poll_n(a.scq, 1).size(), 1u);
    std::vector<TmCqe> rv = poll_tm(tcq, 2);
    ASSERT_EQ(rv.size(), 2u);
    EXPECT_EQ(rv[0].wr_id, 13u);
    EXPECT_EQ(rv[0].flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned(IBV_WC_TM_MATCH));
    EXPECT_EQ(rv[0].tm.tag, 0x7000u);
    EXPECT_EQ(rv[1].wr_id, 13u);
    EXPECT_EQ(rv[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rv[1].flags & IBV_WC_TM_DATA_VALID, unsigned(IBV_WC_TM_DATA_VALID));
    EXPECT_EQ(rv[1].byte_len, kLen);
    std::vector<ibv_wc> f = poll_n(a.rcq, 1);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].wr_id, 7u);
    EXPECT_EQ(fin.data()[0], IBV_TMH_FIN);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    EXPECT_TRUE(same_bytes(tagged.data(), src.data(), kLen));

    // With the receiving QP's send queue full (its sends wait on the peer's
    // empty receive queue), a rendezvous has no room for its READ: it is
    // refused RNR, without consuming the tag, and lands once there is room.
    op.wr_id = 5;
    op.tm.add = {14, &s1, 1, 0x7100, 0xFFFF};
    ASSERT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    ASSERT_EQ(poll_tm(tcq, 1).size(), 1u);
    // The last READ's FIN may still hold a slot until its ACK is in: fill
    // until the queue has stayed full for a while.
    uint64_t filled = 0;
    for (int full_for = 0; full_for < 5;) {
        int rc = post_send(qb, 200 + filled, {plain.sge(0, 8)});
        if (rc == 0) {
            filled++;
            full_for = 0;
            continue;
        }
        ASSERT_EQ(rc, ENOMEM) << "a full send queue";
        full_for++;
        std::this_thread::sleep_for(20ms);
    }
    ASSERT_EQ(filled, 64u) << "the send queue holds max_send_wr WQEs";
    put_tmh(req, IBV_TMH_RNDV, 10, 0x7100);
    tagged.set(0);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    ASSERT_EQ(post_send(qa, 5, {src.sge(3 * kLen, 32)}), 0);
    EXPECT_TRUE(poll_tm(tcq, 1, 200ms).empty()) << "matched with no room for the READ";
    EXPECT_TRUE(drain(a.scq, 0ms).empty());
    for (uint64_t i = 0; i < 64; i++)
        ASSERT_EQ(post_recv(qa, 400 + i, {fin.sge(0, 64)}), 0);
    ASSERT_EQ(poll_n(b.scq, 64).size(), 64u);
    ASSERT_EQ(poll_n(a.rcq, 64).size(), 64u);
    ASSERT_EQ(post_recv(qa, 500, {fin.sge(0, 64)}), 0); // for the FIN
    expect_one(a.scq, {5, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    rv = poll_tm(tcq, 2);
    ASSERT_EQ(rv.size(), 2u);
    EXPECT_EQ(rv[0].wr_id, 14u);
    EXPECT_EQ(rv[0].tm.tag, 0x7100u);
    EXPECT_EQ(rv[1].wr_id, 14u);
    EXPECT_EQ(rv[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rv[1].flags & IBV_WC_TM_DATA_VALID, unsigned(IBV_WC_TM_DATA_VALID));
    expect_one(a.rcq, {500, IBV_WC_SUCCESS, IBV_WC_RECV, qa->qp_num});
    EXPECT_EQ(fin.data()[0], IBV_TMH_FIN);
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    EXPECT_TRUE(same_bytes(tagged.data() + kLen, src.data(), kLen));
    ibv_destroy_qp(qb);
    b.qps.pop_back();
    ibv_destroy_srq(srq);
    b.srqs.pop_back();
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(tcq)), 0);
}

} // namespace
