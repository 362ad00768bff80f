// SPDX-License-Identifier: MIT
//
// The process's side of the agent protocol (agent_proto.hpp).
#pragma once

#include "agent_proto.hpp"
#include "inet.hpp"

#include <string>
#include <sys/types.h>
#include <sys/un.h>
#include <vector>

namespace sroce::agent {

// A process's hold on one device: the connection whose end releases it, the
// slot's UDP socket, and the slot (the QPN bits 16-23 steered to it).
struct Lease {
    int conn = -1;
    int udp = -1;
    uint32_t slot = 0;
    bool relayed = false;       // `udp` is the agent's relay (OpenReply::flags)
    bool steering_kept = false; // kOpenSteeringKept: the slot outlives the agent
    uid_t agent_uid = 0;        // whose agent granted it (SO_PEERCRED)
};

// The options every device socket gets, whoever makes it (the agent, or a
// process with SROCE_AGENT=off): DF, the multicast interface, 16 MiB buffers,
// IPv6 datagrams without a UDP checksum, the received IP header's fields
// reported (read_ip_fields in inet.hpp).  An empty `addr`: a socket for every
// address of interface `ifindex`.
void roce_socket_options(int fd, const IpAddr &addr, int ifindex);

// Lets an IPv6 UDP socket take datagrams whose checksum is 0 (UDP_NO_CHECK6_RX).
void accept_zero_udp6_checksum(int fd);
// Makes a socket report the IP header fields read_ip_fields() reads, of
// IPv4 datagrams, IPv6 ones, or both (a dual-stack socket).
void receive_ip_fields(int fd, bool v4, bool v6);

// One message with one descriptor attached (SCM_RIGHTS); -1 with errno.
ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd);
// The same with one or two.
ssize_t send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds);
// One message (retried on EINTR); *fd gets the first descriptor attached
// (close-on-exec), the others are closed, -1 when none came.
ssize_t recv_with_fd(int sock, void *buf, size_t len, int flags, int *fd);
// The same for the first `max` (at most 4) descriptors, -1 past those that came.
ssize_t recv_with_fds(int sock, void *buf, size_t len, int flags, int *fds, int max);

// Where agents listen (docs/shared-device.md, "Who the agent is"): the
// system agent (root's) on a socket file in kSystemDir, one per network
// namespace, which only root can make; a user's own agent on an abstract
// name of that user's; or the abstract name $SROCE_AGENT_SOCKET says
// alone (tests).
constexpr const char *kSystemDir = "/run/sroce";
struct Endpoint {
    sockaddr_un sa{};
    socklen_t len = 0;
    std::string text; // a path, or "@name"
    bool system = false;
};
// Where this process looks for its agent, in order: $SROCE_AGENT_SOCKET
// alone, or the system agent's and then this user's own.
std::vector<Endpoint> agent_endpoints();
// Where an agent of this process's user listens: root's on the system
// socket (or, where it cannot make one — root of a user namespace, a
// read-only /run — on root's own name), anyone else's on its own name.
Endpoint own_endpoint();
// This user's own agent's abstract name (sroce-agent-UID).
Endpoint user_endpoint();

// A connection to the agent, starting one (`sroce agent start`) when none
// answers and `start` is set; -1 with errno otherwise.  An answer from a
// process that is neither root nor of this process's user is refused
// (EPERM, the reason printed): it could be anyone's squatting the name.
int connect_agent(bool start);

// Whether the process at the other end of `fd` (connected to `where`) may
// be this process's agent: root's or its own user's.  If not, `why` says
// who it is.
bool trusted_agent(int fd, const std::string &where, std::string &why);

// Taking back, under a new agent, the slot held under one that died.
struct Resume {
    uint32_t slot;
    int sock;        // the slot's socket, kept; -1 for a relayed slot
    bool may_start;  // start an agent when none answers
    std::string why; // the agent's reason for a refusal (not printed)
};

// Leases a slot on the device at `addr`, sharing the QP
// table in `table_fd` for listings, or resumes one.  0 or an errno; the
// reason is printed, but for EADDRNOTAVAIL (the address is not on the host).
// A resumed slot of the agent's user comes without a socket (out.udp -1).
int lease_slot(const char *dev_name, const char *netdev, const IpAddr &addr, int table_fd,
               Lease &out, Resume *resume = nullptr);

// An rdma_cm event channel at the agent: `events` is the file the process
// polls (one byte per event), `commands` carries the channel's commands.
struct CmChannel {
    int events = -1, commands = -1;
    uint32_t number = 0;
};
// 0 or an errno.
int open_cm_channel(CmChannel &out);

} // namespace sroce::agent

namespace sroce {
// This process's sroce devices as the agent's rdma_cm needs them (verbs.cpp).
std::vector<agent::CmDeviceInfo> cm_device_infos();
} // namespace sroce
