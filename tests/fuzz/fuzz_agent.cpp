// SPDX-License-Identifier: MIT
//
// libFuzzer target for the agent's control protocol (agent/agent.cpp,
// agent_proto.hpp) and its ownership rules: what any local process may
// write to the agent's socket, from any user.  fuzz_cm_state drives the CM
// beneath; this one drives the agent around it — framing, descriptors,
// device leases and resumptions, rdma_cm channels and their commands,
// listings and stop — through Session, an agent in this process whose
// clients' credentials the harness chooses.
//
// Each input gets a fresh agent and is a sequence of steps, each chosen by
// a control byte (see Step):
//   - a connection from one of four clients: root (the agent's user) with
//     two pids, uid 65534 and uid 1000;
//   - a request built around bytes of the input (an op, mostly the right
//     version, a device address among 127.0.61.1-4, a slot to resume),
//     with a QP table that is right, short, unsealed or missing, a second
//     descriptor (this device's UDP socket or a stray one), and a tail
//     (rdma_cm device records, or junk);
//   - raw bytes as a message, of any length up to 20000;
//   - an rdma_cm command on a command connection, on a channel number the
//     agent gave out or a made-up one;
//   - a connection closed; a pass of the agent's loop.
//
// The network is a namespace of the harness's own (lo only): addresses
// from the input reach nothing else.
//
// Oracle, besides ASan, UBSan and LeakSanitizer:
//   - the first message on a connection is always answered (a reply, or
//     the end of the connection for a stop): never silence;
//   - a channel's commands are refused (ENOENT) to any pid and uid but its
//     opener's;
//   - a stop from a user that is neither root nor the agent's is refused
//     (EPERM) and the agent serves on;
//   - a resumption is refused: no agent died before this one, so no slot
//     is anyone's to take back.
#include "agent.hpp"
#include "agent_client.hpp"
#include "agent_proto.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace sroce::agent;

struct Input {
    const uint8_t *p;
    size_t n;
    uint8_t byte() {
        if (!n) return 0;
        n--;
        return *p++;
    }
    uint16_t u16() { return uint16_t(byte() | byte() << 8); }
    uint32_t u32() { return uint32_t(u16() | uint32_t(u16()) << 16); }
};

struct Client {
    pid_t pid;
    uid_t uid;
};
constexpr Client kClients[] = {{100001, 0}, {100002, 0}, {100003, 65534}, {100004, 1000}};

struct Conn {
    int fd;
    Client who;
    bool first = true;     // nothing sent yet
    uint32_t op = 0;       // what its first message asked
    uint32_t channel = 0;  // kCmChannel's number, kCmCommands' channel
    bool commands = false; // a kCmCommands connection the agent took
    bool answered = false; // its first reply was read
};

struct Channel {
    uint32_t number;
    Client opener;
};

// A QP table the agent takes, or one it must refuse.
int table_fd(uint8_t kind) {
    int fd = memfd_create("fuzz-qps", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    size_t len = kTableEntries * sizeof(QpEntry);
    if (kind % 4 == 1) len = 4096; // short
    if (ftruncate(fd, off_t(len)) < 0) {
        close(fd);
        return -1;
    }
    if (kind % 4 != 2) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK); // 2: unsealed
    return fd;
}

uint32_t device_addr(uint8_t k) {
    return htonl(0x7F003D01 + (k % 4)); // 127.0.61.1-4
}

// A UDP socket on one of the device addresses, as a process of the agent's
// user would hand in its slot's socket.
int udp_socket(uint8_t k) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(4791);
    sa.sin_addr.s_addr = device_addr(k);
    bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
    return fd;
}

// Whether the message went out (a full socket or one the agent closed
// takes none, and then no answer is owed).
bool send_msg(int fd, const void *buf, size_t len, const int *fds, int nfds) {
    return (nfds ? send_with_fds(fd, buf, len, fds, nfds)
                 : send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT)) == ssize_t(len);
}

class Harness {
  public:
    Harness() : session_(options()) {}
    ~Harness() {
        for (Conn &c : conns_)
            if (c.fd >= 0) close(c.fd);
    }
    void run(Input in);

  private:
    static Options options() {
        Options o;
        o.idle_exit = 0;
        o.handover = false;
        return o;
    }
    void step(Input &in);
    void request(Input &in, Conn &c);
    void raw(Input &in, Conn &c);
    void cm_command(Input &in, Conn &c);
    void drain(Conn &c);
    void pump() {
        for (int i = 0; i < 3 && live_; i++)
            live_ = session_.pass(0);
    }

    Session session_;
    std::vector<Conn> conns_;
    std::vector<Channel> channels_;
    bool live_ = true;
    bool stop_allowed_ = false; // a stop from root was sent
};

void Harness::run(Input in) {
    for (int steps = 0; in.n && steps < 64 && live_; steps++)
        step(in);
    pump();
    for (Conn &c : conns_)
        drain(c);
    if (!live_ && !stop_allowed_) {
        fprintf(stderr, "the agent stopped, but no one who may stop it asked\n");
        abort();
    }
}

void Harness::step(Input &in) {
    uint8_t ctl = in.byte();
    if (ctl % 6 == 0 || conns_.empty()) {
        if (conns_.size() >= 24) return;
        Client who = kClients[in.byte() % 4];
        int fd = session_.connect(who.pid, who.uid, who.uid);
        if (fd >= 0) conns_.push_back({fd, who});
        return;
    }
    Conn &c = conns_[in.byte() % conns_.size()];
    switch (ctl % 6) {
    case 1:
        if (c.fd >= 0) request(in, c);
        break;
    case 2:
        if (c.fd >= 0) raw(in, c);
        break;
    case 3:
        if (c.fd >= 0) cm_command(in, c);
        break;
    case 4:
        drain(c);
        if (c.fd >= 0) close(c.fd);
        c.fd = -1;
        break;
    default:
        break;
    }
    pump();
    drain(c);
}

void Harness::request(Input &in, Conn &c) {
    Request rq{};
    uint8_t op = in.byte();
    rq.op = op % 8;
    rq.version = in.byte() % 16 ? kProtoVersion : in.byte();
    snprintf(rq.name, sizeof rq.name, "fuzz%u", op >> 4);
    snprintf(rq.netdev, sizeof rq.netdev, "lo");
    uint8_t dev = in.byte();
    // A device's address, any IPv4 one, or any 16 bytes (IPv6, mapped or not).
    sroce::IpAddr addr = sroce::IpAddr::v4(device_addr(dev));
    if (dev % 8 == 0 && dev & 8) {
        addr = sroce::IpAddr::v4(in.u32());
    } else if (dev % 8 == 0) {
        for (int i = 0; i < 16; i += 4) {
            uint32_t w = in.u32();
            std::memcpy(addr.raw + i, &w, 4);
        }
    }
    std::memcpy(rq.addr, addr.raw, 16);
    uint8_t a = in.byte();
    // A channel number the agent gave out, or anything.
    if (rq.op == kCmCommands && !channels_.empty() && a % 4)
        rq.arg = channels_[a % channels_.size()].number;
    else
        rq.arg = a % 4 ? 0 : in.byte();
    std::vector<uint8_t> msg(reinterpret_cast<uint8_t *>(&rq),
                             reinterpret_cast<uint8_t *>(&rq) + sizeof rq);
    uint8_t tail = in.byte();
    if (rq.op == kCmChannel && tail % 4) {
        for (uint8_t i = 0; i < tail % 4; i++) {
            CmDeviceInfo d{};
            sroce::IpAddr da = sroce::IpAddr::v4(device_addr(in.byte()));
            std::memcpy(d.addr, da.raw, 16);
            d.index = i;
            d.mtu = 5;
            snprintf(d.name, sizeof d.name, "fuzz%u", i);
            msg.insert(msg.end(), reinterpret_cast<uint8_t *>(&d),
                       reinterpret_cast<uint8_t *>(&d) + sizeof d);
        }
    } else if (tail % 8 == 7) {
        for (uint8_t i = 0, k = in.byte(); i < k; i++)
            msg.push_back(in.byte());
    }
    uint8_t fdk = in.byte();
    int fds[2] = {-1, -1};
    int nfds = 0;
    if (fdk % 4) fds[nfds++] = table_fd(fdk % 4 == 3 ? in.byte() : 0);
    if (fdk & 4) fds[nfds++] = fdk & 8 ? udp_socket(dev) : table_fd(0);
    if (nfds == 2 && fds[0] < 0) std::swap(fds[0], fds[1]);
    while (nfds && fds[nfds - 1] < 0)
        nfds--;
    bool sent = send_msg(c.fd, msg.data(), msg.size(), fds, nfds);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (!sent || !c.first) return;
    c.first = false;
    // What the oracle may expect holds for a well-formed request only; a
    // malformed one gets some error reply.
    bool well_formed = rq.version == kProtoVersion &&
                       (rq.op == kCmChannel ? (msg.size() - sizeof rq) % sizeof(CmDeviceInfo) == 0
                                            : msg.size() == sizeof rq) &&
                       (rq.op == kOpenDevice ? nfds >= 1 : nfds == 0);
    c.op = well_formed ? rq.op : 0x200;
    if (c.op == kCmCommands) c.channel = rq.arg;
    if (c.op == kStop && (c.who.uid == 0 || c.who.uid == geteuid())) stop_allowed_ = true;
    // A resumption: nothing was ever anyone's to take back.
    if (c.op == kOpenDevice && rq.arg) c.op = 0x100;
}

void Harness::raw(Input &in, Conn &c) {
    std::vector<uint8_t> msg(in.u16() % 20001);
    for (uint8_t &b : msg)
        b = in.byte();
    uint8_t fdk = in.byte();
    int fd = fdk % 4 == 1 ? table_fd(0) : -1;
    bool sent = send_msg(c.fd, msg.data(), msg.size(), &fd, fd >= 0 ? 1 : 0);
    if (fd >= 0) close(fd);
    if (sent && c.first) {
        c.first = false;
        // Maybe a well-formed stop: then the agent may go.
        Request rq{};
        if (!msg.empty()) std::memcpy(&rq, msg.data(), std::min(msg.size(), sizeof rq));
        if (msg.size() == sizeof rq && rq.op == kStop && rq.version == kProtoVersion &&
            (c.who.uid == 0 || c.who.uid == geteuid()))
            stop_allowed_ = true;
        c.op = 0x200; // answered somehow
    }
}

void Harness::cm_command(Input &in, Conn &c) {
    uint8_t body[512];
    CmCommand cmd{};
    cmd.cmd = in.byte() % 32;
    size_t len = in.byte() % sizeof body;
    cmd.in_len = in.byte() % 8 ? uint32_t(len) : in.u32();
    cmd.out_cap = in.u16();
    for (size_t i = 0; i < len; i++)
        body[i] = in.byte();
    std::vector<uint8_t> msg(reinterpret_cast<uint8_t *>(&cmd),
                             reinterpret_cast<uint8_t *>(&cmd) + sizeof cmd);
    msg.insert(msg.end(), body, body + len);
    if (send_msg(c.fd, msg.data(), msg.size(), nullptr, 0) && c.first) {
        c.first = false;
        c.op = 0x200;
    }
}

// Reads what the agent sent on `c`, checking its first answer.
void Harness::drain(Conn &c) {
    if (c.fd < 0 || c.first) return;
    for (;;) {
        alignas(8) uint8_t b[64 << 10];
        int fd = -1;
        ssize_t n = recv_with_fd(c.fd, b, sizeof b, MSG_DONTWAIT, &fd);
        if (fd >= 0) close(fd);
        if (n < 0) {
            if (errno != EAGAIN || c.answered || !live_) return;
            fprintf(stderr, "request %u from uid %u got no answer\n", c.op, unsigned(c.who.uid));
            abort();
        }
        bool was_answered = c.answered;
        c.answered = true;
        if (n == 0) {
            // The end of the connection, or a stop's empty answer.
            close(c.fd);
            c.fd = -1;
            return;
        }
        if (was_answered || size_t(n) != sizeof(OpenReply)) continue;
        OpenReply rep;
        std::memcpy(&rep, b, sizeof rep);
        if (c.op == kCmChannel && !rep.err) channels_.push_back({rep.slot, c.who});
        if (c.op == kCmCommands) {
            bool owner = false;
            for (const Channel &ch : channels_)
                owner |= ch.number == c.channel && ch.opener.pid == c.who.pid &&
                         ch.opener.uid == c.who.uid;
            if (!owner && rep.err != ENOENT) {
                fprintf(stderr, "pid %d uid %u took channel %u's commands (err %d)\n",
                        int(c.who.pid), unsigned(c.who.uid), c.channel, rep.err);
                abort();
            }
        }
        if (c.op == kStop && c.who.uid != 0 && c.who.uid != geteuid() && rep.err != EPERM) {
            fprintf(stderr, "uid %u's stop was not refused\n", unsigned(c.who.uid));
            abort();
        }
        if (c.op == 0x100 && !rep.err) {
            fprintf(stderr, "pid %d resumed a slot no dead agent left it\n", int(c.who.pid));
            abort();
        }
    }
}

// Addresses from the input reach nothing but this namespace's lo.
bool own_network() {
    if (unshare(CLONE_NEWNET) < 0) return false;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    bool up = s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0 &&
              (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr) == 0);
    if (s >= 0) close(s);
    return up;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    if (!own_network()) {
        fprintf(stderr, "fuzz_agent: needs a network namespace of its own (root): %s\n",
                strerror(errno));
        exit(77);
    }
    // The agent's messages, one per lease and refusal, would drown the
    // fuzzer's; -close_fd_mask=2 silences them in runs.
    setenv("SROCE_AGENT_SOCKET", "fuzz-agent", 1);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in{data, size};
    // Both kinds of steering: the slot map and the classic program.
    if (in.byte() & 1)
        setenv("SROCE_AGENT_STEERING", "classic", 1);
    else
        unsetenv("SROCE_AGENT_STEERING");
    Harness h;
    h.run(in);
    return 0;
}
