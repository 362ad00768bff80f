// SPDX-License-Identifier: MIT
//
// The flow label of an address vector as RoCEv2 carries it: over IPv6 it
// names the UDP source port, by rdma-core's ibv_flow_label_to_udp_sport().
// Real sockets on ::1 and 127.0.0.1 (connected, nothing is sent).
#include "nic.hpp"
#include "port_udp.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <net/if.h>

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
    Route plain = v6.route(lo6, lo6, 0);
    if (!plain.peer) GTEST_SKIP() << "no IPv6 socket on ::1";
    for (uint32_t fl : {0x12345u, 0x00001u}) {
        Route r = v6.route(lo6, lo6, fl);
        ASSERT_NE(r.peer, nullptr) << fl;
        EXPECT_EQ(r.sport, ibv_flow_label_to_udp_sport(fl)) << fl;
        EXPECT_NE(r.peer, plain.peer);
        EXPECT_EQ(v6.route(lo6, lo6, fl).peer, r.peer) << "one socket per peer and label";
    }
    IpAddr lo4 = IpAddr::v4(htonl(INADDR_LOOPBACK));
    UdpPort v4("flow4", lo4, int(if_nametoindex("lo")), stats, {});
    Route r4 = v4.route(lo4, lo4, 0x12345);
    ASSERT_NE(r4.peer, nullptr);
    EXPECT_EQ(r4.peer, v4.route(lo4, lo4, 0).peer);
}

} // namespace
