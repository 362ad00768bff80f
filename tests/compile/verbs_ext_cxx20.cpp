// SPDX-License-Identifier: MIT
//
// <infiniband/verbs_ext.h> as a strict C++20 program sees it (-std=c++20
// -pedantic -Wall -Wextra -Werror): the names are usable in constant
// expressions with the values of rdma-core >= 45, the header's declarations
// have C linkage and stay C++-clean, and ibv_wr_flush() reaches the entry
// point a provider puts right after wr_atomic_write.
#include <infiniband/verbs_ext.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

static_assert(IBV_ACCESS_FLUSH_GLOBAL == (1 << 8));
static_assert(IBV_ACCESS_FLUSH_PERSISTENT == (1 << 9));
static_assert(IBV_QP_EX_WITH_FLUSH == (1 << 11));
static_assert(IBV_QP_EX_WITH_ATOMIC_WRITE == (1 << 12));
static_assert(IBV_WR_FLUSH == 14);
static_assert(IBV_WR_ATOMIC_WRITE == 15);
static_assert(IBV_WC_FLUSH == 8);
static_assert(IBV_WC_ATOMIC_WRITE == 9);
static_assert(IBV_FLUSH_GLOBAL == 1 && IBV_FLUSH_PERSISTENT == 2);
static_assert(IBV_FLUSH_RANGE == 0 && IBV_FLUSH_MR == 1);
static_assert(IB_UVERBS_DEVICE_FLUSH_GLOBAL == (1ULL << 38));
static_assert(IB_UVERBS_DEVICE_FLUSH_PERSISTENT == (1ULL << 39));
static_assert(IB_UVERBS_DEVICE_ATOMIC_WRITE == (1ULL << 40));

// The opcodes have the types of upstream's enumerators, so they fit the
// fields of ibv_send_wr and ibv_wc without casts.
static_assert(std::is_same_v<std::remove_cv_t<decltype(IBV_WR_FLUSH)>, ibv_wr_opcode>);
static_assert(std::is_same_v<std::remove_cv_t<decltype(IBV_WC_FLUSH)>, ibv_wc_opcode>);
static_assert(std::is_same_v<decltype(&ibv_wr_flush),
                             void (*)(ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t)>);

#if PMOF_VERBS_HAVE_ATOMIC_WRITE
constexpr auto kAtomicWriteEnd = offsetof(ibv_qp_ex, wr_atomic_write) + sizeof(void *);
#else
constexpr auto kAtomicWriteEnd = sizeof(ibv_qp_ex) + sizeof(void *);
static_assert(offsetof(ibv_qp_ex_flush, wr_atomic_write) == sizeof(ibv_qp_ex),
              "wr_atomic_write follows rdma-core < 44's struct ibv_qp_ex");
#endif
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
static_assert(offsetof(ibv_qp_ex, wr_flush) == kAtomicWriteEnd);
#else
static_assert(!PMOF_VERBS_HAVE_ATOMIC_WRITE || kAtomicWriteEnd == sizeof(ibv_qp_ex),
              "wr_atomic_write is the last member of rdma-core 44's struct ibv_qp_ex");
static_assert(offsetof(ibv_qp_ex_flush, wr_flush) == kAtomicWriteEnd);
static_assert(std::is_standard_layout_v<ibv_qp_ex_flush>);
#endif

// Part 2, write-commit: project names, clear of every upstream value.
static_assert((IBV_QP_EX_WITH_RDMA_WRITE_COMMIT & ((1ULL << 13) - 1)) == 0);
static_assert(std::is_same_v<std::remove_cv_t<decltype(IBV_WC_RDMA_WRITE_COMMIT)>, ibv_wc_opcode>);
static_assert(IBV_WC_RDMA_WRITE_COMMIT > IBV_WC_ATOMIC_WRITE &&
              (IBV_WC_RDMA_WRITE_COMMIT & IBV_WC_RECV) == 0);

// Never called: compiling and linking it shows the write-commit declarations
// are C++20-clean and resolve against the libraries linked.
int use_write_commit(ibv_context *ctx, ibv_qp_ex *qp) {
    ibv_commit_caps caps{};
    if (int ret = ibv_query_commit_caps(ctx, &caps)) return ret;
    if (int ret = ibv_qp_set_commit_peer(&qp->qp_base, caps.flags & IBV_COMMIT_CAP_NATIVE))
        return ret;
    if (!ibv_qp_to_commit_ops(qp)) return -1;
    ibv_wr_start(qp);
    int ret = ibv_wr_rdma_write_commit(qp, 1, 0x1000, IBV_WRITE_COMMIT_ORDERED);
    if (!ret) ret = ibv_wr_rdma_write_commit_imm(qp, 1, 0x2000, IBV_WRITE_COMMIT_GLOBAL, 0);
    if (ret) {
        ibv_wr_abort(qp);
        return ret;
    }
    return ibv_wr_complete(qp);
}

// An application's own constants built from the names, as constant
// expressions.
constexpr unsigned kTargetAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                   IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;
constexpr uint64_t kSendOps =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE;
constexpr uint64_t kWantedCaps = IB_UVERBS_DEVICE_FLUSH_GLOBAL | IB_UVERBS_DEVICE_FLUSH_PERSISTENT |
                                 IB_UVERBS_DEVICE_ATOMIC_WRITE;
constexpr uint8_t kBothPlacements = IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT;
static_assert(kTargetAccess == 0x303 && kSendOps == 0x1801 && kWantedCaps == (7ULL << 38) &&
              kBothPlacements == 3);

namespace {

using FlushFn = void (*)(ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);

// A provider's QP object.  Built against rdma-core 44, it appends the flush
// entry point to the struct; rdma-core >= 45 has it as a member.
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
struct ProviderQp {
    ibv_qp_ex qpx;
    void set_flush(FlushFn f) { qpx.wr_flush = f; }
};
#else
struct ProviderQp {
    ibv_qp_ex qpx;
#if !PMOF_VERBS_HAVE_ATOMIC_WRITE
    void (*wr_atomic_write)(ibv_qp_ex *, uint32_t, uint64_t, const void *);
#endif
    FlushFn flush;
    void set_flush(FlushFn f) {
        flush = f;
    }
};
static_assert(offsetof(ProviderQp, flush) == kAtomicWriteEnd);
#endif

struct Seen {
    ibv_qp_ex *qp = nullptr;
    uint32_t rkey = 0;
    uint64_t addr = 0;
    size_t len = 0;
    unsigned type = 0, level = 0;
    uint64_t value = 0;
    int calls = 0;
} seen;

extern "C" void fake_flush(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, size_t len, uint8_t type,
                           uint8_t level) {
    seen.qp = qp;
    seen.rkey = rkey;
    seen.addr = addr;
    seen.len = len;
    seen.type = type;
    seen.level = level;
    seen.calls++;
}

extern "C" void fake_atomic_write(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, const void *wr) {
    seen.qp = qp;
    seen.rkey = rkey;
    seen.addr = addr;
    std::memcpy(&seen.value, wr, sizeof(seen.value));
    seen.calls++;
}

// With rdma-core 44 the enum has no FLUSH enumerator, so -Wswitch rejects it
// as a case label of a switch on ibv_wc_opcode; switching on int works with
// both.
constexpr const char *opcode_name(ibv_wc_opcode op) {
    switch (int(op)) {
    case IBV_WC_FLUSH:
        return "FLUSH";
    case IBV_WC_ATOMIC_WRITE:
        return "ATOMIC_WRITE";
    default:
        return "other";
    }
}
static_assert(opcode_name(IBV_WC_FLUSH)[0] == 'F');

int failures;

void check(bool ok, const char *what, int line) {
    if (ok) return;
    std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    failures++;
}
#define CHECK(cond) check((cond), #cond, __LINE__)

} // namespace

int main() {
    ProviderQp q{};
    q.set_flush(fake_flush);
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
    q.qpx.wr_atomic_write = fake_atomic_write;
#else
    q.wr_atomic_write = fake_atomic_write;
#endif

    ibv_wr_flush(&q.qpx, 0xabc, 0x2000, 64, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE);
    CHECK(seen.calls == 1 && seen.qp == &q.qpx && seen.rkey == 0xabc && seen.addr == 0x2000 &&
          seen.len == 64 && seen.type == IBV_FLUSH_PERSISTENT && seen.level == IBV_FLUSH_RANGE);
    ibv_wr_flush(&q.qpx, 1, 0, 0, kBothPlacements, IBV_FLUSH_MR);
    CHECK(seen.calls == 2 && seen.type == 3 && seen.level == IBV_FLUSH_MR);

    const uint64_t word = 0x8877665544332211ULL;
    ibv_wr_atomic_write(&q.qpx, 9, 0x3008, &word);
    CHECK(seen.calls == 3 && seen.rkey == 9 && seen.addr == 0x3008 && seen.value == word);

    ibv_wc wc{};
    wc.opcode = IBV_WC_FLUSH;
    CHECK(wc.opcode == IBV_WC_FLUSH);
    CHECK(std::strcmp(opcode_name(wc.opcode), "FLUSH") == 0);
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_FLUSH;
    CHECK(wr.opcode == 14);

    if (failures) return 1;
    std::printf("verbs_ext.h (C++20, %s FLUSH definitions): ok\n",
                PMOF_VERBS_HAVE_UPSTREAM_FLUSH ? "system" : "supplied");
    return 0;
}
