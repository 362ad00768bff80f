// SPDX-License-Identifier: MIT
//
// The host's sroce agent (docs/shared-device.md): one process per network
// namespace that owns the UDP sockets of every sroce device address, gives
// each process using a device a slot (a socket the kernel steers that
// process's QP numbers to), and serves what a device shares between
// processes.  sroce(8) runs it as `sroce agent`; the engine starts it on
// demand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <sys/types.h>

namespace sroce::agent {

struct Options {
    // Seconds the agent stays up with no process using a device; 0 = forever.
    unsigned idle_exit = 10;
    // Detach (new session, stdio to /dev/null or `log`) once listening; the
    // calling process exits 0 then, or non-zero with the reason on stderr.
    bool detach = false;
    std::string log; // where a detached agent writes its messages
    // Read and keep the record of slot owners a successor needs
    // (handover.hpp).
    bool handover = true;
};

// Runs the agent until it is stopped or idle.  Returns the exit status;
// 0 also when another agent already serves this namespace (`start` then has
// nothing to do).
int run(const Options &opts);

// An agent inside the calling process, with no socket of its own: the
// caller makes its clients' connections and runs its loop one pass at a
// time.  For the control protocol's fuzz target (tests/fuzz/fuzz_agent.cpp).
class Session {
  public:
    explicit Session(const Options &opts);
    ~Session();
    // A client's connection, the agent taking its credentials to be `pid`,
    // `uid` and `gid`: the client's end (a SOCK_SEQPACKET socket), or -1.
    int connect(pid_t pid, uid_t uid, gid_t gid);
    // One pass of the agent's loop, waiting at most `max_wait_ms`.  False
    // once the agent stopped (kStop) or failed.
    bool pass(int max_wait_ms);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Asks the running agent for `op`'s JSON (kResources, kStatus).  Throws
// std::runtime_error when no agent answers.
std::string query(uint32_t op);

// Asks the running agent to stop.  Throws std::runtime_error when no agent
// answers or it refuses (the caller is neither its user nor root).
void stop();

} // namespace sroce::agent
