// SPDX-License-Identifier: MIT
//
// The fake peer (fake_peer.hpp) on UDP sockets on lo, for what only the
// kernel's UDP shows: every datagram sroce sends is checked against the IP
// ID in its real header (a packet socket on lo), a peer sends from another
// source port as Linux rxe does, and an ICMP error on sroce's connected
// socket.  The devices' addresses here are this binary's (tests/README.md).
#define FAKE_PEER_ON_UDP
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

// rxe picks a source port per QP and a fresh IP ID per packet: both must be
// accepted from the connected address.
TEST_F(FakePeer, RxeStyleSourcePortAndIpIdAreAccepted) {
    Bytes data = pattern(48, 5);
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x500), rkey(), 48), data, true, kDefaultPkey,
                     kPeerAddr, port_of(w.peer_alt), 0x3C91);
    send_raw(w.peer_alt, p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x500, data.data(), data.size()));
}

// sroce sends to a peer from a connected socket, whose IP ID counter it
// follows (design.md §7.3).  A datagram to a closed port draws an ICMP
// port unreachable, which Linux leaves on a connected socket to fail its
// next send before it leaves.  That send is made again, with the counter
// read afresh: a write posted once the port is open again arrives although
// the QP never retransmits, with an ICRC right for the IP ID in its real
// header (receive(), through World::tap).
TEST_F(FakePeer, ConnectedSocketSendsPastAnIcmpError) {
    // timeout 0: no retransmission, so only the send itself can deliver.
    Bytes data = pattern(64, 21);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 64, 0x1000, 0x77));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);

    close(w.peer.fd);
    w.peer.fd = -1;
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 64, 0x2000, 0x77));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    w.peer.fd = udp_socket(kPeerAddr, kRoceV2Port);
    ASSERT_GE(w.peer.fd, 0) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 3, 0, 64, 0x3000, 0x77));
    r = reply();
    ASSERT_TRUE(r) << "the write after the ICMP error was lost";
    EXPECT_EQ(r->opcode, kWriteOnly) << r->str();
    EXPECT_EQ(r->psn, kSqPsn + 2);
    EXPECT_EQ(r->payload, data);
    // One ACK covers the write the closed port lost and this one.
    send(ack(kSqPsn + 2, aeth::kAck | aeth::kNoCredits, 3));
    for (uint64_t id : {2u, 3u}) {
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc->wr_id, id);
    }
}

// A WRITE of several packets leaves in segmentation-offload sends: each
// datagram's ICRC must be right for the IP ID the kernel gave it, which
// receive() checks against its header on lo.
TEST_F(FakePeer, MultiPacketWriteHasTheIpIdsOfItsSends) {
    Bytes data = pattern(4 * kMtu, 12);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, uint32_t(data.size()), 0x1000, 0x77));
    Bytes got;
    for (uint32_t i = 0; i < 4; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "packet " << i;
        EXPECT_EQ(r->psn, kSqPsn + i) << r->str();
        got.insert(got.end(), r->payload.begin(), r->payload.end());
    }
    EXPECT_EQ(got, data);
    send(ack(kSqPsn + 3));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
}

} // namespace
