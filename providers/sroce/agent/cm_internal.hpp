// SPDX-License-Identifier: MIT
//
// What the rdma_cm files of the agent share (cm.cpp: ids, addresses and the
// connected CM; cm_ud.cpp: SIDR and multicast): the ucma ABI's event
// numbers, the constants cma.c uses on RoCE, and the state of a channel and
// of an id.  Private to Cm.
#pragma once

#include "cm.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>

namespace sroce::agent {

// The event numbers of the ucma ABI (rdma_cm_event_type, which
// <rdma/rdma_cma.h> declares next to names that clash with the ABI header).
enum : uint32_t {
    RDMA_CM_EVENT_ADDR_RESOLVED = 0,
    RDMA_CM_EVENT_ADDR_ERROR = 1,
    RDMA_CM_EVENT_ROUTE_RESOLVED = 2,
    RDMA_CM_EVENT_ROUTE_ERROR = 3,
    RDMA_CM_EVENT_CONNECT_REQUEST = 4,
    RDMA_CM_EVENT_CONNECT_RESPONSE = 5,
    RDMA_CM_EVENT_CONNECT_ERROR = 6,
    RDMA_CM_EVENT_UNREACHABLE = 7,
    RDMA_CM_EVENT_REJECTED = 8,
    RDMA_CM_EVENT_ESTABLISHED = 9,
    RDMA_CM_EVENT_DISCONNECTED = 10,
    RDMA_CM_EVENT_DEVICE_REMOVAL = 11,
    RDMA_CM_EVENT_MULTICAST_JOIN = 12,
    RDMA_CM_EVENT_MULTICAST_ERROR = 13,
    RDMA_CM_EVENT_ADDR_CHANGE = 14,
    RDMA_CM_EVENT_TIMEWAIT_EXIT = 15,
};

// What the kernel's rdma_cm uses on RoCE (cma.c).
constexpr uint8_t kCmResponseTimeout = 20; // CMA_CM_RESPONSE_TIMEOUT
constexpr uint8_t kMaxCmRetries = 15;      // CMA_MAX_CM_RETRIES
constexpr uint8_t kPacketLifeTime = 18;    // CMA_IBOE_PACKET_LIFETIME
constexpr uint8_t kAckDelay = 15;          // what the device advertises as its CA ACK delay
constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY
constexpr uint32_t kMaxBacklog = 1024;
constexpr uint32_t kInvalidIndex = 0xFFFFFFFF;
constexpr uint16_t kEphemeralLo = 32768, kEphemeralHi = 60999;

// 4.096 us * 2^t, as cm.c rounds it.
inline uint32_t conv_ms(uint8_t t) {
    return 1u << (t > 8 ? std::min<uint8_t>(t - 8, 31) : 0);
}

// cm.c's ACK timeout from the peer's ACK delay and the packet life time.
inline uint8_t ack_timeout(uint8_t delay, uint8_t plt) {
    uint8_t t = plt + 1;
    if (t >= delay)
        t += delay >= t - 1;
    else
        t = delay + (t >= delay - 1);
    return std::min<uint8_t>(t, 31);
}

// The transaction ID of a MAD exchange this side starts: "SR" above its
// local communication ID.
inline uint64_t own_tid(uint32_t local_comm) {
    return uint64_t(0x5352) << 48 | local_comm;
}

inline uint64_t now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

template <class T>
inline T load(const uint8_t *p, size_t len) {
    T v{};
    std::memcpy(&v, p, std::min(len, sizeof v));
    return v;
}

// Whether `a` is the wildcard address of its family.
inline bool is_any(const SockAddr &a) {
    return a.addr().unspecified();
}

enum class IdState {
    kIdle,
    kAddrQuery,
    kAddrResolved,
    kRouteQuery,
    kRouteResolved,
    kConnect,
    kDisconnect,
    kAddrBound,
    kListen
};
enum class CmState {
    kIdle,
    kReqSent,
    kMraReqRcvd,
    kReqRcvd,
    kMraReqSent,
    kRepSent,
    kMraRepRcvd,
    kRepRcvd,
    kMraRepSent,
    kEstablished,
    kDreqSent,
    kDreqRcvd,
    kTimewait,
    kSidrReqSent,
    kSidrReqRcvd
};

struct Cm::Channel {
    uint32_t num = 0;
    int event_fd = -1;
    pid_t pid = 0;
    uid_t uid = 0;
    bool bind_service = false; // may bind rdma_cm ports below 1024
    std::vector<CmDevice> devs;
    std::deque<rdma_ucm_event_resp> events;
    // The log said the channel stopped taking events, or its user joins.
    bool told_full = false, told_joins = false;
};

struct Cm::Id {
    uint32_t handle = 0;
    uint64_t uid = 0; // the process's own (rdma_cm's context)
    uid_t owner = 0;  // the user of its channel, for kIdsPerUser
    uint32_t ch = 0;
    uint16_t ps = 0;
    uint8_t qp_type = 0;
    IdState state = IdState::kIdle;
    // Its addresses, of one family: AF_INET, or AF_INET6 with the scope of
    // a link-local address and the flow label the process set.
    SockAddr src, dst;
    bool bound = false, reuseaddr = false;
    bool afonly = true, afonly_set = false; // RDMA_OPTION_ID_AFONLY, set by the process
    uint8_t tos = 0;
    uint8_t ack_timeout_opt = 0; // RDMA_OPTION_ID_ACK_TIMEOUT, 0 = not set
    IpAddr dev;                  // the device's address once known
    uint32_t seq_num = 0;        // the PSN this side receives from (rdma_cm's seq_num)
    uint32_t events_reported = 0;
    bool destroyed = false; // the process let go; the CM finishes quietly
    uint32_t backlog = 0, pending = 0;
    uint32_t listener = 0; // a connection request's listener
    rdma_ucm_conn_param param{};
    rdma_ucm_ece ece{};
    // What the peer said (REQ or REP), in this side's view.
    uint32_t remote_qpn = 0, remote_psn = 0;
    uint8_t responder_resources = 0, initiator_depth = 0, retry_count = 7, rnr_retry_count = 7;
    uint8_t path_mtu = 3, local_ack_timeout = 19;
    bool active = false;
    // InfiniBand CM
    CmState cm = CmState::kIdle;
    uint32_t local_comm = 0, remote_comm = 0;
    uint64_t remote_guid = 0;
    uint64_t tid = 0;
    IpAddr peer_ip; // the peer's GID
    uint32_t cm_timeout_ms = 0;
    uint8_t max_cm_retries = kMaxCmRetries;
    uint8_t mad[cm::kMadLen] = {};
    int retries_left = 0;
    uint32_t retry_ms = 0;
    uint64_t deadline = 0;       // retransmission, 0 = none
    uint64_t timewait_until = 0; // 0 = not in timewait
    uint32_t qkey = 0;           // a UD id's, once set (cma_set_qkey)
};

// Multicast joins are numbered apart from ids (which librdmacm keeps below
// 65536), so an event names one or the other.
constexpr uint32_t kMcHandleBase = 0x10000;

struct Cm::McJoin {
    uint32_t handle = 0, id = 0;
    uint64_t uid = 0;
    uid_t owner = 0; // the user of its channel, for kJoinsPerUser
    IpAddr group;
    bool send_only = false;
    uint32_t events_reported = 0;
};

} // namespace sroce::agent
