// SPDX-License-Identifier: MIT
//
// The per-device "NIC" of a process: the QP, SRQ and MR tables that packets
// are resolved against, the building of packets into batches for its port
// (port.hpp), the dispatch of what the port receives, timers and coalesced
// ACKs, and the progress thread that drives them.  Implemented by concern:
// nic.cpp (life, tables, options), lease.cpp (the agent's slot), xmit.cpp
// (building and sending), recv.cpp (receiving, dispatch, multicast) and
// progress.cpp (the progress thread, timers, application polling).
#pragma once

#include "agent_client.hpp"
#include "port.hpp"
#include "port_udp.hpp"
#include "sroce.hpp"

namespace sroce {

struct FaultConfig {
    static constexpr int kMaxDropAt = 8;
    double drop = 0, dup = 0, reorder = 0;
    uint64_t seed = 1;
    // Deterministic losses for tests: the Nth datagrams received (1-based).
    uint64_t drop_at[kMaxDropAt] = {};
    int n_drop_at = 0;
    bool enabled() const { return drop > 0 || dup > 0 || reorder > 0 || n_drop_at; }
};

// Parses "drop=0.05,dup=0.01,reorder=0.01,seed=7" (SROCE_FAULT) and
// "drop_at=N" (repeatable); throws on junk.
FaultConfig parse_fault_config(const std::string &spec);

struct NicStats {
    std::atomic<uint64_t> rx_pkts{0}, tx_pkts{0}, rx_bad_icrc{0}, rx_bad_hdr{0}, rx_no_qp{0},
        rx_dropped_fault{0}, retransmits{0}, timeouts{0},
        // FLUSH packets in Linux rxe's ICRC form (icrc.hpp), received / sent
        rx_flush_legacy_icrc{0}, tx_flush_legacy_icrc{0},
        // Packets sent in multi-packet segmentation-offload sends, received
        // in coalesced buffers, and received with an IP ID other than the
        // one expected (solved for, icrc.hpp).
        tx_segmented{0}, rx_coalesced{0}, rx_ip_id_solved{0},
        // Packets sent from a peer's connected socket, and the times such a
        // socket's IP ID counter was read afresh (UdpPort::learn_ip_id).
        tx_connected{0}, tx_ip_id_learned{0},
        // Connected IPv6 sockets whose flow label the kernel would not lease
        // (lease_flow_label): their packets carry the kernel's label.
        tx_flow_label_refused{0},
        // Selective repeat: requests held past a gap, and packets resent
        // one by one (SACKs and the recovery timer).
        rx_held{0}, tx_resent_selective{0},
        // Congestion control: packets received with CE, CNPs sent, CNPs
        // received (and of those, the ones acted on), rate cuts, and the
        // times a QP's rate held its requester back.
        rx_ce{0}, tx_cnp{0}, rx_cnp{0}, rx_cnp_handled{0}, cc_rate_cuts{0}, cc_paced{0};
};

// A NIC's settings from the environment (sroce(8)), read once, when the NIC
// is made.
struct NicOptions {
    FaultConfig fault;            // SROCE_FAULT
    bool busy_poll = false;       // SROCE_BUSY_POLL=1
    bool app_progress = true;     // SROCE_APP_PROGRESS=0 turns it off
    uint64_t spin_ns = 50000;     // SROCE_SPIN_US
    uint64_t park_ns = 50000;     // SROCE_PARK_US (Nic::wait_for_work)
    bool selective_repeat = true; // SROCE_SELECTIVE_REPEAT=0 turns it off
    bool announce = true;         // SROCE_ANNOUNCE=0 turns it off
    bool stats = false;           // SROCE_STATS=1
    bool agent = true;            // SROCE_AGENT=off: the address to ourselves
    unsigned agent_wait_s = 30;   // SROCE_AGENT_WAIT
    UdpPort::Options udp;         // SROCE_GSO, SROCE_GRO, SROCE_CONNECTED
    static NicOptions from_env();
};

class Nic {
  public:
    // The process-wide NIC of a device, created on first use.  nullptr with
    // errno set (EADDRINUSE when another process owns the address).
    static Nic *acquire(Device *dev);
    void release();

    Device *device() const { return dev_; }

    // Prints the counters on stderr, once (SROCE_STATS=1: at close or exit).
    void print_stats();
    // Sends every ACK held back for a post (deferred_acks_) now: at exit.
    void send_deferred_acks_now();

    // Queues one packet: hdr holds BTH and extended headers (hdr_len bytes),
    // payload is gathered from `iov`; pad and ICRC are added here.
    // kQueueLegacyFlush: a FLUSH (no payload) in Linux rxe's ICRC form.
    // kQueueCopy: the payload is copied now, not referenced until sent —
    // for memory others may write meanwhile (a READ response's source: the
    // target application, or another QP's WRITE, can change it before the
    // batch is sent, and a payload that no longer matches its ICRC is a
    // packet the requester drops, again on every retry).
    // kQueueCnp: a CNP, which is not ECN-capable (congestion.cpp).
    static constexpr unsigned kQueueLegacyFlush = 1, kQueueCopy = 2, kQueueCnp = 4;
    // `src`: the address it leaves from (the AV's sgid_index's);
    // `f`: what the AV's GRH puts in the IP header (ip_fields()).
    void queue(TxBatch &b, const IpAddr &src, const IpAddr &dst, IpFields f, const uint8_t *hdr,
               size_t hdr_len, const iovec *iov, int iovcnt, uint32_t payload_len,
               unsigned flags = 0);
    // Sends what the batch holds through the port, and empties it.
    void xmit(TxBatch &b);

    // QP table: QPN = qpn_base_ + index, where qpn_base_ carries the
    // process's slot on the device (agent_proto.hpp) in bits 16-23.
    uint32_t add_qp(Qp *qp); // 0 when full
    void remove_qp(Qp *qp);
    // Updates the QP's entry in the table the agent lists (type, state,
    // peer); caller holds qp->mu or owns the QP alone.
    void publish_qp(const Qp *qp);
    // Calls fn(qp) for every live QP; caller holds objects_mu.
    template <class Fn>
    void for_each_qp(Fn &&fn) {
        uint32_t top = qp_top_.load(std::memory_order_acquire);
        for (uint32_t i = 0; i < top; i++)
            if (Qp *qp = qps_[i].load(std::memory_order_acquire)) fn(qp);
    }
    Qp *find_qp(uint32_t qpn) const {
        uint32_t i = qpn - qpn_base_;
        return i < kMaxQps ? qps_[i].load(std::memory_order_acquire) : nullptr;
    }
    // Multicast (UD QPs): a group is a multicast address, joined by a
    // socket of its own bound to the group's port 4791; datagrams to it
    // (destination QPN 0xFFFFFF) reach every QP attached.  0 or an errno.
    int attach_mcast(Qp *qp, const IpAddr &group);
    int detach_mcast(Qp *qp, const IpAddr &group);
    void detach_all(Qp *qp);

    // SRQ table, for the SRQ numbers XRC packets name: SRQN = srqn_base_ +
    // index, unique on the device like QPNs.
    uint32_t add_srq(Srq *srq); // 0 when full
    void remove_srq(Srq *srq);
    Srq *find_srq(uint32_t srqn) const {
        uint32_t i = srqn - srqn_base_;
        return i < kMaxSrqs ? srqs_[i].load(std::memory_order_acquire) : nullptr;
    }

    // Called by an application thread that found its CQ empty: it is
    // spinning anyway, so it receives and dispatches whatever the socket
    // holds instead of waiting for the progress thread to be scheduled.
    // Returns true when it dispatched anything.  Never blocks: when another
    // thread is receiving, that thread does the work.
    bool app_progress();

    // For a NIC without a progress thread (memwire::set_manual_progress):
    // one receive pass and the timers that are due, in the caller's thread.
    // Returns the number of datagrams received.
    int poll_once();

    // A device opened while its address was not on the host has no socket
    // of the address (no slot at the agent) until a QP or SRQ needs one:
    // then this makes it, or returns why the port is down.  0 or an errno.
    int ensure_socket();

    // The agent that leased this process its slot is gone: every QP is in
    // error, the socket is closed, and no new object can be made (EIO).
    bool lost() const { return lost_.load(std::memory_order_relaxed); }
    // Whether QPs offer selective repeat to their peers (SROCE_SELECTIVE_REPEAT).
    bool selective_repeat() const { return opt_.selective_repeat; }
    // What RC QPs of this NIC announce of themselves in their packets.
    uint8_t announce() const {
        if (!opt_.announce) return 0;
        return wire::bth::kAnnounceNative |
               (opt_.selective_repeat ? wire::bth::kAnnounceSelectiveRepeat : 0);
    }

    // The device's congestion control (`sroce link set ... cc`).
    const CcConfig &cc() const { return cc_; }
    // A QP's rate holds it back until `at`: the progress thread runs its
    // requester then (fire_timers), waking for it if it sleeps past that.
    void pace_at(uint64_t at);
    // Shows the QP's congestion control in the table the agent lists.
    void publish_cc(const Qp *qp);

    MrTable mrs;
    // Held by whoever dispatches packets (the progress thread or an
    // application thread in app_progress) while it touches QPs and MRs, and
    // by destroy/dereg so nothing is freed under it.
    std::mutex objects_mu;
    NicStats stats;

  private:
    std::atomic<bool> stats_printed_{false};
    Nic(Device *dev, const NicOptions &opt);
    ~Nic();
    // The QP table's memory, the wake-up event and the port; then the
    // address's socket, unless the address is not on the host.  0 or an errno.
    int open_port();
    // The address's socket (the agent's lease, or one of our own) into the
    // port, and the QPN space of its slot.  Caller owns the Nic alone or
    // holds bind_mu_ and qp_alloc_mu_.  0 or an errno.
    int bind_socket();
    // The QPN and SRQN space of the slot; the port is ready to use.
    void set_qpn_space(uint32_t slot);
    // Records the port's state (0 or link_down_reason()), and on a change
    // posts IBV_EVENT_PORT_ACTIVE or IBV_EVENT_PORT_ERR to the device's
    // contexts, as the kernel does.  The progress thread looks every
    // kPortCheckNs.
    void port_seen(int reason);
    // Checks the agent connection; on its end, resumes the slot under a new
    // agent when the steering outlives the agent (kOpenSteeringKept), else
    // loses the device.
    void watch_agent();
    void begin_resume();
    // resumer_'s work: the slot back under a new agent, retried until
    // SROCE_AGENT_WAIT seconds have passed; then the device is lost.
    void resume_slot();
    void lose_device();
    void run();
    // Sleeps until the port may hold something (or not at all while the
    // progress thread spins, or parks while an application spins).
    void wait_for_work(uint64_t spin_until);
    void nap(uint64_t ns);
    // One receive from the port and the dispatch of what it returned;
    // caller holds rx_mu_.  Returns the number of datagrams received.
    int rx_pass();
    // One packet through the fault injector (SROCE_FAULT) to dispatch().
    void receive_one(const uint8_t *d, size_t len, const RxDatagram &from, uint16_t pos,
                     TxBatch &tx);
    // One packet; `pos` is its place in a coalesced receive buffer (its IP ID).
    // `from`: the datagram's addresses and source port.
    void dispatch(const uint8_t *data, size_t len, const RxDatagram &from, uint16_t pos,
                  TxBatch &tx);
    void deliver(Qp *qp, wire::Packet &pkt, TxBatch &tx);
    // A CNP for one of our QPs (the reaction point, congestion.hpp).
    void receive_cnp(const wire::Packet &pkt);
    // Runs the requester of every paced QP whose time has come; with `scan`
    // also every QP's other timers and congestion control's meter.
    void fire_timers(TxBatch &tx, bool scan);
    // Whether a paced QP's time has come.
    bool pace_due(uint64_t now) const;
    void send_acks(TxBatch &tx);
    // Sends the deferred ACKs that are due (all of them with `all`); the
    // caller holds rx_mu_ and objects_mu.
    void send_deferred_acks(TxBatch &tx, bool all);
    bool app_is_spinning(uint64_t now) const;

    Device *dev_;
    const NicOptions opt_;
    const CcConfig cc_;
    // The earliest pace_at() not yet served (0: none), and when the progress
    // thread's sleep ends (0: it is awake): a QP paced earlier than that
    // wakes it.
    std::atomic<uint64_t> pace_due_{0};
    std::atomic<uint64_t> sleep_until_{0};
    int refs_ = 0;
    std::unique_ptr<Port> port_;
    UdpPort *udp_ = nullptr; // port_, when it is the kernel's UDP
    // conn, agent_uid and steering_kept change only in resume_slot() while
    // resuming_ is set, when the progress thread does not look at them.
    agent::Lease lease_;
    std::atomic<bool> resuming_{false};
    std::thread resumer_;
    agent::QpEntry *table_ = nullptr; // shared with the agent
    int table_fd_ = -1;
    uint32_t qpn_base_ = 0, srqn_base_ = 0;
    std::atomic<bool> lost_{false};
    // The port has the address's socket, and qpn_base_ and srqn_base_ are set.
    std::atomic<bool> bound_{false};
    std::mutex bind_mu_; // bound_'s making: one bind_socket() at a time
    // The port as last seen: 0 (up) or link_down_reason().  A look every
    // 200 ms costs 15 us (under 0.01% of a core per open device) and sees
    // an address come or go without a netlink socket in every process.
    std::atomic<int> port_down_{0};
    static constexpr uint64_t kPortCheckNs = 200000000;
    // A device that follows its net device: its GID table made again from
    // the addresses at each port check (getifaddrs(3): 40-100 us), and
    // IBV_EVENT_GID_CHANGE for what changed since gids_seen_.
    void watch_gids();
    uint64_t gids_seen_ = 0; // the progress thread's
    int wake_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::atomic<Qp *> qps_[kMaxQps] = {};
    std::atomic<Srq *> srqs_[kMaxSrqs] = {};
    // Multicast groups the port has joined, and the QPs attached to each:
    // changed under rx_mu_ and objects_mu, read under either.
    struct McGroup {
        IpAddr addr; // empty: a free slot
        std::vector<Qp *> members;
    };
    McGroup mc_[kMaxMcGroups];
    std::atomic<int> mc_count_{0};
    // The next IP ID each recent source's connected socket will send
    // (dispatch(): checked before solving for it); under rx_mu_.
    struct IdGuess {
        IpAddr addr;
        uint16_t port = 0;
        uint16_t base = 0; // ID of the last datagram, less its place in a run
        // The highest such ID seen: a datagram that two CPUs' receive queues
        // put behind a later one must not move the next one's guess back.
        uint16_t high = 0;
    };
    IdGuess id_guess_[64];
    static constexpr int kLikelyIds = 4;    // ahead, checked for a datagram's first packet
    static constexpr int kLikelyBehind = 4; // and behind the highest, after those
    std::mutex qp_alloc_mu_;                // qp_next_ and the free slots of qps_ and srqs_
    uint32_t qp_next_ = 0;
    std::atomic<uint32_t> qp_top_{0}; // one past the highest slot ever used
    // QPs in qps_ now.  With none, the progress thread has no timers to run
    // and sleeps kIdleSleepMs at a time: as often as run() looks for the
    // agent's exit.
    std::atomic<uint32_t> live_qps_{0};
    static constexpr int kIdleSleepMs = 20;
    // With QPs, it sleeps at most this long between timer scans.
    static constexpr uint64_t kTimerSleepNs = 1000000;
    static constexpr uint64_t kTimerScanNs = 500000;     // timers are looked at this often
    uint64_t last_poll_timers_ns_ = 0;                   // poll_once()'s last look, under rx_mu_
    static constexpr int kMaxPollFds = 1 + kMaxMcGroups; // the port's
    // Receive state shared by the progress thread and app_progress():
    // everything below rx_mu_ is used only by its holder.
    std::mutex rx_mu_;
    RxDatagram rx_[Port::kRxBatch];
    // Reorder injection holds one packet back and delivers it after the next.
    struct Held {
        std::unique_ptr<uint8_t[]> data;
        size_t len = 0;
        RxDatagram from; // its addresses
        uint16_t pos = 0;
    } held_;
    std::unique_ptr<TxBatch> tx_;
    std::unique_ptr<TxBatch> timer_tx_; // the progress thread's, for timers
    std::vector<Qp *> acks_;            // QPs with a coalesced ACK to send
    // ACKs held back by a receive pass of an application thread, which is
    // about to post (a ping-pong's answer): sent with that post, in one
    // batch, so that the peer wakes once for both; or when due.  By QPN, as
    // a QP may be destroyed meanwhile.
    struct DeferredAck {
        uint32_t qpn;
        uint64_t due_ns;
    };
    std::vector<DeferredAck> deferred_acks_;
    bool rx_by_app_ = false; // the pass under way is app_progress()'s
    uint64_t rng_ = 0;
    uint64_t fault_seq_ = 0; // datagrams seen by the fault injector
    // An application thread counts as spinning on its CQ (app_progress)
    // after this many polls, each less than kSpinningGapNs after the one
    // before, the last less than kSpinningGapNs ago; the progress thread
    // then leaves the socket to it and looks again every park_ns
    // (SROCE_PARK_US).
    static constexpr uint32_t kSpinningPolls = 8;
    static constexpr uint64_t kSpinningGapNs = 5000;
    // How long the progress thread naps when an application thread holds
    // the receive lock.
    static constexpr uint64_t kBusyNapNs = 10000;
    // An application that polled its CQ less than this long ago is active:
    // the progress thread does not spin after traffic (SROCE_SPIN_US).
    static constexpr uint64_t kAppActiveNs = 1000000;
    std::atomic<uint32_t> app_polls_{0};
    // Empty receive passes in a row by application threads (under rx_mu_),
    // and how often such a thread yields the CPU.
    uint32_t app_empty_ = 0;
    static constexpr uint32_t kYieldEvery = 32;
    std::atomic<uint64_t> app_poll_ns_{0};
};

} // namespace sroce
