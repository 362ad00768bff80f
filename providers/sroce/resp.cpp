// Responder: PSN checks, validation against the MR table, execution of
// SEND/WRITE/READ/ATOMIC, duplicate handling through responder resources,
// ACK coalescing and NAKs.
#include "transport.hpp"

#include <algorithm>
#include <cstring>

namespace sroce {
namespace {

using namespace wire;

void send_aeth(Qp *qp, TxBatch &tx, uint8_t syndrome, uint32_t psn) {
    uint8_t hdr[kBthLen + kAethLen];
    bth::build(hdr, kAcknowledge, false, 0, kDefaultPkey, qp->dest_qpn, false, psn);
    aeth::build(hdr + kBthLen, syndrome, qp->msn);
    qp->nic->queue(tx, qp->dest_addr, hdr, sizeof hdr, nullptr, 0, 0);
}

void send_nak(Qp *qp, TxBatch &tx, uint8_t code, uint32_t psn) {
    qp->ack_pending = false;
    send_aeth(qp, tx, aeth::kNak | code, psn);
}

// Class C/D errors: NAK, then the responder QP enters the error state.
void fatal_nak(Qp *qp, TxBatch &tx, uint8_t code, uint32_t psn) {
    send_nak(qp, tx, code, psn);
    if (qp->recv_taken) {
        RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
        complete_recv(qp, r,
                      code == aeth::kNakInvalidRequest ? IBV_WC_REM_INV_REQ_ERR
                                                       : IBV_WC_REM_ACCESS_ERR,
                      IBV_WC_RECV, 0, 0, false);
        qp->rq_tail++;
        qp->recv_taken = false;
    }
    qp_enter_error(qp);
    post_async_event(qp, code == aeth::kNakInvalidRequest      ? IBV_EVENT_QP_REQ_ERR
                         : code == aeth::kNakRemoteAccessError ? IBV_EVENT_QP_ACCESS_ERR
                                                               : IBV_EVENT_QP_FATAL);
}

void send_rnr(Qp *qp, TxBatch &tx, uint32_t psn) {
    qp->ack_pending = false;
    // The requester resends from `psn` after its back-off; the rest of its
    // burst is dropped without a sequence NAK, which would cost it a retry.
    qp->nak_sent = true;
    send_aeth(qp, tx, aeth::kRnrNak | (qp->min_rnr_timer & 0x1F), psn);
}

uint8_t *check_remote(Qp *qp, uint32_t rkey, uint64_t va, uint64_t len, unsigned access) {
    if (!(qp->access & access)) return nullptr;
    Mr *mr = qp->nic->mrs.lookup(rkey);
    if (!mr || mr->pd != reinterpret_cast<Pd *>(qp->qpx.qp_base.pd)) return nullptr;
    return mr_range(mr, va, len, access);
}

// Copies payload into the current receive WQE's scatter list.
bool place_recv(Qp *qp, const uint8_t *src, uint32_t len) {
    RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
    uint32_t off = qp->msg_offset;
    if (uint64_t(off) + len > r.length) return false;
    for (uint32_t i = 0; i < r.num_sge && len; i++) {
        ibv_sge &s = r.sge[i];
        if (off >= s.length) {
            off -= s.length;
            continue;
        }
        uint32_t take = std::min(s.length - off, len);
        std::memcpy(reinterpret_cast<uint8_t *>(uintptr_t(s.addr)) + off, src, take);
        src += take;
        len -= take;
        off = 0;
    }
    return true;
}

void send_read_responses(Qp *qp, TxBatch &tx, uint32_t psn, const uint8_t *src, uint32_t len) {
    uint32_t n = std::max(1u, (len + qp->mtu - 1) / qp->mtu);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t op = n == 1       ? kReadRespOnly
                     : i == 0     ? kReadRespFirst
                     : i + 1 == n ? kReadRespLast
                                  : kReadRespMiddle;
        const OpInfo &info = op_info(op);
        uint8_t hdr[kBthLen + kAethLen];
        bth::build(hdr, op, false, 0, kDefaultPkey, qp->dest_qpn, false, psn_add(psn, i));
        if (info.aeth) aeth::build(hdr + info.aeth, aeth::kAck | aeth::kNoCredits, qp->msn);
        uint32_t off = i * qp->mtu;
        uint32_t plen = std::min(qp->mtu, len - off);
        iovec iov{const_cast<uint8_t *>(src) + off, plen};
        qp->nic->queue(tx, qp->dest_addr, hdr, info.hdr_len, &iov, plen ? 1 : 0, plen);
    }
}

void send_atomic_ack(Qp *qp, TxBatch &tx, uint32_t psn, uint64_t orig) {
    uint8_t hdr[kBthLen + kAethLen + kAtomicAckEthLen];
    bth::build(hdr, kAtomicAcknowledge, false, 0, kDefaultPkey, qp->dest_qpn, false, psn);
    aeth::build(hdr + kBthLen, aeth::kAck | aeth::kNoCredits, qp->msn);
    put64(hdr + kBthLen + kAethLen, orig);
    qp->nic->queue(tx, qp->dest_addr, hdr, sizeof hdr, nullptr, 0, 0);
}

// Dirty ranges: what a later commit on this QP must make durable.  Bounded,
// so no allocation per packet: past kMaxDirty ranges they merge (a commit
// then persists a little more than it must) or the oldest is persisted now.
constexpr size_t kMaxDirty = 32;

int persist_entry(Qp *qp, const DirtyRange &d) {
    Mr *mr = qp->nic->mrs.lookup(d.rkey);
    if (!mr) return 0; // deregistered: nothing left to make durable
    return persist_range(mr->cls, reinterpret_cast<const void *>(uintptr_t(d.lo)), d.hi - d.lo);
}

// Returns false when a range had to be made durable early and could not be:
// the data it covers can no longer be promised, so the caller fails the QP.
[[nodiscard]] bool note_dirty(Qp *qp, uint32_t rkey, const uint8_t *p, uint32_t len) {
    uint64_t lo = uintptr_t(p), hi = lo + len;
    DirtyRange *same = nullptr;
    for (DirtyRange &d : qp->dirty) {
        if (d.rkey != rkey) continue;
        if (lo <= d.hi && hi >= d.lo) {
            d.lo = std::min(d.lo, lo);
            d.hi = std::max(d.hi, hi);
            return true;
        }
        same = &d;
    }
    if (qp->dirty.size() < kMaxDirty) {
        qp->dirty.push_back({rkey, lo, hi});
    } else if (same) {
        same->lo = std::min(same->lo, lo);
        same->hi = std::max(same->hi, hi);
    } else {
        if (persist_entry(qp, qp->dirty.front())) return false;
        qp->dirty.front() = {rkey, lo, hi};
    }
    return true;
}

// Makes every write to `rkey` placed so far durable.  Returns 0 or an errno.
int persist_dirty(Qp *qp, uint32_t rkey) {
    int err = 0;
    for (size_t i = 0; i < qp->dirty.size();) {
        if (qp->dirty[i].rkey != rkey) {
            i++;
            continue;
        }
        if (int e = persist_entry(qp, qp->dirty[i])) err = e;
        qp->dirty[i] = qp->dirty.back();
        qp->dirty.pop_back();
    }
    if (!err) visibility_fence();
    return err;
}

void forget_dirty(Qp *qp, uint32_t rkey) {
    std::erase_if(qp->dirty, [rkey](const DirtyRange &d) { return d.rkey == rkey; });
}

Mr *lookup_mr(Qp *qp, uint32_t rkey) {
    Mr *mr = qp->nic->mrs.lookup(rkey);
    return (mr && mr->pd == reinterpret_cast<Pd *>(qp->qpx.qp_base.pd)) ? mr : nullptr;
}

RdResource *find_resource(Qp *qp, uint32_t psn) {
    for (RdResource &r : qp->rd_res) {
        if (!r.valid) continue;
        int32_t d = psn_diff(psn, r.first_psn);
        if (d >= 0 && psn_diff(psn, r.last_psn) <= 0) return &r;
    }
    return nullptr;
}

RdResource &new_resource(Qp *qp) {
    RdResource &r = qp->rd_res[qp->rd_res_next];
    qp->rd_res_next = (qp->rd_res_next + 1) % uint32_t(qp->rd_res.size());
    r = RdResource{};
    r.valid = true;
    return r;
}

void duplicate(Qp *qp, const Packet &pkt, TxBatch &tx) {
    uint16_t f = pkt.info->flags;
    if (f & (kOpSend | kOpWrite)) {
        // The ACK was lost: acknowledge again up to what we have received.
        if (pkt.ackreq || (f & kOpLast)) {
            qp->ack_pending = true;
            qp->ack_psn = psn_add(qp->epsn, kPsnMask);
        }
        return;
    }
    RdResource *r = find_resource(qp, pkt.psn);
    if (!r) return;
    if (f & kOpRead) {
        // Reads are idempotent: serve the (possibly partial) re-request again.
        if (r->atomic || r->ack_only) return;
        uint64_t va = pkt.va();
        uint32_t len = pkt.dma_len();
        uint8_t *src = len ? check_remote(qp, r->rkey, va, len, IBV_ACCESS_REMOTE_READ) : nullptr;
        if (len && (!src || pkt.rkey() != r->rkey)) return;
        send_read_responses(qp, tx, pkt.psn, src, len);
        return;
    }
    if ((f & kOpAtomic) && r->atomic && r->first_psn == pkt.psn)
        send_atomic_ack(qp, tx, pkt.psn, r->orig); // never executed twice
    if ((f & (kOpFlush | kOpAtomicWrite)) && r->ack_only && r->first_psn == pkt.psn)
        send_read_responses(qp, tx, pkt.psn, nullptr, 0); // nor are these
}

// FLUSH (IBTA A19): QP access decides Invalid Request, MR access Remote
// Access; every write before it in PSN order is already placed, so making
// the range durable covers all of them.
void do_flush(Qp *qp, const Packet &pkt, TxBatch &tx) {
    uint32_t feth = pkt.feth();
    unsigned type = feth & 0xF, level = (feth >> 4) & 0x3;
    unsigned need = ((type & IBV_FLUSH_GLOBAL) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL) : 0u) |
                    ((type & IBV_FLUSH_PERSISTENT) ? unsigned(IBV_ACCESS_FLUSH_PERSISTENT) : 0u);
    if (!type || (type & ~3u) || level > IBV_FLUSH_MR || (feth >> 6) ||
        (qp->access & need) != need) {
        fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
        return;
    }
    Mr *mr = qp->nic->mrs.lookup(pkt.rkey());
    if (!mr || mr->pd != reinterpret_cast<Pd *>(qp->qpx.qp_base.pd)) {
        fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
        return;
    }
    uint64_t va = level == IBV_FLUSH_MR ? mr->iova : pkt.va();
    uint64_t len = level == IBV_FLUSH_MR ? mr->length : pkt.dma_len();
    uint8_t *p = mr_range(mr, va, len, need);
    if (!p && (len || (mr->access & need) != need)) {
        fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
        return;
    }
    int err = 0;
    if ((type & IBV_FLUSH_PERSISTENT) && len)
        err = persist_range(mr->cls, p, len);
    else
        visibility_fence();
    if (err) {
        fatal_nak(qp, tx, aeth::kNakRemoteOpError, pkt.psn);
        return;
    }
    // A persistent FLUSH of the whole MR leaves nothing of it dirty.
    if ((type & IBV_FLUSH_PERSISTENT) && level == IBV_FLUSH_MR) forget_dirty(qp, mr->ibmr.rkey);
    RdResource &r = new_resource(qp);
    r.ack_only = true;
    r.first_psn = r.last_psn = pkt.psn;
    qp->msn = (qp->msn + 1) & 0xFFFFFF;
    qp->ack_pending = false;
    send_read_responses(qp, tx, pkt.psn, nullptr, 0);
    qp->epsn = psn_add(pkt.psn, 1);
}

// ATOMIC WRITE (IBTA A19): one naturally aligned 64-bit store, ordered after
// the writes before it, durable only through a later FLUSH.
void do_atomic_write(Qp *qp, const Packet &pkt, TxBatch &tx) {
    uint64_t va = pkt.va();
    if ((va & 7) || pkt.dma_len() != 8 || pkt.payload_len != 8) {
        fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
        return;
    }
    uint8_t *p = check_remote(qp, pkt.rkey(), va, 8, IBV_ACCESS_REMOTE_WRITE);
    if (!p) {
        fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
        return;
    }
    uint64_t v;
    std::memcpy(&v, pkt.payload, 8);
    __atomic_store_n(reinterpret_cast<uint64_t *>(p), v, __ATOMIC_RELEASE);
    // A later commit to this rkey must make the word durable too.
    if (Mr *mr = lookup_mr(qp, pkt.rkey());
        mr && mr->cls != MemClass::kVolatile && !note_dirty(qp, pkt.rkey(), p, 8)) {
        fatal_nak(qp, tx, aeth::kNakRemoteOpError, pkt.psn);
        return;
    }
    RdResource &r = new_resource(qp);
    r.ack_only = true;
    r.first_psn = r.last_psn = pkt.psn;
    qp->msn = (qp->msn + 1) & 0xFFFFFF;
    qp->ack_pending = false;
    send_read_responses(qp, tx, pkt.psn, nullptr, 0);
    qp->epsn = psn_add(pkt.psn, 1);
}

} // namespace

void resp_flush_ack(Qp *qp, TxBatch &tx) {
    if (!qp->ack_pending) return;
    qp->ack_pending = false;
    send_aeth(qp, tx, aeth::kAck | aeth::kNoCredits, qp->ack_psn);
}

int resp_post_recv(Qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    std::lock_guard<std::mutex> g(qp->mu);
    if (qp->state == IBV_QPS_RESET) {
        *bad_wr = wr;
        return EINVAL;
    }
    uint32_t cap = qp->max_recv_wr;
    for (; wr; wr = wr->next) {
        if (qp->rq_head - qp->rq_tail >= cap) {
            *bad_wr = wr;
            return ENOMEM;
        }
        if (wr->num_sge < 0 || uint32_t(wr->num_sge) > qp->max_recv_sge) {
            *bad_wr = wr;
            return EINVAL;
        }
        uint32_t slot = qp->rq_head % cap;
        RecvWqe &r = qp->rq[slot];
        r.wr_id = wr->wr_id;
        r.sge = &qp->rq_sge[size_t(slot) * qp->max_recv_sge];
        r.num_sge = uint32_t(wr->num_sge);
        r.length = 0;
        r.bad = false;
        bool bad = false;
        for (int i = 0; i < wr->num_sge; i++) {
            const ibv_sge &s = wr->sg_list[i];
            Mr *mr = qp->nic->mrs.lookup(s.lkey);
            uint8_t *host = nullptr;
            if (mr && mr->pd == reinterpret_cast<Pd *>(qp->qpx.qp_base.pd))
                host = mr_range(mr, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE);
            if (!host && s.length) bad = true;
            r.sge[i] = {uintptr_t(host), s.length, s.lkey};
            r.length += s.length;
        }
        if (bad) {
            // Reported as a completion in order, like a hardware RNIC would.
            r.num_sge = 0;
            r.length = 0;
            r.bad = true;
        }
        qp->rq_head++;
        if (qp->state == IBV_QPS_ERR) qp_flush_queues(qp);
    }
    return 0;
}

void resp_receive(Qp *qp, const Packet &pkt, TxBatch &tx) {
    int32_t d = psn_diff(pkt.psn, qp->epsn);
    if (d > 0) {
        // Go-back-N: one NAK per gap, then drop until the expected PSN returns.
        if (!qp->nak_sent) {
            qp->nak_sent = true;
            send_nak(qp, tx, aeth::kNakPsnSeqError, qp->epsn);
        }
        return;
    }
    if (d < 0) {
        duplicate(qp, pkt, tx);
        return;
    }
    qp->nak_sent = false;
    uint16_t f = pkt.info->flags;

    // A multi-packet message must continue with MIDDLE/LAST of the same kind.
    if (qp->in_msg) {
        if (!(f & qp->in_msg) || (f & kOpFirst)) {
            fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
            return;
        }
    } else if ((f & (kOpSend | kOpWrite)) && !(f & kOpFirst)) {
        fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
        return;
    }
    bool last = f & kOpLast;
    // Every packet but a message's last carries exactly one path MTU.
    if ((f & (kOpSend | kOpWrite)) && !last && pkt.payload_len != qp->mtu) {
        fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
        return;
    }
    if (pkt.payload_len > qp->mtu) {
        fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
        return;
    }

    if (f & kOpSend) {
        if (f & kOpFirst) {
            if (qp->rq_head == qp->rq_tail) {
                send_rnr(qp, tx, pkt.psn);
                return;
            }
            qp->recv_taken = true;
            qp->msg_offset = 0;
            RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
            // A WQE without SGEs is a valid zero-length receive; only one
            // whose SGEs failed their checks is refused here.
            if (r.bad && pkt.payload_len) {
                fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
                return;
            }
        }
        if (!place_recv(qp, pkt.payload, pkt.payload_len)) {
            RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
            complete_recv(qp, r, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, false);
            qp->rq_tail++;
            qp->recv_taken = false;
            fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
            return;
        }
        qp->msg_offset += pkt.payload_len;
        if (last) {
            RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
            bool imm = pkt.info->hdrs & kHasImmDt;
            __be32 immv = 0;
            if (imm) std::memcpy(&immv, pkt.hdr + pkt.info->immdt, 4);
            complete_recv(qp, r, IBV_WC_SUCCESS, IBV_WC_RECV, qp->msg_offset, immv, imm, pkt.se);
            qp->rq_tail++;
            qp->recv_taken = false;
            qp->in_msg = 0;
            qp->msn = (qp->msn + 1) & 0xFFFFFF;
        } else {
            qp->in_msg = kOpSend;
        }
    } else if (f & kOpWrite) {
        bool imm = pkt.info->hdrs & kHasImmDt;
        bool commit = f & kOpCommit;
        if (f & kOpFirst) {
            uint8_t ce = commit ? pkt.ceth() : 0;
            // Check a receive WQE is there before placing anything.
            if ((imm || (ce & ceth::kImmed)) && qp->rq_head == qp->rq_tail) {
                send_rnr(qp, tx, pkt.psn);
                return;
            }
            uint32_t len = pkt.dma_len();
            unsigned access = IBV_ACCESS_REMOTE_WRITE;
            if (commit) {
                // The same access rules as the IBTA FLUSH a non-native peer
                // would send: QP access decides Invalid Request, MR access
                // Remote Access Error.
                unsigned need = (ce & ceth::kGlobal) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL)
                                                     : unsigned(IBV_ACCESS_FLUSH_PERSISTENT);
                // IMMED must agree with the opcode that ends the message
                // (ONLY_WITH_IMMEDIATE carries both), and reserved bits are 0.
                bool bad_imm = (f & kOpLast) && bool(ce & ceth::kImmed) != imm;
                if ((ce & ~(ceth::kOrdered | ceth::kImmed | ceth::kGlobal)) || bad_imm ||
                    get24(pkt.hdr + pkt.info->ceth + 1) != 0 || (qp->access & need) != need) {
                    fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
                    return;
                }
                access |= need;
            }
            Mr *mr = lookup_mr(qp, pkt.rkey());
            uint8_t *dst = nullptr;
            if (len || commit) {
                dst = (mr && (qp->access & IBV_ACCESS_REMOTE_WRITE))
                          ? mr_range(mr, pkt.va(), len, access)
                          : nullptr;
                if (!dst) {
                    fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
                    return;
                }
            }
            // ORDERED: what was written to this rkey before becomes durable
            // before this write's data is placed.
            if ((ce & ceth::kOrdered) && persist_dirty(qp, pkt.rkey())) {
                fatal_nak(qp, tx, aeth::kNakRemoteOpError, pkt.psn);
                return;
            }
            qp->write_ptr = dst;
            qp->write_remaining = len;
            qp->msg_offset = 0;
            qp->write_rkey = pkt.rkey();
            qp->write_tracked = mr && mr->cls != MemClass::kVolatile;
            qp->write_uncached = mr && mr->uncached;
            qp->commit_ceth = ce;
        } else if (bool(qp->in_msg_commit) != commit) {
            fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
            return;
        }
        if (pkt.payload_len > qp->write_remaining) {
            fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
            return;
        }
        if (last && imm && qp->rq_head == qp->rq_tail) {
            send_rnr(qp, tx, pkt.psn);
            return;
        }
        if (pkt.payload_len) {
            if (qp->write_uncached)
                copy_nontemporal(qp->write_ptr, pkt.payload, pkt.payload_len);
            else
                std::memcpy(qp->write_ptr, pkt.payload, pkt.payload_len);
            if (qp->write_tracked &&
                !note_dirty(qp, qp->write_rkey, qp->write_ptr, pkt.payload_len)) {
                fatal_nak(qp, tx, aeth::kNakRemoteOpError, pkt.psn);
                return;
            }
        }
        qp->write_ptr += pkt.payload_len;
        qp->write_remaining -= pkt.payload_len;
        qp->msg_offset += pkt.payload_len;
        if (last) {
            if (qp->write_remaining) {
                fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
                return;
            }
            // The commit point: this write and every earlier one to the rkey
            // are durable before the ACK (and the immediate) can go out.
            if (commit && bool(qp->commit_ceth & ceth::kImmed) != imm) {
                fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
                return;
            }
            if (commit) {
                int err = (qp->commit_ceth & ceth::kGlobal) ? (visibility_fence(), 0)
                                                            : persist_dirty(qp, qp->write_rkey);
                if (err) {
                    fatal_nak(qp, tx, aeth::kNakRemoteOpError, pkt.psn);
                    return;
                }
            }
            if (imm) {
                RecvWqe &r = qp->rq[qp->rq_tail % qp->max_recv_wr];
                __be32 immv;
                std::memcpy(&immv, pkt.hdr + pkt.info->immdt, 4);
                // After a commit the immediate, not a length, says what is
                // durable; byte_len is 0 as with the IBTA sequence's final
                // zero-length WRITE WITH IMMEDIATE, so both paths look alike.
                complete_recv(qp, r, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
                              commit ? 0 : qp->msg_offset, immv, true, pkt.se);
                qp->rq_tail++;
            }
            qp->in_msg = 0;
            qp->in_msg_commit = false;
            qp->msn = (qp->msn + 1) & 0xFFFFFF;
        } else {
            qp->in_msg = kOpWrite;
            qp->in_msg_commit = commit;
        }
    } else if (f & kOpRead) {
        uint32_t len = pkt.dma_len();
        uint8_t *src = nullptr;
        if (len) {
            src = check_remote(qp, pkt.rkey(), pkt.va(), len, IBV_ACCESS_REMOTE_READ);
            if (!src) {
                fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
                return;
            }
        }
        uint32_t n = std::max(1u, (len + qp->mtu - 1) / qp->mtu);
        RdResource &r = new_resource(qp);
        r.first_psn = pkt.psn;
        r.last_psn = psn_add(pkt.psn, n - 1);
        r.va = pkt.va();
        r.rkey = pkt.rkey();
        r.length = len;
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
        qp->ack_pending = false; // the responses acknowledge everything before
        send_read_responses(qp, tx, pkt.psn, src, len);
        qp->epsn = psn_add(pkt.psn, n);
        return;
    } else if (f & kOpAtomic) {
        uint64_t va = pkt.atomic_va();
        if (va & 7) {
            fatal_nak(qp, tx, aeth::kNakInvalidRequest, pkt.psn);
            return;
        }
        uint8_t *p = check_remote(qp, pkt.atomic_rkey(), va, 8, IBV_ACCESS_REMOTE_ATOMIC);
        if (!p) {
            fatal_nak(qp, tx, aeth::kNakRemoteAccessError, pkt.psn);
            return;
        }
        auto *word = reinterpret_cast<uint64_t *>(p);
        uint64_t orig;
        if (pkt.opcode == kCompareSwap) {
            orig = pkt.compare();
            __atomic_compare_exchange_n(word, &orig, pkt.swap_add(), false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        } else {
            orig = __atomic_fetch_add(word, pkt.swap_add(), __ATOMIC_SEQ_CST);
        }
        RdResource &r = new_resource(qp);
        r.atomic = true;
        r.first_psn = r.last_psn = pkt.psn;
        r.orig = orig;
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
        qp->ack_pending = false;
        send_atomic_ack(qp, tx, pkt.psn, orig);
        qp->epsn = psn_add(pkt.psn, 1);
        return;
    } else if (f & kOpFlush) {
        do_flush(qp, pkt, tx);
        return;
    } else {
        do_atomic_write(qp, pkt, tx);
        return;
    }
    qp->epsn = psn_add(pkt.psn, 1);
    if (pkt.ackreq) {
        qp->ack_pending = true;
        qp->ack_psn = pkt.psn;
    }
}

} // namespace sroce
