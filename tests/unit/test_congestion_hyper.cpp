// SPDX-License-Identifier: MIT
//
// DCQCN's hyper increase: once both the timer's and the byte counter's
// increase events since the last cut are past F, each event grows the
// target by (min(T, BC) − F)·R_HAI instead of R_AI.
//
// The device: a first cut from 4 Mbit/s, one fast recovery stage, an
// additive increase of 0.25 Mbit/s and a hyper increase of 1 Mbit/s, an
// event each millisecond and each 288 bytes sent (two of the 144-byte
// writes), α that does not decay within the test, no cap on what is in
// flight.  1 Mbit/s is 125 bytes a millisecond.
#define FAKE_PEER_LINK_OPTIONS                                                                     \
    " cc dcqcn cnp-interval 1000 cut-interval 3000 first-rate 4 stages 1 ai-rate 0.25"             \
    " hai-rate 1 rate-timer 1000 rate-bytes 288 alpha-g 0.5 alpha-timer 1000000 inflight-time 0"
#include "congestion_fixture.hpp"

namespace {

using namespace fake_peer;
using namespace cc_test;

TEST_F(Cc, HyperIncreaseOnceBothCountersArePastF) {
    // The cut: target 4, rate 2 Mbit/s, T = BC = 0.
    ASSERT_NO_FATAL_FAILURE(first_cnp_after(8));
    post_small_writes(40);
    expect_silence();
    // ms 1: T = 1, BC = 0, additive: target 4.25, rate 3.125, 390.6 bytes
    // of tokens, three writes; the second makes BC 1, additive again.
    advance(kMs);
    ASSERT_NO_FATAL_FAILURE(expect_writes(3, "ms 1"));
    // ms 2: T = 2 with BC = 1 is additive (target 4.75, rate 4.28); the
    // second write makes BC = 2, both past F = 1: hyper, target + 1.  Four
    // writes (additive alone would give four too).
    advance(kMs);
    ASSERT_NO_FATAL_FAILURE(expect_writes(4, "ms 2"));
    // ms 3: T = 3, BC = 3: target + 2, to 8.75, rate 7.32: six writes
    // (additive increase alone: rate 5.74, four).
    advance(kMs);
    ASSERT_NO_FATAL_FAILURE(expect_writes(6, "ms 3"));
    // ms 4: T = 4, BC = 6: the target grows by 3 at the tick and at each
    // second write: rate 15.3 at the tick, fourteen writes (additive
    // increase alone: six).
    advance(kMs);
    ASSERT_NO_FATAL_FAILURE(expect_writes(14, "ms 4"));
    expect_silence();
}

} // namespace
