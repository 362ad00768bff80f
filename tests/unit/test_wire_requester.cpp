// SPDX-License-Identifier: MIT
//
// The requester against a fake peer (fake_peer.hpp): what sroce sends, and
// how it takes forged, stale, unsolicited and misdirected responses.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

TEST_F(FakePeer, RequesterWritePacketsAreWellFormed) {
    Bytes data = pattern(99, 11);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 99, 0x1122334455667788ull, 0xAABBCCDD));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kWriteOnly) << r->str();
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_TRUE(r->ackreq);
    EXPECT_EQ(r->pad, 1);
    EXPECT_EQ(r->va, 0x1122334455667788ull);
    EXPECT_EQ(r->rkey, 0xAABBCCDDu);
    EXPECT_EQ(r->dma_len, 99u);
    EXPECT_EQ(r->payload, data);
    EXPECT_FALSE(poll_wc(50)) << "completed before the ACK";
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_EQ(wc->opcode, IBV_WC_RDMA_WRITE);

    // Three packets: RETH only in the first, consecutive PSNs, ACK requested
    // on the last.
    Bytes big = pattern(2 * kMtu + 100, 12);
    std::memcpy(w.buf + 0x1000, big.data(), big.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0x1000, uint32_t(big.size()), 0x5000, 7));
    Bytes got;
    const uint8_t ops[] = {kWriteFirst, kWriteMiddle, kWriteLast};
    for (uint32_t i = 0; i < 3; i++) {
        r = reply();
        ASSERT_TRUE(r) << "packet " << i;
        EXPECT_EQ(r->opcode, ops[i]) << r->str();
        EXPECT_EQ(r->psn, kSqPsn + 1 + i);
        if (i == 0) {
            EXPECT_EQ(r->va, 0x5000u);
            EXPECT_EQ(r->rkey, 7u);
            EXPECT_EQ(r->dma_len, big.size());
        }
        if (i == 2) {
            EXPECT_TRUE(r->ackreq);
        }
        if (i < 2) {
            EXPECT_EQ(r->payload.size(), kMtu);
        }
        got.insert(got.end(), r->payload.begin(), r->payload.end());
    }
    EXPECT_EQ(got, big);
    send(ack(kSqPsn + 3, aeth::kAck | aeth::kNoCredits, 2));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 2u);
}

TEST_F(FakePeer, RequesterReadAndAtomicRoundTrip) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_READ, 1, 0x100, 64, 0xABC000, 0x42));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRequest) << r->str();
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_EQ(r->va, 0xABC000u);
    EXPECT_EQ(r->rkey, 0x42u);
    EXPECT_EQ(r->dma_len, 64u);
    Bytes data = pattern(64, 13);
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1), data,
                false));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc->byte_len, 64u);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x100, data.data(), 64));

    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0x200, 8, 0xABC008, 0x42, 3));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kFetchAdd) << r->str();
    EXPECT_EQ(r->psn, kSqPsn + 1);
    EXPECT_EQ(r->va, 0xABC008u);
    EXPECT_EQ(r->swap_add, 3u);
    Bytes orig(8);
    put64(orig.data(), 0x0123456789ABCDEFull);
    send(packet(kAtomicAcknowledge, qpn, kSqPsn + 1,
                cat(aeth_bytes(aeth::kAck | aeth::kNoCredits, 2), orig), {}, false));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_FETCH_ADD);
    uint64_t got;
    std::memcpy(&got, w.buf + 0x200, 8);
    EXPECT_EQ(got, 0x0123456789ABCDEFull);
}

// An ACK for a PSN never sent (IBTA calls these ghost responses) must not
// move the requester's window past what it has sent, or the real ACKs that
// follow look stale and the QP stalls.
TEST_F(FakePeer, RequesterIgnoresAckFarAhead) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->psn, kSqPsn);
    send(ack(kSqPsn + 1000));
    send(ack(psn_add(kSqPsn, 0x7FFFFF)));
    std::optional<ibv_wc> early = poll_wc(100);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = early ? early : poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_FALSE(poll_wc(50)) << "a WQE completed twice";

    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kSqPsn + 1) << r->str();
    send(ack(kSqPsn + 1));
    wc = poll_wc();
    ASSERT_TRUE(wc) << "the WRITE after a ghost ACK never completed";
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(FakePeer, RequesterFailsOnNakWithReservedCode) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | 0x1F));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_NE(wc->status, IBV_WC_SUCCESS);
    EXPECT_NE(wc->status, IBV_WC_WR_FLUSH_ERR);
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

TEST_F(FakePeer, RequesterRemoteAccessNak) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteAccessError));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

TEST_F(FakePeer, RequesterReadResponseWithWrongLengthIsBadResponse) {
    for (size_t len : {60u, 68u, 0u}) {
        SCOPED_TRACE(len);
        ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn));
        ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_READ, 1, 0x100, 64, 0xABC000, 0x42));
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r);
        ASSERT_EQ(r->opcode, kReadRequest);
        send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                    pattern(len, 1), false));
        std::optional<ibv_wc> wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_BAD_RESP_ERR);
        EXPECT_EQ(qp_state(), IBV_QPS_ERR);
        expect_untouched(0x100 + 64, 8);
    }
}

TEST_F(FakePeer, RequesterIgnoresUnsolicitedResponses) {
    // Nothing posted: responses of every kind must be ignored harmlessly.
    Bytes orig(8, 0);
    send(ack(kSqPsn));
    send(ack(psn_add(kSqPsn, kPsnMask)));
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(0x1F, 1), pattern(64, 1), false));
    send(packet(kReadRespMiddle, qpn, kSqPsn, {}, pattern(kMtu, 1), false));
    send(packet(kAtomicAcknowledge, qpn, kSqPsn, cat(aeth_bytes(0x1F, 1), orig), {}, false));
    send(ack(kSqPsn, aeth::kRnrNak | 1));
    send(ack(kSqPsn, 0x40)); // reserved AETH kind
    expect_silence();
    EXPECT_FALSE(poll_wc(50));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    // A READ response or ATOMIC ACK at the PSN of a WRITE does not complete it.
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kSqPsn);
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(0x1F, 1), pattern(16, 1), false));
    send(packet(kAtomicAcknowledge, qpn, kSqPsn, cat(aeth_bytes(0x1F, 1), orig), {}, false));
    std::optional<ibv_wc> wc = poll_wc(100);
    if (wc) {
        EXPECT_NE(wc->status, IBV_WC_SUCCESS) << "WRITE completed by a READ response";
    } else {
        send(ack(kSqPsn));
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
}

// A NAK for a PSN with no request outstanding (nothing posted, or long since
// acknowledged) is a ghost response: ignored, like rxe does, rather than
// failing the QP.
TEST_F(FakePeer, RequesterIgnoresNakForPsnNotOutstanding) {
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteAccessError));
    send(ack(kSqPsn + 50, aeth::kNak | aeth::kNakInvalidRequest));
    expect_silence();
    EXPECT_FALSE(poll_wc(50));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS) << "an unsolicited NAK put the QP in error";
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(FakePeer, RequesterIgnoresStaleNak) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    // For PSNs already acknowledged, with a new request outstanding.
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteOpError));
    send(ack(psn_add(kSqPsn, kPsnMask), aeth::kNak | aeth::kNakRemoteAccessError));
    EXPECT_FALSE(poll_wc(100)) << "a stale NAK completed the new request";
    EXPECT_EQ(qp_state(), IBV_QPS_RTS) << "a stale NAK put the QP in error";
    send(ack(kSqPsn + 1));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(FakePeer, RequesterResendsAfterRnrNak) {
    Bytes data = pattern(32, 14);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_SEND, 1, 0, 32, 0, 0));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kSendOnly);
    EXPECT_EQ(r->psn, kSqPsn);
    send(ack(kSqPsn, aeth::kRnrNak | 1)); // RNR timer code 1: 10 us
    r = reply();
    ASSERT_TRUE(r) << "not resent after the RNR NAK";
    EXPECT_EQ(r->opcode, kSendOnly);
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_EQ(r->payload, data);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_SEND);
}

TEST_F(FakePeer, RequesterGoesBackNOnSequenceNak) {
    for (uint64_t i = 0; i < 3; i++)
        ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, i, 0x100 * i, 16, 0x1000, 1));
    for (uint32_t i = 0; i < 3; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->psn, kSqPsn + i);
    }
    // The peer got the first, lost the second.
    send(ack(kSqPsn + 1, aeth::kNak | aeth::kNakPsnSeqError));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 0u);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    for (uint32_t i = 1; i < 3; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "no retransmission of PSN " << hex(kSqPsn + i);
        EXPECT_EQ(r->psn, kSqPsn + i);
        EXPECT_EQ(r->opcode, kWriteOnly);
    }
    send(ack(kSqPsn + 2));
    for (uint64_t i = 1; i < 3; i++) {
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->wr_id, i);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
    expect_silence();
}

TEST_F(FakePeer, RequesterIgnoresAckFromWrongSource) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send_raw(w.stranger, ack(kSqPsn, aeth::kAck | aeth::kNoCredits, 1, kStrangerAddr));
    EXPECT_FALSE(poll_wc(100)) << "completed by an ACK from a stranger";
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

} // namespace
