// SPDX-License-Identifier: MIT
//
// The network port of a device: what carries the NIC's datagrams.  The NIC
// (nic.hpp) builds packets into a TxBatch and dispatches what a receive
// returns; a Port moves them.  UdpPort (port_udp.hpp) is the kernel's UDP
// sockets; MemPort (port_mem.hpp) keeps them in memory, for tests and
// fuzzing without a network.  Calls are per batch and per run, never per
// packet.
#pragma once

#include "sroce.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

namespace sroce {

struct PeerSocket; // UdpPort's connected socket for one peer address

// How a run leaves: the UDP source port its ICRCs cover, and the port's own
// handle for the way (a connected socket), or nullptr for the device's.
struct Route {
    PeerSocket *peer = nullptr;
    uint16_t sport = wire::kRoceV2Port;
};

// rdma-core's ibv_flow_label_to_udp_sport(): the UDP source port of a
// RoCEv2 flow whose flow label is not 0, in the range 0xC000-0xFFFF.
constexpr uint16_t flow_label_sport(uint32_t fl) {
    uint32_t fl_low = fl & 0x3FFF, fl_high = fl & 0xFC000;
    return uint16_t(((fl_low ^ (fl_high >> 14)) & 0x3FFF) | 0xC000);
}

// Packets queued for one transmit.  Headers are copied into the slot; the
// payload is referenced in place (user memory) unless others may write it
// before the batch is sent (kQueueCopy: READ responses); that is copied here.
// Consecutive packets of equal size for one destination QP form a run, one
// datagram of several packets for a port with segmentation offload
// (design.md §7.2).  The runs are laid out as sendmmsg() takes them;
// a MemPort reads the same iovecs.
struct TxBatch {
    static constexpr int kSlots = 64;
    static constexpr int kIovs = kSlots * (kMaxSge + 2);
    struct Slot {
        uint8_t hdr[wire::kMaxHdrLen + 8];
        uint8_t tail[8]; // pad + ICRC
        uint8_t pad = 0;
        uint16_t ip_id = 0; // the IP ID the ICRC is computed for
        // Covered bytes after the IP ID (icrc_id_tail): what an ID other
        // than the one the ICRC was computed for changes (UdpPort::renumber).
        uint32_t id_tail = 0;
    };
    // One datagram, or a run of packets sent as one segmentation-offload send.
    struct Run {
        SockAddr dst;
        IpAddr src;
        IpFields ip;
        Route route;
        uint16_t first = 0; // its first packet's slot
        uint32_t dqpn = 0;
        uint32_t seg = 0;   // UDP payload of each packet but a shorter last
        uint32_t bytes = 0; // UDP payload of the whole run
        uint16_t count = 0;
        bool closed = false; // ends with a shorter packet: nothing more joins
        // UDP_SEGMENT, the traffic class and hop limit the AV names, and
        // the source address where the socket is not bound to it
        // (IPV6_PKTINFO).
        alignas(cmsghdr)
            uint8_t ctl[CMSG_SPACE(sizeof(uint16_t)) + 2 * CMSG_SPACE(sizeof(int)) + kPktinfoSpace];
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

// One datagram a receive returned, in the port's buffers until its next
// receive.
struct RxDatagram {
    const uint8_t *data = nullptr;
    size_t len = 0;
    IpAddr src;         // the sender's
    uint16_t sport = 0; // its UDP port
    IpAddr dst;         // an address of the device, or a multicast group's
    // A coalesced receive: each packet's size, the last possibly shorter,
    // each packet's IP ID its place (design.md §7.2); 0 for one packet.
    size_t seg = 0;
    // Of the IP header, as far as the port can tell (every segment of a
    // coalesced receive has the same: the kernel coalesces no others); a
    // hop limit of 0 is one not known.
    IpFields ip;
};

struct NicStats;

class Port {
  public:
    static constexpr int kRxBatch = 64;
    // A coalesced receive (UDP_GRO) holds up to one IP datagram's worth.
    static constexpr size_t kMaxDatagram = 65536;

    virtual ~Port() = default;
    // The way packets from `src` to `dst` with header fields `f` leave;
    // asked once per run.  A flow label names the UDP source port
    // (flow_label_sport).
    virtual Route route(const IpAddr &src, const IpAddr &dst, const IpFields &f) = 0;
    // Sends every run of the batch; the caller empties it.  A datagram that
    // cannot leave is lost, as on a wire: the transport recovers it.
    virtual void transmit(TxBatch &b) = 0;
    // Up to `max` datagrams, without blocking; one without data is to be
    // skipped (truncated, or malformed before it reached the port).
    virtual int receive(RxDatagram *out, int max) = 0;
    // Multicast groups whose datagrams receive() returns too.  0 or an errno.
    virtual int join(const IpAddr &group) = 0;
    virtual void leave(const IpAddr &group) = 0;
    // Descriptors that turn readable when receive() has something, for the
    // progress thread to sleep on; none for a port without descriptors.
    virtual int poll_fds(pollfd *out, int max) = 0;

    // Runs of several packets per datagram.
    bool gso() const { return gso_.load(std::memory_order_relaxed); }

  protected:
    // Off for good when the kernel first refuses segmentation offload.
    std::atomic<bool> gso_{true};
};

} // namespace sroce
