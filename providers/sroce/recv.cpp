// SPDX-License-Identifier: MIT
//
// The receive path: what the port returned, through the fault injector
// (SROCE_FAULT), verified (ICRC, partition) and dispatched to its QP's
// responder or completer, or to every QP attached to a multicast group; the
// ACKs a batch owes, coalesced and sent after it.
#include "icrc.hpp"
#include "nic.hpp"
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>

namespace sroce {

namespace {

double next_uniform(uint64_t &s) {
    // splitmix64: cheap and reproducible from the seed.
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) / double(1ull << 53);
}

} // namespace

void Nic::receive_one(const uint8_t *d, size_t len, const RxDatagram &from, uint16_t pos,
                      TxBatch &tx) {
    stats.rx_pkts.fetch_add(1, std::memory_order_relaxed);
    if (opt_.fault.enabled()) {
        uint64_t seq = ++fault_seq_;
        bool chosen = false;
        for (int i = 0; i < opt_.fault.n_drop_at; i++)
            chosen |= opt_.fault.drop_at[i] == seq;
        if (chosen) {
            stats.rx_dropped_fault.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (next_uniform(rng_) < opt_.fault.drop) {
            stats.rx_dropped_fault.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (next_uniform(rng_) < opt_.fault.dup) dispatch(d, len, from, pos, tx);
        if (!held_.len && next_uniform(rng_) < opt_.fault.reorder) {
            std::memcpy(held_.data.get(), d, len);
            held_.len = len;
            held_.from.src = from.src;
            held_.from.sport = from.sport;
            held_.from.dst = from.dst;
            held_.from.ip = from.ip;
            held_.pos = pos;
            return;
        }
    }
    dispatch(d, len, from, pos, tx);
    if (held_.len) {
        dispatch(held_.data.get(), held_.len, held_.from, held_.pos, tx);
        held_.len = 0;
    }
}

int Nic::rx_pass() {
    // Until then the port has only its stand-ins, and no QP exists.
    if (!bound_.load(std::memory_order_acquire)) return 0;
    int n = port_->receive(rx_, Port::kRxBatch);
    TxBatch &tx = *tx_;
    if (!n) {
        if (!deferred_acks_.empty()) {
            std::lock_guard<std::mutex> g(objects_mu);
            send_deferred_acks(tx, !rx_by_app_);
            if (tx.n) xmit(tx);
        }
        return 0;
    }
    // Until the batch has left: what it references stays registered.
    std::lock_guard<std::mutex> g(objects_mu);
    for (int i = 0; i < n; i++) {
        const RxDatagram &d = rx_[i];
        if (!d.data) continue;
        // A coalesced buffer holds packets of one segment size, the last
        // possibly shorter, each with its place in the send as its IP ID.
        size_t seg = d.seg ? d.seg : d.len;
        size_t off = 0;
        uint16_t pos = 0;
        do {
            receive_one(d.data + off, std::min(seg, d.len - off), d, pos, tx);
            off += seg;
            pos++;
        } while (off < d.len);
    }
    // ACKs are coalesced over a receive batch and sent here.
    if (!acks_.empty()) send_acks(tx);
    if (!deferred_acks_.empty()) send_deferred_acks(tx, !rx_by_app_);
    if (tx.n) xmit(tx);
    return n;
}

void Nic::dispatch(const uint8_t *data, size_t len, const RxDatagram &from, uint16_t pos,
                   TxBatch &tx) {
    wire::Packet pkt;
    if (wire::parse(data, len, pkt) != wire::ParseError::kOk) {
        stats.rx_bad_hdr.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    const uint16_t sport = from.sport;
    const IpAddr &dst = from.dst;
    IpHeader ip{from.src, dst, sport, wire::kRoceV2Port, pos};
    // A source port other than 4791 is a connected socket (another sroce
    // process, Linux rxe): its next ID is most likely one more than its last
    // datagram's — or a few more, when datagrams went to other processes of
    // this address or to the sender's own reads of its counter — and a
    // packet of a coalesced run its buffer's first one plus its place.  The
    // sender's threads on two CPUs reach the socket through two backlogs
    // (loopback, RPS), so a datagram may also come a little behind the
    // highest ID seen.
    IdGuess *guess = nullptr;
    int32_t likely = -1;
    if (sport != wire::kRoceV2Port && from.src.is_v4()) {
        guess = &id_guess_[(from.src.hash() * 31u + sport) % std::size(id_guess_)];
        if (guess->addr == from.src && guess->port == sport)
            likely = uint16_t(pos ? guess->base + pos : guess->high + 1);
    }
    uint16_t id = pos;
    const int ahead = pos ? 1 : kLikelyIds, behind = pos ? 0 : kLikelyBehind;
    if (icrc_verify(ip, data, len, &id, likely, ahead, behind)) {
        bool guessed = likely >= 0 && uint16_t(id - likely + behind) < ahead + behind;
        if (id != pos && !guessed) stats.rx_ip_id_solved.fetch_add(1, std::memory_order_relaxed);
        if (guess) {
            // A run's segments take the IDs after its datagram's (renumber),
            // so the datagram's own ID is what the next one follows.
            uint16_t base = uint16_t(id - pos);
            bool known = guess->addr == from.src && guess->port == sport;
            uint16_t high = known && int16_t(base - guess->high) < 0 ? guess->high : base;
            *guess = {from.src, sport, base, high};
        }
    } else {
        if (pkt.opcode != wire::kFlush || !icrc_verify_flush_legacy(ip, data, len)) {
            stats.rx_bad_icrc.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        pkt.legacy_icrc = true;
        stats.rx_flush_legacy_icrc.fetch_add(1, std::memory_order_relaxed);
    }
    // The P_Key table holds only the default full-member key: accept it and
    // its limited-member form, drop every other partition.
    if ((wire::bth::pkey(data) & 0x7FFF) != 0x7FFF) {
        stats.rx_bad_hdr.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    pkt.src_addr = from.src;
    pkt.src_port = sport;
    pkt.dst_addr = dst;
    pkt.ip = from.ip;
    pkt.ip_id = id;
    if ((pkt.ip.tclass & kEcnMask) == kEcnCe) stats.rx_ce.fetch_add(1, std::memory_order_relaxed);
    if (pkt.info->flags & wire::kOpCnp) {
        receive_cnp(pkt);
        return;
    }
    if (dst.multicast()) {
        // A multicast group's: every UD QP attached gets a copy.
        for (McGroup &m : mc_) {
            if (m.addr.empty() || m.addr != dst) continue;
            if (pkt.qpn != wire::kMulticastQpn) break;
            for (Qp *qp : m.members)
                deliver(qp, pkt, tx);
            return;
        }
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    Qp *qp = find_qp(pkt.qpn);
    if (!qp) {
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    deliver(qp, pkt, tx);
}

void Nic::deliver(Qp *qp, wire::Packet &pkt, TxBatch &tx) {
    std::unique_lock<std::mutex> g(qp->mu);
    bool request = pkt.info->flags & wire::kOpReq;
    // Responses come only from the connected peer (the responder checks
    // requests per transport).
    if (qp->attr.state < IBV_QPS_RTR || qp->attr.state == IBV_QPS_ERR ||
        (!request && (pkt.src_addr != qp->attr.dest_addr || pkt.dst_addr != qp->attr.src_addr))) {
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    // A peer that announces itself is sroce (wire-protocol.md §3.3.1):
    // from its first packet on, both ends resend selectively and commits
    // go native, as if the application had declared it.  Only a packet of
    // this connection teaches that: a request in the receive window, a
    // response to something outstanding — not a straggler of an earlier
    // connection from the same address, whose peer may have been another.
    if (uint8_t a = wire::bth::announced(pkt.hdr);
        (a & ~qp->peer_announced) && qp->announce && pkt.src_addr == qp->attr.dest_addr &&
        (request ? uint32_t(wire::psn_diff(pkt.psn, qp->resp.epsn)) < kSendWindow
                 : wire::psn_diff(pkt.psn, qp->comp.una_psn) >= 0 &&
                       wire::psn_diff(pkt.psn, qp->req.next_psn) < 0)) {
        qp->peer_announced |= a;
        qp->agree_selective_repeat();
    }
    tx.order = &qp->tx_mu;
    // The notification point: a request that met congestion on its way.
    // Marks on responses are not reported, as nothing paces them.
    if (request && cc_.on && (pkt.ip.tclass & kEcnMask) == kEcnCe) cc_congestion_seen(qp, pkt, tx);
    if (request) {
        // The peer's own FLUSH shows the ICRC form it takes (req.cpp).
        if (pkt.opcode == wire::kFlush && pkt.src_addr == qp->attr.dest_addr)
            qp->peer_flush_icrc = pkt.legacy_icrc ? kFlushIcrcLegacy : kFlushIcrcIbta;
        resp_receive(qp, pkt, tx);
        if (qp->resp.ack_pending && !qp->ack_listed) {
            qp->ack_listed = true;
            acks_.push_back(qp);
        }
    } else {
        comp_receive(qp, pkt, tx);
    }
    // Requester packets must leave in PSN order even when the application
    // thread also transmits on this QP.
    tx.order = nullptr;
    send_and_unlock(qp, tx, g);
}

void Nic::receive_cnp(const wire::Packet &pkt) {
    stats.rx_cnp.fetch_add(1, std::memory_order_relaxed);
    Qp *qp = find_qp(pkt.qpn);
    if (!qp) {
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    std::lock_guard<std::mutex> g(qp->mu);
    // From the connected peer only: anyone else could slow the QP down.  A
    // UD QP takes them from whoever it sends to.
    if (qp->attr.state < IBV_QPS_RTS || qp->attr.state == IBV_QPS_ERR ||
        (qp->type != IBV_QPT_UD &&
         (pkt.src_addr != qp->attr.dest_addr || pkt.dst_addr != qp->attr.src_addr))) {
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    // Counted, not acted on, with congestion control off: to compare.
    if (!cc_.on) return;
    cc_cnp_received(qp, now_ns());
}

int Nic::attach_mcast(Qp *qp, const IpAddr &group) {
    std::lock_guard<std::mutex> r(rx_mu_);
    std::lock_guard<std::mutex> g(objects_mu);
    McGroup *free_slot = nullptr;
    for (McGroup &m : mc_) {
        if (m.addr.empty()) {
            if (!free_slot) free_slot = &m;
            continue;
        }
        if (m.addr != group) continue;
        // Attaching twice is harmless, as on an RNIC.
        if (std::find(m.members.begin(), m.members.end(), qp) != m.members.end()) return 0;
        if (m.members.size() >= size_t(kMaxMcAttach)) return ENOMEM;
        m.members.push_back(qp);
        return 0;
    }
    if (!free_slot) return ENOMEM;
    if (int err = port_->join(group)) return err;
    free_slot->addr = group;
    free_slot->members.assign(1, qp);
    mc_count_++;
    return 0;
}

int Nic::detach_mcast(Qp *qp, const IpAddr &group) {
    std::lock_guard<std::mutex> r(rx_mu_);
    std::lock_guard<std::mutex> g(objects_mu);
    for (McGroup &m : mc_) {
        if (m.addr.empty() || m.addr != group) continue;
        auto it = std::find(m.members.begin(), m.members.end(), qp);
        if (it == m.members.end()) return EINVAL;
        m.members.erase(it);
        if (m.members.empty()) {
            port_->leave(group);
            m.addr = {};
            mc_count_--;
        }
        return 0;
    }
    return EINVAL;
}

void Nic::detach_all(Qp *qp) {
    if (!mc_count_.load()) return;
    for (McGroup &m : mc_) {
        IpAddr addr;
        {
            std::lock_guard<std::mutex> g(objects_mu);
            if (m.addr.empty() ||
                std::find(m.members.begin(), m.members.end(), qp) == m.members.end())
                continue;
            addr = m.addr;
        }
        detach_mcast(qp, addr);
    }
}

void Nic::send_acks(TxBatch &tx) {
    // An application thread spinning on its CQ that received a request on
    // an RC QP most often answers it at once (ping-pong).  Its post then
    // carries the ACK: without that, the peer's progress thread, asleep
    // while its application spins on memory (perftest's write latency),
    // would wake twice.  Only while it spins: then the progress thread
    // looks every park_ns and sends what is due.  Never a selective
    // acknowledgement or the news of a filled gap, which ask for resends.
    uint64_t now = now_ns();
    uint64_t due = rx_by_app_ && app_is_spinning(now) ? now + kAckHoldNs : 0;
    for (Qp *qp : acks_) {
        std::lock_guard<std::mutex> g(qp->mu);
        qp->ack_listed = false;
        if (!qp->resp.ack_pending) continue;
        if (due && qp->ack_hold_pays && !qp->resp.reorder.held && !qp->resp.ack_urgent) {
            if (!qp->ack_deferred_listed) deferred_acks_.push_back({qp->qpx.qp_base.qp_num, due});
            qp->ack_deferred_listed = true;
            qp->ack_deferred = true;
            continue;
        }
        qp->ack_deferred = false;
        // Only RC QPs ever hold: the dispatcher watches for a ping-pong
        // there (send_packet).
        if (qp->type == IBV_QPT_RC) qp->ack_sent_ns = now;
        resp_send_ack(qp, tx);
    }
    acks_.clear();
}

void Nic::send_deferred_acks(TxBatch &tx, bool all) {
    uint64_t now = now_ns();
    auto keep = deferred_acks_.begin();
    for (const DeferredAck &d : deferred_acks_) {
        if (!all && int64_t(now - d.due_ns) < 0) {
            *keep++ = d;
            continue;
        }
        if (Qp *qp = find_qp(d.qpn)) {
            std::lock_guard<std::mutex> g(qp->mu);
            qp->ack_deferred_listed = false;
            resp_ack_hold_timed_out(qp, tx); // unless a request carried it
        }
    }
    deferred_acks_.erase(keep, deferred_acks_.end());
}

} // namespace sroce
