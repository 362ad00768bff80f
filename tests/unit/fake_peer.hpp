// SPDX-License-Identifier: MIT
//
// sroce against a fake peer: a test opens an sroce device at 127.0.2.1,
// connects an RC QP to 127.0.2.2, and plays the peer itself, crafting every
// RoCEv2 packet with the codec and checking each answer byte by byte.  This
// reaches the error paths two well-behaved sroce endpoints never exercise:
// malformed and forged packets, sequence errors, duplicates, access
// violations, bogus responses.
//
// The expected treatment is the IBTA one (and Linux rxe's): header and ICRC
// errors are dropped silently, PSN gaps get one NAK, duplicates are answered
// without re-executing, access errors get a NAK and move the QP to error.
//
// The device and the peer are on the in-memory wire (port_mem.hpp), and the
// binary opens no AF_INET socket (inet_sockets.hpp); a binary that defines
// FAKE_PEER_ON_UDP before including this plays the peer from UDP sockets on
// lo instead, for what only sockets show: the IP IDs the kernel gives sroce's
// datagrams (checked against their real headers on a packet socket), source
// ports, ICMP errors.  Include it from one source file per binary.
#pragma once

#include "icrc.hpp"
#include "inet_sockets.hpp"
#include "wire.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <map>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <random>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

// External linkage, so that the helpers a binary does not use draw no
// warning; the header is included once per binary.
namespace fake_peer {

#ifdef FAKE_PEER_ON_UDP
constexpr bool kOnUdp = true;
#else
constexpr bool kOnUdp = false;
#endif
// What the device's line in links.conf says beyond its address.
#ifdef FAKE_PEER_LINK_OPTIONS
constexpr const char *kLinkOptions = FAKE_PEER_LINK_OPTIONS;
#else
constexpr const char *kLinkOptions = "";
#endif

using namespace sroce;
using namespace sroce::wire;
using Bytes = std::vector<uint8_t>;

// On the in-memory wire these addresses are the binary's own; on UDP
// (test_wire_udp) they are private to that test (tests/README.md).
constexpr const char *kDevName = "sroce_badin";
constexpr const char *kDevAddr = "127.0.2.1";
constexpr const char *kPeerAddr = "127.0.2.2";
constexpr const char *kStrangerAddr = "127.0.2.3";
// The port of the peer's other source, as Linux rxe sends from one per QP.
constexpr uint16_t kPeerAltPort = 49321;
constexpr uint32_t kPeerQpn = 0x000777;
constexpr uint32_t kRqPsn = 0x000100; // first PSN sroce expects from the peer
constexpr uint32_t kSqPsn = 0x000A00; // first PSN sroce sends
constexpr uint8_t kMinRnrTimer = 12;
constexpr size_t kMrLen = 64 * 1024;
constexpr size_t kNoReadLen = 4096;
constexpr uint32_t kMtu = 1024;
// How long to listen before concluding that nothing was sent.
constexpr int kSilenceMs = 150;
// How long to wait for something that must come.
constexpr int kReplyMs = 2000;

in_addr_t ip4(const char *s) {
    in_addr a{};
    inet_pton(AF_INET, s, &a);
    return a.s_addr;
}

std::string hex(uint32_t v) {
    std::ostringstream o;
    o << "0x" << std::hex << v;
    return o.str();
}

// Where the fake peer sends from and receives at: an address and port of
// the in-memory wire, or a UDP socket bound there (FAKE_PEER_ON_UDP).
struct Endpoint {
    const char *addr = nullptr;
    uint16_t port = kRoceV2Port;
    int fd = -1;
};

// libsroce.so's in-memory wire (libibverbs-ext/shim/memwire.cpp), the one
// its devices are on; the engine's archive linked into the test has a wire
// of its own that no device of the test is on.
extern "C" {
struct sroce_memwire_header {
    uint32_t src, dst;
    uint16_t sport, dport, ip_id;
    uint8_t tclass;
};
void sroce_memwire_listen(uint32_t addr);
long sroce_memwire_take(uint32_t addr, void *buf, size_t cap, sroce_memwire_header *hdr);
int sroce_memwire_send(uint32_t from, uint16_t from_port, uint32_t to, const void *data, size_t len,
                       size_t seg, uint8_t tclass);
void sroce_memwire_clock(uint64_t ns);
}

// A UDP socket that sends DF datagrams with IP ID 0, as an sroce peer does.
int udp_socket(const char *addr, uint16_t port) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = ip4(addr);
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

// Everything the tests share: the device can be opened once per process.
struct World {
    std::string skip;  // the host cannot run these tests, and why
    std::string fatal; // set-up failed in a way that is a test failure
    std::filesystem::path dir;
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    uint8_t *buf = nullptr; // kMrLen bytes, every remote access
    ibv_mr *mr = nullptr;
    uint8_t *noread = nullptr; // kNoReadLen bytes, no REMOTE_READ
    ibv_mr *mr_noread = nullptr;
    Endpoint peer;     // 127.0.2.2:4791, the connected peer
    Endpoint stranger; // 127.0.2.3:4791, not the peer
    Endpoint peer_alt; // 127.0.2.2 on another port, as rxe's hashed source ports
    // On UDP, a packet socket on lo that sees what reaches the peer with its
    // IPv4 header, the IP ID included (needs CAP_NET_RAW; -1 without).
    int tap = -1;
};

// The datagrams to the peer's port 4791 as lo carries them, from the IPv4
// header on.  A classic BPF filter keeps other tests' traffic on lo out.
int open_tap() {
    int fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_IP));
    if (fd < 0) return -1;
    uint32_t peer = ntohl(ip4(kPeerAddr));
    sock_filter code[] = {
        {BPF_LD | BPF_W | BPF_ABS, 0, 0, 16},           // destination address
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 5, peer},        //
        {BPF_LD | BPF_B | BPF_ABS, 0, 0, 9},            // protocol
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 3, IPPROTO_UDP}, //
        {BPF_LD | BPF_H | BPF_ABS, 0, 0, 22},           // destination port (IHL 5)
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, kRoceV2Port}, //
        {BPF_RET | BPF_K, 0, 0, 0xFFFF},
        {BPF_RET | BPF_K, 0, 0, 0},
    };
    sock_fprog prog{uint16_t(std::size(code)), code};
    sockaddr_ll sa{};
    sa.sll_family = AF_PACKET;
    sa.sll_protocol = htons(ETH_P_IP);
    sa.sll_ifindex = int(if_nametoindex("lo"));
    int buf = 8 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) < 0 ||
        bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

World &world() {
    static World w;
    return w;
}

class Env : public ::testing::Environment {
  public:
    void SetUp() override {
        World &w = world();
        w.peer = {kPeerAddr, kRoceV2Port};
        w.stranger = {kStrangerAddr, kRoceV2Port};
        w.peer_alt = {kPeerAddr, kPeerAltPort};
        if (kOnUdp) {
            unsetenv("SROCE_PORT");
            w.peer.fd = udp_socket(kPeerAddr, kRoceV2Port);
            if (w.peer.fd < 0) {
                w.skip = std::string("cannot bind ") + kPeerAddr + ":4791: " + strerror(errno);
                return;
            }
            w.stranger.fd = udp_socket(kStrangerAddr, kRoceV2Port);
            w.peer_alt.fd = udp_socket(kPeerAddr, 0);
            w.tap = open_tap();
            if (w.tap < 0)
                fprintf(stderr,
                        "no packet socket on lo (%s): the IP IDs sroce sends are not "
                        "checked against their headers\n",
                        strerror(errno));
            if (w.stranger.fd < 0 || w.peer_alt.fd < 0) {
                w.skip = std::string("cannot bind a loopback UDP socket: ") + strerror(errno);
                return;
            }
        } else {
            // Read with the configuration, at the first ibv_get_device_list().
            setenv("SROCE_PORT", "memory", 1);
            rctest::expect_no_inet_sockets();
            sroce_memwire_listen(ip4(kPeerAddr));
            sroce_memwire_listen(ip4(kStrangerAddr));
        }
        char tmpl[] = "/tmp/sroce-badinput-XXXXXX";
        if (!mkdtemp(tmpl)) {
            w.fatal = std::string("mkdtemp: ") + strerror(errno);
            return;
        }
        w.dir = tmpl;
        std::filesystem::path conf = w.dir / "links.conf";
        std::ofstream(conf) << kDevName << " netdev lo addr " << kDevAddr << kLinkOptions << "\n";
        // Must precede the first ibv_get_device_list(): the engine reads it once.
        setenv("SROCE_CONFIG", conf.c_str(), 1);
        unsetenv("SROCE_FAULT");

        int n = 0;
        ibv_device **list = ibv_get_device_list(&n);
        ibv_device *dev = nullptr;
        for (int i = 0; list && i < n; i++)
            if (std::strcmp(ibv_get_device_name(list[i]), kDevName) == 0) dev = list[i];
        if (!dev) {
            w.fatal = std::string("no device ") + kDevName +
                      " in ibv_get_device_list(): is the test linked against libsroce.so?";
            if (list) ibv_free_device_list(list);
            return;
        }
        errno = 0;
        w.ctx = ibv_open_device(dev);
        ibv_free_device_list(list);
        if (!w.ctx) {
            if (errno == EADDRINUSE || errno == EADDRNOTAVAIL)
                w.skip = std::string(kDevAddr) + ":4791 unavailable: " + strerror(errno);
            else
                w.fatal = std::string("ibv_open_device: ") + strerror(errno);
            return;
        }
        w.pd = ibv_alloc_pd(w.ctx);
        w.buf = static_cast<uint8_t *>(
            mmap(nullptr, kMrLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        w.noread = static_cast<uint8_t *>(
            mmap(nullptr, kNoReadLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (!w.pd || w.buf == MAP_FAILED || w.noread == MAP_FAILED) {
            w.fatal = "cannot allocate a PD or buffers";
            return;
        }
        w.mr =
            ibv_reg_mr(w.pd, w.buf, kMrLen,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_FLUSH_GLOBAL);
        w.mr_noread = ibv_reg_mr(w.pd, w.noread, kNoReadLen,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!w.mr || !w.mr_noread) w.fatal = std::string("ibv_reg_mr: ") + strerror(errno);
    }

    void TearDown() override {
        World &w = world();
        if (w.mr) ibv_dereg_mr(w.mr);
        if (w.mr_noread) ibv_dereg_mr(w.mr_noread);
        if (w.pd) ibv_dealloc_pd(w.pd);
        if (w.ctx) ibv_close_device(w.ctx);
        if (w.buf && w.buf != MAP_FAILED) munmap(w.buf, kMrLen);
        if (w.noread && w.noread != MAP_FAILED) munmap(w.noread, kNoReadLen);
        for (int fd : {w.peer.fd, w.stranger.fd, w.peer_alt.fd, w.tap})
            if (fd >= 0) close(fd);
        std::error_code ec;
        if (!w.dir.empty()) std::filesystem::remove_all(w.dir, ec);
    }
};

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(new Env);

// One packet received by the fake peer, decoded and checked.
struct Rx {
    Bytes raw;
    uint8_t opcode = 0;
    uint32_t qpn = 0, psn = 0;
    bool ackreq = false;
    uint8_t pad = 0;
    uint16_t pkey = 0;
    uint8_t syndrome = 0;
    uint32_t msn = 0;
    uint64_t orig = 0;
    uint64_t va = 0;
    uint32_t rkey = 0, dma_len = 0;
    uint64_t swap_add = 0, compare = 0;
    Bytes payload;
    bool legacy_icrc = false; // a FLUSH with Linux rxe's ICRC form (icrc.hpp)
    int tclass = -1;          // the TOS byte it was sent with (-1: not known, on UDP)

    std::string str() const {
        const char *n = op_info(opcode).name;
        std::string s = n ? n : "opcode " + hex(opcode);
        s += " psn " + hex(psn);
        if (op_info(opcode).aeth) s += " syndrome " + hex(syndrome) + " msn " + hex(msn);
        return s;
    }
};

// ---------------------------------------------------------------------------
// Packet construction

Bytes reth(uint64_t va, uint32_t rkey, uint32_t len) {
    Bytes b(kRethLen);
    put64(b.data(), va);
    put32(b.data() + 8, rkey);
    put32(b.data() + 12, len);
    return b;
}

Bytes atomic_eth(uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
    Bytes b(kAtomicEthLen);
    put64(b.data(), va);
    put32(b.data() + 8, rkey);
    put64(b.data() + 12, swap_add);
    put64(b.data() + 20, compare);
    return b;
}

Bytes aeth_bytes(uint8_t syndrome, uint32_t msn) {
    Bytes b(kAethLen);
    aeth::build(b.data(), syndrome, msn);
    return b;
}

Bytes cat(const Bytes &a, const Bytes &b) {
    Bytes r = a;
    r.insert(r.end(), b.begin(), b.end());
    return r;
}

Bytes pattern(size_t n, uint8_t seed) {
    Bytes b(n);
    for (size_t i = 0; i < n; i++)
        b[i] = uint8_t(seed + i * 13 + (i >> 8));
    return b;
}

// BTH + ext + payload + pad + ICRC, sealed as sent from `src`:`sport`.
Bytes packet(uint8_t op, uint32_t qpn, uint32_t psn, const Bytes &ext, const Bytes &payload,
             bool ackreq = true, uint16_t pkey = kDefaultPkey, const char *src = kPeerAddr,
             uint16_t sport = kRoceV2Port, uint16_t ip_id = 0) {
    uint32_t pad = (4 - (payload.size() & 3)) & 3;
    // Sized once: growing a 12-byte vector by inserts makes GCC 12 at -O3
    // report a false -Warray-bounds in the inlined copy.
    Bytes p(kBthLen + ext.size() + payload.size() + pad + kIcrcLen);
    bth::build(p.data(), op, false, uint8_t(pad), pkey, qpn, ackreq, psn);
    auto tail = std::copy(ext.begin(), ext.end(), p.begin() + kBthLen);
    std::copy(payload.begin(), payload.end(), tail);
    IpHeader ip{IpAddr::v4(ip4(src)), IpAddr::v4(ip4(kDevAddr)), sport, kRoceV2Port};
    ip.ip_id = ip_id;
    icrc_store(p.data() + p.size() - kIcrcLen, icrc_compute(ip, p.data(), p.size()));
    return p;
}

// `p` (from the peer) with its BTH's resv7 set to `resv7`, sealed again:
// what an sroce peer announces of itself (wire-protocol.md §3.3.1).
Bytes with_resv7(Bytes p, uint8_t resv7) {
    p[8] = uint8_t((p[8] & 0x80) | (resv7 & 0x7F));
    IpHeader ip{IpAddr::v4(ip4(kPeerAddr)), IpAddr::v4(ip4(kDevAddr)), kRoceV2Port, kRoceV2Port};
    icrc_store(p.data() + p.size() - kIcrcLen, icrc_compute(ip, p.data(), p.size()));
    return p;
}

// The announcement of an sroce end: tagged, selective repeat, native commits.
constexpr uint8_t kSroceEnd =
    bth::kAnnounceTag | bth::kAnnounceSelectiveRepeat | bth::kAnnounceNative;

// Re-seals `p` with Linux rxe's FLUSH ICRC: after the standard coverage the
// CRC runs over the packet's bytes before the ICRC once more.
void seal_legacy(Bytes &p, const char *src, uint16_t sport, uint16_t ip_id) {
    size_t body = p.size() - kIcrcLen;
    Bytes covered(p.begin(), p.begin() + long(body));
    covered.insert(covered.end(), p.begin(), p.end());
    IpHeader ip{IpAddr::v4(ip4(src)), IpAddr::v4(ip4(kDevAddr)), sport, kRoceV2Port};
    ip.ip_id = ip_id;
    uint32_t crc = icrc_begin(ip, p.size(), covered.data());
    crc = icrc_update(crc, covered.data() + kBthLen, covered.size() - kBthLen - kIcrcLen);
    icrc_store(p.data() + body, icrc_final(crc));
}

uint16_t port_of(const Endpoint &e) {
    if (e.fd < 0) return e.port;
    sockaddr_in sa{};
    socklen_t l = sizeof sa;
    getsockname(e.fd, reinterpret_cast<sockaddr *>(&sa), &l);
    return ntohs(sa.sin_port);
}

// `tclass`: the TOS byte the datagram arrives with (in memory only).
void send_raw(const Endpoint &e, const Bytes &p, uint8_t tclass = 0) {
    if (e.fd < 0) {
        ASSERT_EQ(
            sroce_memwire_send(ip4(e.addr), e.port, ip4(kDevAddr), p.data(), p.size(), 0, tclass),
            0);
        return;
    }
    int fd = e.fd;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(kRoceV2Port);
    to.sin_addr.s_addr = ip4(kDevAddr);
    ssize_t r = sendto(fd, p.data(), p.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof to);
    ASSERT_EQ(r, ssize_t(p.size())) << strerror(errno);
}

// Receives one datagram on `fd` within `ms`, and checks what every sroce
// packet must satisfy: sent from the device address, a valid header,
// addressed to the peer QP, and a valid ICRC computed with the IP ID the
// kernel gave it — in Linux rxe's FLUSH form only where the caller allows it.
// From the device socket (port 4791) that is the packet's place in its
// segmentation-offload send; from a connected socket its counter: one more
// per datagram, and a run's segments that, +1, … (wire-protocol.md §1.1).
constexpr int kMaxIdGap = 16;

// The same datagram as lo carried it (World::tap): its ICRC must be right
// for the IP ID in its real header, and that ID the one solved for.  lo
// carries a segmentation-offload send whole (the receiving socket gets it
// cut up): a datagram found at offset o of one is its k-th segment, for a k
// that divides o into segments at least as long as it, and has ID base + k.
void check_wire_header(const Bytes &udp, uint16_t solved) {
    World &w = world();
    if (w.tap < 0) return;
    // The last frame read may hold this datagram's segment too.
    static uint8_t f[65536];
    static ssize_t n = 0;
    for (bool fresh = false;; fresh = true) {
        pollfd pf{w.tap, POLLIN, 0};
        if (fresh && (poll(&pf, 1, 1000) <= 0 || (n = recv(w.tap, f, sizeof f, 0)) < 0)) {
            // A packet socket may drop what it has no room for: a capture
            // that missed the datagram is no fault of sroce's.
            n = 0;
            fprintf(stderr, "note: a datagram to the peer was not seen on lo; not checked\n");
            return;
        }
        const uint8_t *payload = f + 28, *end = f + n;
        const uint8_t *at = n > 28 ? std::search(payload, end, udp.begin(), udp.end()) : end;
        if (at == end) continue; // an earlier datagram
        in_addr_t src, dst;
        std::memcpy(&src, f + 12, 4);
        std::memcpy(&dst, f + 16, 4);
        IpHeader ip{IpAddr::v4(src), IpAddr::v4(dst), 0, 0};
        ip.sport = get16(f + 20);
        ip.dport = get16(f + 22);
        ip.df = f[6] & 0x40;
        size_t o = size_t(at - payload);
        uint32_t want = icrc_load(udp.data() + udp.size() - 4);
        bool matched = false;
        for (size_t k = 0; k < kMaxSegments && !matched; k++) {
            if (k ? (o % k || o / k < udp.size()) : o != 0) continue;
            ip.ip_id = uint16_t(get16(f + 4) + k);
            matched = icrc_compute(ip, udp.data(), udp.size()) == want;
        }
        EXPECT_TRUE(matched) << "ICRC wrong for the IP ID the datagram carried (send's first: "
                             << get16(f + 4) << ", offset " << o << ")";
        if (matched) {
            EXPECT_EQ(ip.ip_id, solved);
        }
        return;
    }
}

// The next datagram to `e` within `ms`, with the header fields its ICRC
// covers (the IP ID only where the wire tells it: in memory).
std::optional<Rx> next_datagram(const Endpoint &e, int ms, IpHeader &ip, bool &id_known) {
    Rx rx;
    rx.raw.resize(65536);
    if (e.fd < 0) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        sroce_memwire_header h{};
        long n;
        while ((n = sroce_memwire_take(ip4(e.addr), rx.raw.data(), rx.raw.size(), &h)) < 0) {
            if (std::chrono::steady_clock::now() >= end) return std::nullopt;
            usleep(100);
        }
        rx.raw.resize(size_t(n));
        ip = {IpAddr::v4(h.src), IpAddr::v4(h.dst), h.sport, h.dport, h.ip_id};
        rx.tclass = h.tclass;
        id_known = true;
        return rx;
    }
    pollfd p{e.fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return std::nullopt;
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n =
        recvfrom(e.fd, rx.raw.data(), rx.raw.size(), 0, reinterpret_cast<sockaddr *>(&from), &fl);
    if (n < 0) {
        ADD_FAILURE() << "recvfrom: " << strerror(errno);
        return std::nullopt;
    }
    rx.raw.resize(size_t(n));
    sockaddr_in self{};
    socklen_t sl = sizeof self;
    getsockname(e.fd, reinterpret_cast<sockaddr *>(&self), &sl);
    ip = {IpAddr::v4(from.sin_addr.s_addr), IpAddr::v4(self.sin_addr.s_addr), ntohs(from.sin_port),
          ntohs(self.sin_port)};
    id_known = false;
    return rx;
}

std::optional<Rx> receive(const Endpoint &at, int ms, bool legacy_ok = false) {
    IpHeader ip{};
    bool id_known = false;
    std::optional<Rx> got = next_datagram(at, ms, ip, id_known);
    if (!got) return std::nullopt;
    Rx rx = std::move(*got);
    EXPECT_EQ(ip.src, IpAddr::v4(ip4(kDevAddr)));
    uint16_t sport = ip.sport;
    Packet pkt;
    ParseError e = parse(rx.raw.data(), rx.raw.size(), pkt);
    if (e != ParseError::kOk) {
        ADD_FAILURE() << "sroce sent a malformed packet: " << parse_error_str(e);
        return std::nullopt;
    }
    uint16_t wire_id = ip.ip_id;
    uint16_t id = 0xFFFF;
    bool valid = true;
    if (icrc_verify(ip, rx.raw.data(), rx.raw.size(), &id)) {
    } else if (pkt.opcode == kFlush &&
               icrc_verify_flush_legacy(ip, rx.raw.data(), rx.raw.size(), &id)) {
        rx.legacy_icrc = true;
        EXPECT_TRUE(legacy_ok) << "FLUSH in Linux rxe's ICRC form";
    } else {
        ADD_FAILURE() << "bad ICRC from sroce";
        valid = false;
    }
    if (valid && !rx.legacy_icrc) check_wire_header(rx.raw, id);
    if (valid && id_known) {
        EXPECT_EQ(id, wire_id) << "ICRC computed for another IP ID than the packet's";
    }
    // The kernel cut segmentation-offload sends up for this socket (no
    // UDP_GRO here).
    if (!valid) {
    } else if (sport == kRoceV2Port) {
        EXPECT_LT(id, kMaxSegments) << "ICRC computed for an IP ID sroce never sends";
    } else {
        // Above the highest ID before it by one, or by a few more when
        // datagrams did not reach this socket (lost, or sroce's own reads of
        // the counter, which take an ID each); below it by less than a run.
        static std::map<uint16_t, uint16_t> highest; // per connected socket
        auto [it, first] = highest.try_emplace(sport, id);
        int d = int16_t(uint16_t(id - it->second));
        EXPECT_TRUE(first || (d >= 1 - int(kMaxSegments) && d <= kMaxIdGap))
            << "IP ID " << id << " after " << it->second << ": not the socket's counter";
        if (d > 0) it->second = id;
    }
    const uint8_t *h = rx.raw.data();
    EXPECT_EQ(bth::tver(h), 0);
    // Only a CNP sets BECN.
    EXPECT_EQ(h[4], pkt.opcode == kCnp ? bth::kBecn : 0) << "FECN/BECN/reserved bits";
    rx.opcode = pkt.opcode;
    rx.qpn = pkt.qpn;
    rx.psn = pkt.psn;
    rx.ackreq = pkt.ackreq;
    rx.pad = bth::pad(h);
    rx.pkey = bth::pkey(h);
    EXPECT_EQ(rx.pkey, kDefaultPkey);
    EXPECT_EQ(rx.qpn, kPeerQpn);
    const OpInfo &o = *pkt.info;
    if (o.aeth) {
        rx.syndrome = pkt.syndrome();
        rx.msn = pkt.msn();
    }
    if (o.atomic_ack_eth) rx.orig = pkt.orig();
    if (o.reth) {
        rx.va = pkt.va();
        rx.rkey = pkt.rkey();
        rx.dma_len = pkt.dma_len();
    }
    if (o.atomic_eth) {
        rx.va = pkt.atomic_va();
        rx.rkey = pkt.atomic_rkey();
        rx.swap_add = pkt.swap_add();
        rx.compare = pkt.compare();
    }
    rx.payload.assign(pkt.payload, pkt.payload + pkt.payload_len);
    // Pad bytes are zero.
    for (uint8_t i = 0; i < rx.pad; i++)
        EXPECT_EQ(pkt.payload[pkt.payload_len + i], 0);
    return rx;
}

void drain(const Endpoint &e) {
    uint8_t b[65536];
    if (e.fd < 0) {
        while (sroce_memwire_take(ip4(e.addr), b, sizeof b, nullptr) >= 0) {
        }
        return;
    }
    while (recv(e.fd, b, sizeof b, MSG_DONTWAIT) >= 0) {
    }
}

// ---------------------------------------------------------------------------
// Fixture: a fresh QP connected to the fake peer for every test.

class FakePeer : public ::testing::Test {
  protected:
    World &w = world();
    ibv_cq *cq = nullptr;
    ibv_qp *qp = nullptr;
    uint32_t qpn = 0;

    void SetUp() override {
        if (!w.fatal.empty()) FAIL() << w.fatal;
        if (!w.skip.empty()) GTEST_SKIP() << w.skip;
        for (const Endpoint *e : {&w.peer, &w.stranger, &w.peer_alt})
            drain(*e);
        drain_async_events();
        std::memset(w.buf, 0xEE, kMrLen);
        std::memset(w.noread, 0xDD, kNoReadLen);
        cq = ibv_create_cq(w.ctx, 256, nullptr, nullptr, 0);
        ASSERT_NE(cq, nullptr) << strerror(errno);
        ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn));
    }

    void TearDown() override {
        // Like libibverbs, events must be acknowledged while their QP lives.
        if (w.ctx) drain_async_events();
        if (qp) ibv_destroy_qp(qp);
        if (cq) ibv_destroy_cq(cq);
        qp = nullptr;
        cq = nullptr;
    }

    void create_qp(uint32_t rq_psn, uint32_t sq_psn, uint8_t timeout = 0,
                   unsigned extra_access = 0) {
        if (qp) {
            drain_async_events();
            ibv_destroy_qp(qp);
        }
        ASSERT_NO_FATAL_FAILURE(new_qp());
        ASSERT_NO_FATAL_FAILURE(connect_qp(rq_psn, sq_psn, timeout, extra_access));
    }

    void new_qp() {
        ibv_qp_init_attr_ex ia{};
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = 64;
        ia.cap.max_recv_wr = 64;
        ia.cap.max_send_sge = 4;
        ia.cap.max_recv_sge = 4;
        ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        ia.pd = w.pd;
        ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
                            IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_COMMIT |
                            IBV_QP_EX_WITH_FLUSH;
        qp = ibv_create_qp_ex(w.pd->context, &ia);
        ASSERT_NE(qp, nullptr) << strerror(errno);
        qpn = qp->qp_num;
    }

    // The address vector of the fake peer: its IPv4-mapped GID from the
    // device's GID 1.
    static ibv_ah_attr peer_ah() {
        ibv_ah_attr ah{};
        ah.is_global = 1;
        ah.port_num = 1;
        ah.grh.sgid_index = 1;
        ah.grh.hop_limit = 64;
        ah.grh.dgid.raw[10] = ah.grh.dgid.raw[11] = 0xFF;
        in_addr_t peer = ip4(kPeerAddr);
        std::memcpy(ah.grh.dgid.raw + 12, &peer, 4);
        return ah;
    }

    // Takes the QP from RESET to RTS, connected to the fake peer.
    void connect_qp(uint32_t rq_psn, uint32_t sq_psn, uint8_t timeout = 0,
                    unsigned extra_access = 0) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | extra_access;
        ASSERT_EQ(ibv_modify_qp(
                      qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                  0);
        a = {};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = kPeerQpn;
        a.rq_psn = rq_psn;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = kMinRnrTimer;
        a.ah_attr = peer_ah();
        ASSERT_EQ(ibv_modify_qp(qp, &a,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                    IBV_QP_MIN_RNR_TIMER),
                  0);
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        a.timeout = timeout; // 0: no retransmission timer, so tests see only what they cause
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        ASSERT_EQ(ibv_modify_qp(qp, &a,
                                IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
                  0);
    }

    ibv_qp_state qp_state() {
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
        return a.qp_state;
    }

    uint64_t va(size_t off) const { return uint64_t(uintptr_t(w.buf + off)); }
    uint32_t rkey() const { return w.mr->rkey; }

    Bytes write_only(uint32_t psn, size_t off, const Bytes &data, bool ackreq = true) {
        return packet(kWriteOnly, qpn, psn, reth(va(off), rkey(), uint32_t(data.size())), data,
                      ackreq);
    }

    // A FLUSH to this QP sealed as Linux rxe 6.2+ seals it: from an
    // ephemeral port (peer_alt) with IP ID `ip_id`.
    Bytes legacy_flush(uint32_t psn, const Bytes &ext, uint16_t ip_id) {
        Bytes p = packet(kFlush, qpn, psn, ext, {});
        seal_legacy(p, kPeerAddr, port_of(w.peer_alt), ip_id);
        return p;
    }

    // An empty READ RESPONSE ONLY acknowledging the FLUSH at `psn`.
    Bytes flush_response(uint32_t psn, uint32_t msn) {
        return packet(kReadRespOnly, qpn, psn, aeth_bytes(aeth::kAck | aeth::kNoCredits, msn), {},
                      false);
    }

    void post_flush(uint64_t wr_id) {
        ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
        ASSERT_NE(qpx, nullptr);
        ibv_wr_start(qpx);
        qpx->wr_id = wr_id;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_flush(qpx, 0xAABBCCDD, 0x10000, 64, IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE);
        ASSERT_EQ(ibv_wr_complete(qpx), 0);
    }

    // sroce's next transmission of the FLUSH at `psn`, in the form wanted.
    void expect_flush(uint32_t psn, bool legacy, int n) {
        std::optional<Rx> r = reply(kReplyMs, true);
        ASSERT_TRUE(r) << "transmission " << n;
        ASSERT_EQ(r->opcode, kFlush) << r->str();
        EXPECT_EQ(r->psn, psn) << "transmission " << n;
        EXPECT_EQ(r->legacy_icrc, legacy) << "transmission " << n;
    }

    void expect_success(uint64_t wr_id) {
        std::optional<ibv_wc> wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
        EXPECT_EQ(wc->wr_id, wr_id);
    }

    // The engine touches MR memory under Qp::mu.  Taking that lock (as
    // ibv_query_qp does) orders its accesses with ours in a way
    // ThreadSanitizer can see; a datagram through the kernel is invisible to it.
    void fence() {
        if (!qp) return;
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
    }

    void send(const Bytes &p) {
        fence();
        send_raw(w.peer, p);
    }
    std::optional<Rx> reply(int ms = kReplyMs, bool legacy_ok = false) {
        std::optional<Rx> r = receive(w.peer, ms, legacy_ok);
        fence();
        return r;
    }

    // Nothing at all reaches the peer (or the stranger) for a while.
    void expect_silence(int ms = kSilenceMs) {
        for (const Endpoint *e : {&w.peer, &w.stranger}) {
            std::optional<Rx> r = receive(*e, e == &w.peer ? ms : 0);
            EXPECT_FALSE(r) << "unexpected " << r->str();
        }
    }

    void expect_ack(uint32_t psn, std::optional<uint32_t> msn = std::nullopt) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "no ACK for PSN " << hex(psn);
        EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck) << r->str();
        EXPECT_EQ(r->psn, psn) << r->str();
        if (msn) {
            EXPECT_EQ(r->msn, *msn) << r->str();
        }
    }

    void expect_nak(uint8_t syndrome, uint32_t psn) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "no NAK " << hex(syndrome) << " for PSN " << hex(psn);
        EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
        EXPECT_EQ(r->syndrome, syndrome) << r->str();
        EXPECT_EQ(r->psn, psn) << r->str();
    }

    // A valid WRITE at `psn` is acknowledged and lands byte-exact.
    void expect_qp_works(uint32_t psn, size_t off = 0x8000) {
        Bytes data = pattern(40, uint8_t(psn));
        send(write_only(psn, off, data));
        ASSERT_NO_FATAL_FAILURE(expect_ack(psn));
        EXPECT_EQ(0, std::memcmp(w.buf + off, data.data(), data.size()));
        EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    }

    // The bytes at `off` still hold the fill pattern from SetUp.
    void expect_untouched(size_t off, size_t len) {
        fence();
        for (size_t i = 0; i < len; i++)
            ASSERT_EQ(w.buf[off + i], 0xEE) << "byte " << off + i << " was written";
    }

    // Sends a datagram that must be dropped silently, then shows the QP is
    // unharmed.
    void expect_dropped(const Bytes &bad, const Endpoint *from = nullptr) {
        fence();
        send_raw(from ? *from : w.peer, bad);
        expect_silence();
        EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    }

    std::optional<ibv_wc> poll_wc(int ms = kReplyMs) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        do {
            ibv_wc wc{};
            int n = ibv_poll_cq(cq, 1, &wc);
            if (n < 0) {
                ADD_FAILURE() << "ibv_poll_cq: " << n;
                return std::nullopt;
            }
            if (n == 1) return wc;
            usleep(200);
        } while (std::chrono::steady_clock::now() < end);
        return std::nullopt;
    }

    void drain_async_events() {
        pollfd p{w.ctx->async_fd, POLLIN, 0};
        while (poll(&p, 1, 0) > 0) {
            ibv_async_event ev;
            if (ibv_get_async_event(w.ctx, &ev)) break;
            ibv_ack_async_event(&ev);
        }
    }

    // The first async event within `ms`, if any.
    std::optional<ibv_async_event> async_event(int ms = kReplyMs) {
        pollfd p{w.ctx->async_fd, POLLIN, 0};
        if (poll(&p, 1, ms) <= 0) return std::nullopt;
        ibv_async_event ev;
        if (ibv_get_async_event(w.ctx, &ev)) return std::nullopt;
        ibv_async_event copy = ev;
        ibv_ack_async_event(&ev);
        return copy;
    }

    void expect_fatal_nak(uint8_t syndrome, uint32_t psn, ibv_event_type event) {
        ASSERT_NO_FATAL_FAILURE(expect_nak(syndrome, psn));
        EXPECT_EQ(qp_state(), IBV_QPS_ERR);
        std::optional<ibv_async_event> ev = async_event();
        ASSERT_TRUE(ev) << "no async event";
        EXPECT_EQ(ev->event_type, event);
        EXPECT_EQ(ev->element.qp, qp);
        // A QP in error answers nothing.
        send(write_only(psn_add(psn, 1), 0x8000, pattern(8, 1)));
        expect_silence();
    }

    // Requester side: the sroce QP sends to the fake peer.
    void post(ibv_wr_opcode op, uint64_t wr_id, size_t off, uint32_t len, uint64_t remote,
              uint32_t remote_key, uint64_t compare_add = 0, uint64_t swap = 0) {
        ibv_sge sge{uint64_t(uintptr_t(w.buf + off)), len, w.mr->lkey};
        ibv_send_wr wr{};
        wr.wr_id = wr_id;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = op;
        wr.send_flags = IBV_SEND_SIGNALED;
        if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
            wr.wr.atomic.remote_addr = remote;
            wr.wr.atomic.rkey = remote_key;
            wr.wr.atomic.compare_add = compare_add;
            wr.wr.atomic.swap = swap;
        } else {
            wr.wr.rdma.remote_addr = remote;
            wr.wr.rdma.rkey = remote_key;
        }
        ibv_send_wr *bad = nullptr;
        ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
    }

    // An ordered write-commit with immediate data 0x1234 of the buffer's
    // first 99 bytes to R_Key 0xAABBCCDD, VA 0x10000.
    void post_commit_imm(uint64_t wr_id) {
        ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
        ASSERT_NE(qpx, nullptr);
        ibv_wr_start(qpx);
        qpx->wr_id = wr_id;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ASSERT_EQ(ibv_wr_rdma_write_commit_imm(qpx, 0xAABBCCDD, 0x10000, IBV_WRITE_COMMIT_ORDERED,
                                               htonl(0x1234)),
                  0);
        ibv_wr_set_sge(qpx, w.mr->lkey, uint64_t(uintptr_t(w.buf)), 99);
        ASSERT_EQ(ibv_wr_complete(qpx), 0);
    }

    void post_recv(uint64_t wr_id, size_t off, uint32_t len) {
        ibv_sge sge{uint64_t(uintptr_t(w.buf + off)), len, w.mr->lkey};
        ibv_recv_wr wr{};
        wr.wr_id = wr_id;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr *bad = nullptr;
        ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
    }

    // Responses from the fake peer to the sroce requester.
    Bytes ack(uint32_t psn, uint8_t syndrome = aeth::kAck | aeth::kNoCredits, uint32_t msn = 1,
              const char *src = kPeerAddr) {
        return packet(kAcknowledge, qpn, psn, aeth_bytes(syndrome, msn), {}, false, kDefaultPkey,
                      src);
    }
};

// Far beyond any real CLOCK_MONOTONIC, so that nothing the device stamped
// before the test is in its future.
constexpr uint64_t kClockT0 = 100'000'000'000'000'000ull;

// The fake peer with the device on a clock the test moves: timers fire
// only when it does.  The device looks at its timers once more than
// 500 µs of it have passed (Nic::kTimerScanNs).
class FakePeerOnClock : public FakePeer {
  protected:
    uint64_t now = kClockT0;

    void SetUp() override {
        sroce_memwire_clock(kClockT0);
        FakePeer::SetUp();
    }
    void TearDown() override {
        FakePeer::TearDown();
        sroce_memwire_clock(0);
    }

    void advance(uint64_t ns) {
        now += ns;
        sroce_memwire_clock(now);
    }
};

} // namespace fake_peer
