// SPDX-License-Identifier: MIT
//
// The process's side of the agent protocol (agent_proto.hpp): finding the
// agent, starting it when none runs, and leasing a slot on a device.
#include "agent_client.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <spawn.h>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

namespace sroce::agent {

void accept_zero_udp6_checksum(int fd) {
    // Linux rxe sends RoCEv2 over IPv6 with a UDP checksum of 0, as RFC
    // 6935 allows tunnels to; a socket drops such datagrams unless told
    // otherwise.  The ICRC covers what the checksum would.
    int one = 1;
    setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof one);
}

void receive_ip_fields(int fd, bool v4, bool v6) {
    // A UD receive's GRH holds the sender's IP header as it arrived, and
    // the ECN bits of the traffic class are how congestion is signalled.
    int one = 1;
    if (v4) {
        setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
        setsockopt(fd, IPPROTO_IP, IP_RECVTTL, &one, sizeof one);
    }
    if (v6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWINFO, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof one);
    }
}

void roce_socket_options(int fd, const IpAddr &addr, int ifindex) {
    if (!addr.is_v4()) accept_zero_udp6_checksum(fd);
    receive_ip_fields(fd, addr.is_v4() || addr.empty(), !addr.is_v4());
    if (addr.empty()) {
        // Every address of the interface, of both families: IPv4 ones
        // arrive mapped, each datagram says which address it was sent to,
        // and what leaves names its source (IPV6_PKTINFO).  Bound to the
        // interface, so that other interfaces' addresses stay other
        // devices'.
        int pmtu4 = IP_PMTUDISC_DO, pmtu6 = IPV6_PMTUDISC_DO, zero = 0, one = 1;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu4, sizeof pmtu4);
        setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu6, sizeof pmtu6);
        setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one);
        // A wildcard socket would also get a copy of every multicast
        // datagram to port 4791 of any group joined on the host; groups
        // arrive on the sockets that join them (UdpPort::join).
        setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero);
        setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &zero, sizeof zero);
        if (ifindex > 0) {
            setsockopt(fd, SOL_SOCKET, SO_BINDTOIFINDEX, &ifindex, sizeof ifindex);
            ip_mreqn m{};
            m.imr_ifindex = ifindex;
            setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m);
            setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex);
        }
    } else if (addr.is_v4()) {
        // DF set: an unconnected socket then makes Linux write IP ID 0, which
        // keeps the IPv4 header (covered by the ICRC) predictable; a
        // connected one numbers its datagrams, which sroce follows
        // (design.md §7.3).
        int pmtu = IP_PMTUDISC_DO;
        setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
        // Multicast datagrams leave through the device's own interface.
        in_addr ifaddr{addr.v4_addr()};
        setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifaddr, sizeof ifaddr);
    } else {
        // A packet larger than the path takes is lost, not fragmented (the
        // path MTU bounds every RoCE packet); only IPv6 on this socket.
        int pmtu = IPV6_PMTUDISC_DO, one = 1;
        setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (ifindex > 0) setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex);
    }
    int buf = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
}

ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd) {
    return send_with_fds(sock, buf, len, &fd, 1);
}

ssize_t send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds) {
    char ctl[CMSG_SPACE(sizeof(int) * 2)] = {};
    if (nfds < 1 || nfds > 2) {
        errno = EINVAL;
        return -1;
    }
    iovec iov{const_cast<void *>(buf), len};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * size_t(nfds));
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * size_t(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * size_t(nfds));
    return sendmsg(sock, &m, MSG_NOSIGNAL);
}

ssize_t recv_with_fd(int sock, void *buf, size_t len, int flags, int *fd) {
    return recv_with_fds(sock, buf, len, flags, fd, 1);
}

ssize_t recv_with_fds(int sock, void *buf, size_t len, int flags, int *fds, int max) {
    char ctl[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{buf, len};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t n;
    while ((n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    int got = 0;
    for (int i = 0; i < max; i++)
        fds[i] = -1;
    for (cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&m) : nullptr; c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
            if (got < max)
                fds[got++] = f;
            else
                close(f);
        }
    }
    return n;
}

namespace {

Endpoint abstract_endpoint(const std::string &name) {
    Endpoint e;
    e.sa.sun_family = AF_UNIX;
    size_t n = std::min(name.size(), sizeof e.sa.sun_path - 1);
    std::memcpy(e.sa.sun_path + 1, name.data(), n);
    e.len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
    e.text = "@" + name.substr(0, n);
    return e;
}

Endpoint system_endpoint() {
    struct stat ns {};
    stat("/proc/self/ns/net", &ns);
    Endpoint e;
    e.sa.sun_family = AF_UNIX;
    e.text = std::string(kSystemDir) + "/agent-" + std::to_string(ns.st_ino) + ".sock";
    snprintf(e.sa.sun_path, sizeof e.sa.sun_path, "%s", e.text.c_str());
    e.len = socklen_t(offsetof(sockaddr_un, sun_path) + strlen(e.sa.sun_path) + 1);
    e.system = true;
    return e;
}

} // namespace

namespace {

// Whether this process could make the system agent's socket: root of the
// host (not of a user namespace, nor with /run read-only).
bool system_capable() {
    if (geteuid() != 0) return false;
    if (access(kSystemDir, W_OK) == 0) return true;
    return errno == ENOENT && access("/run", W_OK) == 0;
}

} // namespace

Endpoint user_endpoint() {
    return abstract_endpoint("sroce-agent-" + std::to_string(geteuid()));
}

std::vector<Endpoint> agent_endpoints() {
    if (const char *s = getenv("SROCE_AGENT_SOCKET"); s && *s) return {abstract_endpoint(s)};
    // Root that can have a system agent never asks a name anyone may take.
    if (system_capable()) return {system_endpoint()};
    return {system_endpoint(), user_endpoint()};
}

Endpoint own_endpoint() {
    std::vector<Endpoint> e = agent_endpoints();
    return geteuid() == 0 ? e.front() : e.back();
}

namespace {

// The sroce(8) that matches this library: $SROCE_AGENT_BIN (`sroce exec`
// sets it to itself), the build tree's when this code runs from the build
// tree (tests), the one installed beside the library (a prefix chosen at
// install time, a copied tree), the one of the configured prefix, else the
// first on PATH.
std::string agent_binary() {
    if (const char *b = getenv("SROCE_AGENT_BIN"); b && *b) return b;
    Dl_info info{};
    // Unused in builds that compile the engine into one program (fuzzing).
    [[maybe_unused]] const char *self = nullptr;
    if (dladdr(reinterpret_cast<void *>(&agent_binary), &info) && info.dli_fname &&
        info.dli_fname[0] == '/')
        self = info.dli_fname;
#if defined(SROCE_BUILD_DIR) && defined(SROCE_BUILD_TOOL)
    if (self && std::strncmp(self, SROCE_BUILD_DIR "/", sizeof SROCE_BUILD_DIR) == 0 &&
        access(SROCE_BUILD_TOOL, X_OK) == 0)
        return SROCE_BUILD_TOOL;
#endif
#ifdef SROCE_LIB_TO_BIN
    if (self) {
        std::string beside(self);
        beside.erase(beside.rfind('/') + 1);
        beside += SROCE_LIB_TO_BIN "/sroce";
        if (access(beside.c_str(), X_OK) == 0) return beside;
    }
#endif
#ifdef SROCE_INSTALL_TOOL
    if (access(SROCE_INSTALL_TOOL, X_OK) == 0) return SROCE_INSTALL_TOOL;
#endif
    return "sroce";
}

// The first agent that answers, in agent_endpoints()'s order; `which` says
// where.  -1 with errno (of the last) when none does.
int try_connect(Endpoint *which) {
    int err = ECONNREFUSED;
    for (const Endpoint &e : agent_endpoints()) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, reinterpret_cast<const sockaddr *>(&e.sa), e.len) == 0) {
            if (which) *which = e;
            return fd;
        }
        err = errno;
        close(fd);
    }
    errno = err;
    return -1;
}

// Runs `sroce agent start`, which returns once an agent listens (its own,
// detached, or one that beat it to it).  0 or an errno.
int start_agent() {
    std::string bin = agent_binary();
    char *argv[] = {const_cast<char *>(bin.c_str()), const_cast<char *>("agent"),
                    const_cast<char *>("start"), nullptr};
    pid_t pid;
    int rc = posix_spawnp(&pid, bin.c_str(), nullptr, nullptr, argv, environ);
    if (rc) {
        fprintf(stderr, "sroce: cannot start the sroce agent (%s): %s%s\n", bin.c_str(),
                strerror(rc),
                rc == ENOENT && bin.find('/') == std::string::npos
                    ? " (not installed beside this library nor on PATH; set SROCE_AGENT_BIN)"
                    : "");
        return rc;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        // A program that reaps every child may have taken it: fine, the
        // connection attempts that follow tell.
        if (errno != EINTR) return 0;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "sroce: the sroce agent (%s) failed to start\n", bin.c_str());
        return EIO;
    }
    return 0;
}

} // namespace

bool trusted_agent(int fd, const std::string &where, std::string &why) {
    ucred cred{};
    socklen_t l = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &l) < 0) {
        why = "cannot tell who serves " + where + ": " + strerror(errno);
        return false;
    }
    if (cred.uid == 0 || cred.uid == geteuid()) return true;
    why = where + " is served by pid " + std::to_string(cred.pid) + " of uid " +
          std::to_string(cred.uid) + ", neither root nor this user: not trusting it as the " +
          "sroce agent";
    return false;
}

namespace {

// connect_agent()'s answer for a connection `fd` to `where` (-1: none).
int checked(int fd, const Endpoint &where) {
    if (fd < 0) return fd;
    std::string why;
    if (trusted_agent(fd, where.text, why)) return fd;
    fprintf(stderr, "sroce: %s\n", why.c_str());
    close(fd);
    errno = EPERM;
    return -1;
}

} // namespace

int connect_agent(bool start) {
    Endpoint where;
    int fd = try_connect(&where);
    if (fd >= 0 || !start) return checked(fd, where);
    if (int err = start_agent()) {
        errno = err;
        return -1;
    }
    // It listens before `start` returns; a few tries cover a rival agent
    // that won the name and is just getting there.
    for (int i = 0; i < 50; i++) {
        fd = try_connect(&where);
        if (fd >= 0) return checked(fd, where);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    fprintf(stderr, "sroce: the sroce agent started but does not answer on %s\n",
            own_endpoint().text.c_str());
    errno = ECONNREFUSED;
    return -1;
}

int lease_slot(const char *dev_name, const char *netdev, const IpAddr &addr, int table_fd,
               Lease &out, Resume *resume) {
    int fd = connect_agent(!resume || resume->may_start);
    if (fd < 0) return errno;
    if (resume) {
        // A resumption runs while the device is open and its close waits
        // for it: an agent that accepts but never answers must not hold it.
        timeval tv{2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    ucred cred{};
    socklen_t cl = sizeof cred;
    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
    Request rq{};
    rq.op = kOpenDevice;
    rq.version = kProtoVersion;
    snprintf(rq.name, sizeof rq.name, "%s", dev_name);
    snprintf(rq.netdev, sizeof rq.netdev, "%s", netdev);
    std::memcpy(rq.addr, addr.raw, 16);
    rq.arg = resume ? resume->slot : 0;
    int fds[2] = {table_fd, resume ? resume->sock : -1};
    if (send_with_fds(fd, &rq, sizeof rq, fds, fds[1] >= 0 ? 2 : 1) < 0) {
        int err = errno;
        close(fd);
        return err;
    }
    OpenReply rep{};
    int udp;
    ssize_t n = recv_with_fd(fd, &rep, sizeof rep, 0, &udp);
    int err = 0;
    if (n != ssize_t(sizeof rep)) {
        err = n < 0 ? errno : EPROTO;
        fprintf(stderr, "sroce: %s: the sroce agent did not answer\n", dev_name);
    } else if (rep.err) {
        err = rep.err;
        rep.msg[sizeof rep.msg - 1] = 0;
        // A missing address is the caller's news to give (a port that is down).
        if (resume)
            resume->why = rep.msg;
        else if (err != EADDRNOTAVAIL)
            fprintf(stderr, "sroce: %s: %s\n", dev_name, rep.msg);
    } else if ((udp < 0 && !(resume && resume->sock >= 0)) || rep.slot == 0 ||
               rep.slot >= kMaxSlots || (resume && rep.slot != resume->slot)) {
        err = EPROTO;
        fprintf(stderr, "sroce: %s: the sroce agent sent no usable socket\n", dev_name);
    }
    if (err) {
        if (udp >= 0) close(udp);
        close(fd);
        return err;
    }
    out.conn = fd;
    out.udp = udp;
    out.slot = rep.slot;
    out.relayed = rep.flags & kOpenRelayed;
    out.steering_kept = rep.flags & kOpenSteeringKept;
    out.agent_uid = cred.uid;
    return 0;
}

namespace {

// One request and its OpenReply on a fresh connection; -1 with errno set.
int agent_request(const void *msg, size_t len, OpenReply &rep) {
    int fd = connect_agent(true);
    if (fd < 0) return -1;
    ssize_t n = send(fd, msg, len, MSG_NOSIGNAL);
    if (n == ssize_t(len)) {
        while ((n = recv(fd, &rep, sizeof rep, 0)) < 0 && errno == EINTR) {
        }
    }
    if (n != ssize_t(sizeof rep) || rep.err) {
        int err = n != ssize_t(sizeof rep) ? EPROTO : rep.err;
        if (rep.err == EPROTO) fprintf(stderr, "sroce: %s\n", rep.msg);
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

} // namespace

int open_cm_channel(CmChannel &out) {
    std::vector<CmDeviceInfo> devs = cm_device_infos();
    std::vector<uint8_t> msg(sizeof(Request) + devs.size() * sizeof(CmDeviceInfo));
    Request rq{};
    rq.op = kCmChannel;
    rq.version = kProtoVersion;
    std::memcpy(msg.data(), &rq, sizeof rq);
    if (!devs.empty())
        std::memcpy(msg.data() + sizeof rq, devs.data(), devs.size() * sizeof(CmDeviceInfo));
    OpenReply rep{};
    int ev = agent_request(msg.data(), msg.size(), rep);
    if (ev < 0) return errno;
    rq.op = kCmCommands;
    rq.arg = rep.slot;
    int cmd = agent_request(&rq, sizeof rq, rep);
    if (cmd < 0) {
        int err = errno;
        close(ev);
        return err;
    }
    out.events = ev;
    out.commands = cmd;
    out.number = rep.slot;
    return 0;
}

} // namespace sroce::agent
