// SPDX-License-Identifier: MIT
//
// An allocation failure inside sroce must reach a C program as an error
// (NULL or ENOMEM), never as an exception through extern "C" code, which
// would terminate it.  This binary replaces operator new with one that
// fails on demand (for the calling thread; every form of it, so that
// new and delete always pair), makes every verb that allocates
// fail once, checks the error, and then checks that the same objects work.
// Devices on 127.0.1.19 and 127.0.1.20, used by no other test.
#include "qp_kinds.hpp"

#include <cstdlib>
#include <new>

namespace {
thread_local bool t_fail_new = false;
}

// GCC cannot see that the replacement operator delete below frees exactly
// what the replacement operator new took from malloc().
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void *operator new(std::size_t n) {
    if (t_fail_new) throw std::bad_alloc();
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void *operator new[](std::size_t n) {
    return operator new(n);
}
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
    return t_fail_new ? nullptr : std::malloc(n ? n : 1);
}
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept {
    return t_fail_new ? nullptr : std::malloc(n ? n : 1);
}
void *operator new(std::size_t n, std::align_val_t a) {
    if (t_fail_new) throw std::bad_alloc();
    std::size_t al = std::size_t(a);
    if (void *p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
    throw std::bad_alloc();
}
void operator delete(void *p, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete(void *p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete(void *p) noexcept {
    std::free(p);
}
void operator delete[](void *p) noexcept {
    std::free(p);
}
void operator delete(void *p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void *p, std::size_t) noexcept {
    std::free(p);
}

using namespace rctest;
using namespace qpkinds;

namespace {

ibv_context *g_ctx[2];

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("oom0", "127.0.1.19", "oom1", "127.0.1.20", g_ctx));

// Runs `fn` with every operator new of this thread failing.
template <class Fn>
auto starved(Fn fn) {
    t_fail_new = true;
    errno = 0;
    auto r = fn();
    t_fail_new = false;
    return r;
}

TEST(AllocationFailure, EveryAllocatingVerbFailsWithEnomem) {
    ASSERT_TRUE(g_ctx[0] && g_ctx[1]);
    ibv_context *ctx = g_ctx[0];
    EXPECT_EQ(starved([&] { return ibv_alloc_pd(ctx); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ(starved([&] { return ibv_create_cq(ctx, 16, nullptr, nullptr, 0); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ(starved([&] { return ibv_create_comp_channel(ctx); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);

    End a{g_ctx[0]};
    std::vector<uint8_t> mem(4096);
    EXPECT_EQ(starved([&] { return ibv_reg_mr(a.pd, mem.data(), mem.size(), 0); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    ibv_qp_init_attr ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = a.scq;
    ia.recv_cq = a.rcq;
    ia.cap = {16, 16, 1, 1, 0};
    EXPECT_EQ(starved([&] { return ibv_create_qp(a.pd, &ia); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    ibv_srq_init_attr sa{};
    sa.attr = {16, 1, 0};
    EXPECT_EQ(starved([&] { return ibv_create_srq(a.pd, &sa); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ(starved([&] { return ibv_resize_cq(a.scq, 512); }), ENOMEM);
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    xa.oflags = O_CREAT;
    EXPECT_EQ(starved([&] { return ibv_open_xrcd(ctx, &xa); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ(starved([&] { return ibv_alloc_mw(a.pd, IBV_MW_TYPE_2); }), nullptr);
    EXPECT_EQ(errno, ENOMEM);

    // A QP whose modify could not allocate its responder resources is
    // unchanged and can be modified again.
    ibv_qp *q = a.qp(IBV_QPT_RC);
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(to_init(q, kAllAccess), 0);
    ibv_gid other{};
    ASSERT_EQ(ibv_query_gid(g_ctx[1], 1, 1, &other), 0);
    EXPECT_EQ(starved([&] { return to_rtr(q, other, 0x11, 0, IBV_MTU_1024, 16, 1); }), ENOMEM);
    EXPECT_EQ(qp_state(q), IBV_QPS_INIT);
}

// After the failures, the same verbs succeed and carry traffic.
TEST(AllocationFailure, EverythingWorksAfterwards) {
    ASSERT_TRUE(g_ctx[0] && g_ctx[1]);
    End a{g_ctx[0]}, b{g_ctx[1]};
    ibv_qp *qa = a.qp(IBV_QPT_RC), *qb = b.qp(IBV_QPT_RC);
    ASSERT_NO_FATAL_FAILURE(connect(qa, a, qb, b, true));
    Buf src(a.pd, 1000), dst(b.pd, 1000);
    src.fill(1);
    ASSERT_EQ(post_recv(qb, 1, {dst.sge(0, 1000)}), 0);
    ASSERT_EQ(post_send(qa, 2, {src.sge(0, 1000)}), 0);
    expect_one(b.rcq, {1, IBV_WC_SUCCESS, IBV_WC_RECV, qb->qp_num, 1000});
    expect_one(a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, qa->qp_num});
    Pair::sync_with(Side{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qb});
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 1000));
}

} // namespace
