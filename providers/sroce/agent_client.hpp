// SPDX-License-Identifier: MIT
//
// The process's side of the agent protocol (agent_proto.hpp).
#pragma once

#include "agent_proto.hpp"

#include <sys/types.h>
#include <vector>

#include <sys/types.h>
#include <vector>

namespace sroce::agent {

// A process's hold on one device: the connection whose end releases it, the
// slot's UDP socket, and the slot (the QPN bits 16-23 steered to it).
struct Lease {
    int conn = -1;
    int udp = -1;
    uint32_t slot = 0;
    bool relayed = false; // `udp` is the agent's relay (OpenReply::flags)
};

// The options every device socket gets, whoever makes it (the agent, or a
// process with SROCE_AGENT=off): DF, the multicast interface, 16 MiB buffers.
void roce_socket_options(int fd, uint32_t addr);

// One message with one descriptor attached (SCM_RIGHTS); -1 with errno.
ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd);
// One message (retried on EINTR); *fd gets the first descriptor attached
// (close-on-exec), the others are closed, -1 when none came.
ssize_t recv_with_fd(int sock, void *buf, size_t len, int flags, int *fd);

// A connection to the agent, starting one (`sroce agent start`) when none
// answers and `start` is set; -1 with errno otherwise.  An answer from a
// process that is neither root nor of this process's user is refused
// (EPERM, the reason printed): it could be anyone's squatting the name.
int connect_agent(bool start);

// Whether the process at the other end of `fd` may be this process's agent:
// root's or its own user's.  If not, `why` says who it is.
bool trusted_agent(int fd, std::string &why);

// Leases a slot on the device at `addr` (network order), sharing the QP
// table in `table_fd` for listings.  0 or an errno; the reason is printed,
// but for EADDRNOTAVAIL (the address is not on the host).
int lease_slot(const char *dev_name, const char *netdev, uint32_t addr, int table_fd, Lease &out);

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
