// SPDX-License-Identifier: MIT
//
// Building packets into a batch (pad, ICRC, runs for segmentation offload)
// and handing the batch to the port.
#include "icrc.hpp"
#include "nic.hpp"

#include <climits>
#include <cstring>

namespace sroce {

void Nic::queue(TxBatch &b, const IpAddr &src, const IpAddr &dst, IpFields f, const uint8_t *hdr,
                size_t hdr_len, const iovec *iov, int iovcnt, uint32_t payload_len,
                unsigned flags) {
    bool copy = flags & kQueueCopy;
    // With congestion control every packet but a CNP is ECN-capable, so a
    // switch marks it instead of dropping it; a traffic class that says
    // otherwise of ECN itself is left as the application set it.
    if (cc_.on && !(f.tclass & kEcnMask) && !(flags & kQueueCnp)) f.tclass |= kEct0;
    if (b.n == TxBatch::kSlots || b.niov + iovcnt + 2 > TxBatch::kIovs ||
        (copy && b.copied + payload_len > TxBatch::kCopyBytes)) {
        std::unique_lock<std::mutex> t;
        if (b.order) t = std::unique_lock<std::mutex>(*b.order);
        xmit(b);
    }
    TxBatch::Slot &s = b.slots[b.n];
    std::memcpy(s.hdr, hdr, hdr_len);
    uint32_t pad = (4 - (payload_len & 3)) & 3;
    s.hdr[1] = uint8_t((s.hdr[1] & ~0x30) | pad << 4);
    uint32_t udp_len = uint32_t(hdr_len + payload_len + pad + wire::kIcrcLen);
    uint32_t dqpn = wire::bth::qpn(s.hdr);

    // Join the run before, as its next segment, when the kernel can cut it
    // there: same destination QP (the receiving group steers a whole send by
    // its first packet), no larger than the run's packets, room left.  The
    // ICRC then covers the IP ID the segment will carry: its position.
    TxBatch::Run *run = b.nruns ? &b.runs[b.nruns - 1] : nullptr;
    msghdr *m = run ? &b.msgs[b.nruns - 1].msg_hdr : nullptr;
    bool join = run && port_->gso() && !run->closed && run->ip == f && run->dqpn == dqpn &&
                run->dst.addr() == dst && run->src == src && udp_len <= run->seg &&
                run->count < wire::kMaxSegments && run->bytes + udp_len <= wire::kMaxUdpPayload &&
                m->msg_iovlen + size_t(iovcnt) + 2 <= size_t(IOV_MAX);
    if (!join) {
        run = &b.runs[b.nruns];
        run->dst = SockAddr(dst, wire::kRoceV2Port, uint32_t(dev_->ifindex));
        run->src = src;
        run->ip = f;
        run->route = port_->route(src, dst, f);
        run->first = uint16_t(b.n);
        run->dqpn = dqpn;
        run->seg = udp_len;
        run->bytes = 0;
        run->count = 0;
        run->closed = false;
        m = &b.msgs[b.nruns].msg_hdr;
        *m = {};
        if (!run->route.peer) {
            m->msg_name = &run->dst.sa;
            m->msg_namelen = run->dst.len;
        }
        m->msg_iov = b.iov + b.niov;
        b.nruns++;
    }
    uint16_t pos = run->count++;
    run->bytes += udp_len;
    if (udp_len < run->seg) run->closed = true;

    // The ICRC is computed for ID `pos`, what the device socket gives; a
    // connected socket's packets are corrected when they are sent.
    IpHeader ip{src, dst, run->route.sport, wire::kRoceV2Port, pos};
    uint32_t crc = icrc_begin(ip, udp_len, s.hdr);
    crc = icrc_update(crc, s.hdr + wire::kBthLen, hdr_len - wire::kBthLen);
    iovec *out = b.iov + b.niov;
    int k = 0;
    out[k++] = {s.hdr, hdr_len};
    if (copy && payload_len) {
        if (!b.copy) b.copy.reset(new uint8_t[TxBatch::kCopyBytes]);
        uint8_t *dst = b.copy.get() + b.copied;
        out[k++] = {dst, payload_len};
        b.copied += payload_len;
        for (int i = 0; i < iovcnt; i++) {
            crc = icrc_copy(crc, dst, iov[i].iov_base, iov[i].iov_len);
            dst += iov[i].iov_len;
        }
    } else {
        for (int i = 0; i < iovcnt; i++) {
            if (!iov[i].iov_len) continue;
            crc = icrc_update(crc, iov[i].iov_base, iov[i].iov_len);
            out[k++] = iov[i];
        }
    }
    std::memset(s.tail, 0, pad);
    if (pad) crc = icrc_update(crc, s.tail, pad);
    s.pad = uint8_t(pad);
    s.ip_id = pos;
    s.id_tail = uint32_t(icrc_id_tail(udp_len));
    if (flags & kQueueLegacyFlush) {
        crc = icrc_update(crc, s.hdr, hdr_len);
        s.id_tail += uint32_t(hdr_len);
        stats.tx_flush_legacy_icrc.fetch_add(1, std::memory_order_relaxed);
    }
    icrc_store(s.tail + pad, crc);
    out[k++] = {s.tail, pad + wire::kIcrcLen};
    b.niov += k;
    m->msg_iovlen += size_t(k);
    b.n++;
}

void Nic::xmit(TxBatch &b) {
    port_->transmit(b);
    stats.tx_pkts.fetch_add(uint64_t(b.n), std::memory_order_relaxed);
    b.n = b.nruns = b.niov = 0;
    b.copied = 0;
}

} // namespace sroce
