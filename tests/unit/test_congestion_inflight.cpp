// SPDX-License-Identifier: MIT
//
// The in-flight cap of a rate-limited QP (inflight-time): at most its rate
// times inflight-time unacknowledged, however many tokens its bucket holds;
// each acknowledgement lets as many more go.  (test_congestion.cpp, without
// the cap, shows the bucket alone.)
//
// The device: a first cut from 800 Mbit/s to 400 Mbit/s, whose bucket holds
// 250 us of it (about 85 small writes), and an inflight-time of 10 us: 500
// bytes, three small writes.
#define FAKE_PEER_LINK_OPTIONS                                                                     \
    " cc dcqcn cnp-interval 1000 cut-interval 0 first-rate 800 alpha-timer 1000000"                \
    " rate-timer 1000000 rate-bytes 1000000000 inflight-time 10"
#include "congestion_fixture.hpp"

namespace {

using namespace fake_peer;
using namespace cc_test;

TEST_F(Cc, LimitedQpKeepsItsRatesWorthInFlight) {
    ASSERT_NO_FATAL_FAILURE(first_cnp_after(8));
    post_small_writes(12);
    // A millisecond fills the bucket far past three writes; the cap holds
    // the QP to three until they are acknowledged.
    advance(kMs);
    uint32_t msn = 8;
    for (int round = 0; round < 4; round++) {
        std::string when = "round " + std::to_string(round + 1);
        ASSERT_NO_FATAL_FAILURE(expect_writes(3, when));
        expect_silence();
        msn += 3;
        send(ack(psn_add(next_sq_psn, kPsnMask), aeth::kAck | aeth::kNoCredits, msn));
        for (int i = 0; i < 3; i++) {
            std::optional<ibv_wc> wc = poll_wc();
            ASSERT_TRUE(wc) << when << ": completion " << i;
            EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
        }
    }
    expect_silence();
}

} // namespace
