// SPDX-License-Identifier: MIT
#include "nic.hpp"

#include "icrc.hpp"
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <linux/net_tstamp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdexcept>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <system_error>
#include <time.h>
#include <unistd.h>

namespace sroce {

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

FaultConfig parse_fault_config(const std::string &spec) {
    FaultConfig f;
    size_t pos = 0;
    while (pos < spec.size()) {
        size_t end = spec.find(',', pos);
        if (end == std::string::npos) end = spec.size();
        std::string item = spec.substr(pos, end - pos);
        pos = end + 1;
        if (item.empty()) continue;
        size_t eq = item.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("expected key=value: " + item);
        std::string k = item.substr(0, eq), v = item.substr(eq + 1);
        size_t used = 0;
        double d = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument("bad number: " + item);
        if (k == "seed") {
            f.seed = uint64_t(d);
            continue;
        }
        if (k == "drop_at") {
            if (d < 1 || d != double(uint64_t(d)) || f.n_drop_at == FaultConfig::kMaxDropAt)
                throw std::invalid_argument("drop_at wants a datagram number >= 1, at most " +
                                            std::to_string(FaultConfig::kMaxDropAt) +
                                            " times: " + item);
            f.drop_at[f.n_drop_at++] = uint64_t(d);
            continue;
        }
        if (d < 0 || d > 1) throw std::invalid_argument("probability out of [0,1]: " + item);
        if (k == "drop")
            f.drop = d;
        else if (k == "dup")
            f.dup = d;
        else if (k == "reorder")
            f.reorder = d;
        else
            throw std::invalid_argument("unknown fault: " + k);
    }
    return f;
}

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

std::mutex g_nics_mu;
Nic *g_nics[kMaxDevices] = {};

// A child of fork() has none of its parent's progress threads, and shares
// its sockets and its lease with it: the parent's devices are no use to it
// (as an RNIC's contexts are not across fork), so an open in the child
// starts afresh with a lease of its own.  The inherited objects stay
// allocated and untouched: their destructors would join threads that do
// not exist in the child.
void forget_inherited_nics() {
    for (Nic *&n : g_nics)
        n = nullptr;
}

[[maybe_unused]] const int g_atfork =
    pthread_atfork([] { g_nics_mu.lock(); }, [] { g_nics_mu.unlock(); },
                   [] {
                       forget_inherited_nics();
                       g_nics_mu.unlock();
                   });

bool stats_wanted() {
    const char *s = getenv("SROCE_STATS");
    return s && *s == '1';
}

// librdmacm keeps every device it has seen open until the process ends, so
// their NICs are never released: those still open print at exit.
void print_open_nics_stats() {
    std::unique_lock<std::mutex> g(g_nics_mu, std::try_to_lock);
    if (!g.owns_lock()) return; // exit() from a thread inside acquire/release
    for (Nic *n : g_nics)
        if (n) n->print_stats();
}

double next_uniform(uint64_t &s) {
    // splitmix64: cheap and reproducible from the seed.
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) / double(1ull << 53);
}

} // namespace

Nic *Nic::acquire(Device *dev) {
    std::lock_guard<std::mutex> g(g_nics_mu);
    Nic *&slot = g_nics[dev->index];
    // A lost device stays with the contexts that had it; a new open gets a
    // new lease (from a restarted agent).
    if (slot && slot->lost()) slot = nullptr;
    if (!slot) {
        Nic *n = nullptr;
        try {
            n = new Nic(dev);
            if (int err = n->open_socket()) {
                delete n;
                errno = err;
                return nullptr;
            }
            n->thread_ = std::thread([n] { n->run(); });
            // "sroce-<device>" in top -H, perf and /proc (15 characters).
            std::string name = std::string("sroce-") + dev->ibdev.name;
            pthread_setname_np(n->thread_.native_handle(), name.substr(0, 15).c_str());
        } catch (const std::bad_alloc &) {
            delete n;
            return out_of_memory<Nic *>(nullptr);
        } catch (const std::system_error &e) {
            // No thread could be started (EAGAIN: a process or memory limit).
            delete n;
            errno = e.code().value();
            return nullptr;
        }
        slot = n;
        if (stats_wanted()) {
            static std::once_flag once;
            std::call_once(once, [] { atexit(print_open_nics_stats); });
        }
    }
    slot->refs_++;
    return slot;
}

void Nic::print_stats() {
    if (stats_printed_.exchange(true)) return;
    auto v = [](const std::atomic<uint64_t> &a) {
        return (unsigned long long)a.load(std::memory_order_relaxed);
    };
    fprintf(stderr,
            "sroce: %s: rx_pkts %llu tx_pkts %llu rx_bad_icrc %llu rx_bad_hdr %llu "
            "rx_no_qp %llu rx_dropped_fault %llu retransmits %llu timeouts %llu "
            "rx_flush_legacy_icrc %llu tx_flush_legacy_icrc %llu tx_segmented %llu "
            "rx_coalesced %llu rx_ip_id_solved %llu rx_held %llu tx_resent_selective %llu "
            "tx_connected %llu tx_ip_id_learned %llu\n",
            dev_->ibdev.name, v(stats.rx_pkts), v(stats.tx_pkts), v(stats.rx_bad_icrc),
            v(stats.rx_bad_hdr), v(stats.rx_no_qp), v(stats.rx_dropped_fault), v(stats.retransmits),
            v(stats.timeouts), v(stats.rx_flush_legacy_icrc), v(stats.tx_flush_legacy_icrc),
            v(stats.tx_segmented), v(stats.rx_coalesced), v(stats.rx_ip_id_solved),
            v(stats.rx_held), v(stats.tx_resent_selective), v(stats.tx_connected),
            v(stats.tx_ip_id_learned));
}

void Nic::release() {
    std::lock_guard<std::mutex> g(g_nics_mu);
    if (--refs_ > 0) return;
    if (g_nics[dev_->index] == this) g_nics[dev_->index] = nullptr;
    delete this;
}

struct Nic::RxState {
    static constexpr int kBatch = 64;
    // A coalesced receive (UDP_GRO) holds up to one IPv4 datagram's worth.
    static constexpr size_t kBufLen = 65536;
    // Not value-initialised: only the pages traffic reaches become resident.
    std::unique_ptr<uint8_t[]> bufs{new uint8_t[size_t(kBatch) * kBufLen]};
    mmsghdr msgs[kBatch];
    iovec iovs[kBatch];
    sockaddr_in froms[kBatch];
    static constexpr size_t kCtlLen = CMSG_SPACE(sizeof(int));
    alignas(cmsghdr) uint8_t ctls[kBatch][kCtlLen];
    // Reorder injection holds one packet back and delivers it after the next.
    std::unique_ptr<uint8_t[]> held{new uint8_t[kBufLen]};
    size_t held_len = 0;
    sockaddr_in held_from{};
    in_addr_t held_dst = 0;
    uint16_t held_pos = 0;
    int used = 0;    // entries the last recvmmsg() filled
    int vlen = 1;    // entries the next recvmmsg() asks for
    int singles = 0; // back-to-back receives of one datagram with vlen 1

    RxState() {
        for (int i = 0; i < kBatch; i++) {
            iovs[i] = {bufs.get() + size_t(i) * kBufLen, kBufLen};
            msgs[i].msg_hdr = {};
            msgs[i].msg_hdr.msg_name = &froms[i];
            msgs[i].msg_hdr.msg_namelen = sizeof froms[i];
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctls[i];
            msgs[i].msg_hdr.msg_controllen = kCtlLen;
        }
    }
    // The segment size of a coalesced receive, or 0.
    static size_t segment_size(const msghdr &m) {
        for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(const_cast<msghdr *>(&m), c))
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                int v;
                std::memcpy(&v, CMSG_DATA(c), sizeof v);
                return v > 0 ? size_t(v) : 0;
            }
        return 0;
    }
};

Nic::Nic(Device *dev)
    : dev_(dev), rx_(std::make_unique<RxState>()), tx_(std::make_unique<TxBatch>()),
      timer_tx_(std::make_unique<TxBatch>()) {
    // A QP is listed at most once (ack_listed): the receive path never grows it.
    acks_.reserve(kMaxQps);
    if (const char *f = getenv("SROCE_FAULT"); f && *f) {
        try {
            fault_ = parse_fault_config(f);
        } catch (const std::exception &e) {
            fprintf(stderr, "sroce: ignoring SROCE_FAULT=%s: %s\n", f, e.what());
        }
        rng_ = fault_.seed;
    }
    if (const char *b = getenv("SROCE_BUSY_POLL"); b && *b == '1') busy_poll_ = true;
    if (const char *a = getenv("SROCE_APP_PROGRESS"); a && *a == '0') app_progress_ = false;
    if (const char *s = getenv("SROCE_SPIN_US"); s && *s)
        spin_ns_ = strtoull(s, nullptr, 10) * 1000;
    if (const char *g = getenv("SROCE_GSO"); g && *g == '0') gso_ = false;
    if (const char *g = getenv("SROCE_GRO"); g && *g == '0') gro_ = false;
    if (const char *r = getenv("SROCE_SELECTIVE_REPEAT"); r && *r == '0') selective_repeat_ = false;
    if (const char *c = getenv("SROCE_CONNECTED"); c && *c == '0') connected_ = false;
}

Nic::~Nic() {
    if (stats_wanted()) print_stats();
    stop_ = true;
    // The progress thread first: it is what starts a resumer.
    if (thread_.joinable()) {
        uint64_t one = 1;
        if (write(wake_fd_, &one, sizeof one) < 0) { /* the thread also polls stop_ */
        }
        thread_.join();
    }
    if (resumer_.joinable()) resumer_.join();
    if (fd_ >= 0) close(fd_);
    if (rx_fd_ >= 0) close(rx_fd_);
    for (auto &table : peers_)
        for (PeerSocket &p : table)
            if (p.fd >= 0) close(p.fd);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (lease_.conn >= 0) close(lease_.conn);
    if (table_) munmap(table_, kMaxQps * sizeof(agent::QpEntry));
    if (table_fd_ >= 0) close(table_fd_);
}

int Nic::open_socket() {
    static_assert(kMaxQps == agent::kTableEntries);
    size_t table_len = kMaxQps * sizeof(agent::QpEntry);
    // Sealed against shrinking: the agent maps it too, and refuses a table
    // that could shrink under its reads (a SIGBUS there is every user's).
    table_fd_ = memfd_create("sroce-qps", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (table_fd_ < 0 || ftruncate(table_fd_, off_t(table_len)) < 0 ||
        fcntl(table_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
        return errno;
    void *t = mmap(nullptr, table_len, PROT_READ | PROT_WRITE, MAP_SHARED, table_fd_, 0);
    if (t == MAP_FAILED) return errno;
    table_ = static_cast<agent::QpEntry *>(t);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return errno;
    // An unbound socket stands in until the address's own: every thread
    // always has a descriptor to poll and receive from, on which nothing
    // ever arrives.  bind_socket() puts the real one in its place.
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) return errno;
    rx_fd_ = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (rx_fd_ < 0) return errno;
    // A device whose address is not on the host opens, with its port down,
    // as an RNIC whose net device lost its address does; the socket comes
    // with the first QP or SRQ made once the address is back.
    int down = link_down_reason(dev_->link);
    port_down_.store(down, std::memory_order_relaxed);
    if (down == EADDRNOTAVAIL) return 0;
    int err = bind_socket();
    return err == EADDRNOTAVAIL ? 0 : err;
}

int Nic::bind_socket() {
    uint32_t slot = 1;
    int fd;
    if (const char *a = getenv("SROCE_AGENT"); a && !strcmp(a, "off")) {
        fd = open_exclusive();
        if (fd < 0) return errno;
    } else {
        if (int err = agent::lease_slot(dev_->ibdev.name, dev_->link.netdev.c_str(), dev_->addr,
                                        table_fd_, lease_))
            return err;
        fd = lease_.udp;
        slot = lease_.slot;
    }
    int rx = fd;
    if (lease_.relayed) {
        // Packets come through the agent; this process sends from a
        // socket of its own on the address (any source port is RoCEv2's).
        fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = dev_->addr;
        if (fd >= 0) agent::roce_socket_options(fd, dev_->addr);
        if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0) {
            int err = errno;
            if (fd >= 0) close(fd);
            close(rx);
            return err;
        }
    }
    // Into the stand-ins' numbers: a thread polling or receiving meanwhile
    // never meets a closed descriptor.
    if (dup2(fd, fd_) < 0 || dup2(rx, rx_fd_) < 0) {
        int err = errno;
        close(fd);
        if (rx != fd) close(rx);
        return err;
    }
    close(fd);
    if (rx != fd) close(rx);
    relayed_ = lease_.relayed;
    lease_.udp = fd_;
    // Every socket of the address's group has its own setting: this
    // process's coalesced receives are its own choice.
    int gro = gro_ && !relayed_ ? 1 : 0;
    if (setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &gro, sizeof gro) < 0) gro_ = false;
    qpn_base_ = slot << agent::kSlotShift | kQpnBase;
    srqn_base_ = slot << agent::kSlotShift | kSrqnBase;
    // Start numbering where this process's previous lease of the slot is
    // unlikely to have stopped, so a late packet meets no QP of ours.
    qp_next_ = uint32_t(getpid()) % kMaxQps;
    bound_.store(true, std::memory_order_release);
    return 0;
}

int Nic::ensure_socket() {
    if (bound_.load(std::memory_order_acquire)) return 0;
    int down, err = 0;
    {
        std::lock_guard<std::mutex> g(bind_mu_);
        if (bound_.load(std::memory_order_relaxed)) return 0;
        down = link_down_reason(dev_->link);
        if (!down) {
            std::lock_guard<std::mutex> q(qp_alloc_mu_);
            err = bind_socket();
        }
    }
    // Outside the locks: an event handler may well create a QP.
    port_seen(down);
    return down ? down : err;
}

void Nic::port_seen(int reason) {
    if (lost()) return;
    int was = port_down_.exchange(reason, std::memory_order_relaxed);
    if (!was == !reason) return;
    post_device_event(this, reason ? IBV_EVENT_PORT_ERR : IBV_EVENT_PORT_ACTIVE);
}

int Nic::open_exclusive() {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    agent::roce_socket_options(fd, dev_->addr);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(wire::kRoceV2Port);
    sa.sin_addr.s_addr = dev_->addr;
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0) {
        int err = errno;
        close(fd);
        // A missing address is a port that is down, not news for stderr.
        if (err != EADDRNOTAVAIL) {
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &dev_->addr, a, sizeof a);
            fprintf(stderr,
                    "sroce: %s: cannot bind %s:%u: %s (SROCE_AGENT=off gives a process the "
                    "address to itself)\n",
                    dev_->ibdev.name, a, wire::kRoceV2Port, strerror(err));
        }
        errno = err;
        return -1;
    }
    return fd;
}

void Nic::watch_agent() {
    if (!bound_.load(std::memory_order_acquire) || resuming_.load(std::memory_order_acquire) ||
        lease_.conn < 0 || lost())
        return;
    pollfd p = {lease_.conn, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return;
    char b;
    if (recv(lease_.conn, &b, 1, MSG_DONTWAIT) != 0 && !(p.revents & (POLLHUP | POLLERR))) return;
    if (lease_.steering_kept)
        begin_resume();
    else
        lose_device();
}

// The agent died, but the kernel steers on by its slot map: this process's
// socket (or, relayed, nothing until a new relay comes) keeps the QPs'
// traffic, and the slot goes back to it under the next agent.
void Nic::begin_resume() {
    close(lease_.conn);
    lease_.conn = -1;
    resuming_.store(true, std::memory_order_release);
    if (relayed_) {
        // A relay whose agent is gone would poll readable forever.
        if (int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0); s >= 0) {
            dup2(s, rx_fd_);
            close(s);
        }
    }
    fprintf(stderr,
            "sroce: %s: the sroce agent exited; the device's QPs go on%s while slot %u "
            "is taken back under a new agent\n",
            dev_->ibdev.name, relayed_ ? " (receiving nothing)" : "", lease_.slot);
    if (resumer_.joinable()) resumer_.join(); // the last one, finished
    resumer_ = std::thread([this] { resume_slot(); });
}

void Nic::resume_slot() {
    unsigned wait_s = kAgentWaitS;
    if (const char *w = getenv("SROCE_AGENT_WAIT"); w && *w) wait_s = unsigned(atoi(w));
    uint64_t deadline = now_ns() + uint64_t(wait_s) * 1000000000;
    // Only an agent of the user that ran the last one may take its place
    // (connect_agent checks it is root's or ours); a process of another
    // user waits for it rather than start one of its own.
    agent::Resume r{lease_.slot, relayed_ ? -1 : fd_, lease_.agent_uid == geteuid(), {}};
    uint64_t delay_ms = 10;
    int err = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
        agent::Lease got;
        r.why.clear();
        err = agent::lease_slot(dev_->ibdev.name, dev_->link.netdev.c_str(), dev_->addr, table_fd_,
                                got, &r);
        if (!err) {
            if (relayed_) dup2(got.udp, rx_fd_);
            if (got.udp >= 0) close(got.udp);
            lease_.conn = got.conn;
            lease_.agent_uid = got.agent_uid;
            lease_.steering_kept = got.steering_kept;
            resuming_.store(false, std::memory_order_release);
            fprintf(stderr, "sroce: %s: slot %u resumed under the new sroce agent\n",
                    dev_->ibdev.name, lease_.slot);
            return;
        }
        if (now_ns() >= deadline) break;
        for (uint64_t t = 0; t < delay_ms && !stop_.load(std::memory_order_relaxed); t += 10)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        delay_ms = std::min<uint64_t>(delay_ms * 2, 500);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    fprintf(stderr, "sroce: %s: no sroce agent took slot %u back within %u s (%s)\n",
            dev_->ibdev.name, lease_.slot, wait_s, r.why.empty() ? strerror(err) : r.why.c_str());
    lose_device();
}

void Nic::lose_device() {
    fprintf(stderr,
            "sroce: %s: the sroce agent exited; the device is lost (its QPs are in error, "
            "IBV_EVENT_DEVICE_FATAL); close and reopen it to go on\n",
            dev_->ibdev.name);
    lost_.store(true);
    {
        std::lock_guard<std::mutex> g(objects_mu);
        for_each_qp([](Qp *qp) {
            std::lock_guard<std::mutex> q(qp->mu);
            qp_enter_error(qp);
        });
    }
    post_device_event(this, IBV_EVENT_DEVICE_FATAL);
    // The address's group must empty for a restarted agent to rebuild it:
    // our socket goes now, replaced by an unbound one so that no thread
    // ever uses a closed descriptor number.
    if (int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0); s >= 0) {
        dup2(s, fd_);
        dup2(s, rx_fd_); // a relay whose agent is gone would poll readable forever
        close(s);
    }
}

uint32_t Nic::add_qp(Qp *qp) {
    std::lock_guard<std::mutex> g(qp_alloc_mu_);
    for (uint32_t k = 0; k < kMaxQps; k++) {
        uint32_t i = (qp_next_ + k) % kMaxQps;
        if (!qps_[i].load(std::memory_order_relaxed)) {
            qps_[i].store(qp, std::memory_order_release);
            qp_next_ = i + 1;
            if (i + 1 > qp_top_.load(std::memory_order_relaxed))
                qp_top_.store(i + 1, std::memory_order_release);
            // The progress thread of a device without QPs sleeps long
            // (wait_for_work): this one's timers need it back.
            if (live_qps_.fetch_add(1, std::memory_order_relaxed) == 0) {
                uint64_t one = 1;
                if (write(wake_fd_, &one, sizeof one) < 0) { /* already woken */
                }
            }
            return qpn_base_ + i;
        }
    }
    return 0;
}

uint32_t Nic::add_srq(Srq *srq) {
    std::lock_guard<std::mutex> g(qp_alloc_mu_);
    for (uint32_t i = 0; i < kMaxSrqs; i++) {
        if (!srqs_[i].load(std::memory_order_relaxed)) {
            srqs_[i].store(srq, std::memory_order_release);
            return srqn_base_ + i;
        }
    }
    return 0;
}

void Nic::remove_srq(Srq *srq) {
    uint32_t i = srq->srq_num - srqn_base_;
    if (i < kMaxSrqs) srqs_[i].store(nullptr, std::memory_order_release);
}

void Nic::remove_qp(Qp *qp) {
    uint32_t i = qp->qpx.qp_base.qp_num - qpn_base_;
    if (i >= kMaxQps) return;
    qps_[i].store(nullptr, std::memory_order_release);
    table_[i].id.store(0, std::memory_order_relaxed);
    live_qps_.fetch_sub(1, std::memory_order_relaxed);
}

void Nic::publish_qp(const Qp *qp) {
    uint32_t qpn = qp->qpx.qp_base.qp_num;
    uint32_t i = qpn - qpn_base_;
    if (i >= kMaxQps) return;
    bool connected = qp->type != IBV_QPT_UD && qp->attr.state >= IBV_QPS_RTR;
    table_[i].peer.store(connected ? uint64_t(qp->attr.dest_addr) << 32 | qp->attr.dest_qpn : 0,
                         std::memory_order_relaxed);
    table_[i].id.store(agent::qp_entry_id(qpn, qp->type, qp->attr.state),
                       std::memory_order_relaxed);
}

namespace {
// Set in each device's progress thread, which sends from sockets of its own.
thread_local bool t_progress_thread = false;
} // namespace

Nic::PeerSocket *Nic::peer_socket(in_addr_t dst) {
    if (!connected_ || IN_MULTICAST(ntohl(dst))) return nullptr;
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
        in_addr_t a = p.addr.load(std::memory_order_acquire);
        if (a == dst) return p.usable.load(std::memory_order_relaxed) ? &p : nullptr;
        if (!a) {
            full = false;
            break;
        }
    }
    if (full) return nullptr;
    std::lock_guard<std::mutex> g(peers_mu_);
    for (PeerSocket &p : table) {
        in_addr_t a = p.addr.load(std::memory_order_relaxed);
        if (a == dst) return p.usable.load(std::memory_order_relaxed) ? &p : nullptr;
        if (a) continue;
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = dev_->addr;
        socklen_t len = sizeof sa;
        bool ok = fd >= 0;
        if (ok) agent::roce_socket_options(fd, dev_->addr);
        ok = ok && bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0 &&
             getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len) == 0;
        p.port = ntohs(sa.sin_port);
        sa.sin_port = htons(wire::kRoceV2Port);
        sa.sin_addr.s_addr = dst;
        ok = ok && connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0;
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
        p.addr.store(dst, std::memory_order_release);
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

bool Nic::learn_ip_id(PeerSocket &p) {
    p.synced = false;
    int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (rx < 0) return false;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = dev_->addr;
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
                id = probe_ip_id(data, n, dev_->addr, p.port, ntohs(to.sin_port));
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
    stats.tx_ip_id_learned.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void Nic::queue(TxBatch &b, in_addr_t dst, const uint8_t *hdr, size_t hdr_len, const iovec *iov,
                int iovcnt, uint32_t payload_len, unsigned flags) {
    bool copy = flags & kQueueCopy;
    if (b.n == TxBatch::kSlots || b.niov + iovcnt + 2 > TxBatch::kIovs ||
        (copy && b.copied + payload_len > TxBatch::kCopyBytes)) {
        std::unique_lock<std::mutex> t;
        if (b.order) t = std::unique_lock<std::mutex>(*b.order);
        flush(b);
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
    bool join = run && gso_.load(std::memory_order_relaxed) && !run->closed &&
                run->dst.sin_addr.s_addr == dst && run->dqpn == dqpn && udp_len <= run->seg &&
                run->count < wire::kMaxSegments && run->bytes + udp_len <= wire::kMaxUdpPayload &&
                m->msg_iovlen + size_t(iovcnt) + 2 <= size_t(IOV_MAX);
    if (!join) {
        run = &b.runs[b.nruns];
        run->dst = {};
        run->dst.sin_family = AF_INET;
        run->dst.sin_port = htons(wire::kRoceV2Port);
        run->dst.sin_addr.s_addr = dst;
        run->peer = peer_socket(dst);
        run->first = uint16_t(b.n);
        run->dqpn = dqpn;
        run->seg = udp_len;
        run->bytes = 0;
        run->count = 0;
        run->closed = false;
        m = &b.msgs[b.nruns].msg_hdr;
        *m = {};
        if (!run->peer) {
            m->msg_name = &run->dst;
            m->msg_namelen = sizeof run->dst;
        }
        m->msg_iov = b.iov + b.niov;
        b.nruns++;
    }
    uint16_t pos = run->count++;
    run->bytes += udp_len;
    if (udp_len < run->seg) run->closed = true;

    // The ICRC is computed for ID `pos`, what the device socket gives; a
    // connected socket's packets are corrected when they are sent.
    Ipv4Header ip{dev_->addr, dst, run->peer ? run->peer->port : wire::kRoceV2Port,
                  wire::kRoceV2Port, pos};
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

void Nic::flush(TxBatch &b) {
    uint64_t segmented = 0;
    for (int i = 0; i < b.nruns; i++) {
        TxBatch::Run &r = b.runs[i];
        msghdr &m = b.msgs[i].msg_hdr;
        if (r.count < 2) continue;
        segmented += r.count;
        m.msg_control = r.ctl;
        m.msg_controllen = sizeof r.ctl;
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t seg = uint16_t(r.seg);
        std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
    }
    // Consecutive runs for one socket leave in one sendmmsg().  A failure
    // loses the rest of that socket's runs (the transport recovers them),
    // not other peers'.
    for (int off = 0, end; off < b.nruns; off = end) {
        end = off + 1;
        while (end < b.nruns && b.runs[end].peer == b.runs[off].peer)
            end++;
        send_runs(b, off, end, b.runs[off].peer);
    }
    stats.tx_pkts.fetch_add(uint64_t(b.n), std::memory_order_relaxed);
    if (segmented) stats.tx_segmented.fetch_add(segmented, std::memory_order_relaxed);
    b.n = b.nruns = b.niov = 0;
    b.copied = 0;
}

void Nic::renumber(TxBatch &b, int off, int end, uint16_t first) {
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

void Nic::send_runs(TxBatch &b, int off, int end, PeerSocket *p) {
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
        renumber(b, off, end, uint16_t(p->last_id + 1));
        uint64_t n = 0;
        for (int i = off; i < end; i++)
            n += b.runs[i].count;
        stats.tx_connected.fetch_add(n, std::memory_order_relaxed);
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
                renumber(b, off, end, uint16_t(p->last_id + 1));
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
                        dev_->ibdev.name, strerror(err));
            if (p) return;
            off++;
            continue;
        }
        // A full socket buffer or an unreachable peer is packet loss to
        // the transport: retransmission recovers, so drop the rest.
        return;
    }
}

void Nic::dispatch(const uint8_t *data, size_t len, const sockaddr_in &from, in_addr_t dst,
                   uint16_t pos, TxBatch &tx) {
    wire::Packet pkt;
    if (wire::parse(data, len, pkt) != wire::ParseError::kOk) {
        stats.rx_bad_hdr.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    uint16_t sport = ntohs(from.sin_port);
    Ipv4Header ip{from.sin_addr.s_addr, dst, sport, wire::kRoceV2Port, pos};
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
    if (sport != wire::kRoceV2Port) {
        guess = &id_guess_[(ntohl(from.sin_addr.s_addr) * 31u + sport) % std::size(id_guess_)];
        if (guess->addr == from.sin_addr.s_addr && guess->port == sport)
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
            bool known = guess->addr == from.sin_addr.s_addr && guess->port == sport;
            uint16_t high = known && int16_t(base - guess->high) < 0 ? guess->high : base;
            *guess = {from.sin_addr.s_addr, sport, base, high};
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
    pkt.src_addr = from.sin_addr.s_addr;
    pkt.src_port = ntohs(from.sin_port);
    pkt.dst_addr = dst;
    if (dst != dev_->addr) {
        // A multicast group's: every UD QP attached gets a copy.
        for (McGroup &m : mc_) {
            if (m.fd.load(std::memory_order_relaxed) < 0 || m.addr != dst) continue;
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
        (!request && pkt.src_addr != qp->attr.dest_addr)) {
        stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    tx.order = &qp->tx_mu;
    if (request) {
        // The peer's own FLUSH shows the ICRC form it takes (req.cpp).
        if (pkt.opcode == wire::kFlush && pkt.src_addr == qp->attr.dest_addr)
            qp->req.flush_icrc = pkt.legacy_icrc ? kFlushIcrcLegacy : kFlushIcrcIbta;
        resp_receive(qp, pkt, tx);
        if (qp->resp.ack_pending && !qp->resp.ack_listed) {
            qp->resp.ack_listed = true;
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

int Nic::attach_mcast(Qp *qp, in_addr_t group) {
    std::lock_guard<std::mutex> r(rx_mu_);
    std::lock_guard<std::mutex> g(objects_mu);
    McGroup *free_slot = nullptr;
    for (McGroup &m : mc_) {
        int fd = m.fd.load(std::memory_order_relaxed);
        if (fd < 0) {
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
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno;
    // Every device of the host joined to the group gets its own copy.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(wire::kRoceV2Port);
    sa.sin_addr.s_addr = group;
    ip_mreq mreq{};
    mreq.imr_multiaddr.s_addr = group;
    mreq.imr_interface.s_addr = dev_->addr;
    int gro = gro_ ? 1 : 0;
    setsockopt(fd, IPPROTO_UDP, UDP_GRO, &gro, sizeof gro);
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0 ||
        setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) < 0) {
        int err = errno;
        close(fd);
        return err;
    }
    free_slot->addr = group;
    free_slot->members.assign(1, qp);
    free_slot->fd.store(fd, std::memory_order_release);
    // The progress thread's next poll (within 1 ms) watches the socket too.
    mc_count_++;
    return 0;
}

int Nic::detach_mcast(Qp *qp, in_addr_t group) {
    std::lock_guard<std::mutex> r(rx_mu_);
    std::lock_guard<std::mutex> g(objects_mu);
    for (McGroup &m : mc_) {
        if (m.fd.load(std::memory_order_relaxed) < 0 || m.addr != group) continue;
        auto it = std::find(m.members.begin(), m.members.end(), qp);
        if (it == m.members.end()) return EINVAL;
        m.members.erase(it);
        if (m.members.empty()) {
            close(m.fd.exchange(-1));
            mc_count_--;
        }
        return 0;
    }
    return EINVAL;
}

void Nic::detach_all(Qp *qp) {
    if (!mc_count_.load()) return;
    for (McGroup &m : mc_) {
        in_addr_t addr;
        {
            std::lock_guard<std::mutex> g(objects_mu);
            if (m.fd.load(std::memory_order_relaxed) < 0 ||
                std::find(m.members.begin(), m.members.end(), qp) == m.members.end())
                continue;
            addr = m.addr;
        }
        detach_mcast(qp, addr);
    }
}

void Nic::flush_acks(TxBatch &tx) {
    for (Qp *qp : acks_) {
        std::lock_guard<std::mutex> g(qp->mu);
        qp->resp.ack_listed = false;
        if (qp->resp.ack_pending) resp_flush_ack(qp, tx);
    }
    acks_.clear();
}

void Nic::fire_timers(TxBatch &tx) {
    uint64_t now = now_ns();
    uint32_t top = qp_top_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < top; i++) {
        Qp *qp = qps_[i].load(std::memory_order_acquire);
        if (!qp) continue;
        std::unique_lock<std::mutex> g(qp->mu);
        tx.order = &qp->tx_mu;
        if (qp->comp.timer_deadline_ns || qp->comp.rnr_deadline_ns || qp->comp.sr_deadline_ns)
            req_timers(qp, tx, now);
        tx.order = nullptr;
        send_and_unlock(qp, tx, g);
    }
}

void Nic::receive_one(const uint8_t *d, size_t len, const sockaddr_in &from, in_addr_t dst,
                      uint16_t pos, TxBatch &tx) {
    RxState &rx = *rx_;
    stats.rx_pkts.fetch_add(1, std::memory_order_relaxed);
    if (fault_.enabled()) {
        uint64_t seq = ++fault_seq_;
        bool chosen = false;
        for (int i = 0; i < fault_.n_drop_at; i++)
            chosen |= fault_.drop_at[i] == seq;
        if (chosen) {
            stats.rx_dropped_fault.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (next_uniform(rng_) < fault_.drop) {
            stats.rx_dropped_fault.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        if (next_uniform(rng_) < fault_.dup) dispatch(d, len, from, dst, pos, tx);
        if (!rx.held_len && next_uniform(rng_) < fault_.reorder) {
            std::memcpy(rx.held.get(), d, len);
            rx.held_len = len;
            rx.held_from = from;
            rx.held_dst = dst;
            rx.held_pos = pos;
            return;
        }
    }
    dispatch(d, len, from, dst, pos, tx);
    if (rx.held_len) {
        dispatch(rx.held.get(), rx.held_len, rx.held_from, rx.held_dst, rx.held_pos, tx);
        rx.held_len = 0;
    }
}

int Nic::rx_pass() {
    // Until then fd_ is the stand-in (open_socket), and no QP exists.
    if (!bound_.load(std::memory_order_acquire)) return 0;
    int n = rx_from(rx_fd_, dev_->addr, true);
    if (mc_count_.load(std::memory_order_relaxed)) {
        // The caller holds rx_mu_, so no group socket closes meanwhile.
        for (McGroup &m : mc_)
            if (int fd = m.fd.load(std::memory_order_acquire); fd >= 0)
                n += rx_from(fd, m.addr, false);
    }
    return n;
}

int Nic::rx_from(int fd, in_addr_t dst, bool adaptive) {
    RxState &rx = *rx_;
    TxBatch &tx = *tx_;
    // recvmmsg() rewrites only the name length and flags of the entries it
    // filled: restore those, so that an empty poll costs no set-up.
    for (int i = 0; i < rx.used; i++) {
        rx.msgs[i].msg_hdr.msg_namelen = sizeof rx.froms[i];
        rx.msgs[i].msg_hdr.msg_controllen = RxState::kCtlLen;
        rx.msgs[i].msg_hdr.msg_flags = 0;
    }
    rx.used = 0;
    // A batch costs a failed extra receive attempt whenever fewer datagrams
    // than asked for are queued, which is every time in a ping-pong.  So ask
    // for one until single datagrams keep arriving back to back, and for a
    // full batch while they do.
    int n = recvmmsg(fd, rx.msgs, adaptive ? rx.vlen : RxState::kBatch, MSG_DONTWAIT, nullptr);
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
    rx.used = n;
    std::lock_guard<std::mutex> g(objects_mu);
    for (int i = 0; i < n; i++) {
        const msghdr &mh = rx.msgs[i].msg_hdr;
        if (mh.msg_flags & MSG_TRUNC) continue;
        const uint8_t *d = rx.bufs.get() + size_t(i) * RxState::kBufLen;
        size_t len = rx.msgs[i].msg_len;
        if (relayed_ && fd == rx_fd_) {
            // The agent says where the datagram came from, ahead of it.
            agent::RelayHdr h;
            if (len < sizeof h) continue;
            std::memcpy(&h, d, sizeof h);
            rx.froms[i].sin_family = AF_INET;
            rx.froms[i].sin_addr.s_addr = h.from_addr;
            rx.froms[i].sin_port = h.from_port;
            d += sizeof h;
            len -= sizeof h;
        }
        // A coalesced buffer holds packets of one segment size, the last
        // possibly shorter, each with its place in the send as its IP ID.
        size_t seg = RxState::segment_size(mh);
        if (!seg || seg >= len)
            seg = len;
        else
            stats.rx_coalesced.fetch_add((len + seg - 1) / seg, std::memory_order_relaxed);
        size_t off = 0;
        uint16_t pos = 0;
        do {
            receive_one(d + off, std::min(seg, len - off), rx.froms[i], dst, pos, tx);
            off += seg;
            pos++;
        } while (off < len);
    }
    // ACKs are coalesced over a receive batch and sent here.
    if (!acks_.empty()) flush_acks(tx);
    if (tx.n) flush(tx);
    return n;
}

bool Nic::app_progress() {
    if (!app_progress_) return false;
    std::unique_lock<std::mutex> l(rx_mu_, std::try_to_lock);
    if (!l.owns_lock()) return false;
    // Tells the progress thread whether an application thread is spinning
    // here, polling again and again with no gap, and so receives for it.
    uint64_t now = now_ns();
    uint32_t streak =
        int64_t(now - app_poll_ns_.load(std::memory_order_relaxed)) < int64_t(kSpinningGapNs)
            ? app_polls_.load(std::memory_order_relaxed) + 1
            : 1;
    app_polls_.store(streak, std::memory_order_relaxed);
    app_poll_ns_.store(now, std::memory_order_relaxed);
    if (rx_pass() == 0) {
        // A thread spinning on an empty CQ while others wait for a CPU (more
        // busy pollers than cores: its peer among them) would hold its core
        // for a whole time slice: step aside now and then.  With nobody
        // waiting, sched_yield() returns at once.
        if (++app_empty_ % kYieldEvery == 0) {
            l.unlock();
            sched_yield();
        }
        return false;
    }
    app_empty_ = 0;
    // A pass that dispatched something (and sent the ACKs it owed) can
    // outlast kSpinningGapNs: the gap to the next poll counts from its end,
    // or every packet would end the streak and hand the socket back to the
    // progress thread.
    app_poll_ns_.store(now_ns(), std::memory_order_relaxed);
    return true;
}

bool Nic::app_is_spinning(uint64_t now) const {
    // The application may have polled after `now` was read.
    return app_polls_.load(std::memory_order_relaxed) >= kSpinningPolls &&
           int64_t(now - app_poll_ns_.load(std::memory_order_relaxed)) < int64_t(kSpinningGapNs);
}

void Nic::wait_for_work(uint64_t spin_until) {
    if (busy_poll_) return;
    uint64_t now = now_ns();
    if (app_is_spinning(now)) {
        // Watching the socket too would only add a wake-up per datagram,
        // each one preempting a spinning thread on a small machine.  Look
        // again after kParkNs: an application that stopped polling loses at
        // most that much.
        nap(kParkNs);
    } else if (now >= spin_until) {
        pollfd p[2 + kMaxMcGroups] = {{wake_fd_, POLLIN, 0}, {rx_fd_, POLLIN, 0}};
        nfds_t n = 2;
        if (mc_count_.load(std::memory_order_relaxed))
            for (McGroup &m : mc_)
                if (int fd = m.fd.load(std::memory_order_relaxed); fd >= 0)
                    p[n++] = {fd, POLLIN, 0};
        // A device without QPs has no timers and drops every datagram: its
        // thread only watches for the agent's exit.  librdmacm opens every
        // device, so an rdma_cm application has one such thread for each
        // device it does not use, and each wake-up takes a CPU from one
        // that works.
        int timeout = live_qps_.load(std::memory_order_relaxed) ? 1 : kIdleSleepMs;
        if (poll(p, n, timeout) > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            if (read(wake_fd_, &v, sizeof v) < 0) { /* spurious wake */
            }
        }
    }
}

void Nic::nap(uint64_t ns) {
    pollfd p = {wake_fd_, POLLIN, 0};
    timespec ts = {0, long(ns)};
    ppoll(&p, 1, &ts, nullptr);
}

void Nic::run() {
    t_progress_thread = true;
    uint64_t last_timer_scan = 0, last_agent_check = 0, last_port_check = now_ns();
    uint64_t spin_until = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
        wait_for_work(spin_until);
        // An application thread holding rx_mu_ is receiving right now;
        // waiting for the lock would make its unlock a futex wake-up.  If
        // it polls again and again (a server between requests), yield and
        // look again: this thread then shares the receiving while that one
        // works.  If it polled once (perftest's ib_write_lat, which then
        // spins on memory), yielding could hand the core to that spin for a
        // whole time slice: nap briefly instead.
        bool got = false;
        if (std::unique_lock<std::mutex> l(rx_mu_, std::try_to_lock); l.owns_lock())
            got = rx_pass() > 0;
        else if (app_polls_.load(std::memory_order_relaxed) >= 2)
            sched_yield();
        else
            nap(kBusyNapNs);
        uint64_t now = now_ns();
        // While packets keep coming, sleeping in poll() costs a wake-up per
        // datagram (an inter-processor interrupt in a VM) that is dearer
        // than the datagram itself: poll the socket for a while instead.
        // Not while an application thread polls its CQ at all: it receives
        // for itself, or it spins on memory (perftest's ib_write_lat) and a
        // spinning progress thread would take the CPU it needs.
        if (got &&
            int64_t(now - app_poll_ns_.load(std::memory_order_relaxed)) > int64_t(kAppActiveNs))
            spin_until = now + spin_ns_;
        // Timers need no receive lock, so an application that keeps it busy
        // cannot hold retransmissions back.
        if (now - last_timer_scan > 500000) {
            {
                std::lock_guard<std::mutex> g(objects_mu);
                fire_timers(*timer_tx_);
            }
            last_timer_scan = now;
            if (now - last_agent_check > 20000000) {
                watch_agent();
                last_agent_check = now;
            }
            if (now - last_port_check > kPortCheckNs) {
                port_seen(link_down_reason(dev_->link));
                last_port_check = now;
            }
        }
    }
}

} // namespace sroce
