// SPDX-License-Identifier: MIT
//
// The in-memory port: devices of a process whose configuration is loaded
// with SROCE_PORT=memory are on one wire in memory instead of the kernel's
// UDP.  A datagram one sends is queued at the device whose address it is
// for, whole (a run stays one coalesced datagram, as UDP_GRO gives it), and
// its ICRC covers what UDP would carry: the sender's address and source port
// 4791, and each packet's place in its run as its IP ID.  No socket, no
// kernel, no steering: the engine's wire conformance, transport and fuzzing
// run on it with nothing between two NICs but a queue.
//
// A test stands in for a peer that is not a sroce device through the
// functions of `memwire`: it receives what is sent to an address no device
// has, and sends from any address and port.
#pragma once

#include "icrc.hpp"
#include "port.hpp"

#include <deque>
#include <vector>

namespace sroce {

class MemPort final : public Port {
  public:
    explicit MemPort(const IpAddr &addr);
    ~MemPort() override;

    Route route(const IpAddr &, const IpAddr &, const IpFields &) override { return {}; }
    void transmit(TxBatch &b) override;
    int receive(RxDatagram *out, int max) override;
    int join(const IpAddr &group) override;
    void leave(const IpAddr &group) override;
    int poll_fds(pollfd *out, int max) override;

    const IpAddr &addr() const { return addr_; }
    // Queues a datagram for receive(); called by the wire, from any thread.
    void deliver(const IpAddr &from, uint16_t sport, const IpAddr &dst, const uint8_t *data,
                 size_t len, size_t seg, const IpFields &ip);

  private:
    struct Datagram {
        std::vector<uint8_t> bytes;
        IpAddr from;
        uint16_t sport = 0;
        IpAddr dst;
        size_t seg = 0;
        IpFields ip;
    };
    IpAddr addr_;
    std::mutex mu_; // guards queue_, event_fd_ and signalled_
    std::deque<Datagram> queue_;
    // Readable while the queue holds something, for a progress thread to
    // sleep on: made when one first asks (poll_fds), so that a NIC polled
    // by its application alone (memwire::set_manual_progress) makes no
    // system call per datagram.
    int event_fd_ = -1;
    // Whether event_fd_ is readable: it is written when the queue stops
    // being empty and read when it becomes empty again, not once per
    // datagram.
    bool signalled_ = false;
    static constexpr size_t kMaxQueued = 4096; // then datagrams are dropped
    // What the last receive() returned, kept until the next one.
    Datagram taken_[kRxBatch];
    std::vector<uint8_t> gather_; // transmit()'s, under the caller's batch
};

// The wire the MemPorts of the process are on, and a test's access to it.
namespace memwire {

// One packet as it was on the wire: its bytes (BTH to ICRC) and the header
// fields its ICRC covers.
struct Packet {
    std::vector<uint8_t> bytes;
    IpHeader ip;
    IpFields fields; // what the sender's AV put in the IP header
};

// Keeps what is sent to `addr` (a peer of the test's, no device's) for
// take(); until then it is dropped, as a datagram to nobody.
void listen(const IpAddr &addr);
inline void listen(in_addr_t addr) {
    listen(IpAddr::v4(addr));
}
// The oldest packet sent to `addr` since listen(), or false.
bool take(const IpAddr &addr, Packet &out);
inline bool take(in_addr_t addr, Packet &out) {
    return take(IpAddr::v4(addr), out);
}
// Drops what is kept for every listened address, and stops keeping it.
void reset();
// A datagram of one packet (or a run: `seg` bytes each, the last possibly
// shorter) from `from` to port 4791 of `to`.  Its ICRCs must cover what
// MemPort receivers assume: the source port of `from`, and each packet's
// place in the datagram as its IP ID.  False when no device has `to`, or
// the datagram is larger than UDP carries (Port::kMaxDatagram).
bool send(const IpAddr &from, uint16_t sport, const IpAddr &to, const uint8_t *data, size_t len,
          size_t seg = 0, const IpFields &ip = {});
inline bool send(const sockaddr_in &from, in_addr_t to, const uint8_t *data, size_t len,
                 size_t seg = 0) {
    return send(IpAddr::v4(from.sin_addr.s_addr), ntohs(from.sin_port), IpAddr::v4(to), data, len,
                seg);
}

// NICs made from now on run no progress thread: the test drives them with
// Nic::poll_once().  For a harness that must know when a packet has been
// handled (fuzzing); others keep the thread.
void set_manual_progress(bool manual);
bool manual_progress();

} // namespace memwire

} // namespace sroce
