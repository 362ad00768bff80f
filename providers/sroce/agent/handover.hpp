// SPDX-License-Identifier: MIT
//
// What an agent leaves for the one that takes over after it dies: who holds
// which slot of each address it serves with a slot map (steering.hpp), and
// which map that is.  The programs keep their sockets, and with them their
// traffic, when the agent dies; a new agent keeps steering by the same map,
// takes each slot back only from the process that held it, and gives it to
// nobody else while that process lives.
//
// Root's agent keeps the record in /run/sroce (a directory of root's, 0755;
// the file 0600), one file per network
// namespace and agent socket name; others keep none (they cannot load a
// slot map either).
#pragma once

#include "inet.hpp"

#include <cstdint>
#include <netinet/in.h>
#include <string>
#include <sys/types.h>
#include <vector>

namespace sroce::agent {

struct SlotOwner {
    IpAddr addr;
    uint32_t slot;
    pid_t pid;
    uid_t uid;
    uint64_t start; // the process's start time (proc_start), against pid reuse
    uint32_t map;   // the id of the slot map steering `addr` (steering.hpp), 0 if unknown
    // With an empty `addr`: the interface of a device that has every
    // address of it.
    std::string netdev = {};
};

// /proc/PID/FILE, or "" when it cannot be read.  Never throws: a process
// exiting between open(2) and read(2) makes the read fail with ESRCH, which
// an iostream would turn into an exception ending the agent.
std::string read_proc(pid_t pid, const char *file);
// What is left to read of `fd`, or "" when a read fails.
std::string read_rest(int fd);

// When `pid` started, in clock ticks since boot (/proc/PID/stat); 0 when
// no such process is alive.
uint64_t proc_start(pid_t pid);

// Where this agent keeps its record (per network namespace and socket name).
std::string record_path();

// Replaces the record with `owners`.  0 or an errno.
int save_owners(const std::vector<SlotOwner> &owners);

// The record's entries whose process still lives.
std::vector<SlotOwner> load_owners();

} // namespace sroce::agent
