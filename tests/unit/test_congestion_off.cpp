// SPDX-License-Identifier: MIT
//
// A device with congestion control off (`sroce link set NAME cc off`), as
// Linux rxe is: its packets are not ECN-capable, CE marks get no CNP, and
// CNPs do not slow it down — they are only counted.
#define FAKE_PEER_LINK_OPTIONS " cc off"
#include "congestion.hpp"
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

TEST_F(FakePeer, CongestionControlOff) {
    // A marked write: the ACK alone, with the traffic class the QP's AV
    // has (0), not made ECN-capable.
    send_raw(w.peer, write_only(kRqPsn, 0x8000, pattern(40, 1)), kEcnCe);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
    EXPECT_EQ(r->tclass, 0);
    expect_silence();

    // A well-formed CNP from the peer, then 32 writes with the clock
    // standing still: all of them leave.
    Bytes p = packet(kCnp, qpn, 0, Bytes(kCnpPadLen, 0), {}, false);
    p[4] = bth::kBecn;
    IpHeader ip{IpAddr::v4(ip4(kPeerAddr)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port, kRoceV2Port};
    icrc_store(p.data() + p.size() - kIcrcLen, icrc_compute(ip, p.data(), p.size()));
    sroce_memwire_clock(100'000'000'000'000'000ull);
    send_raw(w.peer, p);
    expect_silence();
    for (int i = 0; i < 32; i++)
        ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, uint64_t(i), 0x100, 64, 0x10000, 0xAABB));
    for (uint32_t i = 0; i < 32; i++) {
        std::optional<Rx> wr = reply();
        ASSERT_TRUE(wr) << "write " << i;
        EXPECT_EQ(wr->opcode, kWriteOnly) << wr->str();
        EXPECT_EQ(wr->psn, psn_add(kSqPsn, i));
        EXPECT_EQ(wr->tclass, 0);
    }
    sroce_memwire_clock(0);
}

} // namespace
