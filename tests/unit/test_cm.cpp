// SPDX-License-Identifier: MIT
//
// The agent's connection manager (agent/cm.cpp, cm_ud.cpp) over IPv6 and
// IPv4, driven through the rdma_ucm commands librdmacm sends, with every MAD
// it sends looped back to it in memory: one process holds three devices,
// so both ends of a connection are ids of one CM.  The host is made up
// (HostRoutes), so the outcome never depends on this machine's addresses:
//   - device A follows interface eth0 (index 2): fe80::a, 10.0.0.1 and
//     2001:db8::1, GID table {fe80::a, ::ffff:10.0.0.1, 2001:db8::1};
//   - device B has 2001:db8::2, GID table {fe80::b, 2001:db8::2};
//   - device C has 10.0.0.2.
// Checked: connections over IPv6 with the rdma_cm header and path as the
// kernel writes them, each address handle naming the GID index of its
// source address; a wildcard listener's families (AFONLY); ports shared
// between families; link-local scopes; the flow label a process binds
// with; SIDR and multicast joins over IPv6; the errors of what is wrong.
#include "cm.hpp"
#include "cm_internal.hpp"
#include "cm_wire.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>
#include <deque>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace sroce;
using namespace sroce::agent;

IpAddr ip(const char *s) {
    IpAddr a;
    EXPECT_TRUE(IpAddr::parse(s, &a)) << s;
    return a;
}

constexpr uint32_t kEth0 = 2;

bool on_eth0(const IpAddr &a, const char *netdev) {
    return std::strcmp(netdev, "eth0") == 0 &&
           (a == ip("fe80::a") || a == ip("10.0.0.1") || a == ip("2001:db8::1"));
}
bool host_local(const IpAddr &a, uint32_t scope) {
    if (a.link_local()) return scope == kEth0 && a == ip("fe80::a");
    return on_eth0(a, "eth0") || a == ip("2001:db8::2") || a == ip("10.0.0.2");
}
IpAddr host_source(const IpAddr &dst, uint32_t scope) {
    if (host_local(dst, scope)) return dst;
    if (dst.link_local()) return scope == kEth0 ? ip("fe80::a") : IpAddr{};
    if (!dst.is_v4() && dst.raw[0] == 0x20) return ip("2001:db8::1");
    if (dst.is_v4() && dst.raw[12] == 10) return ip("10.0.0.1");
    return {};
}

struct Mad {
    IpAddr from, to;
    std::vector<uint8_t> bytes;
};

class CmTest : public testing::Test {
  protected:
    CmTest()
        : cm_(
              [this](const IpAddr &l, const IpAddr &r, const uint8_t *m) {
                  wire_.push_back({l, r, std::vector<uint8_t>(m, m + cm::kMadLen)});
              },
              {host_local, host_source, on_eth0, false}) {
        EXPECT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, fds_), 0);
        CmDevice a, b, c;
        a.follow = true;
        std::strcpy(a.netdev, "eth0");
        a.guid = htobe64(0x0200000000000A);
        a.index = 0;
        std::strcpy(a.name, "sa");
        a.gids = {ip("fe80::a"), ip("10.0.0.1"), ip("2001:db8::1")};
        b.addr = ip("2001:db8::2");
        b.guid = htobe64(0x0200000000000B);
        b.index = 1;
        std::strcpy(b.name, "sb");
        b.gids = {ip("fe80::b"), ip("2001:db8::2")};
        c.addr = ip("10.0.0.2");
        c.guid = htobe64(0x0200000000000C);
        c.index = 2;
        std::strcpy(c.name, "sc");
        c.gids = {ip("fe80::c"), ip("10.0.0.2")};
        ch_ = cm_.open_channel(fds_[0], getpid(), getuid(), true, {a, b, c});
    }
    ~CmTest() override {
        cm_.close_channel(ch_);
        close(fds_[0]);
        close(fds_[1]);
    }

    template <class T>
    int cmd(uint32_t c, const T &in, std::vector<uint8_t> *out = nullptr,
            const void *extra = nullptr, size_t extra_len = 0) {
        std::vector<uint8_t> buf(sizeof in + extra_len);
        std::memcpy(buf.data(), &in, sizeof in);
        if (extra_len) std::memcpy(buf.data() + sizeof in, extra, extra_len);
        uint8_t reply[4096];
        size_t n = 0;
        int e = cm_.command(ch_, c, buf.data(), buf.size(), reply, sizeof reply, &n);
        if (out) out->assign(reply, reply + n);
        return e;
    }
    // The reply of command `c`, which must succeed, as an R.
    template <class R, class T>
    R reply(uint32_t c, const T &in) {
        std::vector<uint8_t> r;
        EXPECT_EQ(cmd(c, in, &r), 0) << "command " << c;
        R out{};
        std::memcpy(&out, r.data(), std::min(r.size(), sizeof out));
        return out;
    }
    uint32_t create(uint16_t ps, uint64_t uid) {
        rdma_ucm_create_id c{};
        c.uid = uid;
        c.ps = ps;
        return reply<rdma_ucm_create_id_resp>(RDMA_USER_CM_CMD_CREATE_ID, c).id;
    }
    static SockAddr sa(const char *a, uint16_t port, uint32_t scope = 0) {
        return SockAddr(ip(a), port, scope);
    }
    int bind(uint32_t id, const SockAddr &s) {
        rdma_ucm_bind b{};
        b.id = id;
        b.addr_size = uint16_t(s.len);
        std::memcpy(&b.addr, &s.in6, s.len);
        return cmd(RDMA_USER_CM_CMD_BIND, b);
    }
    int set_afonly(uint32_t id, int v) {
        rdma_ucm_set_option o{};
        o.id = id;
        o.level = RDMA_OPTION_ID;
        o.optname = RDMA_OPTION_ID_AFONLY;
        o.optlen = sizeof v;
        return cmd(RDMA_USER_CM_CMD_SET_OPTION, o, nullptr, &v, sizeof v);
    }
    int listen(uint32_t id) { return cmd(RDMA_USER_CM_CMD_LISTEN, rdma_ucm_listen{id, 8}); }
    int resolve(uint32_t id, const SockAddr *src, const SockAddr &dst) {
        rdma_ucm_resolve_addr r{};
        r.id = id;
        if (src) {
            std::memcpy(&r.src_addr, &src->in6, src->len);
            r.src_size = uint16_t(src->len);
        }
        std::memcpy(&r.dst_addr, &dst.in6, dst.len);
        r.dst_size = uint16_t(dst.len);
        r.timeout_ms = 2000;
        return cmd(RDMA_USER_CM_CMD_RESOLVE_ADDR, r);
    }
    // Resolves the address and the route, each event checked.
    void resolve_all(uint32_t id, const SockAddr *src, const SockAddr &dst) {
        ASSERT_EQ(resolve(id, src, dst), 0);
        EXPECT_EQ(event().event, uint32_t(RDMA_CM_EVENT_ADDR_RESOLVED));
        ASSERT_EQ(cmd(RDMA_USER_CM_CMD_RESOLVE_ROUTE, rdma_ucm_resolve_route{id, 2000}), 0);
        EXPECT_EQ(event().event, uint32_t(RDMA_CM_EVENT_ROUTE_RESOLVED));
    }
    int connect(uint32_t id, uint32_t qpn) {
        rdma_ucm_connect k{};
        k.id = id;
        k.conn_param.qp_num = qpn;
        k.conn_param.responder_resources = k.conn_param.initiator_depth = 1;
        k.conn_param.retry_count = k.conn_param.rnr_retry_count = 7;
        k.conn_param.valid = 1;
        return cmd(RDMA_USER_CM_CMD_CONNECT, k);
    }
    int accept(uint32_t id, uint64_t uid, uint32_t qpn) {
        rdma_ucm_accept a{};
        a.id = id;
        a.uid = uid;
        a.conn_param.qp_num = qpn;
        a.conn_param.responder_resources = a.conn_param.initiator_depth = 1;
        a.conn_param.rnr_retry_count = 7;
        a.conn_param.valid = qpn != 0;
        return cmd(RDMA_USER_CM_CMD_ACCEPT, a);
    }
    rdma_ucm_event_resp event() {
        rdma_ucm_get_event g{};
        std::vector<uint8_t> r;
        rdma_ucm_event_resp e{};
        e.event = ~0u;
        if (cmd(RDMA_USER_CM_CMD_GET_EVENT, g, &r) == 0)
            std::memcpy(&e, r.data(), std::min(r.size(), sizeof e));
        return e;
    }
    rdma_ucm_query_addr_resp query_addr(uint32_t id) {
        rdma_ucm_query q{};
        q.id = id;
        q.option = RDMA_USER_CM_QUERY_ADDR;
        return reply<rdma_ucm_query_addr_resp>(RDMA_USER_CM_CMD_QUERY, q);
    }
    ib_uverbs_qp_attr init_qp_attr(uint32_t id, uint32_t state) {
        rdma_ucm_init_qp_attr q{};
        q.id = id;
        q.qp_state = state;
        return reply<ib_uverbs_qp_attr>(RDMA_USER_CM_CMD_INIT_QP_ATTR, q);
    }
    // Delivers every MAD in flight where it was sent; returns how many.
    size_t pump() {
        size_t n = 0;
        while (!wire_.empty()) {
            Mad m = wire_.front();
            wire_.pop_front();
            cm_.receive(m.to, m.from, m.bytes.data(), m.bytes.size());
            n++;
        }
        return n;
    }
    static SockAddr addr_of(const void *storage) {
        SockAddr s;
        EXPECT_TRUE(SockAddr::load(storage, &s));
        return s;
    }

    Cm cm_;
    std::deque<Mad> wire_;
    int fds_[2] = {-1, -1};
    uint32_t ch_ = 0;
};

TEST_F(CmTest, ConnectsOverIpv6AsTheKernelWritesIt) {
    uint32_t lis = create(RDMA_PS_TCP, 0x100);
    ASSERT_EQ(bind(lis, sa("::", 7000)), 0);
    ASSERT_EQ(listen(lis), 0);
    uint32_t cli = create(RDMA_PS_TCP, 0x200);
    SockAddr src = sa("2001:db8::2", 0);
    resolve_all(cli, &src, sa("2001:db8::1", 7000));
    rdma_ucm_query_addr_resp qa = query_addr(cli);
    EXPECT_EQ(qa.src_size, sizeof(sockaddr_in6));
    EXPECT_EQ(qa.ibdev_index, 1u) << "device B has the source address";
    uint16_t cport = addr_of(&qa.src_addr).port();
    ASSERT_EQ(connect(cli, 0x11), 0);

    // The REQ: from B to A, the rdma_cm header of IP version 6 with both
    // addresses whole, the path's GIDs the addresses themselves.
    ASSERT_EQ(wire_.size(), 1u);
    EXPECT_EQ(wire_[0].from, ip("2001:db8::2"));
    EXPECT_EQ(wire_[0].to, ip("2001:db8::1"));
    cm::Mad req;
    ASSERT_EQ(cm::parse(wire_[0].bytes.data(), cm::kMadLen, req), cm::ParseError::kOk);
    const uint8_t *pd = req.body + cm::req::kPrivateData;
    EXPECT_EQ(pd[0], 0) << "cma version";
    EXPECT_EQ(pd[1], 0x60) << "IP version 6 in the high nibble";
    EXPECT_EQ(cm::get16(pd + 2), cport);
    EXPECT_EQ(std::memcmp(pd + 4, ip("2001:db8::2").raw, 16), 0);
    EXPECT_EQ(std::memcmp(pd + 20, ip("2001:db8::1").raw, 16), 0);
    EXPECT_EQ(std::memcmp(req.body + cm::req::kPrimaryLocalGid, ip("2001:db8::2").raw, 16), 0);
    EXPECT_EQ(std::memcmp(req.body + cm::req::kPrimaryRemoteGid, ip("2001:db8::1").raw, 16), 0);
    EXPECT_EQ(req.field(cm::req::kServiceId), cm::service_id(cm::kPsTcp, 7000));

    EXPECT_EQ(pump(), 1u);
    rdma_ucm_event_resp e = event();
    ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_CONNECT_REQUEST));
    EXPECT_EQ(e.uid, 0x100u);
    uint32_t srv = e.id;
    // The new id: IPv6 addresses from the header, on device A; its QP's
    // address handle names A's GID 2 (2001:db8::1), the peer's GID whole.
    qa = query_addr(srv);
    EXPECT_EQ(qa.src_size, sizeof(sockaddr_in6));
    EXPECT_EQ(addr_of(&qa.src_addr).addr(), ip("2001:db8::1"));
    EXPECT_EQ(addr_of(&qa.src_addr).port(), 7000);
    EXPECT_EQ(addr_of(&qa.dst_addr).addr(), ip("2001:db8::2"));
    EXPECT_EQ(addr_of(&qa.dst_addr).port(), cport);
    EXPECT_EQ(qa.ibdev_index, 0u);
    ib_uverbs_qp_attr rtr = init_qp_attr(srv, 2);
    EXPECT_EQ(std::memcmp(rtr.ah_attr.grh.dgid, ip("2001:db8::2").raw, 16), 0);
    EXPECT_EQ(rtr.ah_attr.grh.sgid_index, 2);
    EXPECT_EQ(rtr.dest_qp_num, 0x11u);

    ASSERT_EQ(accept(srv, 0x300, 0x22), 0);
    EXPECT_EQ(pump(), 1u);
    e = event();
    ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_CONNECT_RESPONSE));
    EXPECT_EQ(e.param.conn.qp_num, 0x22u);
    rtr = init_qp_attr(cli, 2);
    EXPECT_EQ(std::memcmp(rtr.ah_attr.grh.dgid, ip("2001:db8::1").raw, 16), 0);
    EXPECT_EQ(rtr.ah_attr.grh.sgid_index, 1) << "B's GID 1 is 2001:db8::2";
    // cma_get_roce_udp_flow_label: the ports' hash without a bound label.
    EXPECT_EQ(rtr.ah_attr.grh.flow_label, (uint32_t(cport) * 31 + 7000) & 0xFFFFF);
    ASSERT_EQ(accept(cli, 0x200, 0), 0) << "RTU";
    EXPECT_EQ(pump(), 1u);
    e = event();
    EXPECT_EQ(e.event, uint32_t(RDMA_CM_EVENT_ESTABLISHED));
    EXPECT_EQ(e.id, srv);
}

TEST_F(CmTest, AWildcardListenerTakesIpv4UnlessAfonly) {
    uint32_t dual = create(RDMA_PS_TCP, 0x100);
    ASSERT_EQ(bind(dual, sa("::", 7001)), 0) << "net.ipv6.bindv6only 0: both families";
    ASSERT_EQ(listen(dual), 0);
    uint32_t v6only = create(RDMA_PS_TCP, 0x101);
    ASSERT_EQ(set_afonly(v6only, 1), 0);
    ASSERT_EQ(bind(v6only, sa("::", 7002)), 0);
    ASSERT_EQ(listen(v6only), 0);

    for (uint16_t port : {7001, 7002}) {
        uint32_t cli = create(RDMA_PS_TCP, 0x200 + port);
        SockAddr src = sa("10.0.0.2", 0);
        resolve_all(cli, &src, sa("10.0.0.1", port));
        // Another QP each time: the same one again would be a stale
        // connection to the CM (REJ 10).
        ASSERT_EQ(connect(cli, 0x33 + port), 0);
        ASSERT_EQ(wire_.size(), 1u);
        cm::Mad req;
        ASSERT_EQ(cm::parse(wire_[0].bytes.data(), cm::kMadLen, req), cm::ParseError::kOk);
        const uint8_t *pd = req.body + cm::req::kPrivateData;
        EXPECT_EQ(pd[1], 0x40) << "IPv4: IP version 4";
        static const uint8_t zeros[12] = {};
        EXPECT_EQ(std::memcmp(pd + 4, zeros, 12), 0) << "IPv4 addresses are not mapped";
        pump();
        if (port == 7001) {
            rdma_ucm_event_resp e = event();
            ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_CONNECT_REQUEST));
            // An IPv4 connection on an IPv6 listener is an IPv4 id, on the
            // IPv4 address's GID.
            rdma_ucm_query_addr_resp qa = query_addr(e.id);
            EXPECT_EQ(qa.src_size, sizeof(sockaddr_in));
            EXPECT_EQ(addr_of(&qa.src_addr).addr(), ip("10.0.0.1"));
            EXPECT_EQ(init_qp_attr(e.id, 2).ah_attr.grh.sgid_index, 1);
        } else {
            rdma_ucm_event_resp e = event();
            ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_REJECTED)) << "AFONLY refuses IPv4";
            EXPECT_EQ(e.status, uint32_t(cm::kRejConsumerDefined));
            EXPECT_EQ(e.id, cli);
        }
    }
}

TEST_F(CmTest, PortsAreSharedBetweenFamiliesOnlyWithAfonly) {
    uint32_t a = create(RDMA_PS_TCP, 1), b = create(RDMA_PS_TCP, 2);
    ASSERT_EQ(set_afonly(a, 1), 0);
    ASSERT_EQ(bind(a, sa("::", 7010)), 0);
    EXPECT_EQ(bind(b, sa("0.0.0.0", 7010)), 0) << "an IPv6-only id leaves IPv4 the port";
    uint32_t c = create(RDMA_PS_TCP, 3), d = create(RDMA_PS_TCP, 4);
    ASSERT_EQ(bind(c, sa("::", 7011)), 0);
    EXPECT_EQ(bind(d, sa("10.0.0.1", 7011)), EADDRINUSE) << "a dual-stack wildcard takes it";
    uint32_t e = create(RDMA_PS_TCP, 5), f = create(RDMA_PS_TCP, 6), g = create(RDMA_PS_TCP, 7);
    ASSERT_EQ(bind(e, sa("2001:db8::1", 7012)), 0);
    EXPECT_EQ(bind(f, sa("2001:db8::1", 7012)), EADDRINUSE);
    EXPECT_EQ(bind(g, sa("2001:db8::2", 7012)), 0);
    // AFONLY is for ids not yet bound further than an address.
    EXPECT_EQ(set_afonly(g, 0), 0);
    ASSERT_EQ(listen(g), 0);
    EXPECT_EQ(set_afonly(g, 1), EINVAL);
}

TEST_F(CmTest, LinkLocalAddressesNeedTheirScope) {
    uint32_t a = create(RDMA_PS_TCP, 1);
    EXPECT_EQ(bind(a, sa("fe80::a", 0)), EINVAL) << "no scope";
    EXPECT_EQ(bind(a, sa("fe80::a", 0, kEth0)), 0);
    rdma_ucm_query_addr_resp qa = query_addr(a);
    EXPECT_EQ(addr_of(&qa.src_addr).scope(), kEth0);
    EXPECT_EQ(qa.ibdev_index, 0u);
    // Unbound, to a link-local peer: the source is this host's link-local
    // address of the destination's interface, with its scope.
    uint32_t b = create(RDMA_PS_TCP, 2);
    resolve_all(b, nullptr, sa("fe80::b", 7020, kEth0));
    qa = query_addr(b);
    EXPECT_EQ(addr_of(&qa.src_addr).addr(), ip("fe80::a"));
    EXPECT_EQ(addr_of(&qa.src_addr).scope(), kEth0);
    EXPECT_EQ(addr_of(&qa.dst_addr).scope(), kEth0);
    uint32_t c = create(RDMA_PS_TCP, 3);
    EXPECT_EQ(resolve(c, nullptr, sa("fe80::b", 7020)), EINVAL) << "no scope";
}

TEST_F(CmTest, WrongAddressesGetTheKernelsErrors) {
    uint32_t a = create(RDMA_PS_TCP, 1);
    // An IPv4 address inside an AF_INET6 one is no IPv6 address of the host.
    SockAddr mapped = SockAddr::any(AF_INET6);
    mapped.in6.sin6_addr = ip("10.0.0.1").v6_addr();
    EXPECT_EQ(bind(a, mapped), EADDRNOTAVAIL);
    EXPECT_EQ(bind(a, sa("2001:db8::99", 0)), EADDRNOTAVAIL) << "not the host's";
    ASSERT_EQ(bind(a, sa("10.0.0.1", 0)), 0);
    EXPECT_EQ(resolve(a, nullptr, sa("2001:db8::2", 1)), EINVAL) << "bound IPv4, resolving IPv6";
    uint32_t b = create(RDMA_PS_TCP, 2);
    SockAddr mdst = SockAddr::any(AF_INET6);
    mdst.in6.sin6_addr = ip("10.0.0.2").v6_addr();
    EXPECT_EQ(resolve(b, nullptr, mdst), ENETUNREACH);
    uint32_t c = create(RDMA_PS_TCP, 3);
    EXPECT_EQ(resolve(c, nullptr, sa("3fff::1", 1)), ENETUNREACH) << "no route";
}

TEST_F(CmTest, TheFlowLabelIsTheOneTheProcessBoundWith) {
    uint32_t lis = create(RDMA_PS_TCP, 0x100);
    ASSERT_EQ(bind(lis, sa("2001:db8::1", 7030)), 0);
    ASSERT_EQ(listen(lis), 0);
    uint32_t cli = create(RDMA_PS_TCP, 0x200);
    SockAddr src = sa("2001:db8::2", 0);
    src.in6.sin6_flowinfo = htonl(0xABCDE);
    resolve_all(cli, &src, sa("2001:db8::1", 7030));
    rdma_ucm_query q{};
    q.id = cli;
    auto route = reply<rdma_ucm_query_route_resp>(RDMA_USER_CM_CMD_QUERY_ROUTE, q);
    EXPECT_EQ(route.num_paths, 1u);
    EXPECT_EQ(ntohl(route.ib_route[0].flow_label), 0xABCDEu);
    EXPECT_EQ(std::memcmp(route.ib_route[0].sgid, ip("2001:db8::2").raw, 16), 0);
    ASSERT_EQ(connect(cli, 0x44), 0);
    ASSERT_EQ(wire_.size(), 1u);
    cm::Mad req;
    ASSERT_EQ(cm::parse(wire_[0].bytes.data(), cm::kMadLen, req), cm::ParseError::kOk);
    EXPECT_EQ(req.field(cm::req::kPrimaryFlowLabel), 0xABCDEu);
}

TEST_F(CmTest, SidrOverIpv6) {
    uint32_t lis = create(RDMA_PS_UDP, 0x100);
    ASSERT_EQ(bind(lis, sa("2001:db8::1", 7040)), 0);
    ASSERT_EQ(listen(lis), 0);
    uint32_t cli = create(RDMA_PS_UDP, 0x200);
    SockAddr src = sa("2001:db8::2", 0);
    resolve_all(cli, &src, sa("2001:db8::1", 7040));
    ASSERT_EQ(connect(cli, 0x55), 0);
    EXPECT_EQ(pump(), 1u) << "SIDR_REQ";
    rdma_ucm_event_resp e = event();
    ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_CONNECT_REQUEST));
    ASSERT_EQ(accept(e.id, 0x300, 0x66), 0);
    EXPECT_EQ(pump(), 1u) << "SIDR_REP";
    e = event();
    ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_ESTABLISHED));
    EXPECT_EQ(e.param.ud.qp_num, 0x66u);
    EXPECT_EQ(e.param.ud.qkey, kUdpQkey);
    EXPECT_EQ(std::memcmp(e.param.ud.ah_attr.grh.dgid, ip("2001:db8::1").raw, 16), 0);
    EXPECT_EQ(e.param.ud.ah_attr.grh.sgid_index, 1);
}

TEST_F(CmTest, JoinsIpv6Groups) {
    uint32_t id = create(RDMA_PS_UDP, 0x100);
    ASSERT_EQ(bind(id, sa("2001:db8::1", 0)), 0);
    auto join = [&](const SockAddr &g) {
        rdma_ucm_join_mcast j{};
        j.uid = 0x500;
        j.id = id;
        j.addr_size = uint16_t(g.len);
        j.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
        std::memcpy(&j.addr, &g.in6, g.len);
        return cmd(RDMA_USER_CM_CMD_JOIN_MCAST, j);
    };
    ASSERT_EQ(join(sa("ff0e::1234", 0)), 0);
    rdma_ucm_event_resp e = event();
    ASSERT_EQ(e.event, uint32_t(RDMA_CM_EVENT_MULTICAST_JOIN));
    EXPECT_EQ(std::memcmp(e.param.ud.ah_attr.grh.dgid, ip("ff0e::1234").raw, 16), 0)
        << "the group's address is its MGID";
    EXPECT_EQ(e.param.ud.ah_attr.grh.sgid_index, 2);
    EXPECT_EQ(e.param.ud.qp_num, 0xFFFFFFu);
    EXPECT_EQ(join(sa("239.1.1.1", 0)), EINVAL) << "an IPv4 group on an IPv6 id";
    EXPECT_EQ(join(sa("2001:db8::7", 0)), EINVAL) << "not a group";
    ASSERT_EQ(cm_.joins().size(), 1u);
    EXPECT_EQ(cm_.joins()[0].group, ip("ff0e::1234"));
}

} // namespace
