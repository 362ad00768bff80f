// SPDX-License-Identifier: MIT
//
// Queue pairs: creation of every QP type (RC, UC, UD, XRC send and receive),
// the IB QP state machine (modify/query), completions, flushing on error,
// and the ibv_qp_ex work-request interface.
#include "provider.h"
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <new>
#include <unistd.h>

namespace sroce {
namespace {

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
    // Older rdma-core enums lack FLUSH and ATOMIC_WRITE, so they cannot be
    // case labels.
    if (op == IBV_WR_FLUSH) return IBV_WC_FLUSH;
    if (op == IBV_WR_ATOMIC_WRITE) return IBV_WC_ATOMIC_WRITE;
    switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
        return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        return IBV_WC_FETCH_ADD;
    case IBV_WR_LOCAL_INV:
        return IBV_WC_LOCAL_INV;
    case IBV_WR_BIND_MW:
        return IBV_WC_BIND_MW;
    default:
        return IBV_WC_SEND;
    }
}

} // namespace

// A write-commit sent as an IBTA sequence reports once: when one part fails,
// the parts after it up to the final one stay silent.
void silence_rest_of_commit(Qp *qp, const SendWqe &w) {
    uint32_t cap = qp->sq.max_wr;
    uint32_t slot = uint32_t(&w - qp->sq.wqe.data());
    for (uint32_t k = 1; k < cap; k++) {
        SendWqe &x = qp->sq.wqe[(slot + k) % cap];
        if (x.commit.part == kCommitNone) break;
        x.commit.suppressed = true;
        if (x.commit.part == kCommitFinal) break;
    }
}

void complete_send(Qp *qp, const SendWqe &w, ibv_wc_status status) {
    if (w.commit.suppressed) return;
    if (w.tm.internal) {
        req_tm_done(qp, w, status);
        return;
    }
    if (w.commit.part == kCommitInner) {
        if (status == IBV_WC_SUCCESS) return;
        silence_rest_of_commit(qp, w);
    }
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = status;
    wc.opcode = w.commit.part != kCommitNone ? IBV_WC_RDMA_WRITE_COMMIT : wc_opcode(w.opcode);
    wc.qp_num = qp->qpx.qp_base.qp_num;
    // byte_len: what Linux rxe reports for every send-side opcode.
    wc.byte_len = w.commit.part != kCommitNone ? w.commit.report_len : w.length;
    if (!qp->scq->push(wc, false)) post_cq_overflow(qp->ctx, qp->scq);
}

void complete_recv(Qp *qp, const RecvWqe &r, const RecvCompletion &c) {
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = c.status;
    wc.opcode = c.opcode;
    wc.byte_len = c.byte_len;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    wc.src_qp = qp->type == IBV_QPT_UD ? c.src_qp : qp->attr.dest_qpn;
    wc.sl = c.sl;
    wc.imm_data = c.imm;
    wc.wc_flags = c.wc_flags;
    wc.pkey_index = qp->attr.pkey_index;
    Cq *cq = (c.srq && c.srq->cq) ? c.srq->cq : qp->rcq;
    if (!cq->push(wc, c.solicited, c.tm)) post_cq_overflow(qp->ctx, cq);
}

void Context::post_event(const ibv_async_event &ev) {
    std::lock_guard<std::mutex> g(async_mu);
    try {
        async_q.push_back(ev);
    } catch (const std::bad_alloc &) {
        // The progress thread must not die of it; the event is lost.
        return;
    }
    uint8_t one = 1;
    if (write(async_wr, &one, 1) != 1) { /* a full pipe still leaves the queue readable */
    }
}

void Context::forget_events(const void *obj) {
    std::lock_guard<std::mutex> g(async_mu);
    for (auto it = async_q.begin(); it != async_q.end();) {
        if (it->element.qp == obj || it->element.cq == obj || it->element.srq == obj) {
            it = async_q.erase(it);
            uint8_t b;
            if (read(async_rd, &b, 1) != 1) { /* a reader already took the wake-up byte */
            }
        } else {
            ++it;
        }
    }
}

void post_async_event(Qp *qp, ibv_event_type type) {
    ibv_async_event ev{};
    ev.element.qp = &qp->qpx.qp_base;
    ev.event_type = type;
    qp->ctx->post_event(ev);
}

void post_cq_overflow(Context *ctx, Cq *cq) {
    ibv_async_event ev{};
    ev.element.cq = reinterpret_cast<ibv_cq *>(&cq->cqx);
    ev.event_type = IBV_EVENT_CQ_ERR;
    ctx->post_event(ev);
}

void qp_fail_queues(Qp *qp) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    for (uint32_t i = sq.tail; i != sq.head; i++)
        complete_send(qp, sq.at(i), IBV_WC_WR_FLUSH_ERR);
    sq.tail = q.cur = sq.head;
    sq.rd_outstanding = 0;
    Responder &r = qp->resp;
    RecvCompletion flushed;
    flushed.status = IBV_WC_WR_FLUSH_ERR;
    if (r.recv_taken) {
        flushed.srq = r.recv_srq;
        complete_recv(qp, r.recv, flushed);
        r.recv_taken = false;
        r.recv_srq = nullptr;
        flushed.srq = nullptr;
    }
    // A shared receive queue outlives the QP: its WQEs stay for the others.
    for (uint32_t i = r.rq.tail; i != r.rq.head; i++)
        complete_recv(qp, r.rq.wqe[i % r.rq.max_wr], flushed);
    r.rq.tail = r.rq.head;
    qp->timers.retransmit_at_ns = qp->timers.rnr_at_ns = qp->timers.pace_at_ns = 0;
}

void qp_enter_error(Qp *qp) {
    bool was = qp->in_error();
    qp->attr.state = IBV_QPS_ERR;
    qp->qpx.qp_base.state = IBV_QPS_ERR;
    qp_fail_queues(qp);
    qp->nic->publish_qp(qp);
    // A QP on an SRQ that leaves service tells its owner when nothing more
    // will be consumed from the SRQ on its behalf (IBTA 10.3.1).
    if (!was && (qp->srq || qp->type == IBV_QPT_XRC_RECV))
        post_async_event(qp, IBV_EVENT_QP_LAST_WQE_REACHED);
}

namespace {

void reset_state(Qp *qp) {
    Requester &q = qp->req;
    SendQueue &sq = qp->sq;
    sq.head = sq.tail = q.cur = 0;
    q.next_psn = 0;
    sq.rd_outstanding = 0;
    q.pkts_since_ackreq = 0;
    sq.batch = WrBatch{};
    qp->comp = Completer{};
    qp->timers.retries_left = qp->attr.retry_cnt;
    qp->timers.rnr_left = qp->attr.rnr_retry;
    Responder &r = qp->resp;
    r.rq.head = r.rq.tail = 0;
    r.epsn = r.msn = 0;
    r.nak_sent = r.ack_pending = false;
    r.in_msg = 0;
    r.drop_msg = false;
    r.recv_taken = false;
    r.recv_srq = nullptr;
    for (RdResource &res : r.rd_res)
        res.valid = false;
    r.reorder = Reorder{};
    q.resent.reset();
    cc_reset(qp);
    qp->commit.dirty.clear();
    qp->commit.in_msg = false;
    qp->peer_announced = 0;
    qp->agree_selective_repeat();
    qp->ack_deferred = false;
    qp->ack_hold_pays = false;
    qp->ack_sent_ns = 0;
}

// A reset or destroyed QP leaves nothing in its CQs (as mlx5 cleans them):
// flushed completions of its past must not surface after it is reused.
void forget_completions(Qp *qp) {
    uint32_t n = qp->qpx.qp_base.qp_num;
    if (qp->scq) qp->scq->forget_qp(n);
    if (qp->rcq && qp->rcq != qp->scq) qp->rcq->forget_qp(n);
}

// Required and optional attributes of each transition, per QP type, as the
// kernel's ib_modify_qp_is_ok() table has them (IBTA 11.2.4.2).
struct Transition {
    int required, optional;
    bool valid;
};

Transition transition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
    const bool ud = type == IBV_QPT_UD, uc = type == IBV_QPT_UC, rc = type == IBV_QPT_RC;
    const bool ini = type == IBV_QPT_XRC_SEND, tgt = type == IBV_QPT_XRC_RECV;
    const int conn_init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const int ud_init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    const int rts_opt_uc =
        IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
    const int rts_opt = ud            ? IBV_QP_CUR_STATE | IBV_QP_QKEY
                        : (uc || ini) ? rts_opt_uc
                                      : rts_opt_uc | IBV_QP_MIN_RNR_TIMER;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return {0, 0, true};
    switch (cur) {
    case IBV_QPS_RESET:
        if (next == IBV_QPS_INIT) return {ud ? ud_init : conn_init, 0, true};
        break;
    case IBV_QPS_INIT:
        if (next == IBV_QPS_INIT) return {0, ud ? ud_init : conn_init, true};
        if (next == IBV_QPS_RTR) {
            if (ud) return {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY, true};
            int req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if (rc || tgt) req |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            return {req, IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH, true};
        }
        break;
    case IBV_QPS_RTR:
        if (next == IBV_QPS_RTS) {
            int req = IBV_QP_SQ_PSN;
            if (rc || ini)
                req |=
                    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
            if (tgt) req |= IBV_QP_TIMEOUT;
            return {req, rts_opt, true};
        }
        break;
    case IBV_QPS_RTS:
        if (next == IBV_QPS_RTS) return {0, rts_opt, true};
        if (next == IBV_QPS_SQD) return {0, IBV_QP_EN_SQD_ASYNC_NOTIFY, true};
        break;
    case IBV_QPS_SQD:
        if (next == IBV_QPS_RTS) return {0, rts_opt, true};
        if (next == IBV_QPS_SQD) {
            if (ud) return {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY, true};
            int opt = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                      IBV_QP_PATH_MIG_STATE;
            if (!uc)
                opt |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            return {0, opt, true};
        }
        break;
    case IBV_QPS_SQE:
        if (next == IBV_QPS_RTS)
            return {0,
                    ud ? IBV_QP_CUR_STATE | IBV_QP_QKEY
                       : IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
                             (uc ? 0 : int(IBV_QP_MIN_RNR_TIMER)),
                    true};
        break;
    default:
        break;
    }
    return {0, 0, false};
}

constexpr unsigned kQpAccessKnown =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND |
    IBV_ACCESS_HUGETLB | IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT |
    IBV_ACCESS_RELAXED_ORDERING;

int modify(Qp *qp, ibv_qp_attr *attr, int mask) {
    QpAttr &a = qp->attr;
    // The kernel's uverbs drops the attributes one half of an XRC pair has
    // no use for before checking the rest, and programs (perftest) rely on it.
    if (qp->type == IBV_QPT_XRC_SEND) mask &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (qp->type == IBV_QPT_XRC_RECV)
        mask &= ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
    ibv_qp_state cur = a.state;
    if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
    ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
    Transition t = transition(qp->type, cur, next);
    if (!t.valid) return EINVAL;
    int attrs = mask & ~IBV_QP_STATE;
    if ((attrs & t.required) != t.required) return EINVAL;
    if (attrs & ~(t.required | t.optional)) return EINVAL;

    // Validate everything before changing anything.
    Device *dev = qp->ctx->dev;
    IpAddr dest = a.dest_addr, src = a.src_addr;
    if (mask & IBV_QP_AV) {
        if (!attr->ah_attr.is_global || path_addrs(*dev, attr->ah_attr.grh, &src, &dest))
            return EINVAL;
    }
    if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return EINVAL;
    if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
        return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > kMaxRdAtomic) return EINVAL;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > kMaxRdAtomic)
        return EINVAL;
    // Bits that only mean something for MRs (ON_DEMAND, HUGETLB, ...) are
    // accepted and ignored, as the kernel does; unknown ones are refused.
    if ((mask & IBV_QP_ACCESS_FLAGS) && (attr->qp_access_flags & ~kQpAccessKnown)) return EINVAL;
    if ((mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && next != IBV_QPS_SQD) return EINVAL;

    // A port that is down takes no QP to RTR or RTS (rxe: its GID, the
    // source address, is gone with the address or the net device).
    if ((next == IBV_QPS_RTR || next == IBV_QPS_RTS) && next != cur)
        if (int down = port_down_reason(*dev)) return down;

    // The one allocation, before anything changes: a failure leaves the QP as it was.
    std::vector<RdResource> rd_res;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        rd_res.resize(std::max<uint8_t>(1, attr->max_dest_rd_atomic));

    if (mask & IBV_QP_ACCESS_FLAGS) a.access = attr->qp_access_flags;
    if (mask & IBV_QP_PKEY_INDEX) a.pkey_index = attr->pkey_index;
    if (mask & IBV_QP_PORT) a.port_num = attr->port_num;
    if (mask & IBV_QP_QKEY) a.qkey = attr->qkey;
    if (mask & IBV_QP_AV) {
        a.ah = attr->ah_attr;
        // 20 bits, as RNICs take it (UCX fills the field with more).
        a.ah.grh.flow_label &= 0xFFFFF;
        a.dest_addr = dest;
        a.src_addr = src;
    }
    if (mask & IBV_QP_PATH_MTU) {
        a.path_mtu = std::min(attr->path_mtu, dev->active_mtu);
        a.mtu = uint32_t(mtu_bytes(a.path_mtu));
    }
    if (mask & IBV_QP_DEST_QPN) a.dest_qpn = attr->dest_qp_num & wire::kQpnMask;
    if (mask & IBV_QP_RQ_PSN) qp->resp.epsn = attr->rq_psn & wire::kPsnMask;
    if (mask & IBV_QP_SQ_PSN) {
        qp->req.next_psn = qp->comp.una_psn = attr->sq_psn & wire::kPsnMask;
        qp->req.max_sent_psn = wire::psn_add(qp->req.next_psn, wire::kPsnMask);
        qp->comp.rtt_sent_ns = 0;
    }
    if (mask & IBV_QP_TIMEOUT) a.timeout = attr->timeout;
    if (mask & IBV_QP_RETRY_CNT) a.retry_cnt = qp->timers.retries_left = attr->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) a.rnr_retry = qp->timers.rnr_left = attr->rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER) a.min_rnr_timer = attr->min_rnr_timer;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) a.max_rd_atomic = std::max<uint8_t>(1, attr->max_rd_atomic);
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = std::max<uint8_t>(1, attr->max_dest_rd_atomic);
        qp->resp.rd_res.swap(rd_res);
        qp->resp.rd_res_next = 0;
    }
    if (mask & IBV_QP_STATE) {
        if (next == IBV_QPS_RESET) {
            reset_state(qp);
            forget_completions(qp);
        }
        bool enter_error = next == IBV_QPS_ERR && cur != IBV_QPS_ERR;
        a.state = next;
        qp->qpx.qp_base.state = next;
        a.sq_draining = next == IBV_QPS_SQD;
        if (enter_error) {
            a.state = cur; // qp_enter_error notices the change of state
            qp_enter_error(qp);
        }
        if (next == IBV_QPS_SQD && (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)) {
            // Nothing is ever mid-message when the QP lock is free: the
            // send queue is drained as soon as the transition is made.
            a.sq_draining = false;
            post_async_event(qp, IBV_EVENT_SQ_DRAINED);
        }
    }
    return 0;
}

// ibv_qp_ex: WQEs are built in place past the queue's head and published by
// wr_complete.  The batch lives in the QP (rdma-core defines it per QP).
WrBatch &batch(ibv_qp_ex *qpx) {
    return to_qp(qpx)->sq.batch;
}

void batch_fail(ibv_qp_ex *qpx, int err) {
    WrBatch &b = batch(qpx);
    if (!b.error) b.error = err;
}

SendWqe *wr_begin_flags(ibv_qp_ex *qpx, ibv_wr_opcode op, unsigned flags) {
    Qp *qp = to_qp(qpx);
    WrBatch &b = qp->sq.batch;
    if (b.error) return nullptr;
    if (qp->sq.head + b.pending - qp->sq.tail >= qp->sq.max_wr) {
        b.error = ENOMEM;
        return nullptr;
    }
    uint32_t slot = (qp->sq.head + b.pending) % qp->sq.max_wr;
    b.pending++;
    b.sge_slot = slot;
    b.final_slot = UINT32_MAX;
    return &req_new_wqe(qp, slot, qpx->wr_id, op, flags);
}

SendWqe *wr_begin(ibv_qp_ex *qpx, ibv_wr_opcode op) {
    return wr_begin_flags(qpx, op, qpx->wr_flags);
}

SendWqe *wr_last(ibv_qp_ex *qpx, uint32_t *slot) {
    WrBatch &b = batch(qpx);
    if (b.error || !b.pending) {
        if (!b.error) b.error = EINVAL;
        return nullptr;
    }
    *slot = b.sge_slot;
    return &to_qp(qpx)->sq.wqe[*slot];
}

// The gather list of a commit's write is known only now: its completion
// reports that length.
void note_commit_length(Qp *qp, const SendWqe &w) {
    if (qp->sq.batch.final_slot != UINT32_MAX)
        qp->sq.wqe[qp->sq.batch.final_slot].commit.report_len = w.length;
}

void wr_start(ibv_qp_ex *qpx) {
    Qp *qp = to_qp(qpx);
    qp->mu.lock();
    qp->sq.batch = WrBatch{};
}

int wr_complete(ibv_qp_ex *qpx) {
    Qp *qp = to_qp(qpx);
    WrBatch &b = qp->sq.batch;
    int err = b.error;
    ibv_qp_state st = qp->attr.state;
    if (!err && (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR)) err = EINVAL;
    // Every WQE of the batch must be one its transport carries.
    for (uint32_t i = 0; !err && i < b.pending; i++)
        if (!req_check_wqe(qp, qp->sq.at(qp->sq.head + i))) err = EINVAL;
    if (!err) {
        qp->sq.head += b.pending;
        req_kick(qp);
    }
    b = WrBatch{};
    req_send_and_unlock(qp);
    return err;
}

void wr_abort(ibv_qp_ex *qpx) {
    Qp *qp = to_qp(qpx);
    qp->sq.batch = WrBatch{};
    qp->mu.unlock();
}

void wr_rdma(ibv_qp_ex *qpx, ibv_wr_opcode op, uint32_t rkey, uint64_t addr, __be32 imm) {
    if (SendWqe *w = wr_begin(qpx, op)) {
        w->rkey = rkey;
        w->remote_addr = addr;
        w->imm = imm;
    }
}
void wr_rdma_write(ibv_qp_ex *q, uint32_t rkey, uint64_t a) {
    wr_rdma(q, IBV_WR_RDMA_WRITE, rkey, a, 0);
}
void wr_rdma_write_imm(ibv_qp_ex *q, uint32_t rkey, uint64_t a, __be32 imm) {
    wr_rdma(q, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, a, imm);
}
void wr_rdma_read(ibv_qp_ex *q, uint32_t rkey, uint64_t a) {
    wr_rdma(q, IBV_WR_RDMA_READ, rkey, a, 0);
}
void wr_send(ibv_qp_ex *q) {
    wr_begin(q, IBV_WR_SEND);
}
void wr_send_imm(ibv_qp_ex *q, __be32 imm) {
    if (SendWqe *w = wr_begin(q, IBV_WR_SEND_WITH_IMM)) w->imm = imm;
}
void wr_send_inv(ibv_qp_ex *q, uint32_t invalidate_rkey) {
    if (SendWqe *w = wr_begin(q, IBV_WR_SEND_WITH_INV)) w->imm = htonl(invalidate_rkey);
}
void wr_atomic_cmp_swp(ibv_qp_ex *q, uint32_t rkey, uint64_t a, uint64_t compare, uint64_t swap) {
    if (SendWqe *w = wr_begin(q, IBV_WR_ATOMIC_CMP_AND_SWP)) {
        w->rkey = rkey;
        w->remote_addr = a;
        w->compare_add = compare;
        w->swap = swap;
    }
}
void wr_atomic_fetch_add(ibv_qp_ex *q, uint32_t rkey, uint64_t a, uint64_t add) {
    if (SendWqe *w = wr_begin(q, IBV_WR_ATOMIC_FETCH_AND_ADD)) {
        w->rkey = rkey;
        w->remote_addr = a;
        w->compare_add = add;
    }
}
void wr_atomic_write(ibv_qp_ex *q, uint32_t rkey, uint64_t a, const void *value) {
    if (SendWqe *w = wr_begin(q, IBV_WR_ATOMIC_WRITE)) {
        w->rkey = rkey;
        w->remote_addr = a;
        w->length = 8;
        std::memcpy(w->atomic_data, value, 8);
    }
}
void wr_flush(ibv_qp_ex *q, uint32_t rkey, uint64_t a, size_t len, uint8_t type, uint8_t level) {
    // IBTA A19: at least one placement type, and a selectivity level the
    // FETH can carry; the length travels in a 32-bit DMA length.
    if (!type || (type & ~(IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT)) ||
        (level != IBV_FLUSH_RANGE && level != IBV_FLUSH_MR) || len > UINT32_MAX) {
        batch_fail(q, EINVAL);
        return;
    }
    if (SendWqe *w = wr_begin(q, IBV_WR_FLUSH)) {
        w->rkey = rkey;
        w->remote_addr = a;
        w->length = uint32_t(len);
        w->flush_type = type;
        w->flush_level = level;
    }
}
void wr_local_inv(ibv_qp_ex *q, uint32_t invalidate_rkey) {
    if (SendWqe *w = wr_begin(q, IBV_WR_LOCAL_INV)) w->rkey = invalidate_rkey;
}
void wr_bind_mw(ibv_qp_ex *q, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *info) {
    if (!mw || mw->type != IBV_MW_TYPE_2 || !info) {
        batch_fail(q, EINVAL);
        return;
    }
    if (SendWqe *w = wr_begin(q, IBV_WR_BIND_MW)) {
        w->mw = reinterpret_cast<Mw *>(mw);
        w->mw_rkey = rkey;
        w->bind = *info;
        w->bind_key = info->mr ? info->mr->lkey : 0;
    }
}
void wr_set_sge_list(ibv_qp_ex *q, size_t n, const ibv_sge *sg) {
    uint32_t slot;
    if (SendWqe *w = wr_last(q, &slot)) {
        if (!req_fill_sges(to_qp(q), *w, sg, n)) batch_fail(q, EINVAL);
        note_commit_length(to_qp(q), *w);
    }
}
void wr_set_sge(ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length) {
    ibv_sge sge{addr, length, lkey};
    wr_set_sge_list(q, 1, &sge);
}
void wr_set_inline_data_list(ibv_qp_ex *q, size_t n, const ibv_data_buf *bufs) {
    uint32_t slot;
    if (SendWqe *w = wr_last(q, &slot)) {
        if (!req_fill_inline(to_qp(q), *w, slot, bufs, n)) batch_fail(q, EINVAL);
        note_commit_length(to_qp(q), *w);
    }
}
void wr_set_inline_data(ibv_qp_ex *q, void *addr, size_t length) {
    ibv_data_buf b{addr, length};
    wr_set_inline_data_list(q, 1, &b);
}
void wr_set_ud_addr(ibv_qp_ex *q, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    uint32_t slot;
    Qp *qp = to_qp(q);
    if (qp->type != IBV_QPT_UD) {
        batch_fail(q, EOPNOTSUPP);
        return;
    }
    if (SendWqe *w = wr_last(q, &slot))
        if (!req_set_ud_addr(qp, *w, ah, remote_qpn, remote_qkey)) batch_fail(q, EINVAL);
}
void wr_set_xrc_srqn(ibv_qp_ex *q, uint32_t remote_srqn) {
    uint32_t slot;
    if (to_qp(q)->type != IBV_QPT_XRC_SEND) {
        batch_fail(q, EOPNOTSUPP);
        return;
    }
    if (SendWqe *w = wr_last(q, &slot)) w->xrc_srqn = remote_srqn;
}

// Write-commit.  To a peer that declared the native opcodes: one WQE.  To any
// other peer the same promise as IBTA sequences (docs/design.md §2.5):
//   WRITE + FLUSH(MR); ordered: FLUSH(MR) + WRITE + FLUSH(MR);
//   with immediate data, a final zero-length WRITE WITH IMMEDIATE.
// FLUSH with MR selectivity covers every earlier write to the rkey.
void wr_commit(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint32_t flags, bool imm,
               __be32 immv) {
    Qp *qp = to_qp(qpx);
    WrBatch &b = qp->sq.batch;
    if (flags & ~uint32_t(IBV_WRITE_COMMIT_ORDERED | IBV_WRITE_COMMIT_GLOBAL)) {
        batch_fail(qpx, EINVAL);
        return;
    }
    unsigned user = qpx->wr_flags;
    if (qp->peer_native()) {
        if (SendWqe *w = wr_begin_flags(qpx, kWrWriteCommit, user)) {
            w->rkey = rkey;
            w->remote_addr = addr;
            w->imm = immv;
            w->commit_flags = flags | (imm ? kCommitImmFlag : 0);
            w->commit.part = kCommitFinal;
            b.final_slot = b.sge_slot;
        }
        return;
    }
    uint8_t type = (flags & IBV_WRITE_COMMIT_GLOBAL) ? IBV_FLUSH_GLOBAL : IBV_FLUSH_PERSISTENT;
    // Inner parts are unsignaled and the final one carries the application's
    // flags; a fence belongs to the first part only.
    unsigned inner = user & ~unsigned(IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_FENCE);
    bool first = true;
    auto part = [&](ibv_wr_opcode op, uint8_t role) -> SendWqe * {
        unsigned f = role == kCommitFinal ? user & ~unsigned(IBV_SEND_FENCE) : inner;
        if (first) f |= user & IBV_SEND_FENCE;
        SendWqe *w = wr_begin_flags(qpx, op, f);
        if (!w) return nullptr;
        first = false;
        w->commit.part = role;
        w->rkey = rkey;
        w->remote_addr = addr;
        return w;
    };
    auto flush_mr = [&](uint8_t role) {
        if (SendWqe *w = part(IBV_WR_FLUSH, role)) {
            w->flush_type = type;
            w->flush_level = IBV_FLUSH_MR;
            w->remote_addr = 0;
        }
    };
    if (flags & IBV_WRITE_COMMIT_ORDERED) flush_mr(kCommitInner);
    if (!part(IBV_WR_RDMA_WRITE, kCommitInner)) return;
    uint32_t write_slot = b.sge_slot;
    if (!imm) {
        flush_mr(kCommitFinal);
    } else {
        flush_mr(kCommitInner);
        if (SendWqe *w = part(IBV_WR_RDMA_WRITE_WITH_IMM, kCommitFinal)) w->imm = immv;
    }
    if (b.error) return;
    b.final_slot = b.sge_slot;
    b.sge_slot = write_slot;
}

void wr_rdma_write_commit(ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint32_t flags) {
    wr_commit(q, rkey, addr, flags, false, 0);
}
void wr_rdma_write_commit_imm(ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint32_t flags,
                              __be32 imm) {
    wr_commit(q, rkey, addr, flags, true, imm);
}

const ibv_qp_commit_ops kCommitOps = {wr_rdma_write_commit, wr_rdma_write_commit_imm};

// The ibv_qp_ex operations, installed in one place.
void init_qp_ex_ops(Qp *qp) {
    ibv_qp_ex &x = qp->qpx;
    x.comp_mask = 0;
    x.wr_start = wr_start;
    x.wr_complete = wr_complete;
    x.wr_abort = wr_abort;
    x.wr_rdma_write = wr_rdma_write;
    x.wr_rdma_write_imm = wr_rdma_write_imm;
    x.wr_rdma_read = wr_rdma_read;
    x.wr_send = wr_send;
    x.wr_send_imm = wr_send_imm;
    x.wr_send_inv = wr_send_inv;
    x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
    x.wr_atomic_fetch_add = wr_atomic_fetch_add;
    x.wr_set_sge = wr_set_sge;
    x.wr_set_sge_list = wr_set_sge_list;
    x.wr_set_inline_data = wr_set_inline_data;
    x.wr_set_inline_data_list = wr_set_inline_data_list;
    x.wr_local_inv = wr_local_inv;
    x.wr_bind_mw = wr_bind_mw;
    x.wr_set_ud_addr = wr_set_ud_addr;
    x.wr_set_xrc_srqn = wr_set_xrc_srqn;
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
    x.wr_atomic_write = wr_atomic_write;
#else
    qp->ex.wr_atomic_write = wr_atomic_write;
#endif
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
    x.wr_flush = wr_flush;
#else
    qp->ex.wr_flush = wr_flush;
#endif
}

// The send operations each QP type may enable through send_ops_flags.
uint64_t send_ops_for(ibv_qp_type type) {
    constexpr uint64_t kSends = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    constexpr uint64_t kWrites = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    constexpr uint64_t kLocal = IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
    constexpr uint64_t kRc = kSends | kWrites | kLocal | IBV_QP_EX_WITH_SEND_WITH_INV |
                             IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                             IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    switch (type) {
    case IBV_QPT_RC:
        return kRc | IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE |
               IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    case IBV_QPT_UC:
        return kSends | kWrites | kLocal;
    case IBV_QPT_UD:
        return kSends;
    case IBV_QPT_XRC_SEND:
        return kRc;
    default:
        return 0;
    }
}

int check_caps(const ibv_qp_cap &cap) {
    return (cap.max_send_wr > kMaxWr || cap.max_recv_wr > kMaxWr || cap.max_send_sge > kMaxSge ||
            cap.max_recv_sge > kMaxSge || cap.max_inline_data > kMaxInline)
               ? EINVAL
               : 0;
}

// Validates `attr` for a QP of this context; 0 or an errno.
int check_create(Context *ctx, const ibv_qp_init_attr_ex *attr) {
    ibv_context *ibctx = &ctx->vctx.context;
    constexpr uint32_t kKnown = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |
                                IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if (attr->comp_mask & ~kKnown) return EOPNOTSUPP;
    if (ctx->nic->lost()) return EIO;
    // A QP number needs the address's socket, which a device whose port went
    // down before its first QP does not have yet (ENETDOWN, EADDRNOTAVAIL).
    if (int err = ctx->nic->ensure_socket()) return err;
    // No creation flag is supported; asking for none is fine.
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) return EOPNOTSUPP;
    ibv_qp_type type = attr->qp_type;
    if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD &&
        type != IBV_QPT_XRC_SEND && type != IBV_QPT_XRC_RECV)
        return EOPNOTSUPP;
    if (type == IBV_QPT_XRC_RECV) {
        // A receive-only XRC QP belongs to a domain, not a PD, and has no queues.
        if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd ||
            attr->xrcd->context != ibctx)
            return EINVAL;
        return 0;
    }
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ibctx)
        return EINVAL;
    if (!attr->send_cq || attr->send_cq->context != ibctx) return EINVAL;
    if (type != IBV_QPT_XRC_SEND && (!attr->recv_cq || attr->recv_cq->context != ibctx))
        return EINVAL;
    if (attr->srq && (type == IBV_QPT_XRC_SEND || attr->srq->context != ibctx ||
                      to_srq(attr->srq)->type == IBV_SRQT_XRC ||
                      (to_srq(attr->srq)->type == IBV_SRQT_TM && type != IBV_QPT_RC)))
        return EINVAL;
    uint64_t ops = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? attr->send_ops_flags : 0;
    if (ops & ~send_ops_for(type)) return EOPNOTSUPP;
    return check_caps(attr->cap);
}

void init_queues(Qp *qp, ibv_qp_init_attr_ex *attr, uint64_t ops) {
    ibv_qp_cap &cap = attr->cap;
    SendQueue &sq = qp->sq;
    bool sends = qp->type != IBV_QPT_XRC_RECV;
    bool recvs = sends && !qp->srq && qp->type != IBV_QPT_XRC_SEND;
    // A write-commit to a peer without native opcodes takes up to four WQEs.
    uint32_t per_wr = (ops & IBV_QP_EX_WITH_RDMA_WRITE_COMMIT) ? 4 : 1;
    sq.cap_wr = sends ? cap.max_send_wr : 0;
    sq.max_wr = std::max(1u, sq.cap_wr) * per_wr;
    sq.max_sge = std::max(1u, cap.max_send_sge);
    sq.max_inline = sends ? cap.max_inline_data : 0;
    sq.sig_all = attr->sq_sig_all;
    sq.ops_flags = ops;
    sq.wqe.resize(sq.max_wr);
    sq.sge.resize(size_t(sq.max_wr) * sq.max_sge);
    sq.inline_buf.resize(size_t(sq.max_wr) * sq.max_inline);
    if (recvs)
        qp->resp.rq.init(std::max(1u, cap.max_recv_wr), std::max(1u, cap.max_recv_sge));
    else
        qp->resp.rq.init(1, 1);
    qp->resp.rd_res.assign(1, RdResource{});
    qp->commit.dirty.reserve(32); // bounded (resp.cpp), so the data path never allocates
    // What the QP really has, as ibv_create_qp reports it back.
    if (!recvs) cap.max_recv_wr = cap.max_recv_sge = 0;
    if (!sends) cap.max_send_wr = cap.max_send_sge = cap.max_inline_data = 0;
}

} // namespace

int qp_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
    return req_post_send(to_qp(qp), wr, bad);
}
int qp_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
    return resp_post_recv(to_qp(qp), wr, bad);
}

ibv_qp *create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr) try {
    Context *ctx = to_ctx(ibctx);
    if (int err = check_create(ctx, attr)) {
        errno = err;
        return nullptr;
    }
    uint64_t ops = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? attr->send_ops_flags : 0;
    Qp *qp = new (std::nothrow) Qp;
    if (!qp) {
        errno = ENOMEM;
        return nullptr;
    }
    qp->ctx = ctx;
    qp->nic = ctx->nic;
    qp->type = attr->qp_type;
    if (qp->type == IBV_QPT_RC) qp->announce = qp->nic->announce();
    bool tgt = qp->type == IBV_QPT_XRC_RECV;
    qp->scq = tgt ? nullptr : to_cq(attr->send_cq);
    qp->rcq = tgt || qp->type == IBV_QPT_XRC_SEND ? nullptr : to_cq(attr->recv_cq);
    qp->srq = tgt ? nullptr : (attr->srq ? to_srq(attr->srq) : nullptr);
    qp->pd = tgt ? nullptr : pd_root(attr->pd);
    if (tgt) qp->xrcd = reinterpret_cast<Xrcd *>(attr->xrcd);
    try {
        init_queues(qp, attr, ops);
    } catch (const std::bad_alloc &) {
        delete qp;
        errno = ENOMEM;
        return nullptr;
    }
    // Datagrams are bounded by the port's MTU rather than a path's.
    if (qp->type == IBV_QPT_UD) {
        qp->attr.path_mtu = ctx->dev->active_mtu;
        qp->attr.mtu = uint32_t(mtu_bytes(qp->attr.path_mtu));
    } else {
        qp->attr.mtu = uint32_t(mtu_bytes(qp->attr.path_mtu));
    }

    ibv_qp &b = qp->qpx.qp_base;
    b.context = ibctx;
    b.qp_context = attr->qp_context;
    b.pd = tgt ? nullptr : attr->pd;
    b.send_cq = tgt ? nullptr : attr->send_cq;
    b.recv_cq = qp->rcq ? attr->recv_cq : nullptr;
    b.srq = qp->srq ? attr->srq : nullptr;
    b.state = IBV_QPS_RESET;
    b.qp_type = qp->type;
    b.events_completed = 0;
    pthread_mutex_init(&b.mutex, nullptr);
    pthread_cond_init(&b.cond, nullptr);
    uint32_t qpn = ctx->nic->add_qp(qp);
    if (!qpn) {
        delete qp;
        errno = ENOMEM;
        return nullptr;
    }
    b.qp_num = qpn;
    b.handle = qpn;
    ctx->nic->publish_qp(qp);
    if (qp->xrcd) qp->xrcd->refs++;
    if (qp->srq) qp->srq->users++;
    init_qp_ex_ops(qp);
    return &b;
} catch (const std::bad_alloc &) {
    return out_of_memory<ibv_qp *>(nullptr);
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_qp *sroce_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_context = attr->qp_context;
    ex.send_cq = attr->send_cq;
    ex.recv_cq = attr->recv_cq;
    ex.srq = attr->srq;
    ex.cap = attr->cap;
    ex.qp_type = attr->qp_type;
    ex.sq_sig_all = attr->sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    ibv_qp *qp = create_qp_ex(pd->context, &ex);
    if (qp) attr->cap = ex.cap;
    return qp;
}

int sroce_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
                   struct ibv_qp_init_attr *init) {
    (void)mask; // everything is cheap to report
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    const QpAttr &a = qp->attr;
    *attr = ibv_qp_attr{};
    attr->qp_state = a.state;
    attr->cur_qp_state = a.state;
    attr->path_mtu = a.path_mtu;
    attr->path_mig_state = IBV_MIG_MIGRATED;
    attr->qkey = a.qkey;
    attr->rq_psn = qp->resp.epsn;
    attr->sq_psn = qp->req.next_psn;
    attr->dest_qp_num = a.dest_qpn;
    attr->qp_access_flags = a.access;
    bool own_rq = !qp->srq && qp->type != IBV_QPT_XRC_SEND && qp->type != IBV_QPT_XRC_RECV;
    if (qp->type != IBV_QPT_XRC_RECV) {
        attr->cap.max_send_wr = qp->sq.cap_wr;
        attr->cap.max_send_sge = qp->sq.max_sge;
        attr->cap.max_inline_data = qp->sq.max_inline;
    }
    if (own_rq) {
        attr->cap.max_recv_wr = qp->resp.rq.max_wr;
        attr->cap.max_recv_sge = qp->resp.rq.max_sge;
    }
    attr->ah_attr = a.ah;
    attr->pkey_index = a.pkey_index;
    attr->sq_draining = a.sq_draining;
    attr->max_rd_atomic = a.max_rd_atomic;
    attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr->min_rnr_timer = a.min_rnr_timer;
    attr->port_num = a.port_num;
    attr->timeout = a.timeout;
    attr->retry_cnt = a.retry_cnt;
    attr->rnr_retry = a.rnr_retry;
    if (init) {
        *init = ibv_qp_init_attr{};
        init->qp_context = ibqp->qp_context;
        init->send_cq = ibqp->send_cq;
        init->recv_cq = ibqp->recv_cq;
        init->srq = ibqp->srq;
        init->cap = attr->cap;
        init->qp_type = qp->type;
        init->sq_sig_all = qp->sq.sig_all;
    }
    return 0;
}

int sroce_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask) try {
    Qp *qp = to_qp(ibqp);
    std::unique_lock<std::mutex> g(qp->mu);
    // What was received is acknowledged, as an RNIC would have done already,
    // before a reset forgets it: queued now, sent when the lock is let go.
    if ((mask & IBV_QP_STATE) && (attr->qp_state == IBV_QPS_RESET || attr->qp_state == IBV_QPS_ERR))
        req_queue_deferred_ack(qp);
    int rc = modify(qp, attr, mask);
    if (!rc) qp->nic->publish_qp(qp);
    req_send_queued(qp, g);
    return rc;
} catch (const std::bad_alloc &) {
    return ENOMEM;
}

int sroce_destroy_qp(struct ibv_qp *ibqp) {
    Qp *qp = to_qp(ibqp);
    Nic *nic = qp->nic;
    if (qp->type == IBV_QPT_UD) nic->detach_all(qp);
    {
        // The progress thread holds objects_mu while it uses any QP.
        std::lock_guard<std::mutex> g(nic->objects_mu);
        nic->remove_qp(qp);
        unbind_windows_of(qp);
        // No receive pass reaches the QP any more: what it received last is
        // acknowledged, as an RNIC would have done already.
        std::unique_lock<std::mutex> q(qp->mu);
        send_deferred_ack_now(qp, q);
    }
    qp->ctx->forget_events(ibqp);
    forget_completions(qp);
    if (qp->xrcd) qp->xrcd->refs--;
    if (qp->srq) qp->srq->users--;
    pthread_mutex_destroy(&ibqp->mutex);
    pthread_cond_destroy(&ibqp->cond);
    delete qp;
    return 0;
}

const struct ibv_qp_commit_ops *sroce_qp_to_commit_ops(struct ibv_qp_ex *qpx) {
    // Like any ibv_wr_* operation, only on QPs created with it.
    if (!(to_qp(qpx)->sq.ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_COMMIT)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return &kCommitOps;
}

int sroce_qp_set_commit_peer(struct ibv_qp *ibqp, uint32_t peer_commit_caps) {
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    qp->commit.peer_native = peer_commit_caps & IBV_COMMIT_CAP_NATIVE;
    qp->selective_repeat_declared = qp->type == IBV_QPT_RC && qp->nic->selective_repeat() &&
                                    (peer_commit_caps & IBV_COMMIT_CAP_SELECTIVE_REPEAT);
    qp->agree_selective_repeat();
    return 0;
}

// What a QP offers in ECE (layout: <infiniband/verbs_ext.h>): the commit
// capabilities of its responder, which only reliable connected QPs use.  The
// options are tagged because another implementation without an OUI may one
// day send options of its own under the same vendor ID.
static_assert(kVendorId == IBV_COMMIT_ECE_VENDOR_ID, "ECE carries the device's vendor ID");
static uint32_t ece_offer(const Qp *qp) {
    if (!qp->reliable()) return 0;
    ibv_commit_caps caps{};
    sroce_query_commit_caps(qp->qpx.qp_base.context, &caps);
    uint32_t mask = IBV_COMMIT_ECE_CAPS_MASK;
    if (qp->type != IBV_QPT_RC) mask &= ~uint32_t(IBV_COMMIT_CAP_SELECTIVE_REPEAT);
    return IBV_COMMIT_ECE_TAG | (caps.flags & mask);
}

// librdmacm asks before it sends REQ or REP what to put in them, and hands
// over what the peer sent; the kernel's CM carries both untouched.  A peer
// that sent nothing, or options without sroce's tag, shares no capability,
// so it gets the IBTA sequences.
int sroce_query_ece(struct ibv_qp *ibqp, struct ibv_ece *ece) {
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    *ece = {};
    ece->vendor_id = IBV_COMMIT_ECE_VENDOR_ID;
    ece->options = qp->commit.ece_set ? qp->commit.ece_options : ece_offer(qp);
    return 0;
}

int sroce_set_ece(struct ibv_qp *ibqp, struct ibv_ece *ece) {
    Qp *qp = to_qp(ibqp);
    // libibverbs answers vendor ID 0 itself, before any provider.
    if (!ece->vendor_id) return EOPNOTSUPP;
    if (ece->comp_mask || ece->vendor_id != IBV_COMMIT_ECE_VENDOR_ID) return EINVAL;
    const uint32_t agreed = sroce_ece_agree(ece_offer(qp), ece->options);
    std::lock_guard<std::mutex> g(qp->mu);
    qp->commit.ece_set = true;
    qp->commit.ece_options = agreed;
    qp->commit.peer_native = agreed & IBV_COMMIT_CAP_NATIVE;
    qp->selective_repeat_declared =
        qp->type == IBV_QPT_RC && (agreed & IBV_COMMIT_CAP_SELECTIVE_REPEAT);
    qp->agree_selective_repeat();
    return 0;
}

// A RoCEv2 multicast GID: an IPv6 multicast address, or the IPv4-mapped form
// of a class D one, of the port's family.
static bool multicast_group(const Qp *qp, const union ibv_gid *gid, IpAddr *group) {
    return gid && gid_addr(*qp->ctx->dev, *gid, group) && group->multicast();
}

int sroce_attach_mcast(struct ibv_qp *ibqp, const union ibv_gid *gid, uint16_t) try {
    Qp *qp = to_qp(ibqp);
    IpAddr group;
    if (qp->type != IBV_QPT_UD || !multicast_group(qp, gid, &group)) return EINVAL;
    return qp->nic->attach_mcast(qp, group);
} catch (const std::bad_alloc &) {
    return ENOMEM;
}

int sroce_detach_mcast(struct ibv_qp *ibqp, const union ibv_gid *gid, uint16_t) {
    Qp *qp = to_qp(ibqp);
    IpAddr group;
    if (qp->type != IBV_QPT_UD || !multicast_group(qp, gid, &group)) return EINVAL;
    return qp->nic->detach_mcast(qp, group);
}

struct ibv_qp_ex *sroce_qp_to_qp_ex(struct ibv_qp *qp) {
    return &to_qp(qp)->qpx;
}

} // extern "C"
