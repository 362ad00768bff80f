// SPDX-License-Identifier: MIT
#include "port_udp.hpp"

#include "agent_client.hpp"
#include "icrc.hpp"
#include "nic.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <linux/in6.h>
#include <linux/net_tstamp.h>
#include <netinet/udp.h>
#include <unistd.h>

namespace sroce {

namespace {

// ThreadSanitizer orders a send before the receive of the same datagram
// only for sockets it saw created; the device sockets come from the agent
// (SCM_RIGHTS), so the order the kernel gives is told to it here.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
char g_wire_sync;
inline void wire_release() {
    __tsan_release(&g_wire_sync);
}
inline void wire_acquire() {
    __tsan_acquire(&g_wire_sync);
}
#else
inline void wire_release() {}
inline void wire_acquire() {}
#endif

// Set in each device's progress thread, which sends from sockets of its own.
thread_local bool t_progress_thread = false;

} // namespace

struct UdpPort::RxState {
    static constexpr int kBatch = kRxBatch;
    static constexpr size_t kBufLen = kMaxDatagram;
    // Not value-initialised: only the pages traffic reaches become resident.
    std::unique_ptr<uint8_t[]> bufs{new uint8_t[size_t(kBatch) * kBufLen]};
    mmsghdr msgs[kBatch];
    iovec iovs[kBatch];
    SockAddr froms[kBatch];
    // UDP_GRO's segment size; where the port has every address of its
    // interface, the one each datagram was sent to (IPV6_PKTINFO).
    static constexpr size_t kCtlLen = CMSG_SPACE(sizeof(int)) + kPktinfoSpace + kIpFieldsSpace;
    alignas(cmsghdr) uint8_t ctls[kBatch][kCtlLen];
    int used = 0;    // entries the last recvmmsg() filled
    int vlen = 1;    // entries the next recvmmsg() asks for
    int singles = 0; // back-to-back receives of one datagram with vlen 1

    RxState() {
        for (int i = 0; i < kBatch; i++) {
            iovs[i] = {bufs.get() + size_t(i) * kBufLen, kBufLen};
            msgs[i].msg_hdr = {};
            msgs[i].msg_hdr.msg_name = &froms[i].sa;
            msgs[i].msg_hdr.msg_namelen = sizeof froms[i].in6;
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctls[i];
            msgs[i].msg_hdr.msg_controllen = kCtlLen;
        }
    }
    // The segment size of a coalesced receive, or 0; the address it was
    // sent to, where the socket says; what its IP header held.
    static size_t control(const msghdr &m, IpAddr *dst, IpFields *ip) {
        size_t seg = 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(const_cast<msghdr *>(&m), c))
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                int v;
                std::memcpy(&v, CMSG_DATA(c), sizeof v);
                seg = v > 0 ? size_t(v) : 0;
            } else if (!read_ip_fields(c, ip)) {
                read_pktinfo(c, dst);
            }
        return seg;
    }
};

UdpPort::UdpPort(const char *name, const IpAddr &addr, int ifindex, NicStats &stats, Options o)
    : name_(name), addr_(addr), any_(addr.empty()), ifindex_(ifindex), stats_(stats), opt_(o),
      rx_(std::make_unique<RxState>()) {
    gso_.store(o.gso, std::memory_order_relaxed);
}

UdpPort::~UdpPort() {
    if (fd_ >= 0) close(fd_);
    if (rx_fd_ >= 0) close(rx_fd_);
    for (auto &table : peers_)
        for (PeerSocket &p : table)
            if (p.fd >= 0) close(p.fd);
    for (Group &g : groups_)
        if (int fd = g.fd.load(std::memory_order_relaxed); fd >= 0) close(fd);
}

void UdpPort::set_progress_thread() {
    t_progress_thread = true;
}

int UdpPort::new_socket(bool nonblock) const {
    return socket(any_ ? AF_INET6 : addr_.family(),
                  SOCK_DGRAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
}

int UdpPort::open() {
    fd_ = new_socket(true);
    if (fd_ < 0) return errno;
    rx_fd_ = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (rx_fd_ < 0) return errno;
    return 0;
}

int UdpPort::adopt(int sock, bool relayed) {
    int fd = sock;
    if (relayed) {
        // Packets come through the agent; this process sends from a
        // socket of its own on the address (any source port is RoCEv2's).
        fd = new_socket(false);
        SockAddr sa(addr_, 0, uint32_t(ifindex_));
        if (fd >= 0) agent::roce_socket_options(fd, addr_, ifindex_);
        if (fd < 0 || bind(fd, &sa.sa, sa.len) < 0) {
            int err = errno;
            if (fd >= 0) close(fd);
            close(sock);
            return err;
        }
    }
    if (dup2(fd, fd_) < 0 || dup2(sock, rx_fd_) < 0) {
        int err = errno;
        close(fd);
        if (sock != fd) close(sock);
        return err;
    }
    close(fd);
    if (sock != fd) close(sock);
    relayed_ = relayed;
    // Every socket of the address's group has its own setting: this
    // process's coalesced receives are its own choice.
    int gro = opt_.gro && !relayed_ ? 1 : 0;
    if (setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &gro, sizeof gro) < 0) opt_.gro = false;
    return 0;
}

int UdpPort::bind_exclusive() const {
    int fd = new_socket(false);
    if (fd < 0) return -1;
    agent::roce_socket_options(fd, addr_, ifindex_);
    SockAddr sa(addr_, wire::kRoceV2Port, uint32_t(ifindex_));
    if (bind(fd, &sa.sa, sa.len) < 0) {
        int err = errno;
        close(fd);
        // A missing address is a port that is down, not news for stderr.
        if (err != EADDRNOTAVAIL) {
            fprintf(stderr,
                    "sroce: %s: cannot bind [%s]:%u: %s (SROCE_AGENT=off gives a process the "
                    "address to itself)\n",
                    name_.c_str(), addr_.text().c_str(), wire::kRoceV2Port, strerror(err));
        }
        errno = err;
        return -1;
    }
    return fd;
}

void UdpPort::replace_rx(int rx) {
    if (rx < 0) rx = new_socket(true);
    if (rx < 0) return;
    dup2(rx, rx_fd_);
    close(rx);
}

void UdpPort::shut() {
    // An unbound socket in place of both: no thread ever uses a closed
    // descriptor number, and a relay whose agent is gone would poll
    // readable forever.
    if (int s = new_socket(true); s >= 0) {
        dup2(s, fd_);
        dup2(s, rx_fd_);
        close(s);
    }
}

Route UdpPort::route(const IpAddr &src, const IpAddr &dst, const IpFields &f) {
    // Over IPv4 a receiver tells the IP ID counters of connected sockets
    // apart by source port, and the application's and the progress
    // thread's sockets to one peer would share a flow label's port: the
    // label picks no port there.
    IpFields key = f;
    if (dst.is_v4()) key.flow = 0;
    PeerSocket *p = peer_socket(src, dst, key);
    return {p, p ? p->port : wire::kRoceV2Port};
}

namespace {

// Makes the IPv6 header of what socket `fd` sends to `dst` carry flow label
// `flow`, as the GRH names it: Linux writes a label a socket chose only
// when the socket holds a lease on it (IPV6_FLOWLABEL_MGR), shared with
// every socket of the network namespace that asks for it, and the
// destination it connects to carries it (IPV6_FLOWINFO_SEND).  False when
// the kernel refuses the lease - a label in the range it keeps for its
// own with net.ipv6.flowlabel_state_ranges, or past its limits - and the
// header then carries the label the kernel picks (auto_flowlabels).
bool lease_flow_label(int fd, const IpAddr &dst, uint32_t flow, SockAddr *to) {
    in6_flowlabel_req r{};
    r.flr_dst = dst.v6_addr();
    r.flr_label = htonl(flow & 0xFFFFF);
    r.flr_action = IPV6_FL_A_GET;
    r.flr_share = IPV6_FL_S_ANY;
    r.flr_flags = IPV6_FL_F_CREATE;
    int one = 1;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, &r, sizeof r) < 0 ||
        setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWINFO_SEND, &one, sizeof one) < 0)
        return false;
    to->in6.sin6_flowinfo = htonl(flow & 0xFFFFF);
    return true;
}

// The traffic class and hop limit of everything socket `fd` sends to
// `dst`; 0 leaves the kernel's.
void set_header_fields(int fd, const IpAddr &dst, const IpFields &f) {
    int tclass = f.tclass, hops = f.hop_limit;
    bool v4 = dst.is_v4();
    if (tclass)
        setsockopt(fd, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_TOS : IPV6_TCLASS, &tclass,
                   sizeof tclass);
    if (hops)
        setsockopt(fd, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_TTL : IPV6_UNICAST_HOPS, &hops,
                   sizeof hops);
}

} // namespace

PeerSocket *UdpPort::peer_socket(const IpAddr &src, const IpAddr &dst, const IpFields &f) {
    const uint32_t flow = f.flow;
    if (!opt_.connected || dst.multicast()) return nullptr;
    // The socket's lock is held across the send (the kernel numbers the
    // datagrams in the order they reach it).  The progress thread sending
    // an ACK while the application posts its next request to the same peer
    // — a ping-pong whose target spins on memory, as perftest's does —
    // would make the post sleep on that lock and pay a wake-up: the two
    // kinds of sender get a socket each.
    PeerSocket(&table)[kPeerSockets] = peers_[t_progress_thread ? 1 : 0];
    // Filled in order and never emptied: a lock-free look first, and no
    // lock at all once the table is full.
    bool full = true;
    for (PeerSocket &p : table) {
        if (!p.set.load(std::memory_order_acquire)) {
            full = false;
            break;
        }
        if (p.addr == dst && p.src == src && p.ip == f)
            return p.usable.load(std::memory_order_relaxed) ? &p : nullptr;
    }
    if (full) return nullptr;
    std::lock_guard<std::mutex> g(peers_mu_);
    for (PeerSocket &p : table) {
        if (p.set.load(std::memory_order_relaxed)) {
            if (p.addr == dst && p.src == src && p.ip == f)
                return p.usable.load(std::memory_order_relaxed) ? &p : nullptr;
            continue;
        }
        // Of the peer's family, bound to the address the QP sends from.
        int fd = socket(dst.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
        // A flow label names the source port (rdma-core's convention), which
        // other sockets of the host may have too: they only send.
        SockAddr sa(src, flow ? flow_label_sport(flow) : 0, uint32_t(ifindex_));
        socklen_t len = sa.len;
        bool ok = fd >= 0;
        if (ok) agent::roce_socket_options(fd, src, ifindex_);
        int one = 1;
        if (ok && flow) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        ok = ok && bind(fd, &sa.sa, sa.len) == 0 && getsockname(fd, &sa.sa, &len) == 0;
        p.port = sa.port();
        p.addr = dst;
        p.src = src;
        p.ip = f;
        if (ok) set_header_fields(fd, dst, f);
        SockAddr to(dst, wire::kRoceV2Port, uint32_t(ifindex_));
        if (ok && flow && !dst.is_v4() && !lease_flow_label(fd, dst, flow, &to))
            stats_.tx_flow_label_refused.fetch_add(1, std::memory_order_relaxed);
        ok = ok && connect(fd, &to.sa, to.len) == 0;
        if (ok) {
            p.fd = fd;
            std::lock_guard<std::mutex> l(p.mu);
            ok = learn_ip_id(p);
        }
        if (!ok && fd >= 0) {
            // The device socket serves this peer from now on.
            close(fd);
            p.fd = -1;
        }
        p.usable.store(ok, std::memory_order_relaxed);
        p.set.store(true, std::memory_order_release);
        return ok ? &p : nullptr;
    }
    return nullptr;
}

namespace {

// The IPv4 ID of our probe in a datagram looped back on the error queue
// (from its link-layer header on), or -1.
int probe_ip_id(const uint8_t *data, ssize_t n, in_addr_t addr, uint16_t from, uint16_t to) {
    for (ssize_t at = 0; at + 28 <= n && at <= 32; at++) {
        const uint8_t *h = data + at;
        in_addr_t src, dst;
        std::memcpy(&src, h + 12, 4);
        std::memcpy(&dst, h + 16, 4);
        if (h[0] == 0x45 && h[9] == IPPROTO_UDP && src == addr && dst == addr &&
            wire::get16(h + 20) == from && wire::get16(h + 22) == to)
            return wire::get16(h + 4);
    }
    return -1;
}

} // namespace

bool UdpPort::learn_ip_id(PeerSocket &p) {
    if (!p.addr.is_v4()) {
        // Nothing of the IPv6 header the ICRC covers depends on the socket.
        p.synced = true;
        return true;
    }
    p.synced = false;
    int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (rx < 0) return false;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = p.src.v4_addr();
    socklen_t len = sizeof to;
    int on = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE, off = 0;
    bool ok = bind(rx, reinterpret_cast<sockaddr *>(&to), sizeof to) == 0 &&
              getsockname(rx, reinterpret_cast<sockaddr *>(&to), &len) == 0 &&
              setsockopt(p.fd, SOL_SOCKET, SO_TIMESTAMPING, &on, sizeof on) == 0;
    int id = -1;
    // A few tries: an ICMP error (a peer's port unreachable) may land on
    // the socket between clearing it and the probe, and fail the probe.
    for (int attempt = 0; ok && id < 0 && attempt < 3; attempt++) {
        int err;
        len = sizeof err;
        getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        uint8_t probe = 0;
        // A destination other than the connected one still takes the
        // socket's next ID; our own address always leaves through loopback,
        // whose transmit path loops the datagram back with its timestamp.
        if (sendto(p.fd, &probe, 1, 0, reinterpret_cast<sockaddr *>(&to), sizeof to) != 1) continue;
        // Earlier probes' entries may still be queued: read to ours.
        pollfd pf = {p.fd, 0, 0}; // the error queue shows as POLLERR
        for (int waits = 0; id < 0;) {
            uint8_t data[256];
            alignas(cmsghdr) uint8_t ctl[256];
            iovec iov = {data, sizeof data};
            msghdr m{};
            m.msg_iov = &iov;
            m.msg_iovlen = 1;
            m.msg_control = ctl;
            m.msg_controllen = sizeof ctl;
            ssize_t n = recvmsg(p.fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
            if (n >= 0) {
                id = probe_ip_id(data, n, p.src.v4_addr(), p.port, ntohs(to.sin_port));
                continue;
            }
            if (errno != EAGAIN || waits++ == 1 || poll(&pf, 1, 100) <= 0) break;
        }
    }
    setsockopt(p.fd, SOL_SOCKET, SO_TIMESTAMPING, &off, sizeof off);
    close(rx);
    if (id < 0) return false;
    p.last_id = uint16_t(id);
    p.synced = true;
    stats_.tx_ip_id_learned.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void UdpPort::transmit(TxBatch &b) {
    uint64_t segmented = 0;
    for (int i = 0; i < b.nruns; i++) {
        TxBatch::Run &r = b.runs[i];
        msghdr &m = b.msgs[i].msg_hdr;
        // The device socket of a port with every address of its interface
        // is bound to none: the run names the one it leaves from.
        // The device socket is told per send what a connected one was
        // told once (set_header_fields).
        bool pktinfo = any_ && !r.route.peer;
        bool fields = !r.route.peer && (r.ip.tclass || r.ip.hop_limit);
        if (r.count < 2 && !pktinfo && !fields) continue;
        m.msg_control = r.ctl;
        m.msg_controllen = sizeof r.ctl;
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        size_t len = 0;
        if (r.count >= 2) {
            segmented += r.count;
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t seg = uint16_t(r.seg);
            std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
            len += CMSG_SPACE(sizeof seg);
            c = CMSG_NXTHDR(&m, c);
        }
        // Of the destination's family: a dual-stack socket sends to an
        // IPv4-mapped peer through IPv4, which reads only SOL_IP's.
        bool v4 = r.dst.addr().is_v4();
        auto put_int = [&](int level, int type, int v) {
            c->cmsg_level = level;
            c->cmsg_type = type;
            c->cmsg_len = CMSG_LEN(sizeof v);
            std::memcpy(CMSG_DATA(c), &v, sizeof v);
            len += CMSG_SPACE(sizeof v);
            c = CMSG_NXTHDR(&m, c);
        };
        if (fields && r.ip.tclass)
            put_int(v4 ? SOL_IP : SOL_IPV6, v4 ? IP_TOS : IPV6_TCLASS, r.ip.tclass);
        if (fields && r.ip.hop_limit)
            put_int(v4 ? SOL_IP : SOL_IPV6, v4 ? IP_TTL : IPV6_HOPLIMIT, r.ip.hop_limit);
        if (pktinfo) len += write_pktinfo(c, r.src, ifindex_);
        m.msg_controllen = len;
    }
    // Consecutive runs for one socket leave in one sendmmsg().  A failure
    // loses the rest of that socket's runs (the transport recovers them),
    // not other peers'.
    for (int off = 0, end; off < b.nruns; off = end) {
        end = off + 1;
        while (end < b.nruns && b.runs[end].route.peer == b.runs[off].route.peer)
            end++;
        send_runs(b, off, end, b.runs[off].route.peer);
    }
    if (segmented) stats_.tx_segmented.fetch_add(segmented, std::memory_order_relaxed);
}

void UdpPort::renumber(TxBatch &b, int off, int end, uint16_t first) {
    // Each datagram takes the counter's next value, the segments of a run
    // that value, +1, ….
    for (int i = off; i < end; i++) {
        const TxBatch::Run &r = b.runs[i];
        for (uint16_t k = 0; k < r.count; k++) {
            TxBatch::Slot &s = b.slots[r.first + k];
            uint16_t id = uint16_t(first + (i - off) + k);
            uint8_t *icrc = s.tail + s.pad;
            icrc_store(icrc, icrc_load(icrc) ^ icrc_id_delta(s.id_tail, s.ip_id ^ id));
            s.ip_id = id;
        }
    }
}

void UdpPort::send_runs(TxBatch &b, int off, int end, PeerSocket *p) {
    std::unique_lock<std::mutex> l;
    int fd = fd_;
    if (p) {
        l = std::unique_lock<std::mutex>(p->mu);
        if (!p->synced && !learn_ip_id(*p)) {
            // What was built for this socket is lost; the transport resends
            // it, built for the device socket.
            p->usable.store(false, std::memory_order_relaxed);
            return;
        }
        fd = p->fd;
        if (p->addr.is_v4()) renumber(b, off, end, uint16_t(p->last_id + 1));
        uint64_t n = 0;
        for (int i = off; i < end; i++)
            n += b.runs[i].count;
        stats_.tx_connected.fetch_add(n, std::memory_order_relaxed);
    }
    bool retried = false;
    while (off < end) {
        wire_release();
        int r = sendmmsg(fd, b.msgs + off, unsigned(end - off), 0);
        if (r >= 0) {
            off += r;
            if (!p) continue;
            p->last_id = uint16_t(p->last_id + r);
            if (off == end) break;
            // The kernel stopped at a datagram whose error it kept to
            // itself, possibly after giving it an ID: as for a failure.
            p->synced = false;
            return;
        }
        int err = errno;
        if (err == EINTR && !p) continue;
        if (p) {
            // Whether the failed datagram took an ID is not known: read the
            // counter again.  An ICMP error an earlier datagram drew (a
            // port that was closed then) fails the next send on a connected
            // socket before it leaves: send the rest once more.
            p->synced = false;
            if (err == ECONNREFUSED && !retried && learn_ip_id(*p)) {
                retried = true;
                if (p->addr.is_v4()) renumber(b, off, end, uint16_t(p->last_id + 1));
                continue;
            }
        }
        // A route whose device cannot take segmentation offload: its
        // packets are lost this once (retransmission sends them singly).
        if (b.runs[off].count > 1 && (err == EIO || err == EINVAL || err == EOPNOTSUPP)) {
            if (gso_.exchange(false))
                fprintf(stderr,
                        "sroce: %s: the kernel refused UDP segmentation offload (%s); "
                        "sending every packet as a datagram of its own\n",
                        name_.c_str(), strerror(err));
            if (p) return;
            off++;
            continue;
        }
        // A full socket buffer or an unreachable peer is packet loss to
        // the transport: retransmission recovers, so drop the rest.
        return;
    }
}

int UdpPort::receive(RxDatagram *out, int max) {
    int n = receive_from(rx_fd_, addr_, true, out, 0, max);
    if (ngroups_.load(std::memory_order_relaxed)) {
        for (Group &g : groups_)
            if (int fd = g.fd.load(std::memory_order_acquire); fd >= 0 && n < max)
                n += receive_from(fd, g.addr, false, out, n, max - n);
    }
    return n;
}

int UdpPort::receive_from(int fd, const IpAddr &dst, bool adaptive, RxDatagram *out, int at,
                          int max) {
    RxState &rx = *rx_;
    mmsghdr *msgs = rx.msgs + at;
    // recvmmsg() rewrites only the name length and flags of the entries it
    // filled: restore those, so that an empty poll costs no set-up.
    for (int i = at; i < rx.used; i++) {
        rx.msgs[i].msg_hdr.msg_namelen = sizeof rx.froms[i].in6;
        rx.msgs[i].msg_hdr.msg_controllen = RxState::kCtlLen;
        rx.msgs[i].msg_hdr.msg_flags = 0;
    }
    rx.used = at;
    // A batch costs a failed extra receive attempt whenever fewer datagrams
    // than asked for are queued, which is every time in a ping-pong.  So ask
    // for one until single datagrams keep arriving back to back, and for a
    // full batch while they do.
    int n = recvmmsg(fd, msgs, unsigned(adaptive ? std::min(rx.vlen, max) : max), MSG_DONTWAIT,
                     nullptr);
    if (n > 0) wire_acquire();
    if (n <= 0) {
        if (adaptive) rx.singles = 0;
        return 0;
    }
    if (adaptive) {
        if (rx.vlen == 1) {
            if (++rx.singles >= 2) rx.vlen = RxState::kBatch;
        } else if (n == 1) {
            rx.vlen = 1;
            rx.singles = 0;
        }
    }
    rx.used = at + n;
    for (int i = at; i < at + n; i++) {
        const msghdr &mh = rx.msgs[i].msg_hdr;
        RxDatagram &d = out[i];
        d.data = rx.bufs.get() + size_t(i) * RxState::kBufLen;
        d.len = rx.msgs[i].msg_len;
        d.src = rx.froms[i].addr();
        d.sport = rx.froms[i].port();
        d.dst = dst;
        d.seg = 0;
        d.ip = {};
        // Nothing of a datagram larger than any packet is used.
        if (mh.msg_flags & MSG_TRUNC) {
            d.data = nullptr;
            continue;
        }
        if (relayed_ && fd == rx_fd_) {
            // The agent says where the datagram came from, ahead of it.
            agent::RelayHdr h;
            if (d.len < sizeof h) {
                d.data = nullptr;
                continue;
            }
            std::memcpy(&h, d.data, sizeof h);
            d.src = IpAddr::of_gid(h.from_addr);
            d.sport = ntohs(h.from_port);
            d.dst = IpAddr::of_gid(h.to_addr);
            d.ip = {ntohl(h.flow_label) & 0xFFFFF, h.tclass, h.hop_limit};
            d.data += sizeof h;
            d.len -= sizeof h;
        }
        d.seg = RxState::control(mh, &d.dst, &d.ip);
        if (d.seg >= d.len) d.seg = 0;
        if (d.seg)
            stats_.rx_coalesced.fetch_add((d.len + d.seg - 1) / d.seg, std::memory_order_relaxed);
    }
    return n;
}

int UdpPort::join(const IpAddr &group) {
    Group *free_slot = nullptr;
    for (Group &g : groups_)
        if (g.fd.load(std::memory_order_relaxed) < 0) {
            free_slot = &g;
            break;
        }
    if (!free_slot) return ENOMEM;
    int fd = socket(group.family(), SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno;
    // Every device of the host joined to the group gets its own copy.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // A device of every address has [::]:4791, in the agent's reuseport
    // group: the group's address shares the port with it as its user's.
    if (any_) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (!group.is_v4()) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        agent::accept_zero_udp6_checksum(fd);
    }
    agent::receive_ip_fields(fd, group.is_v4(), !group.is_v4());
    SockAddr sa(group, wire::kRoceV2Port, uint32_t(ifindex_));
    int gro = opt_.gro ? 1 : 0;
    setsockopt(fd, IPPROTO_UDP, UDP_GRO, &gro, sizeof gro);
    // On the device's interface: by its address, or where the port has
    // every address of it, by its index.
    ip_mreqn m4{};
    m4.imr_multiaddr.s_addr = group.v4_addr();
    if (any_)
        m4.imr_ifindex = ifindex_;
    else
        m4.imr_address.s_addr = addr_.v4_addr();
    ipv6_mreq m6{};
    m6.ipv6mr_multiaddr = group.v6_addr();
    m6.ipv6mr_interface = unsigned(ifindex_);
    if (bind(fd, &sa.sa, sa.len) < 0 ||
        (group.is_v4() ? setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m4, sizeof m4)
                       : setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &m6, sizeof m6)) < 0) {
        int err = errno;
        close(fd);
        return err;
    }
    free_slot->addr = group;
    free_slot->fd.store(fd, std::memory_order_release);
    // The progress thread's next poll (within 1 ms) watches the socket too.
    ngroups_++;
    return 0;
}

void UdpPort::leave(const IpAddr &group) {
    for (Group &g : groups_) {
        if (g.fd.load(std::memory_order_relaxed) < 0 || g.addr != group) continue;
        close(g.fd.exchange(-1));
        ngroups_--;
        return;
    }
}

int UdpPort::poll_fds(pollfd *out, int max) {
    int n = 0;
    if (n < max) out[n++] = {rx_fd_, POLLIN, 0};
    if (ngroups_.load(std::memory_order_relaxed))
        for (Group &g : groups_)
            if (int fd = g.fd.load(std::memory_order_relaxed); fd >= 0 && n < max)
                out[n++] = {fd, POLLIN, 0};
    return n;
}

} // namespace sroce
