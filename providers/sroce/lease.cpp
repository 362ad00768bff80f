// SPDX-License-Identifier: MIT
//
// The device's address under the agent: the lease of a slot (or the address
// to ourselves, SROCE_AGENT=off), the port's state, and what happens when
// the agent exits: the slot resumed under the next agent, or the device lost.
#include "nic.hpp"
#include "transport.hpp"

#include <cstdio>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sroce {

int Nic::bind_socket() {
    uint32_t slot = 1;
    int fd;
    if (!opt_.agent) {
        fd = udp_->bind_exclusive();
        if (fd < 0) return errno;
    } else {
        if (int err = agent::lease_slot(dev_->ibdev.name, dev_->link.netdev.c_str(), dev_->addr,
                                        table_fd_, lease_))
            return err;
        fd = lease_.udp;
        slot = lease_.slot;
    }
    if (int err = udp_->adopt(fd, lease_.relayed)) return err;
    lease_.udp = udp_->tx_fd();
    set_qpn_space(slot);
    return 0;
}

void Nic::set_qpn_space(uint32_t slot) {
    qpn_base_ = slot << agent::kSlotShift | kQpnBase;
    srqn_base_ = slot << agent::kSlotShift | kSrqnBase;
    // Start numbering where this process's previous lease of the slot is
    // unlikely to have stopped, so a late packet meets no QP of ours.
    qp_next_ = uint32_t(getpid()) % kMaxQps;
    bound_.store(true, std::memory_order_release);
}

int Nic::ensure_socket() {
    if (bound_.load(std::memory_order_acquire)) return 0;
    int down, err = 0;
    {
        std::lock_guard<std::mutex> g(bind_mu_);
        if (bound_.load(std::memory_order_relaxed)) return 0;
        down = port_down_reason(*dev_);
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

void Nic::watch_gids() {
    if (!dev_->follow || dev_->memory) return;
    dev_->gids.update(dev_->default_gid, netdev_addrs(dev_->link.netdev));
    // Another NIC of the device (another context's) may have made the
    // change: each posts the event to its own contexts.
    uint64_t gen = dev_->gids.generation();
    if (gen != gids_seen_) post_device_event(this, IBV_EVENT_GID_CHANGE);
    gids_seen_ = gen;
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
    bool relayed = udp_->relayed();
    // A relay whose agent is gone would poll readable forever.
    if (relayed) udp_->replace_rx(-1);
    fprintf(stderr,
            "sroce: %s: the sroce agent exited; the device's QPs go on%s while slot %u "
            "is taken back under a new agent\n",
            dev_->ibdev.name, relayed ? " (receiving nothing)" : "", lease_.slot);
    if (resumer_.joinable()) resumer_.join(); // the last one, finished
    resumer_ = std::thread([this] { resume_slot(); });
}

void Nic::resume_slot() {
    unsigned wait_s = opt_.agent_wait_s;
    bool relayed = udp_->relayed();
    uint64_t deadline = now_ns() + uint64_t(wait_s) * 1000000000;
    // Only an agent of the user that ran the last one may take its place
    // (connect_agent checks it is root's or ours); a process of another
    // user waits for it rather than start one of its own.
    agent::Resume r{lease_.slot, relayed ? -1 : udp_->tx_fd(), lease_.agent_uid == geteuid(), {}};
    uint64_t delay_ms = 10;
    int err = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
        agent::Lease got;
        r.why.clear();
        err = agent::lease_slot(dev_->ibdev.name, dev_->link.netdev.c_str(), dev_->addr, table_fd_,
                                got, &r);
        if (!err) {
            if (relayed && got.udp >= 0)
                udp_->replace_rx(got.udp);
            else if (got.udp >= 0)
                close(got.udp);
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
    // The address's group must empty for a restarted agent to rebuild it.
    udp_->shut();
}

} // namespace sroce
