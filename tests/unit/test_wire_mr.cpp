// SPDX-License-Identifier: MIT
//
// Memory regions and windows taken away while a fake peer's message is in
// progress (fake_peer.hpp): what an MR or window no longer grants ends the
// message, and no byte lands after the call that took it returns.
#include "fake_peer.hpp"

namespace {

using namespace fake_peer;

// ---------------------------------------------------------------------------
// Responder: memory taken away while a message is in progress.  A message
// holds its MR until it ends, as rxe's does: what the MR no longer grants
// ends the message, and no byte lands after ibv_dereg_mr() returns.

// Memory registered apart from the world's MR, so tests may take it away.
struct SideMr {
    std::vector<uint8_t> mem;
    ibv_mr *mr = nullptr;
    SideMr(ibv_pd *pd, size_t len, unsigned access, uint8_t fill = 0xEE) : mem(len, fill) {
        mr = ibv_reg_mr(pd, mem.data(), len, int(access));
    }
    ~SideMr() {
        if (mr) ibv_dereg_mr(mr);
    }
    SideMr(const SideMr &) = delete;
    SideMr &operator=(const SideMr &) = delete;
    void dereg() {
        ASSERT_EQ(ibv_dereg_mr(mr), 0);
        mr = nullptr;
    }
    uint64_t va(size_t off = 0) const { return uint64_t(uintptr_t(mem.data() + off)); }
    // How many bytes of [off, off+len) no longer hold `fill`.
    size_t changed(size_t off, size_t len, uint8_t fill) const {
        return size_t(std::count_if(mem.begin() + ptrdiff_t(off),
                                    mem.begin() + ptrdiff_t(off + len),
                                    [fill](uint8_t b) { return b != fill; }));
    }
};

constexpr unsigned kRemoteRw =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

class MidMessage : public FakePeer {
  protected:
    static constexpr size_t kLen = 8 * kMtu;
    Bytes data = pattern(kLen, 0x5A);

    // [p, p+n) holds what the first packet carried.  Callers first see an
    // answer to a later packet, so the first one has been placed.
    void expect_landed(const uint8_t *p, size_t n) {
        fence();
        ASSERT_EQ(std::memcmp(p, data.data(), n), 0) << "the first packet did not land";
    }

    // WRITE FIRST of `data` through `rkey`, acknowledged, so it has landed.
    void write_first(SideMr &m, uint32_t rkey) {
        send(packet(kWriteFirst, qpn, kRqPsn, reth(m.va(), rkey, uint32_t(kLen)),
                    Bytes(data.begin(), data.begin() + kMtu), true));
        ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
        ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    }

    // The rest of the WRITE: six MIDDLE packets and the LAST.
    void write_rest() {
        for (uint32_t i = 1; i < kLen / kMtu; i++)
            send(packet(i + 1 == kLen / kMtu ? kWriteLast : kWriteMiddle, qpn, kRqPsn + i, {},
                        Bytes(data.begin() + i * kMtu, data.begin() + (i + 1) * kMtu),
                        i + 1 == kLen / kMtu));
    }
};

TEST_F(MidMessage, WriteStopsAtDeregistrationAndNothingLandsAfter) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    // The application reuses the memory at once, as it may.
    std::memset(m.mem.data(), 0x55, kLen);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(0, kLen, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

TEST_F(MidMessage, WriteStopsWhenReregRevokesRemoteWrite) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_EQ(
        ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
        0);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u);
}

TEST_F(MidMessage, WriteStopsWhenReregMovesTheTranslation) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    std::vector<uint8_t> elsewhere(kLen, 0x77);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_EQ(
        ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, elsewhere.data(), kLen, 0), 0);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u) << "the old memory was written";
    EXPECT_EQ(std::count(elsewhere.begin(), elsewhere.end(), 0x77), ptrdiff_t(kLen))
        << "the new memory was written by a message that began before it was registered";
}

TEST_F(MidMessage, WriteStopsWhenItsWindowIsInvalidated) {
    SideMr m(w.pd, kLen, kRemoteRw | IBV_ACCESS_MW_BIND);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_mw *mw = ibv_alloc_mw(w.pd, IBV_MW_TYPE_1);
    ASSERT_NE(mw, nullptr) << strerror(errno);
    ibv_mw_bind b{};
    b.wr_id = 9;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = {m.mr, m.va(), kLen, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(ibv_bind_mw(qp, mw, &b), 0);
    ASSERT_NO_FATAL_FAILURE(expect_success(9));
    ASSERT_NO_FATAL_FAILURE(write_first(m, mw->rkey));
    // A type 1 window bound with length 0 is invalidated.
    b.bind_info = {m.mr, m.va(), 0, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(ibv_bind_mw(qp, mw, &b), 0);
    ASSERT_NO_FATAL_FAILURE(expect_success(9));
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u);
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// Another MR's deregistration changes nothing for a message whose own
// memory stays registered.
TEST_F(MidMessage, WriteGoesOnWhenAnotherMrIsDeregistered) {
    SideMr m(w.pd, kLen, kRemoteRw), other(w.pd, 4096, kRemoteRw);
    ASSERT_TRUE(m.mr && other.mr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_NO_FATAL_FAILURE(other.dereg());
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + kLen / kMtu - 1, 1));
    fence();
    EXPECT_EQ(0, std::memcmp(m.mem.data(), data.data(), kLen));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(MidMessage, SendStopsWhenTheReceiveBuffersMrIsDeregistered) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_sge sge{m.va(), uint32_t(kLen), m.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 31;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
    send(packet(kSendFirst, qpn, kRqPsn, {}, Bytes(data.begin(), data.begin() + kMtu), true));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    std::memset(m.mem.data(), 0x55, kLen);
    send(packet(kSendMiddle, qpn, kRqPsn + 1, {},
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    send(packet(kSendLast, qpn, kRqPsn + 2, {},
                Bytes(data.begin() + 2 * kMtu, data.begin() + 3 * kMtu)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakRemoteOpError, kRqPsn + 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 31u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc->status);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
    fence();
    EXPECT_EQ(m.changed(0, kLen, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

// The requester's side: a READ's responses land in the posted local memory
// only while it is registered.
TEST_F(MidMessage, ReadResponseAfterLocalDeregistrationIsAProtectionError) {
    SideMr m(w.pd, 2 * kMtu, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_sge sge{m.va(), uint32_t(2 * kMtu), m.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 41;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = 0xABC000;
    wr.wr.rdma.rkey = 0x42;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->opcode, kReadRequest) << r->str();
    send(packet(kReadRespFirst, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                Bytes(data.begin(), data.begin() + kMtu), false));
    // A request to this QP's responder, answered after the response before it.
    send(write_only(kRqPsn, 0x8000, pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    std::memset(m.mem.data(), 0x55, 2 * kMtu);
    send(packet(kReadRespLast, qpn, kSqPsn + 1, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 41u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc->status);
    fence();
    EXPECT_EQ(m.changed(0, 2 * kMtu, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

} // namespace
