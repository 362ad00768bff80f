// SPDX-License-Identifier: MIT
//
// Verbs outside the QP transport, through public verbs in one process: the
// device attributes and GID table programs probe, ibv_rereg_mr,
// on-demand paging (explicit, implicit refused, ibv_advise_mr), completion
// timestamps and ibv_query_rt_values_ex, ibv_create_cq_ex's checks, the
// context's command FD, devices in a child of fork() and the progress
// thread of a device without QPs.  Two sroce devices on 127.0.13.3 /
// 127.0.13.4.
#include "nic.hpp"
#include "rc_pair.hpp"

#include <climits>
#include <ctime>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];

[[maybe_unused]] ::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(
    new DevicePairEnv("vm0", "127.0.13.3", "vm1", "127.0.13.4", g_ctx));

uint64_t clock_ns(clockid_t clk) {
    timespec t;
    clock_gettime(clk, &t);
    return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

// One signaled RDMA WRITE from A's `src` to `raddr`/`rkey`; its completion.
ibv_wc write(Pair &p, Buf &src, size_t len, uint64_t raddr, uint32_t rkey) {
    std::vector<ibv_sge> sg{src.sge(0, len)};
    ibv_send_wr wr = send_wr(7, IBV_WR_RDMA_WRITE, sg);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    EXPECT_EQ(post(p.a.qp, wr), 0);
    auto wcs = poll_n(p.a.scq, 1);
    EXPECT_EQ(wcs.size(), 1u);
    return wcs.empty() ? ibv_wc{} : wcs[0];
}

TEST(Device, ExtendedAttributes) {
    ibv_device_attr_ex a{};
    ASSERT_EQ(ibv_query_device_ex(g_ctx[0], nullptr, &a), 0);
    EXPECT_EQ(a.phys_port_cnt_ex, a.orig_attr.phys_port_cnt);
    EXPECT_EQ(a.odp_caps.general_caps, uint64_t(IBV_ODP_SUPPORT));
    constexpr uint32_t kRc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                             IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
    EXPECT_EQ(a.odp_caps.per_transport_caps.rc_odp_caps & kRc, kRc);
    EXPECT_EQ(a.hca_core_clock, 1000000u); // kHz: nanosecond ticks
    EXPECT_EQ(a.completion_timestamp_mask, ~0ull);
}

TEST(Device, GidTableHasEmptyEntries) {
    ibv_port_attr pa{};
    ASSERT_EQ(ibv_query_port(g_ctx[0], 1, &pa), 0);
    EXPECT_EQ(pa.gid_tbl_len, 1024);
    ibv_gid_entry e{};
    EXPECT_EQ(ibv_query_gid_ex(g_ctx[0], 1, 1, &e, 0), 0);
    EXPECT_EQ(e.gid_type, uint32_t(IBV_GID_TYPE_ROCE_V2));
    EXPECT_EQ(ibv_query_gid_ex(g_ctx[0], 1, 2, &e, 0), ENODATA);
    EXPECT_EQ(ibv_query_gid_ex(g_ctx[0], 1, 1023, &e, 0), ENODATA);
    EXPECT_EQ(ibv_query_gid_ex(g_ctx[0], 1, 1024, &e, 0), EINVAL);
    // ibv_query_gid reads an empty entry as the zero GID.
    ibv_gid g;
    std::memset(&g, 0xFF, sizeof g);
    EXPECT_EQ(ibv_query_gid(g_ctx[0], 1, 5, &g), 0);
    EXPECT_TRUE(all_bytes(g.raw, sizeof g.raw, 0));
    EXPECT_NE(ibv_query_gid(g_ctx[0], 1, 1024, &g), 0);
    // The table lists the populated entries only.
    ibv_gid_entry t[4];
    EXPECT_EQ(ibv_query_gid_table(g_ctx[0], t, 4, 0), 2);
}

// Context switches so far of the thread of this process named `comm`; -1
// when there is none.
long switches_of(const std::string &comm) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    long n = -1;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string dir = std::string("/proc/self/task/") + e->d_name;
        std::ifstream c(dir + "/comm");
        std::string name;
        if (!std::getline(c, name) || name != comm) continue;
        std::ifstream st(dir + "/status");
        n = 0;
        for (std::string line; std::getline(st, line);)
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
                line.rfind("nonvoluntary_ctxt_switches:", 0) == 0)
                n += std::stol(line.substr(line.find(':') + 1));
    }
    closedir(d);
    return n;
}

// librdmacm opens every device: the progress thread of one without QPs must
// not wake every millisecond, taking a CPU from the threads that work.
TEST(Device, ProgressThreadOfADeviceWithoutQpsSleeps) {
    const std::string comm = "sroce-vm0";
    long before = switches_of(comm);
    ASSERT_GE(before, 0) << "no thread named " << comm;
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    long after = switches_of(comm);
    ASSERT_GE(after, before) << "the thread named " << comm << " went away";
    long idle = after - before;
    // One wake-up per 20 ms is 20; a thread on the 1 ms timer of a device
    // with QPs makes about 400.
    EXPECT_LT(idle, 100) << "context switches in 400 ms without a QP";

    // A QP brings the 1 ms timer back (its retransmissions need it).
    ibv_pd *pd = ibv_alloc_pd(g_ctx[0]);
    ASSERT_NE(pd, nullptr);
    ibv_cq *cq = ibv_create_cq(g_ctx[0], 4, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp *qp = ibv_create_qp(pd, &ia);
    ASSERT_NE(qp, nullptr);
    before = switches_of(comm);
    ASSERT_GE(before, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    long busy = switches_of(comm) - before;
    EXPECT_GT(busy, 100) << "context switches in 400 ms with a QP";
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// The progress thread's park while an application spins (SROCE_PARK_US,
// sroce(8)): the default, a value, and 0, which would make it spin: at
// least a microsecond.
TEST(Device, ParkFromTheEnvironment) {
    unsetenv("SROCE_PARK_US");
    EXPECT_EQ(sroce::NicOptions::from_env().park_ns, 50000u);
    setenv("SROCE_PARK_US", "200", 1);
    EXPECT_EQ(sroce::NicOptions::from_env().park_ns, 200000u);
    setenv("SROCE_PARK_US", "0", 1);
    EXPECT_EQ(sroce::NicOptions::from_env().park_ns, 1000u);
    unsetenv("SROCE_PARK_US");
}

TEST(Device, RtValuesCountMonotonicNanoseconds) {
    ibv_values_ex v{};
    v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    uint64_t before = clock_ns(CLOCK_MONOTONIC);
    ASSERT_EQ(ibv_query_rt_values_ex(g_ctx[0], &v), 0);
    uint64_t after = clock_ns(CLOCK_MONOTONIC);
    EXPECT_EQ(v.comp_mask, uint32_t(IBV_VALUES_MASK_RAW_CLOCK));
    // Ticks in tv_nsec, as mlx5 gives its cycle counter.
    EXPECT_EQ(v.raw_clock.tv_sec, 0);
    uint64_t t = uint64_t(v.raw_clock.tv_nsec);
    EXPECT_GE(t, before);
    EXPECT_LE(t, after);
    // Converted with hca_core_clock (kHz), as programs for any device do.
    ibv_device_attr_ex a{};
    ASSERT_EQ(ibv_query_device_ex(g_ctx[0], nullptr, &a), 0);
    EXPECT_EQ(uint64_t((unsigned __int128)t * 1000000 / a.hca_core_clock), t);
    v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK | IBV_VALUES_MASK_RESERVED;
    EXPECT_EQ(ibv_query_rt_values_ex(g_ctx[0], &v), EINVAL);
}

// A context imported from another's command FD sees its PD and MR by
// handle; an MR of the imported PD's QP works through the imported handles.
TEST(Device, ImportedContextSharesPdAndMr) {
    int dup_fd = dup(g_ctx[0]->cmd_fd);
    ASSERT_GE(dup_fd, 0);
    ibv_context *imported = ibv_import_device(dup_fd);
    ASSERT_NE(imported, nullptr) << std::strerror(errno);
    ibv_pd *pd = ibv_alloc_pd(g_ctx[0]);
    ASSERT_NE(pd, nullptr);
    std::vector<uint8_t> mem(4096);
    ibv_mr *mr = ibv_reg_mr(pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    ibv_pd *ipd = ibv_import_pd(imported, pd->handle);
    ASSERT_NE(ipd, nullptr) << std::strerror(errno);
    EXPECT_EQ(ipd->context, imported);
    EXPECT_EQ(ipd->handle, pd->handle);
    ibv_mr *imr = ibv_import_mr(ipd, mr->handle);
    ASSERT_NE(imr, nullptr) << std::strerror(errno);
    EXPECT_EQ(imr->lkey, mr->lkey);
    EXPECT_EQ(imr->rkey, mr->rkey);
    EXPECT_EQ(imr->length, mr->length);
    EXPECT_EQ(imr->addr, nullptr) << "the kernel knows no address for an imported MR";
    // Only handles of the same command FD's contexts can be imported.
    errno = 0;
    EXPECT_EQ(ibv_import_pd(g_ctx[1], pd->handle), nullptr);
    EXPECT_EQ(errno, EINVAL);
    errno = 0;
    EXPECT_EQ(ibv_import_mr(ipd, mr->handle ^ 0x100), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_unimport_mr(imr);
    EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY) << "an imported handle still names it";
    ibv_unimport_pd(ipd);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    EXPECT_EQ(ibv_close_device(imported), 0);
}

TEST(CqEx, BadSizeOrVectorIsEinvalBeforeAnythingElse) {
    ibv_device_attr da{};
    ASSERT_EQ(ibv_query_device(g_ctx[0], &da), 0);
    ibv_cq_init_attr_ex ca{};
    ca.cqe = uint32_t(da.max_cqe) + 1;
    ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG; // would be EOPNOTSUPP
    errno = 0;
    EXPECT_EQ(ibv_create_cq_ex(g_ctx[0], &ca), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ca.cqe = 10;
    ca.wc_flags = 0;
    ca.comp_vector = uint32_t(g_ctx[0]->num_comp_vectors);
    errno = 0;
    EXPECT_EQ(ibv_create_cq_ex(g_ctx[0], &ca), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

TEST(CqEx, UnsupportedFlagsAreEopnotsupp) {
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 10;
    ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG; // a steering feature sroce has none of
    errno = 0;
    EXPECT_EQ(ibv_create_cq_ex(g_ctx[0], &ca), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    ca.wc_flags = 0;
    ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    ca.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    errno = 0;
    EXPECT_EQ(ibv_create_cq_ex(g_ctx[0], &ca), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    ibv_cq_ex *cq = ibv_create_cq_ex(g_ctx[0], &ca);
    ASSERT_NE(cq, nullptr) << std::strerror(errno);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

TEST(CqEx, CompletionTimestamps) {
    Pair p;
    PairOpts o;
    o.cq_ex = true;
    o.extra_wc_flags =
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o));
    Buf src(p.a.pd, 64), dst(p.b.pd, 64);
    ASSERT_TRUE(src.ok() && dst.ok());
    uint64_t mono0 = clock_ns(CLOCK_MONOTONIC), wall0 = clock_ns(CLOCK_REALTIME);
    std::vector<ibv_sge> sg{src.sge(0, 64)};
    ibv_send_wr wr = send_wr(9, IBV_WR_RDMA_WRITE, sg);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    ASSERT_EQ(post(p.a.qp, wr), 0);
    ibv_poll_cq_attr pa{};
    int rc = ENOENT;
    for (auto end = Clock::now() + kDeadline; rc == ENOENT && Clock::now() < end;)
        rc = ibv_start_poll(p.a.scqx, &pa);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(p.a.scqx->status, IBV_WC_SUCCESS);
    uint64_t ts = ibv_wc_read_completion_ts(p.a.scqx);
    uint64_t wall = ibv_wc_read_completion_wallclock_ns(p.a.scqx);
    ibv_end_poll(p.a.scqx);
    uint64_t mono1 = clock_ns(CLOCK_MONOTONIC), wall1 = clock_ns(CLOCK_REALTIME);
    EXPECT_GE(ts, mono0);
    EXPECT_LE(ts, mono1);
    EXPECT_GE(wall, wall0);
    EXPECT_LE(wall, wall1);
}

TEST(CreateQpEx, CreateFlagsMaskWithNoFlags) {
    ibv_pd *pd = ibv_alloc_pd(g_ctx[0]);
    ASSERT_NE(pd, nullptr);
    ibv_cq *cq = ibv_create_cq(g_ctx[0], 16, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ia.pd = pd;
    ibv_qp *qp = ibv_create_qp_ex(g_ctx[0], &ia);
    ASSERT_NE(qp, nullptr) << std::strerror(errno);
    EXPECT_GE(ia.cap.max_send_wr, 4u);
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

class Rereg : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], PairOpts{})); }
    Pair p;
};

TEST_F(Rereg, InputErrors) {
    Buf b(p.b.pd, 64);
    ASSERT_TRUE(b.ok());
    errno = 0;
    EXPECT_EQ(ibv_rereg_mr(b.mr(), 1 << 10, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibv_rereg_mr(b.mr(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 64, 0),
              IBV_REREG_MR_ERR_INPUT);
    EXPECT_EQ(
        ibv_rereg_mr(b.mr(), IBV_REREG_MR_CHANGE_PD, p.a.pd, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
        IBV_REREG_MR_ERR_INPUT);
    // Remote write without local write, and a PD of another context.
    EXPECT_EQ(ibv_rereg_mr(b.mr(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                           IBV_ACCESS_REMOTE_WRITE),
              IBV_REREG_MR_ERR_CMD);
    errno = 0;
    EXPECT_EQ(ibv_rereg_mr(b.mr(), IBV_REREG_MR_CHANGE_PD, p.a.pd, nullptr, 0, 0),
              IBV_REREG_MR_ERR_CMD);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(b.mr()->pd, p.b.pd);
}

TEST_F(Rereg, AccessTakesEffectForTheSameKey) {
    Buf src(p.a.pd, 64), dst(p.b.pd, 64);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.fill(1);
    EXPECT_EQ(write(p, src, 64, dst.addr(), dst.rkey()).status, IBV_WC_SUCCESS);
    uint32_t rkey = dst.rkey();
    ASSERT_EQ(ibv_rereg_mr(dst.mr(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
              0);
    EXPECT_EQ(dst.rkey(), rkey);
    EXPECT_EQ(write(p, src, 64, dst.addr(), dst.rkey()).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Rereg, TranslationMovesTheRegion) {
    Buf src(p.a.pd, 64), dst(p.b.pd, 64);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.fill(2);
    std::vector<uint8_t> other(256, 0);
    ASSERT_EQ(ibv_rereg_mr(dst.mr(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data(),
                           other.size(), 0),
              0);
    EXPECT_EQ(dst.mr()->addr, other.data());
    EXPECT_EQ(dst.mr()->length, other.size());
    auto raddr = uint64_t(uintptr_t(other.data() + 100));
    EXPECT_EQ(write(p, src, 64, raddr, dst.rkey()).status, IBV_WC_SUCCESS);
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(other.data() + 100, src.data(), 64));
    // The old range is no longer registered.
    EXPECT_EQ(write(p, src, 64, dst.addr(), dst.rkey()).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Rereg, PdDecidesWhichQpsMayUseIt) {
    Buf src(p.a.pd, 64), dst(p.b.pd, 64);
    ASSERT_TRUE(src.ok() && dst.ok());
    ibv_pd *other = ibv_alloc_pd(g_ctx[1]);
    ASSERT_NE(other, nullptr);
    ASSERT_EQ(ibv_rereg_mr(dst.mr(), IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
    EXPECT_EQ(dst.mr()->pd, other);
    EXPECT_EQ(write(p, src, 64, dst.addr(), dst.rkey()).status, IBV_WC_REM_ACCESS_ERR);
    // Back in B's PD before the Buf is deregistered and the PD freed.
    ASSERT_EQ(ibv_rereg_mr(dst.mr(), IBV_REREG_MR_CHANGE_PD, p.b.pd, nullptr, 0, 0), 0);
    EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

class Odp : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], PairOpts{})); }
    Pair p;
};

TEST_F(Odp, ExplicitRegistration) {
    Buf src(p.a.pd, 128), dst(p.b.pd, 128, kAllAccess | IBV_ACCESS_ON_DEMAND);
    ASSERT_TRUE(src.ok() && dst.ok()) << std::strerror(errno);
    src.fill(3);
    EXPECT_EQ(write(p, src, 128, dst.addr(), dst.rkey()).status, IBV_WC_SUCCESS);
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 128));
}

// Implicit on-demand paging (a region over the whole address space) is not
// offered, as Linux rxe does not: its form is refused, with or without
// IBV_ACCESS_ON_DEMAND.
TEST_F(Odp, ImplicitRegistrationIsRefused) {
    for (unsigned odp : {0u, unsigned(IBV_ACCESS_ON_DEMAND)}) {
        errno = 0;
        EXPECT_EQ(ibv_reg_mr(p.b.pd, nullptr, SIZE_MAX,
                             int(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | odp)),
                  nullptr);
        EXPECT_EQ(errno, EINVAL);
    }
}

TEST_F(Odp, AdviseMr) {
    Buf b(p.a.pd, 4096, kAllAccess | IBV_ACCESS_ON_DEMAND);
    ASSERT_TRUE(b.ok());
    ibv_sge sge = b.sge(0, 4096);
    EXPECT_EQ(ibv_advise_mr(p.a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
                            &sge, 1),
              0);
    EXPECT_EQ(ibv_advise_mr(p.a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1), 0);
    EXPECT_EQ(ibv_advise_mr(p.a.pd, ibv_advise_mr_advice(7), 0, &sge, 1), EOPNOTSUPP);
    EXPECT_EQ(ibv_advise_mr(p.a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0), EINVAL);
    ibv_sge beyond = b.sge(4000, 200);
    EXPECT_EQ(ibv_advise_mr(p.a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &beyond, 1), EINVAL);
    ibv_sge wrong_pd = sge;
    EXPECT_EQ(ibv_advise_mr(p.b.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &wrong_pd, 1), EINVAL);
}

} // namespace

namespace {

// One RDMA WRITE over a new pair of QPs on `ctx`, compared byte for byte.
bool write_works(ibv_context *ctx[2]) {
    Pair p;
    p.setup(ctx[0], ctx[1], PairOpts{});
    if (::testing::Test::HasFatalFailure()) return false;
    Buf src(p.a.pd, 4096), dst(p.b.pd, 4096);
    if (!src.ok() || !dst.ok()) return false;
    src.fill(11);
    dst.set(0);
    ibv_wc wc = write(p, src, 4096, dst.addr(), dst.rkey());
    return wc.status == IBV_WC_SUCCESS && same_bytes(src.data(), dst.data(), 4096);
}

} // namespace

// A child of fork() runs none of its parent's progress threads and shares
// its parent's lease: the devices it opens must be its own, while the
// parent's stay open and working (rdma-core's rdma_cm tests fork both
// players from a process that has the device open).
TEST(Fork, ChildOpensTheDevicesAfresh) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork";
#endif
#if defined(__SANITIZE_ADDRESS__)
    // GCC 12's AddressSanitizer takes no allocator lock across fork(): a
    // child forked while a progress thread allocates inherits that lock held
    // and its own progress thread blocks on its first allocation.
    GTEST_SKIP() << "AddressSanitizer's allocator is not fork-safe in a multi-threaded process";
#endif
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
        int n = 0;
        ibv_device **list = ibv_get_device_list(&n);
        ibv_context *ctx[2] = {};
        for (int i = 0; list && i < n; i++) {
            const char *name = ibv_get_device_name(list[i]);
            for (int k = 0; k < 2; k++)
                if (!std::strcmp(name, k ? "vm1" : "vm0")) ctx[k] = ibv_open_device(list[i]);
        }
        if (!ctx[0] || !ctx[1]) _exit(2);
        _exit(write_works(ctx) ? 0 : 3);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st)) << "the child died of signal " << WTERMSIG(st);
    EXPECT_EQ(WEXITSTATUS(st), 0) << "2: no device opened in the child, 3: its write failed";
    EXPECT_TRUE(write_works(g_ctx)) << "the parent's devices after the fork";
}
