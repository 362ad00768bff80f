// SPDX-License-Identifier: MIT
//
// Completer: processes ACKs, NAKs, READ responses and ATOMIC acknowledgements,
// retires send WQEs in order and drives retry and RNR back-off.
#include "transport.hpp"

#include <algorithm>
#include <cstring>

namespace sroce {
namespace {

bool needs_response(const SendWqe &w) {
    return wr_needs_response(w.opcode);
}

uint32_t last_psn(const SendWqe &w) {
    return wire::psn_add(w.tx.first_psn, w.tx.npkts - 1);
}

// Pops finished WQEs off the tail, generating their completions.
void retire(Qp *qp) {
    uint32_t cap = qp->sq.max_wr;
    while (qp->sq.tail != qp->sq.head) {
        SendWqe &w = qp->sq.wqe[qp->sq.tail % cap];
        if (!w.tx.done) break;
        if (needs_response(w)) qp->sq.rd_outstanding--;
        if (w.signaled) complete_send(qp, w, IBV_WC_SUCCESS);
        qp->sq.tail++;
    }
    req_retired(qp);
}

// una never passes a READ/ATOMIC still missing a response, whatever later
// PSNs have been acknowledged: the retransmit timer must keep covering it, or
// a lost response would leave it waiting forever.
uint32_t clamp_una(Qp *qp, uint32_t una) {
    uint32_t cap = qp->sq.max_wr;
    for (uint32_t i = qp->sq.tail; i != qp->sq.head; i++) {
        const SendWqe &w = qp->sq.wqe[i % cap];
        if (!w.tx.started || wire::psn_diff(w.tx.first_psn, una) >= 0) break;
        if (w.tx.done || !needs_response(w)) continue;
        uint32_t missing = wire::psn_add(w.tx.first_psn, w.tx.read_next);
        if (wire::psn_diff(una, missing) > 0) una = missing;
        break;
    }
    return una;
}

// RFC 6298's smoothing: the first sample sets the round trip and half of
// it as its deviation; then gains 1/8 and 1/4.
void rtt_sample(Completer &c, uint64_t r) {
    if (!c.srtt_ns) {
        c.srtt_ns = std::max<uint64_t>(r, 1);
        c.rttvar_ns = r / 2;
        return;
    }
    uint64_t dev = c.srtt_ns > r ? c.srtt_ns - r : r - c.srtt_ns;
    c.rttvar_ns = (3 * c.rttvar_ns + dev) / 4;
    c.srtt_ns = std::max<uint64_t>((7 * c.srtt_ns + r) / 8, 1);
}

void progress(Qp *qp, uint32_t una) {
    // Everything retired is acknowledged, also when a READ/ATOMIC completed
    // before an older one and both retired on the older one's response.
    uint32_t retired_to = qp->req.next_psn;
    if (qp->sq.tail != qp->sq.head) {
        const SendWqe &t = qp->sq.wqe[qp->sq.tail % qp->sq.max_wr];
        if (t.tx.started) retired_to = t.tx.first_psn;
    }
    if (wire::psn_diff(retired_to, una) > 0) una = retired_to;
    una = clamp_una(qp, una);
    if (int32_t n = wire::psn_diff(una, qp->comp.una_psn); n > 0) {
        qp->cc.acked_pkts += uint32_t(n); // congestion control's meter
        qp->comp.una_psn = una;
        qp->timers.retries_left = qp->attr.retry_cnt;
        qp->timers.rnr_left = qp->attr.rnr_retry;
        req_arm_timer(qp);
        Completer &c = qp->comp;
        if (c.rtt_sent_ns && wire::psn_diff(una, c.rtt_psn) > 0) {
            rtt_sample(c, now_ns() - c.rtt_sent_ns);
            c.rtt_sent_ns = 0;
        }
        qp->timers.sr_backoff = 0;
        req_arm_recovery(qp);
    }
}

// Marks every send/write WQE wholly below `psn` (exclusive) done; stops at
// the first WQE still waiting for a response.  Returns that WQE's index or
// sq_cur.
uint32_t ack_below(Qp *qp, uint32_t psn) {
    uint32_t cap = qp->sq.max_wr;
    uint32_t i = qp->sq.tail;
    for (; i != qp->sq.head; i++) {
        SendWqe &w = qp->sq.wqe[i % cap];
        if (w.tx.done) continue;
        if (!w.tx.started || wire::psn_diff(last_psn(w), psn) >= 0) break;
        if (needs_response(w)) break;
        w.tx.done = true;
    }
    return i;
}

// A response's data goes to the WQE's local memory as checked when it was
// posted; whenever the key table changed since, that memory must still be
// registered under the same lkeys (rxe looks them up for every response
// packet), so nothing lands after ibv_dereg_mr() returns.
bool local_still_there(Qp *qp, SendWqe &w) {
    uint64_t now = qp->nic->mrs.epoch();
    if (now == w.mr_epoch) return true;
    if (!sges_still_registered(qp->nic, qp->pd, w.sge, w.num_sge, IBV_ACCESS_LOCAL_WRITE))
        return false;
    w.mr_epoch = now;
    return true;
}

void fail_at(Qp *qp, uint32_t psn, ibv_wc_status status) {
    uint32_t i = ack_below(qp, psn);
    retire(qp);
    if (i != qp->sq.head && i == qp->sq.tail) {
        SendWqe &w = qp->sq.wqe[i % qp->sq.max_wr];
        w.tx.done = true;
        complete_send(qp, w, status);
        if (needs_response(w)) qp->sq.rd_outstanding--;
        qp->sq.tail++;
    }
    qp_enter_error(qp);
}

// Asks again for the responses from `psn` on.  Go-back-N resends everything
// after it too; with selective repeat the later requests were received, so
// only this one goes again (the responder answers it as a duplicate).
void rerequest(Qp *qp, uint32_t psn, TxBatch &tx) {
    if (qp->selective_repeat) {
        req_resend_now(qp, psn, tx);
    } else {
        req_rewind(qp, psn);
    }
}

// Something for a later PSN arrived while `w` still waits for a response, so
// that response was lost: rewind to re-request it from the first one
// missing (the caller's req_run sends).  Once per PSN; if the re-request is
// lost too, the retransmit timer (held at w by clamp_una) covers it.
void resend_missing(Qp *qp, const SendWqe &w, TxBatch &tx) {
    uint32_t psn = wire::psn_add(w.tx.first_psn, w.tx.read_next);
    if (qp->comp.last_nak_rewind == psn) return;
    qp->comp.last_nak_rewind = psn;
    rerequest(qp, psn, tx);
}

ibv_wc_status nak_status(uint8_t code) {
    switch (code) {
    case wire::aeth::kNakInvalidRequest:
        return IBV_WC_REM_INV_REQ_ERR;
    case wire::aeth::kNakRemoteAccessError:
        return IBV_WC_REM_ACCESS_ERR;
    case wire::aeth::kNakRemoteOpError:
        return IBV_WC_REM_OP_ERR;
    default:
        return IBV_WC_REM_INV_RD_REQ_ERR;
    }
}

// Everything up to `psn` (inclusive) has been received and carried out.
void acknowledged(Qp *qp, uint32_t psn, TxBatch &tx) {
    uint32_t next = wire::psn_add(psn, 1);
    if (wire::psn_diff(next, qp->comp.una_psn) < 0) return; // stale
    uint32_t i = ack_below(qp, next);
    retire(qp);
    progress(qp, next);
    // An ACK past an outstanding READ/ATOMIC means its response was lost.
    if (i != qp->sq.head) {
        SendWqe &w = qp->sq.wqe[i % qp->sq.max_wr];
        if (needs_response(w) && !w.tx.done && wire::psn_diff(last_psn(w), psn) <= 0)
            resend_missing(qp, w, tx);
    }
}

void on_ack(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    uint8_t syn = pkt.syndrome();
    uint8_t kind = syn & wire::aeth::kKindMask;
    // A response may only name a PSN this requester has sent; a NAK must name
    // one still outstanding.  Anything else is stale or forged: ignore it.
    if (wire::psn_diff(pkt.psn, qp->req.next_psn) >= 0) return;
    if (kind != wire::aeth::kAck && wire::psn_diff(pkt.psn, qp->comp.una_psn) < 0) return;
    if (kind == wire::aeth::kAck) {
        acknowledged(qp, pkt.psn, tx);
        req_run(qp, tx);
        return;
    }
    if (kind == wire::aeth::kRnrNak) {
        ack_below(qp, pkt.psn);
        retire(qp);
        progress(qp, pkt.psn);
        if (qp->attr.rnr_retry != 7) {
            if (qp->timers.rnr_left == 0) {
                fail_at(qp, pkt.psn, IBV_WC_RNR_RETRY_EXC_ERR);
                return;
            }
            qp->timers.rnr_left--;
        }
        // Wait out the responder's RNR timer, then resend from the NAKed PSN.
        req_rewind(qp, pkt.psn);
        qp->timers.rnr_at_ns = now_ns() + rnr_timer_ns(syn & 0x1F);
        qp->timers.retransmit_at_ns = 0;
        return;
    }
    if (kind == wire::aeth::kNak) {
        uint8_t code = syn & 0x1F;
        if (code == wire::aeth::kNakPsnSeqError) {
            if (wire::psn_diff(pkt.psn, qp->comp.una_psn) < 0) return; // stale
            ack_below(qp, pkt.psn);
            retire(qp);
            uint32_t before = qp->comp.una_psn;
            progress(qp, pkt.psn);
            // During an RNR back-off the resend from una is already due; a
            // sequence NAK for the rest of the burst is no lost packet.
            if (qp->timers.rnr_at_ns) return;
            // Resend from the NAKed PSN, or from an earlier READ/ATOMIC whose
            // response is missing (progress() holds una there).  Only the same
            // NAK again, with nothing acknowledged since, costs a retry.
            uint32_t from = qp->comp.una_psn;
            if (from == pkt.psn && from == before && qp->comp.last_nak_rewind == from) {
                if (qp->timers.retries_left == 0) {
                    fail_at(qp, from, IBV_WC_RETRY_EXC_ERR);
                    return;
                }
                qp->timers.retries_left--;
            }
            qp->comp.last_nak_rewind = from;
            req_rewind(qp, from);
            req_run(qp, tx);
            return;
        }
        fail_at(qp, pkt.psn, nak_status(code));
    }
}

void resend_gaps(Qp *qp, const wire::Packet &pkt, uint32_t cum, uint32_t high, TxBatch &tx) {
    uint32_t n = pkt.payload_len / 4;
    bool sent = false;
    uint32_t cursor = qp->sq.tail; // gaps and their PSNs ascend: so do their WQEs
    for (uint32_t r = 1; r < n; r++) {
        const uint8_t *g = pkt.payload + 4 * r;
        uint32_t first = wire::psn_add(cum, 1 + ((uint32_t(g[0]) << 8) | g[1]));
        uint32_t count = (uint32_t(g[2]) << 8) | g[3];
        for (uint32_t k = 0; k < count; k++) {
            uint32_t psn = wire::psn_add(first, k);
            if (wire::psn_diff(psn, high) >= 0) break;
            if (wire::psn_diff(psn, qp->comp.una_psn) < 0) continue;
            sent |= req_resend(qp, psn, high, tx, &cursor);
        }
    }
    if (sent && !qp->timers.retransmit_at_ns) req_arm_timer(qp);
}

// Selective repeat (wire-protocol.md §5.6.1): a cumulative ACK, then the
// gaps the responder holds requests beyond; each missing PSN is resent once,
// and again only when something sent after its resend has arrived.
void on_sack(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    if ((pkt.syndrome() & wire::aeth::kKindMask) != wire::aeth::kAck) return;
    uint32_t n = pkt.payload_len / 4;
    if (n < 2 || n > 1 + wire::kSackMaxRanges || pkt.payload_len % 4) return;
    const uint32_t cum = pkt.psn;
    const uint32_t high = wire::get24(pkt.payload + 1);
    if (wire::psn_diff(cum, qp->req.next_psn) >= 0) return; // never sent: forged
    acknowledged(qp, cum, tx);
    // The gaps are filled first, then the window's new room.
    int32_t span = wire::psn_diff(high, cum);
    if (!qp->timers.rnr_at_ns && span > 0 && span <= int32_t(kSendWindow) &&
        wire::psn_diff(high, qp->req.next_psn) < 0)
        resend_gaps(qp, pkt, cum, high, tx);
    req_run(qp, tx);
}

SendWqe *find_wqe(Qp *qp, uint32_t psn, uint32_t *index) {
    uint32_t cap = qp->sq.max_wr;
    for (uint32_t i = qp->sq.tail; i != qp->sq.head; i++) {
        SendWqe &w = qp->sq.wqe[i % cap];
        if (!w.tx.started) break;
        int32_t d = wire::psn_diff(psn, w.tx.first_psn);
        if (d >= 0 && uint32_t(d) < w.tx.npkts) {
            *index = i;
            return &w;
        }
    }
    return nullptr;
}

void on_single_response(Qp *qp, const wire::Packet &pkt, TxBatch &tx, bool atomic);

void on_read_response(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    uint32_t idx;
    SendWqe *w = find_wqe(qp, pkt.psn, &idx);
    // FLUSH and ATOMIC WRITE are answered by an empty READ RESPONSE ONLY.
    if (w && wr_ack_only(w->opcode)) {
        if (pkt.rc_opcode() == wire::kReadRespOnly) on_single_response(qp, pkt, tx, false);
        return;
    }
    if (!w || w->opcode != IBV_WR_RDMA_READ || w->tx.done) return;
    uint32_t expect = wire::psn_add(w->tx.first_psn, w->tx.read_next);
    int32_t d = wire::psn_diff(pkt.psn, expect);
    if (d < 0) return; // duplicate
    if (d > 0) {
        // A response went missing: ask again from the first one not received.
        if (qp->comp.last_nak_rewind != expect) {
            qp->comp.last_nak_rewind = expect;
            rerequest(qp, expect, tx);
            req_run(qp, tx);
        }
        return;
    }
    if (pkt.info->hdrs & wire::kHasAeth) {
        uint8_t kind = pkt.syndrome() & wire::aeth::kKindMask;
        if (kind == wire::aeth::kNak) {
            on_ack(qp, pkt, tx);
            return;
        }
    }
    uint32_t off = w->tx.read_next * qp->attr.mtu;
    bool last = w->tx.read_next + 1 == w->tx.npkts;
    uint32_t want = last ? w->length - off : qp->attr.mtu;
    if (!local_still_there(qp, *w)) {
        fail_at(qp, pkt.psn, IBV_WC_LOC_PROT_ERR);
        return;
    }
    if (pkt.payload_len != want ||
        !sg_copy_to(w->sge, w->num_sge, off, pkt.payload, pkt.payload_len)) {
        fail_at(qp, pkt.psn, IBV_WC_BAD_RESP_ERR);
        return;
    }
    // A response acknowledges every request before it.
    uint32_t first_open = ack_below(qp, w->tx.first_psn);
    w->tx.read_next++;
    if (last) w->tx.done = true;
    retire(qp);
    progress(qp, wire::psn_add(pkt.psn, 1));
    if (first_open != idx) resend_missing(qp, qp->sq.wqe[first_open % qp->sq.max_wr], tx);
    req_run(qp, tx);
}

// An answered FLUSH shows which ICRC form its peer takes (req.cpp:
// flush_legacy_form): IBTA's for certain when only that form was sent.
void learn_flush_icrc(Qp *qp, const SendWqe &w) {
    uint8_t &form = qp->peer_flush_icrc;
    if (w.tx.flush_forms == kFlushIcrcIbta)
        form = kFlushIcrcIbta;
    else if (w.tx.flush_last_legacy)
        form = kFlushIcrcLegacy;
    else if (form != kFlushIcrcIbta)
        form = kFlushIcrcUnknown;
}

// Completes the single-PSN request at pkt.psn: an atomic (its original value
// goes to the local buffer) or a FLUSH / ATOMIC WRITE (nothing to place).
void on_single_response(Qp *qp, const wire::Packet &pkt, TxBatch &tx, bool atomic) {
    if ((pkt.syndrome() & wire::aeth::kKindMask) != wire::aeth::kAck) {
        on_ack(qp, pkt, tx);
        return;
    }
    uint32_t idx;
    SendWqe *w = find_wqe(qp, pkt.psn, &idx);
    if (!w || w->tx.done || !needs_response(*w) || w->opcode == IBV_WR_RDMA_READ) return;
    if (wr_ack_only(w->opcode) == atomic) return; // the wrong kind of response
    if (!atomic && pkt.payload_len != 0) {
        fail_at(qp, pkt.psn, IBV_WC_BAD_RESP_ERR);
        return;
    }
    if (wire::psn_diff(pkt.psn, qp->comp.una_psn) < 0) return;
    uint32_t first_open = ack_below(qp, w->tx.first_psn);
    if (atomic && !local_still_there(qp, *w)) {
        fail_at(qp, pkt.psn, IBV_WC_LOC_PROT_ERR);
        return;
    }
    if (atomic) {
        uint64_t orig = pkt.orig();
        std::memcpy(reinterpret_cast<void *>(uintptr_t(w->sge[0].addr)), &orig, 8);
    }
    if (w->opcode == IBV_WR_FLUSH) learn_flush_icrc(qp, *w);
    w->tx.done = true;
    retire(qp);
    progress(qp, wire::psn_add(pkt.psn, 1));
    if (first_open != idx) resend_missing(qp, qp->sq.wqe[first_open % qp->sq.max_wr], tx);
    req_run(qp, tx);
}

} // namespace

void comp_retire(Qp *qp) {
    retire(qp);
}

uint64_t rnr_timer_ns(uint8_t code) {
    // IBTA table 45, in microseconds; code 0 means 655.36 ms.
    static const uint32_t us[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                    160,    240,   320,   480,    640,    960,    1280,   1920,
                                    2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
    return uint64_t(us[code & 31]) * 1000;
}

namespace {

void receive_ibta(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    // Only RC and XRC requesters are answered, each on its own transport.
    uint8_t t = wire::transport_of(pkt.opcode);
    if (t != (qp->type == IBV_QPT_XRC_SEND ? wire::kTransportXrc : wire::kTransportRc)) return;
    if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_XRC_SEND) return;
    switch (pkt.rc_opcode()) {
    case wire::kAcknowledge:
        on_ack(qp, pkt, tx);
        break;
    case wire::kAtomicAcknowledge:
        on_single_response(qp, pkt, tx, true);
        break;
    case wire::kReadRespFirst:
    case wire::kReadRespMiddle:
    case wire::kReadRespLast:
    case wire::kReadRespOnly:
        on_read_response(qp, pkt, tx);
        break;
    default:
        break;
    }
}

} // namespace

void comp_receive(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    if (qp->attr.state != IBV_QPS_RTS && qp->attr.state != IBV_QPS_SQD) return;
    if (pkt.opcode == wire::kSelectiveAck) {
        // Only from a peer that agreed to selective repeat.
        if (qp->selective_repeat) on_sack(qp, pkt, tx);
    } else {
        receive_ibta(qp, pkt, tx);
    }
    if (qp->sq.tail == qp->sq.head) qp->timers.retransmit_at_ns = qp->timers.recovery_at_ns = 0;
}

} // namespace sroce
