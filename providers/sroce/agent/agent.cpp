// SPDX-License-Identifier: MIT
#include "agent.hpp"

#include "agent_client.hpp"
#include "agent_proto.hpp"
#include "cm.hpp"
#include "config.hpp"
#include "handover.hpp"
#include "icrc.hpp"
#include "steering.hpp"
#include "wire.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <stdexcept>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#ifndef SROCE_VERSION
#define SROCE_VERSION "unknown"
#endif

namespace sroce::agent {
namespace {

using nlohmann::json;

// Whether process `pid` has CAP_NET_BIND_SERVICE in the user namespace that
// owns the agent's network namespace, as the kernel's cma asks before a
// bind below 1024 (approximated: the capability in its own user namespace,
// counted only when that is the agent's).  Asked when the process opens its
// rdma_cm channel, while its connection proves it alive.
bool may_bind_service(pid_t pid) {
    struct stat mine {
    }, theirs{};
    std::string proc = "/proc/" + std::to_string(pid);
    if (stat("/proc/self/ns/user", &mine) < 0 || stat((proc + "/ns/user").c_str(), &theirs) < 0 ||
        mine.st_ino != theirs.st_ino || mine.st_dev != theirs.st_dev)
        return false;
    std::string status = read_proc(pid, "status");
    size_t at = status.find("\nCapEff:");
    if (at == std::string::npos) return false;
    at = status.find_first_not_of(" \t", at + 8);
    uint64_t caps = 0;
    if (at == std::string::npos ||
        std::from_chars(status.data() + at, status.data() + status.size(), caps, 16).ec !=
            std::errc())
        return false;
    return (caps >> 10) & 1; // CAP_NET_BIND_SERVICE
}

// Refuses a request: `err` and why, for the client to print.
void refuse(int fd, int err, const std::string &why) {
    OpenReply rep{};
    rep.version = kProtoVersion;
    rep.err = err;
    snprintf(rep.msg, sizeof rep.msg, "%s", why.c_str());
    send(fd, &rep, sizeof rep, MSG_NOSIGNAL);
}

uint64_t mono_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec);
}

uint64_t mono_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// Stamped with the pid and the time of day: several agents may append to
// one log (each started by a program after its predecessor died), and a
// takeover is read against what the programs printed meanwhile.
void log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t{};
    localtime_r(&ts.tv_sec, &t);
    fprintf(stderr, "sroce agent[%d] %02d:%02d:%02d.%03ld: ", int(getpid()), t.tm_hour, t.tm_min,
            t.tm_sec, ts.tv_nsec / 1000000);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

std::string ip_text(const IpAddr &a) {
    return a.text();
}

// What the agent serves, in messages and lock names: an address, or
// "%IF" for every address of interface IF.
std::string place_text(const IpAddr &addr, const std::string &netdev) {
    return addr.empty() ? "%" + netdev : ip_text(addr);
}

const char *type_name(uint32_t t) {
    switch (t) {
    case 1:
        return "GSI";
    case 2:
        return "RC";
    case 3:
        return "UC";
    case 4:
        return "UD";
    case 8:
        return "RAW_PACKET";
    case 9:
        return "XRC_SEND";
    case 10:
        return "XRC_RECV";
    default:
        return "UNKNOWN";
    }
}

const char *state_name(uint32_t s) {
    static const char *const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
    return s < 7 ? names[s] : "UNKNOWN";
}

// Root's lock on serving `addr` in this network namespace: a descriptor,
// -2 when another agent holds it, -1 where root cannot make the file (a
// user namespace, /run read-only) or for an agent not of root's.
int address_file_lock(const std::string &place) {
    if (geteuid() != 0 || (mkdir(kSystemDir, 0755) < 0 && errno != EEXIST)) return -1;
    struct stat ns {};
    stat("/proc/self/ns/net", &ns);
    std::string path =
        std::string(kSystemDir) + "/addr-" + std::to_string(ns.st_ino) + "-" + place + ".lock";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    close(fd);
    return -2;
}

// An abstract Unix address: the name is a byte string after a NUL.
socklen_t abstract_addr(const std::string &name, sockaddr_un &sa) {
    sa = {};
    sa.sun_family = AF_UNIX;
    size_t n = std::min(name.size(), sizeof sa.sun_path - 1);
    std::memcpy(sa.sun_path + 1, name.data(), n);
    return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The agent's scheduling (run()): it relays its relayed processes'
// packets.  The lowest real-time priority, so that it runs ahead of
// ordinary work and behind anything that asked for real time; the nice
// where real time is refused.
constexpr int kAgentRtPriority = 1;
constexpr int kAgentNice = -10;

struct SlotUse {
    int conn = -1;
    int relay = -1; // the agent's end of a relayed slot's pair, or -1
    pid_t pid = 0;
    uid_t uid = 0;
    std::string comm, dev_name;
    const QpEntry *table = nullptr;
};

// One device address: its reuseport group, in slot order, and who uses which
// slot.  Sockets are never closed while the agent lives: under the classic
// program (steering.hpp) they join the group in slot order, and the kernel
// fills a leaving socket's place with the last one, which would re-steer
// another process's QPs; under a slot map, a slot's socket is put back
// only when the slot is leased again.
struct Dev {
    IpAddr addr; // empty: every address of netdev (a device that follows it)
    std::string netdev;
    int ifindex = 0; // of netdev: the scope of link-local peers
    // Who had the agent serve it.  Another user's address goes when no slot
    // and no rdma_cm channel uses it any more (Agent::release_unused);
    // root's stay, as they always have.
    uid_t creator = 0;
    int lock = -1;
    int file_lock = -1; // address_file_lock()
    // Slot -> socket; -1 for a slot a dead agent's process holds and has not
    // resumed yet (only under a slot map).
    std::vector<int> socks;
    int slot_map = -1;        // steering.hpp; -1 under the classic program
    uint32_t slot_map_id = 0; // for the record a successor reads
    std::array<SlotUse, kMaxSlots> use;
    // Slots a dead agent's processes hold: kept for them while they live
    // (handover.hpp), resumed only by them.
    std::array<SlotOwner, kMaxSlots> heldover{};
    uint32_t next = 1;
    uint32_t gsi_psn = 0; // QP1's send PSN, counting every MAD sent
    uint64_t rx_gsi = 0, rx_unroutable = 0, rx_gsi_bad = 0;
    uint64_t rx_relayed = 0, rx_relay_dropped = 0; // for relayed slots (Agent::relay)

    std::string text() const { return place_text(addr, netdev); }

    ~Dev() {
        for (int fd : socks)
            if (fd >= 0) close(fd);
        if (slot_map >= 0) close(slot_map);
        if (lock >= 0) close(lock);
        if (file_lock >= 0) close(file_lock);
        for (SlotUse &u : use) {
            if (u.table) munmap(const_cast<QpEntry *>(u.table), kTableEntries * sizeof(QpEntry));
            if (u.relay >= 0) close(u.relay);
        }
    }
};

// The address of the device a datagram was sent to: its own, or for one
// that has every address of its interface, the one the kernel says.
IpAddr sent_to(const msghdr &m, const Dev &d) {
    IpAddr to = d.addr;
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(const_cast<msghdr *>(&m), c))
        if (read_pktinfo(c, &to)) break;
    return to;
}

// A connection whose first message has not come yet, or an sroce(8) query.
struct Conn {
    int fd = -1;
};

// One end of a process's rdma_cm event channel: its wake-up end (the file
// the process polls) or its command end.
struct CmConn {
    int fd = -1;
    uint32_t channel = 0;
    bool commands = false;
    std::vector<IpAddr> addrs; // the wake-up end: the devices the channel named
    uid_t uid = 0;             // the wake-up end: its owner, for kChannelsPerUser
};

class Agent {
  public:
    explicit Agent(const Options &o)
        : opts_(o),
          cm_([this](const IpAddr &l, const IpAddr &r, const uint8_t *m) { send_mad(l, r, m); }) {}
    ~Agent() {
        for (Conn &c : conns_)
            close(c.fd);
        for (CmConn &c : cm_conns_)
            close(c.fd);
        if (listen_ >= 0) close(listen_);
        // Whatever its end, a socket file left behind is replaced by the
        // next agent; a clean exit leaves none.
        if (!path_.empty()) unlink(path_.c_str());
        if (lock_ >= 0) close(lock_);
    }
    // 0, EADDRINUSE when another agent listens, or another errno.
    int listen_socket();
    // The system agent's socket file; EACCES, EPERM or EROFS where this
    // process cannot make it.
    int listen_system(const Endpoint &e);
    int loop();
    // One round: what is ready is served, waiting at most `max_wait_ms` (or
    // less, for the CM's timers).  False when poll(2) fails.
    bool pass(int max_wait_ms);
    bool stopped() const { return stop_; }
    // A client connection made in this process (Session): its credentials
    // are `cred`, not the process's.
    void add_conn(int fd, const ucred &cred) {
        conns_.push_back({fd});
        creds_[fd] = cred;
    }

  private:
    void accept_conns();
    enum class Served { kKeep, kClose, kSlot, kCm };
    Served serve(int fd, Dev **owner, uint32_t *slot);
    void cm_command(CmConn &c);
    void send_mad(const IpAddr &local, const IpAddr &remote, const uint8_t *mad);
    void open_device(int fd, const Request &rq, int table_fd, int sock, Dev **owner,
                     uint32_t *slot);
    Dev *device(const IpAddr &addr, const std::string &netdev, uid_t uid, std::string &why);
    uint32_t addrs_of(uid_t uid) const;
    void release_unused();
    // A device whose address is not on the host yet (its port is down):
    // retried every kAwaitRetryMs, so that its QP1 answers once the
    // address is back.  Other failures are logged only.
    void await(const IpAddr &addr, const std::string &netdev, uid_t uid, const std::string &why);
    void retry_awaited();
    int new_socket(const Dev &d, bool reuseport, std::string &why);
    // Steers `slot`'s packets to d.socks[slot]; 0 or an errno.
    int steer(Dev &d, uint32_t slot);
    bool slot_free(Dev &d, uint32_t slot);
    int resume(const ucred &cred, Dev &d, uint32_t s, int sock, std::string &why);
    void record_owners();
    void release(Dev &d, uint32_t slot);
    void relay(Dev &d, uint32_t slot);
    void drain_gsi(Dev &d);
    json resources() const;
    json status() const;
    void send_json(int fd, const json &j);
    bool busy() const;

    // Who is at the other end of a client's connection, as the kernel says
    // (SO_PEERCRED), or as a Session said; uid and gid -1, which nothing
    // grants anything, when it cannot tell.
    ucred cred(int fd) const {
        if (auto it = creds_.find(fd); it != creds_.end()) return it->second;
        ucred c{};
        socklen_t l = sizeof c;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &l) < 0) c = {0, uid_t(-1), gid_t(-1)};
        return c;
    }

    Options opts_;
    std::string where_; // where it listens (Endpoint::text)
    // The system agent's socket file, removed at exit under the lock.  The
    // lock file stays: removing it would let two agents lock two files.
    std::string path_;
    int lock_ = -1;
    std::map<int, ucred> creds_; // Session's connections
    // pass()'s, kept between calls: what each pollfd past the first is.
    struct PassRef {
        enum class Kind { kConn, kDevice, kSlot, kRelay, kCm } kind;
        Dev *dev;
        uint32_t index; // conns_, a slot, or cm_conns_
    };
    std::vector<pollfd> pass_pfds_;
    std::vector<PassRef> pass_refs_;
    int listen_ = -1;
    std::vector<Conn> conns_; // admin and not-yet-identified connections
    std::vector<std::unique_ptr<Dev>> devs_;
    std::vector<CmConn> cm_conns_;
    std::vector<CmConn> new_cm_conns_; // made while serving, joined after
    struct Awaited {
        IpAddr addr;
        std::string netdev;
        uid_t uid;
    };
    std::vector<Awaited> awaited_;
    uint64_t awaited_at_ = 0; // mono_ms() of the last retry
    // A bind attempt per address costs a few microseconds.
    static constexpr uint64_t kAwaitRetryMs = 1000;
    Cm cm_;
    bool stop_ = false;
    // What a dead predecessor's record (handover.hpp) says of addresses not
    // served yet: their slots' owners, moved to the Dev when it is made.
    std::vector<SlotOwner> inherited_ = opts_.handover ? load_owners() : std::vector<SlotOwner>{};
    // Something another user's address may have been kept for went away (a
    // slot, a channel) or such an address was added: release_unused() looks
    // at the next pass, and only then, as a relayed packet wakes the loop.
    bool recheck_unused_ = false;
    // relay()'s buffers, allocated at its first use.
    struct RelayBufs {
        static constexpr int kBatch = 32;
        static constexpr size_t kLen = 16 << 10; // past any MTU; longer is cut
        std::unique_ptr<uint8_t[]> data{new uint8_t[kBatch * kLen]};
        RelayHdr hdr[kBatch];
        SockAddr from[kBatch];
        alignas(cmsghdr) uint8_t ctl[kBatch][kPktinfoSpace + kIpFieldsSpace];
        iovec in[kBatch], out[kBatch][2];
        mmsghdr rx[kBatch], tx[kBatch];
    };
    std::unique_ptr<RelayBufs> relay_bufs_;
};

int Agent::listen_socket() {
    Endpoint e = own_endpoint();
    if (e.system) {
        int err = listen_system(e);
        if (err != EACCES && err != EPERM && err != EROFS) return err;
        if (lock_ >= 0) close(lock_);
        lock_ = -1;
        log("cannot make %s (%s): listening on root's own name", e.text.c_str(), strerror(err));
        e = user_endpoint();
    }
    listen_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_ < 0) return errno;
    if (bind(listen_, reinterpret_cast<const sockaddr *>(&e.sa), e.len) < 0 ||
        listen(listen_, 64) < 0)
        return errno;
    where_ = e.text;
    return 0;
}

// Only root may make a file in kSystemDir, so whoever listens on one there
// is root: no one can squat the system agent's socket.  A lock that only
// root can open orders two agents starting at once; a socket file whose
// lock nobody holds is a dead agent's, and is replaced.
int Agent::listen_system(const Endpoint &e) {
    if (mkdir(kSystemDir, 0755) < 0 && errno != EEXIST) return errno;
    struct stat st {};
    if (lstat(kSystemDir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) return EPERM;
    if ((st.st_mode & 07777) != 0755 && chmod(kSystemDir, 0755) < 0) return errno;
    std::string lock = e.text.substr(0, e.text.size() - 5) + ".lock";
    lock_ = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_ < 0) return errno;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno;
    // An agent that answers serves; one that holds the lock without
    // answering is starting or exiting: its lock is waited for, a while.
    if (connect(fd, reinterpret_cast<const sockaddr *>(&e.sa), e.len) == 0 || errno == EAGAIN) {
        close(fd);
        return EADDRINUSE;
    }
    close(fd);
    bool locked = false;
    for (int i = 0; i < 200 && !locked; i++) {
        locked = flock(lock_, LOCK_EX | LOCK_NB) == 0;
        if (!locked && errno != EWOULDBLOCK) return errno;
        if (!locked) usleep(10000);
    }
    if (!locked) return EADDRINUSE;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno;
    unlink(e.text.c_str());
    if (bind(fd, reinterpret_cast<const sockaddr *>(&e.sa), e.len) < 0 || listen(fd, 64) < 0) {
        int err = errno;
        close(fd);
        return err;
    }
    // Anyone may connect, as anyone may open an RNIC's device file.
    chmod(e.text.c_str(), 0666);
    listen_ = fd;
    where_ = e.text;
    path_ = e.text;
    return 0;
}

int Agent::new_socket(const Dev &d, bool reuseport, std::string &why) {
    const IpAddr &addr = d.addr;
    int fd = socket(addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        why = std::string("socket: ") + strerror(errno);
        return -1;
    }
    int one = 1;
    if (reuseport) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    roce_socket_options(fd, addr, d.ifindex);
    // Unbound from the interface, a socket for every address would take
    // every interface's.
    int bound_to = 0;
    socklen_t bl = sizeof bound_to;
    if (addr.empty() && (getsockopt(fd, SOL_SOCKET, SO_BINDTOIFINDEX, &bound_to, &bl) < 0 ||
                         bound_to != d.ifindex)) {
        why = "cannot bind a socket to interface " + d.netdev;
        close(fd);
        errno = ENODEV;
        return -1;
    }
    SockAddr sa(addr, wire::kRoceV2Port, uint32_t(d.ifindex));
    if (bind(fd, &sa.sa, sa.len) < 0) {
        int err = errno;
        why = addr.empty() ? "[::]:4791 on " + d.netdev + ": " + strerror(err)
                           : "[" + ip_text(addr) + "]:4791: " + strerror(err);
        if (err == EADDRINUSE)
            why += addr.empty()
                       ? " (port 4791 of some address is held: a device with an address of its "
                         "own, an sroce process started with SROCE_AGENT=off, another agent "
                         "(SROCE_AGENT_SOCKET), or another RoCE stack)"
                       : " (held by a program outside this agent: an sroce process started with "
                         "SROCE_AGENT=off, another agent (SROCE_AGENT_SOCKET), or another RoCE "
                         "stack)";
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

int Agent::steer(Dev &d, uint32_t slot) {
    int err = d.slot_map >= 0 ? map_slot(d.slot_map, slot, d.socks[slot])
                              : attach_classic(d.socks[0], uint32_t(d.socks.size()));
    if (err) log("%s: cannot steer slot %u: %s", d.text().c_str(), slot, strerror(err));
    return err;
}

// A slot nobody holds: not leased, and not held over for a live process of
// a dead agent (whose exit frees it).
bool Agent::slot_free(Dev &d, uint32_t slot) {
    if (d.use[slot].conn >= 0) return false;
    SlotOwner &h = d.heldover[slot];
    if (h.pid && proc_start(h.pid) == h.start) return false;
    h = {};
    return true;
}

// The record a successor reads (handover.hpp): every leased slot of every
// address under a slot map.
void Agent::record_owners() {
    std::vector<SlotOwner> owners;
    for (const SlotOwner &o : inherited_)
        if (proc_start(o.pid) == o.start) owners.push_back(o);
    for (const auto &d : devs_) {
        if (d->slot_map < 0) continue;
        for (uint32_t s = 1; s < kMaxSlots; s++) {
            const SlotUse &u = d->use[s];
            if (u.conn >= 0)
                owners.push_back(
                    {d->addr, s, u.pid, u.uid, proc_start(u.pid), d->slot_map_id, d->netdev});
            else if (d->heldover[s].pid) {
                owners.push_back(d->heldover[s]);
                owners.back().map = d->slot_map_id;
            }
        }
    }
    if (!opts_.handover) return;
    if (int err = save_owners(owners); err && err != EPERM)
        log("cannot record the slots' owners for a successor: %s", strerror(err));
}

uint32_t Agent::addrs_of(uid_t uid) const {
    uint32_t n = 0;
    for (const auto &d : devs_)
        n += d->creator == uid;
    for (const Awaited &w : awaited_)
        n += w.uid == uid;
    return n;
}

Dev *Agent::device(const IpAddr &addr, const std::string &netdev, uid_t uid, std::string &why) {
    for (auto &d : devs_)
        if (d->addr == addr && (!addr.empty() || d->netdev == netdev)) return d.get();
    std::string place = place_text(addr, netdev);
    // A wildcard would take every address's RoCE traffic, a group's none;
    // every address of one interface is what a device that follows it has.
    if (addr.empty() && if_nametoindex(netdev.c_str()) == 0) {
        why = "no interface " + netdev + " to serve every address of";
        errno = ENODEV;
        return nullptr;
    }
    if (!addr.empty() && !addr.unicast()) {
        why = place + " is no address of one host (unspecified, multicast or broadcast)";
        errno = EINVAL;
        return nullptr;
    }
    if (uid != 0 && addrs_of(uid) >= kAddrsPerUser) {
        why = "uid " + std::to_string(uid) + " has the agent serve " +
              std::to_string(kAddrsPerUser) + " addresses, as many as one user but root may; " +
              place + " is not served";
        errno = EMFILE;
        return nullptr;
    }
    auto d = std::make_unique<Dev>();
    d->addr = addr;
    d->netdev = netdev;
    d->ifindex = int(if_nametoindex(netdev.c_str()));
    d->creator = uid;
    recheck_unused_ |= uid != 0;
    // Two agents (SROCE_AGENT_SOCKET) must never build one group together:
    // an address is locked in the namespace, released by death.  Root's
    // agents lock a file only root can open, so that nobody can keep the
    // next one from taking over; an abstract name, which anyone can bind,
    // tells agents of other users (who lock only that), and a real one of
    // those also holds the port, which the probe below finds.
    d->file_lock = address_file_lock(place);
    if (d->file_lock == -2) {
        why = place + " is served by another sroce agent";
        errno = EADDRINUSE;
        return nullptr;
    }
    d->lock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (d->lock < 0) {
        why = "cannot serve " + place + ": socket: " + strerror(errno);
        return nullptr;
    }
    sockaddr_un sa;
    socklen_t len = abstract_addr("sroce-addr:" + place, sa);
    if (bind(d->lock, reinterpret_cast<sockaddr *>(&sa), len) < 0 && d->file_lock < 0) {
        int err = errno;
        why = err == EADDRINUSE ? place + " is served by another sroce agent"
                                : "cannot serve " + place + ": " + strerror(err);
        errno = err;
        return nullptr;
    }
    // Bound without SO_REUSEPORT first: that fails if anyone else has the
    // port, where a reuseport bind would silently join their group.  The
    // one group this agent joins is the one a dead predecessor left to the
    // processes of its user it served (its address lock is free), which a
    // slot map lets it take over.  Its relayed processes held no member:
    // their slots are theirs again all the same.
    std::vector<SlotOwner> owners;
    std::erase_if(inherited_, [&](const SlotOwner &o) {
        if (o.addr != addr || (addr.empty() && o.netdev != netdev)) return false;
        owners.push_back(o);
        return true;
    });
    // Back where they were if the address cannot be served now (a port
    // that is down is retried): they are still owed their slots.
    struct Restore {
        std::vector<SlotOwner> &from, &to;
        bool done = false;
        ~Restore() {
            if (!done) to.insert(to.end(), from.begin(), from.end());
        }
    } restore{owners, inherited_};
    int probe = new_socket(*d, false, why);
    if (probe < 0) {
        if (errno != EADDRINUSE || owners.empty()) return nullptr;
    } else {
        close(probe);
    }
    bool adopting = probe < 0;
    std::string busy = why;
    int fd = new_socket(*d, true, why);
    if (fd < 0) return nullptr;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    d->socks.push_back(fd);
    std::string no_map;
    // The dead agent's map keeps the running programs' traffic flowing
    // while they take their slots back; a new one would drop it until then.
    bool kept_map = false;
    if (adopting && owners.front().map) {
        std::vector<uint32_t> held;
        for (const SlotOwner &o : owners)
            held.push_back(o.slot);
        std::string no_adopt;
        d->slot_map = adopt_slot_map(owners.front().map, fd, held, no_adopt);
        kept_map = d->slot_map >= 0;
        if (!kept_map)
            log("%s: the dead agent's slot map cannot be kept (%s): its programs lose what is "
                "sent to them until they take their slots back",
                place.c_str(), no_adopt.c_str());
    }
    if (!kept_map) d->slot_map = attach_slot_map(fd, no_map);
    if (d->slot_map >= 0) d->slot_map_id = slot_map_id(d->slot_map);
    if (d->slot_map < 0 && adopting) {
        why = busy;
        errno = EADDRINUSE;
        return nullptr;
    }
    if (d->slot_map < 0) owners.clear();
    if (d->slot_map < 0 && steer(*d, 0)) {
        why = "cannot serve " + place + ": the steering program does not attach";
        errno = EIO;
        return nullptr;
    }
    restore.done = true;
    for (const SlotOwner &o : owners) {
        d->heldover[o.slot] = o;
        d->next = std::max(d->next, o.slot + 1);
    }
    if (d->slot_map >= 0) d->socks.resize(kMaxSlots, -1);
    log("serving %s (%s), steering by %s%s", place.c_str(), netdev.c_str(),
        d->slot_map >= 0 ? "slot map" : ("the classic program: " + no_map).c_str(),
        owners.empty() ? ""
                       : (std::string(adopting ? ", its group taken over" : "") +
                          (kept_map ? " with its map" : "") + " from a dead agent, " +
                          std::to_string(owners.size()) + " slots held over")
                             .c_str());
    devs_.push_back(std::move(d));
    return devs_.back().get();
}

void Agent::await(const IpAddr &addr, const std::string &netdev, uid_t uid,
                  const std::string &why) {
    if (errno != EADDRNOTAVAIL) {
        log("%s", why.c_str());
        return;
    }
    for (const Awaited &w : awaited_)
        if (w.addr == addr) return;
    if (uid != 0 && addrs_of(uid) >= kAddrsPerUser) {
        log("uid %u has the agent serve or await %u addresses: not waiting for %s", unsigned(uid),
            kAddrsPerUser, ip_text(addr).c_str());
        return;
    }
    log("%s (%s) is not on the host: waiting for it", ip_text(addr).c_str(), netdev.c_str());
    awaited_.push_back({addr, netdev, uid});
}

// Another user's address goes when nothing uses it: no slot is leased and
// no open rdma_cm channel named it (whose QP1 must answer), and no slot is
// held over for a live process of a dead agent.  So what a user
// had served costs nothing once that user's processes are gone.
void Agent::release_unused() {
    auto named = [this](const IpAddr &a) {
        for (const auto *v : {&cm_conns_, &new_cm_conns_})
            for (const CmConn &c : *v)
                if (c.fd >= 0 && std::find(c.addrs.begin(), c.addrs.end(), a) != c.addrs.end())
                    return true;
        return false;
    };
    std::erase_if(awaited_, [&](const Awaited &w) { return w.uid != 0 && !named(w.addr); });
    std::erase_if(devs_, [&](const std::unique_ptr<Dev> &d) {
        if (d->creator == 0 || named(d->addr)) return false;
        for (uint32_t s = 1; s < kMaxSlots; s++)
            if (!slot_free(*d, s)) return false;
        log("no longer serving %s (uid %u's, unused)", d->text().c_str(), unsigned(d->creator));
        return true;
    });
}

void Agent::retry_awaited() {
    uint64_t now = mono_ms();
    if (awaited_.empty() || now - awaited_at_ < kAwaitRetryMs) return;
    awaited_at_ = now;
    std::erase_if(awaited_, [this](const Awaited &w) {
        std::string why;
        if (device(w.addr, w.netdev, w.uid, why)) return true;
        if (errno == EADDRNOTAVAIL) return false;
        log("%s", why.c_str());
        return true;
    });
}

void Agent::open_device(int fd, const Request &rq, int table_fd, int sock, Dev **owner,
                        uint32_t *slot) {
    OpenReply rep{};
    rep.version = kProtoVersion;
    std::string why;
    std::string netdev(rq.netdev, strnlen(rq.netdev, sizeof rq.netdev));
    // The table is read for listings for as long as the slot lives: one
    // that is short, or could be made short later, would end the agent
    // with SIGBUS for everyone.
    struct stat st {};
    int seals = fcntl(table_fd, F_GET_SEALS);
    if (fstat(table_fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        size_t(st.st_size) < kTableEntries * sizeof(QpEntry) || seals < 0 ||
        !(seals & F_SEAL_SHRINK))
        return refuse(fd, EINVAL,
                      "the QP table must be a memfd of " +
                          std::to_string(kTableEntries * sizeof(QpEntry)) +
                          " bytes sealed against shrinking");
    ucred cred = this->cred(fd);
    Dev *d = device(IpAddr::of_gid(rq.addr), netdev, cred.uid, why);
    if (!d) return refuse(fd, errno ? errno : EADDRINUSE, why);
    // No user but root takes more than half an address's slots, so that
    // one cannot shut every other out of a device.
    if (cred.uid != 0) {
        uint32_t mine = 0;
        for (uint32_t k = 1; k < kMaxSlots; k++)
            mine += (d->use[k].conn >= 0 && d->use[k].uid == cred.uid) ||
                    (d->use[k].conn < 0 && !slot_free(*d, k) && d->heldover[k].uid == cred.uid);
        if (mine >= kSlotsPerUser)
            return refuse(fd, EMFILE,
                          "uid " + std::to_string(cred.uid) + " holds " + std::to_string(mine) +
                              " process slots of " + d->text() +
                              ", as many as one user but root may");
    }
    if (rq.arg && (rq.arg >= kMaxSlots || d->slot_map < 0))
        return refuse(fd, EINVAL,
                      d->slot_map < 0 ? d->text() + " is not steered by a slot map: "
                                                    "no slot is taken back"
                                      : "no slot " + std::to_string(rq.arg));
    bool direct = cred.uid == geteuid();
    void *table =
        mmap(nullptr, kTableEntries * sizeof(QpEntry), PROT_READ, MAP_SHARED, table_fd, 0);
    if (table == MAP_FAILED) return refuse(fd, EINVAL, "the QP table cannot be mapped");
    uint32_t s = rq.arg;
    if (s) {
        if (int err = resume(cred, *d, s, sock, why)) {
            munmap(table, kTableEntries * sizeof(QpEntry));
            return refuse(fd, err, why);
        }
    } else {
        // Next fit over the slots in use and one more: a freed slot is
        // reused as late as possible, so a QPN comes back late too.
        uint32_t n = std::min<uint32_t>(uint32_t(d->socks.size()) + 1, kMaxSlots);
        for (uint32_t k = 0; k < n; k++) {
            uint32_t c = d->next + k;
            c = 1 + (c - 1) % (n - 1);
            if (slot_free(*d, c)) {
                s = c;
                break;
            }
        }
    }
    if (!s) {
        munmap(table, kTableEntries * sizeof(QpEntry));
        return refuse(fd, EMFILE,
                      "all " + std::to_string(kMaxSlots - 1) + " process slots of " + d->text() +
                          " are in use");
    }
    if (s >= d->socks.size() || d->socks[s] < 0) {
        int fresh = new_socket(*d, true, why);
        if (fresh >= 0) {
            if (s >= d->socks.size())
                d->socks.push_back(fresh);
            else
                d->socks[s] = fresh;
        }
        if (fresh < 0 || steer(*d, s)) {
            int err = fresh < 0 ? errno : EIO;
            if (fresh >= 0 && d->slot_map >= 0) {
                close(fresh);
                d->socks[s] = -1;
            }
            munmap(table, kTableEntries * sizeof(QpEntry));
            return refuse(fd, err, fresh < 0 ? why : "the slot cannot be steered");
        }
    } else if (!rq.arg) {
        // What a previous owner left unread is not for the next one.
        char b[64];
        while (recv(d->socks[s], b, sizeof b, MSG_DONTWAIT) >= 0) {
        }
    }
    // A member of the group could reprogram its steering or connect(2)
    // itself to a peer and take every user's packets: only the agent's own
    // user's processes hold one; any other's get their packets relayed.
    int give = d->socks[s], pair[2] = {-1, -1};
    bool relayed = !direct;
    if (relayed) {
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
            int err = errno;
            munmap(table, kTableEntries * sizeof(QpEntry));
            return refuse(fd, err, std::string("socketpair: ") + strerror(err));
        }
        // A relayed burst waits in the pair as it would in a UDP socket.
        int buf = 16 << 20;
        if (setsockopt(pair[0], SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) < 0)
            setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        fcntl(pair[0], F_SETFL, O_NONBLOCK);
        // A process of the agent's user that held the slot before may have
        // asked for coalesced receives; relay() takes datagrams one by one.
        int off = 0;
        setsockopt(d->socks[s], IPPROTO_UDP, UDP_GRO, &off, sizeof off);
        give = pair[1];
        rep.flags = kOpenRelayed;
    }
    SlotUse &u = d->use[s];
    u.pid = cred.pid;
    u.uid = cred.uid;
    u.comm.clear();
    u.comm = read_proc(cred.pid, "comm");
    if (!u.comm.empty() && u.comm.back() == '\n') u.comm.pop_back();
    u.dev_name.assign(rq.name, strnlen(rq.name, sizeof rq.name));
    u.table = static_cast<const QpEntry *>(table);
    rep.slot = s;
    // A slot outlives this agent only where the next can tell whose it is.
    if (d->slot_map >= 0 && opts_.handover && geteuid() == 0) rep.flags |= kOpenSteeringKept;
    // Recorded before the process hears of it: an agent killed in between
    // leaves a record its successor honours.
    u.conn = fd;
    SlotOwner held = d->heldover[s];
    d->heldover[s] = {};
    record_owners();
    // A resuming process of the agent's user has its socket.
    ssize_t sent = rq.arg && direct ? send(fd, &rep, sizeof rep, MSG_NOSIGNAL)
                                    : send_with_fd(fd, &rep, sizeof rep, give);
    if (pair[1] >= 0) close(pair[1]);
    if (sent < 0) {
        munmap(table, kTableEntries * sizeof(QpEntry));
        if (pair[0] >= 0) close(pair[0]);
        u = SlotUse{};
        d->heldover[s] = held;
        // Its socket back out of the map, so that it may try again (a
        // socket is in one map at most).
        if (rq.arg && direct) {
            unmap_slot(d->slot_map, s);
            close(d->socks[s]);
            d->socks[s] = -1;
        }
        record_owners();
        return;
    }
    u.relay = pair[0];
    if (!rq.arg) d->next = s + 1;
    *owner = d;
    *slot = s;
    log("%s slot %u: pid %d (%s)%s%s", d->text().c_str(), s, int(u.pid), u.comm.c_str(),
        relayed ? ", relayed" : "", rq.arg ? ", resumed" : "");
}

// Slot `s` back to the process that held it under a dead agent: the one
// the record names (handover.hpp), with the socket it kept when it is of
// the agent's user (its traffic never stopped), through a new relay
// otherwise.  0 or an errno, with `why`.
int Agent::resume(const ucred &cred, Dev &d, uint32_t s, int sock, std::string &why) {
    const SlotOwner &h = d.heldover[s];
    if (d.use[s].conn >= 0 || !h.pid || h.pid != cred.pid || h.uid != cred.uid ||
        proc_start(h.pid) != h.start) {
        why = "slot " + std::to_string(s) + " of " + d.text() + " is not this process's to resume";
        return EPERM;
    }
    bool direct = cred.uid == geteuid();
    if (direct != (sock >= 0)) {
        why = direct ? "a process of the agent's user resumes with its slot's socket"
                     : "a relayed process resumes without a socket";
        return EINVAL;
    }
    if (sock < 0) return 0; // relayed: open_device makes the slot's socket
    // The socket must be the slot's member of this address's group: bound
    // here, and taken by the map (which refuses a socket in no group).
    SockAddr sa;
    socklen_t l = sizeof sa.in6;
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockname(sock, &sa.sa, &l) < 0 || sa.sa.sa_family != d.addr.family() ||
        sa.addr() != d.addr || sa.port() != wire::kRoceV2Port ||
        getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_DGRAM) {
        why = "the socket is not one of " + d.text() + ":4791";
        return EINVAL;
    }
    int own = fcntl(sock, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
        why = std::string("dup: ") + strerror(errno);
        return errno;
    }
    // Under the dead agent's map the socket is still at its slot.
    if (int err = slot_holds(d.slot_map, s, own) ? 0 : map_slot(d.slot_map, s, own)) {
        close(own);
        why = std::string("the socket cannot be steered: ") + strerror(err);
        return EINVAL;
    }
    if (d.socks[s] >= 0) close(d.socks[s]);
    d.socks[s] = own;
    return 0;
}

// A relayed slot's packets, from the group's socket the agent keeps to the
// process's end of the pair, each behind where it came from.  Bounded per
// call, so that a flood to one slot delays the agent's other work little;
// what the process has no room for is dropped, as a full UDP socket would.
void Agent::relay(Dev &d, uint32_t slot) {
    SlotUse &u = d.use[slot];
    if (!relay_bufs_) relay_bufs_ = std::make_unique<RelayBufs>();
    RelayBufs &b = *relay_bufs_;
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < RelayBufs::kBatch; i++) {
            b.in[i] = {b.data.get() + size_t(i) * RelayBufs::kLen, RelayBufs::kLen};
            b.rx[i].msg_hdr = {};
            b.rx[i].msg_hdr.msg_name = &b.from[i].sa;
            b.rx[i].msg_hdr.msg_namelen = sizeof b.from[i].in6;
            b.rx[i].msg_hdr.msg_iov = &b.in[i];
            b.rx[i].msg_hdr.msg_iovlen = 1;
            b.rx[i].msg_hdr.msg_control = b.ctl[i];
            b.rx[i].msg_hdr.msg_controllen = sizeof b.ctl[i];
        }
        int n = recvmmsg(d.socks[slot], b.rx, RelayBufs::kBatch, MSG_DONTWAIT, nullptr);
        if (n <= 0) return;
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (b.rx[i].msg_hdr.msg_flags & MSG_TRUNC) {
                d.rx_relay_dropped++; // longer than any RoCE packet
                continue;
            }
            b.hdr[k] = {};
            std::memcpy(b.hdr[k].from_addr, b.from[i].addr().raw, 16);
            b.hdr[k].from_port = htons(b.from[i].port());
            IpAddr to = d.addr;
            IpFields ip;
            const msghdr &mh = b.rx[i].msg_hdr;
            for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(const_cast<msghdr *>(&mh), c))
                if (!read_ip_fields(c, &ip)) read_pktinfo(c, &to);
            std::memcpy(b.hdr[k].to_addr, to.raw, 16);
            b.hdr[k].tclass = ip.tclass;
            b.hdr[k].hop_limit = ip.hop_limit;
            b.hdr[k].flow_label = htonl(ip.flow);
            b.out[k][0] = {&b.hdr[k], sizeof b.hdr[k]};
            b.out[k][1] = {b.in[i].iov_base, b.rx[i].msg_len};
            b.tx[k].msg_hdr = {};
            b.tx[k].msg_hdr.msg_iov = b.out[k];
            b.tx[k].msg_hdr.msg_iovlen = 2;
            k++;
        }
        for (int off = 0; off < k;) {
            int m = sendmmsg(u.relay, b.tx + off, unsigned(k - off), MSG_DONTWAIT | MSG_NOSIGNAL);
            if (m <= 0) {
                d.rx_relay_dropped += uint64_t(k - off);
                break;
            }
            d.rx_relayed += uint64_t(m);
            off += m;
        }
        if (n < RelayBufs::kBatch) return;
    }
}

void Agent::release(Dev &d, uint32_t slot) {
    recheck_unused_ = true;
    SlotUse &u = d.use[slot];
    log("%s slot %u: pid %d left", d.text().c_str(), slot, int(u.pid));
    if (u.table) munmap(const_cast<QpEntry *>(u.table), kTableEntries * sizeof(QpEntry));
    close(u.conn);
    if (u.relay >= 0) close(u.relay);
    u = SlotUse{};
    if (d.slot_map >= 0) record_owners();
}

void Agent::send_json(int fd, const json &j) {
    // One message per chunk, then an empty one: a SEQPACKET message must fit
    // the socket buffer.
    std::string s = j.dump();
    constexpr size_t kChunk = 32 << 10;
    for (size_t off = 0; off < s.size(); off += kChunk)
        if (send(fd, s.data() + off, std::min(kChunk, s.size() - off), MSG_NOSIGNAL) < 0) return;
    send(fd, "", 0, MSG_NOSIGNAL);
}

json Agent::resources() const {
    json devs = json::array();
    for (auto &d : devs_) {
        json procs = json::array();
        json gsi = {{"qpn", 1}, {"type", "GSI"}, {"state", "RTS"}};
        procs.push_back({{"slot", 0},
                         {"pid", int(getpid())},
                         {"comm", "sroce-agent"},
                         {"qps", json::array({gsi})}});
        for (uint32_t s = 1; s < kMaxSlots; s++) {
            const SlotUse &u = d->use[s];
            if (u.conn < 0) continue;
            json qps = json::array();
            for (uint32_t i = 0; i < kTableEntries; i++) {
                uint64_t id = u.table[i].id.load(std::memory_order_relaxed);
                if (!(id >> 63)) continue;
                uint64_t peer = u.table[i].peer.load(std::memory_order_relaxed);
                uint64_t half[2] = {u.table[i].peer_addr[0].load(std::memory_order_relaxed),
                                    u.table[i].peer_addr[1].load(std::memory_order_relaxed)};
                IpAddr raddr = IpAddr::of_gid(half);
                json q = {{"qpn", id & 0xFFFFFF},
                          {"type", type_name(uint32_t(id >> 32) & 0xFF)},
                          {"state", state_name(uint32_t(id >> 40) & 0xFF)}};
                if (!raddr.empty()) {
                    q["rqpn"] = peer & 0xFFFFFF;
                    q["raddr"] = ip_text(raddr);
                }
                const QpEntry &e = u.table[i];
                uint64_t sent = e.cc_cnps_sent.load(std::memory_order_relaxed),
                         received = e.cc_cnps_received.load(std::memory_order_relaxed);
                // Only QPs congestion control has touched: the others have
                // nothing to say.
                if (sent || received)
                    q["cc"] = {{"rate_kbps", e.cc_rate_kbps.load(std::memory_order_relaxed)},
                               {"cnps_sent", sent},
                               {"cnps_received", received},
                               {"rate_cuts", e.cc_cuts.load(std::memory_order_relaxed)}};
                qps.push_back(q);
            }
            procs.push_back({{"slot", s},
                             {"pid", int(u.pid)},
                             {"comm", u.comm},
                             {"ifname", u.dev_name},
                             {"qps", qps}});
        }
        devs.push_back({{"addr", d->text()}, {"netdev", d->netdev}, {"processes", procs}});
    }
    return {{"devices", devs}};
}

json Agent::status() const {
    json devs = json::array();
    for (auto &d : devs_) {
        unsigned used = 0, made = 0, held = 0;
        for (uint32_t s = 1; s < kMaxSlots; s++) {
            used += d->use[s].conn >= 0;
            made += s < d->socks.size() && d->socks[s] >= 0;
            held += d->heldover[s].pid != 0;
        }
        devs.push_back({{"addr", d->text()},
                        {"netdev", d->netdev},
                        {"steering", d->slot_map >= 0 ? "slot map" : "classic"},
                        {"slots", made},
                        {"slots_held_over", held},
                        {"processes", used},
                        {"rx_gsi", d->rx_gsi},
                        {"rx_gsi_dropped", d->rx_gsi_bad},
                        {"rx_unroutable", d->rx_unroutable},
                        {"rx_relayed", d->rx_relayed},
                        {"rx_relay_dropped", d->rx_relay_dropped}});
    }
    json listeners = json::array();
    for (const Cm::Listener &l : cm_.listeners()) {
        bool v4 = l.family == AF_INET;
        std::string family = v4 ? "ipv4" : l.afonly ? "ipv6" : "ipv6+ipv4";
        listeners.push_back(
            {{"addr", l.addr.unspecified() ? (v4 ? "0.0.0.0" : "::") : ip_text(l.addr)},
             {"family", family},
             {"port", l.port},
             {"ps", l.ps},
             {"pid", int(l.pid)}});
    }
    json joins = json::array();
    for (const Cm::Join &j : cm_.joins())
        joins.push_back({{"group", ip_text(j.group)},
                         {"addr", ip_text(j.addr)},
                         {"send_only", j.send_only},
                         {"pid", int(j.pid)}});
    // How it runs (run()): whether a relayed packet waits behind ordinary work.
    std::string scheduling = "nice " + std::to_string(getpriority(PRIO_PROCESS, 0));
    sched_param sp{};
    if ((sched_getscheduler(0) & ~SCHED_RESET_ON_FORK) == SCHED_RR && sched_getparam(0, &sp) == 0)
        scheduling = "SCHED_RR " + std::to_string(sp.sched_priority);
    return {{"pid", int(getpid())},
            {"version", SROCE_VERSION},
            {"scheduling", scheduling},
            {"listeners", listeners},
            {"multicast", joins},
            {"protocol", kProtoVersion},
            {"socket", where_},
            {"cm",
             {{"rx_mads", cm_.stats().rx_mads},
              {"rx_bad_mads", cm_.stats().rx_bad},
              {"tx_mads", cm_.stats().tx_mads},
              {"retries", cm_.stats().retries}}},
            {"devices", devs}};
}

Agent::Served Agent::serve(int fd, Dev **owner, uint32_t *slot) {
    // One byte more than a request may have: a longer one shows as such.
    constexpr size_t kMaxRequest = 32768; // an rdma_cm channel of kMaxDevices devices
    alignas(8) uint8_t msg[kMaxRequest + 1];
    int fds[2];
    ssize_t n = recv_with_fds(fd, msg, sizeof msg, MSG_DONTWAIT, fds, 2);
    if (n < 0) return errno == EAGAIN ? Served::kKeep : Served::kClose;
    struct Closer {
        int *fds;
        ~Closer() {
            for (int i = 0; i < 2; i++)
                if (fds[i] >= 0) close(fds[i]);
        }
    } closer{fds};
    int table_fd = fds[0];
    if (n == 0) return Served::kClose;
    Request rq{};
    std::memcpy(&rq, msg, std::min(sizeof rq, size_t(n)));
    // Another release's request may have another size; its version is
    // always the second word.
    if (size_t(n) >= 2 * sizeof(uint32_t) && rq.version != kProtoVersion) {
        refuse(fd, EPROTO,
               "the running sroce agent (pid " + std::to_string(getpid()) + ") speaks protocol " +
                   std::to_string(kProtoVersion) +
                   "; stop it with 'sroce agent stop' so that this release's starts");
        return Served::kClose;
    }
    // What is not a well-formed request is answered with why, never with
    // silence, a crash or a leaked descriptor.
    std::string bad;
    bool op_known = rq.op == kOpenDevice || rq.op == kResources || rq.op == kStop ||
                    rq.op == kStatus || rq.op == kCmChannel || rq.op == kCmCommands;
    if (size_t(n) > kMaxRequest)
        bad = "a request is at most " + std::to_string(kMaxRequest) + " bytes";
    else if (size_t(n) < sizeof rq)
        bad = "a request of " + std::to_string(n) + " bytes";
    else if (!op_known)
        bad = "unknown request " + std::to_string(rq.op);
    else if ((rq.op == kOpenDevice) != (table_fd >= 0))
        bad = rq.op == kOpenDevice ? "an open carries the QP table's descriptor"
                                   : "no descriptor belongs with request " + std::to_string(rq.op);
    else if (fds[1] >= 0 && (rq.op != kOpenDevice || !rq.arg))
        bad = "a second descriptor belongs only with a resumed slot";
    else if (rq.op == kCmChannel ? (size_t(n) - sizeof rq) % sizeof(CmDeviceInfo) != 0
                                 : size_t(n) != sizeof rq)
        bad = "request " + std::to_string(rq.op) + " of " + std::to_string(n) + " bytes";
    if (!bad.empty()) {
        refuse(fd, size_t(n) > kMaxRequest ? EMSGSIZE : EINVAL, bad);
        return Served::kClose;
    }
    switch (rq.op) {
    case kOpenDevice:
        open_device(fd, rq, table_fd, fds[1], owner, slot);
        return *owner ? Served::kSlot : Served::kClose;
    case kCmChannel: {
        size_t ndev = (size_t(n) - sizeof rq) / sizeof(CmDeviceInfo);
        ucred cred = this->cred(fd);
        if (cred.uid != 0) {
            uint32_t open = 0;
            for (const auto *v : {&cm_conns_, &new_cm_conns_})
                for (const CmConn &c : *v)
                    open += c.fd >= 0 && !c.commands && c.uid == cred.uid;
            if (open >= kChannelsPerUser) {
                refuse(fd, EMFILE,
                       "uid " + std::to_string(cred.uid) + " has " + std::to_string(open) +
                           " rdma_cm channels open, as many as one user but root may");
                return Served::kClose;
            }
        }
        std::vector<CmDevice> devs;
        std::vector<IpAddr> addrs;
        for (size_t i = 0; i < ndev; i++) {
            CmDeviceInfo di;
            std::memcpy(&di, msg + sizeof rq + i * sizeof di, sizeof di);
            IpAddr addr = IpAddr::of_gid(di.addr);
            CmDevice d;
            d.addr = addr;
            d.follow = addr.empty();
            std::memcpy(d.netdev, di.netdev, sizeof d.netdev);
            d.netdev[sizeof d.netdev - 1] = 0;
            for (const auto &g : di.gids)
                d.gids.push_back(IpAddr::of_gid(g));
            while (!d.gids.empty() && d.gids.back().empty())
                d.gids.pop_back();
            d.index = di.index;
            d.guid = di.guid;
            d.mtu = di.mtu;
            std::memcpy(d.name, di.name, sizeof d.name);
            d.name[sizeof d.name - 1] = 0;
            devs.push_back(d);
            // QP1 of every device the process may connect through must
            // answer, whether or not a process has the device open.
            addrs.push_back(addr);
            std::string why;
            if (!device(addr, d.netdev, cred.uid, why)) await(addr, d.netdev, cred.uid, why);
        }
        OpenReply rep{};
        rep.version = kProtoVersion;
        rep.slot =
            cm_.open_channel(fd, cred.pid, cred.uid, may_bind_service(cred.pid), std::move(devs));
        if (send(fd, &rep, sizeof rep, MSG_NOSIGNAL) < 0) {
            cm_.close_channel(rep.slot);
            return Served::kClose;
        }
        new_cm_conns_.push_back({fd, rep.slot, false, std::move(addrs), cred.uid});
        return Served::kCm;
    }
    case kCmCommands: {
        OpenReply rep{};
        rep.version = kProtoVersion;
        rep.slot = rq.arg;
        bool known = false;
        for (const CmConn &c : cm_conns_)
            known |= !c.commands && c.channel == rq.arg;
        for (const CmConn &c : new_cm_conns_)
            known |= !c.commands && c.channel == rq.arg;
        // A channel is named by a small number anyone can send: its commands
        // are only for the process that opened it, as the kernel's are
        // only for whoever holds the file.
        ucred cred = this->cred(fd);
        known = known && cm_.channel_owned_by(rq.arg, cred.pid, cred.uid);
        if (!known) rep.err = ENOENT;
        if (send(fd, &rep, sizeof rep, MSG_NOSIGNAL) < 0 || !known) return Served::kClose;
        new_cm_conns_.push_back({fd, rq.arg, true, {}, cred.uid});
        return Served::kCm;
    }
    case kResources:
        send_json(fd, resources());
        return Served::kClose;
    case kStatus:
        send_json(fd, status());
        return Served::kClose;
    case kStop: {
        // Who may stop it: its own user and root, as only they may kill it.
        ucred cred = this->cred(fd);
        if (cred.uid != 0 && cred.uid != geteuid()) {
            refuse(fd, EPERM,
                   "the sroce agent (pid " + std::to_string(getpid()) + ") runs as uid " +
                       std::to_string(geteuid()) + ": only that user or root may stop it");
            log("uid %u (pid %d) may not stop the agent", unsigned(cred.uid), int(cred.pid));
            return Served::kClose;
        }
        send(fd, "", 0, MSG_NOSIGNAL);
        stop_ = true;
        return Served::kClose;
    }
    default:
        return Served::kClose;
    }
}

void Agent::cm_command(CmConn &c) {
    alignas(8) uint8_t in[kCmMaxMsg];
    ssize_t n = recv(c.fd, in, sizeof in, MSG_DONTWAIT);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(c.fd);
            c.fd = -1;
            recheck_unused_ = true;
        }
        return;
    }
    CmCommand cmd{};
    alignas(8) uint8_t out[sizeof(CmReply) + kCmMaxMsg];
    CmReply rep{};
    size_t out_len = 0;
    if (size_t(n) < sizeof cmd) {
        rep.err = EINVAL;
    } else {
        std::memcpy(&cmd, in, sizeof cmd);
        size_t in_len = std::min<size_t>(cmd.in_len, size_t(n) - sizeof cmd);
        rep.err = cm_.command(c.channel, cmd.cmd, in + sizeof cmd, in_len, out + sizeof rep,
                              std::min<size_t>(cmd.out_cap, kCmMaxMsg), &out_len);
    }
    rep.out_len = uint32_t(out_len);
    std::memcpy(out, &rep, sizeof rep);
    send(c.fd, out, sizeof rep + out_len, MSG_NOSIGNAL);
}

// A MAD to QP1 of `remote` from the device at `local`, as the kernel sends
// one (docs/connection-manager.md, QP1): UD SEND ONLY with AckReq, P_Key 0xFFFF,
// DETH Q_Key 0x80010000 from QP1.
void Agent::send_mad(const IpAddr &src, const IpAddr &remote, const uint8_t *mad) {
    Dev *d = nullptr;
    for (auto &x : devs_)
        if (x->addr == src) d = x.get();
    // Else a device that has every address of the interface `local` is on.
    for (auto &x : devs_)
        if (!d && x->addr.empty()) {
            std::vector<IpAddr> on = netdev_addrs(x->netdev);
            if (std::find(on.begin(), on.end(), src) != on.end()) d = x.get();
        }
    if (!d) return;
    uint8_t pkt[wire::kBthLen + 8 + 256 + 4];
    wire::bth::build(pkt, wire::kUdSendOnly, false, 0, 0xFFFF, 1, true, d->gsi_psn);
    d->gsi_psn = (d->gsi_psn + 1) & 0xFFFFFF;
    wire::put32(pkt + wire::kBthLen, 0x80010000);
    wire::put32(pkt + wire::kBthLen + 4, 1);
    std::memcpy(pkt + wire::kBthLen + 8, mad, 256);
    IpHeader ip{src, remote, wire::kRoceV2Port, wire::kRoceV2Port};
    icrc_store(pkt + sizeof pkt - 4, icrc_compute(ip, pkt, sizeof pkt));
    SockAddr sa(ip.dst, wire::kRoceV2Port, uint32_t(d->ifindex));
    iovec iov{pkt, sizeof pkt};
    msghdr m{};
    m.msg_name = &sa.sa;
    m.msg_namelen = sa.len;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    // A socket of every address leaves from the one named.
    alignas(cmsghdr) uint8_t ctl[kPktinfoSpace];
    if (d->addr.empty()) {
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        write_pktinfo(CMSG_FIRSTHDR(&m), src, d->ifindex);
    }
    sendmsg(d->socks[0], &m, MSG_DONTWAIT);
}

void Agent::accept_conns() {
    for (;;) {
        int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        conns_.push_back({fd});
    }
}

// QP1 and everything unroutable land here: CM MADs go to the CM, the
// rest is counted (`sroce agent status`) and dropped.
void Agent::drain_gsi(Dev &d) {
    alignas(8) uint8_t b[4096 + 256];
    for (;;) {
        SockAddr from;
        iovec iov{b, sizeof b};
        alignas(cmsghdr) uint8_t ctl[kPktinfoSpace + kIpFieldsSpace];
        msghdr m{};
        m.msg_name = &from.sa;
        m.msg_namelen = sizeof from.in6;
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        ssize_t n = recvmsg(d.socks[0], &m, MSG_DONTWAIT);
        if (n < 0) return;
        IpAddr to = sent_to(m, d);
        wire::Packet pkt;
        if (wire::parse(b, size_t(n), pkt) != wire::ParseError::kOk || pkt.qpn != 1) {
            d.rx_unroutable++;
            continue;
        }
        d.rx_gsi++;
        IpHeader ip{from.addr(), to, from.port(), wire::kRoceV2Port};
        // QP1 takes UD SENDs with the GSI Q_Key only, as rxe does.
        if (!icrc_verify(ip, b, size_t(n)) || pkt.opcode != wire::kUdSendOnly ||
            pkt.qkey() != 0x80010000 || (wire::bth::pkey(b) & 0x7FFF) != 0x7FFF) {
            d.rx_gsi_bad++;
            continue;
        }
        cm_.receive(to, from.addr(), pkt.payload, pkt.payload_len);
    }
}

bool Agent::busy() const {
    if (!conns_.empty() || !cm_conns_.empty()) return true;
    for (auto &d : devs_)
        for (uint32_t s = 1; s < kMaxSlots; s++)
            if (d->use[s].conn >= 0) return true;
    return false;
}

int Agent::loop() {
    uint64_t idle_since = mono_s();
    while (!stop_) {
        if (!pass(1000)) return 1;
        uint64_t now = mono_s();
        if (busy()) idle_since = now;
        if (opts_.idle_exit && now - idle_since >= opts_.idle_exit) {
            log("idle for %u s, exiting", opts_.idle_exit);
            break;
        }
    }
    return 0;
}

bool Agent::pass(int max_wait_ms) {
    std::vector<pollfd> &pfds = pass_pfds_;
    std::vector<PassRef> &refs = pass_refs_;
    using Kind = PassRef::Kind;
    {
        if (recheck_unused_) {
            recheck_unused_ = false;
            release_unused();
        }
        pfds.assign(1, {listen_, POLLIN, 0});
        refs.assign(1, {Kind::kConn, nullptr, 0});
        for (uint32_t i = 0; i < conns_.size(); i++) {
            pfds.push_back({conns_[i].fd, POLLIN, 0});
            refs.push_back({Kind::kConn, nullptr, i});
        }
        for (auto &d : devs_) {
            pfds.push_back({d->socks[0], POLLIN, 0});
            refs.push_back({Kind::kDevice, d.get(), 0});
            for (uint32_t s = 1; s < kMaxSlots; s++)
                if (d->use[s].conn >= 0) {
                    pfds.push_back({d->use[s].conn, POLLIN, 0});
                    refs.push_back({Kind::kSlot, d.get(), s});
                    if (d->use[s].relay >= 0) {
                        pfds.push_back({d->socks[s], POLLIN, 0});
                        refs.push_back({Kind::kRelay, d.get(), s});
                    }
                }
        }
        for (uint32_t i = 0; i < cm_conns_.size(); i++) {
            pfds.push_back({cm_conns_[i].fd, POLLIN, 0});
            refs.push_back({Kind::kCm, nullptr, i});
        }
        retry_awaited();
        int timeout = cm_.timers(mono_ms());
        int r = poll(pfds.data(), pfds.size(),
                     timeout < 0 || timeout > max_wait_ms ? max_wait_ms : timeout);
        if (r < 0 && errno != EINTR) {
            log("poll: %s", strerror(errno));
            return false;
        }
        std::vector<uint32_t> done; // conns_ entries finished with
        for (size_t i = 1; r > 0 && i < pfds.size(); i++) {
            if (!pfds[i].revents) continue;
            PassRef ref = refs[i];
            switch (ref.kind) {
            case Kind::kConn: {
                Dev *owner = nullptr;
                uint32_t slot = 0;
                Served sv = serve(conns_[ref.index].fd, &owner, &slot);
                if (sv != Served::kKeep) done.push_back(ref.index);
                if (sv == Served::kClose) close(conns_[ref.index].fd);
                break;
            }
            case Kind::kDevice:
                drain_gsi(*ref.dev);
                break;
            case Kind::kSlot: {
                // A process's connection only ever ends: its end is the
                // process's release of the slot, whatever the cause.
                char b[64];
                if (recv(pfds[i].fd, b, sizeof b, MSG_DONTWAIT) <= 0 || pfds[i].revents & POLLHUP)
                    release(*ref.dev, ref.index);
                break;
            }
            case Kind::kRelay:
                // Released above in this pass: the slot's packets are no
                // one's until it is leased again.
                if (ref.dev->use[ref.index].relay >= 0) relay(*ref.dev, ref.index);
                break;
            case Kind::kCm: {
                CmConn &c = cm_conns_[ref.index];
                if (c.commands) {
                    cm_command(c);
                } else {
                    // The wake-up end only ever ends (close(2) of the
                    // channel, or the process's death): the channel goes.
                    char b[64];
                    ssize_t k = recv(c.fd, b, sizeof b, MSG_DONTWAIT);
                    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                        cm_.close_channel(c.channel);
                        close(c.fd);
                        c.fd = -1;
                        recheck_unused_ = true;
                    }
                }
                break;
            }
            }
        }
        for (auto it = done.rbegin(); it != done.rend(); ++it)
            conns_.erase(conns_.begin() + *it);
        std::erase_if(cm_conns_, [](const CmConn &c) { return c.fd < 0; });
        cm_conns_.insert(cm_conns_.end(), new_cm_conns_.begin(), new_cm_conns_.end());
        new_cm_conns_.clear();
        if (pfds[0].revents & POLLIN) accept_conns();
    }
    return true;
}

} // namespace

int run(const Options &opts) {
    signal(SIGPIPE, SIG_IGN);
    auto agent = std::make_unique<Agent>(opts);
    if (int err = agent->listen_socket()) {
        if (err == EADDRINUSE) {
            // Another agent serves the namespace: nothing to do, unless it
            // is someone else's squatting the name.
            Endpoint e = own_endpoint();
            int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
            std::string why;
            bool squatted = fd >= 0 &&
                            connect(fd, reinterpret_cast<const sockaddr *>(&e.sa), e.len) == 0 &&
                            !trusted_agent(fd, e.text, why);
            if (fd >= 0) close(fd);
            if (!squatted) return 0;
            fprintf(stderr, "sroce agent: %s\n", why.c_str());
            return 1;
        }
        fprintf(stderr, "sroce agent: cannot listen on %s: %s\n", own_endpoint().text.c_str(),
                strerror(err));
        return 1;
    }
    if (opts.detach) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("sroce agent: fork");
            return 1;
        }
        // The parent returns once the socket listens, so whoever started it
        // can connect at once.
        if (pid > 0) _exit(0);
        setsid();
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        int out = opts.log.empty()
                      ? null
                      : open(opts.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (out < 0) out = null;
        // A starter's pipes held open by a long-lived agent would keep its
        // reader (a shell's $(...), a test harness) waiting for their end.
        dup2(null, 0);
        dup2(out, 1);
        dup2(out, 2);
        if (out != null) close(out);
        close(null);
    }
    // A relayed process receives every packet through this loop: a wake-up
    // that waits for a CPU delays its peers' packets.  On a loaded 2-core
    // machine the agent, alone in the scheduling group setsid(2) gave it
    // (autogroup), was seen to wait runnable for up to half a second, a
    // whole RC retry budget; at nice -10, its group's too, still for 570 ms
    // beside busy-polling programs.  So it runs ahead of ordinary work
    // where it may (CAP_SYS_NICE: root's); it needs little CPU, and what a
    // flood to a relayed slot makes it take is bounded by the kernel's
    // real-time throttling as a nice of -10 bounds it.  Not inherited: the
    // agent starts nothing that should run so.
    sched_param rt{};
    rt.sched_priority = kAgentRtPriority;
    if (sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &rt) < 0) {
        // The group's nice counts against other sessions, the thread's
        // within its group.
        setpriority(PRIO_PROCESS, 0, kAgentNice);
        if (FILE *g = fopen("/proc/self/autogroup", "w")) {
            fprintf(g, "%d", kAgentNice);
            fclose(g); // EPERM unprivileged: it runs as before
        }
    }
    log("pid %d listening on %s", int(getpid()), own_endpoint().text.c_str());
    return agent->loop();
}

struct Session::Impl {
    Agent agent;
    explicit Impl(const Options &o) : agent(o) {}
};

Session::Session(const Options &opts) : impl_(std::make_unique<Impl>(opts)) {}
Session::~Session() = default;

int Session::connect(pid_t pid, uid_t uid, gid_t gid) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -1;
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    impl_->agent.add_conn(sv[1], ucred{pid, uid, gid});
    return sv[0];
}

bool Session::pass(int max_wait_ms) {
    return impl_->agent.pass(max_wait_ms) && !impl_->agent.stopped();
}

std::string query(uint32_t op) {
    int fd = -1;
    std::string tried;
    for (const Endpoint &e : agent_endpoints()) {
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
        if (connect(fd, reinterpret_cast<const sockaddr *>(&e.sa), e.len) == 0) {
            if (std::string why; !trusted_agent(fd, e.text, why)) {
                close(fd);
                throw std::runtime_error(why);
            }
            break;
        }
        close(fd);
        fd = -1;
        tried += (tried.empty() ? "" : ", ") + e.text;
    }
    if (fd < 0) throw std::runtime_error("no sroce agent is running (" + tried + ")");
    Request rq{};
    rq.op = op;
    rq.version = kProtoVersion;
    std::string out;
    if (send(fd, &rq, sizeof rq, MSG_NOSIGNAL) == ssize_t(sizeof rq)) {
        std::vector<char> b(64 << 10);
        for (;;) {
            ssize_t n = recv(fd, b.data(), b.size(), 0);
            if (n <= 0) break;
            out.append(b.data(), size_t(n));
        }
    }
    close(fd);
    return out;
}

void stop() {
    std::string r = query(kStop);
    if (r.empty()) return;
    OpenReply rep{};
    if (r.size() != sizeof rep) throw std::runtime_error("the sroce agent did not stop");
    std::memcpy(&rep, r.data(), sizeof rep);
    rep.msg[sizeof rep.msg - 1] = 0;
    throw std::runtime_error(std::string(rep.msg) + " (" + strerror(rep.err) + ")");
}

} // namespace sroce::agent
