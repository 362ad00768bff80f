// SPDX-License-Identifier: MIT
//
// What an sroce end announces of itself in its packets' BTH and what it
// learns from a peer's (wire-protocol.md §3.3.1), against a fake peer: the
// announcement on every RC packet, native commits and selective repeat for
// a peer that announces them, nothing for one that does not (an IBTA peer's
// resv7 is zero) or whose resv7 lacks the tag, and nothing kept over a reset.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

class Announce : public FakePeer {
  protected:
    // A WRITE of 8 bytes acknowledged by the peer's ACK with `resv7`.
    void write_acked_with(uint8_t resv7) {
        post(IBV_WR_RDMA_WRITE, 1, 0x100, 8, 0x10000, 0xAABBCCDD);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r);
        ASSERT_EQ(r->opcode, kWriteOnly) << r->str();
        send(with_resv7(ack(kSqPsn), resv7));
        ASSERT_NO_FATAL_FAILURE(expect_success(1));
    }

    // Posts a write-commit (post_commit_imm) and returns the first packet
    // sroce sends for it.
    std::optional<Rx> commit(uint64_t wr_id) {
        post_commit_imm(wr_id);
        return reply();
    }

    // A write-commit goes as the IBTA sequence: FLUSH first, four packets.
    void expect_ibta_commit(uint64_t wr_id) {
        std::optional<Rx> r = commit(wr_id);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->opcode, kFlush) << r->str();
        for (uint32_t i = 1; i < 4; i++)
            ASSERT_TRUE(reply()) << "part " << i;
    }
};

TEST_F(Announce, EveryRcPacketAnnouncesTheEnd) {
    post(IBV_WR_RDMA_WRITE, 1, 0x100, 8, 0x10000, 0xAABBCCDD);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kWriteOnly) << r->str();
    EXPECT_EQ(r->raw[8], 0x80 | kSroceEnd) << "AckReq and the announcement";
    send(ack(kSqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
    // The responder's packets too: an ACK, a READ response.
    send(write_only(kRqPsn, 0x200, pattern(8, 1)));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
    EXPECT_EQ(r->raw[8], kSroceEnd);
    send(packet(kReadRequest, qpn, (kRqPsn + 1) & kPsnMask, reth(va(0x200), rkey(), 8), {}));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->raw[8], kSroceEnd);
    EXPECT_EQ(r->payload, pattern(8, 1));
}

TEST_F(Announce, ACommitToAnAnnouncingPeerIsNative) {
    // Before the peer has said anything: the IBTA sequence.
    ASSERT_NO_FATAL_FAILURE(expect_ibta_commit(2));
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn));
    // An ACK that announces native commits: the next commit is one message.
    ASSERT_NO_FATAL_FAILURE(write_acked_with(bth::kAnnounceTag | bth::kAnnounceNative));
    std::optional<Rx> r = commit(4);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kCommitWriteOnlyImm) << r->str();
    EXPECT_EQ(r->dma_len, 99u);
    EXPECT_FALSE(reply()) << "more than one native message";
}

// Only the tag makes resv7 an announcement: other bits are another
// implementation's business, and teach nothing.
TEST_F(Announce, AnUntaggedResv7TeachesNothing) {
    ASSERT_NO_FATAL_FAILURE(write_acked_with(bth::kAnnounceCaps));
    ASSERT_NO_FATAL_FAILURE(expect_ibta_commit(2));
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn));
    ASSERT_NO_FATAL_FAILURE(write_acked_with(0x7F));
    ASSERT_NO_FATAL_FAILURE(expect_ibta_commit(3));
}

// Only packets of this connection teach: a request outside the receive
// window or an ACK of nothing outstanding may be a straggler of an earlier
// connection from the same address, whose peer was sroce while this one
// need not be.
TEST_F(Announce, StragglersTeachNothing) {
    send(with_resv7(write_only((kRqPsn + 5000) & kPsnMask, 0x300, pattern(8, 2)), kSroceEnd));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn));
    send(with_resv7(ack(kSqPsn), kSroceEnd)); // nothing was sent yet
    expect_silence(200);
    ASSERT_NO_FATAL_FAILURE(expect_ibta_commit(2));
}

// The QP may be connected to another peer after a reset: what the last one
// announced is forgotten (a declaration, by contrast, stays).
TEST_F(Announce, AResetForgetsWhatThePeerAnnounced) {
    ASSERT_NO_FATAL_FAILURE(write_acked_with(kSroceEnd));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    ASSERT_NO_FATAL_FAILURE(connect_qp(kRqPsn, kSqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_ibta_commit(2));
}

// A requester that announces selective repeat gets its requests past a gap
// held and a SELECTIVE ACKNOWLEDGE; filling the gap carries both out.
TEST_F(Announce, AnAnnouncingRequestersGapIsHeld) {
    uint32_t next = (kRqPsn + 1) & kPsnMask;
    send(with_resv7(write_only(next, 0x300, pattern(8, 2)), kSroceEnd));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->opcode, kSelectiveAck) << r->str();
    EXPECT_EQ(r->psn, (kRqPsn - 1) & kPsnMask) << "the cumulative ACK: nothing yet";
    EXPECT_EQ(get24(r->raw.data() + kBthLen + kAethLen + 1), next) << "highest PSN held";
    expect_untouched(0x300, 8);
    send(with_resv7(write_only(kRqPsn, 0x200, pattern(8, 1)), kSroceEnd));
    ASSERT_NO_FATAL_FAILURE(expect_ack(next));
    fence();
    EXPECT_EQ(0, std::memcmp(w.buf + 0x200, pattern(8, 1).data(), 8));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x300, pattern(8, 2).data(), 8));
}

// An IBTA requester (resv7 zero) gets go-back-N: a sequence NAK, nothing held.
TEST_F(Announce, ASilentRequestersGapIsNaked) {
    send(write_only((kRqPsn + 1) & kPsnMask, 0x300, pattern(8, 2)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn));
    expect_untouched(0x300, 8);
}

} // namespace
