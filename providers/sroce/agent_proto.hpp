// SPDX-License-Identifier: MIT
//
// What a process and the host's sroce agent say to each other.  The agent is
// the "kernel" of sroce (docs/shared-device.md): it owns every device
// address's UDP sockets, hands each process one of them (its slot), and
// keeps what is shared per host.  A process's data path never goes through
// the agent: the kernel's reuseport steering puts a packet straight into the
// socket of the process that owns its destination QP.
//
// The connection is a Unix SOCK_SEQPACKET socket, one per opened device, so
// that its end is the end of the process's use of the device, however the
// process ends.  Messages are fixed-layout structs; file descriptors travel
// as SCM_RIGHTS.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace sroce::agent {

// Bumped whenever a message's layout or meaning changes: a process and an
// agent from different builds then refuse each other with a clear message
// instead of misreading.
// 3: relayed slots (OpenReply::flags); 4: slots resumed under a new agent;
// 5: IPv6 addresses (16-byte addresses everywhere); 6: devices that follow
// their net device (an empty address), RelayHdr::to_addr,
// CmDeviceInfo::netdev; 7: CmDeviceInfo::gids; 8: RelayHdr's IP header
// fields; 9: QpEntry's congestion control
constexpr uint32_t kProtoVersion = 9;

// There is one agent per network namespace, which is exactly the scope of
// the addresses it serves; where it listens is agent_client.hpp's
// agent_endpoints().

// A QPN's bits 16-23 are its slot: the steering program reads that byte of
// the BTH and returns it as the index into the address's reuseport group.
// Slot 0 is the agent's (QP0, QP1 and anything unroutable).
constexpr uint32_t kSlotShift = 16;
constexpr uint32_t kMaxSlots = 256;
// What one user but root may hold of an address's kMaxSlots - 1.
constexpr uint32_t kSlotsPerUser = 128;
// How many addresses one user but root may have the agent serve at once
// (devices opened, and devices its rdma_cm channels name): each costs the
// agent descriptors, and any of 127.0.0.0/8 is an address of the host.
constexpr uint32_t kAddrsPerUser = 32;
// How many rdma_cm channels one user but root may have open at once: each
// costs the agent two descriptors and may queue Cm::kEventsPerChannel events.
constexpr uint32_t kChannelsPerUser = 512;
inline uint32_t qpn_slot(uint32_t qpn) {
    return (qpn >> kSlotShift) & 0xFF;
}

enum Op : uint32_t {
    kOpenDevice = 1, // process: give me a slot on this address
    kResources = 2,  // sroce(8): the processes and QPs of every device, as JSON
    kStop = 3,       // sroce(8): exit now
    kStatus = 4,     // sroce(8): pid, version, devices, as JSON
    // librdmacm's event channel (an open of the rdma_cm device): followed by
    // the process's devices as CmDeviceInfo[]; the reply's `slot` is the
    // channel's number.  The connection then carries one wake-up byte per
    // event queued (what poll(2) on the channel sees).
    kCmChannel = 5,
    // The same channel's commands (`reserved` = its number): CmCommand in,
    // CmReply out, one at a time.
    kCmCommands = 6,
};

// What a process's libibverbs says about one of its devices, for the
// answers the rdma_cm ABI gives about it.
struct CmDeviceInfo {
    uint8_t addr[16]; // IPv6, or IPv4-mapped
    uint32_t index;   // ibv_get_device_index()
    uint64_t guid;    // ibv_get_device_guid(), as stored (network order)
    uint8_t mtu;      // the port's active ibv_mtu
    uint8_t reserved[7];
    char name[64];
    char netdev[16]; // its interface: all of whose addresses are the
                     // device's when `addr` is empty
    // Its GID table by index, an unused entry all zeros: the sgid_index an
    // address handle the CM gives names.
    uint8_t gids[16][16];
};

// One rdma_ucm command: the command struct after its header (`in_len`
// bytes, a user pointer's data appended), and how much reply the caller
// takes.
struct CmCommand {
    uint32_t cmd;
    uint32_t in_len;
    uint32_t out_cap;
    uint32_t reserved;
};
struct CmReply {
    int32_t err; // an errno, 0 on success
    uint32_t out_len;
};
constexpr size_t kCmMaxMsg = 4096;

struct Request {
    uint32_t op;
    uint32_t version;
    char name[64];   // kOpenDevice: the device's name, for listings
    char netdev[16]; // kOpenDevice: its interface
    // kOpenDevice: the address, IPv6 or IPv4-mapped; empty: every address
    // of the interface (a device that follows its net device)
    uint8_t addr[16];
    // kOpenDevice: 0, or the slot this process held under an agent that
    // died (resuming it); kCmCommands: the channel's number.
    uint32_t arg;
};

// kOpenDevice carries one descriptor, the process's QP table (below).  The
// reply, when err == 0, carries one descriptor for the slot:
// - a process of the agent's own user gets the slot's UDP socket: bound to
//   addr:4791, in the address's reuseport group, so the kernel delivers it
//   every packet whose destination QPN has this slot;
// - any other user's process (kOpenRelayed) gets the end of a Unix
//   SOCK_SEQPACKET pair on which the agent relays those packets, each behind
//   a RelayHdr, and sends from a socket of its own.  Whoever holds a member
//   of a reuseport group can reprogram or detach the group's steering
//   (SO_ATTACH_REUSEPORT_CBPF, SO_DETACH_REUSEPORT_BPF) or connect(2) it to
//   take a peer's packets; only the agent's own user may hold one
//   (docs/shared-device.md, "Who receives what").
//
// The agent steers the address by a slot map (kOpenSteeringKept), which
// outlives it: when it dies, a process keeps its socket, or its relay
// stops, and resumes the slot under the agent that follows (kOpenDevice
// with `arg` = the slot; a process of the agent's user attaches the slot's
// socket after the QP table, and gets no descriptor back; another user's
// gets a new relay).
static_assert(sizeof(Request) == 108 && sizeof(CmDeviceInfo) == 376); // agent_wire.py
constexpr uint32_t kOpenRelayed = 1;
constexpr uint32_t kOpenSteeringKept = 2;
struct OpenReply {
    uint32_t version;
    int32_t err; // an errno, 0 on success
    uint32_t slot;
    uint32_t flags; // kOpenRelayed, kOpenSteeringKept
    char msg[256];  // why not, for the process to print
};

// What precedes each relayed datagram: where it came from, and which
// address of the device it was sent to.
struct RelayHdr {
    uint8_t from_addr[16]; // its GID: IPv6, or IPv4-mapped
    uint16_t from_port;    // network order
    // Of its IP header (IpFields): the traffic class or TOS, the hop limit
    // or TTL (0: not known), the IPv6 flow label (network order).
    uint8_t tclass;
    uint8_t hop_limit;
    uint8_t to_addr[16];
    uint32_t flow_label;
};
static_assert(sizeof(RelayHdr) == 40);

// The table a process shares with the agent (a memfd it sends with
// kOpenDevice): one entry per QP slot of the process, written by the
// process whenever a QP is created, changes state or is destroyed, read by
// the agent only for listings.  A reader may see a half-updated entry; it is
// never used for anything but display.
constexpr uint32_t kTableEntries = 4096; // = the engine's QPs per process
struct QpEntry {
    // bit 63 valid, bits 40-47 state (ibv_qp_state), 32-39 type
    // (ibv_qp_type), 0-23 QPN
    std::atomic<uint64_t> id;
    // bits 0-23 peer QPN
    std::atomic<uint64_t> peer;
    // the peer's address (IPv6, or IPv4-mapped), in two halves
    std::atomic<uint64_t> peer_addr[2];
    // Congestion control (congestion.hpp): the rate the QP is held to in
    // kbit/s (0: not limited), CNPs sent and received, rate cuts.
    std::atomic<uint64_t> cc_rate_kbps;
    std::atomic<uint64_t> cc_cnps_sent;
    std::atomic<uint64_t> cc_cnps_received;
    std::atomic<uint64_t> cc_cuts;
};
static_assert(sizeof(QpEntry) == 64);

inline uint64_t qp_entry_id(uint32_t qpn, uint32_t type, uint32_t state) {
    return 1ull << 63 | uint64_t(state & 0xFF) << 40 | uint64_t(type & 0xFF) << 32 |
           (qpn & 0xFFFFFF);
}

} // namespace sroce::agent
