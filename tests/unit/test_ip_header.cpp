// SPDX-License-Identifier: MIT
//
// What of an address vector reaches the IP header, as RoCEv2 carries it:
// over IPv6 the flow label names the UDP source port, by rdma-core's
// ibv_flow_label_to_udp_sport(); the traffic class and hop limit are the
// header's (IPv4's TOS and TTL), and a receive reports the header's back.
// Real sockets on ::1 and 127.0.0.1: the route tests connect and send
// nothing; the header tests send to a port of their own on an ephemeral
// port, never to 4791.
#include "agent_client.hpp"
#include "nic.hpp"
#include "port_udp.hpp"

#include <arpa/inet.h>
#include <cstring>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <unistd.h>

using namespace sroce;

namespace {

IpAddr ip6(const char *s) {
    IpAddr a;
    EXPECT_TRUE(IpAddr::parse(s, &a)) << s;
    return a;
}

TEST(FlowLabel, SourcePortIsRdmaCoresConvention) {
    for (uint32_t fl : {1u, 0x3FFFu, 0x4000u, 0x12345u, 0xFFFFFu, 0xABCDEu})
        EXPECT_EQ(flow_label_sport(fl), ibv_flow_label_to_udp_sport(fl)) << fl;
}

// An IPv6 route of flow label L leaves from port ibv_flow_label_to_udp_sport(L),
// a route without one from a port of the kernel's choosing; over IPv4 the
// label picks no port (the IP ID counters of connected sockets are told
// apart by port).
TEST(FlowLabel, PicksTheUdpSourcePortOfAnIpv6Route) {
    NicStats stats;
    IpAddr lo6 = ip6("::1");
    UdpPort v6("flow6", lo6, int(if_nametoindex("lo")), stats, {});
    Route plain = v6.route(lo6, lo6, {});
    if (!plain.peer) GTEST_SKIP() << "no IPv6 socket on ::1";
    for (uint32_t fl : {0x12345u, 0x00001u}) {
        Route r = v6.route(lo6, lo6, {fl});
        ASSERT_NE(r.peer, nullptr) << fl;
        EXPECT_EQ(r.sport, ibv_flow_label_to_udp_sport(fl)) << fl;
        EXPECT_NE(r.peer, plain.peer);
        EXPECT_EQ(v6.route(lo6, lo6, {fl}).peer, r.peer) << "one socket per peer and label";
    }
    IpAddr lo4 = IpAddr::v4(htonl(INADDR_LOOPBACK));
    UdpPort v4("flow4", lo4, int(if_nametoindex("lo")), stats, {});
    Route r4 = v4.route(lo4, lo4, {0x12345});
    ASSERT_NE(r4.peer, nullptr);
    EXPECT_EQ(r4.peer, v4.route(lo4, lo4, {}).peer);
    // A traffic class or hop limit of its own is a socket of its own: they
    // are the socket's options, not each send's.
    Route tc = v4.route(lo4, lo4, {0, 0x2A, 0});
    ASSERT_NE(tc.peer, nullptr);
    EXPECT_NE(tc.peer, r4.peer);
    EXPECT_EQ(v4.route(lo4, lo4, {0, 0x2A, 0}).peer, tc.peer);
    EXPECT_NE(v4.route(lo4, lo4, {0, 0x2A, 9}).peer, tc.peer);
}

// A port on `addr`, port 0 (the kernel's choice), with the options every
// device socket gets; its own address and port in `self`.
std::unique_ptr<UdpPort> port_on(const IpAddr &addr, NicStats &stats, SockAddr *self) {
    int lo = int(if_nametoindex("lo"));
    auto p = std::make_unique<UdpPort>("iphdr", addr, lo, stats, UdpPort::Options{});
    if (p->open() != 0) return nullptr;
    int fd = socket(addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    agent::roce_socket_options(fd, addr, lo);
    *self = SockAddr(addr, 0, 0);
    socklen_t len = sizeof self->in6;
    if (bind(fd, &self->sa, self->len) < 0 || getsockname(fd, &self->sa, &len) < 0) {
        close(fd);
        return nullptr;
    }
    if (p->adopt(fd, false) != 0) return nullptr;
    return p;
}

// One datagram of `n` bytes to `to` from the port's own socket, carrying `f`.
void send_one(UdpPort &p, const IpAddr &src, const SockAddr &to, const IpFields &f,
              const uint8_t *data, size_t n) {
    TxBatch b;
    TxBatch::Run &r = b.runs[0];
    r.dst = to;
    r.src = src;
    r.ip = f;
    r.count = 1;
    r.seg = r.bytes = uint32_t(n);
    b.iov[0] = {const_cast<uint8_t *>(data), n};
    b.msgs[0].msg_hdr = {};
    b.msgs[0].msg_hdr.msg_name = &r.dst.sa;
    b.msgs[0].msg_hdr.msg_namelen = r.dst.len;
    b.msgs[0].msg_hdr.msg_iov = b.iov;
    b.msgs[0].msg_hdr.msg_iovlen = 1;
    b.nruns = b.n = b.niov = 1;
    p.transmit(b);
}

// What the next receive returns, waiting a while for it.
bool receive_one(UdpPort &p, RxDatagram *d) {
    for (int i = 0; i < 1000; i++) {
        if (p.receive(d, 1) == 1) return true;
        usleep(1000);
    }
    return false;
}

// The AV's traffic class and hop limit go out in each datagram's header,
// and a receive reports them; without them the kernel's own (TOS 0, TTL and
// hop limit 64) arrive.  The traffic class carries ECN's two bits too.
TEST(IpHeader, TrafficClassAndHopLimitGoOutAndAreReportedBack) {
    // The last: a device of every address of its interface, whose one
    // dual-stack socket sends and receives IPv4 too.
    for (const char *a : {"127.0.0.1", "::1", ""}) {
        SCOPED_TRACE(a);
        NicStats stats;
        bool any = !*a;
        IpAddr addr = any ? IpAddr() : ip6(a);
        SockAddr self;
        std::unique_ptr<UdpPort> p = port_on(addr, stats, &self);
        if (!p && !addr.is_v4()) GTEST_SKIP() << "no IPv6 socket on " << a;
        ASSERT_NE(p, nullptr) << std::strerror(errno);
        if (any) {
            addr = ip6("127.0.0.1");
            self = SockAddr(addr, self.port(), 0);
        }
        const uint8_t data[12] = {0x64, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
        struct Case {
            IpFields sent, seen;
        } cases[] = {
            {{0, 0x2A, 7}, {0, 0x2A, 7}},     // DSCP 10, ECT(0)
            {{0, 0xB8, 255}, {0, 0xB8, 255}}, // DSCP 46, not ECN-capable
            {{0, 0x03, 1}, {0, 0x03, 1}},     // CE, as a marking switch leaves it
            {{}, {0, 0, 64}},
        };
        for (const Case &c : cases) {
            send_one(*p, addr, self, c.sent, data, sizeof data);
            RxDatagram d;
            ASSERT_TRUE(receive_one(*p, &d)) << "tclass " << int(c.sent.tclass);
            ASSERT_EQ(d.len, sizeof data);
            EXPECT_EQ(std::memcmp(d.data, data, sizeof data), 0);
            EXPECT_EQ(d.ip.tclass, c.seen.tclass);
            EXPECT_EQ(d.ip.hop_limit, c.seen.hop_limit);
            // Over IPv6 the kernel labels the flow itself (auto_flowlabels).
            if (addr.is_v4()) {
                EXPECT_EQ(d.ip.flow, 0u);
            }
        }
    }
}

// A flow label in an IPv6 header (here from a socket that leases it, as a
// connected sroce socket does) is reported with the datagram.
TEST(IpHeader, ReceivedFlowLabelIsReported) {
    NicStats stats;
    IpAddr lo6 = ip6("::1");
    SockAddr self;
    std::unique_ptr<UdpPort> p = port_on(lo6, stats, &self);
    if (!p) GTEST_SKIP() << "no IPv6 socket on ::1";
    int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(s, 0);
    constexpr uint32_t kLabel = 0x5A5A1;
    in6_flowlabel_req r{};
    r.flr_dst = in6addr_loopback;
    r.flr_label = htonl(kLabel);
    r.flr_action = IPV6_FL_A_GET;
    r.flr_share = IPV6_FL_S_ANY;
    r.flr_flags = IPV6_FL_F_CREATE;
    int one = 1, tclass = 0x48;
    ASSERT_EQ(setsockopt(s, IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, &r, sizeof r), 0)
        << std::strerror(errno);
    ASSERT_EQ(setsockopt(s, IPPROTO_IPV6, IPV6_FLOWINFO_SEND, &one, sizeof one), 0);
    ASSERT_EQ(setsockopt(s, IPPROTO_IPV6, IPV6_TCLASS, &tclass, sizeof tclass), 0);
    SockAddr to = self;
    to.in6.sin6_flowinfo = htonl(kLabel);
    const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ASSERT_EQ(sendto(s, data, sizeof data, 0, &to.sa, to.len), ssize_t(sizeof data))
        << std::strerror(errno);
    close(s);
    RxDatagram d;
    ASSERT_TRUE(receive_one(*p, &d));
    EXPECT_EQ(d.ip.flow, kLabel);
    EXPECT_EQ(d.ip.tclass, 0x48);
    EXPECT_EQ(d.ip.hop_limit, 64);
}

} // namespace
