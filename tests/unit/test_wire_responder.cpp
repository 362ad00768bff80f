// SPDX-License-Identifier: MIT
//
// The responder against a fake peer (fake_peer.hpp): valid requests, input
// dropped silently, access errors, sequence errors and duplicates, RNR and
// invalid requests, XRC strangers, and async events of destroyed QPs.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

// ---------------------------------------------------------------------------
// Responder: valid requests

TEST_F(FakePeer, WriteOnlyIsAckedWithPsnAndMsnAndLands) {
    Bytes a = pattern(64, 1), b = pattern(1000, 2);
    send(write_only(kRqPsn, 0x100, a));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x100, a.data(), a.size()));
    expect_untouched(0x100 + a.size(), 64);
    expect_untouched(0x100 - 64, 64);
    send(write_only(kRqPsn + 1, 0x1000, b));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 1, 2));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x1000, b.data(), b.size()));
    // Odd length: the pad is stripped, not written.
    Bytes c = pattern(13, 3);
    send(write_only(kRqPsn + 2, 0x3000, c));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 2, 3));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x3000, c.data(), c.size()));
    expect_untouched(0x3000 + c.size(), 8);
    expect_silence();
}

TEST_F(FakePeer, MultiPacketWriteAcrossThePsnWrap) {
    ASSERT_NO_FATAL_FAILURE(create_qp(0xFFFFFE, kSqPsn));
    Bytes data = pattern(3 * kMtu, 9);
    uint32_t p0 = 0xFFFFFE;
    send(packet(kWriteFirst, qpn, p0, reth(va(0x4000), rkey(), uint32_t(data.size())),
                Bytes(data.begin(), data.begin() + kMtu), false));
    send(packet(kWriteMiddle, qpn, psn_add(p0, 1), {},
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    send(packet(kWriteLast, qpn, psn_add(p0, 2), {}, Bytes(data.begin() + 2 * kMtu, data.end())));
    ASSERT_NO_FATAL_FAILURE(expect_ack(0x000000, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x4000, data.data(), data.size()));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(0x000001));
}

TEST_F(FakePeer, SendOnlyFillsThePostedReceive) {
    ASSERT_NO_FATAL_FAILURE(post_recv(77, 0x2000, 256));
    Bytes data = pattern(100, 4);
    send(packet(kSendOnly, qpn, kRqPsn, {}, data));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 77u);
    EXPECT_EQ(wc->opcode, IBV_WC_RECV);
    EXPECT_EQ(wc->byte_len, 100u);
    EXPECT_EQ(wc->src_qp, kPeerQpn);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x2000, data.data(), data.size()));
}

// ---------------------------------------------------------------------------
// Responder: the ACK of what an application thread received (Nic::deferred_acks_)

class DeferredAck : public FakePeer {
  protected:
    // Polls the empty CQ back to back for a while, as a program waiting for
    // a message does: long enough for the progress thread, asleep for at
    // most a millisecond, to see it and leave the receiving to this thread.
    void spin_empty() {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
        ibv_wc wc{};
        while (std::chrono::steady_clock::now() < end)
            ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
    }
    // The SEND the peer sends now at `psn`, received while spinning.
    void receive_send(uint32_t psn, uint64_t wr_id) {
        post_recv(wr_id, 0x2000, 64);
        ASSERT_NO_FATAL_FAILURE(spin_empty());
        send(packet(kSendOnly, qpn, psn, {}, pattern(16, 1)));
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyMs);
        ibv_wc wc{};
        int n = 0;
        while (!(n = ibv_poll_cq(cq, 1, &wc)) && std::chrono::steady_clock::now() < end) {
        }
        ASSERT_EQ(n, 1);
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc.opcode, IBV_WC_RECV);
        EXPECT_EQ(wc.wr_id, wr_id);
        EXPECT_EQ(wc.byte_len, 16u);
    }
    // The ACK of the peer's SEND at `psn` and the answer at `answer_psn`.
    // A held ACK goes ahead of the answer; one sent at the end of a receive
    // pass races the answer, which the application may post as soon as the
    // pass has written its completion: either order then.
    void expect_ack_and_answer(uint32_t psn, uint32_t msn, uint32_t answer_psn) {
        bool acked = false, answered = false;
        for (int i = 0; i < 2; i++) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << "packet " << i;
            if (r->opcode == kAcknowledge) {
                EXPECT_EQ(r->psn, psn);
                EXPECT_EQ(r->msn, msn);
                acked = true;
            } else {
                EXPECT_EQ(r->opcode, kSendOnly) << r->str();
                EXPECT_EQ(r->psn, answer_psn);
                answered = true;
            }
        }
        EXPECT_TRUE(acked && answered);
    }
    // One round of a ping-pong, the peer's SEND at kRqPsn answered at
    // once, which shows the QP that holding its ACKs pays; then the peer's
    // second SEND (kRqPsn + 1) is received, its ACK most likely held.
    void ping_pong_then_receive() {
        ASSERT_NO_FATAL_FAILURE(receive_send(kRqPsn, 1));
        post(IBV_WR_SEND, 2, 0x100, 8, 0, 0);
        ASSERT_NO_FATAL_FAILURE(expect_ack_and_answer(kRqPsn, 1, kSqPsn));
        send(ack(kSqPsn));
        ASSERT_NO_FATAL_FAILURE(expect_success(2));
        ASSERT_NO_FATAL_FAILURE(receive_send((kRqPsn + 1) & kPsnMask, 3));
    }
};

// The answer the application posts at once and the ACK of what it answers
// both go (the ACK held for it and carried ahead of it, most likely).
TEST_F(DeferredAck, AnAnswerAndTheAckOfWhatItAnswersBothGo) {
    ASSERT_NO_FATAL_FAILURE(ping_pong_then_receive());
    post(IBV_WR_SEND, 4, 0x100, 8, 0, 0);
    ASSERT_NO_FATAL_FAILURE(
        expect_ack_and_answer((kRqPsn + 1) & kPsnMask, 2, (kSqPsn + 1) & kPsnMask));
}

// With no answer, the ACK goes all the same: when the QP is destroyed (or
// moved to error) right after the receive, as a program that ends does;
// and otherwise when its hold runs out.
TEST_F(DeferredAck, AReceiveIsAckedWhenItsQpIsDestroyedAtOnce) {
    ASSERT_NO_FATAL_FAILURE(ping_pong_then_receive());
    ibv_destroy_qp(qp);
    qp = nullptr;
    ASSERT_NO_FATAL_FAILURE(expect_ack((kRqPsn + 1) & kPsnMask, 2));
}

TEST_F(DeferredAck, AReceiveIsAckedWhenItsQpGoesToError) {
    ASSERT_NO_FATAL_FAILURE(ping_pong_then_receive());
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    ASSERT_NO_FATAL_FAILURE(expect_ack((kRqPsn + 1) & kPsnMask, 2));
}

TEST_F(DeferredAck, AReceiveNobodyAnswersIsAckedAnyway) {
    ASSERT_NO_FATAL_FAILURE(ping_pong_then_receive());
    ASSERT_NO_FATAL_FAILURE(expect_ack((kRqPsn + 1) & kPsnMask, 2));
    expect_silence();
}

// ---------------------------------------------------------------------------
// Responder: silently dropped input

TEST_F(FakePeer, GarbageIsDropped) {
    std::mt19937 rng(31337);
    for (int i = 0; i < 40; i++) {
        Bytes g(1 + rng() % 300);
        for (uint8_t &b : g)
            b = uint8_t(rng());
        if (i % 2) {
            // Plausible start: a supported opcode, version 0, our QPN.
            g.resize(std::max<size_t>(g.size(), 48));
            g[0] = kWriteOnly;
            g[1] = 0;
            put24(g.data() + 5, qpn);
        }
        send(g);
    }
    expect_silence();
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, TruncatedHeadersAreDropped) {
    Bytes full = write_only(kRqPsn, 0x100, pattern(16, 6));
    for (size_t len = 1; len < kBthLen + kRethLen + kIcrcLen; len++) {
        Bytes cut(full.begin(), full.begin() + long(len));
        send(cut);
        // The same length with an ICRC that is right for what is left.
        if (len >= kBthLen + kIcrcLen) {
            IpHeader ip{IpAddr::v4(ip4(kPeerAddr)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port,
                        kRoceV2Port};
            icrc_store(cut.data() + len - kIcrcLen, icrc_compute(ip, cut.data(), len));
            send(cut);
        }
    }
    expect_silence();
    expect_untouched(0x100, 16);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, ZeroLengthDatagramIsDropped) {
    ASSERT_NO_FATAL_FAILURE(expect_dropped({}));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, WrongIcrcIsDropped) {
    Bytes good = write_only(kRqPsn, 0x100, pattern(64, 7));
    for (size_t at : {good.size() - 1, good.size() - 4, size_t(0x30), size_t(9), size_t(20)}) {
        Bytes bad = good;
        bad[at] ^= 0x01;
        ASSERT_NO_FATAL_FAILURE(expect_dropped(bad));
    }
    expect_untouched(0x100, 64);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, UnknownQpnIsDropped) {
    for (uint32_t q : {qpn + 1000, uint32_t(0xFFFFFF), 0u, 1u, kPeerQpn}) {
        Bytes p = packet(kWriteOnly, q, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8));
        ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    }
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, UnsupportedOpcodeIsDropped) {
    // Reserved RC codes, UC RDMA WRITE ONLY, UD SEND ONLY, CNP; valid ICRC.
    for (uint8_t op : {0x15, 0x18, 0x1F, 0x2A, 0x64, 0x81}) {
        Bytes p = packet(op, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8));
        ASSERT_NO_FATAL_FAILURE(expect_dropped(p)) << "opcode " << hex(op);
    }
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, NonZeroTransportVersionIsDropped) {
    Bytes p = write_only(kRqPsn, 0x100, pattern(32, 8));
    p[1] |= 0x01;
    IpHeader ip{IpAddr::v4(ip4(kPeerAddr)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port, kRoceV2Port};
    icrc_store(p.data() + p.size() - 4, icrc_compute(ip, p.data(), p.size()));
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, PacketFromWrongSourceAddressIsDropped) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8), true,
                     kDefaultPkey, kStrangerAddr);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p, &w.stranger));
    EXPECT_FALSE(receive(w.stranger, kSilenceMs)) << "sroce answered a stranger";
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

// IBTA 9.6.1.1: a BTH P_Key that matches no entry of the P_Key table (sroce
// has one, the default 0xFFFF) is a header error: drop silently.  The limited
// member form 0x7FFF matches the full member 0xFFFF.
TEST_F(FakePeer, PkeyMismatchIsDropped) {
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8), true, 0x1234);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    expect_untouched(0x100, 32);
    Bytes limited =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x200), rkey(), 32), pattern(32, 9), true, 0x7FFF);
    send(limited);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// ---------------------------------------------------------------------------
// Responder: access errors (NAK Remote Access Error, QP to error)

TEST_F(FakePeer, WriteOutsideTheMrNaksRemoteAccessError) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(kMrLen - 4), rkey(), 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(kMrLen - 4, 4);
}

TEST_F(FakePeer, WriteBelowTheMrNaksRemoteAccessError) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0) - 4, rkey(), 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0, 4);
}

TEST_F(FakePeer, WriteWithWrongRkeyNaksRemoteAccessError) {
    // Right slot, wrong random high bits: a guessed key must not work.
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey() ^ 0x80000000u, 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0x100, 8);
}

TEST_F(FakePeer, WriteWithOverflowingRangeNaksRemoteAccessError) {
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 0xFFFFFFF0u), pattern(8, 1), true);
    send(p);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    // IBTA allows either: the range check (access error) or the length check.
    EXPECT_TRUE(r->syndrome == (aeth::kNak | aeth::kNakRemoteAccessError) ||
                r->syndrome == (aeth::kNak | aeth::kNakInvalidRequest))
        << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
    expect_untouched(0x100, 8);
}

TEST_F(FakePeer, ReadWithoutRemoteReadAccessNaksRemoteAccessError) {
    Bytes p = packet(kReadRequest, qpn, kRqPsn,
                     reth(uint64_t(uintptr_t(w.noread)), w.mr_noread->rkey, 64), {});
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
}

TEST_F(FakePeer, AtomicWithWrongRkeyNaksRemoteAccessError) {
    Bytes p = packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2000), rkey() + 1, 1, 0), {});
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0x2000, 8);
}

TEST_F(FakePeer, PsnAheadGetsExactlyOneSequenceNak) {
    for (uint32_t k = 3; k < 13; k++)
        send(write_only(kRqPsn + k, 0x100 + 64 * k, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn));
    expect_silence(300);
    for (uint32_t k = 3; k < 13; k++)
        expect_untouched(0x100 + 64 * k, 16);
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    // Once the expected PSN arrives, a new gap earns a new NAK.
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
    send(write_only(kRqPsn + 5, 0x100, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn + 1));
    expect_silence();
}

TEST_F(FakePeer, DuplicateWriteIsReAckedNotReExecuted) {
    Bytes data = pattern(64, 1);
    Bytes p = write_only(kRqPsn, 0x100, data);
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    ASSERT_EQ(0, std::memcmp(w.buf + 0x100, data.data(), data.size()));
    std::memset(w.buf + 0x100, 0xEE, data.size());
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    expect_untouched(0x100, data.size());
    // Behind by more than one: the ACK covers everything received so far.
    send(write_only(kRqPsn + 1, 0x400, pattern(8, 2)));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 1, 2));
    send(p);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck) << r->str();
    EXPECT_GE(psn_diff(r->psn, kRqPsn), 0) << r->str();
    EXPECT_LE(psn_diff(r->psn, kRqPsn + 1), 0) << r->str();
    expect_untouched(0x100, data.size());
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

TEST_F(FakePeer, DuplicateReadIsServedAgain) {
    Bytes mem = pattern(2500, 3);
    std::memcpy(w.buf + 0x1000, mem.data(), mem.size());
    // Single-packet read.
    Bytes rd = packet(kReadRequest, qpn, kRqPsn, reth(va(0x1000), rkey(), 64), {});
    for (int pass = 0; pass < 2; pass++) {
        send(rd);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck) << r->str();
        EXPECT_EQ(r->msn, 1u);
        EXPECT_EQ(r->payload, Bytes(mem.begin(), mem.begin() + 64));
    }
    // Three-packet read, then the whole request again, then its tail only.
    uint32_t p = kRqPsn + 1;
    Bytes rd3 = packet(kReadRequest, qpn, p, reth(va(0x1000), rkey(), 2500), {});
    auto expect_responses = [&](uint32_t psn, size_t off) {
        size_t left = mem.size() - off;
        uint32_t n = uint32_t((left + kMtu - 1) / kMtu);
        for (uint32_t i = 0; i < n; i++) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << "response " << i;
            uint8_t want = n == 1       ? kReadRespOnly
                           : i == 0     ? kReadRespFirst
                           : i + 1 == n ? kReadRespLast
                                        : kReadRespMiddle;
            EXPECT_EQ(r->opcode, want) << r->str();
            EXPECT_EQ(r->psn, psn_add(psn, i));
            size_t len = std::min<size_t>(kMtu, left - i * kMtu);
            EXPECT_EQ(r->payload, Bytes(mem.begin() + long(off + i * kMtu),
                                        mem.begin() + long(off + i * kMtu + len)));
        }
    };
    send(rd3);
    ASSERT_NO_FATAL_FAILURE(expect_responses(p, 0));
    send(rd3);
    ASSERT_NO_FATAL_FAILURE(expect_responses(p, 0));
    send(packet(kReadRequest, qpn, p + 1, reth(va(0x1000 + kMtu), rkey(), 2500 - kMtu), {}));
    ASSERT_NO_FATAL_FAILURE(expect_responses(p + 1, kMtu));
    expect_silence();
    // The read consumed three PSNs.
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(p + 3));
}

TEST_F(FakePeer, DuplicateAtomicReturnsOriginalWithoutReExecuting) {
    auto *word = reinterpret_cast<uint64_t *>(w.buf + 0x2000);
    *word = 100;
    Bytes fa = packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2000), rkey(), 5, 0), {});
    for (int pass = 0; pass < 3; pass++) {
        send(fa);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kAtomicAcknowledge) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
        EXPECT_EQ(r->orig, 100u) << "pass " << pass;
        EXPECT_EQ(*word, 105u) << "pass " << pass;
    }
    // Compare-and-swap; after it the word is put back, so a re-execution
    // of the duplicate would be visible.
    Bytes cs = packet(kCompareSwap, qpn, kRqPsn + 1, atomic_eth(va(0x2000), rkey(), 7, 105), {});
    send(cs);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAtomicAcknowledge) << r->str();
    EXPECT_EQ(r->orig, 105u);
    EXPECT_EQ(*word, 7u);
    *word = 105;
    send(cs);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kRqPsn + 1);
    EXPECT_EQ(r->orig, 105u);
    EXPECT_EQ(*word, 105u) << "duplicate compare-and-swap executed again";
    // The older one is still remembered.
    send(fa);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->orig, 100u);
    EXPECT_EQ(*word, 105u);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

// ---------------------------------------------------------------------------
// Responder: RNR and invalid requests

TEST_F(FakePeer, SendWithoutReceiveGetsRnrNak) {
    Bytes data = pattern(60, 4);
    Bytes s = packet(kSendOnly, qpn, kRqPsn, {}, data);
    send(s);
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kRnrNak | kMinRnrTimer, kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    EXPECT_FALSE(poll_wc(50));
    // The retry after a receive is posted succeeds at the same PSN.
    ASSERT_NO_FATAL_FAILURE(post_recv(5, 0x3000, 128));
    send(s);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->byte_len, 60u);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x3000, data.data(), data.size()));
}

TEST_F(FakePeer, WriteWithImmediateWithoutReceiveGetsRnrNak) {
    Bytes imm(4, 0x5A);
    Bytes p =
        packet(kWriteOnlyImm, qpn, kRqPsn, cat(reth(va(0x100), rkey(), 16), imm), pattern(16, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kRnrNak | kMinRnrTimer, kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(FakePeer, WriteMiddleWithoutFirstNaksInvalidRequest) {
    send(packet(kWriteMiddle, qpn, kRqPsn, {}, pattern(kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, WriteLastWithoutFirstNaksInvalidRequest) {
    send(packet(kWriteLast, qpn, kRqPsn, {}, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, SendMiddleWithoutFirstNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(1, 0x3000, 4096));
    send(packet(kSendMiddle, qpn, kRqPsn, {}, pattern(kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, PayloadLargerThanPathMtuNaksInvalidRequest) {
    send(write_only(kRqPsn, 0x100, pattern(2 * kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 2 * kMtu);
}

TEST_F(FakePeer, WritePayloadLongerThanRethLengthNaksInvalidRequest) {
    send(packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 16), pattern(32, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100 + 16, 16);
}

TEST_F(FakePeer, ShortMiddlePacketNaksInvalidRequest) {
    Bytes data = pattern(3 * kMtu, 2);
    send(packet(kWriteFirst, qpn, kRqPsn, reth(va(0x4000), rkey(), uint32_t(data.size())),
                Bytes(data.begin(), data.begin() + kMtu), false));
    send(packet(kWriteMiddle, qpn, kRqPsn + 1, {}, Bytes(data.begin(), data.begin() + 512), false));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn + 1, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, NewMessageInsideAnotherNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(1, 0x3000, 4096));
    send(packet(kWriteFirst, qpn, kRqPsn, reth(va(0x4000), rkey(), 2 * kMtu), pattern(kMtu, 1),
                false));
    send(packet(kSendOnly, qpn, kRqPsn + 1, {}, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn + 1, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, SendLongerThanTheReceiveNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(9, 0x3000, 32));
    send(packet(kSendOnly, qpn, kRqPsn, {}, pattern(64, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 9u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_LEN_ERR);
    expect_untouched(0x3000 + 32, 32);
}

TEST_F(FakePeer, ZeroLengthReadAndWriteNeedNoValidKey) {
    send(packet(kWriteOnly, qpn, kRqPsn, reth(0, 0, 0), {}));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    send(packet(kReadRequest, qpn, kRqPsn + 1, reth(0, 0, 0), {}));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn + 1);
    EXPECT_TRUE(r->payload.empty());
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

// ibv_destroy_qp() discards the QP's unread async events (the kernel does so
// for every libibverbs provider): an event read afterwards would carry a
// dangling element.qp that ibv_ack_async_event() and the application then
// dereference.
TEST_F(FakePeer, AsyncEventOfADestroyedQpIsNotDelivered) {
    send(write_only(kRqPsn, kMrLen - 4, pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn));
    ASSERT_EQ(qp_state(), IBV_QPS_ERR);
    ibv_qp *dead = qp;
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    qp = nullptr;
    pollfd p{w.ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
        ibv_async_event ev;
        ASSERT_EQ(ibv_get_async_event(w.ctx, &ev), 0);
        // Not acknowledged: that is what would crash.
        ADD_FAILURE() << "got event " << ibv_event_type_str(ev.event_type) << " for destroyed QP "
                      << static_cast<void *>(ev.element.qp)
                      << (ev.element.qp == dead ? " (the one just destroyed)" : "");
    }
}

// An XRC receive QP answers only its connected peer: a stranger's request
// naming an SRQ that does not exist must not put it in the error state.
TEST(XrcBadInput, StrangersRequestNamingNoSrqIsDropped) {
    World &w = world();
    if (!w.skip.empty()) GTEST_SKIP() << w.skip;
    ASSERT_EQ(w.fatal, "");
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    xa.oflags = O_CREAT;
    ibv_xrcd *xrcd = ibv_open_xrcd(w.ctx, &xa);
    ASSERT_NE(xrcd, nullptr) << strerror(errno);
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_XRC_RECV;
    ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ia.xrcd = xrcd;
    ibv_qp *qp = ibv_create_qp_ex(w.ctx, &ia);
    ASSERT_NE(qp, nullptr) << strerror(errno);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kPeerQpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xFF;
    uint32_t peer = ip4(kPeerAddr);
    std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer, 4);
    ASSERT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT), 0);
    Bytes xrceth = {0, 0x0A, 0xBC, 0xDE}; // no such SRQ
    for (const char *src : {kStrangerAddr, kPeerAddr}) {
        SCOPED_TRACE(src);
        Bytes p = packet(wire::kXrcBase | kSendOnly, qp->qp_num, 0, xrceth, pattern(8, 1), true,
                         kDefaultPkey, src);
        send_raw(std::strcmp(src, kPeerAddr) ? w.stranger : w.peer, p);
        ibv_qp_attr got{};
        ibv_qp_init_attr init{};
        std::optional<Rx> r = receive(w.peer, kSilenceMs);
        ASSERT_EQ(ibv_query_qp(qp, &got, IBV_QP_STATE, &init), 0);
        if (std::strcmp(src, kStrangerAddr) == 0) {
            EXPECT_FALSE(r) << "a stranger's packet was answered";
            EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
        } else {
            // From the peer the same packet is an invalid request.
            ASSERT_TRUE(r);
            EXPECT_EQ(r->raw[kBthLen] & 0xE0, aeth::kNak);
            EXPECT_EQ(got.qp_state, IBV_QPS_ERR);
        }
    }
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

} // namespace
