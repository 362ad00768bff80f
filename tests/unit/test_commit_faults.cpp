// SPDX-License-Identifier: MIT
//
// Write-commit under loss, duplication and reordering (the engine's fault
// injector, set before the devices on 127.0.1.13 / 127.0.1.14 are opened):
// on both the native and the IBTA path, every commit completes, in order,
// only once its range is durable, and every immediate reaches the target once
// and in order.
#include "persist_log.hpp"

#include <infiniband/verbs_ext.h>
#include <random>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];
PersistLog g_log;

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new DevicePairEnv(
        "cf0", "127.0.1.13", "cf1", "127.0.1.14", g_ctx,
        [] {
            setenv("SROCE_FAULT", "drop=0.03,dup=0.03,reorder=0.03,seed=11", 1);
            sroce_set_persist_hook(&PersistLog::hook, &g_log);
        },
        [] { sroce_set_persist_hook(nullptr, nullptr); }));

constexpr unsigned kFlushAccess = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;

class CommitFaults : public ::testing::TestWithParam<bool> {};

TEST_P(CommitFaults, EveryCommitCompletesDurableAndInOrder) {
    Pair p;
    PairOpts o;
    o.qp_ex = true;
    o.extra_send_ops = IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    o.sq_sig_all = false;
    o.send_wr = 256;
    o.b_access = kAllAccess | kFlushAccess;
    o.recv_wr = 256;
    ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o));
    if (GetParam()) {
        ASSERT_EQ(ibv_qp_set_commit_peer(p.a.qp, IBV_COMMIT_CAP_NATIVE), 0);
    }
    constexpr size_t kLen = 4 << 20;
    FileMr dst(p.b.pd, kLen, kAllAccess | kFlushAccess);
    ASSERT_TRUE(dst.ok()) << std::strerror(errno);
    Buf src(p.a.pd, kLen);
    src.fill(GetParam() ? 51 : 52);
    Buf rbuf(p.b.pd, 64);
    g_log.clear();

    std::mt19937_64 rng(GetParam() ? 7 : 8);
    constexpr int kOps = 400;
    struct Op {
        size_t off, len;
        bool imm;
    };
    std::vector<Op> ops;
    size_t next = 0;
    int polled = 0, imms = 0;
    auto check_completion = [&](const ibv_wc &wc) {
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "commit " << wc.wr_id;
        ASSERT_EQ(wc.wr_id, uint64_t(polled)) << "commits complete in order";
        ASSERT_EQ(wc.opcode, IBV_WC_RDMA_WRITE_COMMIT);
        const Op &op = ops[size_t(polled)];
        // Durable by the time the initiator hears of it.
        ASSERT_TRUE(g_log.covers(dst.data() + op.off, op.len)) << "commit " << polled;
        polled++;
    };
    for (int i = 0; i < kOps; i++) {
        Op op{next, 1 + rng() % 9000, rng() % 3 == 0};
        next += op.len + rng() % 64;
        ASSERT_LT(next, kLen);
        ops.push_back(op);
        if (op.imm) {
            ASSERT_EQ(post_recv(p.b.qp, uint64_t(i), {rbuf.sge(0, 64)}), 0);
        }
        // A plain write to the same rkey before each commit: the commit must
        // cover it too.
        ibv_qp_ex *q = p.a.qpx;
        ibv_wr_start(q);
        q->wr_id = uint64_t(i);
        q->wr_flags = IBV_SEND_SIGNALED;
        uint32_t flags = (rng() % 2) ? IBV_WRITE_COMMIT_ORDERED : 0;
        if (op.imm) {
            ASSERT_EQ(ibv_wr_rdma_write_commit_imm(q, dst.rkey(), dst.addr(op.off), flags,
                                                   htonl(uint32_t(i))),
                      0);
        } else {
            ASSERT_EQ(ibv_wr_rdma_write_commit(q, dst.rkey(), dst.addr(op.off), flags), 0);
        }
        ibv_wr_set_sge(q, src.lkey(), src.addr(op.off), uint32_t(op.len));
        ASSERT_EQ(ibv_wr_complete(q), 0);
        // Keep up to 16 commits in flight.
        while (i + 1 - polled >= 16) {
            std::vector<ibv_wc> wc = poll_n(p.a.scq, 1, 30s);
            ASSERT_EQ(wc.size(), 1u) << "stuck with " << i + 1 - polled << " in flight";
            ASSERT_NO_FATAL_FAILURE(check_completion(wc[0]));
        }
    }
    while (polled < kOps) {
        std::vector<ibv_wc> wc = poll_n(p.a.scq, 1, 30s);
        ASSERT_EQ(wc.size(), 1u) << "stuck at " << polled;
        ASSERT_NO_FATAL_FAILURE(check_completion(wc[0]));
    }
    // Every immediate arrived once, in order.
    int expect_imm = 0;
    for (int i = 0; i < kOps; i++)
        if (ops[size_t(i)].imm) expect_imm++;
    std::vector<ibv_wc> rc = poll_n(p.b.rcq, size_t(expect_imm), 30s);
    ASSERT_EQ(int(rc.size()), expect_imm);
    int last = -1;
    for (const ibv_wc &wc : rc) {
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        int seq = int(ntohl(wc.imm_data));
        EXPECT_GT(seq, last);
        EXPECT_TRUE(ops[size_t(seq)].imm);
        last = seq;
        imms++;
    }
    EXPECT_EQ(imms, expect_imm);
    EXPECT_TRUE(drain(p.b.rcq, 100ms).empty()) << "an immediate was delivered twice";
    Pair::sync_with(p.b);
    for (const Op &op : ops)
        ASSERT_TRUE(same_bytes(dst.data() + op.off, src.data() + op.off, op.len));
}

INSTANTIATE_TEST_SUITE_P(Paths, CommitFaults, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return i.param ? "native" : "ibta_fallback";
                         });

} // namespace
