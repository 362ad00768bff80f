// SPDX-License-Identifier: MIT
//
// The sroce link configuration: which devices exist and which local address
// each one answers on.  Shared by the engine (to build its device list) and
// by the sroce(8) tool (to edit the list), so both agree on one file format.
#pragma once

#include "inet.hpp"

#include <string>
#include <vector>

namespace sroce {

// Congestion control of a link (docs/congestion-control.md): ECN-capable
// packets, CNPs for the CE marks received, and DCQCN's rate limiter per QP;
// off unless `sroce link set NAME cc dcqcn` turns it on.
// Every field but `enabled` is a parameter of `sroce link set NAME cc ...`,
// in the units cc_params() names.
struct CcParams {
    bool enabled = false;        // cc dcqcn | cc off
    double cnp_interval = 1000;  // us: at most one CNP per QP this often
    double cnp_dscp = 48;        // the CNPs' DSCP
    double cut_interval = 2000;  // us: at most one rate cut per QP this often
    double alpha_g = 1.0 / 256;  // g, α's gain
    double alpha_timer = 2000;   // us: α decays when no CNP came for this long
    double rate_timer = 2000;    // us: T, a rate increase this often
    double rate_bytes = 65536;   // B: and one per this many bytes sent
    double stages = 5;           // F: fast recovery stages
    double ai_rate = 0.5;        // Mbit/s: R_AI, additive increase
    double hai_rate = 2;         // Mbit/s: R_HAI, hyper increase
    double min_rate = 1;         // Mbit/s: no QP is held below this
    double first_rate = 0;       // Mbit/s: the rate the first CNP cuts (0: the QP's measured rate)
    double inflight_time = 2000; // us: a limited QP's rate times this in flight at most
    bool operator==(const CcParams &) const = default;
};

// The parameters by name, as links.conf and `sroce link set` write them.
struct CcParamInfo {
    const char *name;
    double CcParams::*field;
    double min, max;
    bool integer;
    const char *unit; // what the value counts
};
const std::vector<CcParamInfo> &cc_params();
// Sets `name` to the text `value`; empty, or why it cannot.
std::string set_cc_param(CcParams &cc, const std::string &name, const std::string &value);
// `cc dcqcn` or `cc off` and the parameters that differ from the defaults,
// as words for links.conf.
std::vector<std::string> cc_words(const CcParams &cc);

struct Link {
    std::string name;   // device name, as ibv_get_device_name() reports it
    std::string netdev; // interface the address lives on; used for MTU and state
    // IPv4 dotted quad, or an IPv6 literal; empty: every address of
    // netdev, as an rxe link has (the device follows its net device)
    std::string addr;
    CcParams cc;

    bool operator==(const Link &) const = default;
};

inline constexpr const char *default_config_path = "/etc/sroce/links.conf";

// $SROCE_CONFIG if set and non-empty, else default_config_path.
std::string config_path();

// A missing file is an empty configuration, so a fresh host needs no setup.
// Any malformed line throws std::runtime_error("PATH:LINE: reason").
std::vector<Link> load_links(const std::string &path);

// Validates, creates the parent directory, then replaces the file atomically
// so a concurrently starting application never reads a half-written list.
// Throws std::runtime_error on invalid links or on any system-call failure.
void save_links(const std::string &path, const std::vector<Link> &links);

// Empty when the link is acceptable on its own, else why it is not.  Does not
// check uniqueness, which only makes sense against a whole list.
std::string link_error(const Link &link);

// Empty when `links` could be saved, else the first reason it cannot.
std::string links_error(const std::vector<Link> &links);

// Binary-equal addresses written differently ("::1" and "0::1") are the same
// endpoint; this is the canonical text used to compare them.  Empty when
// `addr` is neither an IPv4 nor an IPv6 literal.
std::string canonical_addr(const std::string &addr);
bool is_ipv6_addr(const std::string &addr);

// The addresses of `netdev` in the order the kernel's GID cache adds them to
// an RDMA device's table: IPv4 ones (mapped), then IPv6 ones.  None for an
// unknown interface.
std::vector<IpAddr> netdev_addrs(const std::string &netdev);
// First IPv4 address of `netdev`; throws if the interface is unknown or has none.
std::string interface_ipv4(const std::string &netdev);
// Throws if the interface is unknown.
int interface_mtu(const std::string &netdev);
bool interface_exists(const std::string &netdev);
// Up and carrier present; false for an unknown interface.
bool interface_running(const std::string &netdev);
// Whether a socket of this network namespace can bind `addr` (an IPv4 or
// IPv6 literal; a link-local IPv6 one on `netdev`): whether the address is
// on the host now.
bool address_local(const std::string &addr, const std::string &netdev);
// Why the port of `link` is down, as rxe has it when its net device lost the
// address or went down: EADDRNOTAVAIL (the address is not on the host),
// ENETDOWN (the interface is down, has no carrier or does not exist), or 0
// when the port is up.  One socket and two system calls: 15 us on a loaded
// 2-core VM, as much as interface_running() alone, so every port query can
// afford it.
int link_down_reason(const Link &link);

// Largest IB MTU (256..4096) whose RoCEv2 frame fits in an interface MTU of
// `ifmtu`, or 0 if not even 256 fits.  IPv6 has a 20-byte larger header.
int roce_mtu(int ifmtu, bool ipv6 = false);

// Serialises read-modify-write cycles of the file at `path` between
// processes (two concurrent `sroce link add` would otherwise lose one link).
// Locks the containing directory, creating it if needed, because the file
// itself is replaced by rename and a lock on it would not survive.
class ConfigLock {
  public:
    explicit ConfigLock(const std::string &path);
    ~ConfigLock();
    ConfigLock(const ConfigLock &) = delete;
    ConfigLock &operator=(const ConfigLock &) = delete;

  private:
    int fd_ = -1;
};

} // namespace sroce
