// SPDX-License-Identifier: MIT
//
// The persistence operations against a fake peer (fake_peer.hpp): native
// commits and their immediate data, FLUSH (and Linux rxe's ICRC form of it,
// learned from the peer), ATOMIC WRITE, and write-commit to peers that did
// or did not declare native commits.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

// A native commit's CETH IMMED flag and its opcode must agree: immediate
// data exists only together with a commit, and a commit that announces one
// must carry it.  Either mismatch is an Invalid Request, and nothing lands.
TEST_F(FakePeer, CommitImmediateFlagMustMatchTheOpcode) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes ce(4);
    ce[0] = ceth::kImmed | ceth::kGlobal;
    post_recv(1, 0x9000, 64);
    send(packet(kCommitWriteOnly, qpn, kRqPsn, cat(reth(va(0x100), rkey(), 8), ce), pattern(8, 3)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 8);

    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    drain_async_events();
    ce[0] = ceth::kGlobal; // no IMMED, yet the opcode carries immediate data
    Bytes imm(4);
    put32(imm.data(), 0x55);
    post_recv(2, 0x9000, 64);
    send(packet(kCommitWriteOnlyImm, qpn, kRqPsn, cat(cat(reth(va(0x100), rkey(), 8), ce), imm),
                pattern(8, 3)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 8);
}

// A well-formed native commit with immediate data, for contrast: placed,
// acknowledged, and the immediate delivered.
TEST_F(FakePeer, NativeCommitWithImmediateIsAcceptedFromAPeer) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes ce(4);
    ce[0] = ceth::kImmed | ceth::kGlobal;
    Bytes imm(4);
    put32(imm.data(), 0x55);
    post_recv(3, 0x9000, 64);
    Bytes data = pattern(8, 4);
    send(packet(kCommitWriteOnlyImm, qpn, kRqPsn, cat(cat(reth(va(0x100), rkey(), 8), ce), imm),
                data));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    EXPECT_EQ(std::memcmp(w.buf + 0x100, data.data(), 8), 0);
}

TEST_F(FakePeer, FlushWithoutQpFlushAccessIsInvalidRequest) {
    Bytes feth(4);
    put32(feth.data(), 1); // placement: global visibility, selectivity: range
    send(packet(kFlush, qpn, kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), {}));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

// FLUSH and ATOMIC WRITE are answered by an empty READ RESPONSE ONLY; a
// duplicate is answered again from the responder resources, never executed
// a second time.
TEST_F(FakePeer, FlushIsAnsweredAndItsDuplicateReplayed) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    Bytes flush = packet(kFlush, qpn, kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), {});
    for (int pass = 0; pass < 2; pass++) {
        send(flush);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
        EXPECT_TRUE(r->payload.empty());
    }
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// Linux rxe 6.2 and later seals FLUSH with its own ICRC form (icrc.hpp): it
// is accepted, from rxe's hashed source ports with any IP ID, and a
// corrupted one is still dropped.
TEST_F(FakePeer, FlushInLinuxRxesIcrcFormIsAccepted) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    Bytes flush = legacy_flush(kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), 0x5A5A);
    Bytes bad = flush;
    bad[kBthLen + 5] ^= 0x01;
    ASSERT_NO_FATAL_FAILURE(expect_dropped(bad, &w.peer_alt));
    fence();
    send_raw(w.peer_alt, flush);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// Only FLUSH has the legacy form: any other opcode sealed that way is corrupt.
TEST_F(FakePeer, LegacyIcrcFormOfOtherOpcodesIsDropped) {
    Bytes wr = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 0), {});
    seal_legacy(wr, kPeerAddr, kRoceV2Port, 0);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(wr));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, AtomicWriteStoresOnceAndItsDuplicateIsReplayed) {
    Bytes v1 = pattern(8, 1), v2 = pattern(8, 2);
    Bytes aw = packet(kAtomicWrite, qpn, kRqPsn, reth(va(0x100), rkey(), 8), v1);
    send(aw);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
    EXPECT_TRUE(r->payload.empty());
    qp_state(); // orders the engine's store before this thread's read
    EXPECT_EQ(std::memcmp(w.buf + 0x100, v1.data(), 8), 0);
    // A later WRITE changes the word; the duplicate must not undo it.
    send(packet(kWriteOnly, qpn, kRqPsn + 1, reth(va(0x100), rkey(), 8), v2, true));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
    send(aw);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    qp_state();
    EXPECT_EQ(std::memcmp(w.buf + 0x100, v2.data(), 8), 0) << "duplicate ATOMIC WRITE re-executed";
}

TEST_F(FakePeer, MisalignedAtomicWriteIsInvalidRequest) {
    send(packet(kAtomicWrite, qpn, kRqPsn, reth(va(0x104), rkey(), 8), pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x104, 8);
}

TEST_F(FakePeer, MisalignedAtomicIsRejected) {
    auto *word = reinterpret_cast<uint64_t *>(w.buf + 0x2000);
    *word = 1;
    send(packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2004), rkey(), 1, 0), {}));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kNak) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(*word, 1u);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

// A peer that drops IBTA-form FLUSHes (unfixed Linux rxe) is found by
// retransmission: two IBTA tries, then the forms alternate, and the form
// answered is the one used first from then on.
TEST_F(FakePeer, FlushFormIsLearnedFromAnAnsweredRetransmission) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 10));
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    const bool legacy[] = {false, false, true};
    for (int n = 0; n < 3; n++)
        ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, legacy[n], n));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
    ASSERT_NO_FATAL_FAILURE(post_flush(2));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, true, 0));
    // A learned form is re-checked: unanswered, the next try is IBTA's.
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, false, 1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, true, 2));
    send(flush_response(kSqPsn + 1, 2));
    ASSERT_NO_FATAL_FAILURE(expect_success(2));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

// A peer that answered an IBTA-form FLUSH never sees the other form.
TEST_F(FakePeer, FlushToAPeerThatTookIbtasFormNeverUsesTheOther) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 10));
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, false, 0));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
    ASSERT_NO_FATAL_FAILURE(post_flush(2));
    for (int n = 0; n < 5; n++)
        ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, false, n));
    send(flush_response(kSqPsn + 1, 2));
    ASSERT_NO_FATAL_FAILURE(expect_success(2));
}

// The peer's own FLUSH shows its form before sroce sends one.
TEST_F(FakePeer, PeersOwnLegacyFlushTeachesTheForm) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    fence();
    send_raw(w.peer_alt, legacy_flush(kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), 7));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, true, 0));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
}

// docs/design.md §2.5: no manufacturer-specific opcode ever reaches a peer that
// has not declared support; the commit travels as IBTA FLUSH(MR) + WRITE +
// FLUSH(MR) + zero-length WRITE WITH IMMEDIATE instead.
TEST_F(FakePeer, WriteCommitToAnUndeclaredPeerIsAnIbtaSequence) {
    ASSERT_NO_FATAL_FAILURE(post_commit_imm(1));
    const uint8_t want[] = {kFlush, kWriteOnly, kFlush, kWriteOnlyImm};
    for (int i = 0; i < 4; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "packet " << i;
        EXPECT_LT(r->opcode, 0xC0) << r->str();
        EXPECT_EQ(r->opcode, want[i]) << r->str();
        EXPECT_EQ(r->psn, (kSqPsn + uint32_t(i)) & kPsnMask);
        EXPECT_EQ(r->rkey, 0xAABBCCDDu);
        if (r->opcode == kFlush) { // selectivity MR, placement persistent
            EXPECT_EQ(get32(r->raw.data() + kBthLen), 0x12u) << r->str();
        }
        if (r->opcode == kWriteOnly) {
            EXPECT_EQ(r->dma_len, 99u);
        }
        if (r->opcode == kWriteOnlyImm) {
            EXPECT_EQ(r->dma_len, 0u);
            EXPECT_EQ(get32(r->raw.data() + kBthLen + kRethLen), 0x1234u);
        }
    }
    EXPECT_FALSE(reply()) << "more than the IBTA sequence was sent";
}

TEST_F(FakePeer, WriteCommitToADeclaredPeerIsOneNativeMessage) {
    ASSERT_EQ(ibv_qp_set_commit_peer(qp, IBV_COMMIT_CAP_NATIVE), 0);
    ASSERT_NO_FATAL_FAILURE(post_commit_imm(1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kCommitWriteOnlyImm) << r->str();
    EXPECT_TRUE(r->ackreq);
    EXPECT_EQ(r->dma_len, 99u);
    const uint8_t *ceth = r->raw.data() + kBthLen + kRethLen;
    EXPECT_EQ(ceth[0], ceth::kOrdered | ceth::kImmed);
    EXPECT_EQ(get32(r->raw.data() + kBthLen + kRethLen + kCethLen), 0x1234u);
    EXPECT_EQ(r->payload.size(), 99u);
    EXPECT_FALSE(reply());
}

} // namespace
