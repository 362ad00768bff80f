// SPDX-License-Identifier: MIT
//
// Responder: every request packet goes through a chain of small checks
// (transport, PSN, opcode sequence, opcode validity, receive resources,
// length, rkey) that each either pass it on or name an outcome; execution
// and acknowledgement follow; one table maps the failing outcomes to the
// NAK, the receive completion and the async event.  Per-transport rules
// (RC, UC, UD, XRC) live in the checks, not in the execution.
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>

namespace sroce {
namespace {

using namespace wire;

// What a stage decided about a packet.
enum class Outcome : uint8_t {
    kNext,           // go on to the next stage
    kDone,           // handled completely
    kDrop,           // discarded without a trace (UC/UD rules, stale packets)
    kDuplicate,      // RC: an earlier PSN: re-acknowledge or replay
    kPsnGap,         // RC: a later PSN: one sequence NAK per gap
    kRnr,            // RC: no receive WQE: RNR NAK
    kInvalidRequest, // class C error
    kRemoteAccess,   // rkey, range or access violation
    kRemoteOp,       // the operation could not be carried out (persistence failed)
    kRecvLength,     // the message does not fit the receive WQE
    kRecvProtection, // the receive WQE's lkeys do not name its memory
};

// How an error outcome is reported.  RC: NAK, then the QP enters the
// error state with the async event; UC and UD report nothing to the sender
// and stay operational: a receive WQE the message had taken completes with
// `recv_status` (the length case) or is reused for the next message.
struct ErrorAction {
    uint8_t nak;
    ibv_wc_status recv_status;
    ibv_event_type event;
};

constexpr ErrorAction error_action(Outcome o) {
    switch (o) {
    case Outcome::kRemoteAccess:
        return {aeth::kNakRemoteAccessError, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR};
    case Outcome::kRemoteOp:
        return {aeth::kNakRemoteOpError, IBV_WC_REM_OP_ERR, IBV_EVENT_QP_FATAL};
    case Outcome::kRecvLength:
        return {aeth::kNakInvalidRequest, IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR};
    case Outcome::kRecvProtection:
        return {aeth::kNakRemoteOpError, IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_FATAL};
    default:
        return {aeth::kNakInvalidRequest, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR};
    }
}

// One packet on its way through the stages.
struct Rx {
    Qp *qp;
    const Packet &pkt;
    TxBatch &tx;
    uint8_t op; // the RC opcode of the operation (UC/XRC mapped)
    uint16_t f; // its OpFlags
    Pd *pd;     // protection domain for memory checks (an XRC SRQ's for XRC)
    Srq *srq;   // where SENDs take receive WQEs (nullptr: the QP's queue)
    Mr *mr = nullptr;
    uint8_t *mem = nullptr; // checked target/source of an RDMA operation
    unsigned need = 0;      // the access `mem` was checked for
    uint64_t epoch = 0;     // the key table's epoch when it was
    uint32_t n_resp = 1;    // READ: response packets
    uint64_t orig = 0;      // ATOMIC: the original value
};

Responder &R(Rx &rx) {
    return rx.qp->resp;
}

// ---------------------------------------------------------------------------
// Packets to the requester

void send_aeth(Qp *qp, TxBatch &tx, uint8_t syndrome, uint32_t psn) {
    uint8_t hdr[kBthLen + kAethLen];
    bth::build(hdr, qp->is_xrc() ? kXrcBase | kAcknowledge : kAcknowledge, false, 0, kDefaultPkey,
               qp->attr.dest_qpn, false, psn);
    bth::announce(hdr, qp->announce);
    aeth::build(hdr + kBthLen, syndrome, qp->resp.msn);
    qp->nic->queue(tx, qp->attr.src_addr, qp->attr.dest_addr, ip_fields(qp->attr.ah.grh), hdr,
                   sizeof hdr, nullptr, 0, 0);
}

void send_read_responses(Qp *qp, TxBatch &tx, uint32_t psn, const uint8_t *src, uint32_t len) {
    uint32_t mtu = qp->attr.mtu;
    uint32_t n = std::max(1u, (len + mtu - 1) / mtu);
    uint8_t xrc = qp->is_xrc() ? kXrcBase : 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t op = n == 1       ? kReadRespOnly
                     : i == 0     ? kReadRespFirst
                     : i + 1 == n ? kReadRespLast
                                  : kReadRespMiddle;
        const OpInfo &info = op_info(xrc | op);
        uint8_t hdr[kBthLen + kAethLen];
        bth::build(hdr, xrc | op, false, 0, kDefaultPkey, qp->attr.dest_qpn, false,
                   psn_add(psn, i));
        bth::announce(hdr, qp->announce);
        if (info.aeth) aeth::build(hdr + info.aeth, aeth::kAck | aeth::kNoCredits, qp->resp.msn);
        uint32_t off = i * mtu;
        uint32_t plen = std::min(mtu, len - off);
        iovec iov{const_cast<uint8_t *>(src) + off, plen};
        qp->nic->queue(tx, qp->attr.src_addr, qp->attr.dest_addr, ip_fields(qp->attr.ah.grh), hdr,
                       info.hdr_len, &iov, plen ? 1 : 0, plen, Nic::kQueueCopy);
    }
}

void send_atomic_ack(Qp *qp, TxBatch &tx, uint32_t psn, uint64_t orig) {
    uint8_t hdr[kBthLen + kAethLen + kAtomicAckEthLen];
    bth::build(hdr, qp->is_xrc() ? kXrcBase | kAtomicAcknowledge : kAtomicAcknowledge, false, 0,
               kDefaultPkey, qp->attr.dest_qpn, false, psn);
    bth::announce(hdr, qp->announce);
    aeth::build(hdr + kBthLen, aeth::kAck | aeth::kNoCredits, qp->resp.msn);
    put64(hdr + kBthLen + kAethLen, orig);
    qp->nic->queue(tx, qp->attr.src_addr, qp->attr.dest_addr, ip_fields(qp->attr.ah.grh), hdr,
                   sizeof hdr, nullptr, 0, 0);
}

// ---------------------------------------------------------------------------
// Receive WQEs

// What the tag-matching header (TMH) of a SEND to a tag-matching SRQ made of
// the message (Responder::tm_mode).
constexpr uint8_t kTmMsgNone = 0, // no tag matching
    kTmMsgNoTag = 1,              // NO_TAG: an ordinary receive
    kTmMsgMatched = 2,            // EAGER whose tag matched: the data go to the tag's buffer
    kTmMsgUnexpected = 3,         // EAGER or RNDV that matched no tag: an ordinary receive
    kTmMsgRndv = 4;               // RNDV whose tag matched: the data are READ from the sender
constexpr uint32_t kTmhLen = 16, kRvhLen = 16;

// Classifies a SEND to a tag-matching SRQ by its TMH and, for a matched tag,
// makes the tag's buffer the message's receive WQE.  True when the message
// still needs an ordinary WQE.
bool tm_classify(Rx &rx) {
    Responder &r = R(rx);
    const Packet &pkt = rx.pkt;
    r.tm_mode = kTmMsgNone;
    r.skip = 0;
    if (pkt.payload_len < kTmhLen) return true;
    const uint8_t *tmh = pkt.payload;
    uint8_t op = tmh[0];
    uint64_t tag = get64(tmh + 8);
    if (op == IBV_TMH_NO_TAG) {
        r.tm_mode = kTmMsgNoTag;
        return true;
    }
    bool rndv = op == IBV_TMH_RNDV && pkt.payload_len >= kTmhLen + kRvhLen;
    std::lock_guard<std::mutex> g(rx.srq->mu);
    if (op == IBV_TMH_EAGER || rndv) {
        for (Srq::Tag &t : rx.srq->tags) {
            if (!t.valid || (tag & t.mask) != (t.tag & t.mask)) continue;
            t.valid = false;
            r.tm_mode = rndv ? kTmMsgRndv : kTmMsgMatched;
            r.tm_tag = tag;
            r.tm_priv = get32(tmh + 4);
            r.recv = RecvWqe{t.wr_id, t.sge.length ? 1u : 0u, r.recv_sge, t.sge.length};
            r.recv_sge[0] = t.sge;
            r.recv_taken = true;
            r.recv_srq = rx.srq;
            r.recv_bad = false;
            r.recv_epoch = ~uint64_t(0); // checked when posted: again before placing
            if (rndv) {
                r.rvh_va = get64(tmh + kTmhLen);
                r.rvh_rkey = get32(tmh + kTmhLen + 8);
                r.rvh_len = get32(tmh + kTmhLen + 12);
                r.skip = UINT32_MAX; // the request itself is not placed
            } else {
                r.skip = kTmhLen;
            }
            return false;
        }
    }
    r.tm_mode = kTmMsgUnexpected;
    return true;
}

// Takes the next receive WQE for the message starting now, from the SRQ or
// the QP's own queue.  False when there is none.
bool take_recv(Rx &rx) {
    Responder &r = R(rx);
    if (r.recv_taken) return true; // UC: reused after a dropped message
    RecvQueue *q = &r.rq;
    std::unique_lock<std::mutex> g;
    if (rx.srq) {
        g = std::unique_lock<std::mutex>(rx.srq->mu);
        if (rx.srq->error) return false;
        q = &rx.srq->rq;
    }
    if (q->empty()) return false;
    RecvWqe &w = q->front();
    r.recv = w;
    r.recv.sge = r.recv_sge;
    // The lkeys are checked now, against the MRs as they are now.
    Pd *pd = rx.srq ? rx.srq->pd : rx.qp->pd;
    r.recv_bad = false;
    r.recv_epoch = rx.qp->nic->mrs.epoch();
    for (uint32_t i = 0; i < w.num_sge; i++) {
        uint8_t *host = check_lkey(rx.qp->nic, pd, w.sge[i], IBV_ACCESS_LOCAL_WRITE);
        if (!host && w.sge[i].length) r.recv_bad = true;
        r.recv_sge[i] = {uintptr_t(host), w.sge[i].length, w.sge[i].lkey};
    }
    q->tail++;
    r.recv_taken = true;
    r.recv_srq = rx.srq;
    if (rx.srq && rx.srq->limit && q->size() < rx.srq->limit) {
        // The limit is one-shot: ibv_modify_srq arms it again.
        rx.srq->limit = 0;
        ibv_async_event ev{};
        ev.element.srq = &rx.srq->ibsrq;
        ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
        rx.qp->ctx->post_event(ev);
    }
    return true;
}

void finish_recv(Qp *qp, ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len,
                 const Packet *pkt, bool solicited) {
    Responder &r = qp->resp;
    RecvCompletion c;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = byte_len;
    c.solicited = solicited;
    c.srq = r.recv_srq;
    if (pkt && (pkt->info->hdrs & kHasImmDt)) {
        std::memcpy(&c.imm, pkt->hdr + pkt->info->immdt, 4);
        c.wc_flags |= IBV_WC_WITH_IMM;
    }
    // ibv_wc.invalidated_rkey shares imm_data's bytes but is host order.
    if (pkt && (pkt->info->flags & kOpInv)) {
        c.imm = pkt->ieth();
        c.wc_flags |= IBV_WC_WITH_INV;
    }
    if (pkt && qp->type == IBV_QPT_UD) {
        c.src_qp = pkt->src_qpn();
        c.wc_flags |= IBV_WC_GRH;
        // RoCE has no SL; RNICs report in it the network header type of the
        // 40 bytes before the payload (wire.hpp), and UCX's UD transport
        // reads it to find the destination address there.  With the wrong
        // one it takes an IPv4 header for an IPv6 GID and drops every
        // datagram.
        c.sl = pkt->src_addr.is_v4() ? kNetworkHdrIpv4 : kNetworkHdrIpv6;
    }
    // Tag matching: what the TMH made of the message.
    ibv_wc_tm_info tm{};
    if (r.tm_mode != kTmMsgNone && status == IBV_WC_SUCCESS) {
        c.opcode = r.tm_mode == kTmMsgNoTag ? IBV_WC_TM_NO_TAG : IBV_WC_TM_RECV;
        if (r.tm_mode == kTmMsgMatched || r.tm_mode == kTmMsgRndv) {
            c.wc_flags |= IBV_WC_TM_MATCH;
            if (r.tm_mode == kTmMsgMatched) c.wc_flags |= IBV_WC_TM_DATA_VALID;
            tm = {r.tm_tag, r.tm_priv};
        }
    }
    c.tm = &tm;
    r.tm_mode = kTmMsgNone;
    complete_recv(qp, r.recv, c);
    r.recv_taken = false;
    r.recv_srq = nullptr;
}

// Copies payload into the taken receive WQE's scatter list at the message
// offset.  False when it does not fit.
bool place_recv(Responder &r, const uint8_t *src, uint32_t len) {
    if (uint64_t(r.msg_offset) + len > r.recv.length) return false;
    sg_copy_to(r.recv.sge, r.recv.num_sge, r.msg_offset, src, len);
    return true;
}

// The 40-byte GRH area of a UD receive, as Linux rxe lays it out: over IPv6
// the packet's IPv6 header, over IPv4 20 zero bytes, then the IPv4 header.
// The header is rebuilt from what the socket reports of it; a hop limit it
// did not report is written as the kernel's default (64), and the IPv4
// flags as sroce and rxe send them (DF).
void make_grh(uint8_t grh[kGrhLen], const Packet &pkt) {
    std::memset(grh, 0, kGrhLen);
    uint8_t hops = pkt.ip.hop_limit ? pkt.ip.hop_limit : 64;
    if (!pkt.src_addr.is_v4()) {
        put32(grh, 6u << 28 | uint32_t(pkt.ip.tclass) << 20 | (pkt.ip.flow & 0xFFFFF));
        put16(grh + 4, uint16_t(kUdpHdrLen + pkt.len));
        grh[6] = 17; // UDP
        grh[7] = hops;
        std::memcpy(grh + 8, pkt.src_addr.raw, 16);
        std::memcpy(grh + 24, pkt.dst_addr.raw, 16);
        return;
    }
    uint8_t *ip = grh + 20;
    ip[0] = 0x45;
    ip[1] = pkt.ip.tclass;
    put16(ip + 2, uint16_t(kIpv4HdrLen + kUdpHdrLen + pkt.len));
    put16(ip + 4, pkt.ip_id);
    put16(ip + 6, 0x4000); // DF
    ip[8] = hops;
    ip[9] = 17; // UDP
    std::memcpy(ip + 12, pkt.src_addr.raw + 12, 4);
    std::memcpy(ip + 16, pkt.dst_addr.raw + 12, 4);
    uint32_t sum = 0;
    for (size_t i = 0; i < kIpv4HdrLen; i += 2)
        sum += get16(ip + i);
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    put16(ip + 10, uint16_t(~sum));
}

// ---------------------------------------------------------------------------
// Dirty ranges: what a later commit on this QP must make durable.  Bounded,
// so no allocation per packet: past kMaxDirty ranges they merge (a commit
// then persists a little more than it must) or the oldest is persisted now.
constexpr size_t kMaxDirty = 32;

// Persists the range through what its MR maps now: after rereg_mr moved
// the translation, the old host addresses are no longer the MR's (and may
// no longer be mapped), so they are never flushed.
int persist_entry(Qp *qp, const DirtyRange &d) {
    Mr *mr = qp->nic->mrs.lookup(d.mr_key);
    if (!mr || mr->window) return 0; // deregistered: nothing left to make durable
    uint64_t lo = std::max(d.lo, mr->iova), hi = std::min(d.hi, mr->iova + mr->length);
    if (lo >= hi) return 0;
    const uint8_t *p = mr_range(mr, lo, hi - lo, 0);
    return p ? persist_range(mr->cls, p, hi - lo) : 0;
}

// Notes `len` bytes written through `rkey` at `lo` in the iova space of the
// MR `mr_key`.  Returns false when a range had to be made durable early and
// could not be: the data it covers can no longer be promised, so the caller
// fails the QP.
[[nodiscard]] bool note_dirty(Qp *qp, uint32_t rkey, uint32_t mr_key, uint64_t lo, uint32_t len) {
    std::vector<DirtyRange> &dirty = qp->commit.dirty;
    uint64_t hi = lo + len;
    DirtyRange *same = nullptr;
    for (DirtyRange &d : dirty) {
        if (d.rkey != rkey || d.mr_key != mr_key) continue;
        if (lo <= d.hi && hi >= d.lo) {
            d.lo = std::min(d.lo, lo);
            d.hi = std::max(d.hi, hi);
            return true;
        }
        same = &d;
    }
    if (dirty.size() < kMaxDirty) {
        dirty.push_back({rkey, mr_key, lo, hi});
    } else if (same) {
        same->lo = std::min(same->lo, lo);
        same->hi = std::max(same->hi, hi);
    } else {
        if (persist_entry(qp, dirty.front())) return false;
        dirty.front() = {rkey, mr_key, lo, hi};
    }
    return true;
}

// Makes every write to `rkey` placed so far durable.  Returns 0 or an errno.
// The iova of host address `p` in `mr`.
uint64_t mr_va(const Mr *mr, const uint8_t *p) {
    return mr->iova + uint64_t(p - mr->addr);
}

int persist_dirty(Qp *qp, uint32_t rkey) {
    std::vector<DirtyRange> &dirty = qp->commit.dirty;
    int err = 0;
    for (size_t i = 0; i < dirty.size();) {
        if (dirty[i].rkey != rkey) {
            i++;
            continue;
        }
        if (int e = persist_entry(qp, dirty[i])) err = e;
        dirty[i] = dirty.back();
        dirty.pop_back();
    }
    if (!err) visibility_fence();
    return err;
}

// ---------------------------------------------------------------------------
// Responder resources (READ / ATOMIC / FLUSH / ATOMIC WRITE replay)

RdResource *find_resource(Qp *qp, uint32_t psn) {
    for (RdResource &r : qp->resp.rd_res) {
        if (!r.valid) continue;
        if (psn_diff(psn, r.first_psn) >= 0 && psn_diff(psn, r.last_psn) <= 0) return &r;
    }
    return nullptr;
}

RdResource &new_resource(Qp *qp, uint32_t first_psn, uint32_t last_psn) {
    Responder &r = qp->resp;
    RdResource &res = r.rd_res[r.rd_res_next];
    r.rd_res_next = (r.rd_res_next + 1) % uint32_t(r.rd_res.size());
    res = RdResource{};
    res.valid = true;
    res.first_psn = first_psn;
    res.last_psn = last_psn;
    return res;
}

// ---------------------------------------------------------------------------
// Stages

// The opcode's transport must be the QP's; datagrams must carry its Q_Key;
// XRC requests name an SRQ of the QP's XRC domain.
Outcome check_transport(Rx &rx) {
    Qp *qp = rx.qp;
    uint8_t t = transport_of(rx.pkt.opcode);
    // Only the connected peer may talk to a connected QP, at the address
    // the QP sends from (rxe's check_addr): checked first, so that no
    // stranger's packet can fail the QP.
    if (qp->connected() &&
        (rx.pkt.src_addr != qp->attr.dest_addr || rx.pkt.dst_addr != qp->attr.src_addr))
        return Outcome::kDrop;
    switch (qp->type) {
    case IBV_QPT_RC:
        if (t != kTransportRc && t != kTransportVendor) return Outcome::kDrop;
        break;
    case IBV_QPT_UC:
        if (t != kTransportUc) return Outcome::kDrop;
        break;
    case IBV_QPT_UD:
        if (t != kTransportUd || rx.pkt.qkey() != qp->attr.qkey) return Outcome::kDrop;
        break;
    case IBV_QPT_XRC_RECV: {
        if (t != kTransportXrc) return Outcome::kDrop;
        Srq *srq = qp->nic->find_srq(rx.pkt.xrc_srqn());
        if (!srq || srq->xrcd != qp->xrcd) return Outcome::kInvalidRequest;
        rx.srq = srq;
        rx.pd = srq->pd;
        break;
    }
    default:
        return Outcome::kDrop;
    }
    return Outcome::kNext;
}

Outcome check_psn(Rx &rx) {
    Responder &r = R(rx);
    const Packet &pkt = rx.pkt;
    switch (rx.qp->type) {
    case IBV_QPT_UD:
        return Outcome::kNext;
    case IBV_QPT_UC:
        // No retransmission: a gap loses the message in progress; a new one
        // may start at any PSN (IBTA 9.7.5.1.1 for UC).
        if (pkt.psn != r.epsn) {
            r.in_msg = 0;
            r.msg_offset = 0;
            if (!(rx.f & kOpFirst)) {
                r.drop_msg = true;
                return Outcome::kDrop;
            }
            r.drop_msg = false;
            r.epsn = pkt.psn;
        }
        return r.drop_msg ? Outcome::kDrop : Outcome::kNext;
    default: {
        int32_t d = psn_diff(pkt.psn, r.epsn);
        if (d > 0) return Outcome::kPsnGap;
        if (d < 0) return Outcome::kDuplicate;
        r.nak_sent = false;
        return Outcome::kNext;
    }
    }
}

// A multi-packet message continues with MIDDLE/LAST packets of its own kind,
// and a new one starts with FIRST or ONLY.
Outcome check_op_seq(Rx &rx) {
    Responder &r = R(rx);
    bool ok = r.in_msg ? (rx.f & r.in_msg) && !(rx.f & kOpFirst)
                       : !(rx.f & (kOpSend | kOpWrite)) || (rx.f & kOpFirst);
    if (ok && r.in_msg == kOpWrite && bool(rx.f & kOpCommit) != rx.qp->commit.in_msg) ok = false;
    if (ok) return Outcome::kNext;
    if (rx.qp->type == IBV_QPT_UC) {
        // The message in progress lost its end: a new one may start here.
        r.in_msg = 0;
        rx.qp->commit.in_msg = false;
        r.drop_msg = !(rx.f & kOpFirst);
        return r.drop_msg ? Outcome::kDrop : Outcome::kNext;
    }
    return Outcome::kInvalidRequest;
}

// The QP must allow the operation; payloads respect the path MTU.
Outcome check_op_valid(Rx &rx) {
    Qp *qp = rx.qp;
    const Packet &pkt = rx.pkt;
    unsigned access = qp->attr.access;
    if (pkt.payload_len > qp->attr.mtu) return Outcome::kInvalidRequest;
    // Every packet but a message's last carries exactly one path MTU.
    if ((rx.f & (kOpSend | kOpWrite)) && !(rx.f & kOpLast) && pkt.payload_len != qp->attr.mtu)
        return Outcome::kInvalidRequest;
    if (rx.f & kOpCommit) {
        if (qp->type != IBV_QPT_RC) return Outcome::kDrop;
        if (rx.f & kOpFirst) {
            // The same access rules as the IBTA FLUSH a non-native peer
            // would send: QP access decides Invalid Request, MR access
            // Remote Access Error.  IMMED must agree with the opcode that
            // ends the message, and reserved bits are 0.
            uint8_t ce = pkt.ceth();
            unsigned need = (ce & ceth::kGlobal) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL)
                                                 : unsigned(IBV_ACCESS_FLUSH_PERSISTENT);
            bool imm = pkt.info->hdrs & kHasImmDt;
            bool bad_imm = (rx.f & kOpLast) && bool(ce & ceth::kImmed) != imm;
            if ((ce & ~(ceth::kOrdered | ceth::kImmed | ceth::kGlobal)) || bad_imm ||
                get24(pkt.hdr + pkt.info->ceth + 1) != 0 || (access & need) != need)
                return Outcome::kInvalidRequest;
        } else if ((rx.f & kOpLast) &&
                   bool(qp->commit.ceth & ceth::kImmed) != bool(pkt.info->hdrs & kHasImmDt)) {
            return Outcome::kInvalidRequest;
        }
    }
    if (rx.f & kOpFlush) {
        uint32_t feth = pkt.feth();
        unsigned type = feth & 0xF, level = (feth >> 4) & 0x3;
        unsigned need =
            ((type & IBV_FLUSH_GLOBAL) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL) : 0u) |
            ((type & IBV_FLUSH_PERSISTENT) ? unsigned(IBV_ACCESS_FLUSH_PERSISTENT) : 0u);
        if (!type || (type & ~3u) || level > IBV_FLUSH_MR || (feth >> 6) || (access & need) != need)
            return Outcome::kInvalidRequest;
    }
    if (rx.f & kOpAtomicWrite) {
        if ((pkt.va() & 7) || pkt.dma_len() != 8 || pkt.payload_len != 8)
            return Outcome::kInvalidRequest;
    }
    if ((rx.f & kOpAtomic) && (pkt.atomic_va() & 7)) return Outcome::kInvalidRequest;
    return Outcome::kNext;
}

// Whether this packet consumes a receive WQE: every SEND's first packet, a
// WRITE WITH IMMEDIATE's last, and a commit carrying IMMED (checked at its
// first packet so nothing is placed before it could be refused).
bool needs_recv(const Rx &rx) {
    if (rx.f & kOpSend) return rx.f & kOpFirst;
    if (!(rx.f & kOpWrite)) return false;
    bool imm_last = (rx.f & kOpLast) && (rx.pkt.info->hdrs & kHasImmDt);
    bool commit_imm = (rx.f & kOpCommit) && (rx.f & kOpFirst) && (rx.pkt.ceth() & ceth::kImmed);
    return imm_last || commit_imm;
}

// The receive WQE's SGEs were checked when the message took it (a tag's
// when it was posted); whenever the key table changed since, they are checked
// again before the next byte is placed, so nothing lands in memory that was
// deregistered or re-registered in the meantime.
Outcome recheck_recv(Rx &rx) {
    Responder &r = R(rx);
    uint64_t now = rx.qp->nic->mrs.epoch();
    if (!r.recv_taken || r.recv_bad || now == r.recv_epoch) return Outcome::kNext;
    Pd *pd = r.recv_srq ? r.recv_srq->pd : rx.qp->pd;
    if (!sges_still_registered(rx.qp->nic, pd, r.recv.sge, r.recv.num_sge, IBV_ACCESS_LOCAL_WRITE))
        return Outcome::kRecvProtection;
    r.recv_epoch = now;
    return Outcome::kNext;
}

Outcome check_resource(Rx &rx) {
    Responder &r = R(rx);
    if ((rx.f & kOpSend) && !(rx.f & kOpFirst)) return recheck_recv(rx); // taken at FIRST
    if (!needs_recv(rx)) return Outcome::kNext;
    if (!(rx.f & kOpSend)) {
        // Only checked here: a WRITE's WQE is taken when the message ends.
        RecvQueue &q = rx.srq ? rx.srq->rq : r.rq;
        std::unique_lock<std::mutex> g;
        if (rx.srq) g = std::unique_lock<std::mutex>(rx.srq->mu);
        if (r.recv_taken || !q.empty()) return Outcome::kNext;
        return rx.qp->reliable() ? Outcome::kRnr : Outcome::kDrop;
    }
    bool tm = rx.srq && rx.srq->type == IBV_SRQT_TM;
    // A rendezvous needs a send queue slot for its READ: with none, the
    // sender retries later (RNR) before any tag is consumed.
    if (tm && !r.recv_taken && rx.pkt.payload_len >= kTmhLen + kRvhLen &&
        rx.pkt.payload[0] == IBV_TMH_RNDV && req_sq_full(rx.qp))
        return Outcome::kRnr;
    if (tm && !r.recv_taken && !tm_classify(rx)) {
        r.msg_offset = 0;
        return recheck_recv(rx);
    }
    if (!take_recv(rx)) return rx.qp->reliable() ? Outcome::kRnr : Outcome::kDrop;
    r.msg_offset = 0;
    // A receive WQE whose memory is no longer there (its MR deregistered or
    // re-registered) fails the message, as rxe does (a malformed WQE).
    if (r.recv_bad && (rx.pkt.payload_len || rx.qp->type == IBV_QPT_UD))
        return Outcome::kRecvProtection;
    return recheck_recv(rx);
}

Outcome check_length(Rx &rx) {
    Responder &r = R(rx);
    const Packet &pkt = rx.pkt;
    if (rx.f & kOpSend) {
        uint32_t grh = rx.qp->type == IBV_QPT_UD ? uint32_t(kGrhLen) : 0;
        uint32_t placed = pkt.payload_len - std::min(r.skip, pkt.payload_len);
        if (uint64_t(r.msg_offset) + grh + placed > r.recv.length) return Outcome::kRecvLength;
    } else if ((rx.f & kOpWrite) && !(rx.f & kOpFirst)) {
        if (pkt.payload_len > r.write_remaining) return Outcome::kInvalidRequest;
        if ((rx.f & kOpLast) && pkt.payload_len != r.write_remaining)
            return Outcome::kInvalidRequest;
    } else if (rx.f & kOpWrite) {
        uint32_t len = pkt.dma_len();
        if (pkt.payload_len > len || ((rx.f & kOpLast) && pkt.payload_len != len))
            return Outcome::kInvalidRequest;
    }
    return Outcome::kNext;
}

// The rkey names an MR of the QP's protection domain that grants the access
// and covers the range.
// A WRITE's later packets: its range was checked at the FIRST packet, and
// again whenever the key table changed since (a deregistration, rereg_mr, a
// window's invalidation), as rxe holds the MR for the whole message.  What
// is no longer granted, or no longer maps where the message began, ends it
// with a remote access error.
Outcome recheck_write(Rx &rx) {
    Responder &r = R(rx);
    uint32_t len = rx.pkt.payload_len;
    uint64_t now = rx.qp->nic->mrs.epoch();
    if (!len || now == r.write_epoch) return Outcome::kNext;
    Mr *mr = nullptr;
    uint8_t *p = remote_access(rx.qp, rx.pd, r.write_rkey, r.write_va, len, r.write_access, &mr);
    if (!p || p != r.write_ptr || (rx.qp->attr.access & r.write_access) != r.write_access)
        return Outcome::kRemoteAccess;
    r.write_epoch = now;
    r.write_mr_key = mr->key.load(std::memory_order_relaxed);
    r.write_mr_va = mr_va(mr, p);
    r.write_tracked = mr->cls != MemClass::kVolatile;
    r.write_uncached = mr->uncached;
    return Outcome::kNext;
}

Outcome check_rkey(Rx &rx) {
    const Packet &pkt = rx.pkt;
    uint32_t rkey, len;
    uint64_t va;
    unsigned need;
    if ((rx.f & kOpWrite) && !(rx.f & kOpFirst)) return recheck_write(rx);
    if ((rx.f & kOpWrite) && (rx.f & kOpFirst)) {
        rkey = pkt.rkey();
        va = pkt.va();
        len = pkt.dma_len();
        need = IBV_ACCESS_REMOTE_WRITE;
        if (rx.f & kOpCommit)
            need |= (pkt.ceth() & ceth::kGlobal) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL)
                                                 : unsigned(IBV_ACCESS_FLUSH_PERSISTENT);
        else if (!len)
            return Outcome::kNext; // a zero-length WRITE names no memory
    } else if (rx.f & kOpRead) {
        rkey = pkt.rkey();
        va = pkt.va();
        len = pkt.dma_len();
        need = IBV_ACCESS_REMOTE_READ;
        rx.n_resp = std::max(1u, (len + rx.qp->attr.mtu - 1) / rx.qp->attr.mtu);
        if (!len) return Outcome::kNext;
    } else if (rx.f & kOpAtomic) {
        rkey = pkt.atomic_rkey();
        va = pkt.atomic_va();
        len = 8;
        need = IBV_ACCESS_REMOTE_ATOMIC;
    } else if (rx.f & kOpAtomicWrite) {
        rkey = pkt.rkey();
        va = pkt.va();
        len = 8;
        need = IBV_ACCESS_REMOTE_WRITE;
    } else if (rx.f & kOpFlush) {
        // FLUSH (IBTA A19): the MR must be registered for the placement type.
        unsigned type = pkt.feth() & 0xF;
        rkey = pkt.rkey();
        need = ((type & IBV_FLUSH_GLOBAL) ? unsigned(IBV_ACCESS_FLUSH_GLOBAL) : 0u) |
               ((type & IBV_FLUSH_PERSISTENT) ? unsigned(IBV_ACCESS_FLUSH_PERSISTENT) : 0u);
        rx.mr = lookup_mr(rx.qp->nic, rx.pd, rkey);
        if (!rx.mr) return Outcome::kRemoteAccess;
        bool whole = ((pkt.feth() >> 4) & 3) == IBV_FLUSH_MR;
        va = whole ? rx.mr->iova : pkt.va();
        uint64_t flen = whole ? rx.mr->length : pkt.dma_len();
        rx.mem = mr_range(rx.mr, va, flen, need);
        if (!rx.mem && (flen || (rx.mr->access & need) != need)) return Outcome::kRemoteAccess;
        return Outcome::kNext;
    } else {
        return Outcome::kNext;
    }
    // The QP must grant the remote access as well as the MR or window.
    if ((rx.qp->attr.access & need) != need) return Outcome::kRemoteAccess;
    rx.need = need;
    rx.epoch = rx.qp->nic->mrs.epoch();
    rx.mem = remote_access(rx.qp, rx.pd, rkey, va, len, need, &rx.mr);
    return rx.mem ? Outcome::kNext : Outcome::kRemoteAccess;
}

// ---------------------------------------------------------------------------
// Execution

Outcome exec_send(Rx &rx) {
    Responder &r = R(rx);
    const Packet &pkt = rx.pkt;
    if (rx.qp->type == IBV_QPT_UD) {
        uint8_t grh[kGrhLen];
        make_grh(grh, pkt);
        place_recv(r, grh, kGrhLen);
        r.msg_offset += kGrhLen;
    }
    // A matched EAGER's TMH, or all of a matched RNDV request, is not data.
    uint32_t skip = std::min(r.skip, pkt.payload_len);
    r.skip -= skip;
    place_recv(r, pkt.payload + skip, pkt.payload_len - skip);
    r.msg_offset += pkt.payload_len - skip;
    if (!(rx.f & kOpLast)) {
        r.in_msg = kOpSend;
        return Outcome::kNext;
    }
    if (r.tm_mode == kTmMsgRndv) {
        // The match is reported now; the data follow by RDMA READ from the
        // sender's buffer, then a FIN tells the sender it may reuse it.
        RecvWqe buf = r.recv;
        ibv_sge sge = r.recv_sge[0];
        Srq *srq = r.recv_srq;
        uint64_t tag = r.tm_tag;
        uint32_t priv = r.tm_priv, len = std::min(r.rvh_len, buf.length);
        r.in_msg = 0;
        finish_recv(rx.qp, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, &pkt, pkt.se);
        if (!req_post_tm_read(rx.qp, rx.tx, srq, buf.wr_id, tag, priv, sge, len, r.rvh_va,
                              r.rvh_rkey))
            return Outcome::kRemoteOp;
        return Outcome::kNext;
    }
    if (rx.f & kOpInv) {
        int err = invalidate_rkey(rx.qp, rx.pd, pkt.ieth());
        if (err) return Outcome::kInvalidRequest;
    }
    r.in_msg = 0;
    finish_recv(rx.qp, IBV_WC_SUCCESS, IBV_WC_RECV, r.msg_offset, &pkt, pkt.se);
    return Outcome::kNext;
}

Outcome exec_write(Rx &rx) {
    Qp *qp = rx.qp;
    Responder &r = R(rx);
    CommitState &c = qp->commit;
    const Packet &pkt = rx.pkt;
    bool commit = rx.f & kOpCommit;
    if (rx.f & kOpFirst) {
        uint8_t ce = commit ? pkt.ceth() : 0;
        // ORDERED: what was written to this rkey before becomes durable
        // before this write's data is placed.
        if ((ce & ceth::kOrdered) && persist_dirty(qp, pkt.rkey())) return Outcome::kRemoteOp;
        r.write_ptr = rx.mem;
        r.write_va = pkt.va();
        r.write_mr_key = rx.mr ? rx.mr->key.load(std::memory_order_relaxed) : 0;
        r.write_mr_va = rx.mr ? mr_va(rx.mr, rx.mem) : 0;
        r.write_access = rx.need;
        r.write_epoch = rx.epoch;
        r.write_remaining = pkt.dma_len();
        r.msg_offset = 0;
        r.write_rkey = pkt.rkey();
        r.write_tracked = rx.mr && rx.mr->cls != MemClass::kVolatile;
        r.write_uncached = rx.mr && rx.mr->uncached;
        c.ceth = ce;
        c.in_msg = commit;
    }
    if (pkt.payload_len) {
        if (r.write_uncached)
            copy_nontemporal(r.write_ptr, pkt.payload, pkt.payload_len);
        else
            std::memcpy(r.write_ptr, pkt.payload, pkt.payload_len);
        if (r.write_tracked &&
            !note_dirty(qp, r.write_rkey, r.write_mr_key, r.write_mr_va, pkt.payload_len))
            return Outcome::kRemoteOp;
    }
    r.write_ptr += pkt.payload_len;
    r.write_va += pkt.payload_len;
    r.write_mr_va += pkt.payload_len;
    r.write_remaining -= pkt.payload_len;
    r.msg_offset += pkt.payload_len;
    if (!(rx.f & kOpLast)) {
        r.in_msg = kOpWrite;
        return Outcome::kNext;
    }
    r.in_msg = 0;
    c.in_msg = false;
    // The commit point: this write and every earlier one to the rkey are
    // durable before the ACK (and the immediate) can go out.
    if (commit) {
        int err =
            (c.ceth & ceth::kGlobal) ? (visibility_fence(), 0) : persist_dirty(qp, r.write_rkey);
        if (err) return Outcome::kRemoteOp;
    }
    if (pkt.info->hdrs & kHasImmDt) {
        if (!take_recv(rx)) return qp->reliable() ? Outcome::kRnr : Outcome::kDrop;
        // After a commit the immediate, not a length, says what is durable;
        // byte_len is 0 as with the IBTA sequence's final zero-length WRITE
        // WITH IMMEDIATE, so both paths look alike.
        finish_recv(qp, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, commit ? 0 : r.msg_offset, &pkt,
                    pkt.se);
    }
    return Outcome::kNext;
}

Outcome exec_read(Rx &rx) {
    const Packet &pkt = rx.pkt;
    RdResource &res = new_resource(rx.qp, pkt.psn, psn_add(pkt.psn, rx.n_resp - 1));
    res.va = pkt.va();
    res.rkey = pkt.rkey();
    res.length = pkt.dma_len();
    return Outcome::kNext;
}

Outcome exec_atomic(Rx &rx) {
    const Packet &pkt = rx.pkt;
    auto *word = reinterpret_cast<uint64_t *>(rx.mem);
    uint64_t orig;
    if (rx.op == kCompareSwap) {
        orig = pkt.compare();
        __atomic_compare_exchange_n(word, &orig, pkt.swap_add(), false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
    } else {
        orig = __atomic_fetch_add(word, pkt.swap_add(), __ATOMIC_SEQ_CST);
    }
    RdResource &res = new_resource(rx.qp, pkt.psn, pkt.psn);
    res.atomic = true;
    res.orig = rx.orig = orig;
    return Outcome::kNext;
}

// ATOMIC WRITE (IBTA A19): one naturally aligned 64-bit store, ordered after
// the writes before it, durable only through a later FLUSH.
Outcome exec_atomic_write(Rx &rx) {
    uint64_t v;
    std::memcpy(&v, rx.pkt.payload, 8);
    __atomic_store_n(reinterpret_cast<uint64_t *>(rx.mem), v, __ATOMIC_RELEASE);
    // A later commit to this rkey must make the word durable too.
    if (rx.mr->cls != MemClass::kVolatile &&
        !note_dirty(rx.qp, rx.pkt.rkey(), rx.mr->key.load(std::memory_order_relaxed),
                    mr_va(rx.mr, rx.mem), 8))
        return Outcome::kRemoteOp;
    new_resource(rx.qp, rx.pkt.psn, rx.pkt.psn).ack_only = true;
    return Outcome::kNext;
}

// FLUSH (IBTA A19): every write before it in PSN order is already placed, so
// making the range durable covers all of them.
Outcome exec_flush(Rx &rx) {
    const Packet &pkt = rx.pkt;
    unsigned type = pkt.feth() & 0xF;
    bool whole = ((pkt.feth() >> 4) & 3) == IBV_FLUSH_MR;
    uint64_t len = whole ? rx.mr->length : pkt.dma_len();
    int err = 0;
    if ((type & IBV_FLUSH_PERSISTENT) && len)
        err = persist_range(rx.mr->cls, rx.mem, len);
    else
        visibility_fence();
    if (err) return Outcome::kRemoteOp;
    // A persistent FLUSH of the whole MR leaves nothing of it dirty.
    if ((type & IBV_FLUSH_PERSISTENT) && whole) {
        uint32_t rkey = rx.mr->ibmr.rkey;
        std::erase_if(rx.qp->commit.dirty, [rkey](const DirtyRange &d) { return d.rkey == rkey; });
    }
    new_resource(rx.qp, pkt.psn, pkt.psn).ack_only = true;
    return Outcome::kNext;
}

Outcome execute(Rx &rx) {
    if (rx.f & kOpSend) return exec_send(rx);
    if (rx.f & kOpWrite) return exec_write(rx);
    if (rx.f & kOpRead) return exec_read(rx);
    if (rx.f & kOpAtomic) return exec_atomic(rx);
    if (rx.f & kOpAtomicWrite) return exec_atomic_write(rx);
    if (rx.f & kOpFlush) return exec_flush(rx);
    return Outcome::kInvalidRequest;
}

// Advances the expected PSN and answers: READ data, an atomic's original
// value, the empty READ RESPONSE of FLUSH / ATOMIC WRITE, or a (coalesced)
// ACK when the requester asked for one.
void acknowledge(Rx &rx) {
    Qp *qp = rx.qp;
    Responder &r = R(rx);
    const Packet &pkt = rx.pkt;
    if (rx.f & kOpComplete) r.msn = (r.msn + 1) & 0xFFFFFF;
    if (qp->type == IBV_QPT_UD) return;
    r.epsn = psn_add(pkt.psn, (rx.f & kOpRead) ? rx.n_resp : 1);
    if (!qp->reliable()) return;
    if (rx.f & (kOpRead | kOpAtomic | kOpFlush | kOpAtomicWrite)) {
        r.ack_pending = false; // the response acknowledges everything before
        if (rx.f & kOpAtomic)
            send_atomic_ack(qp, rx.tx, pkt.psn, rx.orig);
        else
            send_read_responses(qp, rx.tx, pkt.psn, (rx.f & kOpRead) ? rx.mem : nullptr,
                                (rx.f & kOpRead) ? pkt.dma_len() : 0);
        return;
    }
    if (pkt.ackreq) {
        r.ack_pending = true;
        r.ack_psn = pkt.psn;
    }
}

// RC: the ACK was lost, or a READ / atomic response: answer again without
// executing anything twice.
void duplicate(Rx &rx) {
    Qp *qp = rx.qp;
    const Packet &pkt = rx.pkt;
    if (rx.f & (kOpSend | kOpWrite)) {
        if (pkt.ackreq || (rx.f & kOpLast)) {
            qp->resp.ack_pending = true;
            qp->resp.ack_psn = psn_add(qp->resp.epsn, kPsnMask);
        }
        return;
    }
    RdResource *r = find_resource(qp, pkt.psn);
    if (!r) return;
    if (rx.f & kOpRead) {
        // Reads are idempotent: serve the (possibly partial) re-request again.
        if (r->atomic || r->ack_only) return;
        uint32_t len = pkt.dma_len();
        uint8_t *src = nullptr;
        if (len) {
            Mr *mr;
            src = remote_access(qp, rx.pd, r->rkey, pkt.va(), len, IBV_ACCESS_REMOTE_READ, &mr);
            if (!src || pkt.rkey() != r->rkey) return;
        }
        send_read_responses(qp, rx.tx, pkt.psn, src, len);
        return;
    }
    if ((rx.f & kOpAtomic) && r->atomic && r->first_psn == pkt.psn)
        send_atomic_ack(qp, rx.tx, pkt.psn, r->orig); // never executed twice
    if ((rx.f & (kOpFlush | kOpAtomicWrite)) && r->ack_only && r->first_psn == pkt.psn)
        send_read_responses(qp, rx.tx, pkt.psn, nullptr, 0); // nor are these
}

void send_rnr(Rx &rx) {
    Responder &r = R(rx);
    r.ack_pending = false;
    // The requester resends from this PSN after its back-off; the rest of
    // its burst is dropped without a sequence NAK, which would cost it a retry.
    r.nak_sent = true;
    send_aeth(rx.qp, rx.tx, aeth::kRnrNak | (rx.qp->attr.min_rnr_timer & 0x1F), rx.pkt.psn);
}

void fail(Rx &rx, Outcome o) {
    Qp *qp = rx.qp;
    Responder &r = R(rx);
    ErrorAction a = error_action(o);
    if (!qp->reliable()) {
        // UC/UD: the message is lost; only a receive too small is reported.
        r.in_msg = 0;
        if (qp->type == IBV_QPT_UC) r.drop_msg = !(rx.f & kOpLast);
        if (r.recv_taken && (o == Outcome::kRecvLength || o == Outcome::kRecvProtection))
            finish_recv(qp, a.recv_status, IBV_WC_RECV, 0, nullptr, false);
        return;
    }
    // Class C/D errors: NAK, then the responder QP enters the error state.
    r.ack_pending = false;
    send_aeth(qp, rx.tx, aeth::kNak | a.nak, rx.pkt.psn);
    if (r.recv_taken) finish_recv(qp, a.recv_status, IBV_WC_RECV, 0, nullptr, false);
    qp_enter_error(qp);
    post_async_event(qp, a.event);
}

// ---------------------------------------------------------------------------
// Selective repeat (wire-protocol.md §5.6.1)

// One request through the checks, execution and acknowledgement.
void process(Qp *qp, const Packet &pkt, TxBatch &tx);

// Keeps a request that arrived past a gap until the gap is filled.  False
// when it cannot (beyond the window, or no memory for the buffer): the
// caller answers with go-back-N instead.
bool hold(Rx &rx) {
    Qp *qp = rx.qp;
    Responder &r = R(rx);
    Reorder &b = r.reorder;
    const Packet &pkt = rx.pkt;
    if (uint32_t(psn_diff(pkt.psn, r.epsn)) >= kSendWindow) return false;
    if (!b.mem) {
        // Allocated at the first gap only: most connections never see one.
        uint32_t size = qp->attr.mtu + uint32_t(kMaxHdrLen + 3 + kIcrcLen);
        b.mem.reset(new (std::nothrow) uint8_t[size_t(size) * kSendWindow]);
        b.slots.reset(new (std::nothrow) HeldSlot[kSendWindow]);
        if (!b.mem || !b.slots) {
            b = Reorder{};
            return false;
        }
        b.slot_size = size;
    }
    if (pkt.len > b.slot_size) return false;
    HeldSlot &s = b.slot(pkt.psn);
    if (!s.len || s.psn != pkt.psn) {
        if (!s.len) b.held++;
        s = {pkt.psn, uint16_t(pkt.len), pkt.legacy_icrc};
        std::memcpy(b.data(pkt.psn), pkt.hdr, pkt.len);
        qp->nic->stats.rx_held.fetch_add(1, std::memory_order_relaxed);
    }
    // Everything before the gap is carried out: the SACK acknowledges it.
    r.ack_pending = true;
    r.ack_psn = psn_add(r.epsn, kPsnMask);
    return true;
}

// Sends the SELECTIVE ACKNOWLEDGE for the requests held past the gap at the
// expected PSN; false (and nothing held any more) when none is.
bool send_sack(Qp *qp, TxBatch &tx) {
    Responder &r = qp->resp;
    Reorder &b = r.reorder;
    uint8_t pkt[kBthLen + kAethLen + 4 * (1 + kSackMaxRanges)];
    static_assert(sizeof pkt <= kMaxHdrLen, "Nic::queue copies it as a header");
    uint8_t *ranges = pkt + kBthLen + kAethLen + 4;
    uint32_t held = 0, nranges = 0, high = 0, gap_start = 0;
    bool in_gap = false;
    for (uint32_t i = 0; i < kSendWindow; i++) {
        uint32_t psn = psn_add(r.epsn, i);
        HeldSlot &s = b.slot(psn);
        if (s.len && s.psn != psn) {
            s.len = 0; // left behind by a PSN the expected one jumped past
        }
        if (!s.len) {
            if (!in_gap) gap_start = i;
            in_gap = true;
            continue;
        }
        held++;
        high = psn;
        if (in_gap && nranges < kSackMaxRanges) {
            uint8_t *g = ranges + 4 * nranges++;
            put16(g, uint16_t(gap_start));
            put16(g + 2, uint16_t(i - gap_start));
        }
        in_gap = false;
    }
    b.held = held;
    if (!held) return false;
    bth::build(pkt, kSelectiveAck, false, 0, kDefaultPkey, qp->attr.dest_qpn, false,
               psn_add(r.epsn, kPsnMask));
    bth::announce(pkt, qp->announce);
    aeth::build(pkt + kBthLen, aeth::kAck | aeth::kNoCredits, r.msn);
    uint8_t *h = pkt + kBthLen + kAethLen;
    h[0] = 0;
    put24(h + 1, high);
    qp->nic->queue(tx, qp->attr.src_addr, qp->attr.dest_addr, ip_fields(qp->attr.ah.grh), pkt,
                   kBthLen + kAethLen + 4 * (1 + nranges), nullptr, 0, 0);
    return true;
}

// Carries out the requests held right after the expected PSN, in order.
void drain_held(Qp *qp, TxBatch &tx) {
    Responder &r = qp->resp;
    Reorder &b = r.reorder;
    while (b.held && qp->attr.state != IBV_QPS_ERR) {
        HeldSlot &s = b.slot(r.epsn);
        if (!s.len || s.psn != r.epsn) return;
        Packet pkt;
        bool ok = parse(b.data(s.psn), s.len, pkt) == ParseError::kOk;
        pkt.legacy_icrc = s.legacy_icrc;
        s.len = 0;
        b.held--;
        if (!ok) return;
        pkt.src_addr = qp->attr.dest_addr;
        pkt.src_port = kRoceV2Port;
        pkt.dst_addr = qp->attr.src_addr;
        // No new data reaches the slot while it is read: only packets past
        // a gap are held, and this one's PSN is the expected one.
        process(qp, pkt, tx);
    }
}

void conclude(Rx &rx, Outcome o) {
    switch (o) {
    case Outcome::kNext:
    case Outcome::kDone:
    case Outcome::kDrop:
        return;
    case Outcome::kDuplicate:
        duplicate(rx);
        return;
    case Outcome::kPsnGap:
        if (rx.qp->selective_repeat && hold(rx)) return;
        // Go-back-N: one NAK per gap, then drop until the expected PSN returns.
        if (!R(rx).nak_sent) {
            R(rx).nak_sent = true;
            R(rx).ack_pending = false;
            send_aeth(rx.qp, rx.tx, aeth::kNak | aeth::kNakPsnSeqError, R(rx).epsn);
        }
        return;
    case Outcome::kRnr:
        send_rnr(rx);
        return;
    default:
        fail(rx, o);
    }
}

// The checks in order, then execution: the first outcome other than kNext
// ends the packet's way.  Direct calls, so the compiler can inline the chain.
Outcome run_stages(Rx &rx) {
    Outcome o;
    if ((o = check_transport(rx)) != Outcome::kNext) return o;
    if ((o = check_psn(rx)) != Outcome::kNext) return o;
    if ((o = check_op_seq(rx)) != Outcome::kNext) return o;
    if ((o = check_op_valid(rx)) != Outcome::kNext) return o;
    if ((o = check_resource(rx)) != Outcome::kNext) return o;
    if ((o = check_length(rx)) != Outcome::kNext) return o;
    if ((o = check_rkey(rx)) != Outcome::kNext) return o;
    return execute(rx);
}

void process(Qp *qp, const Packet &pkt, TxBatch &tx) {
    Rx rx{qp, pkt, tx, pkt.rc_opcode(), pkt.info->flags, qp->pd, qp->srq};
    Outcome o = run_stages(rx);
    if (o != Outcome::kNext) {
        conclude(rx, o);
        return;
    }
    acknowledge(rx);
}

} // namespace

void resp_send_ack(Qp *qp, TxBatch &tx) {
    if (!qp->resp.ack_pending) return;
    qp->resp.ack_pending = false;
    qp->resp.ack_urgent = false;
    if (qp->resp.reorder.held && send_sack(qp, tx)) return;
    send_aeth(qp, tx, aeth::kAck | aeth::kNoCredits, qp->resp.ack_psn);
}

void resp_send_deferred_ack(Qp *qp, TxBatch &tx) {
    if (!qp->ack_deferred) return;
    qp->ack_deferred = false;
    resp_send_ack(qp, tx);
}

void resp_ack_hold_timed_out(Qp *qp, TxBatch &tx) {
    if (!qp->ack_deferred) return;
    qp->ack_hold_pays = false;
    resp_send_deferred_ack(qp, tx);
}

void RecvQueue::init(uint32_t wr, uint32_t sges) {
    max_wr = wr;
    max_sge = sges;
    wqe.assign(wr, RecvWqe{});
    sge.assign(size_t(wr) * sges, ibv_sge{});
    head = tail = 0;
}

int RecvQueue::post(ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    for (; wr; wr = wr->next) {
        if (head - tail >= max_wr) {
            *bad_wr = wr;
            return ENOMEM;
        }
        if (wr->num_sge < 0 || uint32_t(wr->num_sge) > max_sge) {
            *bad_wr = wr;
            return EINVAL;
        }
        uint32_t slot = head % max_wr;
        RecvWqe &r = wqe[slot];
        r.wr_id = wr->wr_id;
        r.sge = &sge[size_t(slot) * max_sge];
        r.num_sge = uint32_t(wr->num_sge);
        r.length = 0;
        for (int i = 0; i < wr->num_sge; i++) {
            r.sge[i] = wr->sg_list[i];
            r.length += wr->sg_list[i].length;
        }
        head++;
    }
    return 0;
}

int resp_post_recv(Qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    std::lock_guard<std::mutex> g(qp->mu);
    if (qp->attr.state == IBV_QPS_RESET || qp->srq || qp->type == IBV_QPT_XRC_SEND ||
        qp->type == IBV_QPT_XRC_RECV) {
        *bad_wr = wr;
        return EINVAL;
    }
    int err = qp->resp.rq.post(wr, bad_wr);
    if (qp->attr.state == IBV_QPS_ERR) qp_fail_queues(qp);
    return err;
}

void resp_receive(Qp *qp, const Packet &pkt, TxBatch &tx) {
    Responder &r = qp->resp;
    if (!r.reorder.held) {
        process(qp, pkt, tx);
        return;
    }
    const uint32_t before = r.epsn;
    process(qp, pkt, tx);
    drain_held(qp, tx);
    // A gap filled: the requester learns where the next one starts (or that
    // none is left) now, whether or not the filling packet asked for an ACK,
    // rather than when its recovery timer fires.
    if (qp->attr.state != IBV_QPS_ERR && psn_diff(r.epsn, before) > 0) {
        r.ack_pending = true;
        r.ack_urgent = true;
        r.ack_psn = psn_add(r.epsn, kPsnMask);
    }
}

} // namespace sroce
