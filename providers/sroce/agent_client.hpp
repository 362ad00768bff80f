// SPDX-License-Identifier: MIT
//
// The process's side of the agent protocol (agent_proto.hpp).
#pragma once

#include "agent_proto.hpp"

namespace sroce::agent {

// A process's hold on one device: the connection whose end releases it, the
// slot's UDP socket, and the slot (the QPN bits 16-23 steered to it).
struct Lease {
    int conn = -1;
    int udp = -1;
    uint32_t slot = 0;
};

// A connection to the agent, starting one (`sroce agent start`) when none
// answers and `start` is set; -1 with errno otherwise.
int connect_agent(bool start);

// Leases a slot on the device at `addr` (network order), sharing the QP
// table in `table_fd` for listings.  0 or an errno; the reason is printed.
int lease_slot(const char *dev_name, const char *netdev, uint32_t addr, int table_fd, Lease &out);

} // namespace sroce::agent
