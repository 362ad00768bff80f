// SPDX-License-Identifier: MIT
#include "handover.hpp"

#include "agent_client.hpp"
#include "agent_proto.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace sroce::agent {
namespace {

constexpr const char *kDir = kSystemDir;

} // namespace

// One record per agent: per network namespace, and per abstract name for an
// agent of root's on one ($SROCE_AGENT_SOCKET).
std::string record_path() {
    struct stat ns {};
    stat("/proc/self/ns/net", &ns);
    Endpoint e = own_endpoint();
    std::string name;
    if (!e.system)
        for (char c : e.text.substr(1))
            name += isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '.';
    return std::string(kDir) + "/slots-" + std::to_string(ns.st_ino) + (name.empty() ? "" : "-") +
           name;
}

std::string read_rest(int fd) {
    std::string text;
    char b[4096];
    for (;;) {
        ssize_t n = read(fd, b, sizeof b);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return {};
        if (n == 0) return text;
        text.append(b, size_t(n));
    }
}

std::string read_proc(pid_t pid, const char *file) {
    std::string path = "/proc/" + std::to_string(pid) + "/" + file;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    std::string text = read_rest(fd);
    close(fd);
    return text;
}

uint64_t proc_start(pid_t pid) {
    std::string s = read_proc(pid, "stat");
    // The command name may hold spaces and parentheses: fields count from
    // the last ')'.  Field 22 is the start time, the 20th after it.
    size_t p = s.rfind(')');
    if (p == std::string::npos) return 0;
    std::istringstream in(s.substr(p + 1));
    std::string field;
    for (int i = 0; i < 20 && in >> field; i++) {
    }
    return in ? std::strtoull(field.c_str(), nullptr, 10) : 0;
}

int save_owners(const std::vector<SlotOwner> &owners) {
    if (geteuid() != 0) return EPERM;
    std::string p = record_path(), tmp = p + ".new";
    if (owners.empty()) return unlink(p.c_str()) < 0 && errno != ENOENT ? errno : 0;
    if (mkdir(kDir, 0755) < 0 && errno != EEXIST) return errno;
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = fd < 0 ? nullptr : fdopen(fd, "w");
    if (!f) {
        int err = errno;
        if (fd >= 0) close(fd);
        return err;
    }
    for (const SlotOwner &o : owners)
        fprintf(f, "%s %u %d %u %llu %u\n",
                o.addr.empty() ? ("%" + o.netdev).c_str() : o.addr.text().c_str(), o.slot,
                int(o.pid), unsigned(o.uid), static_cast<unsigned long long>(o.start), o.map);
    int err = ferror(f) ? EIO : 0;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && rename(tmp.c_str(), p.c_str()) < 0) err = errno;
    if (err) unlink(tmp.c_str());
    return err;
}

std::vector<SlotOwner> load_owners() {
    std::vector<SlotOwner> out;
    if (geteuid() != 0) return out;
    std::ifstream f(record_path());
    // A record written before maps were recorded has no sixth field, and
    // one written before IPv6 an IPv4 address as a number (network order).
    // "%IF" is a device that has every address of interface IF.
    for (std::string line; std::getline(f, line);) {
        std::istringstream in(line);
        std::string a;
        unsigned slot, uid, map = 0;
        int pid;
        unsigned long long start;
        if (!(in >> a >> slot >> pid >> uid >> start)) break;
        in >> map;
        IpAddr addr;
        std::string netdev;
        if (a.size() > 1 && a[0] == '%') {
            netdev = a.substr(1);
        } else if (a.find_first_of(".:") == a.npos) {
            char *end;
            unsigned long v = strtoul(a.c_str(), &end, 10);
            if (*end || v > UINT32_MAX) break;
            addr = IpAddr::v4(in_addr_t(v));
        } else if (!IpAddr::parse(a.c_str(), &addr)) {
            break;
        }
        if (slot > 0 && slot < kMaxSlots && pid > 0 && proc_start(pid) == start)
            out.push_back({addr, slot, pid_t(pid), uid_t(uid), start, map, netdev});
    }
    return out;
}

} // namespace sroce::agent
