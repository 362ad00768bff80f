// SPDX-License-Identifier: MIT
//
// RoCEv2 over IPv6: the ICRC over the masked IPv6 header, checked against
// packets built and sealed with scapy; and two devices whose addresses are
// IPv6 (fd00:31::1 and fd00:31::2, on the in-memory wire) exchanging every
// kind of traffic, with the GID table, the GRH of UD receives and the
// family checks of address vectors as rxe has them.
#include "icrc.hpp"
#include "qp_kinds.hpp"
#include "wire.hpp"

#include <arpa/inet.h>

using namespace sroce;
using namespace sroce::wire;
using namespace rctest;
using namespace qpkinds;

namespace {

ibv_context *g_ctx[2];
[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("v6a", "fd00:31::1", "v6b", "fd00:31::2", g_ctx));

IpAddr ip6(const char *s) {
    IpAddr a;
    EXPECT_TRUE(IpAddr::parse(s, &a)) << s;
    return a;
}

ibv_gid gid6(const char *s) {
    ibv_gid g;
    std::memcpy(g.raw, ip6(s).raw, 16);
    return g;
}

// ---------------------------------------------------------------------------
// ICRC

struct Golden {
    const char *what;
    const char *src, *dst;
    uint16_t sport;
    std::vector<uint8_t> bytes; // UDP payload, ICRC last
};

// Built with scapy (IPv6 / UDP / BTH / ...) and sealed by scapy's own ICRC
// recipe for IPv6 (8 bytes of ones, then the packet with traffic class,
// flow label, hop limit, UDP checksum and BTH resv8a set to ones).  The
// header fields masked there were not ones: tc 0x20, fl 0x12345, hlim 64,
// and hlim 1 for the second.
const Golden kGolden[] = {
    // BTH(opcode=0x0a, dqpn=0x12, psn=0x345, ackreq=1) /
    //   Raw(struct.pack(">QII", 0x7f0012345678, 0xabcd0101, 8) + bytes(range(0xa0, 0xa8)))
    {"RDMA_WRITE_ONLY", "fd00::1", "fd00::2", 0xC123, {0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00,
                                                       0x12, 0x80, 0x00, 0x03, 0x45, 0x00, 0x00,
                                                       0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, 0xab,
                                                       0xcd, 0x01, 0x01, 0x00, 0x00, 0x00, 0x08,
                                                       0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6,
                                                       0xa7, 0xdf, 0x22, 0x8e, 0xc1}},
    // BTH(opcode=0x11, dqpn=0x13, psn=0x345) / AETH(syndrome=0x1f, msn=7)
    {"ACKNOWLEDGE between link-local addresses",
     "fe80::200:ff:fe00:1",
     "fe80::200:ff:fe00:2",
     4791,
     {0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00,
      0x03, 0x45, 0x1f, 0x00, 0x00, 0x07, 0x0b, 0xb4, 0xac, 0x39}},
};

IpHeader hdr6(const Golden &g) {
    return {ip6(g.src), ip6(g.dst), g.sport, kRoceV2Port};
}

TEST(IcrcIpv6, ScapyPacketsMatchComputeAndVerify) {
    for (const Golden &g : kGolden) {
        SCOPED_TRACE(g.what);
        const std::vector<uint8_t> &p = g.bytes;
        uint32_t stored = icrc_load(p.data() + p.size() - kIcrcLen);
        EXPECT_EQ(icrc_compute(hdr6(g), p.data(), p.size()), stored);
        // Streaming, as the transmit path builds it.
        uint32_t s = icrc_begin(hdr6(g), p.size(), p.data());
        s = icrc_update(s, p.data() + kBthLen, p.size() - kBthLen - kIcrcLen);
        EXPECT_EQ(icrc_final(s), stored);
        EXPECT_TRUE(icrc_verify(hdr6(g), p.data(), p.size()));
        Packet pkt;
        EXPECT_EQ(parse(p.data(), p.size(), pkt), ParseError::kOk);
    }
}

// IPv6 has no IP ID: whatever a receiver expects of one changes nothing,
// and no other covered field can be solved for.
TEST(IcrcIpv6, CoversAddressesPortsAndLengthAndNoIpId) {
    const Golden &g = kGolden[0];
    const std::vector<uint8_t> &p = g.bytes;
    for (uint16_t id : {0, 1, 0x1234, 0xFFFF}) {
        IpHeader ip = hdr6(g);
        ip.ip_id = id;
        ip.df = id & 1;
        uint16_t used = 0xABCD;
        EXPECT_TRUE(icrc_verify(ip, p.data(), p.size(), &used, id, 4, 4)) << id;
        EXPECT_EQ(used, id) << "an ID expected is no ID solved for";
    }
    for (auto mod : std::vector<void (*)(IpHeader &)>{
             [](IpHeader &h) { h.src.raw[15] ^= 1; }, [](IpHeader &h) { h.src.raw[0] ^= 0x80; },
             [](IpHeader &h) { h.dst.raw[15] ^= 1; }, [](IpHeader &h) { h.dst.raw[7] ^= 4; },
             [](IpHeader &h) { h.sport ^= 1; }, [](IpHeader &h) { h.dport ^= 1; }}) {
        IpHeader ip = hdr6(g);
        mod(ip);
        EXPECT_FALSE(icrc_verify(ip, p.data(), p.size()));
    }
    // The same packet as IPv4-mapped addresses is an IPv4 packet: another ICRC.
    IpHeader v4{IpAddr::v4(htonl(0x0A000001)), IpAddr::v4(htonl(0x0A000002)), g.sport, kRoceV2Port};
    EXPECT_FALSE(icrc_verify(v4, p.data(), p.size()));
    std::vector<uint8_t> bad = p;
    bad[20] ^= 0x10;
    EXPECT_FALSE(icrc_verify(hdr6(g), bad.data(), bad.size()));
    // BTH resv8a is masked in both families.
    std::vector<uint8_t> fecn = p;
    fecn[4] = 0xC0;
    EXPECT_TRUE(icrc_verify(hdr6(g), fecn.data(), fecn.size()));
}

// ---------------------------------------------------------------------------
// Devices on IPv6 addresses

class Ipv6 : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(g_ctx[0] && g_ctx[1]); }
};

TEST_F(Ipv6, GidTableIsLinkLocalThenTheAddressBothRoceV2) {
    ibv_gid g;
    ASSERT_EQ(ibv_query_gid(g_ctx[0], 1, 0, &g), 0);
    EXPECT_EQ(g.raw[0], 0xFE);
    EXPECT_EQ(g.raw[1], 0x80);
    EXPECT_TRUE(all_bytes(g.raw + 2, 6, 0));
    ASSERT_EQ(ibv_query_gid(g_ctx[0], 1, 1, &g), 0);
    EXPECT_EQ(std::memcmp(g.raw, gid6("fd00:31::1").raw, 16), 0);
    for (uint32_t i = 0; i < 2; i++) {
        ibv_gid_entry e{};
        ASSERT_EQ(ibv_query_gid_ex(g_ctx[0], 1, i, &e, 0), 0) << i;
        EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        EXPECT_EQ(e.gid_index, i);
    }
    ibv_gid_entry e{};
    EXPECT_EQ(ibv_query_gid_ex(g_ctx[0], 1, 2, &e, 0), ENODATA);
    ibv_gid_entry table[8];
    EXPECT_EQ(ibv_query_gid_table(g_ctx[0], table, 8, 0), 2);
    // The table's length is what rxe reports, however few entries are used.
    ibv_port_attr pa{};
    ASSERT_EQ(ibv_query_port(g_ctx[0], 1, &pa), 0);
    EXPECT_EQ(pa.gid_tbl_len, 1024);
}

TEST_F(Ipv6, RcWritesReadsSendsAndAtomicsByteForByte) {
    Pair p;
    ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], PairOpts{}));
    constexpr size_t kLen = 64 << 10;
    Buf src(p.a.pd, kLen), dst(p.b.pd, kLen), back(p.a.pd, kLen);
    src.fill(31);
    dst.set(0);
    back.set(0);
    ASSERT_EQ(post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, kLen)}, dst.addr(), dst.rkey()),
              0);
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), kLen));
    ASSERT_EQ(post_rdma(p.a.qp, 2, IBV_WR_RDMA_READ, {back.sge(0, kLen)}, dst.addr(), dst.rkey()),
              0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, p.a.qpn(), int64_t(kLen)});
    EXPECT_TRUE(same_bytes(back.data(), src.data(), kLen));
    ASSERT_EQ(post_recv(p.b.qp, 3, {dst.sge(0, 5000)}), 0);
    ASSERT_EQ(post_send(p.a.qp, 4, {src.sge(100, 5000)}), 0);
    expect_one(p.b.rcq, {3, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 5000});
    expect_one(p.a.scq, {4, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    EXPECT_TRUE(same_bytes(dst.data(), src.data() + 100, 5000));
    dst.word(0) = 40;
    ASSERT_EQ(post_atomic(p.a.qp, 5, IBV_WR_ATOMIC_FETCH_AND_ADD, back.sge(8, 8), dst.addr(),
                          dst.rkey(), 2),
              0);
    expect_one(p.a.scq, {5, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, p.a.qpn(), 8});
    EXPECT_EQ(back.word(8), 40u);
    Pair::sync_with(p.b);
    EXPECT_EQ(dst.word(0), 42u);
}

TEST_F(Ipv6, UdSendsArriveBehindTheIpv6HeaderAndAreAnswered) {
    End a{g_ctx[0]}, b{g_ctx[1]};
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    Buf src(a.pd, 256), dst(b.pd, 40 + 256);
    src.fill(5);
    dst.set(0xEE);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 40 + 256)}), 0);
    ASSERT_EQ(post_ud(qa, 2, a.ah(b.gid), qb->qp_num, kQkey, {src.sge(0, 200)}), 0);
    expect_one(a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    std::vector<ibv_wc> rc = poll_n(b.rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    expect_wc(rc[0], {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 240, IBV_WC_GRH});
    EXPECT_EQ(rc[0].sl, kNetworkHdrIpv6) << "the L3 header type UCX reads";
    // The GRH area is the packet's IPv6 header, as rxe places it.
    const uint8_t *grh = dst.data();
    EXPECT_EQ(grh[0] >> 4, 6);
    EXPECT_EQ(get16(grh + 4), 8 + 12 + 8 + 200 + 4) << "payload length: UDP, BTH, DETH, data, ICRC";
    EXPECT_EQ(grh[6], 17) << "next header UDP";
    EXPECT_EQ(std::memcmp(grh + 8, a.gid.raw, 16), 0) << "source";
    EXPECT_EQ(std::memcmp(grh + 24, b.gid.raw, 16), 0) << "destination";
    EXPECT_TRUE(same_bytes(grh + 40, src.data(), 200));
    ibv_ah *back = ibv_create_ah_from_wc(b.pd, &rc[0], reinterpret_cast<ibv_grh *>(dst.data()), 1);
    ASSERT_NE(back, nullptr) << std::strerror(errno);
    b.ahs.push_back(back);
    Buf got(a.pd, 40 + 64);
    ASSERT_EQ(post_recv(qa, 3, {got.sge(0, 40 + 64)}), 0);
    ASSERT_EQ(post_ud(qb, 4, back, rc[0].src_qp, kQkey, {dst.sge(40, 64)}), 0);
    expect_one(a.rcq, {3, IBV_WC_SUCCESS, IBV_WC_RECV, qa->qp_num, 104, IBV_WC_GRH});
    EXPECT_TRUE(same_bytes(got.data() + 40, src.data(), 64));
}

// The GRH of a UD receive is the IPv6 header as it arrived: the sender's
// traffic class, flow label and hop limit as its address handle set them.
TEST_F(Ipv6, UdGrhHasTheSendersTrafficClassFlowLabelAndHopLimit) {
    End a{g_ctx[0]}, b{g_ctx[1]};
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    Buf src(a.pd, 64), dst(b.pd, 40 + 64);
    src.fill(9);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 40 + 64)}), 0);
    ASSERT_EQ(post_ud(qa, 2, a.ah(b.gid, 0x2A, 9, 0x12345), qb->qp_num, kQkey, {src.sge(0, 64)}),
              0);
    expect_one(a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    std::vector<ibv_wc> rc = poll_n(b.rcq, 1);
    ASSERT_EQ(rc.size(), 1u);
    expect_wc(rc[0], {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 104, IBV_WC_GRH});
    const uint8_t *grh = dst.data();
    EXPECT_EQ(get32(grh), 0x62A12345u) << "version 6, traffic class 0x2A, flow label 0x12345";
    EXPECT_EQ(grh[7], 9) << "hop limit";
    EXPECT_TRUE(same_bytes(grh + 40, src.data(), 64));
}

TEST_F(Ipv6, UcAndXrcCarryTheirMessages) {
    End a{g_ctx[0]}, b{g_ctx[1]};
    ibv_qp *qa = a.qp(IBV_QPT_UC), *qb = b.qp(IBV_QPT_UC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, false));
    Buf src(a.pd, 3000), dst(b.pd, 3000);
    src.fill(8);
    dst.set(0);
    ASSERT_EQ(post_rdma(qa, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 3000)}, dst.addr(), dst.rkey()), 0);
    expect_one(a.scq, {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, qa->qp_num});
    ASSERT_EQ(post_recv(qb, 2, {dst.sge(0, 3000)}), 0);
    ASSERT_EQ(post_send(qa, 3, {src.sge(0, 3000)}), 0);
    expect_one(b.rcq, {2, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 3000});
    expect_one(a.scq, {3, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 3000));

    ibv_cq *xcq = ibv_create_cq(g_ctx[1], 16, nullptr, nullptr, 0);
    ASSERT_NE(xcq, nullptr);
    Xrc x;
    ASSERT_NO_FATAL_FAILURE(x.make(a, b, xcq, 16));
    ASSERT_NO_FATAL_FAILURE(connect(x.send_qp, a, x.recv_qp, b, true));
    Buf xs(a.pd, 2048), xd(b.pd, 2048);
    xs.fill(9);
    ASSERT_EQ(post_srq(x.srq, 4, {xd.sge(0, 2048)}), 0);
    std::vector<ibv_sge> sg{xs.sge(0, 2048)};
    ibv_send_wr wr = send_wr(5, IBV_WR_SEND, sg);
    wr.qp_type.xrc.remote_srqn = x.srqn;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(x.send_qp, &wr, &bad), 0);
    expect_one(a.scq, {5, IBV_WC_SUCCESS, IBV_WC_SEND, x.send_qp->qp_num});
    expect_one(xcq, {4, IBV_WC_SUCCESS, IBV_WC_RECV, x.recv_qp->qp_num, 2048});
    EXPECT_TRUE(same_bytes(xd.data(), xs.data(), 2048));
    x.destroy();
    EXPECT_EQ(ibv_destroy_cq(xcq), 0);
}

TEST_F(Ipv6, UdMulticastToAnIpv6Group) {
    End a{g_ctx[0]}, b{g_ctx[1]};
    ibv_qp *qa = a.qp(IBV_QPT_UD), *qb = b.qp(IBV_QPT_UD);
    ASSERT_EQ(ud_to_rts(qa, kQkey), 0);
    ASSERT_EQ(ud_to_rts(qb, kQkey), 0);
    ibv_gid group = gid6("ff12::31:1");
    ASSERT_EQ(ibv_attach_mcast(qb, &group, 0), 0);
    Buf src(a.pd, 64), dst(b.pd, 104);
    src.fill(6);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 104)}), 0);
    ASSERT_EQ(post_ud(qa, 2, a.ah(group), kMulticastQpn, kQkey, {src.sge(0, 64)}), 0);
    expect_one(b.rcq, {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 104, IBV_WC_GRH});
    EXPECT_EQ(std::memcmp(dst.data() + 24, group.raw, 16), 0) << "sent to the group";
    EXPECT_TRUE(same_bytes(dst.data() + 40, src.data(), 64));
    EXPECT_EQ(ibv_detach_mcast(qb, &group, 0), 0);
    // A group of the other family is no group of this port.
    ibv_gid v4group{};
    v4group.raw[10] = v4group.raw[11] = 0xFF;
    v4group.raw[12] = 239;
    v4group.raw[15] = 1;
    EXPECT_EQ(ibv_attach_mcast(qb, &v4group, 0), EINVAL);
}

// An address of the other family is no peer of this port: rxe refuses
// such an AV, as the route it needs does not exist.
TEST_F(Ipv6, AnIpv4PeerIsRefusedWithEinval) {
    End a{g_ctx[0]};
    ibv_gid v4{};
    v4.raw[10] = v4.raw[11] = 0xFF;
    v4.raw[12] = 10;
    v4.raw[15] = 2;
    ibv_ah_attr aa{};
    aa.is_global = 1;
    aa.port_num = 1;
    aa.grh.dgid = v4;
    aa.grh.sgid_index = 1;
    errno = 0;
    EXPECT_EQ(ibv_create_ah(a.pd, &aa), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_qp *q = a.qp(IBV_QPT_RC);
    ASSERT_EQ(to_init(q, kAllAccess), 0);
    EXPECT_EQ(to_rtr_path(q, v4, 0x20, 0), EINVAL);
    EXPECT_EQ(qp_state(q), IBV_QPS_INIT);
}

} // namespace
