// SPDX-License-Identifier: MIT
//
// <infiniband/verbs_ext.h> itself, without devices: the names it supplies
// carry rdma-core >= 45's values, the configure-time decision about the
// system's headers matches what they contain, and ibv_wr_flush() reaches the
// entry point a provider places right after wr_atomic_write.  Strict C11 and
// C++20 builds of the header are in tests/compile/.
#include <infiniband/verbs_ext.h>
// Included twice on purpose: the header must be idempotent.
#include <infiniband/verbs_ext.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

#if PMOF_VERBS_HAVE_ATOMIC_WRITE
constexpr size_t kAtomicWriteEnd = offsetof(ibv_qp_ex, wr_atomic_write) + sizeof(void *);
#else
constexpr size_t kAtomicWriteEnd = sizeof(ibv_qp_ex) + sizeof(void *);
#endif

TEST(VerbsExtHeader, UpstreamValues) {
    EXPECT_EQ(IBV_ACCESS_FLUSH_GLOBAL, 1 << 8);
    EXPECT_EQ(IBV_ACCESS_FLUSH_PERSISTENT, 1 << 9);
    EXPECT_EQ(uint64_t(IBV_QP_EX_WITH_FLUSH), 1u << 11);
    EXPECT_EQ(uint64_t(IBV_QP_EX_WITH_ATOMIC_WRITE), 1u << 12);
    EXPECT_EQ(int(IBV_WR_FLUSH), 14);
    EXPECT_EQ(int(IBV_WR_ATOMIC_WRITE), 15);
    EXPECT_EQ(int(IBV_WC_FLUSH), 8);
    EXPECT_EQ(int(IBV_WC_ATOMIC_WRITE), 9);
    EXPECT_EQ(int(IBV_FLUSH_GLOBAL), 1);
    EXPECT_EQ(int(IBV_FLUSH_PERSISTENT), 2);
    EXPECT_EQ(int(IBV_FLUSH_RANGE), 0);
    EXPECT_EQ(int(IBV_FLUSH_MR), 1);
    EXPECT_EQ(uint64_t(IB_UVERBS_DEVICE_FLUSH_GLOBAL), 1ull << 38);
    EXPECT_EQ(uint64_t(IB_UVERBS_DEVICE_FLUSH_PERSISTENT), 1ull << 39);
    EXPECT_EQ(uint64_t(IB_UVERBS_DEVICE_ATOMIC_WRITE), 1ull << 40);
}

// The FLUSH opcodes take values rdma-core 44 leaves unused, so a completion
// can never be mistaken for another kind.
TEST(VerbsExtHeader, OpcodesDoNotCollide) {
    for (int op : {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP,
                   IBV_WC_FETCH_ADD, IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_TSO,
                   IBV_WC_ATOMIC_WRITE, IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM}) {
        EXPECT_NE(op, int(IBV_WC_FLUSH));
    }
    EXPECT_FALSE(IBV_WC_FLUSH & IBV_WC_RECV) << "a FLUSH completion is a send completion";
    for (int op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
                   IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                   IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV, IBV_WR_TSO,
                   IBV_WR_DRIVER1, IBV_WR_ATOMIC_WRITE}) {
        EXPECT_NE(op, int(IBV_WR_FLUSH));
    }
}

TEST(VerbsExtHeader, FlushAccessIsMandatoryAndDistinct) {
    const unsigned flush = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;
    const unsigned older = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND |
                           IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;
    EXPECT_EQ(flush & older, 0u);
    // Below IBV_ACCESS_OPTIONAL_FIRST: a provider that cannot honour them
    // must fail the registration rather than ignore them.
    EXPECT_LT(flush, unsigned(IBV_ACCESS_OPTIONAL_FIRST));
}

// PMOF_VERBS_HAVE_ATOMIC_WRITE and PMOF_VERBS_HAVE_UPSTREAM_FLUSH were
// decided by compiling against the system's headers; the struct those
// headers define must agree with them.
TEST(VerbsExtHeader, ConfigMatchesSystemHeaders) {
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
    EXPECT_EQ(offsetof(ibv_qp_ex, wr_flush), kAtomicWriteEnd);
#else
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
    EXPECT_EQ(sizeof(ibv_qp_ex), kAtomicWriteEnd)
        << "the system's struct ibv_qp_ex has members after wr_atomic_write, yet the "
           "configuration says it lacks wr_flush";
#else
    EXPECT_EQ(offsetof(ibv_qp_ex_flush, wr_atomic_write), sizeof(ibv_qp_ex));
#endif
    EXPECT_EQ(offsetof(ibv_qp_ex_flush, qpx), 0u);
    EXPECT_EQ(offsetof(ibv_qp_ex_flush, wr_flush), kAtomicWriteEnd);
#endif
}

using FlushFn = void (*)(ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);

struct FlushCall {
    ibv_qp_ex *qp;
    uint32_t rkey;
    uint64_t addr;
    size_t len;
    uint8_t type, level;
};
FlushCall g_call;
int g_calls;

void record_flush(ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, size_t len, uint8_t type,
                  uint8_t level) {
    g_call = {qp, rkey, addr, len, type, level};
    g_calls++;
}

// The header cannot know the provider's struct; it only knows where
// rdma-core >= 45 puts the member.  This QP is raw storage with the entry
// point written at that offset, as a provider built against rdma-core 44
// places it.
TEST(VerbsExtHeader, WrFlushCallsTheEntryPointAfterWrAtomicWrite) {
    alignas(ibv_qp_ex) unsigned char storage[kAtomicWriteEnd + sizeof(FlushFn)] = {};
    auto *qp = reinterpret_cast<ibv_qp_ex *>(storage);
    FlushFn fn = record_flush;
    std::memcpy(storage + kAtomicWriteEnd, &fn, sizeof(fn));
    g_calls = 0;

    ibv_wr_flush(qp, 0xdeadbeef, 0x7f0000001000ull, 1ull << 33, IBV_FLUSH_PERSISTENT,
                 IBV_FLUSH_RANGE);
    ASSERT_EQ(g_calls, 1);
    EXPECT_EQ(g_call.qp, qp);
    EXPECT_EQ(g_call.rkey, 0xdeadbeefu);
    EXPECT_EQ(g_call.addr, 0x7f0000001000ull);
    EXPECT_EQ(g_call.len, size_t(1) << 33) << "the length is a size_t, not 32 bits";
    EXPECT_EQ(g_call.type, IBV_FLUSH_PERSISTENT);
    EXPECT_EQ(g_call.level, IBV_FLUSH_RANGE);

    ibv_wr_flush(qp, 1, 0, 0, IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT, IBV_FLUSH_MR);
    ASSERT_EQ(g_calls, 2);
    EXPECT_EQ(g_call.type, 3);
    EXPECT_EQ(g_call.level, IBV_FLUSH_MR);
}

// What "the names fit the structures" means for an application: assigning
// them to the fields rdma-core declares needs no cast.
TEST(VerbsExtHeader, NamesFitTheVerbsStructures) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_FLUSH;
    EXPECT_EQ(wr.opcode, IBV_WR_FLUSH);
    ibv_wc wc{};
    wc.opcode = IBV_WC_FLUSH;
    EXPECT_EQ(wc.opcode, IBV_WC_FLUSH);
    ibv_qp_init_attr_ex ia{};
    ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH;
    EXPECT_TRUE(ia.send_ops_flags & IBV_QP_EX_WITH_FLUSH);
    ibv_device_attr_ex da{};
    da.device_cap_flags_ex = IB_UVERBS_DEVICE_FLUSH_PERSISTENT;
    EXPECT_TRUE(da.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_PERSISTENT);
    EXPECT_FALSE(da.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_GLOBAL);
    ibv_qp_attr qa{};
    qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_PERSISTENT;
    EXPECT_EQ(qa.qp_access_flags, unsigned(IBV_ACCESS_REMOTE_WRITE) | (1u << 9));
}

} // namespace
