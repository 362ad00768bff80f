// SPDX-License-Identifier: MIT
//
// Requester: turns send-queue WQEs into packets (segmentation at the path MTU,
// PSN assignment, fences, read/atomic credits), keeps the go-back-N state and
// the retransmit and RNR timers.  UC and UD QPs use the same path without
// acknowledgements: their WQEs retire once their packets have left.
#include "transport.hpp"

#include <algorithm>
#include <cstring>
#include <pthread.h>

namespace sroce {
namespace {

// Selective repeat: the oldest unacknowledged packet is resent once the
// responder has said nothing about it for this long, then twice as long...
constexpr uint64_t kRecoveryNs = 1000000;
constexpr uint32_t kRecoveryMaxDoublings = 6;
// Ask for an ACK at least this often inside long messages.
constexpr uint32_t kAckReqEvery = 32;

// Each posting thread's batch (48 KiB), made on its first post: a static
// thread_local would be reserved in every thread of every process the
// library is preloaded into, most of which never post.  Freed when its
// thread ends through a key's destructor, which runs at pthread_exit() but
// not at exit(): a thread's exit handlers may still post.
thread_local TxBatch *t_tx = nullptr;

pthread_key_t tx_key() {
    static const pthread_key_t key = [] {
        pthread_key_t k;
        pthread_key_create(&k, [](void *p) {
            delete static_cast<TxBatch *>(p);
            t_tx = nullptr;
        });
        return k;
    }();
    return key;
}

TxBatch &thread_tx() {
    if (!t_tx) [[unlikely]] {
        t_tx = new TxBatch;
        pthread_setspecific(tx_key(), t_tx);
    }
    return *t_tx;
}

bool is_read(const SendWqe &w) {
    return w.opcode == IBV_WR_RDMA_READ;
}
bool is_atomic(const SendWqe &w) {
    return w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
bool needs_credit(const SendWqe &w) {
    return wr_needs_response(w.opcode);
}
// Work requests carried out by the requester itself, with no packet.
bool is_local(const SendWqe &w) {
    return w.opcode == IBV_WR_BIND_MW || w.opcode == IBV_WR_LOCAL_INV;
}

uint32_t div_up(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

// The RC opcode of packet i of a SEND or WRITE WQE.
uint8_t send_write_opcode(const SendWqe &w, uint32_t i) {
    bool first = i == 0, last = i + 1 == w.tx.npkts;
    using namespace wire;
    if (w.opcode == kWrWriteCommit) {
        bool imm = w.commit_flags & kCommitImmFlag;
        if (first && last) return imm ? kCommitWriteOnlyImm : kCommitWriteOnly;
        if (first) return kCommitWriteFirst;
        if (last) return imm ? kCommitWriteLastImm : kCommitWriteLast;
        return kCommitWriteMiddle;
    }
    if (w.opcode == IBV_WR_SEND_WITH_INV) {
        if (last) return first ? kSendOnlyInv : kSendLastInv;
        return first ? kSendFirst : kSendMiddle;
    }
    bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    bool imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w.opcode == IBV_WR_SEND_WITH_IMM;
    if (first && last)
        return write ? (imm ? kWriteOnlyImm : kWriteOnly) : (imm ? kSendOnlyImm : kSendOnly);
    if (first) return write ? kWriteFirst : kSendFirst;
    if (last) return write ? (imm ? kWriteLastImm : kWriteLast) : (imm ? kSendLastImm : kSendLast);
    return write ? kWriteMiddle : kSendMiddle;
}

// The RC opcode of a WQE's packet i.
uint8_t rc_opcode(const SendWqe &w, uint32_t i) {
    using namespace wire;
    if (is_read(w)) return kReadRequest;
    if (is_atomic(w)) return w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? kCompareSwap : kFetchAdd;
    if (w.opcode == IBV_WR_FLUSH) return kFlush;
    if (w.opcode == IBV_WR_ATOMIC_WRITE) return kAtomicWrite;
    return send_write_opcode(w, i);
}

// The opcode on the QP's transport.
uint8_t wire_opcode(const Qp *qp, uint8_t rc) {
    using namespace wire;
    switch (qp->type) {
    case IBV_QPT_UC:
        return kUcBase | rc;
    case IBV_QPT_UD:
        return rc == kSendOnlyImm ? kUdSendOnlyImm : kUdSendOnly;
    case IBV_QPT_XRC_SEND:
        return kXrcBase | rc;
    default:
        return rc;
    }
}

// Linux rxe 6.2 and later drops FLUSHes with IBTA's ICRC and takes only its
// own form (icrc.hpp).  The first transmission uses the form the peer is
// known to take, IBTA's while unknown; retransmissions alternate - while
// unknown only after two in IBTA's form, so a lost packet alone rarely shows
// an IBTA peer the other form - and the completer learns from the answer.  A
// peer that answered an IBTA-form FLUSH never sees the other form again.
bool flush_legacy_form(Qp *qp, SendWqe &w) {
    uint8_t n = w.tx.flush_tx;
    if (w.tx.flush_tx < UINT8_MAX) w.tx.flush_tx++;
    bool legacy;
    switch (qp->peer_flush_icrc) {
    case kFlushIcrcIbta:
        legacy = false;
        break;
    case kFlushIcrcLegacy:
        legacy = n % 2 == 0;
        break;
    default:
        legacy = n >= 2 && n % 2 == 0;
        break;
    }
    w.tx.flush_forms |= legacy ? kFlushIcrcLegacy : kFlushIcrcIbta;
    w.tx.flush_last_legacy = legacy;
    return legacy;
}

// `ackreq`: ask for an acknowledgement whatever the position (a selective
// resend, whose answer tells the requester where the responder stands).
void send_packet(Qp *qp, SendWqe &w, uint32_t i, TxBatch &tx, bool ackreq_always = false) {
    using namespace wire;
    // An ACK held back for this QP's next request goes ahead of it, as an
    // RNIC's would have: the peer may count on the order (its send
    // completion before what this request causes, as rdma-core's
    // tag-matching rendezvous test does).
    if (qp->ack_deferred) {
        resp_send_deferred_ack(qp, tx);
    } else if (i == 0 && qp->ack_sent_ns && !qp->ack_hold_pays &&
               now_ns() - qp->ack_sent_ns < kAckHoldNs) {
        // An answer this soon after the ACK of what it answers: from now on
        // the ACK waits for the answer.
        qp->ack_hold_pays = true;
    }
    const uint32_t mtu = qp->attr.mtu;
    uint8_t op = wire_opcode(qp, rc_opcode(w, i));
    const OpInfo &info = op_info(op);
    uint8_t hdr[kMaxHdrLen];
    uint32_t psn = psn_add(w.tx.first_psn, i);
    if (psn_diff(psn, qp->req.max_sent_psn) > 0) {
        qp->req.max_sent_psn = psn;
        if (qp->selective_repeat && !qp->comp.rtt_sent_ns) {
            qp->comp.rtt_psn = psn;
            qp->comp.rtt_sent_ns = now_ns();
        }
    }
    bool ud = qp->type == IBV_QPT_UD;
    uint32_t dqpn = ud ? w.ud_qpn : qp->attr.dest_qpn;
    const IpAddr &daddr = ud ? w.ud_addr : qp->attr.dest_addr;
    const IpAddr &saddr = ud ? w.ud_src : qp->attr.src_addr;
    IpFields ipf = ud ? w.ud_ip : ip_fields(qp->attr.ah.grh);
    bool last = info.flags & kOpLast;
    // A QP its rate holds back asks for every packet's acknowledgement: at a
    // packet every few milliseconds, one ACK per kAckReqEvery would leave the
    // selective-repeat recovery timer to resend what is not lost.
    bool ackreq = qp->reliable() &&
                  ((info.flags & (kOpRead | kOpAtomic | kOpFlush | kOpAtomicWrite)) || last ||
                   ackreq_always || qp->cc.limited || ++qp->req.pkts_since_ackreq >= kAckReqEvery);
    if (ackreq) qp->req.pkts_since_ackreq = 0;
    bool se = last && (w.flags & IBV_SEND_SOLICITED);
    bth::build(hdr, op, se, 0, kDefaultPkey, dqpn, ackreq, psn);
    bth::announce(hdr, qp->announce);
    if (info.xrceth) put32(hdr + info.xrceth, w.xrc_srqn & kQpnMask);
    if (info.deth) {
        put32(hdr + info.deth, w.ud_qkey);
        put32(hdr + info.deth + 4, qp->qpx.qp_base.qp_num & kQpnMask);
    }
    if (info.feth) put32(hdr + info.feth, uint32_t(w.flush_level) << 4 | w.flush_type);
    if (info.reth) {
        // A re-sent READ asks only for the responses not yet received.
        uint32_t off = is_read(w) ? i * mtu : 0;
        put64(hdr + info.reth, w.remote_addr + off);
        put32(hdr + info.reth + 8, w.rkey);
        put32(hdr + info.reth + 12, w.length - off);
    }
    if (info.atomic_eth) {
        bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
        put64(hdr + info.atomic_eth, w.remote_addr);
        put32(hdr + info.atomic_eth + 8, w.rkey);
        put64(hdr + info.atomic_eth + 12, cas ? w.swap : w.compare_add);
        put64(hdr + info.atomic_eth + 20, cas ? w.compare_add : 0);
    }
    if (info.ceth) {
        hdr[info.ceth] =
            uint8_t(((w.commit_flags & IBV_WRITE_COMMIT_ORDERED) ? ceth::kOrdered : 0) |
                    ((w.commit_flags & kCommitImmFlag) ? ceth::kImmed : 0) |
                    ((w.commit_flags & IBV_WRITE_COMMIT_GLOBAL) ? ceth::kGlobal : 0));
        hdr[info.ceth + 1] = hdr[info.ceth + 2] = hdr[info.ceth + 3] = 0;
    }
    if (info.immdt) std::memcpy(hdr + info.immdt, &w.imm, 4); // already network order
    if (info.ieth) std::memcpy(hdr + info.ieth, &w.imm, 4);   // the rkey, likewise
    if (!(info.hdrs & kHasPayload)) {
        bool legacy = op == kFlush && flush_legacy_form(qp, w);
        qp->nic->queue(tx, saddr, daddr, ipf, hdr, info.hdr_len, nullptr, 0, 0,
                       legacy ? Nic::kQueueLegacyFlush : 0);
        return;
    }
    if (w.opcode == IBV_WR_ATOMIC_WRITE) {
        iovec iov{w.atomic_data, 8};
        qp->nic->queue(tx, saddr, daddr, ipf, hdr, info.hdr_len, &iov, 1, 8);
        return;
    }
    uint32_t off = i * mtu;
    uint32_t len = std::min(mtu, w.length - std::min(w.length, off));
    iovec iov[kMaxSge];
    int n = 0;
    sg_walk(w.sge, w.num_sge, off, len, [&](uint8_t *p, uint32_t k) { iov[n++] = {p, k}; });
    qp->nic->queue(tx, saddr, daddr, ipf, hdr, info.hdr_len, iov, n, len);
}

// Congestion control's part in sending a request packet of `bytes`
// (kCcPacketOverhead included): false when the QP's rate holds it back
// (cc_admit set the pacing timer), else counted for the meter.
bool cc_may_send(Qp *qp, uint32_t bytes, uint64_t now) {
    if (qp->cc.limited && !cc_admit(qp, bytes, now)) return false;
    qp->cc.tx_bytes += bytes;
    qp->cc.tx_pkts++;
    return true;
}

} // namespace

bool req_sq_full(const Qp *qp) {
    return qp->sq.head - qp->sq.tail >= qp->sq.max_wr;
}

bool req_post_tm_read(Qp *qp, TxBatch &tx, Srq *srq, uint64_t wr_id, uint64_t tag, uint32_t priv,
                      const ibv_sge &buf, uint32_t len, uint64_t va, uint32_t rkey) {
    SendQueue &sq = qp->sq;
    if (req_sq_full(qp)) {
        SendWqe failed;
        failed.tm.internal = kTmRead;
        failed.tm.srq = srq;
        failed.tm.wr_id = wr_id;
        req_tm_done(qp, failed, IBV_WC_LOC_QP_OP_ERR);
        return false;
    }
    SendWqe &w = req_new_wqe(qp, sq.head % sq.max_wr, 0, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED);
    w.signaled = true;
    w.num_sge = len ? 1 : 0;
    w.sge[0] = {buf.addr, len, buf.lkey};
    w.length = len;
    w.remote_addr = va;
    w.rkey = rkey;
    w.tm.internal = kTmRead;
    w.tm.srq = srq;
    w.tm.wr_id = wr_id;
    w.tm.tag = tag;
    w.tm.priv = priv;
    sq.head++;
    req_run(qp, tx);
    return true;
}

void req_tm_done(Qp *qp, const SendWqe &w, ibv_wc_status status) {
    if (w.tm.internal != kTmRead) return; // a FIN: nothing to report
    ibv_wc wc{};
    wc.wr_id = w.tm.wr_id;
    wc.status = status;
    wc.opcode = IBV_WC_TM_RECV;
    wc.byte_len = w.length;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    wc.wc_flags = status == IBV_WC_SUCCESS ? IBV_WC_TM_DATA_VALID : 0;
    if (!w.tm.srq->cq->push(wc, false)) post_cq_overflow(qp->ctx, w.tm.srq->cq);
    if (status != IBV_WC_SUCCESS) return;
    // The FIN carries a TMH naming the tag back to the sender.
    Requester &q = qp->req;
    std::memset(q.tm_fin, 0, sizeof q.tm_fin);
    q.tm_fin[0] = IBV_TMH_FIN;
    wire::put32(q.tm_fin + 4, w.tm.priv);
    wire::put64(q.tm_fin + 8, w.tm.tag);
    q.tm_fin_pending = true;
}

// Posts a pending FIN once the send queue has room.
void post_tm_fin(Qp *qp) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    if (!q.tm_fin_pending || sq.head - sq.tail >= sq.max_wr) return;
    SendWqe &w = req_new_wqe(qp, sq.head % sq.max_wr, 0, IBV_WR_SEND, IBV_SEND_SIGNALED);
    w.signaled = true;
    w.tm.internal = kTmFin;
    std::memcpy(w.tm.fin, q.tm_fin, sizeof w.tm.fin);
    w.num_sge = 1;
    w.sge[0] = {uintptr_t(w.tm.fin), uint32_t(sizeof w.tm.fin), 0};
    w.length = sizeof w.tm.fin;
    sq.head++;
    q.tm_fin_pending = false;
}

void req_fail_at_tail(Qp *qp) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    SendWqe &w = sq.at(sq.tail);
    w.tx.started = true;
    w.tx.done = true;
    complete_send(qp, w, w.status);
    // Retired here, or the flush that follows would complete it twice.
    sq.tail++;
    q.cur = sq.tail;
    qp_enter_error(qp);
}

void req_retired(Qp *qp) {
    // A rewind may have left the transmit cursor behind WQEs acknowledged since.
    if (int32_t(qp->req.cur - qp->sq.tail) < 0) qp->req.cur = qp->sq.tail;
}

void req_arm_timer(Qp *qp) {
    Completer &c = qp->comp;
    if (wire::psn_diff(qp->req.next_psn, c.una_psn) > 0 && qp->attr.timeout)
        qp->timers.retransmit_at_ns = now_ns() + timeout_ns(qp->attr.timeout);
    else
        qp->timers.retransmit_at_ns = 0;
}

void req_run(Qp *qp, TxBatch &tx) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    if (qp->attr.state != IBV_QPS_RTS || qp->timers.rnr_at_ns) return;
    post_tm_fin(qp);
    bool reliable = qp->reliable();
    bool sent = false, local_done = false;
    // Congestion control: while the QP's rate limits it, each packet waits
    // for its bytes (congestion.hpp); the pacing timer resumes it.
    uint64_t now = 0;
    if (qp->cc.limited) {
        if (qp->timers.pace_at_ns) return;
        now = now_ns();
        cc_refill(qp, now);
    }
    // And its packets in flight to its rate's worth (IRN's cap on what a
    // queue can be made to hold); an acknowledgement resumes it.
    const int32_t window = int32_t(std::min(kSendWindow, cc_inflight_cap(qp)));
    const uint32_t mtu = qp->attr.mtu;
    while (q.cur != sq.head) {
        SendWqe &w = sq.at(q.cur);
        if (w.tx.done) {
            q.cur++;
            continue;
        }
        if (!w.tx.started) {
            if (w.status != IBV_WC_SUCCESS) {
                // A WQE that failed local checks completes in order, once
                // everything before it has (req_fail_at_tail).
                if (sq.tail == q.cur) req_fail_at_tail(qp);
                return;
            }
            if ((w.flags & IBV_SEND_FENCE) && sq.rd_outstanding) break;
            if (is_local(w)) {
                // In order with the work requests around it; it completes
                // once those before it have.
                ibv_wc_status st =
                    w.opcode == IBV_WR_BIND_MW ? mw_bind(qp, w) : mw_local_invalidate(qp, w.rkey);
                if (st != IBV_WC_SUCCESS) {
                    w.status = st;
                    continue; // reported in order by the branch above
                }
                w.tx.started = true;
                w.tx.first_psn = q.next_psn;
                w.tx.npkts = 0;
                w.tx.done = true;
                q.cur++;
                local_done = true;
                continue;
            }
            if (needs_credit(w) && sq.rd_outstanding >= qp->attr.max_rd_atomic) break;
            if (reliable && wire::psn_diff(q.next_psn, qp->comp.una_psn) >= window) break;
            w.tx.first_psn = q.next_psn;
            // Atomics, FLUSH and ATOMIC WRITE take one PSN; a READ one per
            // response packet; SEND/WRITE one per packet.
            bool single = wr_needs_response(w.opcode) && !is_read(w);
            w.tx.npkts = single ? 1 : std::max(1u, div_up(w.length, qp->attr.mtu));
            w.tx.sent_pkts = 0;
            w.tx.read_next = 0;
            w.tx.started = true;
            q.next_psn = wire::psn_add(q.next_psn, w.tx.npkts);
            if (needs_credit(w)) sq.rd_outstanding++;
        }
        if (needs_credit(w)) {
            if (w.tx.sent_pkts == 0) {
                if (!cc_may_send(qp, kCcPacketOverhead, now)) goto out;
                send_packet(qp, w, w.tx.read_next, tx);
                w.tx.sent_pkts = 1;
                sent = true;
            }
        } else {
            while (w.tx.sent_pkts < w.tx.npkts) {
                uint32_t psn = wire::psn_add(w.tx.first_psn, w.tx.sent_pkts);
                if (reliable && wire::psn_diff(psn, qp->comp.una_psn) >= window) goto out;
                uint32_t off = w.tx.sent_pkts * mtu;
                uint32_t bytes =
                    std::min(mtu, w.length - std::min(w.length, off)) + kCcPacketOverhead;
                if (!cc_may_send(qp, bytes, now)) goto out;
                send_packet(qp, w, w.tx.sent_pkts, tx);
                w.tx.sent_pkts++;
                sent = true;
            }
            // Nothing acknowledges UC and UD: done once sent (retired by
            // req_retire_sent after the batch has left).
            if (!reliable) w.tx.done = true;
        }
        q.cur++;
    }
out:
    if (reliable && sent && !qp->timers.retransmit_at_ns) req_arm_timer(qp);
    if (reliable && sent && !qp->timers.recovery_at_ns) req_arm_recovery(qp);
    // Nothing acknowledges a local operation: complete it here once it has
    // reached the tail (unacknowledged transports retire after sending).
    if (reliable && local_done) comp_retire(qp);
}

void req_rewind(Qp *qp, uint32_t psn) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    for (uint32_t i = sq.tail; i != sq.head; i++) {
        SendWqe &w = sq.at(i);
        if (!w.tx.started) break;
        if (w.tx.done) continue;
        int32_t d = wire::psn_diff(psn, w.tx.first_psn);
        if (d >= 0 && uint32_t(d) < w.tx.npkts) {
            if (needs_credit(w)) {
                w.tx.read_next = std::max(w.tx.read_next, uint32_t(d));
                w.tx.sent_pkts = 0;
            } else {
                w.tx.sent_pkts = uint32_t(d);
            }
            for (uint32_t j = i + 1; j != sq.head; j++) {
                SendWqe &x = sq.at(j);
                if (!x.tx.started) break;
                x.tx.sent_pkts = 0;
            }
            q.cur = i;
            qp->nic->stats.retransmits.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (d < 0) break;
    }
}

void req_arm_recovery(Qp *qp) {
    Completer &c = qp->comp;
    if (!qp->selective_repeat || wire::psn_diff(qp->req.next_psn, c.una_psn) <= 0) {
        qp->timers.recovery_at_ns = 0;
        return;
    }
    // A round trip and four of its deviations, as TCP's RTO; never less
    // than kRecoveryNs, which a lost packet at the end of a burst waits,
    // and never more than a sixteenth of the retransmit timer's period:
    // behind a deep queue (no congestion control, a round trip of tens of
    // ms) the timer must still get its few doublings in before that one
    // rewinds everything.  Nor more than its old longest period: a sample
    // that waited for a lost packet's recovery counts that wait too.
    const Completer &rt = qp->comp;
    uint64_t base = std::clamp(rt.srtt_ns + 4 * rt.rttvar_ns, kRecoveryNs,
                               kRecoveryNs << kRecoveryMaxDoublings);
    if (qp->attr.timeout)
        base = std::min(base, std::max(kRecoveryNs, timeout_ns(qp->attr.timeout) / 16));
    uint64_t period = base << std::min(qp->timers.sr_backoff, kRecoveryMaxDoublings);
    // Never later than the retransmit timer, which would rewind everything.
    if (qp->attr.timeout) period = std::min(period, timeout_ns(qp->attr.timeout));
    qp->timers.recovery_at_ns = now_ns() + period;
}

bool req_resend(Qp *qp, uint32_t psn, uint32_t reported, TxBatch &tx, uint32_t *cursor) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    if (!q.resent) {
        q.resent.reset(new (std::nothrow) ResendMark[kSendWindow]);
        if (!q.resent) return false;
    }
    ResendMark &m = q.resent[psn % kSendWindow];
    // A resend still on its way: the responder has not yet received anything
    // sent after it.
    if (m.psn == psn && wire::psn_diff(reported, m.mark) <= 0) return false;
    uint32_t from = cursor && int32_t(*cursor - sq.tail) > 0 ? *cursor : sq.tail;
    for (uint32_t i = from; i != sq.head; i++) {
        SendWqe &w = sq.at(i);
        if (!w.tx.started) return false;
        int32_t d = wire::psn_diff(psn, w.tx.first_psn);
        if (d < 0) return false;
        if (uint32_t(d) >= w.tx.npkts) continue;
        if (cursor) *cursor = i;
        if (w.tx.done) return false;
        uint32_t k = uint32_t(d);
        if (needs_credit(w)) {
            // A request for what has not been answered yet; a READ's other
            // PSNs name responses, not packets of this side.
            if (k != w.tx.read_next || w.tx.sent_pkts == 0) return false;
            send_packet(qp, w, k, tx, true);
        } else if (k >= w.tx.sent_pkts) {
            return false; // not sent yet: req_run will
        } else {
            send_packet(qp, w, k, tx, true);
        }
        m = {psn, q.max_sent_psn};
        qp->nic->stats.tx_resent_selective.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    return false;
}

bool req_resend_now(Qp *qp, uint32_t psn, TxBatch &tx) {
    if (qp->req.resent) qp->req.resent[psn % kSendWindow].psn = UINT32_MAX;
    return req_resend(qp, psn, psn, tx);
}

void req_timers(Qp *qp, TxBatch &tx, uint64_t now) {
    Completer &c = qp->comp;
    if (qp->attr.state != IBV_QPS_RTS && qp->attr.state != IBV_QPS_SQD) return;
    if (qp->timers.rnr_at_ns && now >= qp->timers.rnr_at_ns) {
        qp->timers.rnr_at_ns = 0;
        req_rewind(qp, c.una_psn);
        req_run(qp, tx);
        req_arm_timer(qp);
        return;
    }
    if (qp->timers.recovery_at_ns && now >= qp->timers.recovery_at_ns && !qp->timers.rnr_at_ns) {
        // Whatever the mark says: nothing reported it lost, nothing came.
        req_resend_now(qp, c.una_psn, tx);
        qp->timers.sr_backoff++;
        req_arm_recovery(qp);
    }
    if (qp->timers.retransmit_at_ns && now >= qp->timers.retransmit_at_ns) {
        qp->nic->stats.timeouts.fetch_add(1, std::memory_order_relaxed);
        if (qp->timers.retries_left == 0) {
            SendWqe &w = qp->sq.at(qp->sq.tail);
            w.tx.done = true;
            complete_send(qp, w, IBV_WC_RETRY_EXC_ERR);
            qp->sq.tail++;
            qp_enter_error(qp);
            return;
        }
        qp->timers.retries_left--;
        req_rewind(qp, c.una_psn);
        req_run(qp, tx);
        req_arm_timer(qp);
    }
}

bool req_fill_sges(Qp *qp, SendWqe &w, const ibv_sge *sg, size_t n) {
    if (n > qp->sq.max_sge) return false;
    bool atomic = is_atomic(w);
    unsigned need = is_read(w) || atomic ? IBV_ACCESS_LOCAL_WRITE : 0;
    Pd *pd = qp->pd;
    uint64_t total = 0;
    w.num_sge = uint32_t(n);
    w.mr_epoch = qp->nic->mrs.epoch();
    for (size_t i = 0; i < n; i++) {
        uint8_t *host = check_lkey(qp->nic, pd, sg[i], need);
        if (!host && sg[i].length) w.status = IBV_WC_LOC_PROT_ERR;
        w.sge[i] = {uintptr_t(host), sg[i].length, sg[i].lkey};
        total += sg[i].length;
    }
    if (total > kMaxMsgSize) return false;
    w.length = uint32_t(total);
    if (atomic && (w.length != 8 || (w.remote_addr & 7))) w.status = IBV_WC_LOC_LEN_ERR;
    return true;
}

bool req_take_atomic_write_value(SendWqe &w) {
    // The 8 bytes are captured when posted, like inline data: the wire
    // carries them exactly as the application laid them out.
    if (w.length != 8) return false;
    uint8_t *dst = w.atomic_data;
    sg_walk(w.sge, w.num_sge, 0, 8, [&dst](uint8_t *p, uint32_t k) {
        std::memcpy(dst, p, k);
        dst += k;
    });
    w.num_sge = 0;
    return true;
}

bool req_fill_inline(Qp *qp, SendWqe &w, uint32_t slot, const ibv_data_buf *bufs, size_t n) {
    if (is_read(w) || is_atomic(w)) return false;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += bufs[i].length;
    if (total > qp->sq.max_inline) return false;
    // data(), not operator[]: with max_inline_data 0 the pool is empty and
    // only zero-length inline sends get here.
    uint8_t *buf = qp->sq.inline_buf.data() + size_t(slot) * qp->sq.max_inline;
    uint32_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (bufs[i].length) std::memcpy(buf + off, bufs[i].addr, bufs[i].length);
        off += uint32_t(bufs[i].length);
    }
    w.num_sge = 1;
    w.sge[0] = {uintptr_t(buf), off, 0};
    w.length = off;
    return true;
}

SendWqe &req_new_wqe(Qp *qp, uint32_t slot, uint64_t wr_id, ibv_wr_opcode op, unsigned flags) {
    SendWqe &w = qp->sq.wqe[slot];
    w = SendWqe{};
    w.sge = &qp->sq.sge[size_t(slot) * qp->sq.max_sge];
    w.wr_id = wr_id;
    w.opcode = op;
    w.flags = flags;
    w.signaled = qp->sq.sig_all || (flags & IBV_SEND_SIGNALED);
    // A UD WQE without an address (ibv_wr_set_ud_addr not called) fails.
    w.ud_qkey = qp->attr.qkey;
    return w;
}

bool req_set_ud_addr(Qp *qp, SendWqe &w, ibv_ah *ibah, uint32_t qpn, uint32_t qkey) {
    if (!ibah) return false;
    Ah *ah = reinterpret_cast<Ah *>(ibah);
    w.ud_addr = ah->addr;
    w.ud_src = ah->src;
    w.ud_ip = ip_fields(ah->attr.grh);
    w.ud_qpn = qpn & wire::kQpnMask;
    // A controlled Q_Key in the work request means the QP's own.
    w.ud_qkey = (qkey & wire::kQkeyControlled) ? qp->attr.qkey : qkey;
    return true;
}

bool req_check_wqe(Qp *qp, SendWqe &w) {
    // Which operations each transport carries (IBTA 9.2 and 11.6.1).
    switch (qp->type) {
    case IBV_QPT_UD:
        if (w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM) return false;
        // A datagram is one packet (IBTA 9.6): the path MTU bounds it.
        if (w.length > qp->attr.mtu) return false;
        break;
    case IBV_QPT_UC:
        // IBTA defines no UC SEND WITH INVALIDATE opcode.
        if (w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM &&
            w.opcode != IBV_WR_RDMA_WRITE && w.opcode != IBV_WR_RDMA_WRITE_WITH_IMM && !is_local(w))
            return false;
        break;
    case IBV_QPT_XRC_SEND:
        if (w.opcode == IBV_WR_FLUSH || w.opcode == IBV_WR_ATOMIC_WRITE ||
            w.opcode == kWrWriteCommit)
            return false;
        break;
    case IBV_QPT_XRC_RECV:
        return false; // no send queue
    default:
        break;
    }
    return true;
}

void req_kick(Qp *qp) {
    if (qp->attr.state == IBV_QPS_ERR) {
        qp_fail_queues(qp);
        return;
    }
    TxBatch &tx = thread_tx();
    tx.order = &qp->tx_mu;
    req_run(qp, tx);
    tx.order = nullptr;
}

void send_and_unlock(Qp *qp, TxBatch &tx, std::unique_lock<std::mutex> &held) {
    if (!tx.n) {
        held.unlock();
        return;
    }
    std::lock_guard<std::mutex> t(qp->tx_mu);
    held.unlock();
    qp->nic->xmit(tx);
}

void req_queue_deferred_ack(Qp *qp) {
    TxBatch &tx = thread_tx();
    tx.order = &qp->tx_mu;
    resp_send_deferred_ack(qp, tx);
    tx.order = nullptr;
}

void req_send_queued(Qp *qp, std::unique_lock<std::mutex> &held) {
    send_and_unlock(qp, thread_tx(), held);
}

void send_deferred_ack_now(Qp *qp, std::unique_lock<std::mutex> &held) {
    if (!qp->ack_deferred) return;
    req_queue_deferred_ack(qp);
    send_and_unlock(qp, thread_tx(), held);
    held.lock();
}

void req_retire_sent(Qp *qp) {
    std::lock_guard<std::mutex> g(qp->mu);
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    while (sq.tail != sq.head && sq.tail != q.cur) {
        SendWqe &w = sq.at(sq.tail);
        if (!w.tx.done) break;
        if (w.signaled) complete_send(qp, w, IBV_WC_SUCCESS);
        sq.tail++;
    }
    // A WQE that failed local checks waits for those before it; with no
    // acknowledgement to wake the requester, its turn comes here.
    if (sq.tail == q.cur && q.cur != sq.head) {
        SendWqe &w = sq.at(q.cur);
        if (!w.tx.started && w.status != IBV_WC_SUCCESS) req_fail_at_tail(qp);
    }
}

void req_send_and_unlock(Qp *qp) {
    std::unique_lock<std::mutex> held(qp->mu, std::adopt_lock);
    send_and_unlock(qp, thread_tx(), held);
    // The payload left from the application's memory: only now may it reuse
    // the buffers of an unacknowledged transport.
    if (!qp->reliable()) req_retire_sent(qp);
}

int req_post_local(Qp *qp, ibv_wr_opcode op, uint64_t wr_id, unsigned flags, Mw *mw, uint32_t rkey,
                   const ibv_mw_bind_info *bind) {
    std::unique_lock<std::mutex> g(qp->mu);
    SendQueue &sq = qp->sq;
    ibv_qp_state st = qp->attr.state;
    if (st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_ERR) return EINVAL;
    if (sq.head - sq.tail >= sq.max_wr) return ENOMEM;
    SendWqe &w = req_new_wqe(qp, sq.head % sq.max_wr, wr_id, op, flags);
    w.mw = mw;
    w.mw_rkey = rkey;
    if (bind) {
        w.bind = *bind;
        w.bind_key = bind->mr ? bind->mr->lkey : 0;
    }
    if (!req_check_wqe(qp, w)) return EINVAL;
    sq.head++;
    req_kick(qp);
    g.release();
    req_send_and_unlock(qp);
    return 0;
}

int req_post_send(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    std::unique_lock<std::mutex> g(qp->mu);
    SendQueue &sq = qp->sq;
    ibv_qp_state st = qp->attr.state;
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR ||
        qp->type == IBV_QPT_XRC_RECV) {
        *bad_wr = wr;
        return EINVAL;
    }
    int err = 0;
    // The WRs before a refused one stay posted and must be started, so every
    // error leaves the loop through the kick below.
    for (; wr; wr = wr->next) {
        if (sq.head - sq.tail >= sq.max_wr) {
            err = ENOMEM;
            break;
        }
        bool atomic = false;
        // On int: rdma-core < 44's enum lacks ATOMIC_WRITE, a case label here.
        switch (int(wr->opcode)) {
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            atomic = true;
            break;
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
        case IBV_WR_ATOMIC_WRITE:
        case IBV_WR_LOCAL_INV:
            break;
        case IBV_WR_BIND_MW:
            // ibv_bind_mw() binds type 1 windows; this binds type 2 ones.
            if (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2 ||
                wr->bind_mw.mw->context != qp->qpx.qp_base.context)
                err = EINVAL;
            break;
        default:
            // FLUSH has no fields in ibv_send_wr: it is posted with ibv_wr_flush().
            err = EINVAL;
            break;
        }
        if (err || wr->num_sge < 0) {
            err = EINVAL;
            break;
        }
        uint32_t slot = sq.head % sq.max_wr;
        SendWqe &w = req_new_wqe(qp, slot, wr->wr_id, wr->opcode, wr->send_flags);
        w.imm = wr->opcode == IBV_WR_SEND_WITH_INV ? htonl(wr->invalidate_rkey) : wr->imm_data;
        if (atomic) {
            w.remote_addr = wr->wr.atomic.remote_addr;
            w.rkey = wr->wr.atomic.rkey;
            w.compare_add = wr->wr.atomic.compare_add;
            w.swap = wr->wr.atomic.swap;
        } else if (qp->type == IBV_QPT_UD && wr->opcode != IBV_WR_BIND_MW &&
                   wr->opcode != IBV_WR_LOCAL_INV) {
            if (!req_set_ud_addr(qp, w, wr->wr.ud.ah, wr->wr.ud.remote_qpn,
                                 wr->wr.ud.remote_qkey)) {
                err = EINVAL;
                break;
            }
        } else {
            w.remote_addr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
        }
        if (qp->type == IBV_QPT_XRC_SEND) w.xrc_srqn = wr->qp_type.xrc.remote_srqn;
        if (wr->opcode == IBV_WR_LOCAL_INV) w.rkey = wr->invalidate_rkey;
        if (wr->opcode == IBV_WR_BIND_MW) {
            w.mw = reinterpret_cast<Mw *>(wr->bind_mw.mw);
            w.mw_rkey = wr->bind_mw.rkey;
            w.bind = wr->bind_mw.bind_info;
            w.bind_key = w.bind.mr ? w.bind.mr->lkey : 0;
        }
        if (is_local(w)) {
            if (!req_check_wqe(qp, w)) {
                err = EINVAL;
                break;
            }
            sq.head++;
            continue;
        }
        bool ok;
        if ((wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ && !atomic) {
            ibv_data_buf bufs[kMaxSge];
            if (uint32_t(wr->num_sge) > kMaxSge) {
                err = EINVAL;
                break;
            }
            for (int i = 0; i < wr->num_sge; i++)
                bufs[i] = {reinterpret_cast<void *>(uintptr_t(wr->sg_list[i].addr)),
                           wr->sg_list[i].length};
            ok = req_fill_inline(qp, w, slot, bufs, size_t(wr->num_sge));
        } else {
            ok = req_fill_sges(qp, w, wr->sg_list, size_t(wr->num_sge));
        }
        if (ok && wr->opcode == IBV_WR_ATOMIC_WRITE) ok = req_take_atomic_write_value(w);
        if (!ok || !req_check_wqe(qp, w)) {
            err = EINVAL;
            break;
        }
        sq.head++;
    }
    if (err) *bad_wr = wr;
    req_kick(qp);
    g.release();
    req_send_and_unlock(qp);
    return err;
}

} // namespace sroce
