// SPDX-License-Identifier: MIT
//
// sroce against a fake peer: the test opens an sroce device at 127.0.2.1,
// connects an RC QP to 127.0.2.2, and plays the peer itself from a plain UDP
// socket bound there, crafting every RoCEv2 packet with the codec and
// checking each answer byte by byte.  This reaches the error paths two
// well-behaved sroce endpoints never exercise: malformed and forged packets,
// sequence errors, duplicates, access violations, bogus responses.
//
// The expected treatment is the IBTA one (and Linux rxe's): header and ICRC
// errors are dropped silently, PSN gaps get one NAK, duplicates are answered
// without re-executing, access errors get a NAK and move the QP to error.
#include "icrc.hpp"
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

namespace {

using namespace sroce;
using namespace sroce::wire;
using Bytes = std::vector<uint8_t>;

// Private to this test: other tests running concurrently use other addresses.
constexpr const char *kDevName = "sroce_badin";
constexpr const char *kDevAddr = "127.0.2.1";
constexpr const char *kPeerAddr = "127.0.2.2";
constexpr const char *kStrangerAddr = "127.0.2.3";
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
    int peer = -1;     // 127.0.2.2:4791, the connected peer
    int stranger = -1; // 127.0.2.3:4791, not the peer
    int peer_alt = -1; // 127.0.2.2 on an ephemeral port, as rxe's hashed source ports
    // A packet socket on lo that sees what reaches the peer with its IPv4
    // header, the IP ID included (needs CAP_NET_RAW; -1 without).
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
        w.peer = udp_socket(kPeerAddr, kRoceV2Port);
        if (w.peer < 0) {
            w.skip = std::string("cannot bind ") + kPeerAddr + ":4791: " + strerror(errno);
            return;
        }
        w.stranger = udp_socket(kStrangerAddr, kRoceV2Port);
        w.peer_alt = udp_socket(kPeerAddr, 0);
        w.tap = open_tap();
        if (w.tap < 0)
            fprintf(stderr,
                    "no packet socket on lo (%s): the IP IDs sroce sends are not "
                    "checked against their headers\n",
                    strerror(errno));
        if (w.stranger < 0 || w.peer_alt < 0) {
            w.skip = std::string("cannot bind a loopback UDP socket: ") + strerror(errno);
            return;
        }
        char tmpl[] = "/tmp/sroce-badinput-XXXXXX";
        if (!mkdtemp(tmpl)) {
            w.fatal = std::string("mkdtemp: ") + strerror(errno);
            return;
        }
        w.dir = tmpl;
        std::filesystem::path conf = w.dir / "links.conf";
        std::ofstream(conf) << kDevName << " netdev lo addr " << kDevAddr << "\n";
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
        for (int fd : {w.peer, w.stranger, w.peer_alt, w.tap})
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
    Ipv4Header ip{ip4(src), ip4(kDevAddr), sport, kRoceV2Port};
    ip.ip_id = ip_id;
    icrc_store(p.data() + p.size() - kIcrcLen, icrc_compute(ip, p.data(), p.size()));
    return p;
}

// Re-seals `p` with Linux rxe's FLUSH ICRC: after the standard coverage the
// CRC runs over the packet's bytes before the ICRC once more.
void seal_legacy(Bytes &p, const char *src, uint16_t sport, uint16_t ip_id) {
    size_t body = p.size() - kIcrcLen;
    Bytes covered(p.begin(), p.begin() + long(body));
    covered.insert(covered.end(), p.begin(), p.end());
    Ipv4Header ip{ip4(src), ip4(kDevAddr), sport, kRoceV2Port};
    ip.ip_id = ip_id;
    uint32_t crc = icrc_begin(ip, p.size(), covered.data());
    crc = icrc_update(crc, covered.data() + kBthLen, covered.size() - kBthLen - kIcrcLen);
    icrc_store(p.data() + body, icrc_final(crc));
}

uint16_t port_of(int fd) {
    sockaddr_in sa{};
    socklen_t l = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &l);
    return ntohs(sa.sin_port);
}

void send_raw(int fd, const Bytes &p) {
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
        Ipv4Header ip{};
        std::memcpy(&ip.src, f + 12, 4);
        std::memcpy(&ip.dst, f + 16, 4);
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

std::optional<Rx> receive(int fd, int ms, bool legacy_ok = false) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return std::nullopt;
    Rx rx;
    rx.raw.resize(65536);
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n =
        recvfrom(fd, rx.raw.data(), rx.raw.size(), 0, reinterpret_cast<sockaddr *>(&from), &fl);
    if (n < 0) {
        ADD_FAILURE() << "recvfrom: " << strerror(errno);
        return std::nullopt;
    }
    rx.raw.resize(size_t(n));
    EXPECT_EQ(from.sin_addr.s_addr, ip4(kDevAddr));
    uint16_t sport = ntohs(from.sin_port);
    sockaddr_in self{};
    socklen_t sl = sizeof self;
    getsockname(fd, reinterpret_cast<sockaddr *>(&self), &sl);
    Packet pkt;
    ParseError e = parse(rx.raw.data(), rx.raw.size(), pkt);
    if (e != ParseError::kOk) {
        ADD_FAILURE() << "sroce sent a malformed packet: " << parse_error_str(e);
        return std::nullopt;
    }
    Ipv4Header ip{from.sin_addr.s_addr, self.sin_addr.s_addr, ntohs(from.sin_port),
                  ntohs(self.sin_port)};
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
    EXPECT_EQ(h[4], 0) << "FECN/BECN/reserved bits set";
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

void drain(int fd) {
    uint8_t b[65536];
    while (recv(fd, b, sizeof b, MSG_DONTWAIT) >= 0) {
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
        for (int fd : {w.peer, w.stranger, w.peer_alt})
            drain(fd);
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
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xFF;
        in_addr_t peer = ip4(kPeerAddr);
        std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer, 4);
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
        for (int fd : {w.peer, w.stranger}) {
            std::optional<Rx> r = receive(fd, fd == w.peer ? ms : 0);
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
    void expect_dropped(const Bytes &bad, int fd = -1) {
        fence();
        send_raw(fd < 0 ? w.peer : fd, bad);
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

// ---------------------------------------------------------------------------
// Responder: valid requests

TEST_F(FakePeer, WriteOnlyIsAckedWithPsnAndMsnAndLands) {
    Bytes a = pattern(64, 1), b = pattern(1000, 2);
    send(write_only(kRqPsn, 0x100, a));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x100, a.data(), a.size()));
    expect_untouched(0x100 + a.size(), 64);
    expect_untouched(0x100 - 64, 64);
    send(write_only(kRqPsn + 1, 0x1000, b));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 1, 2));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x1000, b.data(), b.size()));
    // Odd length: the pad is stripped, not written.
    Bytes c = pattern(13, 3);
    send(write_only(kRqPsn + 2, 0x3000, c));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 2, 3));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x3000, c.data(), c.size()));
    expect_untouched(0x3000 + c.size(), 8);
    expect_silence();
}

TEST_F(FakePeer, MultiPacketWriteAcrossThePsnWrap) {
    ASSERT_NO_FATAL_FAILURE(create_qp(0xFFFFFE, kSqPsn));
    Bytes data = pattern(3 * kMtu, 9);
    uint32_t p0 = 0xFFFFFE;
    send(packet(kWriteFirst, qpn, p0, reth(va(0x4000), rkey(), uint32_t(data.size())),
                Bytes(data.begin(), data.begin() + kMtu), false));
    send(packet(kWriteMiddle, qpn, psn_add(p0, 1), {},
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    send(packet(kWriteLast, qpn, psn_add(p0, 2), {}, Bytes(data.begin() + 2 * kMtu, data.end())));
    ASSERT_NO_FATAL_FAILURE(expect_ack(0x000000, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x4000, data.data(), data.size()));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(0x000001));
}

TEST_F(FakePeer, SendOnlyFillsThePostedReceive) {
    ASSERT_NO_FATAL_FAILURE(post_recv(77, 0x2000, 256));
    Bytes data = pattern(100, 4);
    send(packet(kSendOnly, qpn, kRqPsn, {}, data));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 77u);
    EXPECT_EQ(wc->opcode, IBV_WC_RECV);
    EXPECT_EQ(wc->byte_len, 100u);
    EXPECT_EQ(wc->src_qp, kPeerQpn);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x2000, data.data(), data.size()));
}

// rxe picks a source port per QP and a fresh IP ID per packet: both must be
// accepted from the connected address.
TEST_F(FakePeer, RxeStyleSourcePortAndIpIdAreAccepted) {
    sockaddr_in sa{};
    socklen_t sl = sizeof sa;
    getsockname(w.peer_alt, reinterpret_cast<sockaddr *>(&sa), &sl);
    Bytes data = pattern(48, 5);
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x500), rkey(), 48), data, true, kDefaultPkey,
                     kPeerAddr, ntohs(sa.sin_port), 0x3C91);
    send_raw(w.peer_alt, p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    EXPECT_EQ(0, std::memcmp(w.buf + 0x500, data.data(), data.size()));
}

// ---------------------------------------------------------------------------
// Responder: silently dropped input

TEST_F(FakePeer, GarbageIsDropped) {
    std::mt19937 rng(31337);
    for (int i = 0; i < 40; i++) {
        Bytes g(1 + rng() % 300);
        for (uint8_t &b : g)
            b = uint8_t(rng());
        if (i % 2) {
            // Plausible start: a supported opcode, version 0, our QPN.
            g.resize(std::max<size_t>(g.size(), 48));
            g[0] = kWriteOnly;
            g[1] = 0;
            put24(g.data() + 5, qpn);
        }
        send(g);
    }
    expect_silence();
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, TruncatedHeadersAreDropped) {
    Bytes full = write_only(kRqPsn, 0x100, pattern(16, 6));
    for (size_t len = 1; len < kBthLen + kRethLen + kIcrcLen; len++) {
        Bytes cut(full.begin(), full.begin() + long(len));
        send(cut);
        // The same length with an ICRC that is right for what is left.
        if (len >= kBthLen + kIcrcLen) {
            Ipv4Header ip{ip4(kPeerAddr), ip4(kDevAddr), kRoceV2Port, kRoceV2Port};
            icrc_store(cut.data() + len - kIcrcLen, icrc_compute(ip, cut.data(), len));
            send(cut);
        }
    }
    expect_silence();
    expect_untouched(0x100, 16);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, ZeroLengthDatagramIsDropped) {
    ASSERT_NO_FATAL_FAILURE(expect_dropped({}));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, WrongIcrcIsDropped) {
    Bytes good = write_only(kRqPsn, 0x100, pattern(64, 7));
    for (size_t at : {good.size() - 1, good.size() - 4, size_t(0x30), size_t(9), size_t(20)}) {
        Bytes bad = good;
        bad[at] ^= 0x01;
        ASSERT_NO_FATAL_FAILURE(expect_dropped(bad));
    }
    expect_untouched(0x100, 64);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, UnknownQpnIsDropped) {
    for (uint32_t q : {qpn + 1000, uint32_t(0xFFFFFF), 0u, 1u, kPeerQpn}) {
        Bytes p = packet(kWriteOnly, q, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8));
        ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    }
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, UnsupportedOpcodeIsDropped) {
    // Reserved RC codes, UC RDMA WRITE ONLY, UD SEND ONLY, CNP; valid ICRC.
    for (uint8_t op : {0x15, 0x18, 0x1F, 0x2A, 0x64, 0x81}) {
        Bytes p = packet(op, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8));
        ASSERT_NO_FATAL_FAILURE(expect_dropped(p)) << "opcode " << hex(op);
    }
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, NonZeroTransportVersionIsDropped) {
    Bytes p = write_only(kRqPsn, 0x100, pattern(32, 8));
    p[1] |= 0x01;
    Ipv4Header ip{ip4(kPeerAddr), ip4(kDevAddr), kRoceV2Port, kRoceV2Port};
    icrc_store(p.data() + p.size() - 4, icrc_compute(ip, p.data(), p.size()));
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, PacketFromWrongSourceAddressIsDropped) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8), true,
                     kDefaultPkey, kStrangerAddr);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p, w.stranger));
    EXPECT_FALSE(receive(w.stranger, kSilenceMs)) << "sroce answered a stranger";
    expect_untouched(0x100, 32);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

// IBTA 9.6.1.1: a BTH P_Key that matches no entry of the P_Key table (sroce
// has one, the default 0xFFFF) is a header error: drop silently.  The limited
// member form 0x7FFF matches the full member 0xFFFF.
TEST_F(FakePeer, PkeyMismatchIsDropped) {
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 32), pattern(32, 8), true, 0x1234);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(p));
    expect_untouched(0x100, 32);
    Bytes limited =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x200), rkey(), 32), pattern(32, 9), true, 0x7FFF);
    send(limited);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// ---------------------------------------------------------------------------
// Responder: access errors (NAK Remote Access Error, QP to error)

TEST_F(FakePeer, WriteOutsideTheMrNaksRemoteAccessError) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(kMrLen - 4), rkey(), 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(kMrLen - 4, 4);
}

TEST_F(FakePeer, WriteBelowTheMrNaksRemoteAccessError) {
    Bytes p = packet(kWriteOnly, qpn, kRqPsn, reth(va(0) - 4, rkey(), 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0, 4);
}

TEST_F(FakePeer, WriteWithWrongRkeyNaksRemoteAccessError) {
    // Right slot, wrong random high bits: a guessed key must not work.
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey() ^ 0x80000000u, 8), pattern(8, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0x100, 8);
}

TEST_F(FakePeer, WriteWithOverflowingRangeNaksRemoteAccessError) {
    Bytes p =
        packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 0xFFFFFFF0u), pattern(8, 1), true);
    send(p);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    // IBTA allows either: the range check (access error) or the length check.
    EXPECT_TRUE(r->syndrome == (aeth::kNak | aeth::kNakRemoteAccessError) ||
                r->syndrome == (aeth::kNak | aeth::kNakInvalidRequest))
        << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
    expect_untouched(0x100, 8);
}

TEST_F(FakePeer, ReadWithoutRemoteReadAccessNaksRemoteAccessError) {
    Bytes p = packet(kReadRequest, qpn, kRqPsn,
                     reth(uint64_t(uintptr_t(w.noread)), w.mr_noread->rkey, 64), {});
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
}

TEST_F(FakePeer, AtomicWithWrongRkeyNaksRemoteAccessError) {
    Bytes p = packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2000), rkey() + 1, 1, 0), {});
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn,
                                             IBV_EVENT_QP_ACCESS_ERR));
    expect_untouched(0x2000, 8);
}

// ---------------------------------------------------------------------------
// Responder: sequence errors and duplicates

// ---------------------------------------------------------------------------
// Responder: memory taken away while a message is in progress.  A message
// holds its MR until it ends, as rxe's does: what the MR no longer grants
// ends the message, and no byte lands after ibv_dereg_mr() returns.

// Memory registered apart from the world's MR, so tests may take it away.
struct SideMr {
    std::vector<uint8_t> mem;
    ibv_mr *mr = nullptr;
    SideMr(ibv_pd *pd, size_t len, unsigned access, uint8_t fill = 0xEE) : mem(len, fill) {
        mr = ibv_reg_mr(pd, mem.data(), len, int(access));
    }
    ~SideMr() {
        if (mr) ibv_dereg_mr(mr);
    }
    SideMr(const SideMr &) = delete;
    SideMr &operator=(const SideMr &) = delete;
    void dereg() {
        ASSERT_EQ(ibv_dereg_mr(mr), 0);
        mr = nullptr;
    }
    uint64_t va(size_t off = 0) const { return uint64_t(uintptr_t(mem.data() + off)); }
    // How many bytes of [off, off+len) no longer hold `fill`.
    size_t changed(size_t off, size_t len, uint8_t fill) const {
        return size_t(std::count_if(mem.begin() + ptrdiff_t(off),
                                    mem.begin() + ptrdiff_t(off + len),
                                    [fill](uint8_t b) { return b != fill; }));
    }
};

constexpr unsigned kRemoteRw =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

class MidMessage : public FakePeer {
  protected:
    static constexpr size_t kLen = 8 * kMtu;
    Bytes data = pattern(kLen, 0x5A);

    // [p, p+n) holds what the first packet carried.  Callers first see an
    // answer to a later packet, so the first one has been placed.
    void expect_landed(const uint8_t *p, size_t n) {
        fence();
        ASSERT_EQ(std::memcmp(p, data.data(), n), 0) << "the first packet did not land";
    }

    // WRITE FIRST of `data` through `rkey`, acknowledged, so it has landed.
    void write_first(SideMr &m, uint32_t rkey) {
        send(packet(kWriteFirst, qpn, kRqPsn, reth(m.va(), rkey, uint32_t(kLen)),
                    Bytes(data.begin(), data.begin() + kMtu), true));
        ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
        ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    }

    // The rest of the WRITE: six MIDDLE packets and the LAST.
    void write_rest() {
        for (uint32_t i = 1; i < kLen / kMtu; i++)
            send(packet(i + 1 == kLen / kMtu ? kWriteLast : kWriteMiddle, qpn, kRqPsn + i, {},
                        Bytes(data.begin() + i * kMtu, data.begin() + (i + 1) * kMtu),
                        i + 1 == kLen / kMtu));
    }
};

TEST_F(MidMessage, WriteStopsAtDeregistrationAndNothingLandsAfter) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    // The application reuses the memory at once, as it may.
    std::memset(m.mem.data(), 0x55, kLen);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(0, kLen, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

TEST_F(MidMessage, WriteStopsWhenReregRevokesRemoteWrite) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_EQ(
        ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
        0);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u);
}

TEST_F(MidMessage, WriteStopsWhenReregMovesTheTranslation) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    std::vector<uint8_t> elsewhere(kLen, 0x77);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_EQ(
        ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, elsewhere.data(), kLen, 0), 0);
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u) << "the old memory was written";
    EXPECT_EQ(std::count(elsewhere.begin(), elsewhere.end(), 0x77), ptrdiff_t(kLen))
        << "the new memory was written by a message that began before it was registered";
}

TEST_F(MidMessage, WriteStopsWhenItsWindowIsInvalidated) {
    SideMr m(w.pd, kLen, kRemoteRw | IBV_ACCESS_MW_BIND);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_mw *mw = ibv_alloc_mw(w.pd, IBV_MW_TYPE_1);
    ASSERT_NE(mw, nullptr) << strerror(errno);
    ibv_mw_bind b{};
    b.wr_id = 9;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = {m.mr, m.va(), kLen, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(ibv_bind_mw(qp, mw, &b), 0);
    ASSERT_NO_FATAL_FAILURE(expect_success(9));
    ASSERT_NO_FATAL_FAILURE(write_first(m, mw->rkey));
    // A type 1 window bound with length 0 is invalidated.
    b.bind_info = {m.mr, m.va(), 0, IBV_ACCESS_REMOTE_WRITE};
    ASSERT_EQ(ibv_bind_mw(qp, mw, &b), 0);
    ASSERT_NO_FATAL_FAILURE(expect_success(9));
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_fatal_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn + 1,
                                             IBV_EVENT_QP_ACCESS_ERR));
    fence();
    EXPECT_EQ(m.changed(kMtu, kLen - kMtu, 0xEE), 0u);
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

// Another MR's deregistration changes nothing for a message whose own
// memory stays registered.
TEST_F(MidMessage, WriteGoesOnWhenAnotherMrIsDeregistered) {
    SideMr m(w.pd, kLen, kRemoteRw), other(w.pd, 4096, kRemoteRw);
    ASSERT_TRUE(m.mr && other.mr) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(write_first(m, m.mr->rkey));
    ASSERT_NO_FATAL_FAILURE(other.dereg());
    write_rest();
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + kLen / kMtu - 1, 1));
    fence();
    EXPECT_EQ(0, std::memcmp(m.mem.data(), data.data(), kLen));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(MidMessage, SendStopsWhenTheReceiveBuffersMrIsDeregistered) {
    SideMr m(w.pd, kLen, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_sge sge{m.va(), uint32_t(kLen), m.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 31;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
    send(packet(kSendFirst, qpn, kRqPsn, {}, Bytes(data.begin(), data.begin() + kMtu), true));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    std::memset(m.mem.data(), 0x55, kLen);
    send(packet(kSendMiddle, qpn, kRqPsn + 1, {},
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    send(packet(kSendLast, qpn, kRqPsn + 2, {},
                Bytes(data.begin() + 2 * kMtu, data.begin() + 3 * kMtu)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakRemoteOpError, kRqPsn + 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 31u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc->status);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
    fence();
    EXPECT_EQ(m.changed(0, kLen, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

// The requester's side: a READ's responses land in the posted local memory
// only while it is registered.
TEST_F(MidMessage, ReadResponseAfterLocalDeregistrationIsAProtectionError) {
    SideMr m(w.pd, 2 * kMtu, kRemoteRw);
    ASSERT_NE(m.mr, nullptr) << strerror(errno);
    ibv_sge sge{m.va(), uint32_t(2 * kMtu), m.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 41;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = 0xABC000;
    wr.wr.rdma.rkey = 0x42;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->opcode, kReadRequest) << r->str();
    send(packet(kReadRespFirst, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                Bytes(data.begin(), data.begin() + kMtu), false));
    // A request to this QP's responder, answered after the response before it.
    send(write_only(kRqPsn, 0x8000, pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    ASSERT_NO_FATAL_FAILURE(expect_landed(m.mem.data(), kMtu));
    ASSERT_NO_FATAL_FAILURE(m.dereg());
    std::memset(m.mem.data(), 0x55, 2 * kMtu);
    send(packet(kReadRespLast, qpn, kSqPsn + 1, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                Bytes(data.begin() + kMtu, data.begin() + 2 * kMtu), false));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 41u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc->status);
    fence();
    EXPECT_EQ(m.changed(0, 2 * kMtu, 0x55), 0u) << "bytes landed after ibv_dereg_mr() returned";
}

TEST_F(FakePeer, PsnAheadGetsExactlyOneSequenceNak) {
    for (uint32_t k = 3; k < 13; k++)
        send(write_only(kRqPsn + k, 0x100 + 64 * k, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn));
    expect_silence(300);
    for (uint32_t k = 3; k < 13; k++)
        expect_untouched(0x100 + 64 * k, 16);
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    // Once the expected PSN arrives, a new gap earns a new NAK.
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
    send(write_only(kRqPsn + 5, 0x100, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakPsnSeqError, kRqPsn + 1));
    expect_silence();
}

TEST_F(FakePeer, DuplicateWriteIsReAckedNotReExecuted) {
    Bytes data = pattern(64, 1);
    Bytes p = write_only(kRqPsn, 0x100, data);
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    ASSERT_EQ(0, std::memcmp(w.buf + 0x100, data.data(), data.size()));
    std::memset(w.buf + 0x100, 0xEE, data.size());
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    expect_untouched(0x100, data.size());
    // Behind by more than one: the ACK covers everything received so far.
    send(write_only(kRqPsn + 1, 0x400, pattern(8, 2)));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn + 1, 2));
    send(p);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck) << r->str();
    EXPECT_GE(psn_diff(r->psn, kRqPsn), 0) << r->str();
    EXPECT_LE(psn_diff(r->psn, kRqPsn + 1), 0) << r->str();
    expect_untouched(0x100, data.size());
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

TEST_F(FakePeer, DuplicateReadIsServedAgain) {
    Bytes mem = pattern(2500, 3);
    std::memcpy(w.buf + 0x1000, mem.data(), mem.size());
    // Single-packet read.
    Bytes rd = packet(kReadRequest, qpn, kRqPsn, reth(va(0x1000), rkey(), 64), {});
    for (int pass = 0; pass < 2; pass++) {
        send(rd);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck) << r->str();
        EXPECT_EQ(r->msn, 1u);
        EXPECT_EQ(r->payload, Bytes(mem.begin(), mem.begin() + 64));
    }
    // Three-packet read, then the whole request again, then its tail only.
    uint32_t p = kRqPsn + 1;
    Bytes rd3 = packet(kReadRequest, qpn, p, reth(va(0x1000), rkey(), 2500), {});
    auto expect_responses = [&](uint32_t psn, size_t off) {
        size_t left = mem.size() - off;
        uint32_t n = uint32_t((left + kMtu - 1) / kMtu);
        for (uint32_t i = 0; i < n; i++) {
            std::optional<Rx> r = reply();
            ASSERT_TRUE(r) << "response " << i;
            uint8_t want = n == 1       ? kReadRespOnly
                           : i == 0     ? kReadRespFirst
                           : i + 1 == n ? kReadRespLast
                                        : kReadRespMiddle;
            EXPECT_EQ(r->opcode, want) << r->str();
            EXPECT_EQ(r->psn, psn_add(psn, i));
            size_t len = std::min<size_t>(kMtu, left - i * kMtu);
            EXPECT_EQ(r->payload, Bytes(mem.begin() + long(off + i * kMtu),
                                        mem.begin() + long(off + i * kMtu + len)));
        }
    };
    send(rd3);
    ASSERT_NO_FATAL_FAILURE(expect_responses(p, 0));
    send(rd3);
    ASSERT_NO_FATAL_FAILURE(expect_responses(p, 0));
    send(packet(kReadRequest, qpn, p + 1, reth(va(0x1000 + kMtu), rkey(), 2500 - kMtu), {}));
    ASSERT_NO_FATAL_FAILURE(expect_responses(p + 1, kMtu));
    expect_silence();
    // The read consumed three PSNs.
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(p + 3));
}

TEST_F(FakePeer, DuplicateAtomicReturnsOriginalWithoutReExecuting) {
    auto *word = reinterpret_cast<uint64_t *>(w.buf + 0x2000);
    *word = 100;
    Bytes fa = packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2000), rkey(), 5, 0), {});
    for (int pass = 0; pass < 3; pass++) {
        send(fa);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kAtomicAcknowledge) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
        EXPECT_EQ(r->orig, 100u) << "pass " << pass;
        EXPECT_EQ(*word, 105u) << "pass " << pass;
    }
    // Compare-and-swap; after it the word is put back, so a re-execution
    // of the duplicate would be visible.
    Bytes cs = packet(kCompareSwap, qpn, kRqPsn + 1, atomic_eth(va(0x2000), rkey(), 7, 105), {});
    send(cs);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAtomicAcknowledge) << r->str();
    EXPECT_EQ(r->orig, 105u);
    EXPECT_EQ(*word, 7u);
    *word = 105;
    send(cs);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kRqPsn + 1);
    EXPECT_EQ(r->orig, 105u);
    EXPECT_EQ(*word, 105u) << "duplicate compare-and-swap executed again";
    // The older one is still remembered.
    send(fa);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->orig, 100u);
    EXPECT_EQ(*word, 105u);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

// ---------------------------------------------------------------------------
// Responder: RNR and invalid requests

TEST_F(FakePeer, SendWithoutReceiveGetsRnrNak) {
    Bytes data = pattern(60, 4);
    Bytes s = packet(kSendOnly, qpn, kRqPsn, {}, data);
    send(s);
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kRnrNak | kMinRnrTimer, kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    EXPECT_FALSE(poll_wc(50));
    // The retry after a receive is posted succeeds at the same PSN.
    ASSERT_NO_FATAL_FAILURE(post_recv(5, 0x3000, 128));
    send(s);
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->byte_len, 60u);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x3000, data.data(), data.size()));
}

TEST_F(FakePeer, WriteWithImmediateWithoutReceiveGetsRnrNak) {
    Bytes imm(4, 0x5A);
    Bytes p =
        packet(kWriteOnlyImm, qpn, kRqPsn, cat(reth(va(0x100), rkey(), 16), imm), pattern(16, 1));
    send(p);
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kRnrNak | kMinRnrTimer, kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(FakePeer, WriteMiddleWithoutFirstNaksInvalidRequest) {
    send(packet(kWriteMiddle, qpn, kRqPsn, {}, pattern(kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, WriteLastWithoutFirstNaksInvalidRequest) {
    send(packet(kWriteLast, qpn, kRqPsn, {}, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, SendMiddleWithoutFirstNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(1, 0x3000, 4096));
    send(packet(kSendMiddle, qpn, kRqPsn, {}, pattern(kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, PayloadLargerThanPathMtuNaksInvalidRequest) {
    send(write_only(kRqPsn, 0x100, pattern(2 * kMtu, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 2 * kMtu);
}

TEST_F(FakePeer, WritePayloadLongerThanRethLengthNaksInvalidRequest) {
    send(packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 16), pattern(32, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100 + 16, 16);
}

TEST_F(FakePeer, ShortMiddlePacketNaksInvalidRequest) {
    Bytes data = pattern(3 * kMtu, 2);
    send(packet(kWriteFirst, qpn, kRqPsn, reth(va(0x4000), rkey(), uint32_t(data.size())),
                Bytes(data.begin(), data.begin() + kMtu), false));
    send(packet(kWriteMiddle, qpn, kRqPsn + 1, {}, Bytes(data.begin(), data.begin() + 512), false));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn + 1, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, NewMessageInsideAnotherNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(1, 0x3000, 4096));
    send(packet(kWriteFirst, qpn, kRqPsn, reth(va(0x4000), rkey(), 2 * kMtu), pattern(kMtu, 1),
                false));
    send(packet(kSendOnly, qpn, kRqPsn + 1, {}, pattern(16, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn + 1, IBV_EVENT_QP_REQ_ERR));
}

TEST_F(FakePeer, SendLongerThanTheReceiveNaksInvalidRequest) {
    ASSERT_NO_FATAL_FAILURE(post_recv(9, 0x3000, 32));
    send(packet(kSendOnly, qpn, kRqPsn, {}, pattern(64, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 9u);
    EXPECT_EQ(wc->status, IBV_WC_LOC_LEN_ERR);
    expect_untouched(0x3000 + 32, 32);
}

TEST_F(FakePeer, ZeroLengthReadAndWriteNeedNoValidKey) {
    send(packet(kWriteOnly, qpn, kRqPsn, reth(0, 0, 0), {}));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn, 1));
    send(packet(kReadRequest, qpn, kRqPsn + 1, reth(0, 0, 0), {}));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn + 1);
    EXPECT_TRUE(r->payload.empty());
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 2));
}

// A native commit's CETH IMMED flag and its opcode must agree: immediate
// data exists only together with a commit, and a commit that announces one
// must carry it.  Either mismatch is an Invalid Request, and nothing lands.
TEST_F(FakePeer, CommitImmediateFlagMustMatchTheOpcode) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes ce(4);
    ce[0] = ceth::kImmed | ceth::kGlobal;
    post_recv(1, 0x9000, 64);
    send(packet(kCommitWriteOnly, qpn, kRqPsn, cat(reth(va(0x100), rkey(), 8), ce), pattern(8, 3)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 8);

    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    drain_async_events();
    ce[0] = ceth::kGlobal; // no IMMED, yet the opcode carries immediate data
    Bytes imm(4);
    put32(imm.data(), 0x55);
    post_recv(2, 0x9000, 64);
    send(packet(kCommitWriteOnlyImm, qpn, kRqPsn, cat(cat(reth(va(0x100), rkey(), 8), ce), imm),
                pattern(8, 3)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x100, 8);
}

// A well-formed native commit with immediate data, for contrast: placed,
// acknowledged, and the immediate delivered.
TEST_F(FakePeer, NativeCommitWithImmediateIsAcceptedFromAPeer) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes ce(4);
    ce[0] = ceth::kImmed | ceth::kGlobal;
    Bytes imm(4);
    put32(imm.data(), 0x55);
    post_recv(3, 0x9000, 64);
    Bytes data = pattern(8, 4);
    send(packet(kCommitWriteOnlyImm, qpn, kRqPsn, cat(cat(reth(va(0x100), rkey(), 8), ce), imm),
                data));
    ASSERT_NO_FATAL_FAILURE(expect_ack(kRqPsn));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    EXPECT_EQ(std::memcmp(w.buf + 0x100, data.data(), 8), 0);
}

TEST_F(FakePeer, FlushWithoutQpFlushAccessIsInvalidRequest) {
    Bytes feth(4);
    put32(feth.data(), 1); // placement: global visibility, selectivity: range
    send(packet(kFlush, qpn, kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), {}));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
}

// FLUSH and ATOMIC WRITE are answered by an empty READ RESPONSE ONLY; a
// duplicate is answered again from the responder resources, never executed
// a second time.
TEST_F(FakePeer, FlushIsAnsweredAndItsDuplicateReplayed) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    Bytes flush = packet(kFlush, qpn, kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), {});
    for (int pass = 0; pass < 2; pass++) {
        send(flush);
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "pass " << pass;
        EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
        EXPECT_EQ(r->psn, kRqPsn);
        EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
        EXPECT_TRUE(r->payload.empty());
    }
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// Linux rxe 6.2 and later seals FLUSH with its own ICRC form (icrc.hpp): it
// is accepted, from rxe's hashed source ports with any IP ID, and a
// corrupted one is still dropped.
TEST_F(FakePeer, FlushInLinuxRxesIcrcFormIsAccepted) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    Bytes flush = legacy_flush(kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), 0x5A5A);
    Bytes bad = flush;
    bad[kBthLen + 5] ^= 0x01;
    ASSERT_NO_FATAL_FAILURE(expect_dropped(bad, w.peer_alt));
    fence();
    send_raw(w.peer_alt, flush);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn + 1));
}

// Only FLUSH has the legacy form: any other opcode sealed that way is corrupt.
TEST_F(FakePeer, LegacyIcrcFormOfOtherOpcodesIsDropped) {
    Bytes wr = packet(kWriteOnly, qpn, kRqPsn, reth(va(0x100), rkey(), 0), {});
    seal_legacy(wr, kPeerAddr, kRoceV2Port, 0);
    ASSERT_NO_FATAL_FAILURE(expect_dropped(wr));
    ASSERT_NO_FATAL_FAILURE(expect_qp_works(kRqPsn));
}

TEST_F(FakePeer, AtomicWriteStoresOnceAndItsDuplicateIsReplayed) {
    Bytes v1 = pattern(8, 1), v2 = pattern(8, 2);
    Bytes aw = packet(kAtomicWrite, qpn, kRqPsn, reth(va(0x100), rkey(), 8), v1);
    send(aw);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kAck);
    EXPECT_TRUE(r->payload.empty());
    qp_state(); // orders the engine's store before this thread's read
    EXPECT_EQ(std::memcmp(w.buf + 0x100, v1.data(), 8), 0);
    // A later WRITE changes the word; the duplicate must not undo it.
    send(packet(kWriteOnly, qpn, kRqPsn + 1, reth(va(0x100), rkey(), 8), v2, true));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge) << r->str();
    send(aw);
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    qp_state();
    EXPECT_EQ(std::memcmp(w.buf + 0x100, v2.data(), 8), 0) << "duplicate ATOMIC WRITE re-executed";
}

TEST_F(FakePeer, MisalignedAtomicWriteIsInvalidRequest) {
    send(packet(kAtomicWrite, qpn, kRqPsn, reth(va(0x104), rkey(), 8), pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(
        expect_fatal_nak(aeth::kNak | aeth::kNakInvalidRequest, kRqPsn, IBV_EVENT_QP_REQ_ERR));
    expect_untouched(0x104, 8);
}

TEST_F(FakePeer, MisalignedAtomicIsRejected) {
    auto *word = reinterpret_cast<uint64_t *>(w.buf + 0x2000);
    *word = 1;
    send(packet(kFetchAdd, qpn, kRqPsn, atomic_eth(va(0x2004), rkey(), 1, 0), {}));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_EQ(r->syndrome & aeth::kKindMask, aeth::kNak) << r->str();
    EXPECT_EQ(r->psn, kRqPsn);
    EXPECT_EQ(*word, 1u);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

// ---------------------------------------------------------------------------
// Requester: what sroce sends, and how it takes forged responses

// A peer that drops IBTA-form FLUSHes (unfixed Linux rxe) is found by
// retransmission: two IBTA tries, then the forms alternate, and the form
// answered is the one used first from then on.
TEST_F(FakePeer, FlushFormIsLearnedFromAnAnsweredRetransmission) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 10));
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    const bool legacy[] = {false, false, true};
    for (int n = 0; n < 3; n++)
        ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, legacy[n], n));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
    ASSERT_NO_FATAL_FAILURE(post_flush(2));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, true, 0));
    // A learned form is re-checked: unanswered, the next try is IBTA's.
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, false, 1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, true, 2));
    send(flush_response(kSqPsn + 1, 2));
    ASSERT_NO_FATAL_FAILURE(expect_success(2));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

// A peer that answered an IBTA-form FLUSH never sees the other form.
TEST_F(FakePeer, FlushToAPeerThatTookIbtasFormNeverUsesTheOther) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 10));
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, false, 0));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
    ASSERT_NO_FATAL_FAILURE(post_flush(2));
    for (int n = 0; n < 5; n++)
        ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn + 1, false, n));
    send(flush_response(kSqPsn + 1, 2));
    ASSERT_NO_FATAL_FAILURE(expect_success(2));
}

// The peer's own FLUSH shows its form before sroce sends one.
TEST_F(FakePeer, PeersOwnLegacyFlushTeachesTheForm) {
    ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn, 0, IBV_ACCESS_FLUSH_GLOBAL));
    Bytes feth(4);
    put32(feth.data(), 1);
    fence();
    send_raw(w.peer_alt, legacy_flush(kRqPsn, cat(feth, reth(va(0x100), rkey(), 64)), 7));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRespOnly) << r->str();
    ASSERT_NO_FATAL_FAILURE(post_flush(1));
    ASSERT_NO_FATAL_FAILURE(expect_flush(kSqPsn, true, 0));
    send(flush_response(kSqPsn, 1));
    ASSERT_NO_FATAL_FAILURE(expect_success(1));
}

// docs/design.md §2.5: no manufacturer-specific opcode ever reaches a peer that
// has not declared support; the commit travels as IBTA FLUSH(MR) + WRITE +
// FLUSH(MR) + zero-length WRITE WITH IMMEDIATE instead.
TEST_F(FakePeer, WriteCommitToAnUndeclaredPeerIsAnIbtaSequence) {
    ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
    ASSERT_NE(qpx, nullptr);
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_wr_rdma_write_commit_imm(qpx, 0xAABBCCDD, 0x10000, IBV_WRITE_COMMIT_ORDERED,
                                           htonl(0x1234)),
              0);
    ibv_wr_set_sge(qpx, w.mr->lkey, uint64_t(uintptr_t(w.buf)), 99);
    ASSERT_EQ(ibv_wr_complete(qpx), 0);
    const uint8_t want[] = {kFlush, kWriteOnly, kFlush, kWriteOnlyImm};
    for (int i = 0; i < 4; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "packet " << i;
        EXPECT_LT(r->opcode, 0xC0) << r->str();
        EXPECT_EQ(r->opcode, want[i]) << r->str();
        EXPECT_EQ(r->psn, (kSqPsn + uint32_t(i)) & kPsnMask);
        EXPECT_EQ(r->rkey, 0xAABBCCDDu);
        if (r->opcode == kFlush) { // selectivity MR, placement persistent
            EXPECT_EQ(get32(r->raw.data() + kBthLen), 0x12u) << r->str();
        }
        if (r->opcode == kWriteOnly) {
            EXPECT_EQ(r->dma_len, 99u);
        }
        if (r->opcode == kWriteOnlyImm) {
            EXPECT_EQ(r->dma_len, 0u);
            EXPECT_EQ(get32(r->raw.data() + kBthLen + kRethLen), 0x1234u);
        }
    }
    EXPECT_FALSE(reply()) << "more than the IBTA sequence was sent";
}

TEST_F(FakePeer, WriteCommitToADeclaredPeerIsOneNativeMessage) {
    ASSERT_EQ(ibv_qp_set_commit_peer(qp, IBV_COMMIT_CAP_NATIVE), 0);
    ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_wr_rdma_write_commit_imm(qpx, 0xAABBCCDD, 0x10000, IBV_WRITE_COMMIT_ORDERED,
                                           htonl(0x1234)),
              0);
    ibv_wr_set_sge(qpx, w.mr->lkey, uint64_t(uintptr_t(w.buf)), 99);
    ASSERT_EQ(ibv_wr_complete(qpx), 0);
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kCommitWriteOnlyImm) << r->str();
    EXPECT_TRUE(r->ackreq);
    EXPECT_EQ(r->dma_len, 99u);
    const uint8_t *ceth = r->raw.data() + kBthLen + kRethLen;
    EXPECT_EQ(ceth[0], ceth::kOrdered | ceth::kImmed);
    EXPECT_EQ(get32(r->raw.data() + kBthLen + kRethLen + kCethLen), 0x1234u);
    EXPECT_EQ(r->payload.size(), 99u);
    EXPECT_FALSE(reply());
}

// sroce sends to a peer from a connected socket, whose IP ID counter it
// follows (design.md §7.3).  A datagram to a closed port draws an ICMP
// port unreachable, which Linux leaves on a connected socket to fail its
// next send before it leaves.  That send is made again, with the counter
// read afresh: a write posted once the port is open again arrives although
// the QP never retransmits, with an ICRC right for the IP ID in its real
// header (receive(), through World::tap).
TEST_F(FakePeer, ConnectedSocketSendsPastAnIcmpError) {
    // timeout 0: no retransmission, so only the send itself can deliver.
    Bytes data = pattern(64, 21);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 64, 0x1000, 0x77));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);

    close(w.peer);
    w.peer = -1;
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 64, 0x2000, 0x77));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    w.peer = udp_socket(kPeerAddr, kRoceV2Port);
    ASSERT_GE(w.peer, 0) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 3, 0, 64, 0x3000, 0x77));
    r = reply();
    ASSERT_TRUE(r) << "the write after the ICMP error was lost";
    EXPECT_EQ(r->opcode, kWriteOnly) << r->str();
    EXPECT_EQ(r->psn, kSqPsn + 2);
    EXPECT_EQ(r->payload, data);
    // One ACK covers the write the closed port lost and this one.
    send(ack(kSqPsn + 2, aeth::kAck | aeth::kNoCredits, 3));
    for (uint64_t id : {2u, 3u}) {
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc->wr_id, id);
    }
}

TEST_F(FakePeer, RequesterWritePacketsAreWellFormed) {
    Bytes data = pattern(99, 11);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 99, 0x1122334455667788ull, 0xAABBCCDD));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kWriteOnly) << r->str();
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_TRUE(r->ackreq);
    EXPECT_EQ(r->pad, 1);
    EXPECT_EQ(r->va, 0x1122334455667788ull);
    EXPECT_EQ(r->rkey, 0xAABBCCDDu);
    EXPECT_EQ(r->dma_len, 99u);
    EXPECT_EQ(r->payload, data);
    EXPECT_FALSE(poll_wc(50)) << "completed before the ACK";
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_EQ(wc->opcode, IBV_WC_RDMA_WRITE);

    // Three packets: RETH only in the first, consecutive PSNs, ACK requested
    // on the last.
    Bytes big = pattern(2 * kMtu + 100, 12);
    std::memcpy(w.buf + 0x1000, big.data(), big.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0x1000, uint32_t(big.size()), 0x5000, 7));
    Bytes got;
    const uint8_t ops[] = {kWriteFirst, kWriteMiddle, kWriteLast};
    for (uint32_t i = 0; i < 3; i++) {
        r = reply();
        ASSERT_TRUE(r) << "packet " << i;
        EXPECT_EQ(r->opcode, ops[i]) << r->str();
        EXPECT_EQ(r->psn, kSqPsn + 1 + i);
        if (i == 0) {
            EXPECT_EQ(r->va, 0x5000u);
            EXPECT_EQ(r->rkey, 7u);
            EXPECT_EQ(r->dma_len, big.size());
        }
        if (i == 2) {
            EXPECT_TRUE(r->ackreq);
        }
        if (i < 2) {
            EXPECT_EQ(r->payload.size(), kMtu);
        }
        got.insert(got.end(), r->payload.begin(), r->payload.end());
    }
    EXPECT_EQ(got, big);
    send(ack(kSqPsn + 3, aeth::kAck | aeth::kNoCredits, 2));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 2u);
}

TEST_F(FakePeer, RequesterReadAndAtomicRoundTrip) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_READ, 1, 0x100, 64, 0xABC000, 0x42));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kReadRequest) << r->str();
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_EQ(r->va, 0xABC000u);
    EXPECT_EQ(r->rkey, 0x42u);
    EXPECT_EQ(r->dma_len, 64u);
    Bytes data = pattern(64, 13);
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1), data,
                false));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc->byte_len, 64u);
    EXPECT_EQ(0, std::memcmp(w.buf + 0x100, data.data(), 64));

    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0x200, 8, 0xABC008, 0x42, 3));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kFetchAdd) << r->str();
    EXPECT_EQ(r->psn, kSqPsn + 1);
    EXPECT_EQ(r->va, 0xABC008u);
    EXPECT_EQ(r->swap_add, 3u);
    Bytes orig(8);
    put64(orig.data(), 0x0123456789ABCDEFull);
    send(packet(kAtomicAcknowledge, qpn, kSqPsn + 1,
                cat(aeth_bytes(aeth::kAck | aeth::kNoCredits, 2), orig), {}, false));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_FETCH_ADD);
    uint64_t got;
    std::memcpy(&got, w.buf + 0x200, 8);
    EXPECT_EQ(got, 0x0123456789ABCDEFull);
}

// An ACK for a PSN never sent (IBTA calls these ghost responses) must not
// move the requester's window past what it has sent, or the real ACKs that
// follow look stale and the QP stalls.
TEST_F(FakePeer, RequesterIgnoresAckFarAhead) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->psn, kSqPsn);
    send(ack(kSqPsn + 1000));
    send(ack(psn_add(kSqPsn, 0x7FFFFF)));
    std::optional<ibv_wc> early = poll_wc(100);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = early ? early : poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_FALSE(poll_wc(50)) << "a WQE completed twice";

    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kSqPsn + 1) << r->str();
    send(ack(kSqPsn + 1));
    wc = poll_wc();
    ASSERT_TRUE(wc) << "the WRITE after a ghost ACK never completed";
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
}

TEST_F(FakePeer, RequesterFailsOnNakWithReservedCode) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | 0x1F));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 1u);
    EXPECT_NE(wc->status, IBV_WC_SUCCESS);
    EXPECT_NE(wc->status, IBV_WC_WR_FLUSH_ERR);
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

TEST_F(FakePeer, RequesterRemoteAccessNak) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteAccessError));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(qp_state(), IBV_QPS_ERR);
}

TEST_F(FakePeer, RequesterReadResponseWithWrongLengthIsBadResponse) {
    for (size_t len : {60u, 68u, 0u}) {
        SCOPED_TRACE(len);
        ASSERT_NO_FATAL_FAILURE(create_qp(kRqPsn, kSqPsn));
        ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_READ, 1, 0x100, 64, 0xABC000, 0x42));
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r);
        ASSERT_EQ(r->opcode, kReadRequest);
        send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(aeth::kAck | aeth::kNoCredits, 1),
                    pattern(len, 1), false));
        std::optional<ibv_wc> wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_BAD_RESP_ERR);
        EXPECT_EQ(qp_state(), IBV_QPS_ERR);
        expect_untouched(0x100 + 64, 8);
    }
}

TEST_F(FakePeer, RequesterIgnoresUnsolicitedResponses) {
    // Nothing posted: responses of every kind must be ignored harmlessly.
    Bytes orig(8, 0);
    send(ack(kSqPsn));
    send(ack(psn_add(kSqPsn, kPsnMask)));
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(0x1F, 1), pattern(64, 1), false));
    send(packet(kReadRespMiddle, qpn, kSqPsn, {}, pattern(kMtu, 1), false));
    send(packet(kAtomicAcknowledge, qpn, kSqPsn, cat(aeth_bytes(0x1F, 1), orig), {}, false));
    send(ack(kSqPsn, aeth::kRnrNak | 1));
    send(ack(kSqPsn, 0x40)); // reserved AETH kind
    expect_silence();
    EXPECT_FALSE(poll_wc(50));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS);
    // A READ response or ATOMIC ACK at the PSN of a WRITE does not complete it.
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->psn, kSqPsn);
    send(packet(kReadRespOnly, qpn, kSqPsn, aeth_bytes(0x1F, 1), pattern(16, 1), false));
    send(packet(kAtomicAcknowledge, qpn, kSqPsn, cat(aeth_bytes(0x1F, 1), orig), {}, false));
    std::optional<ibv_wc> wc = poll_wc(100);
    if (wc) {
        EXPECT_NE(wc->status, IBV_WC_SUCCESS) << "WRITE completed by a READ response";
    } else {
        send(ack(kSqPsn));
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
}

// A NAK for a PSN with no request outstanding (nothing posted, or long since
// acknowledged) is a ghost response: ignored, like rxe does, rather than
// failing the QP.
TEST_F(FakePeer, RequesterIgnoresNakForPsnNotOutstanding) {
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteAccessError));
    send(ack(kSqPsn + 50, aeth::kNak | aeth::kNakInvalidRequest));
    expect_silence();
    EXPECT_FALSE(poll_wc(50));
    EXPECT_EQ(qp_state(), IBV_QPS_RTS) << "an unsolicited NAK put the QP in error";
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(FakePeer, RequesterIgnoresStaleNak) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    // For PSNs already acknowledged, with a new request outstanding.
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 2, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send(ack(kSqPsn, aeth::kNak | aeth::kNakRemoteOpError));
    send(ack(psn_add(kSqPsn, kPsnMask), aeth::kNak | aeth::kNakRemoteAccessError));
    EXPECT_FALSE(poll_wc(100)) << "a stale NAK completed the new request";
    EXPECT_EQ(qp_state(), IBV_QPS_RTS) << "a stale NAK put the QP in error";
    send(ack(kSqPsn + 1));
    wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 2u);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(FakePeer, RequesterResendsAfterRnrNak) {
    Bytes data = pattern(32, 14);
    std::memcpy(w.buf, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_SEND, 1, 0, 32, 0, 0));
    std::optional<Rx> r = reply();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->opcode, kSendOnly);
    EXPECT_EQ(r->psn, kSqPsn);
    send(ack(kSqPsn, aeth::kRnrNak | 1)); // RNR timer code 1: 10 us
    r = reply();
    ASSERT_TRUE(r) << "not resent after the RNR NAK";
    EXPECT_EQ(r->opcode, kSendOnly);
    EXPECT_EQ(r->psn, kSqPsn);
    EXPECT_EQ(r->payload, data);
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_SEND);
}

TEST_F(FakePeer, RequesterGoesBackNOnSequenceNak) {
    for (uint64_t i = 0; i < 3; i++)
        ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, i, 0x100 * i, 16, 0x1000, 1));
    for (uint32_t i = 0; i < 3; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->psn, kSqPsn + i);
    }
    // The peer got the first, lost the second.
    send(ack(kSqPsn + 1, aeth::kNak | aeth::kNakPsnSeqError));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->wr_id, 0u);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    for (uint32_t i = 1; i < 3; i++) {
        std::optional<Rx> r = reply();
        ASSERT_TRUE(r) << "no retransmission of PSN " << hex(kSqPsn + i);
        EXPECT_EQ(r->psn, kSqPsn + i);
        EXPECT_EQ(r->opcode, kWriteOnly);
    }
    send(ack(kSqPsn + 2));
    for (uint64_t i = 1; i < 3; i++) {
        wc = poll_wc();
        ASSERT_TRUE(wc);
        EXPECT_EQ(wc->wr_id, i);
        EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
    expect_silence();
}

TEST_F(FakePeer, RequesterIgnoresAckFromWrongSource) {
    ASSERT_NO_FATAL_FAILURE(post(IBV_WR_RDMA_WRITE, 1, 0, 16, 0x1000, 1));
    ASSERT_TRUE(reply());
    send_raw(w.stranger, ack(kSqPsn, aeth::kAck | aeth::kNoCredits, 1, kStrangerAddr));
    EXPECT_FALSE(poll_wc(100)) << "completed by an ACK from a stranger";
    send(ack(kSqPsn));
    std::optional<ibv_wc> wc = poll_wc();
    ASSERT_TRUE(wc);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

// ibv_destroy_qp() discards the QP's unread async events (the kernel does so
// for every libibverbs provider): an event read afterwards would carry a
// dangling element.qp that ibv_ack_async_event() and the application then
// dereference.
TEST_F(FakePeer, AsyncEventOfADestroyedQpIsNotDelivered) {
    send(write_only(kRqPsn, kMrLen - 4, pattern(8, 1)));
    ASSERT_NO_FATAL_FAILURE(expect_nak(aeth::kNak | aeth::kNakRemoteAccessError, kRqPsn));
    ASSERT_EQ(qp_state(), IBV_QPS_ERR);
    ibv_qp *dead = qp;
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    qp = nullptr;
    pollfd p{w.ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
        ibv_async_event ev;
        ASSERT_EQ(ibv_get_async_event(w.ctx, &ev), 0);
        // Not acknowledged: that is what would crash.
        ADD_FAILURE() << "got event " << ibv_event_type_str(ev.event_type) << " for destroyed QP "
                      << static_cast<void *>(ev.element.qp)
                      << (ev.element.qp == dead ? " (the one just destroyed)" : "");
    }
}

// An XRC receive QP answers only its connected peer: a stranger's request
// naming an SRQ that does not exist must not put it in the error state.
TEST(XrcBadInput, StrangersRequestNamingNoSrqIsDropped) {
    World &w = world();
    if (!w.skip.empty()) GTEST_SKIP() << w.skip;
    ASSERT_EQ(w.fatal, "");
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    xa.oflags = O_CREAT;
    ibv_xrcd *xrcd = ibv_open_xrcd(w.ctx, &xa);
    ASSERT_NE(xrcd, nullptr) << strerror(errno);
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_XRC_RECV;
    ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ia.xrcd = xrcd;
    ibv_qp *qp = ibv_create_qp_ex(w.ctx, &ia);
    ASSERT_NE(qp, nullptr) << strerror(errno);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kPeerQpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xFF;
    uint32_t peer = ip4(kPeerAddr);
    std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer, 4);
    ASSERT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT), 0);
    Bytes xrceth = {0, 0x0A, 0xBC, 0xDE}; // no such SRQ
    for (const char *src : {kStrangerAddr, kPeerAddr}) {
        SCOPED_TRACE(src);
        Bytes p = packet(wire::kXrcBase | kSendOnly, qp->qp_num, 0, xrceth, pattern(8, 1), true,
                         kDefaultPkey, src);
        send_raw(std::strcmp(src, kPeerAddr) ? w.stranger : w.peer, p);
        ibv_qp_attr got{};
        ibv_qp_init_attr init{};
        std::optional<Rx> r = receive(w.peer, kSilenceMs);
        ASSERT_EQ(ibv_query_qp(qp, &got, IBV_QP_STATE, &init), 0);
        if (std::strcmp(src, kStrangerAddr) == 0) {
            EXPECT_FALSE(r) << "a stranger's packet was answered";
            EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
        } else {
            // From the peer the same packet is an invalid request.
            ASSERT_TRUE(r);
            EXPECT_EQ(r->raw[kBthLen] & 0xE0, aeth::kNak);
            EXPECT_EQ(got.qp_state, IBV_QPS_ERR);
        }
    }
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

} // namespace
