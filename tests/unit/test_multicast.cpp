// SPDX-License-Identifier: MIT
//
// UD multicast (ibv_attach_mcast / ibv_detach_mcast) over RoCEv2: a datagram
// to an IPv4-mapped multicast GID with destination QPN 0xFFFFFF reaches every
// UD QP attached to the group, on every device of the host.  The binary
// moves itself into a network namespace of its own first, so no multicast
// datagram can leave the machine whatever its routes; the devices are on
// 127.0.1.21 and 127.0.1.22 of that namespace's lo.
#include "qp_kinds.hpp"

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>

using namespace rctest;
using namespace qpkinds;

namespace {

ibv_context *g_ctx[2];
std::string g_skip;

// Brings lo up in the new namespace (it starts down).
bool loopback_up() {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return false;
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    bool ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    close(fd);
    return ok;
}

class IsolatedDevices : public ::testing::Environment {
  public:
    void SetUp() override {
        if (unshare(CLONE_NEWNET) != 0 || !loopback_up()) {
            g_skip = std::string("no private network namespace: ") + std::strerror(errno);
            return;
        }
        env_.SetUp();
    }
    void TearDown() override {
        if (g_skip.empty()) env_.TearDown();
    }

  private:
    // The kernel's IP multicast is the point: the devices are on UDP.
    DevicePairEnv env_{"mcs0", "127.0.1.21", "mcs1", "127.0.1.22", g_ctx, {}, {}, Wire::kUdp};
};

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new IsolatedDevices);

ibv_gid group_gid(uint8_t last) {
    ibv_gid g{};
    g.raw[10] = g.raw[11] = 0xFF;
    g.raw[12] = 239;
    g.raw[13] = 1;
    g.raw[14] = 2;
    g.raw[15] = last;
    return g;
}

class Multicast : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!g_skip.empty()) GTEST_SKIP() << g_skip;
        ASSERT_TRUE(g_ctx[0] && g_ctx[1]);
        a = std::make_unique<End>(g_ctx[0]);
        b = std::make_unique<End>(g_ctx[1]);
    }
    std::unique_ptr<End> a, b;
};

TEST_F(Multicast, EveryAttachedQpOnEveryDeviceGetsACopy) {
    ibv_qp *sender = a->qp(IBV_QPT_UD), *a1 = a->qp(IBV_QPT_UD);
    ibv_qp *b1 = b->qp(IBV_QPT_UD), *b2 = b->qp(IBV_QPT_UD), *b3 = b->qp(IBV_QPT_UD);
    for (ibv_qp *q : {sender, a1, b1, b2, b3})
        ASSERT_EQ(ud_to_rts(q, kQkey), 0);
    ibv_gid g = group_gid(7);
    for (ibv_qp *q : {a1, b1, b2})
        ASSERT_EQ(ibv_attach_mcast(q, &g, 0), 0);
    ASSERT_EQ(ibv_attach_mcast(b2, &g, 0), 0) << "attaching twice is harmless";
    Buf src(a->pd, 100), abuf(a->pd, 200), bbuf(b->pd, 600);
    src.fill(3);
    ASSERT_EQ(post_recv(a1, 1, {abuf.sge(0, 200)}), 0);
    ASSERT_EQ(post_recv(b1, 2, {bbuf.sge(0, 200)}), 0);
    ASSERT_EQ(post_recv(b2, 3, {bbuf.sge(200, 200)}), 0);
    ASSERT_EQ(post_recv(b3, 4, {bbuf.sge(400, 200)}), 0);
    ibv_ah *ah = a->ah(g);
    ASSERT_EQ(post_ud(sender, 9, ah, 0xFFFFFF, kQkey, {src.sge(0, 100)}), 0);
    expect_one(a->scq, {9, IBV_WC_SUCCESS, IBV_WC_SEND, sender->qp_num});
    expect_one(a->rcq, {1, IBV_WC_SUCCESS, IBV_WC_RECV, a1->qp_num, 140, IBV_WC_GRH});
    std::vector<ibv_wc> rc = poll_n(b->rcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    for (const ibv_wc &wc : rc) {
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc.src_qp, sender->qp_num);
        EXPECT_TRUE(wc.qp_num == b1->qp_num || wc.qp_num == b2->qp_num);
        const uint8_t *grh = bbuf.data() + (wc.wr_id == 2 ? 0 : 200);
        EXPECT_EQ(std::memcmp(grh + 36, g.raw + 12, 4), 0) << "GRH destination: the group";
        EXPECT_TRUE(same_bytes(grh + 40, src.data(), 100));
    }
    EXPECT_TRUE(drain(b->rcq, 50ms).empty()) << "b3 is not attached";

    // Detached, b1 gets nothing more; detaching twice is an error.
    ASSERT_EQ(ibv_detach_mcast(b1, &g, 0), 0);
    EXPECT_EQ(ibv_detach_mcast(b1, &g, 0), EINVAL);
    ASSERT_EQ(post_recv(b2, 5, {bbuf.sge(200, 200)}), 0);
    ASSERT_EQ(post_recv(a1, 6, {abuf.sge(0, 200)}), 0);
    ASSERT_EQ(post_ud(sender, 10, ah, 0xFFFFFF, kQkey, {src.sge(0, 50)}), 0);
    expect_one(b->rcq, {5, IBV_WC_SUCCESS, IBV_WC_RECV, b2->qp_num, 90, IBV_WC_GRH});
    expect_one(a->rcq, {6, IBV_WC_SUCCESS, IBV_WC_RECV, a1->qp_num, 90, IBV_WC_GRH});
    EXPECT_TRUE(drain(b->rcq, 50ms).empty());
    EXPECT_EQ(poll_n(a->scq, 1).size(), 1u);
    // A QP destroyed while attached leaves the group cleanly.
    ASSERT_EQ(ibv_destroy_qp(b2), 0);
    b->qps.erase(std::find(b->qps.begin(), b->qps.end(), b2));
    ASSERT_EQ(post_ud(sender, 11, ah, 0xFFFFFF, kQkey, {src.sge(0, 50)}), 0);
    EXPECT_EQ(poll_n(a->scq, 1).size(), 1u);
    EXPECT_TRUE(drain(b->rcq, 50ms).empty());
}

TEST_F(Multicast, OnlyUdQpsAndMulticastGids) {
    ibv_qp *rc = a->qp(IBV_QPT_RC), *ud = a->qp(IBV_QPT_UD);
    ibv_gid g = group_gid(8), unicast{};
    ASSERT_EQ(ibv_query_gid(g_ctx[0], 1, 1, &unicast), 0);
    EXPECT_EQ(ibv_attach_mcast(rc, &g, 0), EINVAL);
    EXPECT_EQ(ibv_attach_mcast(ud, &unicast, 0), EINVAL);
    EXPECT_EQ(ibv_detach_mcast(ud, &g, 0), EINVAL) << "never attached";
    ibv_device_attr attr{};
    ASSERT_EQ(ibv_query_device(g_ctx[0], &attr), 0);
    EXPECT_GT(attr.max_mcast_grp, 0);
    EXPECT_GT(attr.max_mcast_qp_attach, 0);
}

} // namespace
