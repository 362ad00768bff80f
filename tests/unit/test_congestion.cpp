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
