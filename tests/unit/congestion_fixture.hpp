// SPDX-License-Identifier: MIT
//
// The fixture of the congestion control tests (test_congestion*.cpp): the
// fake peer (fake_peer.hpp) on a clock the test moves, with CNPs, marked
// requests, paced writes and their acknowledgements.  The including file
// defines FAKE_PEER_LINK_OPTIONS first: the device's cc parameters.
#pragma once

#include "congestion.hpp"
#include "fake_peer.hpp"

namespace cc_test {

using namespace fake_peer;

constexpr uint64_t kMs = 1'000'000;
constexpr uint8_t kCnpTclass = 48 << 2; // DSCP 48, not ECN-capable
constexpr uint32_t kSmall = 64;         // the writes the rate is measured with
// What each of them costs the QP's rate.
constexpr uint32_t kSmallCost = kSmall + kCcPacketOverhead;

class Cc : public FakePeerOnClock {
  protected:
    uint32_t next_rq_psn = kRqPsn; // the peer's next request
    uint32_t next_sq_psn = kSqPsn; // sroce's next request

    void send_tc(const Bytes &p, uint8_t tclass, const Endpoint *from = nullptr) {
        fence();
        send_raw(from ? *from : w.peer, p, tclass);
    }

    // A CNP for sroce's QP `dqpn`, from `src`, sealed as RNICs send it.
    Bytes cnp(uint32_t dqpn, const char *src = kPeerAddr) {
        Bytes p = packet(kCnp, dqpn, 0, Bytes(kCnpPadLen, 0), {}, false, kDefaultPkey, src);
        p[4] = bth::kBecn;
        IpHeader ip{IpAddr::v4(ip4(src)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port, kRoceV2Port};
        icrc_store(p.data() + p.size() - kIcrcLen, icrc_compute(ip, p.data(), p.size()));
        return p;
    }

    // A WRITE from the peer, marked `tclass` on its way, and what sroce
    // answers: its ACK, and a CNP if `cnp`.
    void peer_write(uint8_t tclass, bool cnp_expected) {
        uint32_t psn = next_rq_psn;
        next_rq_psn = psn_add(psn, 1);
        send_tc(write_only(psn, 0x8000, pattern(40, uint8_t(psn))), tclass);
        bool got_ack = false, got_cnp = false;
        for (int i = 0; i < (cnp_expected ? 2 : 1); i++) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << "no answer to the write at PSN " << hex(psn);
            if (r->opcode == kCnp) {
                ASSERT_FALSE(got_cnp) << "two CNPs";
                got_cnp = true;
                expect_cnp(*r);
            } else {
                ASSERT_EQ(r->opcode, kAcknowledge) << r->str();
                EXPECT_EQ(r->psn, psn);
                // With congestion control, sroce's own packets are ECN-capable.
                EXPECT_EQ(r->tclass, kEct0);
                got_ack = true;
            }
        }
        EXPECT_TRUE(got_ack);
        EXPECT_EQ(got_cnp, cnp_expected);
        expect_silence();
    }

    // RoCEv2's CNP (annex A17): opcode 0x81 to the QP that sent the marked
    // request, BECN, PSN and A bit 0, 16 reserved zero bytes; DSCP 48 and
    // not ECN-capable, so that no switch drops or marks it.
    void expect_cnp(const Rx &r) {
        EXPECT_EQ(r.opcode, kCnp);
        EXPECT_EQ(r.qpn, kPeerQpn);
        EXPECT_EQ(r.psn, 0u);
        EXPECT_FALSE(r.ackreq);
        EXPECT_EQ(r.raw.size(), kBthLen + kCnpPadLen + kIcrcLen);
        EXPECT_EQ(r.raw[4], bth::kBecn);
        for (size_t i = kBthLen; i < kBthLen + kCnpPadLen && i < r.raw.size(); i++)
            EXPECT_EQ(r.raw[i], 0) << "reserved byte " << i;
        EXPECT_EQ(r.tclass, kCnpTclass);
    }

    // `n` writes of kSmall bytes from sroce to the peer, posted now.
    void post_small_writes(int n) {
        for (int i = 0; i < n; i++)
            ASSERT_NO_FATAL_FAILURE(
                post(IBV_WR_RDMA_WRITE, uint64_t(i), 0x100, kSmall, 0x10000, 0xAABBCCDD));
    }

    // Waits for the next `n` writes (or packets of opcode `op`) from sroce,
    // in PSN order, ECN-capable.
    void expect_writes(int n, const std::string &when, uint8_t op = kWriteOnly) {
        for (int i = 0; i < n; i++) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << when << ": packet " << i + 1 << " of " << n << " did not come";
            ASSERT_EQ(r->opcode, op) << when << ": " << r->str();
            EXPECT_EQ(r->psn, next_sq_psn) << when;
            EXPECT_EQ(r->tclass, kEct0) << when;
            next_sq_psn = psn_add(next_sq_psn, 1);
        }
    }

    // The peer acknowledges everything sroce has sent, and sroce completes it.
    void ack_all(int n) {
        send(ack(psn_add(next_sq_psn, kPsnMask), aeth::kAck | aeth::kNoCredits, uint32_t(n)));
        for (int i = 0; i < n; i++) {
            std::optional<ibv_wc> wc = poll_wc();
            ASSERT_TRUE(wc) << "completion " << i;
            EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
        }
    }

    // The CNP reaches sroce before anything that follows: the ACK of a write
    // sent after it shows it was handled.
    void deliver_cnp(const Bytes &p, const Endpoint *from = nullptr) {
        send_tc(p, 0, from);
        ASSERT_NO_FATAL_FAILURE(peer_write(kEct0, false));
    }

    // `n` writes leave at once with the clock standing still (no CNP yet:
    // the QP is not limited), are acknowledged, and then the QP's first CNP
    // arrives.
    void first_cnp_after(int n) {
        post_small_writes(n);
        ASSERT_NO_FATAL_FAILURE(expect_writes(n, "before any CNP"));
        ASSERT_NO_FATAL_FAILURE(ack_all(n));
        ASSERT_NO_FATAL_FAILURE(deliver_cnp(cnp(qpn)));
    }

    // Moves the clock a millisecond at a time, at `rate_per_ms` bytes each
    // (the QP's rate then), and checks that sroce sends the writes a token
    // bucket at that rate admits: one while it holds anything, each taking
    // kSmallCost from it, what is owed carried over.
    double tokens = 0;
    void expect_paced(const std::vector<double> &rate_per_ms, const std::string &what,
                      uint8_t op = kWriteOnly) {
        for (size_t k = 0; k < rate_per_ms.size(); k++) {
            advance(kMs);
            tokens += rate_per_ms[k];
            int n = 0;
            while (tokens > 0) {
                tokens -= kSmallCost;
                n++;
            }
            ASSERT_NO_FATAL_FAILURE(expect_writes(n, what + ", ms " + std::to_string(k + 1), op));
        }
    }
};

} // namespace cc_test
