// SPDX-License-Identifier: MIT
//
// Selective repeat's recovery timer against the fake peer, on a clock the
// test moves: with no round trip measured it resends the oldest packet
// after 1 ms of silence; once one is, after the round trip and four of its
// deviations (as TCP's RTO, RFC 6298), so that a peer whose answers take
// longer than a millisecond (a loaded host) is not sent what it already
// has.  A request is timed from its first sending, also when the timer
// resent it; the timer never waits more than a sixteenth of the
// retransmit timer's period, nor more than 64 ms without one; a reset
// forgets what was measured.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

// The device looks at its timers once more than 500 µs of the test's clock
// have passed: the test moves it by more between two looks, so that a
// silence and the resend after it bracket a timer's period to within
// 600 µs.
constexpr uint64_t kUs = 1'000;
constexpr uint64_t kMs = 1'000'000;

class Recovery : public FakePeerOnClock {
  protected:
    uint32_t next_psn = kSqPsn; // sroce's next write
    uint64_t wr_id = 1;

    // sroce's packet for PSN `psn`: a write, resent (with AckReq) or new.
    void expect_write(uint32_t psn, const std::string &what) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << what << ": nothing came";
        EXPECT_EQ(r->opcode, kWriteOnly) << what << ": " << r->str();
        EXPECT_EQ(r->psn, psn) << what;
        EXPECT_TRUE(r->ackreq) << what;
    }

    // A new 8-byte write; returns its PSN once it has left.
    uint32_t write(const std::string &what) {
        uint32_t psn = next_psn;
        next_psn = psn_add(next_psn, 1);
        post(IBV_WR_RDMA_WRITE, wr_id, 0x100, 8, 0x10000, 0xAABBCCDD);
        expect_write(psn, what);
        return psn;
    }

    // The write at `psn`, just sent, is resent by the timer: not yet once
    // `quiet_us` have passed, by `by_us`.  Its period lies between.
    void resent_between(uint32_t psn, uint64_t quiet_us, uint64_t by_us, const std::string &what) {
        advance(quiet_us * kUs);
        expect_silence();
        advance((by_us - quiet_us) * kUs);
        expect_write(psn, what);
    }

    // The peer acknowledges up to `psn`, announcing itself as sroce; the
    // write completes.
    void ack_to(uint32_t psn) {
        send(with_resv7(ack(psn), kSroceEnd));
        ASSERT_NO_FATAL_FAILURE(expect_success(wr_id));
        wr_id++;
    }
};

// Each time below is from the write's sending.
TEST_F(Recovery, FollowsTheRoundTripOnceMeasured) {
    // The first answer announces selective repeat.
    uint32_t a = write("the first write");
    ASSERT_NO_FATAL_FAILURE(ack_to(a));

    // Nothing measured yet: 1 ms of silence and the write is resent (not
    // yet at 0.9 ms, by 1.5 ms).  The answer at 1.5 ms times it from its
    // first sending: round trip 1.5 ms, deviation 0.75 ms.
    uint32_t b = write("the second write");
    ASSERT_NO_FATAL_FAILURE(resent_between(b, 900, 1500, "the resend after 1 ms"));
    ASSERT_NO_FATAL_FAILURE(ack_to(b));

    // The timer now waits 1.5 + 4 x 0.75 = 4.5 ms (not yet at 4.3 ms, by
    // 4.9 ms), where it used to wait 1 ms.  Answered at 5.4 ms: round
    // trip 1.9875 ms, deviation 1.5375 ms.
    uint32_t c = write("the third write");
    ASSERT_NO_FATAL_FAILURE(resent_between(c, 4300, 4900, "the resend after 4.5 ms"));
    advance(500 * kUs);
    ASSERT_NO_FATAL_FAILURE(ack_to(c));

    // 1.9875 + 4 x 1.5375 = 8.1375 ms (not yet at 7.6, by 8.2).
    uint32_t d = write("the fourth write");
    ASSERT_NO_FATAL_FAILURE(resent_between(d, 7600, 8200, "the resend after 8.1 ms"));
    ASSERT_NO_FATAL_FAILURE(ack_to(d));

    // A reset forgets the round trip: 1 ms again once the peer has
    // announced itself anew.
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &reset, IBV_QP_STATE), 0);
    ASSERT_NO_FATAL_FAILURE(connect_qp(kRqPsn, kSqPsn));
    next_psn = kSqPsn;
    uint32_t e = write("the first write after a reset");
    ASSERT_NO_FATAL_FAILURE(ack_to(e));
    uint32_t f = write("the second write after a reset");
    ASSERT_NO_FATAL_FAILURE(resent_between(f, 900, 1500, "the resend after 1 ms, after the reset"));
    ASSERT_NO_FATAL_FAILURE(ack_to(f));
}

// With a retransmit timer (timeout 14: 67 ms), the recovery timer waits at
// most a sixteenth of it, 4.19 ms, whatever the round trip: behind a deep
// queue it must get its doublings in before the retransmit timer rewinds.
TEST_F(Recovery, WaitsNoMoreThanASixteenthOfTheRetransmitTimer) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 14));
    uint32_t a = write("the first write");
    ASSERT_NO_FATAL_FAILURE(ack_to(a));
    // A 10 ms round trip: the timer resends after 1 ms (seen at 1.5 ms),
    // then 2 ms after that.
    uint32_t b = write("the second write");
    advance(1500 * kUs);
    ASSERT_NO_FATAL_FAILURE(expect_write(b, "the resend after 1 ms"));
    advance(2100 * kUs);
    ASSERT_NO_FATAL_FAILURE(expect_write(b, "the resend 2 ms later"));
    advance(6400 * kUs);
    ASSERT_NO_FATAL_FAILURE(ack_to(b));
    // 10 + 4 x 5 = 30 ms measured; 4.19 ms it is (not yet at 3.7, by 4.3).
    uint32_t c = write("the third write");
    ASSERT_NO_FATAL_FAILURE(resent_between(c, 3700, 4300, "the resend after 4.19 ms"));
    ASSERT_NO_FATAL_FAILURE(ack_to(c));
}

// Without a retransmit timer (timeout 0) nothing else bounds it: after a
// round trip of 100 ms (srtt + 4 rttvar well past 64 ms) it still waits
// only 64 ms, the 1 ms timer's longest period (six doublings).
TEST_F(Recovery, WaitsNoMoreThan64MsWithoutARetransmitTimer) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0));
    uint32_t a = write("the first write");
    ASSERT_NO_FATAL_FAILURE(ack_to(a));
    uint32_t b = write("the second write");
    advance(100 * kMs);
    ASSERT_NO_FATAL_FAILURE(expect_write(b, "the resend while the answer is late"));
    ASSERT_NO_FATAL_FAILURE(ack_to(b));
    uint32_t c = write("the third write");
    ASSERT_NO_FATAL_FAILURE(resent_between(c, 63000, 64600, "the resend after 64 ms"));
    ASSERT_NO_FATAL_FAILURE(ack_to(c));
}

} // namespace
