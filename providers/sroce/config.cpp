// SPDX-License-Identifier: MIT
#include "config.hpp"

#include "inet.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <ifaddrs.h>
#include <map>
#include <net/if.h>
#include <netinet/in.h>
#include <set>
#include <stdexcept>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sroce {

namespace {

// IB_DEVICE_NAME_MAX is 64 including the terminator.
constexpr std::size_t max_link_name = 63;

// IPv4 + UDP + BTH + the largest extended header (AtomicETH) + ICRC.
constexpr int roce_overhead_ipv4 = 20 + 8 + 12 + 28 + 4;
constexpr int ipv6_extra_header = 40 - 20;

std::string errno_text(int err) {
    return std::strerror(err);
}

[[noreturn]] void throw_errno(const std::string &what, int err) {
    throw std::runtime_error(what + ": " + errno_text(err));
}

class Fd {
  public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    int get() const { return fd_; }
    // Lets the caller see close() errors, which for NFS may be the first
    // report of a failed write.
    int release() {
        int fd = fd_;
        fd_ = -1;
        return fd;
    }

  private:
    int fd_;
};

bool valid_link_name(const std::string &name) {
    if (name.empty() || name.size() > max_link_name) return false;
    for (unsigned char c : name) {
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// Mirrors the kernel's dev_valid_name(), so that a name we accept can also be
// passed to ioctl() without being silently truncated to another interface.
bool valid_netdev_name(const std::string &name) {
    if (name.empty() || name.size() >= IFNAMSIZ) return false;
    if (name == "." || name == "..") return false;
    for (unsigned char c : name) {
        if (c == '/' || c == ':' || c == ' ' || (c >= '\t' && c <= '\r') || c == '\0') return false;
    }
    return true;
}

bool is_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

std::vector<std::string> split_words(const std::string &line) {
    std::vector<std::string> words;
    std::size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && is_space(line[i]))
            ++i;
        std::size_t start = i;
        while (i < line.size() && !is_space(line[i]))
            ++i;
        if (i > start) words.push_back(line.substr(start, i - start));
    }
    return words;
}

// Returns the reason the line is malformed, or empty on success.
std::string parse_line(const std::vector<std::string> &words, Link &link) {
    link = Link{};
    link.name = words[0];
    // Each word once: of two values one would be lost without a word.
    std::vector<std::string> given;
    for (std::size_t i = 1; i < words.size(); i += 2) {
        const std::string &key = words[i];
        if (std::find(given.begin(), given.end(), key) != given.end())
            return "'" + key + "' given twice";
        given.push_back(key);
        std::string *value;
        if (key == "netdev") {
            value = &link.netdev;
        } else if (key == "addr") {
            value = &link.addr;
        } else if (key == "cc") {
            if (i + 1 >= words.size()) return "missing value after 'cc'";
            if (words[i + 1] != "dcqcn" && words[i + 1] != "off")
                return "unknown congestion control '" + words[i + 1] + "' (expected dcqcn or off)";
            link.cc.enabled = words[i + 1] == "dcqcn";
            continue;
        } else if (std::string err =
                       set_cc_param(link.cc, key, i + 1 < words.size() ? words[i + 1] : "");
                   err.empty()) {
            continue;
        } else if (err.rfind("unknown", 0) != 0) {
            return err;
        } else {
            return "unknown keyword '" + key + "' (expected netdev, addr, cc or a cc parameter)";
        }
        if (i + 1 >= words.size()) return "missing value after '" + key + "'";
        *value = words[i + 1];
    }
    auto has = [&](const char *k) {
        return std::find(given.begin(), given.end(), k) != given.end();
    };
    if (!has("netdev")) return "link '" + link.name + "' has no 'netdev IF'";
    // Without an address the link has every address of its interface.
    if (has("addr") && link.addr.empty()) return "empty address for link '" + link.name + "'";
    return link_error(link);
}

std::string read_file(const std::string &path, bool &missing) {
    missing = false;
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
        if (errno == ENOENT) {
            missing = true;
            return {};
        }
        throw_errno(path, errno);
    }
    std::string text;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_errno(path, errno);
        }
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
    }
    return text;
}

// Returns 0 or the errno of the failing call.
int write_all(int fd, const std::string &data) {
    std::size_t off = 0;
    while (off < data.size()) {
        ssize_t n = ::write(fd, data.data() + off, data.size() - off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        off += static_cast<std::size_t>(n);
    }
    return 0;
}

std::string parent_dir(const std::string &path) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    return dir.empty() ? std::string(".") : dir.string();
}

void make_parent_dir(const std::string &path) {
    std::string dir = parent_dir(path);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create directory " + dir + ": " + ec.message());
}

// Replacing a symlink by rename() would turn it into a regular file; write
// through it instead so that a link managed elsewhere keeps working.  Done by
// hand because realpath() fails on the dangling link a fresh target leaves.
std::string resolve_target(const std::string &path) {
    std::filesystem::path p = path;
    for (int hops = 0; hops < 40; ++hops) {
        std::error_code ec;
        if (!std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec))) break;
        std::filesystem::path next = std::filesystem::read_symlink(p, ec);
        if (ec) break;
        p = next.is_absolute() ? next : p.parent_path() / next;
    }
    return p.string();
}

// What no two links may share: an address, or the interface a link without
// one follows.
std::string place_key(const Link &l) {
    return l.addr.empty() ? "%" + l.netdev : canonical_addr(l.addr);
}

std::string render(const std::vector<Link> &links) {
    std::string out = "# sroce links, one per line: NAME netdev IF [addr IP] [cc ...]\n"
                      "# Edited by 'sroce link add/set/del'; see sroce(8).\n";
    for (const Link &l : links) {
        out += l.name + " netdev " + l.netdev + (l.addr.empty() ? "" : " addr " + l.addr);
        // A link with the defaults says nothing of them, so that new
        // defaults reach it.
        if (l.cc != CcParams{})
            for (const std::string &w : cc_words(l.cc))
                out += " " + w;
        out += "\n";
    }
    return out;
}

int query_ifreq(const std::string &netdev, unsigned long request, ifreq &ifr) {
    if (!valid_netdev_name(netdev)) return ENODEV;
    Fd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (sock.get() < 0) throw_errno("socket", errno);
    std::memset(&ifr, 0, sizeof ifr);
    std::memcpy(ifr.ifr_name, netdev.c_str(), netdev.size() + 1);
    if (::ioctl(sock.get(), request, &ifr) < 0) return errno;
    return 0;
}

std::string number_text(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.10g", v);
    return b;
}

} // namespace

const std::vector<CcParamInfo> &cc_params() {
    static const std::vector<CcParamInfo> table = {
        {"cnp-interval", &CcParams::cnp_interval, 0, 1e6, false, "us"},
        {"cnp-dscp", &CcParams::cnp_dscp, 0, 63, true, "DSCP"},
        {"cut-interval", &CcParams::cut_interval, 0, 1e6, false, "us"},
        {"alpha-g", &CcParams::alpha_g, 1.0 / 65536, 1, false, "fraction"},
        {"alpha-timer", &CcParams::alpha_timer, 1, 1e6, false, "us"},
        {"rate-timer", &CcParams::rate_timer, 1, 1e6, false, "us"},
        {"rate-bytes", &CcParams::rate_bytes, 1, 1e9, true, "bytes"},
        {"stages", &CcParams::stages, 0, 100, true, "stages"},
        {"ai-rate", &CcParams::ai_rate, 0, 1e6, false, "Mbit/s"},
        {"hai-rate", &CcParams::hai_rate, 0, 1e6, false, "Mbit/s"},
        {"min-rate", &CcParams::min_rate, 0.001, 1e6, false, "Mbit/s"},
        {"first-rate", &CcParams::first_rate, 0, 1e6, false, "Mbit/s"},
        {"inflight-time", &CcParams::inflight_time, 0, 1e6, false, "us"},
    };
    return table;
}

std::string set_cc_param(CcParams &cc, const std::string &name, const std::string &value) {
    for (const CcParamInfo &p : cc_params()) {
        if (name != p.name) continue;
        if (value.empty()) return "missing value after '" + name + "'";
        char *end = nullptr;
        errno = 0;
        double v = std::strtod(value.c_str(), &end);
        if (errno || end == value.c_str() || *end || !(v >= p.min && v <= p.max) ||
            (p.integer && v != double(int64_t(v))))
            return "invalid " + name + " '" + value + "' (" + std::string(p.unit) + ", " +
                   (p.integer ? "an integer " : "") + "from " + number_text(p.min) + " to " +
                   number_text(p.max) + ")";
        cc.*p.field = v;
        return {};
    }
    return "unknown congestion control parameter '" + name + "'";
}

std::vector<std::string> cc_words(const CcParams &cc) {
    std::vector<std::string> w = {"cc", cc.enabled ? "dcqcn" : "off"};
    const CcParams defaults;
    for (const CcParamInfo &p : cc_params()) {
        if (cc.*p.field == defaults.*p.field) continue;
        w.push_back(p.name);
        w.push_back(number_text(cc.*p.field));
    }
    return w;
}

std::string config_path() {
    const char *env = std::getenv("SROCE_CONFIG");
    if (env != nullptr && *env != '\0') return env;
    return default_config_path;
}

std::string canonical_addr(const std::string &addr) {
    char text[INET6_ADDRSTRLEN];
    in_addr a4;
    if (::inet_pton(AF_INET, addr.c_str(), &a4) == 1)
        return ::inet_ntop(AF_INET, &a4, text, sizeof text);
    in6_addr a6;
    if (::inet_pton(AF_INET6, addr.c_str(), &a6) != 1) return {};
    // RoCEv2 carries IPv4 endpoints as v4-mapped GIDs, so the two spellings
    // name the same endpoint.
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
        std::memcpy(&a4, &a6.s6_addr[12], sizeof a4);
        return ::inet_ntop(AF_INET, &a4, text, sizeof text);
    }
    return ::inet_ntop(AF_INET6, &a6, text, sizeof text);
}

bool is_ipv6_addr(const std::string &addr) {
    in6_addr a6;
    return ::inet_pton(AF_INET6, addr.c_str(), &a6) == 1;
}

std::string link_error(const Link &link) {
    if (!valid_link_name(link.name))
        return "invalid link name '" + link.name + "' (1 to " + std::to_string(max_link_name) +
               " characters from A-Z a-z 0-9 _ . -)";
    if (!valid_netdev_name(link.netdev))
        return "invalid interface name '" + link.netdev + "' for link '" + link.name + "'";
    IpAddr a;
    if (link.addr.empty()) return {};
    if (!IpAddr::parse(link.addr.c_str(), &a))
        return "invalid address '" + link.addr + "' for link '" + link.name +
               "' (expected an IPv4 or IPv6 address)";
    if (!a.unicast())
        return "address " + link.addr + " of link '" + link.name +
               "' is no address of one host (unspecified, multicast or broadcast)";
    return {};
}

std::string links_error(const std::vector<Link> &links) {
    std::set<std::string> names;
    std::map<std::string, std::string> addrs;
    for (const Link &l : links) {
        if (std::string err = link_error(l); !err.empty()) return err;
        if (!names.insert(l.name).second) return "duplicate link name '" + l.name + "'";
        auto [it, fresh] = addrs.emplace(place_key(l), l.name);
        if (!fresh)
            return l.addr.empty() ? "interface " + l.netdev + " of link '" + l.name +
                                        "' is already followed by link '" + it->second + "'"
                                  : "address " + l.addr + " of link '" + l.name +
                                        "' is already used by link '" + it->second + "'";
    }
    return {};
}

std::vector<Link> load_links(const std::string &path) {
    bool missing;
    std::string text = read_file(path, missing);
    std::vector<Link> links;
    if (missing) return links;

    // name/canonical address -> line first seen, to point at both duplicates.
    std::map<std::string, std::size_t> name_line;
    std::map<std::string, std::pair<std::size_t, std::string>> addr_line;
    std::size_t lineno = 0, pos = 0;
    while (pos < text.size()) {
        std::size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        ++lineno;

        if (std::size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        std::vector<std::string> words = split_words(line);
        if (words.empty()) continue;

        auto fail = [&](const std::string &why) {
            throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + why);
        };
        Link link;
        if (std::string err = parse_line(words, link); !err.empty()) fail(err);
        if (auto [it, fresh] = name_line.emplace(link.name, lineno); !fresh)
            fail("duplicate link name '" + link.name + "' (first defined on line " +
                 std::to_string(it->second) + ")");
        if (auto [it, fresh] =
                addr_line.emplace(place_key(link), std::make_pair(lineno, link.name));
            !fresh)
            fail((link.addr.empty() ? "interface " + link.netdev + " is already followed"
                                    : "address " + link.addr + " is already used") +
                 " by link '" + it->second.second + "' on line " +
                 std::to_string(it->second.first));
        links.push_back(std::move(link));
    }
    return links;
}

void save_links(const std::string &path, const std::vector<Link> &links) {
    if (std::string err = links_error(links); !err.empty())
        throw std::runtime_error(path + ": " + err);

    const std::string target = resolve_target(path);
    make_parent_dir(target);
    const std::string dir = parent_dir(target);

    // Applications running as any user read this file, so a fresh one must be
    // world-readable (mkstemp creates 0600); an existing one keeps its mode.
    mode_t mode = 0644;
    struct stat st;
    if (::stat(target.c_str(), &st) == 0) mode = st.st_mode & 07777;

    const std::string contents = render(links);
    std::string tmp = dir + "/." + std::filesystem::path(target).filename().string() + ".tmpXXXXXX";
    Fd fd(::mkostemp(tmp.data(), O_CLOEXEC));
    if (fd.get() < 0) throw_errno("cannot create temporary file in " + dir, errno);

    auto fill_and_rename = [&]() -> int {
        if (::fchmod(fd.get(), mode) != 0) return errno;
        if (int err = write_all(fd.get(), contents); err != 0) return err;
        if (::fsync(fd.get()) != 0) return errno;
        if (::close(fd.release()) != 0) return errno;
        if (::rename(tmp.c_str(), target.c_str()) != 0) return errno;
        return 0;
    };
    if (int err = fill_and_rename(); err != 0) {
        ::unlink(tmp.c_str());
        throw_errno("cannot write " + target, err);
    }

    // Makes the rename itself durable; the new contents are already complete,
    // so a failure here is not worth reporting.
    Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd.get() >= 0) ::fsync(dfd.get());
}

std::vector<IpAddr> netdev_addrs(const std::string &netdev) {
    std::vector<IpAddr> v4, v6;
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return v4;
    for (ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || netdev != ifa->ifa_name) continue;
        if (ifa->ifa_addr->sa_family == AF_INET)
            v4.push_back(
                IpAddr::v4(reinterpret_cast<sockaddr_in *>(ifa->ifa_addr)->sin_addr.s_addr));
        else if (ifa->ifa_addr->sa_family == AF_INET6)
            v6.push_back(IpAddr::v6(reinterpret_cast<sockaddr_in6 *>(ifa->ifa_addr)->sin6_addr));
    }
    freeifaddrs(list);
    v4.insert(v4.end(), v6.begin(), v6.end());
    return v4;
}

std::string interface_ipv4(const std::string &netdev) {
    ifaddrs *list = nullptr;
    if (::getifaddrs(&list) != 0) throw_errno("getifaddrs", errno);
    std::string found;
    for (ifaddrs *ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
        if (netdev != ifa->ifa_name) continue;
        char text[INET_ADDRSTRLEN];
        const auto *sin = reinterpret_cast<const sockaddr_in *>(ifa->ifa_addr);
        if (::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) != nullptr) {
            found = text;
            break;
        }
    }
    ::freeifaddrs(list);
    if (!found.empty()) return found;
    if (!interface_exists(netdev)) throw std::runtime_error("no such interface '" + netdev + "'");
    throw std::runtime_error("interface '" + netdev + "' has no IPv4 address");
}

int interface_mtu(const std::string &netdev) {
    ifreq ifr;
    int err = query_ifreq(netdev, SIOCGIFMTU, ifr);
    if (err == ENODEV) throw std::runtime_error("no such interface '" + netdev + "'");
    if (err != 0) throw_errno("cannot read the MTU of '" + netdev + "'", err);
    return ifr.ifr_mtu;
}

bool interface_exists(const std::string &netdev) {
    return valid_netdev_name(netdev) && ::if_nametoindex(netdev.c_str()) != 0;
}

bool interface_running(const std::string &netdev) {
    ifreq ifr;
    if (query_ifreq(netdev, SIOCGIFFLAGS, ifr) != 0) return false;
    return (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING);
}

namespace {

// Whether `fd` (a datagram socket of addr's family) can bind `addr`, port 0.
bool binds(int fd, const std::string &addr, const std::string &netdev) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (auto *sin = reinterpret_cast<sockaddr_in *>(&ss);
        ::inet_pton(AF_INET, addr.c_str(), &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        len = sizeof *sin;
    } else if (auto *sin6 = reinterpret_cast<sockaddr_in6 *>(&ss);
               ::inet_pton(AF_INET6, addr.c_str(), &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr))
            sin6->sin6_scope_id = ::if_nametoindex(netdev.c_str());
        len = sizeof *sin6;
    } else {
        return false;
    }
    // Only the address is checked: no ephemeral port is taken for it.
    int one = 1;
    ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    return ::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) == 0 || errno != EADDRNOTAVAIL;
}

} // namespace

bool address_local(const std::string &addr, const std::string &netdev) {
    Fd sock(::socket(is_ipv6_addr(addr) ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    // Out of descriptors: no answer, and a port is not taken down for that.
    return sock.get() < 0 || binds(sock.get(), addr, netdev);
}

int link_down_reason(const Link &link) {
    // One socket serves both questions.
    Fd sock(::socket(is_ipv6_addr(link.addr) ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (sock.get() < 0) return 0;
    // A link that follows its net device is up with it, as rxe's port.
    if (!link.addr.empty() && !binds(sock.get(), link.addr, link.netdev)) return EADDRNOTAVAIL;
    if (!valid_netdev_name(link.netdev)) return ENETDOWN;
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, link.netdev.c_str(), link.netdev.size() + 1);
    if (::ioctl(sock.get(), SIOCGIFFLAGS, &ifr) < 0) return ENETDOWN;
    return (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING) ? 0 : ENETDOWN;
}

int roce_mtu(int ifmtu, bool ipv6) {
    int room = ifmtu - roce_overhead_ipv4 - (ipv6 ? ipv6_extra_header : 0);
    for (int mtu = 4096; mtu >= 256; mtu /= 2)
        if (mtu <= room) return mtu;
    return 0;
}

ConfigLock::ConfigLock(const std::string &path) {
    const std::string target = resolve_target(path);
    make_parent_dir(target);
    const std::string dir = parent_dir(target);
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw_errno("cannot open directory " + dir, errno);
    while (::flock(fd_, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd_);
        fd_ = -1;
        throw_errno("cannot lock directory " + dir, err);
    }
}

ConfigLock::~ConfigLock() {
    if (fd_ >= 0) ::close(fd_);
}

} // namespace sroce
