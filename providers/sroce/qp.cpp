// Queue pairs: creation, the IB QP state machine (modify/query), completions,
// flushing on error, and the ibv_qp_ex work-request interface.
#include "provider.h"
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace sroce {
namespace {

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
    // rdma-core 44's enum lacks FLUSH, so it cannot be a case label.
    if (op == IBV_WR_FLUSH) return IBV_WC_FLUSH;
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
    case IBV_WR_ATOMIC_WRITE:
        return IBV_WC_ATOMIC_WRITE;
    default:
        return IBV_WC_SEND;
    }
}

} // namespace

// A write-commit sent as an IBTA sequence reports once: when one part fails,
// the parts after it up to the final one stay silent.
void silence_rest_of_commit(Qp *qp, const SendWqe &w) {
    uint32_t cap = qp->max_send_wr;
    uint32_t slot = uint32_t(&w - qp->sq.data());
    for (uint32_t k = 1; k < cap; k++) {
        SendWqe &x = qp->sq[(slot + k) % cap];
        if (x.commit_part == kCommitNone) break;
        x.suppressed = true;
        if (x.commit_part == kCommitFinal) break;
    }
}

void complete_send(Qp *qp, const SendWqe &w, ibv_wc_status status) {
    if (w.suppressed) return;
    if (w.commit_part == kCommitInner) {
        if (status == IBV_WC_SUCCESS) return;
        silence_rest_of_commit(qp, w);
    }
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = status;
    wc.opcode = w.commit_part != kCommitNone ? IBV_WC_RDMA_WRITE_COMMIT : wc_opcode(w.opcode);
    wc.qp_num = qp->qpx.qp_base.qp_num;
    // byte_len: what Linux rxe reports for every send-side opcode.
    wc.byte_len = w.commit_part != kCommitNone ? w.report_len : w.length;
    if (!qp->scq->push(wc, false)) post_cq_overflow(qp->ctx, qp->scq);
}

void complete_recv(Qp *qp, const RecvWqe &r, ibv_wc_status status, ibv_wc_opcode opcode,
                   uint32_t byte_len, __be32 imm, bool with_imm, bool solicited) {
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.byte_len = byte_len;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    wc.src_qp = qp->dest_qpn;
    if (with_imm) {
        wc.imm_data = imm;
        wc.wc_flags |= IBV_WC_WITH_IMM;
    }
    wc.pkey_index = qp->pkey_index;
    if (!qp->rcq->push(wc, solicited)) post_cq_overflow(qp->ctx, qp->rcq);
}

void Context::post_event(const ibv_async_event &ev) {
    std::lock_guard<std::mutex> g(async_mu);
    async_q.push_back(ev);
    uint8_t one = 1;
    if (write(async_wr, &one, 1) != 1) { /* a full pipe still leaves the queue readable */
    }
}

void Context::forget_events(const void *obj) {
    std::lock_guard<std::mutex> g(async_mu);
    for (auto it = async_q.begin(); it != async_q.end();) {
        if (it->element.qp == obj || it->element.cq == obj) {
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

void qp_flush_queues(Qp *qp) {
    uint32_t scap = qp->max_send_wr, rcap = qp->max_recv_wr;
    for (uint32_t i = qp->sq_tail; i != qp->sq_head; i++) {
        complete_send(qp, qp->sq[i % scap], IBV_WC_WR_FLUSH_ERR);
    }
    qp->sq_tail = qp->sq_cur = qp->sq_head;
    qp->rd_outstanding = 0;
    for (uint32_t i = qp->rq_tail; i != qp->rq_head; i++)
        complete_recv(qp, qp->rq[i % rcap], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, false);
    qp->rq_tail = qp->rq_head;
    qp->recv_taken = false;
    qp->timer_deadline_ns = qp->rnr_deadline_ns = 0;
}

void qp_enter_error(Qp *qp) {
    qp->state = IBV_QPS_ERR;
    qp->qpx.qp_base.state = IBV_QPS_ERR;
    qp_flush_queues(qp);
}

namespace {

void reset_state(Qp *qp) {
    qp->sq_head = qp->sq_tail = qp->sq_cur = 0;
    qp->rq_head = qp->rq_tail = 0;
    qp->next_psn = qp->una_psn = qp->epsn = qp->msn = 0;
    qp->rd_outstanding = 0;
    qp->timer_deadline_ns = qp->rnr_deadline_ns = 0;
    qp->nak_sent = qp->ack_pending = false;
    qp->in_msg = 0;
    qp->recv_taken = false;
    qp->last_nak_rewind = UINT32_MAX;
    for (RdResource &r : qp->rd_res)
        r.valid = false;
    qp->dirty.clear();
    qp->in_msg_commit = false;
}

// Required and optional attributes of each RC transition (IBTA 11.2.4.2).
struct Transition {
    int required, optional;
    bool valid;
};

Transition transition(ibv_qp_state cur, ibv_qp_state next) {
    constexpr int kRtsOpt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                            IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return {0, 0, true};
    switch (cur) {
    case IBV_QPS_RESET:
        if (next == IBV_QPS_INIT)
            return {IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0, true};
        break;
    case IBV_QPS_INIT:
        if (next == IBV_QPS_INIT)
            return {0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, true};
        if (next == IBV_QPS_RTR)
            return {IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                    IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH, true};
        break;
    case IBV_QPS_RTR:
        if (next == IBV_QPS_RTS)
            return {IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC,
                    kRtsOpt, true};
        break;
    case IBV_QPS_RTS:
        if (next == IBV_QPS_RTS) return {0, kRtsOpt, true};
        if (next == IBV_QPS_SQD) return {0, IBV_QP_EN_SQD_ASYNC_NOTIFY, true};
        break;
    case IBV_QPS_SQD:
        if (next == IBV_QPS_RTS) return {0, kRtsOpt, true};
        if (next == IBV_QPS_SQD)
            return {0,
                    kRtsOpt | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PKEY_INDEX,
                    true};
        break;
    case IBV_QPS_SQE:
        if (next == IBV_QPS_RTS)
            return {0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER, true};
        break;
    case IBV_QPS_ERR:
        break;
    default:
        break;
    }
    return {0, 0, false};
}

bool dest_from_gid(const ibv_gid &gid, in_addr_t *addr) {
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    if (std::memcmp(gid.raw, kMapped, 12) != 0) return false;
    std::memcpy(addr, gid.raw + 12, 4);
    return true;
}

int modify(Qp *qp, ibv_qp_attr *attr, int mask) {
    ibv_qp_state cur = qp->state;
    if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
    ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
    Transition t = transition(cur, next);
    if (!t.valid) return EINVAL;
    int attrs = mask & ~IBV_QP_STATE;
    if ((attrs & t.required) != t.required) return EINVAL;
    if (attrs & ~(t.required | t.optional)) return EINVAL;

    // Validate everything before changing anything.
    Device *dev = qp->ctx->dev;
    in_addr_t dest = qp->dest_addr;
    if (mask & IBV_QP_AV) {
        if (!attr->ah_attr.is_global || attr->ah_attr.grh.sgid_index >= kNumGids ||
            !dest_from_gid(attr->ah_attr.grh.dgid, &dest))
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
    if ((mask & IBV_QP_ACCESS_FLAGS) &&
        (attr->qp_access_flags & ~unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                           IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT)))
        return EINVAL;

    if (mask & IBV_QP_ACCESS_FLAGS) qp->access = attr->qp_access_flags;
    if (mask & IBV_QP_PKEY_INDEX) qp->pkey_index = attr->pkey_index;
    if (mask & IBV_QP_PORT) qp->port_num = attr->port_num;
    if (mask & IBV_QP_AV) {
        qp->ah = attr->ah_attr;
        qp->dest_addr = dest;
    }
    if (mask & IBV_QP_PATH_MTU) {
        qp->path_mtu = std::min(attr->path_mtu, dev->active_mtu);
        qp->mtu = uint32_t(mtu_bytes(qp->path_mtu));
    }
    if (mask & IBV_QP_DEST_QPN) qp->dest_qpn = attr->dest_qp_num & wire::kQpnMask;
    if (mask & IBV_QP_RQ_PSN) qp->epsn = attr->rq_psn & wire::kPsnMask;
    if (mask & IBV_QP_SQ_PSN) qp->next_psn = qp->una_psn = attr->sq_psn & wire::kPsnMask;
    if (mask & IBV_QP_TIMEOUT) qp->timeout = attr->timeout;
    if (mask & IBV_QP_RETRY_CNT) qp->retry_cnt = qp->retries_left = attr->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry = qp->rnr_left = attr->rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER) qp->min_rnr_timer = attr->min_rnr_timer;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        qp->max_rd_atomic = std::max<uint8_t>(1, attr->max_rd_atomic);
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
        qp->max_dest_rd_atomic = std::max<uint8_t>(1, attr->max_dest_rd_atomic);
        qp->rd_res.assign(qp->max_dest_rd_atomic, RdResource{});
        qp->rd_res_next = 0;
    }
    if (mask & IBV_QP_STATE) {
        if (next == IBV_QPS_RESET) reset_state(qp);
        qp->state = next;
        qp->qpx.qp_base.state = next;
        if (next == IBV_QPS_ERR) qp_flush_queues(qp);
    }
    return 0;
}

// ibv_qp_ex: WQEs are built in place past sq_head and published by wr_complete.
struct WrBatch {
    uint32_t pending = 0;
    int error = 0;
    uint32_t sge_slot = 0;            // the WQE ibv_wr_set_sge* fills
    uint32_t final_slot = UINT32_MAX; // the WQE reporting the current commit
};
thread_local WrBatch t_wr;

SendWqe *wr_begin_flags(ibv_qp_ex *qpx, ibv_wr_opcode op, unsigned flags) {
    Qp *qp = to_qp(qpx);
    if (t_wr.error) return nullptr;
    if (qp->sq_head + t_wr.pending - qp->sq_tail >= qp->max_send_wr) {
        t_wr.error = ENOMEM;
        return nullptr;
    }
    uint32_t slot = (qp->sq_head + t_wr.pending) % qp->max_send_wr;
    t_wr.pending++;
    t_wr.sge_slot = slot;
    t_wr.final_slot = UINT32_MAX;
    return &req_new_wqe(qp, slot, qpx->wr_id, op, flags);
}

SendWqe *wr_begin(ibv_qp_ex *qpx, ibv_wr_opcode op) {
    return wr_begin_flags(qpx, op, qpx->wr_flags);
}

SendWqe *wr_last(ibv_qp_ex *qpx, uint32_t *slot) {
    Qp *qp = to_qp(qpx);
    if (t_wr.error || !t_wr.pending) {
        if (!t_wr.error) t_wr.error = EINVAL;
        return nullptr;
    }
    *slot = t_wr.sge_slot;
    return &qp->sq[*slot];
}

// The gather list of a commit's write is known only now: its completion
// reports that length.
void note_commit_length(Qp *qp, const SendWqe &w) {
    if (t_wr.final_slot != UINT32_MAX) qp->sq[t_wr.final_slot].report_len = w.length;
}

void wr_start(ibv_qp_ex *qpx) {
    to_qp(qpx)->mu.lock();
    t_wr = WrBatch{};
}

int wr_complete(ibv_qp_ex *qpx) {
    Qp *qp = to_qp(qpx);
    int err = t_wr.error;
    if (!err &&
        (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR))
        err = EINVAL;
    if (!err) {
        qp->sq_head += t_wr.pending;
        req_kick(qp);
    }
    t_wr = WrBatch{};
    req_send_and_unlock(qp);
    return err;
}

void wr_abort(ibv_qp_ex *qpx) {
    t_wr = WrBatch{};
    to_qp(qpx)->mu.unlock();
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
        if (!t_wr.error) t_wr.error = EINVAL;
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
void wr_set_sge_list(ibv_qp_ex *q, size_t n, const ibv_sge *sg) {
    uint32_t slot;
    if (SendWqe *w = wr_last(q, &slot)) {
        if (!req_fill_sges(to_qp(q), *w, sg, n)) t_wr.error = EINVAL;
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
        if (!req_fill_inline(to_qp(q), *w, slot, bufs, n)) t_wr.error = EINVAL;
        note_commit_length(to_qp(q), *w);
    }
}

// Write-commit.  To a peer that declared the native opcodes: one WQE.  To any
// other peer the same promise as IBTA sequences (DESIGN.md §2.5):
//   WRITE + FLUSH(MR); ordered: FLUSH(MR) + WRITE + FLUSH(MR);
//   with immediate data, a final zero-length WRITE WITH IMMEDIATE.
// FLUSH with MR selectivity covers every earlier write to the rkey.
void wr_commit(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint32_t flags, bool imm,
               __be32 immv) {
    Qp *qp = to_qp(qpx);
    if (flags & ~uint32_t(IBV_WRITE_COMMIT_ORDERED | IBV_WRITE_COMMIT_GLOBAL)) {
        if (!t_wr.error) t_wr.error = EINVAL;
        return;
    }
    unsigned user = qpx->wr_flags;
    if (qp->peer_native_commit) {
        if (SendWqe *w = wr_begin_flags(qpx, kWrWriteCommit, user)) {
            w->rkey = rkey;
            w->remote_addr = addr;
            w->imm = immv;
            w->commit_flags = flags | (imm ? kCommitImmFlag : 0);
            w->commit_part = kCommitFinal;
            t_wr.final_slot = t_wr.sge_slot;
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
        w->commit_part = role;
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
    uint32_t write_slot = t_wr.sge_slot;
    if (!imm) {
        flush_mr(kCommitFinal);
    } else {
        flush_mr(kCommitInner);
        if (SendWqe *w = part(IBV_WR_RDMA_WRITE_WITH_IMM, kCommitFinal)) w->imm = immv;
    }
    if (t_wr.error) return;
    t_wr.final_slot = t_wr.sge_slot;
    t_wr.sge_slot = write_slot;
}

void wr_rdma_write_commit(ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint32_t flags) {
    wr_commit(q, rkey, addr, flags, false, 0);
}
void wr_rdma_write_commit_imm(ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint32_t flags,
                              __be32 imm) {
    wr_commit(q, rkey, addr, flags, true, imm);
}

const ibv_qp_commit_ops kCommitOps = {wr_rdma_write_commit, wr_rdma_write_commit_imm};
void wr_set_inline_data(ibv_qp_ex *q, void *addr, size_t length) {
    ibv_data_buf b{addr, length};
    wr_set_inline_data_list(q, 1, &b);
}
void wr_unsupported_ud(ibv_qp_ex *, ibv_ah *, uint32_t, uint32_t) {
    t_wr.error = EOPNOTSUPP;
}
void wr_unsupported_xrc(ibv_qp_ex *, uint32_t) {
    t_wr.error = EOPNOTSUPP;
}

int post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad) {
    return req_post_send(to_qp(ibqp), wr, bad);
}
int post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
    return resp_post_recv(to_qp(ibqp), wr, bad);
}

} // namespace

int qp_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
    return post_send(qp, wr, bad);
}
int qp_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
    return post_recv(qp, wr, bad);
}

ibv_qp *create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *attr) {
    constexpr uint64_t kSendOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                                  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_FLUSH |
                                  IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    Context *ctx = to_ctx(ibctx);
    if (attr->comp_mask & ~uint32_t(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    if (attr->qp_type != IBV_QPT_RC || attr->srq) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    uint64_t ops = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? attr->send_ops_flags : 0;
    if (ops & ~kSendOps) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    ibv_qp_cap &cap = attr->cap;
    if (!attr->send_cq || !attr->recv_cq || attr->send_cq->context != ibctx ||
        attr->recv_cq->context != ibctx || cap.max_send_wr > kMaxWr || cap.max_recv_wr > kMaxWr ||
        cap.max_send_sge > kMaxSge || cap.max_recv_sge > kMaxSge ||
        cap.max_inline_data > kMaxInline) {
        errno = EINVAL;
        return nullptr;
    }
    auto *qp = new Qp;
    qp->ctx = ctx;
    qp->nic = ctx->nic;
    qp->scq = to_cq(attr->send_cq);
    qp->rcq = to_cq(attr->recv_cq);
    qp->sq_sig_all = attr->sq_sig_all;
    // A write-commit to a peer without native opcodes takes up to four WQEs.
    uint32_t per_wr = (ops & IBV_QP_EX_WITH_RDMA_WRITE_COMMIT) ? 4 : 1;
    qp->max_send_wr = std::max(1u, cap.max_send_wr) * per_wr;
    qp->cap_send_wr = cap.max_send_wr;
    qp->max_recv_wr = std::max(1u, cap.max_recv_wr);
    qp->max_send_sge = std::max(1u, cap.max_send_sge);
    qp->max_recv_sge = std::max(1u, cap.max_recv_sge);
    qp->max_inline = cap.max_inline_data;
    qp->send_ops_flags = ops;
    qp->sq.resize(qp->max_send_wr);
    qp->sq_sge.resize(size_t(qp->max_send_wr) * qp->max_send_sge);
    qp->sq_inline.resize(size_t(qp->max_send_wr) * qp->max_inline);
    qp->rq.resize(qp->max_recv_wr);
    qp->rq_sge.resize(size_t(qp->max_recv_wr) * qp->max_recv_sge);
    qp->rd_res.assign(1, RdResource{});
    qp->dirty.reserve(32); // bounded (resp.cpp), so the data path never allocates
    qp->mtu = uint32_t(mtu_bytes(qp->path_mtu));

    ibv_qp &b = qp->qpx.qp_base;
    b.context = ibctx;
    b.qp_context = attr->qp_context;
    b.pd = attr->pd;
    b.send_cq = attr->send_cq;
    b.recv_cq = attr->recv_cq;
    b.srq = nullptr;
    b.state = IBV_QPS_RESET;
    b.qp_type = IBV_QPT_RC;
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
    x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
    x.wr_atomic_fetch_add = wr_atomic_fetch_add;
    x.wr_set_sge = wr_set_sge;
    x.wr_set_sge_list = wr_set_sge_list;
    x.wr_set_inline_data = wr_set_inline_data;
    x.wr_set_inline_data_list = wr_set_inline_data_list;
    x.wr_atomic_write = wr_atomic_write;
    qp->wr_flush = wr_flush;
    x.wr_set_ud_addr = wr_unsupported_ud;
    x.wr_set_xrc_srqn = wr_unsupported_xrc;
    return &b;
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
    *attr = ibv_qp_attr{};
    attr->qp_state = qp->state;
    attr->cur_qp_state = qp->state;
    attr->path_mtu = qp->path_mtu;
    attr->path_mig_state = IBV_MIG_MIGRATED;
    attr->qkey = qp->qkey;
    attr->rq_psn = qp->epsn;
    attr->sq_psn = qp->next_psn;
    attr->dest_qp_num = qp->dest_qpn;
    attr->qp_access_flags = qp->access;
    attr->cap.max_send_wr = qp->cap_send_wr;
    attr->cap.max_recv_wr = qp->max_recv_wr;
    attr->cap.max_send_sge = qp->max_send_sge;
    attr->cap.max_recv_sge = qp->max_recv_sge;
    attr->cap.max_inline_data = qp->max_inline;
    attr->ah_attr = qp->ah;
    attr->pkey_index = qp->pkey_index;
    attr->sq_draining = 0;
    attr->max_rd_atomic = qp->max_rd_atomic;
    attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
    attr->min_rnr_timer = qp->min_rnr_timer;
    attr->port_num = qp->port_num;
    attr->timeout = qp->timeout;
    attr->retry_cnt = qp->retry_cnt;
    attr->rnr_retry = qp->rnr_retry;
    if (init) {
        *init = ibv_qp_init_attr{};
        init->qp_context = ibqp->qp_context;
        init->send_cq = ibqp->send_cq;
        init->recv_cq = ibqp->recv_cq;
        init->cap = attr->cap;
        init->qp_type = IBV_QPT_RC;
        init->sq_sig_all = qp->sq_sig_all;
    }
    return 0;
}

int sroce_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask) {
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    return modify(qp, attr, mask);
}

int sroce_destroy_qp(struct ibv_qp *ibqp) {
    Qp *qp = to_qp(ibqp);
    Nic *nic = qp->nic;
    {
        // The progress thread holds objects_mu while it uses any QP.
        std::lock_guard<std::mutex> g(nic->objects_mu);
        nic->remove_qp(qp);
    }
    qp->ctx->forget_events(ibqp);
    pthread_mutex_destroy(&ibqp->mutex);
    pthread_cond_destroy(&ibqp->cond);
    delete qp;
    return 0;
}

const struct ibv_qp_commit_ops *sroce_qp_to_commit_ops(struct ibv_qp_ex *qpx) {
    // Like any ibv_wr_* operation, only on QPs created with it.
    if (!(to_qp(qpx)->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_COMMIT)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return &kCommitOps;
}

int sroce_qp_set_commit_peer(struct ibv_qp *ibqp, uint32_t peer_commit_caps) {
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    qp->peer_native_commit = peer_commit_caps & IBV_COMMIT_CAP_NATIVE;
    return 0;
}

struct ibv_qp_ex *sroce_qp_to_qp_ex(struct ibv_qp *qp) {
    return &to_qp(qp)->qpx;
}

} // extern "C"
