// SPDX-License-Identifier: MIT
//
// The kernel's UDP as a device's port: the address's socket on port 4791
// (the agent's lease, or one of our own), a connected socket per peer
// address, multicast groups' sockets, segmentation offload on send
// (UDP_SEGMENT) and coalesced receives (UDP_GRO), sendmmsg()/recvmmsg().
#pragma once

#include "port.hpp"

#include <string>

namespace sroce {

struct NicStats;

// A connected socket for one peer address and set of header fields (flow
// label, traffic class, hop limit: socket options, as a control message
// would make the kernel look the route up again).  Sending on it skips the
// route lookup an unconnected socket makes for every datagram (about a
// tenth of a small message's round trip on loopback), but over IPv4
// Linux then numbers the IDs from a counter of the socket's — a random
// start, one more per datagram, the segments of a run that ID, +1, … — and
// the ICRC covers the ID.  So the counter is read once (learn_ip_id),
// followed under `mu` for every send, and each packet's ICRC corrected for
// its ID just before it leaves (design.md §7.3).  IPv6 has no such field.
struct PeerSocket {
    std::atomic<bool> set{false}; // stored last, once the rest is set
    IpAddr addr;
    IpAddr src;  // the address it is bound to
    IpFields ip; // a flow label names the source port
    int fd = -1;
    // False: this peer gets the device socket (the socket could not be
    // made, or its counter no longer be read).
    std::atomic<bool> usable{false};
    uint16_t port = 0;    // its UDP source port (host order)
    std::mutex mu;        // held from the ID correction to the send
    uint16_t last_id = 0; // the ID of the last datagram sent
    bool synced = false;  // last_id is known
};

class UdpPort final : public Port {
  public:
    struct Options {
        bool gso = true;       // SROCE_GSO
        bool gro = true;       // SROCE_GRO
        bool connected = true; // SROCE_CONNECTED: a socket per peer address
    };
    // `ifindex`: the interface of the address, the scope of link-local peers.
    // An empty `addr`: every address of that interface is the port's (a
    // device that follows its net device).
    UdpPort(const char *name, const IpAddr &addr, int ifindex, NicStats &stats, Options o);
    ~UdpPort() override;

    // Unbound stand-ins for the address's socket: every thread always has a
    // descriptor to poll and receive from, on which nothing ever arrives.
    // 0 or an errno.
    int open();
    // The address's socket into the stand-ins' numbers, so that a thread
    // polling or receiving meanwhile never meets a closed descriptor.
    // `relayed`: `sock` is the agent's relay, whose datagrams start with a
    // RelayHdr, and a socket of our own on the address sends.  Takes `sock`.
    // 0 or an errno.
    int adopt(int sock, bool relayed);
    // A socket of our own on the address, bound without the agent
    // (SROCE_AGENT=off); -1 with errno set.
    int bind_exclusive() const;
    // Receives from `rx` from now on (a relay under a new agent), or from
    // nothing (rx < 0: an unbound socket).
    void replace_rx(int rx);
    // Sends and receives nothing from now on: the address's group must
    // empty for a restarted agent to rebuild it.
    void shut();
    int tx_fd() const { return fd_; }
    bool relayed() const { return relayed_; }

    Route route(const IpAddr &src, const IpAddr &dst, const IpFields &f) override;
    void transmit(TxBatch &b) override;
    int receive(RxDatagram *out, int max) override;
    int join(const IpAddr &group) override;
    void leave(const IpAddr &group) override;
    int poll_fds(pollfd *out, int max) override;

    // Marks the calling thread as the device's progress thread, which sends
    // from connected sockets of its own (route()).
    static void set_progress_thread();

  private:
    // An unbound socket of the address's family (IPv6 for every address).
    int new_socket(bool nonblock) const;
    // The connected socket for packets from `src` to `dst` with header
    // fields `f`, made on first use; nullptr for multicast, when the table
    // is full or the socket cannot be made.
    PeerSocket *peer_socket(const IpAddr &src, const IpAddr &dst, const IpFields &f);
    // Reads the socket's IP ID counter: a datagram to a socket of our own,
    // whose header comes back with its transmit timestamp.  p.mu held.
    bool learn_ip_id(PeerSocket &p);
    // Sends runs [off, end) of the batch, all on p's socket (nullptr: the
    // device socket); a failure loses the rest of them.
    void send_runs(TxBatch &b, int off, int end, PeerSocket *p);
    // Corrects the ICRCs of runs [off, end) for the IDs a connected socket
    // gives them when `first` is the next of its counter.
    static void renumber(TxBatch &b, int off, int end, uint16_t first);
    // One recvmmsg() on `fd` into entries [at, at + max) (the device socket
    // when `adaptive`, else a multicast group's whose address is `dst`).
    int receive_from(int fd, const IpAddr &dst, bool adaptive, RxDatagram *out, int at, int max);

    std::string name_; // the device's, for messages
    IpAddr addr_;
    bool any_; // addr_ is empty: every address of the interface
    int ifindex_;
    NicStats &stats_;
    Options opt_;
    int fd_ = -1; // sends; and receives, unless the slot is relayed
    // Where this process's packets arrive: fd_'s socket, or the agent's
    // relay (agent_proto.hpp, kOpenRelayed).
    int rx_fd_ = -1;
    bool relayed_ = false;
    static constexpr int kPeerSockets = 16;
    // [0] for application threads, [1] for the progress thread.
    PeerSocket peers_[2][kPeerSockets];
    std::mutex peers_mu_; // making one
    // Multicast groups' sockets.  A slot's fd changes only under the NIC's
    // receive lock, so a receive never reads a closed one.
    struct Group {
        std::atomic<int> fd{-1};
        IpAddr addr;
    };
    Group groups_[kMaxMcGroups];
    std::atomic<int> ngroups_{0};
    // Receive buffers, used by whoever holds the NIC's receive lock.
    struct RxState;
    std::unique_ptr<RxState> rx_;
};

} // namespace sroce
