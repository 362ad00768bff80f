// SPDX-License-Identifier: MIT
//
// Who runs the receive path and the timers, and when: the device's progress
// thread (sleeping on the port, spinning while traffic lasts, parked while
// an application thread spins on its CQ) and application threads that poll
// an empty CQ (app_progress).
#include "nic.hpp"
#include "transport.hpp"

#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

namespace sroce {

void Nic::fire_timers(TxBatch &tx, bool scan) {
    uint64_t now = now_ns();
    // Paced QPs whose time is still to come set the next due again.
    pace_due_.store(0, std::memory_order_relaxed);
    uint32_t top = qp_top_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < top; i++) {
        Qp *qp = qps_[i].load(std::memory_order_acquire);
        if (!qp) continue;
        std::unique_lock<std::mutex> g(qp->mu);
        tx.order = &qp->tx_mu;
        bool sent = false;
        if (uint64_t at = qp->timers.pace_at_ns) {
            if (now >= at) {
                qp->timers.pace_at_ns = 0;
                req_run(qp, tx);
                sent = true;
            } else {
                pace_at(at);
            }
        }
        if (scan) {
            if (qp->timers.retransmit_at_ns || qp->timers.rnr_at_ns || qp->timers.recovery_at_ns)
                req_timers(qp, tx, now);
            // Let go of while it was held back: it sends now.
            if (cc_.on && cc_tick(qp, now)) {
                req_run(qp, tx);
                sent = true;
            }
        }
        tx.order = nullptr;
        send_and_unlock(qp, tx, g);
        // What a paced UD or UC QP sent has left: nothing acknowledges it,
        // so it completes now, as after a post (req_send_and_unlock).
        if (sent && !qp->reliable()) req_retire_sent(qp);
    }
}

bool Nic::pace_due(uint64_t now) const {
    uint64_t due = pace_due_.load(std::memory_order_relaxed);
    return due && now >= due;
}

int Nic::poll_once() {
    std::lock_guard<std::mutex> l(rx_mu_);
    int n = rx_pass();
    // As often as the progress thread would look, not at every call.
    uint64_t now = now_ns();
    bool scan = now - last_poll_timers_ns_ >= kTimerScanNs;
    if (scan || pace_due(now)) {
        if (scan) last_poll_timers_ns_ = now;
        std::lock_guard<std::mutex> g(objects_mu);
        fire_timers(*timer_tx_, scan);
    }
    return n;
}

bool Nic::app_progress() {
    if (!opt_.app_progress) return false;
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
    int got;
    {
        // Reset while rx_mu_ is still held, whatever rx_pass() throws.
        rx_by_app_ = true;
        struct Reset {
            bool &flag;
            ~Reset() { flag = false; }
        } reset{rx_by_app_};
        got = rx_pass();
    }
    if (got == 0) {
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
    if (opt_.busy_poll) return;
    uint64_t now = now_ns();
    if (app_is_spinning(now)) {
        // Watching the socket too would only add a wake-up per datagram,
        // each one preempting a spinning thread on a small machine.  Look
        // again after park_ns: an application that stopped polling loses at
        // most that much.
        nap(opt_.park_ns);
    } else if (now >= spin_until) {
        pollfd p[1 + kMaxPollFds] = {{wake_fd_, POLLIN, 0}};
        nfds_t n = 1 + nfds_t(port_->poll_fds(p + 1, kMaxPollFds));
        // A device without QPs has no timers and drops every datagram: its
        // thread only watches for the agent's exit.  librdmacm opens every
        // device, so an rdma_cm application has one such thread for each
        // device it does not use, and each wake-up takes a CPU from one
        // that works.
        uint64_t sleep_ns = live_qps_.load(std::memory_order_relaxed)
                                ? kTimerSleepNs
                                : uint64_t(kIdleSleepMs) * 1000000;
        // Until a paced QP may send again, if that comes first.
        if (uint64_t due = pace_due_.load(std::memory_order_relaxed))
            sleep_ns = due > now ? std::min(sleep_ns, due - now) : 0;
        sleep_until_.store(now + sleep_ns, std::memory_order_relaxed);
        // A pace_at() between the load above and the store is seen here.
        if (uint64_t due = pace_due_.load(std::memory_order_relaxed); due && due < now + sleep_ns)
            sleep_ns = due > now ? due - now : 0;
        timespec ts = {time_t(sleep_ns / 1000000000), long(sleep_ns % 1000000000)};
        if (ppoll(p, n, &ts, nullptr) > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            if (read(wake_fd_, &v, sizeof v) < 0) { /* spurious wake */
            }
        }
        sleep_until_.store(0, std::memory_order_relaxed);
    }
}

void Nic::nap(uint64_t ns) {
    pollfd p = {wake_fd_, POLLIN, 0};
    timespec ts = {0, long(ns)};
    ppoll(&p, 1, &ts, nullptr);
}

void Nic::run() {
    UdpPort::set_progress_thread();
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
            spin_until = now + opt_.spin_ns;
        // Spinning, but not ahead of a thread waiting for this CPU: another
        // process's progress thread stuck behind this spin waited up to
        // 57 us a round trip in perftest's ib_write_lat.
        else if (!got && now < spin_until && !opt_.busy_poll)
            sched_yield();
        // Timers need no receive lock, so an application that keeps it busy
        // cannot hold retransmissions back.
        if (pace_due(now) && now - last_timer_scan <= kTimerScanNs) {
            std::lock_guard<std::mutex> g(objects_mu);
            fire_timers(*timer_tx_, false);
        }
        if (now - last_timer_scan > kTimerScanNs) {
            {
                std::lock_guard<std::mutex> g(objects_mu);
                fire_timers(*timer_tx_, true);
            }
            last_timer_scan = now;
            if (now - last_agent_check > 20000000) {
                watch_agent();
                last_agent_check = now;
            }
            if (now - last_port_check > kPortCheckNs) {
                port_seen(port_down_reason(*dev_));
                watch_gids();
                last_port_check = now;
            }
        }
    }
}

} // namespace sroce
