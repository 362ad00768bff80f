// SPDX-License-Identifier: MIT
//
// How the kernel hands an address's packets to the socket of their slot
// (docs/shared-device.md, "Steering"): a program attached to the address's
// SO_REUSEPORT group reads the destination QPN's slot byte.
//
// Two ways, chosen when the agent starts serving an address:
// - a slot map (eBPF, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY): slot -> socket,
//   with holes; it outlives the agent, which is what lets running programs
//   keep their traffic when the agent dies and lets a new agent take the
//   group over.  Loading it takes CAP_BPF (root's agent);
// - a classic program returning the slot as the index into the group, which
//   the kernel keeps in join order: anyone may load it, but a socket that
//   leaves moves the last one into its place, so the group must lose no
//   member while it serves, and cannot outlive the agent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sroce::agent {

// A slot map attached to the group `member` belongs to, its slot 0 being
// `member`.  The map's descriptor, or -1 with `why` (the classic program
// is then the way).  SROCE_AGENT_STEERING=classic makes it refuse.
int attach_slot_map(int member, std::string &why);

// The slot map a dead predecessor attached to the group that `member` has
// just joined, found again by its id (slot_map_id), with `member` put at
// its empty slot 0.  The sockets the running programs kept stay in it, so
// their traffic goes on through the takeover, where a new map would drop it
// until each program had handed its socket in.  It must hold a socket at
// one of `held` (the slots the record says live processes hold), which a
// map freed since and an id reused cannot.  The map's descriptor, or -1
// with `why`.
int adopt_slot_map(uint32_t id, int member, const std::vector<uint32_t> &held, std::string &why);

// The kernel's id of `map`, by which a successor finds it; 0 if unknown.
uint32_t slot_map_id(int map);

// Whether `sock` is the socket at `slot`: one that a process kept in an
// adopted map, which the kernel will not put there a second time (EBUSY).
bool slot_holds(int map, uint32_t slot, int sock);

// Puts `sock`, a member of the map's group, at `slot`.  0 or an errno:
// EINVAL for a socket that is not a bound member of a reuseport group.
int map_slot(int map, uint32_t slot, int sock);

// Takes `slot` out of the map (a socket no longer there).
void unmap_slot(int map, uint32_t slot);

// The classic program for a group of `members` sockets, attached through
// `member`; 0 or an errno.
int attach_classic(int member, uint32_t members);

} // namespace sroce::agent
