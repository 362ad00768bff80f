// SPDX-License-Identifier: MIT
//
// How a cut QP's rate comes back, and how the cuts that follow shrink:
// DCQCN's additive increase of the target once the fast recovery stages
// are over, CNPs inside cut-interval that cut nothing, and α decaying by
// the alpha-timer periods without a cut.  (test_congestion.cpp has the
// cut and the fast recovery themselves.)
//
// The device: a first cut from 8 Mbit/s, one fast recovery stage, an
// additive increase of 2 Mbit/s every millisecond and none by bytes sent,
// at most one cut every 3 ms, α's gain 1/2 and its timer 1 ms, no cap on
// what is in flight.  1 Mbit/s is 125 bytes a millisecond.
#define FAKE_PEER_LINK_OPTIONS                                                                     \
    " cc dcqcn cnp-interval 1000 cut-interval 3000 first-rate 8 stages 1 ai-rate 2"                \
    " rate-timer 1000 rate-bytes 1000000000 alpha-g 0.5 alpha-timer 1000 inflight-time 0"
#include "congestion_fixture.hpp"

namespace {

using namespace fake_peer;
using namespace cc_test;

TEST_F(Cc, RateClimbsAdditivelyAndLaterCutsShrinkWithAlpha) {
    // The first CNP: target 8, rate 8·(1 - 1/2) = 4 Mbit/s; α stays 1.
    ASSERT_NO_FATAL_FAILURE(first_cnp_after(8));
    post_small_writes(80);
    expect_silence();
    // Each millisecond past the single fast recovery stage the target
    // grows by 2 Mbit/s and the rate goes halfway to it, before that
    // millisecond's tokens: target 10, rate 7; then 12 and 9.5.
    ASSERT_NO_FATAL_FAILURE(expect_paced({875, 1187.5}, "additive increase"));

    // 2 ms after the cut: inside cut-interval, this CNP cuts nothing, and
    // the climb goes on: target 14, rate 11.75.
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn)));
    ASSERT_NO_FATAL_FAILURE(expect_paced({1468.75}, "a CNP inside cut-interval"));

    // 3 ms after the cut it does.  Three alpha-timer periods passed
    // without one: α = 1·(1/2)³ = 1/8, and the cut takes α/2 of the rate,
    // 11.75 · 15/16 = 11.015625 Mbit/s (α = 1 would halve it), and makes
    // the rate before it the target.  Each millisecond's increase comes
    // before its tokens: target 13.75, rate 12.3828125; then 15.75 and
    // 14.06640625 (from a halved rate: 9.8125, then 12.78125).
    ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn)));
    ASSERT_NO_FATAL_FAILURE(
        expect_paced({12.3828125 * 125, 14.06640625 * 125}, "a cut shrunk by α's decay"));
}

} // namespace
