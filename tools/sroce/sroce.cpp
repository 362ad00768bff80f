// SPDX-License-Identifier: MIT
//
// sroce(8): manages the sroce link configuration and runs programs with the
// verbs shim preloaded.  The command syntax follows iproute2's `rdma link` so
// that instructions written for rxe carry over with only the tool renamed.
#include "agent.hpp"
#include "agent_proto.hpp"
#include "config.hpp"
#include "devview.hpp"
#include "mountview.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <iostream>
#include <net/if.h>
#include <netinet/in.h>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#ifndef SROCE_VERSION
#define SROCE_VERSION "unknown"
#endif

namespace {

#ifndef SROCE_SHIM_SONAME
#define SROCE_SHIM_SONAME "libsroce.so"
#endif

// The shim is looked for under its soname first: a runtime-only installation
// (the libsroce package without -dev) has no libsroce.so development link.
constexpr const char *shim_names[] = {SROCE_SHIM_SONAME, "libsroce.so"};

// Syntax errors in arguments CLI11 cannot see (the iproute2-style keyword
// pairs); reported with exit status 2 like CLI11's own parse errors.
class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

struct AddArgs {
    std::string netdev;
    std::optional<std::string> addr;
};

AddArgs parse_add_keywords(const std::vector<std::string> &words) {
    AddArgs out;
    bool have_netdev = false;
    for (std::size_t i = 0; i < words.size(); i += 2) {
        const std::string &key = words[i];
        if (key != "netdev" && key != "addr")
            throw UsageError("unknown keyword '" + key + "' (expected netdev or addr)");
        if (i + 1 >= words.size()) throw UsageError("missing value after '" + key + "'");
        if (key == "netdev") {
            if (have_netdev) throw UsageError("'netdev' given twice");
            out.netdev = words[i + 1];
            have_netdev = true;
        } else {
            if (out.addr) throw UsageError("'addr' given twice");
            out.addr = words[i + 1];
        }
    }
    if (!have_netdev) throw UsageError("missing 'netdev IF'");
    return out;
}

// Binding is the question the engine will ask later, so it is the most
// faithful test that the address is usable here: the kernel accepts exactly
// the addresses it would deliver to us, including all of 127/8 on lo.
void check_local_address(const std::string &addr, const std::string &netdev) {
    sockaddr_storage ss{};
    socklen_t len;
    int family;
    if (!sroce::is_ipv6_addr(addr)) {
        auto *sin = reinterpret_cast<sockaddr_in *>(&ss);
        sin->sin_family = AF_INET;
        if (::inet_pton(AF_INET, addr.c_str(), &sin->sin_addr) != 1)
            throw std::runtime_error("invalid address '" + addr + "'");
        len = sizeof *sin;
        family = AF_INET;
    } else {
        auto *sin6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        sin6->sin6_family = AF_INET6;
        ::inet_pton(AF_INET6, addr.c_str(), &sin6->sin6_addr);
        // A link-local address is only meaningful together with its interface.
        if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr))
            sin6->sin6_scope_id = ::if_nametoindex(netdev.c_str());
        len = sizeof *sin6;
        family = AF_INET6;
    }
    int fd = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    int rc = ::bind(fd, reinterpret_cast<sockaddr *>(&ss), len);
    int err = errno;
    ::close(fd);
    if (rc == 0) return;
    if (err == EADDRNOTAVAIL)
        throw std::runtime_error("address " + addr + " is not assigned to any local interface");
    throw std::runtime_error("cannot bind to " + addr + ": " + std::strerror(err));
}

void link_add(const std::string &path, const std::string &name,
              const std::vector<std::string> &keywords) {
    AddArgs args = parse_add_keywords(keywords);
    sroce::Link link{name, args.netdev, args.addr.value_or("")};

    if (!sroce::interface_exists(link.netdev))
        throw std::runtime_error("no such interface '" + link.netdev + "'");
    // Without an address the link follows its interface, as an rxe link
    // does: every address of it, now and later, is the device's.
    if (args.addr) {
        if (sroce::canonical_addr(link.addr).empty())
            throw std::runtime_error("invalid address '" + link.addr +
                                     "' (expected an IPv4 or IPv6 address)");
        check_local_address(link.addr, link.netdev);
    }
    if (std::string err = sroce::link_error(link); !err.empty()) throw std::runtime_error(err);

    sroce::ConfigLock lock(path);
    std::vector<sroce::Link> links = sroce::load_links(path);
    for (const sroce::Link &l : links)
        if (l.name == link.name) throw std::runtime_error("link '" + name + "' already exists");
    links.push_back(link);
    if (std::string err = sroce::links_error(links); !err.empty()) throw std::runtime_error(err);
    sroce::save_links(path, links);
}

void link_del(const std::string &path, const std::string &name) {
    sroce::ConfigLock lock(path);
    std::vector<sroce::Link> links = sroce::load_links(path);
    auto it = std::find_if(links.begin(), links.end(),
                           [&](const sroce::Link &l) { return l.name == name; });
    if (it == links.end()) throw std::runtime_error("link '" + name + "' does not exist");
    links.erase(it);
    sroce::save_links(path, links);
}

// `sroce link set NAME cc dcqcn|off|default [PARAM VALUE]...`: applies the
// words to `cc`, or says why they are wrong.
void apply_cc_keywords(sroce::CcParams &cc, const std::vector<std::string> &words) {
    if (words.empty()) throw UsageError("nothing to set (expected cc and its parameters)");
    // Each word once: with two values one would be lost without a word.
    // `cc default` may start the list, and then a mode may follow it.
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < words.size(); i += 2) {
        const std::string &key = words[i];
        if (i + 1 >= words.size()) throw UsageError("missing value after '" + key + "'");
        const std::string &value = words[i + 1];
        bool reset = key == "cc" && value == "default";
        if (reset && i != 0) throw UsageError("'cc default' must come first");
        if (!reset) {
            if (std::find(seen.begin(), seen.end(), key) != seen.end())
                throw UsageError("'" + key + "' given twice");
            seen.push_back(key);
        }
        if (key == "cc") {
            if (reset)
                cc = sroce::CcParams{};
            else if (value == "dcqcn" || value == "off")
                cc.enabled = value == "dcqcn";
            else
                throw UsageError("unknown congestion control '" + value +
                                 "' (expected dcqcn, off or default)");
            continue;
        }
        if (std::string err = sroce::set_cc_param(cc, key, value); !err.empty())
            throw UsageError(err.rfind("unknown", 0) == 0 ? "unknown keyword '" + key +
                                                                "' (expected cc or one of its "
                                                                "parameters; see sroce(8))"
                                                          : err);
    }
}

void link_set(const std::string &path, const std::string &name,
              const std::vector<std::string> &keywords) {
    sroce::ConfigLock lock(path);
    std::vector<sroce::Link> links = sroce::load_links(path);
    auto it = std::find_if(links.begin(), links.end(),
                           [&](const sroce::Link &l) { return l.name == name; });
    if (it == links.end()) throw std::runtime_error("link '" + name + "' does not exist");
    apply_cc_keywords(it->cc, keywords);
    sroce::save_links(path, links);
}

struct LinkStatus {
    bool active;
    std::optional<int> mtu;
    std::optional<unsigned> netdev_index;
};

LinkStatus link_status(const sroce::Link &link) {
    LinkStatus st{false, std::nullopt, std::nullopt};
    if (!sroce::interface_exists(link.netdev)) return st;
    if (unsigned idx = ::if_nametoindex(link.netdev.c_str()); idx != 0) st.netdev_index = idx;
    // As the port of a running program has it (the address must be on the host).
    st.active = sroce::link_down_reason(link) == 0;
    try {
        st.mtu = sroce::roce_mtu(sroce::interface_mtu(link.netdev),
                                 link.addr.empty() || sroce::is_ipv6_addr(link.addr));
    } catch (const std::runtime_error &) {
        // The interface vanished between the two queries; report it as gone.
        st = LinkStatus{false, std::nullopt, std::nullopt};
    }
    return st;
}

// One JSON object per link, with iproute2's `rdma link show -j` keys first;
// both `sroce link show` and the rdma wrapper print these.
nlohmann::ordered_json link_rows(const std::string &path, const std::optional<std::string> &which) {
    std::vector<sroce::Link> links = sroce::load_links(path);

    // rdma(8) names a port as DEV/PORT; sroce devices have the single port 1.
    std::optional<std::string> want = which;
    if (want && want->size() > 2 && want->ends_with("/1")) want->resize(want->size() - 2);

    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < links.size(); ++i) {
        const sroce::Link &l = links[i];
        if (want && l.name != *want) continue;
        LinkStatus st = link_status(l);
        nlohmann::ordered_json j;
        j["ifindex"] = i;
        j["ifname"] = l.name;
        j["port"] = 1;
        j["state"] = st.active ? "ACTIVE" : "DOWN";
        j["physical_state"] = st.active ? "LINK_UP" : "DISABLED";
        j["netdev"] = l.netdev;
        if (st.netdev_index) j["netdev_index"] = *st.netdev_index;
        if (!l.addr.empty()) j["addr"] = l.addr; // none: every address of netdev
        if (st.mtu) j["mtu"] = *st.mtu;
        nlohmann::ordered_json cc;
        cc["mode"] = l.cc.enabled ? "dcqcn" : "off";
        for (const sroce::CcParamInfo &p : sroce::cc_params())
            cc[p.name] = l.cc.*p.field;
        j["cc"] = std::move(cc);
        out.push_back(std::move(j));
    }
    if (want && out.empty()) throw std::runtime_error("link '" + *which + "' does not exist");
    return out;
}

// `with_cc`: sroce's own listing; rdma(8)'s has no congestion control.
std::string link_text(const nlohmann::ordered_json &row, bool with_cc = true) {
    std::string line = "link " + row["ifname"].get<std::string>() + "/1 state " +
                       row["state"].get<std::string>() + " physical_state " +
                       row["physical_state"].get<std::string>() + " netdev " +
                       row["netdev"].get<std::string>();
    if (row.contains("addr")) line += " addr " + row["addr"].get<std::string>();
    if (row.contains("mtu")) line += " mtu " + std::to_string(row["mtu"].get<int>());
    // Congestion control, and the parameters that are not the defaults.
    if (with_cc && row.contains("cc")) {
        sroce::CcParams cc;
        cc.enabled = row["cc"]["mode"] == "dcqcn";
        for (const sroce::CcParamInfo &p : sroce::cc_params())
            cc.*p.field = row["cc"][p.name].get<double>();
        for (const std::string &w : sroce::cc_words(cc))
            line += " " + w;
    }
    return line;
}

void link_show(const std::string &path, const std::optional<std::string> &which, bool json) {
    nlohmann::ordered_json rows = link_rows(path, which);
    if (json) {
        std::cout << rows.dump() << '\n';
        return;
    }
    for (const auto &row : rows)
        std::cout << link_text(row) << '\n';
}

std::string exe_dir() {
    std::error_code ec;
    std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return {};
    return exe.parent_path().string();
}

std::string find_shim() {
    if (const char *env = std::getenv("SROCE_SHIM"); env != nullptr && *env != '\0') {
        // An explicit choice that is wrong must not silently fall back to
        // some other build of the shim.
        if (::access(env, R_OK) != 0)
            throw std::runtime_error(std::string("SROCE_SHIM=") + env + ": " +
                                     std::strerror(errno));
        return env;
    }

    std::vector<std::filesystem::path> dirs;
    if (std::string dir = exe_dir(); !dir.empty()) {
        const std::filesystem::path prefix = std::filesystem::path(dir) / "..";
        dirs.push_back(prefix / "lib");
#ifdef SROCE_INSTALL_LIBDIR
        {
            std::filesystem::path libdir = SROCE_INSTALL_LIBDIR;
            dirs.push_back(libdir.is_absolute() ? libdir : prefix / libdir);
        }
#endif
#ifdef SROCE_LIBRARY_ARCH
        dirs.push_back(prefix / "lib" / SROCE_LIBRARY_ARCH);
#endif
    }
    std::vector<std::filesystem::path> candidates;
    for (const auto &d : dirs)
        for (const char *name : shim_names)
            candidates.push_back(d / name);
#ifdef SROCE_BUILD_SHIM
    // Last, so that an installed sroce never prefers a stale build tree.
    candidates.emplace_back(SROCE_BUILD_SHIM);
#endif

    std::vector<std::string> tried;
    for (const auto &c : candidates) {
        std::string p = c.lexically_normal().string();
        if (::access(p.c_str(), R_OK) == 0) return p;
        if (std::find(tried.begin(), tried.end(), p) == tried.end()) tried.push_back(p);
    }
    std::string where;
    for (const std::string &p : tried)
        where += "\n  " + p;
    throw std::runtime_error(std::string("cannot find ") + shim_names[0] + "; looked in:" + where +
                             "\nset SROCE_SHIM to its path");
}

// ld.so splits LD_PRELOAD on both colons and spaces.
bool preload_has(const std::string &list, const std::string &lib) {
    std::size_t i = 0;
    while (i <= list.size()) {
        std::size_t end = list.find_first_of(": ", i);
        if (end == std::string::npos) end = list.size();
        if (list.compare(i, end - i, lib) == 0 && end - i == lib.size()) return true;
        i = end + 1;
    }
    return false;
}

// The directory holding `rdma`, a link to this program that `sroce exec`
// puts first on PATH (see run_rdma()).
std::string find_wrapper_dir() {
    std::vector<std::filesystem::path> candidates;
    if (std::string dir = exe_dir(); !dir.empty()) {
        const std::filesystem::path prefix = std::filesystem::path(dir) / "..";
#ifdef SROCE_INSTALL_LIBEXECDIR
        std::filesystem::path libexec = SROCE_INSTALL_LIBEXECDIR;
        candidates.push_back((libexec.is_absolute() ? libexec : prefix / libexec) / "sroce");
#endif
    }
#ifdef SROCE_BUILD_WRAPPERS
    candidates.emplace_back(SROCE_BUILD_WRAPPERS);
#endif
    for (const auto &c : candidates) {
        std::string dir = std::filesystem::absolute(c).lexically_normal().string();
        if (::access((dir + "/rdma").c_str(), X_OK) == 0) return dir;
    }
    return {};
}

// Makes the sroce devices visible outside libibverbs, in /sys/class and
// /dev/infiniband as the kernel would show them, to this process and the
// program it becomes.  Failing that, the program runs as before; it is told
// why on one line, since most programs never look there.
void show_devices_to_program(const std::string &shim) {
    if (const char *env = std::getenv("SROCE_EXEC_NAMESPACE"); env && std::string_view(env) == "0")
        return;
    std::vector<sroce::tool::DeviceView> devices;
    try {
        devices = sroce::tool::collect_devices(shim);
    } catch (const std::exception &e) {
        std::cerr << "sroce: exec: cannot list the devices (" << e.what()
                  << "); /sys/class/infiniband does not show them\n";
        return;
    }
    if (devices.empty()) return;
    if (std::string err = sroce::tool::show_devices(devices); !err.empty())
        std::cerr << "sroce: exec: /sys/class/infiniband and /dev/infiniband do not show the "
                     "sroce devices: "
                  << err << '\n';
}

void prepend_path(const std::string &dir) {
    std::string path;
    if (const char *old = std::getenv("PATH"); old != nullptr) {
        path = old;
    } else {
        // execvp()'s own default when PATH is unset.
        std::size_t n = ::confstr(_CS_PATH, nullptr, 0);
        path.resize(n);
        ::confstr(_CS_PATH, path.data(), n);
        path.resize(n ? n - 1 : 0);
    }
    if (path == dir || path.starts_with(dir + ":")) return;
    path = path.empty() ? dir : dir + ":" + path;
    if (::setenv("PATH", path.c_str(), 1) != 0)
        throw std::runtime_error(std::string("setenv: ") + std::strerror(errno));
}

int run_exec(const std::vector<std::string> &command, const std::string &config_override) {
    if (command.empty()) throw UsageError("exec: missing PROGRAM");

    std::string shim = find_shim();
    if (shim.find_first_of(": \t\n") != std::string::npos)
        throw std::runtime_error("shim path '" + shim +
                                 "' contains a colon or blank, which LD_PRELOAD cannot express");
    // The dynamic loader resolves a relative LD_PRELOAD entry against the
    // child's working directory; pin it down now.
    shim = std::filesystem::absolute(shim).lexically_normal().string();

    std::string preload = shim;
    if (const char *old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0')
        preload = preload_has(old, shim) ? std::string(old) : shim + ":" + old;
    if (::setenv("LD_PRELOAD", preload.c_str(), 1) != 0)
        throw std::runtime_error(std::string("setenv: ") + std::strerror(errno));

    // The engine inside the child reads the configuration itself; make it
    // read the file this invocation was told about.
    if (!config_override.empty()) {
        std::string abs = std::filesystem::absolute(config_override).string();
        if (::setenv("SROCE_CONFIG", abs.c_str(), 1) != 0)
            throw std::runtime_error(std::string("setenv: ") + std::strerror(errno));
    }

    // Both read /proc/self/exe, which names this program as seen from the
    // host, not from a chroot, once show_devices_to_program() has made a
    // mount namespace: so before it.
    if (std::string dir = find_wrapper_dir(); !dir.empty()) prepend_path(dir);
    // The program's library starts the agent when none runs; it is this
    // sroce, wherever it was installed or copied to, PATH or not.
    if (const char *bin = std::getenv("SROCE_AGENT_BIN"); bin == nullptr || *bin == '\0') {
        std::error_code ec;
        std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (!ec && ::access(self.c_str(), X_OK) == 0 &&
            ::setenv("SROCE_AGENT_BIN", self.c_str(), 1) != 0)
            throw std::runtime_error(std::string("setenv: ") + std::strerror(errno));
    }
    show_devices_to_program(shim);

    std::vector<char *> argv;
    for (const std::string &a : command)
        argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    int err = errno;
    std::cerr << "sroce: " << command[0] << ": " << std::strerror(err) << '\n';
    // Same convention as env(1) and the shells, so callers can tell a
    // missing program from one that ran and failed.
    return err == ENOENT ? 127 : 126;
}

// iproute2's rdma(8), found on PATH past the wrapper (which is this program
// under another name), or in its usual places.
std::string find_real_rdma() {
    std::error_code ec;
    const auto self = std::filesystem::canonical("/proc/self/exe", ec);
    std::vector<std::string> dirs;
    if (const char *path = std::getenv("PATH"); path != nullptr) {
        std::string_view rest = path;
        while (!rest.empty()) {
            std::size_t colon = rest.find(':');
            dirs.emplace_back(rest.substr(0, colon));
            rest = colon == rest.npos ? std::string_view() : rest.substr(colon + 1);
        }
    }
    for (const char *d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"})
        dirs.emplace_back(d);
    for (const std::string &d : dirs) {
        if (d.empty()) continue;
        const std::string candidate = d + "/rdma";
        if (::access(candidate.c_str(), X_OK) != 0) continue;
        if (std::filesystem::canonical(candidate, ec) == self) continue;
        return candidate;
    }
    return {};
}

struct Captured {
    int status = -1;
    std::string out, err;
};

std::string read_all(int fd) {
    std::string text;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buf, std::size_t(n));
    }
    return text;
}

// Runs `program` with our arguments; stderr goes to a file because a pipe
// for each stream would need polling to avoid a deadlock.
Captured capture(const std::string &program, char **argv) {
    Captured c;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return c;
    FILE *err = std::tmpfile();
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        if (err) ::dup2(::fileno(err), STDERR_FILENO);
        argv[0] = const_cast<char *>(program.c_str());
        ::execv(program.c_str(), argv);
        ::_exit(127);
    }
    ::close(out[1]);
    if (pid > 0) c.out = read_all(out[0]);
    ::close(out[0]);
    int status = 0;
    while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (pid > 0 && WIFEXITED(status)) c.status = WEXITSTATUS(status);
    if (err) {
        std::rewind(err);
        c.err = read_all(::fileno(err));
        std::fclose(err);
    }
    return c;
}

// iproute2 accepts any leading part of a keyword ("l" for "link").
bool abbreviates(std::string_view word, std::string_view keyword) {
    return !word.empty() && keyword.starts_with(word);
}

// `rdma`, as `sroce exec` puts it first on PATH: `rdma [-j] [-p] [-d] link
// [show|list] [DEV[/PORT]]` lists the sroce links after the kernel's, in the
// same form as `sroce link show`; anything else is iproute2's rdma(8).
int run_rdma(int argc, char **argv) {
    const std::string real = find_real_rdma();
    auto forward = [&]() -> int {
        if (real.empty()) {
            std::cerr << "rdma: iproute2's rdma is not installed\n";
            return 127;
        }
        argv[0] = const_cast<char *>(real.c_str());
        ::execv(real.c_str(), argv);
        std::cerr << "rdma: " << real << ": " << std::strerror(errno) << '\n';
        return 126;
    };

    bool json = false, pretty = false;
    std::vector<std::string> words;
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "--json") {
            json = true;
        } else if (a == "--pretty") {
            pretty = true;
        } else if (a == "--details") {
            // Details of sroce links are what `sroce link show` prints anyway.
        } else if (a.size() > 1 && a[0] == '-' && a[1] != '-') {
            for (char c : a.substr(1)) {
                if (c == 'j')
                    json = true;
                else if (c == 'p')
                    pretty = true;
                else if (c != 'd')
                    return forward();
            }
        } else if (a.starts_with("-")) {
            return forward();
        } else {
            words.emplace_back(a);
        }
    }
    const bool link_show =
        !words.empty() && words.size() <= 3 && abbreviates(words[0], "link") &&
        (words.size() == 1 || abbreviates(words[1], "show") || abbreviates(words[1], "list"));
    if (!link_show) return forward();

    nlohmann::ordered_json rows;
    std::optional<std::string> which;
    if (words.size() == 3) which = words[2];
    try {
        std::vector<sroce::Link> links = sroce::load_links(sroce::config_path());
        if (which) {
            std::string name =
                which->ends_with("/1") ? which->substr(0, which->size() - 2) : *which;
            if (std::none_of(links.begin(), links.end(),
                             [&](const sroce::Link &l) { return l.name == name; }))
                return forward();
        }
        rows = link_rows(sroce::config_path(), which);
    } catch (const std::exception &e) {
        std::cerr << "sroce: " << e.what() << '\n';
        return 1;
    }

    // The kernel's links, if it has any: without RDMA support rdma(8) fails
    // to open its netlink socket, which just means there are none.
    Captured kernel;
    if (!which && !real.empty()) kernel = capture(real, argv);
    if (kernel.status == 0) std::cerr << kernel.err;
    if (json) {
        nlohmann::ordered_json all = nlohmann::ordered_json::array();
        if (kernel.status == 0) {
            auto parsed = nlohmann::ordered_json::parse(kernel.out, nullptr, false);
            if (parsed.is_array()) all = std::move(parsed);
        }
        for (auto &row : rows)
            all.push_back(std::move(row));
        std::cout << (pretty ? all.dump(4) : all.dump()) << '\n';
    } else {
        if (kernel.status == 0) std::cout << kernel.out;
        for (const auto &row : rows)
            std::cout << link_text(row, false) << '\n';
    }
    return 0;
}

std::string command_path(const CLI::App &root) {
    std::string path = root.get_name();
    const CLI::App *app = &root;
    for (;;) {
        std::vector<CLI::App *> subs = app->get_subcommands();
        if (subs.empty()) break;
        app = subs.front();
        path += " " + app->get_name();
    }
    return path;
}

// CLI11 cannot stop at the first word of the child's command line (its
// prefix mode rejects everything after "--"), so the command is split off
// before parsing.  Returns the index of the "exec" word when it is the
// subcommand, i.e. when only our global options precede it.
std::optional<int> find_exec_word(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "exec") return i;
        if (a == "--config") {
            ++i;
            continue;
        }
        if (a.starts_with("--config=") || a == "-j" || a == "--json") continue;
        return std::nullopt;
    }
    return std::nullopt;
}

// `sroce resource show [qp]`, in the shape of iproute2's `rdma resource show`.
void resource_show(bool qps, bool as_json) {
    nlohmann::json r = nlohmann::json::parse(sroce::agent::query(sroce::agent::kResources));
    if (as_json) {
        std::cout << r.dump() << '\n';
        return;
    }
    int index = 0;
    for (const auto &d : r["devices"]) {
        if (!qps) {
            std::set<std::string> names;
            size_t nqp = 0, nproc = 0;
            for (const auto &p : d["processes"]) {
                if (p.contains("ifname")) names.insert(p["ifname"].get<std::string>());
                if (p["slot"] != 0) nproc++;
                nqp += p["qps"].size();
            }
            std::string joined;
            for (const std::string &n : names)
                joined += (joined.empty() ? "" : ",") + n;
            std::cout << index++ << ": " << (joined.empty() ? "-" : joined) << ": addr "
                      << d["addr"].get<std::string>() << " processes " << nproc << " qp " << nqp
                      << '\n';
            continue;
        }
        for (const auto &p : d["processes"]) {
            std::string link = p.contains("ifname") ? p["ifname"].get<std::string>()
                                                    : d["addr"].get<std::string>();
            for (const auto &q : p["qps"]) {
                std::cout << "link " << link << "/1 lqpn " << q["qpn"].get<uint32_t>();
                if (q.contains("rqpn")) std::cout << " rqpn " << q["rqpn"].get<uint32_t>();
                std::cout << " type " << q["type"].get<std::string>() << " state "
                          << q["state"].get<std::string>() << " pid " << p["pid"].get<int>()
                          << " comm " << p["comm"].get<std::string>();
                if (q.contains("cc")) {
                    const auto &c = q["cc"];
                    uint64_t kbps = c["rate_kbps"].get<uint64_t>();
                    std::cout << " cc_rate " << (kbps ? std::to_string(kbps) + "kbit" : "-")
                              << " cnps_sent " << c["cnps_sent"].get<uint64_t>()
                              << " cnps_received " << c["cnps_received"].get<uint64_t>()
                              << " rate_cuts " << c["rate_cuts"].get<uint64_t>();
                }
                std::cout << '\n';
            }
        }
    }
}

} // namespace

int main(int argc, char **argv) {
    if (std::filesystem::path(argv[0]).filename() == "rdma") return run_rdma(argc, argv);

    CLI::App app{"Manage sroce soft-RoCE devices and run programs on them.", "sroce"};
    app.set_version_flag("--version", std::string("sroce ") + SROCE_VERSION);
    app.require_subcommand(1);
    app.failure_message([](const CLI::App *root, const CLI::Error &e) {
        return "sroce: " + std::string(e.what()) + "\nTry '" + command_path(*root) +
               " --help' for more information.\n";
    });

    std::string config_override;
    bool json = false;
    app.add_option("--config", config_override,
                   "Link configuration file (default: $SROCE_CONFIG, else " +
                       std::string(sroce::default_config_path) + ")")
        ->type_name("PATH");
    app.add_flag("-j,--json", json, "Print link information as JSON");

    CLI::App *link = app.add_subcommand("link", "Show and edit sroce devices (default: show)");
    link->fallthrough();
    link->require_subcommand(0, 1);

    std::string add_name;
    std::vector<std::string> add_keywords;
    CLI::App *add = link->add_subcommand("add", "Create device NAME answering on IP (default: "
                                                "the first IPv4 address of IF)");
    add->fallthrough();
    add->add_option("NAME", add_name, "Device name, 1-63 characters from A-Za-z0-9_.-")->required();
    add->add_option("KEYWORDS", add_keywords, "netdev IF [addr IP]");
    add->footer("Usage: sroce link add NAME netdev IF [addr IP]");

    std::string set_name;
    std::vector<std::string> set_keywords;
    CLI::App *set = link->add_subcommand("set", "Change device NAME's congestion control");
    set->fallthrough();
    set->add_option("NAME", set_name, "Device name")->required();
    set->add_option("KEYWORDS", set_keywords, "cc dcqcn|off|default [PARAM VALUE]...");
    set->footer("Usage: sroce link set NAME cc dcqcn|off|default [PARAM VALUE]...\n"
                "Parameters: cnp-interval cnp-dscp cut-interval alpha-g alpha-timer rate-timer\n"
                "rate-bytes stages ai-rate hai-rate min-rate first-rate inflight-time\n"
                "(see sroce(8)).\n"
                "Programs that open the device afterwards use the new settings.");

    std::string del_name;
    CLI::App *del = link->add_subcommand("del", "Remove device NAME");
    del->alias("delete");
    del->fallthrough();
    del->add_option("NAME", del_name, "Device name")->required();

    std::string show_name;
    CLI::App *show = link->add_subcommand("show", "Show all devices, or only NAME");
    show->alias("list");
    show->fallthrough();
    show->add_option("NAME", show_name, "Device name (NAME or NAME/1)");

    CLI::App *agent = app.add_subcommand(
        "agent", "The host's sroce agent, which shares each device between processes");
    agent->require_subcommand(1);
    sroce::agent::Options agent_opts;
    CLI::App *agent_start =
        agent->add_subcommand("start", "Start it in the background unless one runs");
    CLI::App *agent_run = agent->add_subcommand("run", "Run it in the foreground");
    for (CLI::App *a : {agent_start, agent_run}) {
        a->add_option("--idle-exit", agent_opts.idle_exit,
                      "Exit after this many seconds with no process using a device "
                      "(0: never; default 10)")
            ->type_name("SECONDS");
    }
    // The environment reaches the agents that programs start (a resumption
    // after an agent's death), which no command line names.
    agent_start->add_option("--log", agent_opts.log, "Append messages to FILE")
        ->type_name("FILE")
        ->envname("SROCE_AGENT_LOG");
    CLI::App *agent_stop = agent->add_subcommand("stop", "Stop the running agent");
    CLI::App *agent_status = agent->add_subcommand("status", "Show the running agent");

    CLI::App *res = app.add_subcommand("resource", "Show which processes and QPs use devices");
    res->alias("res");
    res->fallthrough();
    res->require_subcommand(0, 1);
    CLI::App *res_show = res->add_subcommand("show", "Show a summary, or every QP");
    res_show->fallthrough();
    std::string res_what;
    res_show->add_option("OBJECT", res_what, "qp")->check(CLI::IsMember({"qp"}));

    CLI::App *exec =
        app.add_subcommand("exec", "Run PROGRAM with the sroce verbs shim in LD_PRELOAD");
    exec->footer("Usage: sroce exec [--] PROGRAM [ARGS...]\n"
                 "The exit status is that of PROGRAM (127 if not found, 126 if not runnable).");

    // Everything from PROGRAM on belongs to the child, including words that
    // look like our own options.  Only a leading "--" is ours; any other
    // leading dash word goes to CLI11, which handles -h and rejects the rest.
    int parse_argc = argc;
    std::vector<std::string> command;
    if (std::optional<int> at = find_exec_word(argc, argv)) {
        int first = *at + 1;
        if (first < argc && std::string_view(argv[first]) == "--") {
            command.assign(argv + first + 1, argv + argc);
            parse_argc = first;
        } else if (first >= argc || argv[first][0] != '-') {
            command.assign(argv + first, argv + argc);
            parse_argc = first;
        }
    }

    try {
        app.parse(parse_argc, argv);
    } catch (const CLI::ParseError &e) {
        return app.exit(e) == 0 ? 0 : 2;
    }

    const std::string path = config_override.empty() ? sroce::config_path() : config_override;
    try {
        if (*exec) return run_exec(command, config_override);
        if (*agent_start || *agent_run) {
            agent_opts.detach = bool(*agent_start);
            return sroce::agent::run(agent_opts);
        }
        if (*agent_stop) {
            sroce::agent::stop();
            return 0;
        }
        if (*agent_status) {
            nlohmann::json st = nlohmann::json::parse(sroce::agent::query(sroce::agent::kStatus));
            std::cout << (json ? st.dump() : st.dump(2)) << '\n';
            return 0;
        }
        if (*res) {
            resource_show(res_what == "qp", json);
            return 0;
        }
        if (*add) {
            link_add(path, add_name, add_keywords);
        } else if (*set) {
            link_set(path, set_name, set_keywords);
        } else if (*del) {
            link_del(path, del_name);
        } else {
            std::optional<std::string> which;
            if (*show && !show_name.empty()) which = show_name;
            link_show(path, which, json);
        }
    } catch (const UsageError &e) {
        std::cerr << "sroce: " << e.what() << "\nTry '" << command_path(app)
                  << " --help' for more information.\n";
        return 2;
    } catch (const std::exception &e) {
        std::cerr << "sroce: " << e.what() << '\n';
        return 1;
    }
    return 0;
}
