// SPDX-License-Identifier: MIT
//
// The per-device "NIC" of a process: its UDP socket on port 4791, the
// progress thread that receives and dispatches packets and fires timers,
// and the QP and MR tables that packets are resolved against.
#pragma once

#include "agent_client.hpp"
#include "sroce.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

namespace sroce {

// Packets queued for one sendmmsg().  Headers are copied into the slot; the
// payload is referenced in place (user memory) unless others may write it
// before the batch is sent (kQueueCopy: READ responses); that is copied here.
// Consecutive packets of equal size for one destination QP form a run,
// handed to the kernel as one UDP_SEGMENT send (wire-protocol.md §1.1).
struct TxBatch {
    static constexpr int kSlots = 64;
    static constexpr int kIovs = kSlots * (kMaxSge + 2);
    struct Slot {
        uint8_t hdr[wire::kMaxHdrLen + 8];
        uint8_t tail[8]; // pad + ICRC
        uint8_t pad = 0;
        uint16_t ip_id = 0; // the IP ID the ICRC is computed for
        // Covered bytes after the IP ID (icrc_id_tail): what an ID other
        // than the one the ICRC was computed for changes (Nic::renumber).
        uint32_t id_tail = 0;
    };
    // One datagram, or a run of packets sent as one segmentation-offload send.
    struct PeerSocket;
    struct Run {
        sockaddr_in dst;
        // The destination's connected socket (Nic::peer_socket), or nullptr
        // for the device socket.
        PeerSocket *peer = nullptr;
        uint16_t first = 0; // its first packet's slot
        uint32_t dqpn = 0;
        uint32_t seg = 0;   // UDP payload of each packet but a shorter last
        uint32_t bytes = 0; // UDP payload of the whole run
        uint16_t count = 0;
        bool closed = false; // ends with a shorter packet: nothing more joins
        alignas(cmsghdr) uint8_t ctl[CMSG_SPACE(sizeof(uint16_t))];
    };
    Slot slots[kSlots];
    Run runs[kSlots];
    mmsghdr msgs[kSlots]; // one per run
    iovec iov[kIovs];     // the runs' iovecs, each run's contiguous
    int n = 0;            // packets
    int nruns = 0;
    int niov = 0;
    // Payload copied at queue time, so the ICRC covers exactly the bytes sent
    // even if the memory changes before sendmmsg (allocated on first use).
    static constexpr size_t kCopyBytes = size_t(kSlots) * 4096;
    std::unique_ptr<uint8_t[]> copy;
    size_t copied = 0;
    // The QP whose packets are being built, when their order matters: a
    // batch that fills up mid-build is sent under its tx_mu.
    std::mutex *order = nullptr;
};

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
        // socket's IP ID counter was read afresh (Nic::learn_ip_id).
        tx_connected{0}, tx_ip_id_learned{0},
        // Selective repeat: requests held past a gap, and packets resent
        // one by one (SACKs and the recovery timer).
        rx_held{0}, tx_resent_selective{0};
};

// A connected socket for one peer address.  Sending on it skips the route
// lookup an unconnected socket makes for every datagram (about a tenth of a
// small message's round trip on loopback), but Linux then numbers the IPv4
// IDs from a counter of the socket's — a random start, one more per datagram,
// the segments of a run that ID, +1, … — and the ICRC covers the ID.  So the
// counter is read once (learn_ip_id), followed under `mu` for every send, and
// each packet's ICRC corrected for its ID just before it leaves
// (wire-protocol.md §4.2).
struct TxBatch::PeerSocket {
    std::atomic<in_addr_t> addr{0}; // stored last, once the rest is set
    int fd = -1;
    // False: this peer gets the device socket (the socket could not be
    // made, or its counter no longer be read).
    std::atomic<bool> usable{false};
    uint16_t port = 0;    // its UDP source port (host order)
    std::mutex mu;        // held from the ID correction to the send
    uint16_t last_id = 0; // the ID of the last datagram sent
    bool synced = false;  // last_id is known
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

    // Queues one packet: hdr holds BTH and extended headers (hdr_len bytes),
    // payload is gathered from `iov`; pad and ICRC are added here.
    // kQueueLegacyFlush: a FLUSH (no payload) in Linux rxe's ICRC form.
    // kQueueCopy: the payload is copied now, not referenced until sent —
    // for memory others may write meanwhile (a READ response's source: the
    // target application, or another QP's WRITE, can change it before the
    // batch is sent, and a payload that no longer matches its ICRC is a
    // packet the requester drops, again on every retry).
    static constexpr unsigned kQueueLegacyFlush = 1, kQueueCopy = 2;
    void queue(TxBatch &b, in_addr_t dst, const uint8_t *hdr, size_t hdr_len, const iovec *iov,
               int iovcnt, uint32_t payload_len, unsigned flags = 0);
    void flush(TxBatch &b);

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
    // Multicast (UD QPs): a group is an IPv4 multicast address, joined by a
    // socket of its own bound to the group's port 4791; datagrams to it
    // (destination QPN 0xFFFFFF) reach every QP attached.  0 or an errno.
    int attach_mcast(Qp *qp, in_addr_t group);
    int detach_mcast(Qp *qp, in_addr_t group);
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

    // A device opened while its address was not on the host has no socket
    // of the address (no slot at the agent) until a QP or SRQ needs one:
    // then this makes it, or returns why the port is down.  0 or an errno.
    int ensure_socket();

    // The agent that leased this process its slot is gone: every QP is in
    // error, the socket is closed, and no new object can be made (EIO).
    bool lost() const { return lost_.load(std::memory_order_relaxed); }
    // Whether QPs offer selective repeat to their peers (SROCE_SELECTIVE_REPEAT).
    bool selective_repeat() const { return selective_repeat_; }

    MrTable mrs;
    // Held by whoever dispatches packets (the progress thread or an
    // application thread in app_progress) while it touches QPs and MRs, and
    // by destroy/dereg so nothing is freed under it.
    std::mutex objects_mu;
    NicStats stats;

  private:
    std::atomic<bool> stats_printed_{false};
    explicit Nic(Device *dev);
    ~Nic();
    int open_socket();
    // The address's socket (the agent's lease, or one of our own) into
    // fd_, and the QPN space of its slot.  Caller owns the Nic alone or
    // holds bind_mu_ and qp_alloc_mu_.  0 or an errno.
    int bind_socket();
    // A socket of our own, bound without the agent (SROCE_AGENT=off); -1
    // with errno set.
    int open_exclusive();
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
    // SROCE_AGENT_WAIT seconds (default kAgentWaitS) have passed; then the
    // device is lost.
    void resume_slot();
    void lose_device();
    void run();
    // Sleeps until the socket may hold something (or not at all while the
    // progress thread spins, or parks while an application spins).
    void wait_for_work(uint64_t spin_until);
    void nap(uint64_t ns);
    // One non-blocking recvmmsg() and the dispatch of what it returned;
    // caller holds rx_mu_.  Returns the number of datagrams received.
    int rx_pass();
    // One recvmmsg() on `fd` (the device socket, or a multicast group's
    // whose address is `dst`) and the dispatch of what it returned.
    int rx_from(int fd, in_addr_t dst, bool adaptive);
    // One packet through the fault injector (SROCE_FAULT) to dispatch().
    void receive_one(const uint8_t *d, size_t len, const sockaddr_in &from, in_addr_t dst,
                     uint16_t pos, TxBatch &tx);
    // One packet; `pos` is its place in a coalesced receive buffer (its IP ID).
    void dispatch(const uint8_t *data, size_t len, const sockaddr_in &from, in_addr_t dst,
                  uint16_t pos, TxBatch &tx);
    void deliver(Qp *qp, wire::Packet &pkt, TxBatch &tx);
    using PeerSocket = TxBatch::PeerSocket;
    // The connected socket for packets to `dst`, made on first use; nullptr
    // for multicast, when the table is full or the socket cannot be made.
    PeerSocket *peer_socket(in_addr_t dst);
    // Reads the socket's IP ID counter: a datagram to a socket of our own,
    // whose header comes back with its transmit timestamp.  p.mu held.
    bool learn_ip_id(PeerSocket &p);
    // Sends runs [off, end) of the batch, all on p's socket (nullptr: the
    // device socket); a failure loses the rest of them.
    void send_runs(TxBatch &b, int off, int end, PeerSocket *p);
    // Corrects the ICRCs of runs [off, end) for the IDs a connected socket
    // gives them when `first` is the next of its counter.
    static void renumber(TxBatch &b, int off, int end, uint16_t first);
    void fire_timers(TxBatch &tx);
    void flush_acks(TxBatch &tx);

    Device *dev_;
    int refs_ = 0;
    int fd_ = -1; // sends; and receives, unless the slot is relayed
    // Where this process's packets arrive: fd_'s socket, or the agent's relay
    // (agent_proto.hpp, kOpenRelayed), whose datagrams start with a RelayHdr.
    int rx_fd_ = -1;
    bool relayed_ = false;
    // conn, agent_uid and steering_kept change only in resume_slot() while
    // resuming_ is set, when the progress thread does not look at them.
    agent::Lease lease_;
    std::atomic<bool> resuming_{false};
    std::thread resumer_;
    static constexpr unsigned kAgentWaitS = 30;
    agent::QpEntry *table_ = nullptr; // shared with the agent
    int table_fd_ = -1;
    uint32_t qpn_base_ = 0, srqn_base_ = 0;
    std::atomic<bool> lost_{false};
    // fd_ is the address's socket, and qpn_base_ and srqn_base_ are set.
    std::atomic<bool> bound_{false};
    std::mutex bind_mu_;
    // The port as last seen: 0 (up) or link_down_reason().  A look every
    // 200 ms costs 15 us (under 0.01% of a core per open device) and sees
    // an address come or go without a netlink socket in every process.
    std::atomic<int> port_down_{0};
    static constexpr uint64_t kPortCheckNs = 200000000;
    int wake_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::atomic<Qp *> qps_[kMaxQps] = {};
    std::atomic<Srq *> srqs_[kMaxSrqs] = {};
    // Multicast groups.  A slot's fd changes under rx_mu_ and objects_mu
    // (so a receive pass never reads a closed one); members under objects_mu.
    struct McGroup {
        std::atomic<int> fd{-1};
        in_addr_t addr = 0;
        std::vector<Qp *> members;
    };
    McGroup mc_[kMaxMcGroups];
    static constexpr int kPeerSockets = 16;
    // [0] for application threads, [1] for the progress thread.
    PeerSocket peers_[2][kPeerSockets];
    std::mutex peers_mu_;   // making one
    bool connected_ = true; // SROCE_CONNECTED=0: the device socket only
    // The next IP ID each recent source's connected socket will send
    // (dispatch(): checked before solving for it); under rx_mu_.
    struct IdGuess {
        in_addr_t addr = 0;
        uint16_t port = 0;
        uint16_t base = 0; // ID of the last datagram, less its place in a run
        // The highest such ID seen: a datagram that two CPUs' receive queues
        // put behind a later one must not move the next one's guess back.
        uint16_t high = 0;
    };
    IdGuess id_guess_[64];
    static constexpr int kLikelyIds = 4;    // ahead, checked for a datagram's first packet
    static constexpr int kLikelyBehind = 4; // and behind the highest, after those
    std::atomic<int> mc_count_{0};
    std::mutex qp_alloc_mu_;
    uint32_t qp_next_ = 0;
    std::atomic<uint32_t> qp_top_{0}; // one past the highest slot ever used
    // QPs in qps_ now.  With none, the progress thread has no timers to run
    // and sleeps kIdleSleepMs at a time: as often as run() looks for the
    // agent's exit.
    std::atomic<uint32_t> live_qps_{0};
    static constexpr int kIdleSleepMs = 20;
    // Receive state shared by the progress thread and app_progress():
    // everything below rx_mu_ is used only by its holder.
    struct RxState;
    std::mutex rx_mu_;
    std::unique_ptr<RxState> rx_;
    std::unique_ptr<TxBatch> tx_;
    std::unique_ptr<TxBatch> timer_tx_; // the progress thread's, for timers
    std::vector<Qp *> acks_;            // QPs with a coalesced ACK to send
    FaultConfig fault_;
    uint64_t rng_ = 0;
    uint64_t fault_seq_ = 0; // datagrams seen by the fault injector
    bool busy_poll_ = false;
    // Segmentation offload on send (UDP_SEGMENT) and coalesced receives
    // (UDP_GRO); SROCE_GSO=0 / SROCE_GRO=0 turn them off.  Send offload also
    // goes off for good the first time the kernel refuses it.
    std::atomic<bool> gso_{true};
    bool gro_ = true;
    bool selective_repeat_ = true;
    bool app_progress_ = true;
    uint64_t spin_ns_ = 50000; // how long the progress thread polls after traffic
    // An application thread counts as spinning on its CQ (app_progress)
    // after this many polls, each less than kSpinningGapNs after the one
    // before, the last less than kSpinningGapNs ago; the progress thread
    // then leaves the socket to it and looks again every kParkNs.
    static constexpr uint32_t kSpinningPolls = 8;
    static constexpr uint64_t kSpinningGapNs = 5000;
    static constexpr uint64_t kParkNs = 50000;
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
    bool app_is_spinning(uint64_t now) const;
};

} // namespace sroce
