// SPDX-License-Identifier: MIT
#include "port_mem.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace sroce {

namespace {

// The wire: which MemPort has which address, who joined which group, and
// what is kept for the test's peers.  Made once and never destroyed, as
// progress threads may still send while the process exits.
struct Wire {
    std::mutex mu; // guards everything below
    std::vector<MemPort *> ports;
    struct Member {
        IpAddr group;
        MemPort *port;
    };
    std::vector<Member> members;
    struct Listener {
        IpAddr addr;
        std::deque<memwire::Packet> kept;
    };
    std::vector<Listener> listeners;
    std::atomic<bool> manual{false};

    // Queues the datagram at its destination; caller holds mu.
    bool deliver(const IpAddr &from, uint16_t sport, const IpAddr &dst, const uint8_t *data,
                 size_t len, size_t seg, IpFields ip) {
        // As the kernel fills what the sender leaves to it.
        if (!ip.hop_limit) ip.hop_limit = dst.multicast() ? 1 : 64;
        if (from.is_v4()) ip.flow = 0;
        bool any = false;
        if (dst.multicast()) {
            for (const Member &m : members)
                if (m.group == dst) {
                    m.port->deliver(from, sport, dst, data, len, seg, ip);
                    any = true;
                }
            return any;
        }
        for (MemPort *p : ports)
            if (p->addr() == dst) {
                p->deliver(from, sport, dst, data, len, seg, ip);
                return true;
            }
        for (Listener &l : listeners) {
            if (l.addr != dst) continue;
            // One packet each, as a packet socket on the wire would see them.
            size_t step = seg ? seg : len;
            uint16_t id = 0;
            for (size_t off = 0; off < len; off += step, id++) {
                size_t n = std::min(step, len - off);
                IpHeader hdr{from, dst, sport, wire::kRoceV2Port, id};
                l.kept.push_back({std::vector<uint8_t>(data + off, data + off + n), hdr, ip});
            }
            return true;
        }
        return false;
    }
};

Wire &wire_() {
    static Wire *w = [] {
        auto *made = new Wire;
        // A child of fork() has none of its parent's NICs (Nic::acquire):
        // their ports must not take its datagrams.
        pthread_atfork([] { wire_().mu.lock(); }, [] { wire_().mu.unlock(); },
                       [] {
                           Wire &c = wire_();
                           c.ports.clear();
                           c.members.clear();
                           c.mu.unlock();
                       });
        return made;
    }();
    return *w;
}

} // namespace

MemPort::MemPort(const IpAddr &addr) : addr_(addr) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    w.ports.push_back(this);
}

MemPort::~MemPort() {
    Wire &w = wire_();
    {
        std::lock_guard<std::mutex> g(w.mu);
        std::erase(w.ports, this);
        std::erase_if(w.members, [this](const Wire::Member &m) { return m.port == this; });
    }
    if (event_fd_ >= 0) close(event_fd_);
}

void MemPort::transmit(TxBatch &b) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    for (int i = 0; i < b.nruns; i++) {
        const TxBatch::Run &r = b.runs[i];
        const msghdr &m = b.msgs[i].msg_hdr;
        gather_.resize(r.bytes);
        size_t off = 0;
        for (size_t k = 0; k < m.msg_iovlen; k++) {
            std::memcpy(gather_.data() + off, m.msg_iov[k].iov_base, m.msg_iov[k].iov_len);
            off += m.msg_iov[k].iov_len;
        }
        w.deliver(r.src, wire::kRoceV2Port, r.dst.addr(), gather_.data(), off,
                  r.count > 1 ? r.seg : 0, r.ip);
    }
}

void MemPort::deliver(const IpAddr &from, uint16_t sport, const IpAddr &dst, const uint8_t *data,
                      size_t len, size_t seg, const IpFields &ip) {
    {
        std::lock_guard<std::mutex> g(mu_);
        // A full receive queue drops, as a full socket buffer does: a NIC
        // nobody polls must not grow without bound.
        if (queue_.size() >= kMaxQueued) return;
        queue_.push_back({std::vector<uint8_t>(data, data + len), from, sport, dst, seg, ip});
        if (event_fd_ < 0 || signalled_) return;
        signalled_ = true;
        uint64_t one = 1;
        if (write(event_fd_, &one, sizeof one) < 0) { /* the counter cannot overflow at 1 */
        }
    }
}

int MemPort::receive(RxDatagram *out, int max) {
    std::lock_guard<std::mutex> g(mu_);
    int n = 0;
    while (n < max && n < kRxBatch && !queue_.empty()) {
        taken_[n] = std::move(queue_.front());
        queue_.pop_front();
        const Datagram &d = taken_[n];
        // An empty datagram is one too (no data would mean "skip it").
        static const uint8_t kEmpty = 0;
        out[n] = {d.bytes.empty() ? &kEmpty : d.bytes.data(),
                  d.bytes.size(),
                  d.from,
                  d.sport,
                  d.dst,
                  d.seg,
                  d.ip};
        n++;
    }
    // What is left keeps the event set, so the next pass does not sleep
    // first; an empty queue clears it, under mu_ so that a datagram
    // delivered meanwhile sets it again.
    if (queue_.empty() && signalled_) {
        uint64_t v;
        if (read(event_fd_, &v, sizeof v) < 0) { /* it was set: cannot fail */
        }
        signalled_ = false;
    }
    return n;
}

int MemPort::join(const IpAddr &group) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    w.members.push_back({group, this});
    return 0;
}

void MemPort::leave(const IpAddr &group) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    std::erase_if(w.members,
                  [&](const Wire::Member &m) { return m.port == this && m.group == group; });
}

int MemPort::poll_fds(pollfd *out, int max) {
    if (max < 1) return 0;
    std::lock_guard<std::mutex> g(mu_);
    if (event_fd_ < 0) {
        event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (event_fd_ < 0) return 0; // the thread polls its timers' interval instead
        if (!queue_.empty()) {
            uint64_t one = 1;
            if (write(event_fd_, &one, sizeof one) < 0) { /* a fresh counter is 0 */
            }
            signalled_ = true;
        }
    }
    out[0] = {event_fd_, POLLIN, 0};
    return 1;
}

namespace memwire {

void listen(const IpAddr &addr) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    for (const Wire::Listener &l : w.listeners)
        if (l.addr == addr) return;
    w.listeners.push_back({addr, {}});
}

bool take(const IpAddr &addr, Packet &out) {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    for (Wire::Listener &l : w.listeners) {
        if (l.addr != addr || l.kept.empty()) continue;
        out = std::move(l.kept.front());
        l.kept.pop_front();
        return true;
    }
    return false;
}

void reset() {
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    w.listeners.clear();
}

bool send(const IpAddr &from, uint16_t sport, const IpAddr &to, const uint8_t *data, size_t len,
          size_t seg, const IpFields &ip) {
    // No datagram is larger than UDP's: the receive path's buffers (the
    // fault injector's held packet) are that large.
    if (len > Port::kMaxDatagram) return false;
    Wire &w = wire_();
    std::lock_guard<std::mutex> g(w.mu);
    return w.deliver(from, sport, to, data, len, seg && seg < len ? seg : 0, ip);
}

void set_manual_progress(bool manual) {
    wire_().manual.store(manual);
}

bool manual_progress() {
    return wire_().manual.load();
}

} // namespace memwire

} // namespace sroce
