// SPDX-License-Identifier: MIT
//
// Congestion control against the fake peer (fake_peer.hpp), on a clock the
// test moves: what sroce answers to CE marks (ECN-capable packets, one CNP
// per interval, to the right QP, in RoCEv2's format) and what its rate
// limiter does with the CNPs it gets, packet by packet.
//
// The device: CNPs at most every millisecond, rate cuts as often as CNPs
// come, a first cut taken from 8 Mbit/s, α that does not decay within a
// test, a rate increase every 5 ms and none by bytes sent, and no cap on
// what is in flight (test_congestion_inflight.cpp has it).
#define FAKE_PEER_LINK_OPTIONS                                                                     \
    " cc dcqcn cnp-interval 1000 cut-interval 0 first-rate 8 alpha-timer 1000000"                  \
    " rate-timer 5000 rate-bytes 1000000000 inflight-time 0"
#include "congestion_fixture.hpp"

namespace {

using namespace fake_peer;
using namespace cc_test;

TEST_F(Cc, CeMarkedRequestsGetOneCnpPerInterval) {
    // Not marked, ECN-capable: nothing to report.
    ASSERT_NO_FATAL_FAILURE(peer_write(kEct0, false));
    // Marked: a CNP to the sender's QP, and the ACK.
    ASSERT_NO_FATAL_FAILURE(peer_write(kEcnCe, true));
    // Marked again within the interval (the clock stands still): no CNP.
    ASSERT_NO_FATAL_FAILURE(peer_write(kEcnCe, false));
    advance(999'000);
    ASSERT_NO_FATAL_FAILURE(peer_write(kEcnCe | 0xB8, false));
    // Once the interval has passed, the next mark is reported; DSCP bits do
    // not matter, ECN's two do.
    advance(1'000);
    ASSERT_NO_FATAL_FAILURE(peer_write(kEcnCe | 0xB8, true));
    advance(5 * kMs);
    ASSERT_NO_FATAL_FAILURE(peer_write(0xB8 | kEct0, false));
    ASSERT_NO_FATAL_FAILURE(peer_write(kEcnCe, true));
}

TEST_F(Cc, CeMarkedResponsesAreNotReported) {
    // sroce's requests are paced by CNPs; its peer's ACKs and READ
    // responses are not, so their marks are not reported.
    post_small_writes(1);
    ASSERT_NO_FATAL_FAILURE(expect_writes(1, "the write"));
    send_tc(ack(kSqPsn, aeth::kAck | aeth::kNoCredits, 1), kEcnCe);
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    expect_silence();
}

TEST_F(Cc, CnpCutsTheRateAndThePacketsFollowIt) {
    // The first CNP: the rate is cut from 8 Mbit/s (first-rate) by α/2,
    // α starting at 1: 4 Mbit/s, 500 bytes a millisecond.  Nothing leaves
    // until the clock moves.
    ASSERT_NO_FATAL_FAILURE(first_cnp_after(16));
    post_small_writes(40);
    expect_silence();
    ASSERT_NO_FATAL_FAILURE(expect_paced({500, 500, 500, 500}, "at 4 Mbit/s"));

    // A second CNP 4 ms later: α stayed 1 ((1 - g)·1 + g), the target
    // becomes 4 Mbit/s and the rate 2 Mbit/s.  Five milliseconds after the
    // cut the timer's first increase (fast recovery) takes it halfway back
    // to the target: 3 Mbit/s.
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn)));
    ASSERT_NO_FATAL_FAILURE(expect_paced({250, 250, 250, 250, 375, 375}, "after the second CNP"));
    expect_silence();
}

// A UD QP is both roles too: a marked datagram gets a CNP back to the QP
// its DETH names, at the address it came from, and a CNP from anyone it
// sends to paces its sends.
TEST_F(Cc, UdQpsSendAndHonourCnps) {
    constexpr uint32_t kQkey = 0x11223344;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 32;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp *ud = ibv_create_qp(w.pd, &ia);
    ASSERT_NE(ud, nullptr) << strerror(errno);
    struct Closer {
        ibv_qp *qp;
        ibv_ah *ah = nullptr;
        ~Closer() {
            ibv_destroy_qp(qp);
            if (ah) ibv_destroy_ah(ah);
        }
    } closer{ud};
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    ASSERT_EQ(ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(ud, &a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = kSqPsn;
    ASSERT_EQ(ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);

    // Marked and unmarked datagrams from the peer's QP kPeerQpn.
    for (int i = 0; i < 2; i++) {
        ibv_sge sge{uint64_t(uintptr_t(w.buf + 0x4000 + i * 0x400)), 0x400, w.mr->lkey};
        ibv_recv_wr rw{}, *bad = nullptr;
        rw.wr_id = 50 + i;
        rw.sg_list = &sge;
        rw.num_sge = 1;
        ASSERT_EQ(ibv_post_recv(ud, &rw, &bad), 0);
    }
    Bytes deth(kDethLen, 0);
    put32(deth.data(), kQkey);
    put24(deth.data() + 5, kPeerQpn);
    for (uint8_t tc : {kEcnCe, kEct0}) {
        Bytes data = pattern(64, tc);
        send_tc(packet(kUdSendOnly, ud->qp_num, 7, deth, data, false), tc);
        std::optional<ibv_wc> wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
        EXPECT_EQ(wc->src_qp, kPeerQpn);
        EXPECT_EQ(wc->byte_len, 40u + 64u);
        // After the 40 bytes of the GRH.
        EXPECT_EQ(std::memcmp(w.buf + 0x4000 + (wc->wr_id - 50) * 0x400 + 40, data.data(), 64), 0);
        if (tc == kEcnCe) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << "no CNP for the marked datagram";
            expect_cnp(*r);
        }
        expect_silence();
    }

    // Before a CNP the QP sends at once; after it, at 4 Mbit/s.
    ibv_ah_attr ah = peer_ah();
    closer.ah = ibv_create_ah(w.pd, &ah);
    ASSERT_NE(closer.ah, nullptr) << strerror(errno);
    auto post_sends = [&](int n) {
        for (int i = 0; i < n; i++) {
            ibv_sge sge{uint64_t(uintptr_t(w.buf + 0x100)), kSmall, w.mr->lkey};
            ibv_send_wr sw{}, *bad = nullptr;
            sw.sg_list = &sge;
            sw.num_sge = 1;
            sw.opcode = IBV_WR_SEND;
            sw.send_flags = IBV_SEND_SIGNALED;
            sw.wr.ud.ah = closer.ah;
            sw.wr.ud.remote_qpn = kPeerQpn;
            sw.wr.ud.remote_qkey = kQkey;
            ASSERT_EQ(ibv_post_send(ud, &sw, &bad), 0);
        }
    };
    ASSERT_NO_FATAL_FAILURE(post_sends(3));
    ASSERT_NO_FATAL_FAILURE(expect_writes(3, "before the CNP", kUdSendOnly));
    // From any address: a UD QP's peers are whoever it sends to.
    send_tc(cnp(ud->qp_num, kStrangerAddr), 0, &w.stranger);
    ASSERT_NO_FATAL_FAILURE(peer_write(kEct0, false));
    ASSERT_NO_FATAL_FAILURE(post_sends(11));
    expect_silence();
    // 4, 3 and 4 datagrams of 144 bytes in the three milliseconds' 500.
    ASSERT_NO_FATAL_FAILURE(expect_paced({500, 500, 500}, "UD at 4 Mbit/s", kUdSendOnly));
    expect_silence();
    for (int i = 0; i < 14; i++) {
        std::optional<ibv_wc> wc = poll_wc();
        ASSERT_TRUE(wc) << "send completion " << i;
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
}

TEST_F(Cc, CnpsFromOthersAreIgnored) {
    // From an address that is not the peer's, or for a QP that does not
    // exist: nothing changes, and writes still leave at once.
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn, kStrangerAddr), &w.stranger));
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn ^ 0x7F)));
    post_small_writes(8);
    ASSERT_NO_FATAL_FAILURE(expect_writes(8, "after others' CNPs"));
}

TEST_F(Cc, MalformedCnpsAreDropped) {
    // Longer or shorter than a CNP, or with a bad ICRC: dropped silently,
    // and the QP keeps its rate.
    Bytes longer = cnp(qpn);
    longer.insert(longer.end() - kIcrcLen, 4, 0);
    IpHeader ip{IpAddr::v4(ip4(kPeerAddr)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port, kRoceV2Port};
    icrc_store(longer.data() + longer.size() - kIcrcLen,
               icrc_compute(ip, longer.data(), longer.size()));
    Bytes bad_icrc = cnp(qpn);
    bad_icrc[20] ^= 1;
    for (const Bytes &p : {longer, bad_icrc})
        ASSERT_NO_FATAL_FAILURE(deliver_cnp(p));
    post_small_writes(8);
    ASSERT_NO_FATAL_FAILURE(expect_writes(8, "after malformed CNPs"));
}

TEST_F(Cc, ResetForgetsTheRate) {
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn)));
    // The QP taken through RESET and connected again sends at once.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    ASSERT_NO_FATAL_FAILURE(connect_qp(kRqPsn, kSqPsn));
    next_rq_psn = kRqPsn;
    next_sq_psn = kSqPsn;
    post_small_writes(8);
    ASSERT_NO_FATAL_FAILURE(expect_writes(8, "after a reset"));
}

} // namespace
