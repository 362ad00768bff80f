// SPDX-License-Identifier: MIT
//
// Entry points between the transport roles (requester, responder, completer)
// and the QP.  They run with Qp::mu held, except the verbs' own entries,
// which take it themselves (req_post_send, req_post_local, req_retire_sent,
// resp_post_recv); req_send_and_unlock and send_and_unlock release it.  The
// lock order is in sroce.hpp.
#pragma once

#include "nic.hpp"

namespace sroce {

// requester (req.cpp)
int req_post_send(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr);
void req_run(Qp *qp, TxBatch &tx);
void req_rewind(Qp *qp, uint32_t psn);
// The completer retired WQEs up to SendQueue::tail: the requester moves its
// transmit cursor past them if a rewind had left it behind.
void req_retired(Qp *qp);
void req_timers(Qp *qp, TxBatch &tx, uint64_t now);
void req_arm_timer(Qp *qp);
// Selective repeat: resends the one packet at `psn` unless a resend of it may
// still be on its way (the responder's highest held PSN, `reported`, is not
// past what had been sent when it left).  True when it sent.  `cursor`, for
// callers resending PSNs in ascending order, is the send queue index where
// the search for the PSN's WQE starts, and is left at the WQE found.
bool req_resend(Qp *qp, uint32_t psn, uint32_t reported, TxBatch &tx, uint32_t *cursor = nullptr);
// The same whatever the last resend of `psn`: nothing has been heard of it.
bool req_resend_now(Qp *qp, uint32_t psn, TxBatch &tx);
// (Re)starts the selective-repeat recovery timer, or stops it when nothing
// is outstanding.
void req_arm_recovery(Qp *qp);
// Completes the WQE at the tail with the local error found when it was
// posted, and puts the QP in the error state.
void req_fail_at_tail(Qp *qp);
// Building blocks shared by ibv_post_send and the ibv_wr_* interface.
SendWqe &req_new_wqe(Qp *qp, uint32_t slot, uint64_t wr_id, ibv_wr_opcode op, unsigned flags);
bool req_fill_sges(Qp *qp, SendWqe &w, const ibv_sge *sg, size_t n);
bool req_fill_inline(Qp *qp, SendWqe &w, uint32_t slot, const ibv_data_buf *bufs, size_t n);
// Sets a UD WQE's destination from an address handle; false without one.
bool req_set_ud_addr(Qp *qp, SendWqe &w, ibv_ah *ah, uint32_t qpn, uint32_t qkey);
// Whether the QP's transport carries the WQE's operation (and, for UD, its size).
bool req_check_wqe(Qp *qp, SendWqe &w);
// Moves an ATOMIC WRITE's 8-byte value from its gather list into the WQE.
bool req_take_atomic_write_value(SendWqe &w);
// Queues what it can transmit into the calling thread's batch (or flushes
// every WQE when the QP is in error); the caller then calls send_and_unlock.
void req_kick(Qp *qp);
// Retires the WQEs of an unreliable QP (UC, UD) once their packets are sent.
void req_retire_sent(Qp *qp);
// True when the send queue has no room for another WQE.
bool req_sq_full(const Qp *qp);
// Tag matching: posts the RDMA READ that fetches a matched rendezvous's data
// into the tag's buffer (the FIN follows when it completes).  When the send
// queue is full it completes the tag's buffer with IBV_WC_LOC_QP_OP_ERR, so
// its owner does not wait for data that will not come, and returns false.
bool req_post_tm_read(Qp *qp, TxBatch &tx, Srq *srq, uint64_t wr_id, uint64_t tag, uint32_t priv,
                      const ibv_sge &buf, uint32_t len, uint64_t va, uint32_t rkey);
// Called by complete_send for the requester's own tag-matching WQEs.
void req_tm_done(Qp *qp, const SendWqe &w, ibv_wc_status status);
// Posts a local work request (BIND_MW for ibv_bind_mw()) as ibv_post_send
// would; 0 or an errno.
int req_post_local(Qp *qp, ibv_wr_opcode op, uint64_t wr_id, unsigned flags, Mw *mw, uint32_t rkey,
                   const ibv_mw_bind_info *bind);
// Sends the calling thread's batch (if any) and releases qp->mu, which the
// caller holds; the QP's tx_mu is taken before qp->mu is released.
void req_send_and_unlock(Qp *qp);
// The same for a batch of the caller's: `held` is its lock on qp->mu.
void send_and_unlock(Qp *qp, TxBatch &tx, std::unique_lock<std::mutex> &held);
// Sends the ACK left for the QP's next request (resp_send_deferred_ack) now,
// from the calling thread, which holds qp->mu in `held` and keeps it.
void send_deferred_ack_now(Qp *qp, std::unique_lock<std::mutex> &held);
// Queues it into the calling thread's batch, which the caller, holding
// qp->mu in `held`, sends later with req_send_queued (which unlocks).
void req_queue_deferred_ack(Qp *qp);
void req_send_queued(Qp *qp, std::unique_lock<std::mutex> &held);

// completer (comp.cpp)
void comp_receive(Qp *qp, const wire::Packet &pkt, TxBatch &tx);
// Completes the finished WQEs at the send queue's tail, in order.
void comp_retire(Qp *qp);

// responder (resp.cpp)
int resp_post_recv(Qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
void resp_receive(Qp *qp, const wire::Packet &pkt, TxBatch &tx);
void resp_send_ack(Qp *qp, TxBatch &tx);
// Queues the ACK a receive pass left for the QP's next post (Qp::ack_deferred)
// into `tx`, if there is one: for that post, or because the QP is about to
// be reset, moved to error or destroyed.  Under Qp::mu.
void resp_send_deferred_ack(Qp *qp, TxBatch &tx);
// The same for an ACK whose hold ran out: no request came to carry it, so
// the QP holds no more until it shows a ping-pong again (Qp::ack_hold_pays).
void resp_ack_hold_timed_out(Qp *qp, TxBatch &tx);

// qp.cpp
void qp_enter_error(Qp *qp);
// Completes every queued WQE with IBV_WC_WR_FLUSH_ERR, as the IB spec says
// a QP in error does ("flushes"; the engine keeps "flush" for the IBTA FLUSH
// operation, and says "xmit" for sending a batch).
void qp_fail_queues(Qp *qp);
void complete_send(Qp *qp, const SendWqe &wqe, ibv_wc_status status);
// What a receive completion reports beyond its WQE.
struct RecvCompletion {
    ibv_wc_status status = IBV_WC_SUCCESS;
    ibv_wc_opcode opcode = IBV_WC_RECV;
    uint32_t byte_len = 0;
    // Immediate data in network order, or the invalidated rkey in host order
    // (ibv_wc's union has them so).
    __be32 imm = 0;
    unsigned wc_flags = 0;
    uint32_t src_qp = 0;    // UD: the sender's QP (others report the connected peer)
    uint8_t sl = 0;         // UD: the network header type (see finish_recv)
    bool solicited = false; // the message carried the SE bit (wakes a solicited-only CQ)
    Srq *srq = nullptr;     // the WQE came from this SRQ (an XRC SRQ has its own CQ)
    const ibv_wc_tm_info *tm = nullptr; // tag matching: the tag and context
};
void complete_recv(Qp *qp, const RecvWqe &wqe, const RecvCompletion &c);
void post_async_event(Qp *qp, ibv_event_type type);
void post_cq_overflow(Context *ctx, Cq *cq);
// A device event (IBV_EVENT_DEVICE_FATAL) for every context on `nic` (verbs.cpp).
void post_device_event(Nic *nic, ibv_event_type type);
// Memory windows (mw.cpp).  SEND WITH INVALIDATE: invalidates the type 2
// window `rkey` names.  0 or an errno.
int invalidate_rkey(Qp *qp, Pd *pd, uint32_t rkey);
// Carries out a BIND_MW / LOCAL_INV work request when the requester reaches it.
ibv_wc_status mw_bind(Qp *qp, const SendWqe &wqe);
ibv_wc_status mw_local_invalidate(Qp *qp, uint32_t rkey);
// The MR a window is bound to, or nullptr.
Mr *window_parent(Mw *mw);
// Takes the type 2 windows bound through `qp` out of service (QP destroyed);
// caller holds objects_mu.
void unbind_windows_of(Qp *qp);

// Retransmit timeout of the QP's `timeout` attribute: 4.096 us * 2^timeout.
inline uint64_t timeout_ns(uint8_t t) {
    return t ? 4096ull << t : 0;
}
// IBTA RNR timer encoding (5 bits) to nanoseconds.
uint64_t rnr_timer_ns(uint8_t code);

} // namespace sroce
