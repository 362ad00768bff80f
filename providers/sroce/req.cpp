// Requester: turns send-queue WQEs into packets (segmentation at the path MTU,
// PSN assignment, fences, read/atomic credits), keeps the go-back-N state and
// the retransmit and RNR timers.
#include "transport.hpp"

#include <algorithm>
#include <cstring>

namespace sroce {
namespace {

// Packets in flight beyond the oldest unacknowledged PSN.
constexpr int32_t kWindow = 1024;
// Ask for an ACK at least this often inside long messages.
constexpr uint32_t kAckReqEvery = 32;

thread_local TxBatch t_tx;

bool is_read(const SendWqe &w) {
    return w.opcode == IBV_WR_RDMA_READ;
}
bool is_atomic(const SendWqe &w) {
    return w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
bool needs_credit(const SendWqe &w) {
    return wr_needs_response(w.opcode);
}

uint32_t div_up(uint32_t a, uint32_t b) {
    return (a + b - 1) / b;
}

// Fills iov with the bytes [off, off+len) of the WQE's gather list.
int gather(const SendWqe &w, uint32_t off, uint32_t len, iovec *iov) {
    int n = 0;
    for (uint32_t i = 0; i < w.num_sge && len; i++) {
        const ibv_sge &s = w.sge[i];
        if (off >= s.length) {
            off -= s.length;
            continue;
        }
        uint32_t take = std::min(s.length - off, len);
        iov[n++] = {reinterpret_cast<uint8_t *>(uintptr_t(s.addr)) + off, take};
        len -= take;
        off = 0;
    }
    return n;
}

uint8_t send_write_opcode(const SendWqe &w, uint32_t i) {
    bool first = i == 0, last = i + 1 == w.npkts;
    using namespace wire;
    if (w.opcode == kWrWriteCommit) {
        bool imm = w.commit_flags & kCommitImmFlag;
        if (first && last) return imm ? kCommitWriteOnlyImm : kCommitWriteOnly;
        if (first) return kCommitWriteFirst;
        if (last) return imm ? kCommitWriteLastImm : kCommitWriteLast;
        return kCommitWriteMiddle;
    }
    bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    bool imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w.opcode == IBV_WR_SEND_WITH_IMM;
    if (first && last)
        return write ? (imm ? kWriteOnlyImm : kWriteOnly) : (imm ? kSendOnlyImm : kSendOnly);
    if (first) return write ? kWriteFirst : kSendFirst;
    if (last) return write ? (imm ? kWriteLastImm : kWriteLast) : (imm ? kSendLastImm : kSendLast);
    return write ? kWriteMiddle : kSendMiddle;
}

void send_packet(Qp *qp, SendWqe &w, uint32_t i, TxBatch &tx) {
    using namespace wire;
    uint8_t hdr[kMaxHdrLen];
    uint32_t psn = psn_add(w.first_psn, i);
    Nic *nic = qp->nic;
    if (is_read(w)) {
        // A re-sent READ asks only for the responses not yet received.
        uint32_t off = i * qp->mtu;
        bth::build(hdr, kReadRequest, false, 0, kDefaultPkey, qp->dest_qpn, true, psn);
        put64(hdr + kBthLen, w.remote_addr + off);
        put32(hdr + kBthLen + 8, w.rkey);
        put32(hdr + kBthLen + 12, w.length - off);
        nic->queue(tx, qp->dest_addr, hdr, kBthLen + kRethLen, nullptr, 0, 0);
        return;
    }
    if (is_atomic(w)) {
        uint8_t op = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? kCompareSwap : kFetchAdd;
        bth::build(hdr, op, false, 0, kDefaultPkey, qp->dest_qpn, true, psn);
        put64(hdr + kBthLen, w.remote_addr);
        put32(hdr + kBthLen + 8, w.rkey);
        if (op == kCompareSwap) {
            put64(hdr + kBthLen + 12, w.swap);
            put64(hdr + kBthLen + 20, w.compare_add);
        } else {
            put64(hdr + kBthLen + 12, w.compare_add);
            put64(hdr + kBthLen + 20, 0);
        }
        nic->queue(tx, qp->dest_addr, hdr, kBthLen + kAtomicEthLen, nullptr, 0, 0);
        return;
    }
    if (w.opcode == IBV_WR_FLUSH) {
        bth::build(hdr, kFlush, false, 0, kDefaultPkey, qp->dest_qpn, true, psn);
        put32(hdr + kBthLen, uint32_t(w.flush_level) << 4 | w.flush_type);
        put64(hdr + kBthLen + kFethLen, w.remote_addr);
        put32(hdr + kBthLen + kFethLen + 8, w.rkey);
        put32(hdr + kBthLen + kFethLen + 12, w.length);
        nic->queue(tx, qp->dest_addr, hdr, kBthLen + kFethLen + kRethLen, nullptr, 0, 0);
        return;
    }
    if (w.opcode == IBV_WR_ATOMIC_WRITE) {
        bth::build(hdr, kAtomicWrite, false, 0, kDefaultPkey, qp->dest_qpn, true, psn);
        put64(hdr + kBthLen, w.remote_addr);
        put32(hdr + kBthLen + 8, w.rkey);
        put32(hdr + kBthLen + 12, 8);
        iovec iov{w.atomic_data, 8};
        nic->queue(tx, qp->dest_addr, hdr, kBthLen + kRethLen, &iov, 1, 8);
        return;
    }
    uint8_t op = send_write_opcode(w, i);
    const OpInfo &info = op_info(op);
    bool last = info.flags & kOpLast;
    bool ackreq = last || ++qp->pkts_since_ackreq >= kAckReqEvery;
    if (ackreq) qp->pkts_since_ackreq = 0;
    bool se = last && (w.flags & IBV_SEND_SOLICITED);
    bth::build(hdr, op, se, 0, kDefaultPkey, qp->dest_qpn, ackreq, psn);
    if (info.reth) {
        put64(hdr + info.reth, w.remote_addr);
        put32(hdr + info.reth + 8, w.rkey);
        put32(hdr + info.reth + 12, w.length);
    }
    if (info.ceth) {
        hdr[info.ceth] =
            uint8_t(((w.commit_flags & IBV_WRITE_COMMIT_ORDERED) ? ceth::kOrdered : 0) |
                    ((w.commit_flags & kCommitImmFlag) ? ceth::kImmed : 0) |
                    ((w.commit_flags & IBV_WRITE_COMMIT_GLOBAL) ? ceth::kGlobal : 0));
        hdr[info.ceth + 1] = hdr[info.ceth + 2] = hdr[info.ceth + 3] = 0;
    }
    if (info.immdt) std::memcpy(hdr + info.immdt, &w.imm, 4); // already network order
    uint32_t off = i * qp->mtu;
    uint32_t len = std::min(qp->mtu, w.length - std::min(w.length, off));
    iovec iov[kMaxSge];
    int n = gather(w, off, len, iov);
    nic->queue(tx, qp->dest_addr, hdr, info.hdr_len, iov, n, len);
}

} // namespace

void req_arm_timer(Qp *qp) {
    if (wire::psn_diff(qp->next_psn, qp->una_psn) > 0 && qp->timeout)
        qp->timer_deadline_ns = now_ns() + timeout_ns(qp->timeout);
    else
        qp->timer_deadline_ns = 0;
}

void req_run(Qp *qp, TxBatch &tx) {
    if (qp->state != IBV_QPS_RTS || qp->rnr_deadline_ns) return;
    uint32_t cap = qp->max_send_wr;
    bool sent = false;
    while (qp->sq_cur != qp->sq_head) {
        SendWqe &w = qp->sq[qp->sq_cur % cap];
        if (w.done) {
            qp->sq_cur++;
            continue;
        }
        if (!w.started) {
            if (w.status != IBV_WC_SUCCESS) {
                // A WQE that failed local checks completes in order, once
                // everything before it has.
                if (qp->sq_tail != qp->sq_cur) break;
                w.started = true;
                w.done = true;
                complete_send(qp, w, w.status);
                // Retired here, or the flush below would complete it twice.
                qp->sq_tail++;
                qp_enter_error(qp);
                return;
            }
            if ((w.flags & IBV_SEND_FENCE) && qp->rd_outstanding) break;
            if (needs_credit(w) && qp->rd_outstanding >= qp->max_rd_atomic) break;
            if (wire::psn_diff(qp->next_psn, qp->una_psn) >= kWindow) break;
            w.first_psn = qp->next_psn;
            // Atomics, FLUSH and ATOMIC WRITE take one PSN; a READ one per
            // response packet; SEND/WRITE one per packet.
            bool single = wr_needs_response(w.opcode) && !is_read(w);
            w.npkts = single ? 1 : std::max(1u, div_up(w.length, qp->mtu));
            w.sent_pkts = 0;
            w.read_next = 0;
            w.started = true;
            qp->next_psn = wire::psn_add(qp->next_psn, w.npkts);
            if (needs_credit(w)) qp->rd_outstanding++;
        }
        if (needs_credit(w)) {
            if (w.sent_pkts == 0) {
                send_packet(qp, w, w.read_next, tx);
                w.sent_pkts = 1;
                sent = true;
            }
        } else {
            while (w.sent_pkts < w.npkts) {
                uint32_t psn = wire::psn_add(w.first_psn, w.sent_pkts);
                if (wire::psn_diff(psn, qp->una_psn) >= kWindow) goto out;
                send_packet(qp, w, w.sent_pkts, tx);
                w.sent_pkts++;
                sent = true;
            }
        }
        qp->sq_cur++;
    }
out:
    if (sent && !qp->timer_deadline_ns) req_arm_timer(qp);
}

void req_rewind(Qp *qp, uint32_t psn) {
    uint32_t cap = qp->max_send_wr;
    for (uint32_t i = qp->sq_tail; i != qp->sq_head; i++) {
        SendWqe &w = qp->sq[i % cap];
        if (!w.started) break;
        if (w.done) continue;
        int32_t d = wire::psn_diff(psn, w.first_psn);
        if (d >= 0 && uint32_t(d) < w.npkts) {
            if (needs_credit(w)) {
                w.read_next = std::max(w.read_next, uint32_t(d));
                w.sent_pkts = 0;
            } else {
                w.sent_pkts = uint32_t(d);
            }
            for (uint32_t j = i + 1; j != qp->sq_head; j++) {
                SendWqe &x = qp->sq[j % cap];
                if (!x.started) break;
                x.sent_pkts = 0;
            }
            qp->sq_cur = i;
            qp->nic->stats.retransmits.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (d < 0) break;
    }
}

void req_timers(Qp *qp, TxBatch &tx, uint64_t now) {
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) return;
    if (qp->rnr_deadline_ns && now >= qp->rnr_deadline_ns) {
        qp->rnr_deadline_ns = 0;
        req_rewind(qp, qp->una_psn);
        req_run(qp, tx);
        req_arm_timer(qp);
        return;
    }
    if (qp->timer_deadline_ns && now >= qp->timer_deadline_ns) {
        qp->nic->stats.timeouts.fetch_add(1, std::memory_order_relaxed);
        if (qp->retries_left == 0) {
            SendWqe &w = qp->sq[qp->sq_tail % qp->max_send_wr];
            w.done = true;
            complete_send(qp, w, IBV_WC_RETRY_EXC_ERR);
            qp->sq_tail++;
            qp_enter_error(qp);
            return;
        }
        qp->retries_left--;
        req_rewind(qp, qp->una_psn);
        req_run(qp, tx);
        req_arm_timer(qp);
    }
}

bool req_fill_sges(Qp *qp, SendWqe &w, const ibv_sge *sg, size_t n) {
    if (n > qp->max_send_sge) return false;
    bool atomic = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    unsigned need = w.opcode == IBV_WR_RDMA_READ || atomic ? IBV_ACCESS_LOCAL_WRITE : 0;
    uint64_t total = 0;
    w.num_sge = uint32_t(n);
    for (size_t i = 0; i < n; i++) {
        const ibv_sge &s = sg[i];
        Mr *mr = qp->nic->mrs.lookup(s.lkey);
        uint8_t *host = nullptr;
        if (mr && mr->pd == reinterpret_cast<Pd *>(qp->qpx.qp_base.pd))
            host = mr_range(mr, s.addr, s.length, need);
        if (!host && s.length) w.status = IBV_WC_LOC_PROT_ERR;
        w.sge[i] = {uintptr_t(host), s.length, s.lkey};
        total += s.length;
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
    uint32_t off = 0;
    for (uint32_t i = 0; i < w.num_sge; i++) {
        if (w.sge[i].length && w.sge[i].addr)
            std::memcpy(w.atomic_data + off, reinterpret_cast<void *>(uintptr_t(w.sge[i].addr)),
                        w.sge[i].length);
        off += w.sge[i].length;
    }
    w.num_sge = 0;
    return true;
}

bool req_fill_inline(Qp *qp, SendWqe &w, uint32_t slot, const ibv_data_buf *bufs, size_t n) {
    if (w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
        w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
        return false;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += bufs[i].length;
    if (total > qp->max_inline) return false;
    // data(), not operator[]: with max_inline_data 0 the pool is empty and
    // only zero-length inline sends get here.
    uint8_t *buf = qp->sq_inline.data() + size_t(slot) * qp->max_inline;
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
    SendWqe &w = qp->sq[slot];
    w = SendWqe{};
    w.sge = &qp->sq_sge[size_t(slot) * qp->max_send_sge];
    w.wr_id = wr_id;
    w.opcode = op;
    w.flags = flags;
    w.signaled = qp->sq_sig_all || (flags & IBV_SEND_SIGNALED);
    return w;
}

void req_kick(Qp *qp) {
    if (qp->state == IBV_QPS_ERR) {
        qp_flush_queues(qp);
        return;
    }
    t_tx.order = &qp->tx_mu;
    req_run(qp, t_tx);
    t_tx.order = nullptr;
}

void send_and_unlock(Qp *qp, TxBatch &tx, std::unique_lock<std::mutex> &held) {
    if (!tx.n) {
        held.unlock();
        return;
    }
    std::lock_guard<std::mutex> t(qp->tx_mu);
    held.unlock();
    qp->nic->flush(tx);
}

void req_send_and_unlock(Qp *qp) {
    std::unique_lock<std::mutex> held(qp->mu, std::adopt_lock);
    send_and_unlock(qp, t_tx, held);
}

int req_post_send(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    std::unique_lock<std::mutex> g(qp->mu);
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
        *bad_wr = wr;
        return EINVAL;
    }
    uint32_t cap = qp->max_send_wr;
    int err = 0;
    // The WRs before a refused one stay posted and must be started, so every
    // error leaves the loop through the kick below.
    for (; wr; wr = wr->next) {
        if (qp->sq_head - qp->sq_tail >= cap) {
            err = ENOMEM;
            break;
        }
        bool atomic = false;
        switch (wr->opcode) {
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            atomic = true;
            break;
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
        case IBV_WR_ATOMIC_WRITE:
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
        uint32_t slot = qp->sq_head % cap;
        SendWqe &w = req_new_wqe(qp, slot, wr->wr_id, wr->opcode, wr->send_flags);
        w.imm = wr->imm_data;
        if (atomic) {
            w.remote_addr = wr->wr.atomic.remote_addr;
            w.rkey = wr->wr.atomic.rkey;
            w.compare_add = wr->wr.atomic.compare_add;
            w.swap = wr->wr.atomic.swap;
        } else {
            w.remote_addr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
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
        if (!ok) {
            err = EINVAL;
            break;
        }
        qp->sq_head++;
    }
    if (err) *bad_wr = wr;
    req_kick(qp);
    send_and_unlock(qp, t_tx, g);
    return err;
}

} // namespace sroce
