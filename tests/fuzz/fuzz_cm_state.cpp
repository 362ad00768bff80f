// SPDX-License-Identifier: MIT
//
// libFuzzer target for the agent's connection manager (agent/cm.cpp and
// cm_ud.cpp): the rdma_cm ids and the InfiniBand CM state machine under
// them, driven by hostile MADs on QP1 mixed with a process's rdma_ucm
// commands and the passing of time.  fuzz_cm_mad covers the MAD codec
// alone; this one covers what the CM does with what the codec accepts.
//
// Every input starts from the same scene, so that the REP, REJ, MRA, DREQ
// and SIDR paths have state to reach: one process with two devices listens
// on a TCP port (any address) and a UDP port (device A), and connects to
// both from its own devices (its REQ and SIDR_REQ are in flight); a second
// process connects a TCP id to a remote peer.  The input is then a sequence
// of steps, each chosen by a control byte (see Step):
//   - a MAD the harness builds around bytes of the input, so the fuzzer
//     need not rediscover the MAD header; on request aimed at a listener
//     (service ID and rdma_cm header), or answering a MAD the CM sent (its
//     communication IDs, transaction ID, addresses and QPN copied in), which
//     gets past lookups no fuzzer could guess;
//   - a MAD the CM sent, looped back as its own device receives it, which
//     plays both ends of a connection through the one CM;
//   - raw bytes as a MAD, of any length;
//   - time advanced and timers() run;
//   - an rdma_ucm command on the ids and joins the process was given (or
//     on stale and made-up ones), or raw command bytes; a channel closed
//     or opened.
// The harness knows the handles from CREATE_ID, GET_EVENT and JOIN
// replies, as librdmacm would; the CM's communication IDs and PSNs are
// random, which the answering steps make irrelevant to the input.
//
// Oracle, besides ASan, UBSan and LeakSanitizer (commands and MADs are
// passed in buffers of their exact size, replies in one of the agent's):
// every MAD the CM sends is 256 bytes that parse; its counters match what
// went in and out; timers() returns -1 or a positive delay; once every
// channel is closed no listener or join is left and the CM falls quiet
// within its retries and timewait.  The CM is destroyed after each input,
// so what it still holds is freed or reported as a leak.
#include "cm.hpp"
#include "cm_wire.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <endian.h>
#include <iterator>
#include <map>
#include <memory>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace sroce;
using sroce::agent::Cm;
using sroce::agent::CmDevice;

[[noreturn]] void fail(const char *what) {
    fprintf(stderr, "fuzz_cm_state: %s\n", what);
    abort();
}

uint32_t ip4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    return htonl(uint32_t(a) << 24 | uint32_t(b) << 16 | uint32_t(c) << 8 | d);
}

IpAddr ip6(const char *s) {
    IpAddr a;
    if (!IpAddr::parse(s, &a)) fail("a bad IPv6 literal in the scene");
    return a;
}

// Documentation addresses (RFC 5737, RFC 3849): the scene's host
// (scene_is_local) answers for them, never the kernel.  Devices A and B are
// IPv4, C is IPv6 with a link-local address on interface kScopeC too.
const IpAddr kDevA = IpAddr::v4(ip4(192, 0, 2, 1)), kDevB = IpAddr::v4(ip4(192, 0, 2, 2)),
             kPeer = IpAddr::v4(ip4(198, 51, 100, 9)), kPeer2 = IpAddr::v4(ip4(203, 0, 113, 7)),
             kLoopback = IpAddr::v4(ip4(127, 0, 0, 1)), kDevC = ip6("2001:db8::1"),
             kDevCLink = ip6("fe80::c"), kPeer6 = ip6("2001:db8::9"), kPeer6Link = ip6("fe80::9"),
             kLoopback6 = ip6("::1");
constexpr uint32_t kScopeC = 3;
constexpr uint16_t kTcpPort = 7471, kUdpPort = 7472;
constexpr size_t kReplyCap = 4096; // the agent's reply buffer (kCmMaxMsg)
constexpr size_t kHistory = 32;    // MADs sent that a step can answer or loop back
constexpr size_t kMaxHandles = 64;
constexpr size_t kMaxChannels = 4;
constexpr int kMaxSteps = 400;

// CM timers run on CLOCK_MONOTONIC milliseconds (cm_internal.hpp).
uint64_t mono_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// The fuzz input, read front to back; past its end every byte reads 0, so
// that any input is a complete sequence of steps.
class Input {
  public:
    Input(const uint8_t *p, size_t n) : p_(p), n_(n) {}
    bool empty() const { return n_ == 0; }
    uint8_t u8() {
        if (!n_) return 0;
        n_--;
        return *p_++;
    }
    uint16_t u16() {
        uint16_t v = u8();
        return uint16_t(v << 8 | u8());
    }
    uint32_t u32() {
        uint32_t v = u16();
        return v << 16 | u16();
    }
    void bytes(uint8_t *dst, size_t len) {
        if (!len) return;
        size_t k = std::min(len, n_);
        std::memcpy(dst, p_, k);
        std::memset(dst + k, 0, len - k);
        p_ += k;
        n_ -= k;
    }
    // A length byte, then that many bytes (at most cap) into dst, which the
    // caller zeroed: short bodies keep inputs short.
    void chunk(uint8_t *dst, size_t cap) { bytes(dst, std::min<size_t>(u8(), cap)); }

  private:
    const uint8_t *p_;
    size_t n_;
};

// The control byte: the low three bits choose the step, the high five are
// its argument.  Each step's comment gives the argument, then the bytes the
// step reads next (make_cm_state_seeds.py writes them the same way).
enum Step : uint8_t {
    kMad,        // attribute; flags, TID (2), body length, body
    kAnswer,     // attribute; flags, which MAD the CM sent (0 the newest),
                 // TID (replaced by the MAD's), body length, body
    kLoopBack,   // -; which MAD the CM sent, for the device it went to
    kTime,       // how far the clock moves; -
    kCommand,    // channel; Command, then that command's bytes
    kCommand2,   // the same (commands are most of what reaches state)
    kRawCommand, // channel; number, reply capacity (2), length (2), bytes
    kRawMad,     // 256 bytes or a length (2) first, local and remote address;
                 // length, bytes
};

// The structured commands: the byte modulo kCommands, whose quotient picks
// a variant (reply capacity, REJ reason, command length...).
enum Command : uint8_t {
    kGetEvent,
    kAccept,
    kAcceptRtu,
    kReject,
    kDisconnect,
    kDestroy,
    kCreate,
    kBindIp,
    kBind,
    kResolveIp,
    kResolveAddr,
    kResolveRoute,
    kConnect,
    kListen,
    kSetOption,
    kNotify,
    kInitQpAttr,
    kQuery,
    kQueryRoute,
    kMigrate,
    kJoin,
    kJoinIp,
    kLeave,
    kClose,
    kOpen,
    kCommands
};

// kMad/kAnswer flags byte: addresses, and whether a REQ or SIDR_REQ is
// aimed at a listener (bits 5-6 choose which service).
constexpr uint8_t kAim = 1 << 4;
struct Service {
    cm::PortSpace ps;
    uint16_t port;
};
constexpr Service kServices[] = {
    {cm::kPsTcp, kTcpPort}, {cm::kPsUdp, kUdpPort}, {cm::kPsTcp, 7473}, {cm::kPsIb, kTcpPort}};

// The scene's host: its own addresses are the two devices' and loopback;
// the peers are reached from device A and B, anything else not at all.
// Answered here so that the outcome of an input never depends on the
// machine's addresses and routes.
bool scene_is_local(const IpAddr &a, uint32_t scope) {
    if (a == kDevCLink) return scope == kScopeC;
    return a == kDevA || a == kDevB || a == kDevC || a.loopback();
}
IpAddr scene_source_for(const IpAddr &dst, uint32_t scope) {
    if (scene_is_local(dst, scope)) return dst;
    if (dst == kPeer) return kDevA;
    if (dst == kPeer2) return kDevB;
    if (dst == kPeer6) return kDevC;
    if (dst.link_local() && scope == kScopeC) return kDevCLink;
    return {};
}
bool scene_on_interface(const IpAddr &a, const char *netdev) {
    return std::strcmp(netdev, "eth_c") == 0 && (a == kDevC || a == kDevCLink);
}

IpAddr local_of(unsigned k) {
    const IpAddr t[] = {kDevA, kDevB, kDevC, kPeer};
    return t[k % 4];
}
IpAddr remote_of(unsigned k) {
    const IpAddr t[] = {kPeer, kDevA, kPeer6, kPeer2};
    return t[k % 4];
}

struct Sent {
    IpAddr local, remote;
    uint8_t mad[cm::kMadLen];
};

class Harness {
  public:
    explicit Harness(int event_fd);
    void step(Input &in);
    void finish();

  private:
    void on_send(const IpAddr &local, const IpAddr &remote, const uint8_t *mad);
    void deliver(const IpAddr &local, const IpAddr &remote, const uint8_t *mad, size_t len);
    int command(uint32_t ch, uint32_t cmd, const void *in, size_t in_len,
                size_t out_cap = kReplyCap, std::vector<uint8_t> *reply = nullptr);
    template <class T>
    int command(uint32_t ch, uint32_t cmd, const T &s, std::vector<uint8_t> *reply = nullptr,
                size_t out_cap = kReplyCap) {
        return command(ch, cmd, &s, sizeof s, out_cap, reply);
    }
    uint32_t open(unsigned devs);
    uint32_t create(uint32_t ch, uint16_t ps, uint64_t uid);
    void learn(uint32_t handle);
    uint32_t pick_handle(Input &in);
    uint32_t pick_channel(unsigned k) const;
    bool pick_sent(uint8_t k, Sent &s) const;
    static uint64_t pick_uid(Input &in);
    static void put_addr(void *sa, Input &in);
    static void fill_param(rdma_ucm_conn_param &p, Input &in);
    static rdma_ucm_ece pick_ece(Input &in);

    void mad_step(Input &in, uint8_t op, bool answer);
    void time_step(uint8_t op);
    void command_step(Input &in, uint8_t op);
    void raw_command_step(Input &in, uint8_t op);
    void raw_mad_step(Input &in, uint8_t op);
    void timers(uint64_t advance);

    // Before cm_: its sender fills them, already while the scene is set.
    std::vector<Sent> sent_;
    std::map<uint32_t, uint32_t> qpn_; // local comm ID -> the QPN its REQ or REP named
    uint64_t sends_ = 0, receives_ = 0;
    Cm cm_;
    int event_fd_;
    std::vector<uint32_t> chans_;
    std::vector<uint32_t> handles_;
    uint64_t clock_;
    int last_timer_ = -1;
    uint32_t next_pid_ = 4242;
};

Harness::Harness(int event_fd)
    : cm_([this](const IpAddr &l, const IpAddr &r, const uint8_t *m) { on_send(l, r, m); },
          {scene_is_local, scene_source_for, scene_on_interface, false}),
      event_fd_(event_fd), clock_(mono_ms()) {
    uint32_t p1 = open(0), p2 = open(1);
    auto ok = [](int e) {
        if (e) fail("setting the scene failed");
    };
    auto sa = [](void *dst, const IpAddr &addr, uint16_t port) {
        SockAddr s(addr, port, kScopeC);
        std::memcpy(dst, &s.in6, s.len);
    };
    auto listen = [&](uint16_t ps, uint64_t uid, const IpAddr &addr, uint16_t port) {
        rdma_ucm_bind_ip b{};
        b.id = create(p1, ps, uid);
        sa(&b.addr, addr, port);
        ok(command(p1, RDMA_USER_CM_CMD_BIND_IP, b));
        ok(command(p1, RDMA_USER_CM_CMD_LISTEN, rdma_ucm_listen{b.id, 4}));
    };
    auto connect = [&](uint32_t ch, uint16_t ps, uint64_t uid, const IpAddr &src, const IpAddr &dst,
                       uint16_t port, uint32_t qpn) {
        rdma_ucm_resolve_ip r{};
        r.id = create(ch, ps, uid);
        sa(&r.src_addr, src, 0);
        sa(&r.dst_addr, dst, port);
        r.timeout_ms = 2000;
        ok(command(ch, RDMA_USER_CM_CMD_RESOLVE_IP, r));
        ok(command(ch, RDMA_USER_CM_CMD_RESOLVE_ROUTE, rdma_ucm_resolve_route{r.id, 2000}));
        rdma_ucm_connect k{};
        k.id = r.id;
        k.conn_param.qp_num = qpn;
        k.conn_param.private_data_len = 8;
        std::memcpy(k.conn_param.private_data, "fuzz_cm!", 8);
        k.conn_param.responder_resources = k.conn_param.initiator_depth = 1;
        k.conn_param.retry_count = k.conn_param.rnr_retry_count = 7;
        k.conn_param.valid = 1;
        ok(command(ch, RDMA_USER_CM_CMD_CONNECT, k));
    };
    listen(RDMA_PS_TCP, 0x1001, IpAddr::v4(INADDR_ANY), kTcpPort);
    listen(RDMA_PS_UDP, 0x1002, kDevA, kUdpPort);
    connect(p1, RDMA_PS_TCP, 0x2001, kDevA, kDevA, kTcpPort, 0x000111);
    connect(p1, RDMA_PS_UDP, 0x2002, kDevB, kDevA, kUdpPort, 0x000222);
    connect(p2, RDMA_PS_TCP, 0x3001, kDevA, kPeer, kTcpPort, 0x000333);
    // IPv6: a wildcard listener of both families (no AFONLY) and a REQ to it
    // from device C.  Last, so that the seeds' positions above hold.
    listen(RDMA_PS_TCP, 0x1003, IpAddr{}, 7473);
    connect(p1, RDMA_PS_TCP, 0x2003, kDevC, kDevC, 7473, 0x000444);
}

void Harness::on_send(const IpAddr &local, const IpAddr &remote, const uint8_t *mad) {
    Sent s;
    s.local = local;
    s.remote = remote;
    std::memcpy(s.mad, mad, sizeof s.mad);
    cm::Mad m;
    if (cm::parse(s.mad, sizeof s.mad, m) != cm::ParseError::kOk)
        fail("the CM sent a MAD that does not parse");
    sends_++;
    // A DREQ names the receiver's QP, which only its REQ or REP told.
    if (m.hdr.attr_id == cm::kReq)
        qpn_[uint32_t(m.field(cm::req::kLocalCommId))] = uint32_t(m.field(cm::req::kLocalQpn));
    else if (m.hdr.attr_id == cm::kRep)
        qpn_[uint32_t(m.field(cm::kLocalCommId))] = uint32_t(m.field(cm::rep::kLocalQpn));
    if (sent_.size() == kHistory) sent_.erase(sent_.begin());
    sent_.push_back(s);
}

void Harness::deliver(const IpAddr &local, const IpAddr &remote, const uint8_t *mad, size_t len) {
    std::unique_ptr<uint8_t[]> copy(new uint8_t[len]);
    if (len) std::memcpy(copy.get(), mad, len);
    receives_++;
    cm_.receive(local, remote, copy.get(), len);
}

int Harness::command(uint32_t ch, uint32_t cmd, const void *in, size_t in_len, size_t out_cap,
                     std::vector<uint8_t> *reply) {
    std::unique_ptr<uint8_t[]> inb(new uint8_t[in_len]);
    if (in_len) std::memcpy(inb.get(), in, in_len);
    std::unique_ptr<uint8_t[]> out(new uint8_t[kReplyCap]);
    size_t out_len = 0;
    int e =
        cm_.command(ch, cmd, inb.get(), in_len, out.get(), std::min(out_cap, kReplyCap), &out_len);
    if (out_len > kReplyCap) fail("a reply longer than the agent's buffer");
    if (e == 0 && reply) reply->assign(out.get(), out.get() + out_len);
    return e;
}

uint32_t Harness::open(unsigned devs) {
    auto dev = [](uint64_t guid, uint32_t index, uint8_t mtu, const char *name,
                  std::vector<IpAddr> gids) {
        CmDevice d;
        d.guid = htobe64(guid);
        d.index = index;
        d.mtu = mtu;
        std::strcpy(d.name, name);
        d.gids = std::move(gids);
        return d;
    };
    CmDevice a = dev(0x0002C9FFFE000001, 0, 3, "sroce_a", {ip6("fe80::a"), kDevA});
    a.addr = kDevA;
    CmDevice b = dev(0x0002C9FFFE000002, 1, 5, "sroce_b", {ip6("fe80::b"), kDevB});
    b.addr = kDevB;
    // C follows its interface: the table the process saw lists both its
    // addresses, the link-local one first.
    CmDevice c = dev(0x0002C9FFFE000003, 2, 4, "sroce_c", {kDevCLink, IpAddr{}, kDevC});
    c.follow = true;
    std::strcpy(c.netdev, "eth_c");
    std::vector<CmDevice> d;
    switch (devs % 4) {
    case 0:
        d = {a, b, c};
        break;
    case 1:
        d = {a};
        break;
    case 2:
        d = {b};
        break;
    default:
        break;
    }
    uint32_t ch =
        cm_.open_channel(event_fd_, pid_t(next_pid_++), getuid(), devs % 2 == 0, std::move(d));
    chans_.push_back(ch);
    return ch;
}

uint32_t Harness::create(uint32_t ch, uint16_t ps, uint64_t uid) {
    rdma_ucm_create_id c{};
    c.uid = uid;
    c.ps = ps;
    std::vector<uint8_t> r;
    if (command(ch, RDMA_USER_CM_CMD_CREATE_ID, c, &r) || r.size() < 4)
        fail("setting the scene failed");
    uint32_t h;
    std::memcpy(&h, r.data(), 4);
    learn(h);
    return h;
}

void Harness::learn(uint32_t h) {
    if (handles_.size() < kMaxHandles &&
        std::find(handles_.begin(), handles_.end(), h) == handles_.end())
        handles_.push_back(h);
}

// Mostly a handle the process was given (destroyed ones stay: a stale
// handle is a case too), sometimes a made-up one.
uint32_t Harness::pick_handle(Input &in) {
    uint8_t b = in.u8();
    if (b >= 0xF0 || handles_.empty()) return b & 0x0F;
    return handles_[b % handles_.size()];
}

// A channel that is open, or one that is not.
uint32_t Harness::pick_channel(unsigned k) const {
    if (chans_.empty() || k % 8 == 7) return 100 + k;
    return chans_[k % chans_.size()];
}

// The k-th most recent MAD the CM sent.
bool Harness::pick_sent(uint8_t k, Sent &s) const {
    if (sent_.empty()) return false;
    s = sent_[sent_.size() - 1 - k % sent_.size()];
    return true;
}

// The scene's uids too, as destroy_id finds a listener's requests by uid.
uint64_t Harness::pick_uid(Input &in) {
    const uint64_t t[] = {0x1001, 0x2001, 0, 0x5000};
    uint8_t b = in.u8();
    return b < 4 ? t[b] : 0x6000 + b;
}

// An address of either family: bits 0-2 pick it, 3-5 the port, 6 the
// family (IPv6: its wildcard, device C's global and link-local addresses,
// the peer's, loopback, a link-local address without a scope, and an IPv4
// one mapped), 7 an unspecified family.
void Harness::put_addr(void *sa, Input &in) {
    uint8_t b = in.u8();
    const IpAddr v4[] = {IpAddr::v4(INADDR_ANY), kDevA, kDevB, kPeer, kLoopback, kDevA, kDevB,
                         IpAddr::v4(INADDR_ANY)};
    const IpAddr v6[] = {IpAddr{},   kDevC,      kDevCLink,  kPeer6,
                         kLoopback6, kPeer6Link, kPeer6Link, kDevA};
    const uint16_t ports[] = {0, kTcpPort, kUdpPort, 7473, 80, 0, kTcpPort, kUdpPort};
    uint16_t port = ports[b >> 3 & 7];
    if ((b >> 3 & 7) == 5) port = in.u16();
    SockAddr s;
    if (b & 0x40) {
        s = SockAddr::any(AF_INET6);
        s.in6.sin6_addr = v6[b & 7].v6_addr();
        s.in6.sin6_scope_id = (b & 7) == 2 || (b & 7) == 5 ? kScopeC : 0;
        s.set_port(port);
    } else {
        s = SockAddr(v4[b & 7], port);
    }
    if (b & 0x80) s.sa.sa_family = AF_UNSPEC;
    std::memcpy(sa, &s.in6, sizeof s.in6);
}

void Harness::fill_param(rdma_ucm_conn_param &p, Input &in) {
    p.qp_num = in.u32();
    p.private_data_len = in.u8();
    // Only its length matters to the CM; the bytes travel as they are.
    for (size_t i = 0; i < sizeof p.private_data; i++)
        p.private_data[i] = uint8_t(i * 7 + 1);
    uint8_t f = in.u8();
    p.srq = f & 1;
    p.flow_control = f >> 1 & 1;
    p.retry_count = f >> 2 & 7;
    p.rnr_retry_count = f >> 5 & 7;
    p.responder_resources = in.u8();
    p.initiator_depth = in.u8();
    p.valid = 1;
}

rdma_ucm_ece Harness::pick_ece(Input &in) {
    switch (in.u8() % 4) {
    case 0:
        return {};
    case 1:
        return {0xFFFFFF, 0x5C00000F}; // what sroce's QPs offer
    default: {
        rdma_ucm_ece e;
        e.vendor_id = in.u32();
        e.attr_mod = in.u32();
        return e;
    }
    }
}

void Harness::step(Input &in) {
    uint8_t op = in.u8();
    switch (Step(op & 7)) {
    case kMad:
        return mad_step(in, op, false);
    case kAnswer:
        return mad_step(in, op, true);
    case kLoopBack: {
        Sent s;
        if (!pick_sent(in.u8(), s)) return;
        // What the CM sent from `local` to `remote` arrives at `remote`.
        return deliver(s.remote, s.local, s.mad, sizeof s.mad);
    }
    case kTime:
        return time_step(op);
    case kCommand:
    case kCommand2:
        return command_step(in, op);
    case kRawCommand:
        return raw_command_step(in, op);
    case kRawMad:
        return raw_mad_step(in, op);
    }
}

void Harness::mad_step(Input &in, uint8_t op, bool answer) {
    using namespace cm;
    static constexpr uint16_t kAttrs[] = {kReq,  kMra,     kRej,     kRep, kRtu, kDreq,
                                          kDrep, kSidrReq, kSidrRep, kLap, kReq, kRep};
    uint16_t attr = kAttrs[(op >> 3) % std::size(kAttrs)];
    uint8_t how = in.u8();
    IpAddr local = local_of(how), remote = remote_of(how >> 2);
    Sent s;
    bool answering = answer && pick_sent(in.u8(), s);
    uint8_t mad[kMadLen] = {};
    MadHdr h;
    h.attr_id = attr;
    h.tid = in.u16();
    uint8_t *b = mad + kMadHdrLen;
    in.chunk(b, kCmDataLen);
    if (answering) {
        // From where the CM sent it to, arriving where it came from.
        local = s.local;
        remote = s.remote;
    }
    if (how & kAim) {
        const Service &sv = kServices[how >> 5 & 3];
        size_t pd = attr == kReq ? req::kPrivateData : sidr_req::kPrivateData;
        if (attr == kReq || attr == kSidrReq) {
            set(b, attr == kReq ? req::kServiceId : sidr_req::kServiceId,
                service_id(sv.ps, sv.port));
            CmaHdr c;
            c.set(remote, local);
            c.port = get16(b + pd + 2);
            c.store(b + pd);
        }
        if (attr == kReq) std::memcpy(b + req::kPrimaryLocalGid, remote.raw, 16);
    }
    if (answering) {
        Mad sm;
        (void)parse(s.mad, sizeof s.mad, sm);
        h.tid = sm.hdr.tid;
        uint32_t their_local = uint32_t(get(sm.body, kLocalCommId));
        uint32_t their_remote = uint32_t(get(sm.body, kRemoteCommId));
        uint16_t sa = sm.hdr.attr_id;
        bool connected = sa != kReq && sa != kSidrReq && sa != kSidrRep;
        switch (attr) {
        case kSidrReq:
        case kSidrRep:
            set(b, sidr_req::kRequestId, their_local);
            break;
        case kReq:
            // The peer's REQ again, which the CM's REP or REJ answered.
            if (connected) set(b, req::kLocalCommId, their_remote);
            break;
        default:
            set(b, kRemoteCommId, their_local);
            if (connected) set(b, kLocalCommId, their_remote);
            if (attr == kDreq)
                if (auto q = qpn_.find(their_local); q != qpn_.end())
                    set(b, dreq::kRemoteQpn, q->second);
            break;
        }
    }
    h.store(mad);
    deliver(local, remote, mad, sizeof mad);
}

void Harness::timers(uint64_t advance) {
    clock_ = std::max(clock_, mono_ms()) + advance;
    int r = cm_.timers(clock_);
    if (r != -1 && r < 1) fail("timers() returned neither -1 nor a delay");
    last_timer_ = r;
}

void Harness::time_step(uint8_t op) {
    // Up to the retries of a REQ (6.1 s) and a SIDR_REQ (4.1 s), a REP's or
    // DREQ's CM response timeout (up to 2^23 ms) and MRA's extensions.
    static constexpr uint64_t kSteps[] = {0,       1,       20,         500,       4096,
                                          4200,    6200,    16400,      65536,     1 << 20,
                                          1 << 22, 1 << 24, 1ull << 25, 1ull << 32};
    unsigned k = (op >> 3) % (std::size(kSteps) + 1);
    timers(k == std::size(kSteps) ? uint64_t(std::max(last_timer_, 0)) : kSteps[k]);
}

void Harness::command_step(Input &in, uint8_t op) {
    uint32_t ch = pick_channel(op >> 3);
    uint8_t which = in.u8();
    std::vector<uint8_t> reply;
    switch (Command(which % kCommands)) {
    case kGetEvent: {
        const size_t caps[] = {sizeof(rdma_ucm_event_resp), offsetof(rdma_ucm_event_resp, reserved),
                               16, kReplyCap};
        if (command(ch, RDMA_USER_CM_CMD_GET_EVENT, rdma_ucm_get_event{}, &reply,
                    caps[which / kCommands % 4]) == 0 &&
            reply.size() >= offsetof(rdma_ucm_event_resp, event)) {
            uint32_t h;
            std::memcpy(&h, reply.data() + offsetof(rdma_ucm_event_resp, id), 4);
            learn(h);
        }
        return;
    }
    case kAccept:
    case kAcceptRtu: {
        rdma_ucm_accept a{};
        a.id = pick_handle(in);
        a.uid = pick_uid(in);
        if (which % kCommands == kAccept) fill_param(a.conn_param, in);
        a.ece = pick_ece(in);
        // Without its ECE (an older librdmacm), or cut short.
        const size_t lens[] = {sizeof a, offsetof(rdma_ucm_accept, ece), sizeof a, 16};
        command(ch, RDMA_USER_CM_CMD_ACCEPT, &a, lens[which / kCommands % 4]);
        return;
    }
    case kReject: {
        rdma_ucm_reject r{};
        r.id = pick_handle(in);
        const uint8_t reasons[] = {0, cm::kRejConsumerDefined, cm::kRejVendorOptionNotSupported,
                                   cm::kRejNoQp};
        r.reason = reasons[which / kCommands % 4];
        r.private_data_len = in.u8();
        command(ch, RDMA_USER_CM_CMD_REJECT, r);
        return;
    }
    case kDisconnect:
        command(ch, RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{pick_handle(in)});
        return;
    case kDestroy: {
        rdma_ucm_destroy_id d{};
        d.id = pick_handle(in);
        command(ch, RDMA_USER_CM_CMD_DESTROY_ID, d);
        return;
    }
    case kCreate: {
        rdma_ucm_create_id c{};
        c.uid = pick_uid(in);
        const uint16_t ps[] = {RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB, 0x0999};
        uint8_t b = in.u8();
        c.ps = ps[b % 5];
        c.qp_type = b / 5 % 11; // RC 2, UC 3, UD 4, XRC 9, 10 among others
        if (command(ch, RDMA_USER_CM_CMD_CREATE_ID, c, &reply) == 0 && reply.size() >= 4) {
            uint32_t h;
            std::memcpy(&h, reply.data(), 4);
            learn(h);
        }
        return;
    }
    case kBindIp: {
        rdma_ucm_bind_ip b{};
        b.id = pick_handle(in);
        put_addr(&b.addr, in);
        command(ch, RDMA_USER_CM_CMD_BIND_IP, b);
        return;
    }
    case kBind: {
        rdma_ucm_bind b{};
        b.id = pick_handle(in);
        put_addr(&b.addr, in);
        const uint16_t sizes[] = {sizeof(sockaddr_in), sizeof(sockaddr_in6), sizeof b.addr, 2};
        b.addr_size = sizes[which / kCommands % 4];
        command(ch, RDMA_USER_CM_CMD_BIND, b);
        return;
    }
    case kResolveIp: {
        rdma_ucm_resolve_ip r{};
        r.id = pick_handle(in);
        put_addr(&r.src_addr, in);
        put_addr(&r.dst_addr, in);
        r.timeout_ms = 2000;
        command(ch, RDMA_USER_CM_CMD_RESOLVE_IP, r);
        return;
    }
    case kResolveAddr: {
        rdma_ucm_resolve_addr r{};
        r.id = pick_handle(in);
        put_addr(&r.src_addr, in);
        put_addr(&r.dst_addr, in);
        r.src_size = r.dst_size = sizeof(sockaddr_in);
        r.timeout_ms = 2000;
        r.reserved = which / kCommands % 4 == 3;
        command(ch, RDMA_USER_CM_CMD_RESOLVE_ADDR, r);
        return;
    }
    case kResolveRoute:
        command(ch, RDMA_USER_CM_CMD_RESOLVE_ROUTE,
                rdma_ucm_resolve_route{pick_handle(in), which / kCommands % 4 == 3 ? 0u : 2000u});
        return;
    case kConnect: {
        rdma_ucm_connect k{};
        k.id = pick_handle(in);
        fill_param(k.conn_param, in);
        k.conn_param.valid = which / kCommands % 4 != 3;
        k.ece = pick_ece(in);
        const size_t lens[] = {sizeof k, offsetof(rdma_ucm_connect, ece), sizeof k, sizeof k};
        command(ch, RDMA_USER_CM_CMD_CONNECT, &k, lens[which / kCommands % 4]);
        return;
    }
    case kListen: {
        const uint32_t backlogs[] = {0, 1, 2, 5000};
        command(ch, RDMA_USER_CM_CMD_LISTEN,
                rdma_ucm_listen{pick_handle(in), backlogs[which / kCommands % 4]});
        return;
    }
    case kSetOption: {
        struct Option {
            uint32_t level, name, len;
        };
        static constexpr Option kOptions[] = {
            {RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, 1},
            {RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 4},
            {RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, 4},
            {RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 1},
            {RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, sizeof(ib_path_rec_data)},
            {RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, 2 * sizeof(ib_path_rec_data)},
            {RDMA_OPTION_ID, 9, 4},
            {RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, 4}};
        uint8_t b = in.u8();
        const Option &o = kOptions[b % std::size(kOptions)];
        rdma_ucm_set_option s{};
        s.id = pick_handle(in);
        s.level = o.level;
        s.optname = o.name;
        s.optlen = o.len;
        std::vector<uint8_t> buf(sizeof s + o.len);
        in.bytes(buf.data() + sizeof s, o.len);
        // The value the process says it appended, and sometimes did not.
        if (b & 0x80) s.optlen += 8;
        std::memcpy(buf.data(), &s, sizeof s);
        command(ch, RDMA_USER_CM_CMD_SET_OPTION, buf.data(), buf.size());
        return;
    }
    case kNotify: {
        const uint32_t events[] = {0, 16, 3, 0};
        command(ch, RDMA_USER_CM_CMD_NOTIFY,
                rdma_ucm_notify{pick_handle(in), events[which / kCommands % 4]});
        return;
    }
    case kInitQpAttr: {
        rdma_ucm_init_qp_attr q{};
        q.id = pick_handle(in);
        q.qp_state = in.u8() % 8;
        command(ch, RDMA_USER_CM_CMD_INIT_QP_ATTR, q);
        return;
    }
    case kQuery: {
        rdma_ucm_query q{};
        q.id = pick_handle(in);
        uint8_t b = in.u8();
        q.option = b % 4;
        const size_t caps[] = {kReplyCap, 8, 8 + sizeof(ib_path_rec_data) - 1,
                               offsetof(rdma_ucm_query_addr_resp, ibdev_index)};
        command(ch, RDMA_USER_CM_CMD_QUERY, q, nullptr, caps[b / 4 % 4]);
        return;
    }
    case kQueryRoute: {
        rdma_ucm_query q{};
        q.id = pick_handle(in);
        const size_t caps[] = {kReplyCap, sizeof(rdma_ucm_query_route_resp),
                               offsetof(rdma_ucm_query_route_resp, ibdev_index), 8};
        command(ch, RDMA_USER_CM_CMD_QUERY_ROUTE, q, nullptr, caps[which / kCommands % 4]);
        return;
    }
    case kMigrate: {
        // The shim replaces the old file descriptor with its channel's number.
        rdma_ucm_migrate_id m{};
        m.id = pick_handle(in);
        m.fd = pick_channel(in.u8());
        command(ch, RDMA_USER_CM_CMD_MIGRATE_ID, m);
        return;
    }
    case kJoin:
    case kJoinIp: {
        uint8_t b = in.u8();
        uint8_t addr[sizeof(sockaddr_storage)] = {};
        if (b % 4 == 3) {
            sockaddr_in6 s{};
            s.sin6_family = AF_INET6;
            s.sin6_addr.s6_addr[0] = 0xFF;
            s.sin6_addr.s6_addr[1] = 0x02;
            s.sin6_addr.s6_addr[15] = 1;
            std::memcpy(addr, &s, sizeof s);
        } else {
            sockaddr_in s{};
            s.sin_family = AF_INET;
            const uint32_t groups[] = {ip4(224, 1, 1, 1), ip4(239, 0, 0, 7), 0};
            s.sin_addr.s_addr = groups[b % 4];
            std::memcpy(addr, &s, sizeof s);
        }
        int e;
        if (which % kCommands == kJoin) {
            rdma_ucm_join_mcast j{};
            j.uid = pick_uid(in);
            j.id = pick_handle(in);
            j.join_flags = b / 4 % 3;
            const uint16_t sizes[] = {sizeof(sockaddr_in), 28, 0, sizeof(sockaddr_in)};
            j.addr_size = b % 4 == 3 ? 28 : sizes[b / 16 % 4];
            std::memcpy(&j.addr, addr, sizeof addr);
            e = command(ch, RDMA_USER_CM_CMD_JOIN_MCAST, j, &reply);
        } else {
            rdma_ucm_join_ip_mcast j{};
            j.uid = pick_uid(in);
            j.id = pick_handle(in);
            std::memcpy(&j.addr, addr, sizeof j.addr);
            e = command(ch, RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, &reply);
        }
        if (e == 0 && reply.size() >= 4) {
            uint32_t h;
            std::memcpy(&h, reply.data(), 4);
            learn(h);
        }
        return;
    }
    case kLeave: {
        rdma_ucm_destroy_id d{};
        d.id = pick_handle(in);
        command(ch, RDMA_USER_CM_CMD_LEAVE_MCAST, d);
        return;
    }
    case kClose:
        cm_.close_channel(ch);
        std::erase(chans_, ch);
        return;
    case kOpen:
        if (chans_.size() < kMaxChannels) open(which / kCommands);
        return;
    case kCommands:
        return;
    }
}

void Harness::raw_command_step(Input &in, uint8_t op) {
    uint32_t ch = pick_channel(op >> 3);
    uint8_t cmd = in.u8();
    size_t cap = in.u16() % (kReplyCap + 1);
    size_t len = in.u16() % 600;
    std::vector<uint8_t> buf(len);
    in.bytes(buf.data(), len);
    command(ch, cmd, buf.data(), len, cap);
}

void Harness::raw_mad_step(Input &in, uint8_t op) {
    size_t len = op & 8 ? cm::kMadLen : in.u16() % 320;
    std::vector<uint8_t> mad(len);
    in.bytes(mad.data(), len);
    deliver(local_of(op >> 4), remote_of(op >> 6), mad.data(), len);
}

void Harness::finish() {
    while (!chans_.empty()) {
        cm_.close_channel(chans_.back());
        chans_.pop_back();
    }
    if (!cm_.listeners().empty()) fail("a listener outlived its channel");
    if (!cm_.joins().empty()) fail("a multicast join outlived its channel");
    // What is left is being torn down: DREQs and REJs retried at most 15
    // times each, timewait after; far apart steps fire each once.
    for (int i = 0; i < 256 && (i == 0 || last_timer_ != -1); i++)
        timers(uint64_t(1) << 32);
    if (last_timer_ != -1) fail("the CM still runs timers after every channel closed");
    const Cm::Stats &st = cm_.stats();
    if (st.tx_mads != sends_ || st.rx_mads + st.rx_bad != receives_)
        fail("the CM's counters disagree with the MADs it sent and received");
}

// The channels' wake-up bytes go to one socket pair, emptied after each
// input (the CM sends them without waiting, so a full one only drops them).
int event_socket(int which) {
    static int sv[2] = {-1, -1};
    if (sv[0] < 0 && socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        fail("socketpair");
    return sv[which];
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    {
        Harness h(event_socket(0));
        for (int n = 0; n < kMaxSteps && !in.empty(); n++)
            h.step(in);
        h.finish();
    }
    char b[64];
    while (recv(event_socket(1), b, sizeof b, MSG_DONTWAIT) > 0) {
    }
    return 0;
}
