// SPDX-License-Identifier: MIT
#include "nic.hpp"

#include "port_mem.hpp"
#include "transport.hpp"

#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdexcept>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <system_error>
#include <time.h>
#include <unistd.h>

namespace sroce {

namespace {
std::atomic<uint64_t> g_fake_now{0};
} // namespace

void set_fake_clock(uint64_t ns) {
    g_fake_now.store(ns, std::memory_order_relaxed);
}

uint64_t now_ns() {
    if (uint64_t f = g_fake_now.load(std::memory_order_relaxed)) [[unlikely]]
        return f;
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

// librdmacm keeps every device it has seen open until the process ends, so
// their NICs are never released: those still open print at exit.
void print_open_nics_stats() {
    std::unique_lock<std::mutex> g(g_nics_mu, std::try_to_lock);
    if (!g.owns_lock()) return; // exit() from a thread inside acquire/release
    for (Nic *n : g_nics)
        if (n) n->print_stats();
}

// An application that exits right after its last receive (a ping-pong's
// end) may have left that receive's ACK for a post that never comes.
void send_open_nics_deferred_acks() {
    std::unique_lock<std::mutex> g(g_nics_mu, std::try_to_lock);
    if (!g.owns_lock()) return;
    for (Nic *n : g_nics)
        if (n) n->send_deferred_acks_now();
}

} // namespace

void Nic::send_deferred_acks_now() {
    // A progress thread in the middle of a pass sends them at its end.
    std::unique_lock<std::mutex> r(rx_mu_, std::defer_lock);
    for (int i = 0; i < 1000 && !r.try_lock(); i++)
        sched_yield();
    if (!r.owns_lock()) return;
    std::lock_guard<std::mutex> g(objects_mu);
    if (deferred_acks_.empty()) return;
    send_deferred_acks(*tx_, true);
    if (tx_->n) xmit(*tx_);
}

Nic *Nic::acquire(Device *dev) {
    std::lock_guard<std::mutex> g(g_nics_mu);
    Nic *&slot = g_nics[dev->index];
    // A lost device stays with the contexts that had it; a new open gets a
    // new lease (from a restarted agent).
    if (slot && slot->lost()) slot = nullptr;
    if (!slot) {
        Nic *n = nullptr;
        try {
            n = new Nic(dev, NicOptions::from_env());
            if (int err = n->open_port()) {
                delete n;
                errno = err;
                return nullptr;
            }
            if (!(dev->memory && memwire::manual_progress())) {
                n->thread_ = std::thread([n] { n->run(); });
                // "sroce-<device>" in top -H, perf and /proc (15 characters).
                std::string name = std::string("sroce-") + dev->ibdev.name;
                pthread_setname_np(n->thread_.native_handle(), name.substr(0, 15).c_str());
            }
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
        static std::once_flag acks_once;
        std::call_once(acks_once, [] { atexit(send_open_nics_deferred_acks); });
        if (n->opt_.stats) {
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
            "tx_connected %llu tx_ip_id_learned %llu tx_flow_label_refused %llu "
            "rx_ce %llu tx_cnp %llu rx_cnp %llu rx_cnp_handled %llu cc_rate_cuts %llu "
            "cc_paced %llu\n",
            dev_->ibdev.name, v(stats.rx_pkts), v(stats.tx_pkts), v(stats.rx_bad_icrc),
            v(stats.rx_bad_hdr), v(stats.rx_no_qp), v(stats.rx_dropped_fault), v(stats.retransmits),
            v(stats.timeouts), v(stats.rx_flush_legacy_icrc), v(stats.tx_flush_legacy_icrc),
            v(stats.tx_segmented), v(stats.rx_coalesced), v(stats.rx_ip_id_solved),
            v(stats.rx_held), v(stats.tx_resent_selective), v(stats.tx_connected),
            v(stats.tx_ip_id_learned), v(stats.tx_flow_label_refused), v(stats.rx_ce),
            v(stats.tx_cnp), v(stats.rx_cnp), v(stats.rx_cnp_handled), v(stats.cc_rate_cuts),
            v(stats.cc_paced));
}

void Nic::release() {
    std::lock_guard<std::mutex> g(g_nics_mu);
    if (--refs_ > 0) return;
    if (g_nics[dev_->index] == this) g_nics[dev_->index] = nullptr;
    delete this;
}

NicOptions NicOptions::from_env() {
    NicOptions o;
    if (const char *f = getenv("SROCE_FAULT"); f && *f) {
        try {
            o.fault = parse_fault_config(f);
        } catch (const std::exception &e) {
            fprintf(stderr, "sroce: ignoring SROCE_FAULT=%s: %s\n", f, e.what());
        }
    }
    if (const char *b = getenv("SROCE_BUSY_POLL"); b && *b == '1') o.busy_poll = true;
    if (const char *a = getenv("SROCE_APP_PROGRESS"); a && *a == '0') o.app_progress = false;
    if (const char *s = getenv("SROCE_SPIN_US"); s && *s)
        o.spin_ns = strtoull(s, nullptr, 10) * 1000;
    if (const char *s = getenv("SROCE_PARK_US"); s && *s)
        o.park_ns = std::max<uint64_t>(strtoull(s, nullptr, 10), 1) * 1000;
    if (const char *r = getenv("SROCE_SELECTIVE_REPEAT"); r && *r == '0')
        o.selective_repeat = false;
    if (const char *a = getenv("SROCE_ANNOUNCE"); a && *a == '0') o.announce = false;
    if (const char *s = getenv("SROCE_STATS"); s && *s == '1') o.stats = true;
    if (const char *a = getenv("SROCE_AGENT"); a && !strcmp(a, "off")) o.agent = false;
    if (const char *w = getenv("SROCE_AGENT_WAIT"); w && *w) o.agent_wait_s = unsigned(atoi(w));
    if (const char *g = getenv("SROCE_GSO"); g && *g == '0') o.udp.gso = false;
    if (const char *g = getenv("SROCE_GRO"); g && *g == '0') o.udp.gro = false;
    if (const char *c = getenv("SROCE_CONNECTED"); c && *c == '0') o.udp.connected = false;
    return o;
}

Nic::Nic(Device *dev, const NicOptions &opt)
    : dev_(dev), opt_(opt), cc_(CcConfig::from(dev->link.cc)), tx_(std::make_unique<TxBatch>()),
      timer_tx_(std::make_unique<TxBatch>()) {
    // A QP is listed at most once (ack_listed): the receive path never grows it.
    acks_.reserve(kMaxQps);
    deferred_acks_.reserve(kMaxQps);
    rng_ = opt_.fault.seed;
    if (opt_.fault.enabled()) held_.data.reset(new uint8_t[Port::kMaxDatagram]);
}

Nic::~Nic() {
    if (opt_.stats) print_stats();
    stop_ = true;
    // The progress thread first: it is what starts a resumer.
    if (thread_.joinable()) {
        uint64_t one = 1;
        if (write(wake_fd_, &one, sizeof one) < 0) { /* the thread also polls stop_ */
        }
        thread_.join();
    }
    if (resumer_.joinable()) resumer_.join();
    port_.reset();
    if (wake_fd_ >= 0) close(wake_fd_);
    if (lease_.conn >= 0) close(lease_.conn);
    if (table_) munmap(table_, kMaxQps * sizeof(agent::QpEntry));
    if (table_fd_ >= 0) close(table_fd_);
}

int Nic::open_port() {
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
    if (dev_->memory) {
        // The in-memory wire: the address is ours alone, no agent leases it.
        port_ = std::make_unique<MemPort>(dev_->addr);
        set_qpn_space(1);
        // No earlier lease to keep clear of: number from the start, so the
        // timer scan covers only the QPs there are.
        qp_next_ = 0;
        return 0;
    }
    // What the device's table is now; the first look updates it.
    gids_seen_ = dev_->gids.generation();
    // Unbound stand-ins until the address's own socket: bind_socket() puts
    // the real one in their place.
    auto udp =
        std::make_unique<UdpPort>(dev_->ibdev.name, dev_->addr, dev_->ifindex, stats, opt_.udp);
    if (int err = udp->open()) return err;
    udp_ = udp.get();
    port_ = std::move(udp);
    // A device whose address is not on the host opens, with its port down,
    // as an RNIC whose net device lost its address does; the socket comes
    // with the first QP or SRQ made once the address is back.
    int down = link_down_reason(dev_->link);
    port_down_.store(down, std::memory_order_relaxed);
    if (down == EADDRNOTAVAIL) return 0;
    int err = bind_socket();
    return err == EADDRNOTAVAIL ? 0 : err;
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

void Nic::publish_cc(const Qp *qp) {
    uint32_t i = qp->qpx.qp_base.qp_num - qpn_base_;
    if (i >= kMaxQps || !table_) return;
    const QpCc &c = qp->cc;
    // kbit/s: bytes per ns times 8e6.
    table_[i].cc_rate_kbps.store(c.limited ? std::max<uint64_t>(1, uint64_t(c.rc * 8e6)) : 0,
                                 std::memory_order_relaxed);
    table_[i].cc_cnps_sent.store(c.cnps_sent, std::memory_order_relaxed);
    table_[i].cc_cnps_received.store(c.cnps_received, std::memory_order_relaxed);
    table_[i].cc_cuts.store(c.cuts, std::memory_order_relaxed);
}

void Nic::pace_at(uint64_t at) {
    uint64_t due = pace_due_.load(std::memory_order_relaxed);
    while ((!due || at < due) &&
           !pace_due_.compare_exchange_weak(due, at, std::memory_order_relaxed)) {
    }
    // The progress thread sleeps past it: wake it (it then sleeps no longer
    // than until the earliest due).
    uint64_t sleeping = sleep_until_.load(std::memory_order_relaxed);
    if (sleeping && at < sleeping) {
        uint64_t one = 1;
        if (write(wake_fd_, &one, sizeof one) < 0) { /* a wake-up is pending anyway */
        }
    }
}

void Nic::publish_qp(const Qp *qp) {
    uint32_t qpn = qp->qpx.qp_base.qp_num;
    uint32_t i = qpn - qpn_base_;
    if (i >= kMaxQps) return;
    bool connected = qp->type != IBV_QPT_UD && qp->attr.state >= IBV_QPS_RTR;
    uint64_t half[2] = {};
    if (connected) std::memcpy(half, qp->attr.dest_addr.raw, 16);
    table_[i].peer_addr[0].store(half[0], std::memory_order_relaxed);
    table_[i].peer_addr[1].store(half[1], std::memory_order_relaxed);
    table_[i].peer.store(connected ? qp->attr.dest_qpn : 0, std::memory_order_relaxed);
    table_[i].id.store(agent::qp_entry_id(qpn, qp->type, qp->attr.state),
                       std::memory_order_relaxed);
}

} // namespace sroce
