// SPDX-License-Identifier: MIT
//
// The RC transport through public verbs, in one process: two sroce devices on
// loopback (127.0.1.1 and 127.0.1.2, used by no other test), each with its own
// NIC and progress thread, and a pair of QPs connected back to back.  Every
// test checks the data byte for byte and every defined field of every work
// completion.
#include "rc_pair.hpp"

#include <fcntl.h>
#include <poll.h>
#include <random>

using namespace rctest;

namespace {

ibv_context *g_ctx[2];

// The devices are opened once for the binary; closing them at the end runs
// the NIC teardown (progress thread join, socket close) as well.
class Devices : public ::testing::Environment {
  public:
    void SetUp() override {
        ibv_device *dev[2];
        std::string err = find_devices("rct0", "127.0.1.1", "rct1", "127.0.1.2", dev);
        ASSERT_EQ(err, "");
        for (int i = 0; i < 2; i++) {
            g_ctx[i] = open_device(dev[i]);
            ASSERT_NE(g_ctx[i], nullptr) << std::strerror(errno);
        }
    }
    void TearDown() override {
        for (ibv_context *&c : g_ctx) {
            if (c) {
                EXPECT_EQ(ibv_close_device(c), 0);
            }
            c = nullptr;
        }
    }
};

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new Devices);

class Rc : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(g_ctx[0] && g_ctx[1]) << "sroce devices not open"; }
    void make(const PairOpts &o = {}) { ASSERT_NO_FATAL_FAILURE(p.setup(g_ctx[0], g_ctx[1], o)); }
    static void make(Pair &q, const PairOpts &o) {
        ASSERT_NO_FATAL_FAILURE(q.setup(g_ctx[0], g_ctx[1], o));
    }

    Pair p;
};

class RcMtu : public Rc, public ::testing::WithParamInterface<ibv_mtu> {};

constexpr size_t kMiB = 1 << 20;

std::vector<size_t> message_sizes(uint32_t mtu) {
    return {0, 1, mtu - 1, mtu, mtu + 1, 5 * size_t(mtu) + 3, kMiB};
}

std::vector<ibv_sge> one(const Buf &b, size_t off, size_t len) {
    if (!len) return {};
    return {b.sge(off, len)};
}

// Bytes of `b` outside every SGE of `sg` still hold `v` (SGEs in other
// buffers are ignored).
::testing::AssertionResult uncovered_are(const Buf &b, const std::vector<ibv_sge> &sg, uint8_t v) {
    std::vector<bool> covered(b.size());
    for (const ibv_sge &s : sg) {
        if (s.addr < b.addr() || s.addr + s.length > b.addr(b.size())) continue;
        for (uint32_t i = 0; i < s.length; i++)
            covered[size_t(s.addr - b.addr()) + i] = true;
    }
    for (size_t i = 0; i < b.size(); i++)
        if (!covered[i] && b.data()[i] != v)
            return ::testing::AssertionFailure() << "byte " << i << " outside the SGEs changed";
    return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// Data path

TEST_P(RcMtu, SendRecv) {
    PairOpts o;
    o.mtu = GetParam();
    make(o);
    const uint32_t mtu = mtu_bytes(o.mtu);
    Buf src(p.a.pd, kMiB + 8), dst(p.b.pd, kMiB + 8);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.fill(1);
    uint64_t id = 0;
    for (size_t len : message_sizes(mtu)) {
        SCOPED_TRACE("length " + std::to_string(len));
        dst.set(0);
        ASSERT_EQ(post_recv(p.b.qp, 1000 + id, {dst.sge(0, dst.size())}), 0);
        ASSERT_EQ(post_send(p.a.qp, id, one(src, 3, len)), 0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        expect_one(p.b.rcq, {1000 + id, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), int64_t(len)});
        EXPECT_TRUE(same_bytes(dst.data(), src.data() + 3, len));
        EXPECT_TRUE(all_bytes(dst.data() + len, dst.size() - len, 0));
        EXPECT_TRUE(dst.guards_intact());
        id++;
    }
    EXPECT_TRUE(drain(p.a.scq).empty());
    EXPECT_TRUE(drain(p.b.scq).empty());
}

TEST_P(RcMtu, RdmaWrite) {
    PairOpts o;
    o.mtu = GetParam();
    make(o);
    const uint32_t mtu = mtu_bytes(o.mtu);
    Buf src(p.a.pd, kMiB + 8), dst(p.b.pd, kMiB + 16);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.fill(2);
    uint64_t id = 0;
    for (size_t len : message_sizes(mtu)) {
        SCOPED_TRACE("length " + std::to_string(len));
        dst.set(0);
        Pair::sync_with(p.b);
        ASSERT_EQ(
            post_rdma(p.a.qp, id, IBV_WR_RDMA_WRITE, one(src, 5, len), dst.addr(7), dst.rkey()), 0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
        Pair::sync_with(p.b);
        EXPECT_TRUE(all_bytes(dst.data(), 7, 0));
        EXPECT_TRUE(same_bytes(dst.data() + 7, src.data() + 5, len));
        EXPECT_TRUE(all_bytes(dst.data() + 7 + len, dst.size() - 7 - len, 0));
        EXPECT_TRUE(dst.guards_intact());
        id++;
    }
    // A plain WRITE consumes no receive and completes nothing at the responder.
    EXPECT_TRUE(drain(p.b.rcq).empty());
}

TEST_P(RcMtu, RdmaReadIntoScatterList) {
    PairOpts o;
    o.mtu = GetParam();
    make(o);
    const uint32_t mtu = mtu_bytes(o.mtu);
    constexpr size_t kGap = 29;
    Buf remote(p.b.pd, kMiB + 16), local(p.a.pd, kMiB + 4 * kGap);
    ASSERT_TRUE(remote.ok() && local.ok());
    remote.fill(3);
    Pair::sync_with(p.b);
    uint64_t id = 0;
    for (size_t len : message_sizes(mtu)) {
        SCOPED_TRACE("length " + std::to_string(len));
        local.set(0);
        std::vector<ibv_sge> sg = spread(local, len, 3, kGap);
        ASSERT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_READ, sg, remote.addr(9), remote.rkey()), 0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, p.a.qpn(), int64_t(len)});
        std::vector<uint8_t> got = gathered(sg);
        ASSERT_EQ(got.size(), len);
        EXPECT_TRUE(same_bytes(got.data(), remote.data() + 9, len));
        EXPECT_TRUE(uncovered_are(local, sg, 0));
        EXPECT_TRUE(local.guards_intact());
        id++;
    }
}

// A target application that keeps writing memory its peer READs (a status
// word, a ring being refilled) gets torn data, as from any RNIC — but every
// READ completes: each response must carry an ICRC over the bytes it carries,
// not over what the memory held a moment before it was sent.
TEST_F(Rc, ReadOfMemoryTheTargetKeepsWriting) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the application racing the NIC's reads is the point of this test";
#endif
    PairOpts o;
    o.mtu = IBV_MTU_4096;
    // 4 ms, three retries: a response that never verifies fails in ~16 ms,
    // while a loaded host that delays one (the writer spins on a core of
    // two) gets more than one chance, as it sometimes needs.
    o.retry_cnt = 3;
    o.timeout = 10;
    make(o);
    constexpr size_t kLen = 64 << 10;
    Buf remote(p.b.pd, kLen), local(p.a.pd, kLen);
    ASSERT_TRUE(remote.ok() && local.ok());
    remote.set(0);
    Pair::sync_with(p.b);
    std::atomic<bool> stop{false}, started{false};
    std::thread writer([&] {
        for (uint8_t v = 1; !stop.load(std::memory_order_relaxed); v = uint8_t(v % 255 + 1)) {
            std::memset(remote.data(), v, kLen);
            started.store(true, std::memory_order_release);
        }
    });
    while (!started.load(std::memory_order_acquire))
        std::this_thread::yield();
    for (uint64_t id = 0; id < 200; id++) {
        ASSERT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_READ, one(local, 0, kLen), remote.addr(),
                            remote.rkey()),
                  0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, p.a.qpn(), int64_t(kLen)});
        if (HasFailure()) break;
    }
    stop = true;
    writer.join();
    // The writer had covered the buffer before the first READ: no 0 left.
    EXPECT_EQ(std::count(local.data(), local.data() + kLen, 0), 0);
    EXPECT_TRUE(local.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(PathMtu, RcMtu, ::testing::Values(IBV_MTU_256, IBV_MTU_1024, IBV_MTU_4096),
                         [](const ::testing::TestParamInfo<ibv_mtu> &i) {
                             return "mtu" + std::to_string(mtu_bytes(i.param));
                         });

TEST_F(Rc, SendWithImmediate) {
    PairOpts o;
    o.mtu = IBV_MTU_256;
    make(o);
    Buf src(p.a.pd, 4096), dst(p.b.pd, 4096);
    src.fill(4);
    uint64_t id = 0;
    for (size_t len : {size_t(0), size_t(4), size_t(255), size_t(1000)}) {
        SCOPED_TRACE("length " + std::to_string(len));
        dst.set(0);
        uint32_t imm = 0xA1B2C300u + uint32_t(id);
        ASSERT_EQ(post_recv(p.b.qp, 500 + id, {dst.sge(0, dst.size())}), 0);
        ASSERT_EQ(post_send_imm(p.a.qp, id, one(src, 0, len), imm), 0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        expect_one(p.b.rcq, {500 + id, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), int64_t(len),
                             IBV_WC_WITH_IMM, imm});
        EXPECT_TRUE(same_bytes(dst.data(), src.data(), len));
        EXPECT_TRUE(all_bytes(dst.data() + len, dst.size() - len, 0));
        id++;
    }
}

TEST_F(Rc, RdmaWriteWithImmediate) {
    PairOpts o;
    o.mtu = IBV_MTU_1024;
    make(o);
    const size_t mtu = 1024;
    Buf src(p.a.pd, 8 * mtu), dst(p.b.pd, 8 * mtu);
    src.fill(5);
    uint64_t id = 0;
    for (size_t len : {size_t(0), size_t(1), 5 * mtu + 3}) {
        SCOPED_TRACE("length " + std::to_string(len));
        dst.set(0);
        Pair::sync_with(p.b);
        uint32_t imm = 0x0BADC0DEu + uint32_t(id);
        // The receive WQE needs no buffer: the data goes where the WRITE says.
        ASSERT_EQ(post_recv(p.b.qp, 700 + id, {}), 0);
        ASSERT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_WRITE_WITH_IMM, one(src, 0, len), dst.addr(11),
                            dst.rkey(), IBV_SEND_SIGNALED, imm),
                  0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
        expect_one(p.b.rcq, {700 + id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, p.b.qpn(),
                             int64_t(len), IBV_WC_WITH_IMM, imm});
        Pair::sync_with(p.b);
        EXPECT_TRUE(same_bytes(dst.data() + 11, src.data(), len));
        EXPECT_TRUE(all_bytes(dst.data() + 11 + len, dst.size() - 11 - len, 0));
        id++;
    }
}

TEST_F(Rc, GatherSendScatterReceive) {
    PairOpts o;
    o.mtu = IBV_MTU_256;
    make(o);
    Buf s1(p.a.pd, 2048), s2(p.a.pd, 2048), d1(p.b.pd, 2048), d2(p.b.pd, 2048);
    s1.fill(6);
    s2.fill(7);
    d1.set(0);
    d2.set(0);
    // 1201 bytes from two MRs into three receive pieces of 7, 600 and 1000.
    std::vector<ibv_sge> gather{s1.sge(0, 100), s2.sge(0, 300), s1.sge(200, 800), s2.sge(500, 1)};
    std::vector<ibv_sge> scatter{d1.sge(3, 7), d2.sge(0, 600), d1.sge(50, 1000)};
    ASSERT_EQ(post_recv(p.b.qp, 9, scatter), 0);
    ASSERT_EQ(post_send(p.a.qp, 8, gather), 0);
    expect_one(p.a.scq, {8, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {9, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 1201});
    std::vector<uint8_t> sent = gathered(gather), got = gathered(scatter);
    ASSERT_EQ(sent.size(), 1201u);
    EXPECT_TRUE(same_bytes(got.data(), sent.data(), sent.size()));
    EXPECT_TRUE(all_bytes(got.data() + sent.size(), got.size() - sent.size(), 0));
    EXPECT_TRUE(uncovered_are(d1, scatter, 0));
    EXPECT_TRUE(uncovered_are(d2, scatter, 0));
}

TEST_F(Rc, InlineSendAndWrite) {
    PairOpts o;
    o.mtu = IBV_MTU_256;
    o.max_inline = 512;
    make(o);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qia{};
    ASSERT_EQ(ibv_query_qp(p.a.qp, &qa, IBV_QP_CAP, &qia), 0);
    EXPECT_GE(qia.cap.max_inline_data, 512u);
    Buf dst(p.b.pd, 1024), rdst(p.b.pd, 1024);
    uint64_t id = 0;
    for (size_t len : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(257), size_t(512)}) {
        SCOPED_TRACE("length " + std::to_string(len));
        // Unregistered memory, reused as soon as the post returns: inline
        // data is copied when posted.
        std::vector<uint8_t> msg(len + 1), want(len + 1);
        fill_pattern(want.data(), want.size(), 100 + id);
        msg = want;
        std::vector<ibv_sge> sg;
        if (len) sg.push_back({uint64_t(uintptr_t(msg.data())), uint32_t(len), 0xDEAD});
        dst.set(0);
        rdst.set(0);
        Pair::sync_with(p.b);
        ASSERT_EQ(post_recv(p.b.qp, 300 + id, {dst.sge(0, dst.size())}), 0);
        ASSERT_EQ(post_send(p.a.qp, id, sg, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
        ASSERT_EQ(post_rdma(p.a.qp, 100 + id, IBV_WR_RDMA_WRITE, sg, rdst.addr(1), rdst.rkey(),
                            IBV_SEND_SIGNALED | IBV_SEND_INLINE),
                  0);
        std::fill(msg.begin(), msg.end(), 0x5A);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        expect_one(p.a.scq, {100 + id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
        expect_one(p.b.rcq, {300 + id, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), int64_t(len)});
        Pair::sync_with(p.b);
        EXPECT_TRUE(same_bytes(dst.data(), want.data(), len));
        EXPECT_TRUE(all_bytes(dst.data() + len, dst.size() - len, 0));
        EXPECT_TRUE(all_bytes(rdst.data(), 1, 0));
        EXPECT_TRUE(same_bytes(rdst.data() + 1, want.data(), len));
        EXPECT_TRUE(all_bytes(rdst.data() + 1 + len, rdst.size() - 1 - len, 0));
        id++;
    }
    // More than max_inline_data is refused at post time.
    std::vector<uint8_t> big(1024);
    std::vector<ibv_sge> sg{{uint64_t(uintptr_t(big.data())), 513, 0}};
    ibv_send_wr wr = send_wr(77, IBV_WR_SEND, sg, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    EXPECT_NE(post(p.a.qp, wr), 0);
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
}

TEST_F(Rc, InlineWithoutInlineCapacity) {
    make(); // max_inline_data 0
    Buf dst(p.b.pd, 64);
    dst.set(0x44);
    ASSERT_EQ(post_recv(p.b.qp, 5, {dst.sge(0, 64)}), 0);
    // Zero bytes always fit; one byte does not.
    ASSERT_EQ(post_send(p.a.qp, 1, {}, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {5, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 0});
    uint8_t byte = 1;
    std::vector<ibv_sge> sg{{uint64_t(uintptr_t(&byte)), 1, 0}};
    ibv_send_wr wr = send_wr(2, IBV_WR_SEND, sg, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    EXPECT_EQ(post(p.a.qp, wr), EINVAL);
    EXPECT_TRUE(all_bytes(dst.data(), 64, 0x44));
}

TEST_F(Rc, AtomicCompareSwap) {
    make();
    Buf remote(p.b.pd, 64), local(p.a.pd, 64);
    remote.set(0x11);
    local.set(0x22);
    const uint64_t v0 = 0x1122334455667788ull, v1 = 0xCAFEF00DDEADBEEFull;
    remote.word(8) = v0;
    Pair::sync_with(p.b);
    // Matching compare: swapped, original returned.
    ASSERT_EQ(post_atomic(p.a.qp, 1, IBV_WR_ATOMIC_CMP_AND_SWP, local.sge(16, 8), remote.addr(8),
                          remote.rkey(), v0, v1),
              0);
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, p.a.qpn(), 8});
    EXPECT_EQ(local.word(16), v0);
    Pair::sync_with(p.b);
    EXPECT_EQ(remote.word(8), v1);
    // Mismatch: memory unchanged, current value returned.
    ASSERT_EQ(post_atomic(p.a.qp, 2, IBV_WR_ATOMIC_CMP_AND_SWP, local.sge(24, 8), remote.addr(8),
                          remote.rkey(), v0, 42),
              0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, p.a.qpn(), 8});
    EXPECT_EQ(local.word(24), v1);
    Pair::sync_with(p.b);
    EXPECT_EQ(remote.word(8), v1);
    EXPECT_TRUE(all_bytes(remote.data(), 8, 0x11));
    EXPECT_TRUE(all_bytes(remote.data() + 16, 48, 0x11));
    EXPECT_TRUE(all_bytes(local.data(), 16, 0x22));
    EXPECT_TRUE(all_bytes(local.data() + 32, 32, 0x22));
    EXPECT_TRUE(remote.guards_intact() && local.guards_intact());
}

TEST_F(Rc, AtomicFetchAdd) {
    make();
    Buf remote(p.b.pd, 64), local(p.a.pd, 64);
    remote.set(0);
    local.set(0);
    uint64_t model = 0xFFFFFFFFFFFFFFF0ull; // wraps on the second add
    remote.word(32) = model;
    Pair::sync_with(p.b);
    const uint64_t adds[] = {7, 0x20, 0, 0x8000000000000000ull, 1};
    uint64_t id = 0;
    for (uint64_t add : adds) {
        ASSERT_EQ(post_atomic(p.a.qp, id, IBV_WR_ATOMIC_FETCH_AND_ADD, local.sge(8, 8),
                              remote.addr(32), remote.rkey(), add),
                  0);
        expect_one(p.a.scq, {id, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, p.a.qpn(), 8});
        EXPECT_EQ(local.word(8), model);
        model += add;
        Pair::sync_with(p.b);
        EXPECT_EQ(remote.word(32), model);
        id++;
    }
    EXPECT_TRUE(all_bytes(remote.data(), 32, 0));
    EXPECT_TRUE(all_bytes(remote.data() + 40, 24, 0));
}

TEST_F(Rc, UnsignaledWorkRequestsRetireSilently) {
    PairOpts o;
    o.sq_sig_all = false;
    o.send_wr = 16;
    make(o);
    constexpr int kRounds = 10, kPerRound = 16, kLen = 64;
    Buf src(p.a.pd, kRounds * kPerRound * kLen), dst(p.b.pd, kRounds * kPerRound * kLen);
    Buf rbuf(p.b.pd, kRounds * kLen);
    src.fill(8);
    dst.set(0);
    Pair::sync_with(p.b);
    // Only the last WR of each round is signaled; its completion also means
    // the 15 before it left the (16-deep) send queue, or the next round
    // could not be posted.
    for (int r = 0; r < kRounds; r++) {
        for (int i = 0; i < kPerRound; i++) {
            uint64_t id = uint64_t(r * kPerRound + i);
            size_t off = size_t(id) * kLen;
            unsigned flags = i == kPerRound - 1 ? IBV_SEND_SIGNALED : 0;
            if (i == 7) {
                ASSERT_EQ(post_recv(p.b.qp, id, {rbuf.sge(size_t(r) * kLen, kLen)}), 0);
                ASSERT_EQ(post_send(p.a.qp, id, {src.sge(off, kLen)}, flags), 0);
            } else {
                ASSERT_EQ(post_rdma(p.a.qp, id, IBV_WR_RDMA_WRITE, {src.sge(off, kLen)},
                                    dst.addr(off), dst.rkey(), flags),
                          0);
            }
        }
        uint64_t last = uint64_t(r * kPerRound + kPerRound - 1);
        expect_one(p.a.scq, {last, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
        // Receive completions do not depend on the sender's signaling.
        expect_one(p.b.rcq,
                   {uint64_t(r * kPerRound + 7), IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), kLen});
    }
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
    Pair::sync_with(p.b);
    for (int id = 0; id < kRounds * kPerRound; id++) {
        size_t off = size_t(id) * kLen;
        if (id % kPerRound == 7) {
            EXPECT_TRUE(all_bytes(dst.data() + off, kLen, 0));
            EXPECT_TRUE(
                same_bytes(rbuf.data() + size_t(id / kPerRound) * kLen, src.data() + off, kLen));
        } else {
            EXPECT_TRUE(same_bytes(dst.data() + off, src.data() + off, kLen)) << "wr " << id;
        }
    }
}

TEST_F(Rc, ManyOutstandingWorkRequests) {
    PairOpts o;
    o.send_wr = o.recv_wr = 256;
    o.rd_atomic = 16;
    make(o);
    constexpr int kN = 256;
    constexpr size_t kSlot = 4096;
    Buf src(p.a.pd, kN * kSlot), local(p.a.pd, kN * kSlot);
    Buf dst(p.b.pd, kN * kSlot), remote(p.b.pd, kN * kSlot);
    src.fill(9);
    remote.fill(10);
    local.set(0);
    dst.set(0);
    Pair::sync_with(p.b);
    std::mt19937 rng(11);
    std::vector<size_t> len(kN);
    for (size_t &l : len)
        l = rng() % 3000;

    // 256 receives, then 256 SENDs in one chain.
    std::vector<ibv_recv_wr> rwr(kN);
    std::vector<ibv_sge> rsg(kN), ssg(kN);
    for (int i = 0; i < kN; i++) {
        rsg[size_t(i)] = dst.sge(size_t(i) * kSlot, kSlot);
        rwr[size_t(i)] = {uint64_t(1000 + i), i + 1 < kN ? &rwr[size_t(i) + 1] : nullptr,
                          &rsg[size_t(i)], 1};
    }
    ibv_recv_wr *rbad = nullptr;
    ASSERT_EQ(ibv_post_recv(p.b.qp, rwr.data(), &rbad), 0);
    std::vector<ibv_send_wr> swr(kN);
    for (int i = 0; i < kN; i++) {
        ssg[size_t(i)] = src.sge(size_t(i) * kSlot, len[size_t(i)]);
        swr[size_t(i)] = {};
        swr[size_t(i)].wr_id = uint64_t(i);
        swr[size_t(i)].next = i + 1 < kN ? &swr[size_t(i) + 1] : nullptr;
        swr[size_t(i)].sg_list = &ssg[size_t(i)];
        swr[size_t(i)].num_sge = len[size_t(i)] ? 1 : 0;
        swr[size_t(i)].opcode = IBV_WR_SEND;
        swr[size_t(i)].send_flags = IBV_SEND_SIGNALED;
    }
    ibv_send_wr *sbad = nullptr;
    ASSERT_EQ(ibv_post_send(p.a.qp, swr.data(), &sbad), 0);
    std::vector<ibv_wc> sc = poll_n(p.a.scq, kN), rc = poll_n(p.b.rcq, kN);
    ASSERT_EQ(sc.size(), size_t(kN));
    ASSERT_EQ(rc.size(), size_t(kN));
    for (int i = 0; i < kN; i++) {
        expect_wc(sc[size_t(i)], {uint64_t(i), IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        expect_wc(rc[size_t(i)], {uint64_t(1000 + i), IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(),
                                  int64_t(len[size_t(i)])});
        EXPECT_TRUE(same_bytes(dst.data() + size_t(i) * kSlot, src.data() + size_t(i) * kSlot,
                               len[size_t(i)]))
            << "send " << i;
    }

    // 256 WRITEs and READs, interleaved, in one chain: the READs hold only 16
    // credits at a time.
    dst.set(0);
    Pair::sync_with(p.b);
    for (int i = 0; i < kN; i++) {
        bool read = i % 2;
        size_t off = size_t(i) * kSlot;
        ssg[size_t(i)] = read ? local.sge(off, len[size_t(i)]) : src.sge(off, len[size_t(i)]);
        swr[size_t(i)].wr_id = uint64_t(5000 + i);
        swr[size_t(i)].opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
        swr[size_t(i)].wr.rdma.remote_addr = read ? remote.addr(off) : dst.addr(off);
        swr[size_t(i)].wr.rdma.rkey = read ? remote.rkey() : dst.rkey();
    }
    ASSERT_EQ(ibv_post_send(p.a.qp, swr.data(), &sbad), 0);
    sc = poll_n(p.a.scq, kN);
    ASSERT_EQ(sc.size(), size_t(kN));
    Pair::sync_with(p.b);
    for (int i = 0; i < kN; i++) {
        bool read = i % 2;
        size_t off = size_t(i) * kSlot, l = len[size_t(i)];
        expect_wc(sc[size_t(i)],
                  {uint64_t(5000 + i), IBV_WC_SUCCESS, read ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE,
                   p.a.qpn(), read ? int64_t(l) : -1});
        if (read)
            EXPECT_TRUE(same_bytes(local.data() + off, remote.data() + off, l)) << "read " << i;
        else
            EXPECT_TRUE(same_bytes(dst.data() + off, src.data() + off, l)) << "write " << i;
    }
}

TEST_F(Rc, FenceWaitsForPriorRead) {
    PairOpts o;
    o.rd_atomic = 4;
    make(o);
    constexpr size_t kLen = 64 * 1024;
    Buf rsrc(p.b.pd, kLen), rdst(p.b.pd, kLen), bounce(p.a.pd, kLen);
    for (int round = 0; round < 5; round++) {
        SCOPED_TRACE("round " + std::to_string(round));
        rsrc.fill(20 + uint64_t(round));
        rdst.set(0);
        bounce.set(0);
        Pair::sync_with(p.b);
        // The fenced WRITE sends what the READ brought into `bounce`; without
        // the fence it would be gathered before the READ responses arrive.
        ASSERT_EQ(
            post_rdma(p.a.qp, 1, IBV_WR_RDMA_READ, {bounce.sge(0, kLen)}, rsrc.addr(), rsrc.rkey()),
            0);
        ASSERT_EQ(post_rdma(p.a.qp, 2, IBV_WR_RDMA_WRITE, {bounce.sge(0, kLen)}, rdst.addr(),
                            rdst.rkey(), IBV_SEND_SIGNALED | IBV_SEND_FENCE),
                  0);
        expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, p.a.qpn(), int64_t(kLen)});
        expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
        Pair::sync_with(p.b);
        EXPECT_TRUE(same_bytes(rdst.data(), rsrc.data(), kLen));
    }
}

// ---------------------------------------------------------------------------
// Extended verbs

TEST_F(Rc, QpExWorkRequestBatch) {
    PairOpts o;
    o.qp_ex = true;
    o.max_inline = 64;
    make(o);
    Buf src(p.a.pd, 4096), local(p.a.pd, 4096), rmem(p.b.pd, 4096), rbuf(p.b.pd, 4096);
    src.fill(30);
    local.set(0);
    rmem.fill(31);
    rbuf.set(0);
    const uint64_t counter = 1000, swap_old = 0x55;
    rmem.word(4000) = counter;
    rmem.word(4008) = swap_old;
    Pair::sync_with(p.b);
    ASSERT_EQ(post_recv(p.b.qp, 50, {rbuf.sge(0, 1024)}), 0);
    ASSERT_EQ(post_recv(p.b.qp, 51, {rbuf.sge(1024, 1024)}), 0);
    ASSERT_EQ(post_recv(p.b.qp, 52, {}), 0);
    std::vector<uint8_t> expect_remote(rmem.data(), rmem.data() + 4096);
    char hello[] = "inline payload via ibv_wr_set_inline_data";

    ibv_qp_ex *x = p.a.qpx;
    ibv_wr_start(x);
    x->wr_flags = IBV_SEND_SIGNALED;
    x->wr_id = 1;
    ibv_wr_rdma_write(x, rmem.rkey(), rmem.addr(0));
    ibv_wr_set_sge(x, src.lkey(), src.addr(0), 1000);
    x->wr_id = 2;
    x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, hello, sizeof hello);
    x->wr_id = 3;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(x, htonl(0x5150));
    ibv_sge two[2] = {src.sge(1000, 10), src.sge(2000, 20)};
    ibv_wr_set_sge_list(x, 2, two);
    x->wr_id = 4;
    ibv_wr_rdma_read(x, rmem.rkey(), rmem.addr(2048));
    ibv_wr_set_sge(x, local.lkey(), local.addr(0), 512);
    x->wr_id = 5;
    ibv_wr_atomic_fetch_add(x, rmem.rkey(), rmem.addr(4000), 5);
    ibv_wr_set_sge(x, local.lkey(), local.addr(1024), 8);
    x->wr_id = 6;
    ibv_wr_atomic_cmp_swp(x, rmem.rkey(), rmem.addr(4008), swap_old, 0x66);
    ibv_wr_set_sge(x, local.lkey(), local.addr(1032), 8);
    x->wr_id = 7;
    ibv_wr_rdma_write_imm(x, rmem.rkey(), rmem.addr(3000), htonl(0x7777));
    ibv_wr_set_sge(x, src.lkey(), src.addr(3000), 100);
    ASSERT_EQ(ibv_wr_complete(x), 0);
    // The inline payload was copied at build time.
    std::memset(hello, 0, sizeof hello);

    std::vector<ibv_wc> sc = poll_n(p.a.scq, 7);
    ASSERT_EQ(sc.size(), 7u);
    uint32_t q = p.a.qpn();
    expect_wc(sc[0], {1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, q});
    expect_wc(sc[1], {2, IBV_WC_SUCCESS, IBV_WC_SEND, q});
    expect_wc(sc[2], {3, IBV_WC_SUCCESS, IBV_WC_SEND, q});
    expect_wc(sc[3], {4, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, q, 512});
    expect_wc(sc[4], {5, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, q, 8});
    expect_wc(sc[5], {6, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, q, 8});
    expect_wc(sc[6], {7, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, q});
    std::vector<ibv_wc> rc = poll_n(p.b.rcq, 3);
    ASSERT_EQ(rc.size(), 3u);
    uint32_t bq = p.b.qpn();
    expect_wc(rc[0], {50, IBV_WC_SUCCESS, IBV_WC_RECV, bq, int64_t(sizeof hello)});
    expect_wc(rc[1], {51, IBV_WC_SUCCESS, IBV_WC_RECV, bq, 30, IBV_WC_WITH_IMM, 0x5150});
    expect_wc(rc[2],
              {52, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, bq, 100, IBV_WC_WITH_IMM, 0x7777});

    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(rmem.data(), src.data(), 1000));
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data()),
                 "inline payload via ibv_wr_set_inline_data");
    EXPECT_TRUE(same_bytes(rbuf.data() + 1024, src.data() + 1000, 10));
    EXPECT_TRUE(same_bytes(rbuf.data() + 1034, src.data() + 2000, 20));
    EXPECT_TRUE(same_bytes(local.data(), expect_remote.data() + 2048, 512));
    EXPECT_EQ(local.word(1024), counter);
    EXPECT_EQ(rmem.word(4000), counter + 5);
    EXPECT_EQ(local.word(1032), swap_old);
    EXPECT_EQ(rmem.word(4008), 0x66u);
    EXPECT_TRUE(same_bytes(rmem.data() + 3000, src.data() + 3000, 100));
    EXPECT_TRUE(same_bytes(rmem.data() + 1000, expect_remote.data() + 1000, 2000));
}

// rdma-core defines an ibv_wr_* batch per QP (ibv_wr_post(3)): one thread
// may build batches on two QPs at once, and each posts exactly its own work.
TEST_F(Rc, QpExBatchesOpenOnTwoQpsAtOnce) {
    PairOpts o;
    o.qp_ex = true;
    make(o);
    Pair q;
    make(q, o);
    Buf src1(p.a.pd, 256), src2(q.a.pd, 256), dst1(p.b.pd, 256), dst2(q.b.pd, 256);
    src1.fill(41);
    src2.fill(42);
    dst1.set(0);
    dst2.set(0);
    ASSERT_EQ(post_recv(p.b.qp, 70, {dst1.sge(0, 256)}), 0);
    ASSERT_EQ(post_recv(q.b.qp, 71, {dst2.sge(0, 256)}), 0);

    ibv_qp_ex *x = p.a.qpx, *y = q.a.qpx;
    ibv_wr_start(x);
    ibv_wr_start(y);
    x->wr_id = 1;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(x);
    y->wr_id = 2;
    y->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(y);
    ibv_wr_set_sge(x, src1.lkey(), src1.addr(0), 100);
    ibv_wr_set_sge(y, src2.lkey(), src2.addr(0), 200);
    ASSERT_EQ(ibv_wr_complete(y), 0);
    ASSERT_EQ(ibv_wr_complete(x), 0);

    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(q.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, q.a.qpn()});
    expect_one(p.b.rcq, {70, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 100});
    expect_one(q.b.rcq, {71, IBV_WC_SUCCESS, IBV_WC_RECV, q.b.qpn(), 200});
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
    EXPECT_TRUE(drain(q.a.scq).empty());
    Pair::sync_with(p.b);
    Pair::sync_with(q.b);
    EXPECT_TRUE(same_bytes(dst1.data(), src1.data(), 100));
    EXPECT_TRUE(same_bytes(dst2.data(), src2.data(), 200));
}

TEST_F(Rc, QpExAbortAndFailedBatchPostNothing) {
    PairOpts o;
    o.qp_ex = true;
    o.max_inline = 16;
    make(o);
    Buf src(p.a.pd, 4096), rmem(p.b.pd, 4096), rbuf(p.b.pd, 256);
    src.fill(40);
    rmem.set(0);
    Pair::sync_with(p.b);
    ASSERT_EQ(post_recv(p.b.qp, 60, {rbuf.sge(0, 256)}), 0);
    ibv_qp_ex *x = p.a.qpx;

    // Aborted: discarded.
    ibv_wr_start(x);
    x->wr_flags = IBV_SEND_SIGNALED;
    x->wr_id = 1;
    ibv_wr_rdma_write(x, rmem.rkey(), rmem.addr(0));
    ibv_wr_set_sge(x, src.lkey(), src.addr(0), 100);
    x->wr_id = 2;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, src.lkey(), src.addr(0), 10);
    ibv_wr_abort(x);

    // A builder error (inline data over max_inline_data) fails the batch.
    ibv_wr_start(x);
    x->wr_id = 3;
    ibv_wr_rdma_write(x, rmem.rkey(), rmem.addr(200));
    ibv_wr_set_sge(x, src.lkey(), src.addr(200), 100);
    x->wr_id = 4;
    x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, src.data(), 64);
    EXPECT_NE(ibv_wr_complete(x), 0);

    // The QP still works, and only this batch reaches the peer.
    ibv_wr_start(x);
    x->wr_flags = IBV_SEND_SIGNALED;
    x->wr_id = 5;
    ibv_wr_rdma_write(x, rmem.rkey(), rmem.addr(400));
    ibv_wr_set_sge(x, src.lkey(), src.addr(400), 100);
    ASSERT_EQ(ibv_wr_complete(x), 0);
    expect_one(p.a.scq, {5, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
    EXPECT_TRUE(drain(p.b.rcq).empty());
    Pair::sync_with(p.b);
    EXPECT_TRUE(all_bytes(rmem.data(), 400, 0));
    EXPECT_TRUE(same_bytes(rmem.data() + 400, src.data() + 400, 100));
    EXPECT_TRUE(all_bytes(rmem.data() + 500, rmem.size() - 500, 0));
}

struct ExWc {
    uint64_t wr_id;
    ibv_wc_status status;
    ibv_wc_opcode opcode;
    uint32_t byte_len, qp_num, wc_flags;
    __be32 imm;
};

// Polls an extended CQ for n completions within the deadline.
std::vector<ExWc> poll_ex(ibv_cq_ex *cq, size_t n) {
    std::vector<ExWc> out;
    auto end = Clock::now() + kDeadline;
    ibv_poll_cq_attr attr{};
    while (out.size() < n && Clock::now() < end) {
        int rc = ibv_start_poll(cq, &attr);
        if (rc == ENOENT) {
            std::this_thread::sleep_for(50us);
            continue;
        }
        if (rc) {
            ADD_FAILURE() << "ibv_start_poll: " << rc;
            break;
        }
        do {
            ExWc w{cq->wr_id,
                   cq->status,
                   ibv_wc_read_opcode(cq),
                   ibv_wc_read_byte_len(cq),
                   ibv_wc_read_qp_num(cq),
                   ibv_wc_read_wc_flags(cq),
                   0};
            if (w.wc_flags & IBV_WC_WITH_IMM) w.imm = ibv_wc_read_imm_data(cq);
            out.push_back(w);
        } while (out.size() < n && (rc = ibv_next_poll(cq)) == 0);
        ibv_end_poll(cq);
    }
    return out;
}

TEST_F(Rc, ExtendedCq) {
    PairOpts o;
    o.cq_ex = true;
    make(o);
    Buf src(p.a.pd, 4096), dst(p.b.pd, 4096);
    src.fill(50);
    ASSERT_EQ(post_recv(p.b.qp, 10, {dst.sge(0, 2048)}), 0);
    ASSERT_EQ(post_recv(p.b.qp, 11, {dst.sge(2048, 2048)}), 0);
    ASSERT_EQ(post_send_imm(p.a.qp, 1, {src.sge(0, 100)}, 0xFEEDu), 0);
    ASSERT_EQ(post_send(p.a.qp, 2, {}), 0);
    std::vector<ExWc> sc = poll_ex(p.a.scqx, 2);
    ASSERT_EQ(sc.size(), 2u);
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(sc[size_t(i)].wr_id, uint64_t(i + 1));
        EXPECT_EQ(sc[size_t(i)].status, IBV_WC_SUCCESS);
        EXPECT_EQ(sc[size_t(i)].opcode, IBV_WC_SEND);
        EXPECT_EQ(sc[size_t(i)].qp_num, p.a.qpn());
        EXPECT_EQ(sc[size_t(i)].wc_flags, 0u);
    }
    std::vector<ExWc> rc = poll_ex(p.b.rcqx, 2);
    ASSERT_EQ(rc.size(), 2u);
    EXPECT_EQ(rc[0].wr_id, 10u);
    EXPECT_EQ(rc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc[0].opcode, IBV_WC_RECV);
    EXPECT_EQ(rc[0].byte_len, 100u);
    EXPECT_EQ(rc[0].qp_num, p.b.qpn());
    EXPECT_EQ(rc[0].wc_flags, unsigned(IBV_WC_WITH_IMM));
    EXPECT_EQ(rc[0].imm, htonl(0xFEED));
    EXPECT_EQ(rc[1].wr_id, 11u);
    EXPECT_EQ(rc[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc[1].opcode, IBV_WC_RECV);
    EXPECT_EQ(rc[1].byte_len, 0u);
    EXPECT_EQ(rc[1].wc_flags, 0u);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 100));
    // Empty CQ: ENOENT, and no end_poll is owed.
    ibv_poll_cq_attr attr{};
    EXPECT_EQ(ibv_start_poll(p.b.rcqx, &attr), ENOENT);
    EXPECT_EQ(ibv_start_poll(p.a.scqx, &attr), ENOENT);
}

TEST_F(Rc, CompletionChannelEvents) {
    PairOpts o;
    o.b_channel = true;
    make(o);
    Buf src(p.a.pd, 256), dst(p.b.pd, 1024);
    src.fill(60);
    for (uint64_t i = 0; i < 4; i++)
        ASSERT_EQ(post_recv(p.b.qp, 100 + i, {dst.sge(size_t(i) * 256, 256)}), 0);
    pollfd pfd{p.b.channel->fd, POLLIN, 0};
    ibv_cq *ev_cq = nullptr;
    void *ev_ctx = nullptr;

    ASSERT_EQ(ibv_req_notify_cq(p.b.rcq, 0), 0);
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
    ASSERT_EQ(post_send(p.a.qp, 1, {src.sge(0, 16)}), 0);
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    ASSERT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, p.b.rcq);
    EXPECT_EQ(ev_ctx, &p.b);
    ibv_ack_cq_events(ev_cq, 1);
    expect_one(p.b.rcq, {100, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 16});
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});

    // Not re-armed: no event.
    ASSERT_EQ(post_send(p.a.qp, 2, {src.sge(0, 16)}), 0);
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {101, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 16});
    EXPECT_EQ(poll(&pfd, 1, 50), 0);

    // Solicited only: an unsolicited message raises no event, a solicited one does.
    ASSERT_EQ(ibv_req_notify_cq(p.b.rcq, 1), 0);
    ASSERT_EQ(post_send(p.a.qp, 3, {src.sge(0, 16)}), 0);
    expect_one(p.a.scq, {3, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {102, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 16});
    EXPECT_EQ(poll(&pfd, 1, 50), 0);
    ASSERT_EQ(post_send(p.a.qp, 4, {src.sge(0, 16)}, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED), 0);
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    ASSERT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, p.b.rcq);
    ibv_ack_cq_events(ev_cq, 1);
    expect_one(p.b.rcq, {103, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 16});
    expect_one(p.a.scq, {4, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
}

// An event of a CQ that reports to a shared channel, when nobody takes it: a
// QP flushed into ERR completes its receive on `cq`, which was armed.
static ibv_qp *flush_into(Side &s, ibv_cq *cq, Buf &buf) {
    ibv_qp_init_attr ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap = {1, 1, 1, 1, 0};
    ibv_qp *qp = ibv_create_qp(s.pd, &ia);
    if (!qp) return nullptr;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (to_init(qp, 0) || post_recv(qp, 77, {buf.sge(0, 16)}) || ibv_req_notify_cq(cq, 0) ||
        ibv_modify_qp(qp, &a, IBV_QP_STATE)) {
        ibv_destroy_qp(qp);
        return nullptr;
    }
    return qp;
}

// Several CQs share one channel, as libfabric providers share one per
// domain.  Destroying a CQ takes its events out of the channel, as uverbs
// does: ibv_get_cq_event never returns a CQ that no longer exists, and the
// channel's descriptor stays readable only while an event remains.
TEST_F(Rc, DestroyingACqTakesItsEventsFromASharedChannel) {
    PairOpts o;
    o.b_channel = true;
    make(o);
    Buf src(p.a.pd, 256), dst(p.b.pd, 256), spare(p.b.pd, 256);
    pollfd pfd{p.b.channel->fd, POLLIN, 0};
    ibv_cq *ev_cq = nullptr;
    void *ev_ctx = nullptr;
    int flags = fcntl(p.b.channel->fd, F_GETFL);
    ASSERT_EQ(fcntl(p.b.channel->fd, F_SETFL, flags | O_NONBLOCK), 0);

    // Alone in the channel: once its CQ is gone, nothing is readable.
    ibv_cq *gone = ibv_create_cq(p.b.ctx, 16, nullptr, p.b.channel, 0);
    ASSERT_NE(gone, nullptr);
    ibv_qp *qp = flush_into(p.b, gone, spare);
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    ASSERT_EQ(ibv_destroy_cq(gone), 0);
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
    EXPECT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), -1);
    EXPECT_EQ(errno, EAGAIN);

    // Ahead of another CQ's event: the other one is what remains.
    gone = ibv_create_cq(p.b.ctx, 16, nullptr, p.b.channel, 0);
    ASSERT_NE(gone, nullptr);
    qp = flush_into(p.b, gone, spare);
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(poll(&pfd, 1, 10000), 1);
    ASSERT_EQ(post_recv(p.b.qp, 5, {dst.sge(0, 64)}), 0);
    ASSERT_EQ(ibv_req_notify_cq(p.b.rcq, 0), 0);
    ASSERT_EQ(post_send(p.a.qp, 6, {src.sge(0, 64)}), 0);
    expect_one(p.a.scq, {6, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    ASSERT_EQ(ibv_destroy_cq(gone), 0);
    ASSERT_EQ(poll(&pfd, 1, 0), 1);
    ASSERT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, p.b.rcq);
    EXPECT_EQ(ev_ctx, &p.b);
    ibv_ack_cq_events(ev_cq, 1);
    expect_one(p.b.rcq, {5, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 64});
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
    EXPECT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), -1);
}

// Two events of one CQ, both armed before either is taken, are two events.
TEST_F(Rc, ACqArmedTwiceHasTwoEventsInItsChannel) {
    PairOpts o;
    o.b_channel = true;
    make(o);
    Buf src(p.a.pd, 256), dst(p.b.pd, 256);
    pollfd pfd{p.b.channel->fd, POLLIN, 0};
    for (uint64_t i = 0; i < 2; i++) {
        ASSERT_EQ(post_recv(p.b.qp, 10 + i, {dst.sge(0, 64)}), 0);
        ASSERT_EQ(ibv_req_notify_cq(p.b.rcq, 0), 0);
        ASSERT_EQ(post_send(p.a.qp, 20 + i, {src.sge(0, 64)}), 0);
        expect_one(p.a.scq, {20 + i, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        ASSERT_EQ(poll(&pfd, 1, 10000), 1);
        expect_one(p.b.rcq, {10 + i, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 64});
    }
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(poll(&pfd, 1, 0), 1) << "event " << i;
        ibv_cq *ev_cq = nullptr;
        void *ev_ctx = nullptr;
        ASSERT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), 0);
        EXPECT_EQ(ev_cq, p.b.rcq);
        ibv_ack_cq_events(ev_cq, 1);
    }
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
}

// An application that spins on its CQ receives for itself, and the progress
// thread leaves the socket to it; when the application stops polling to wait
// on a completion channel instead, the progress thread must take over again
// or the packet would never be received.
TEST_F(Rc, ProgressThreadTakesOverWhenTheApplicationStopsPolling) {
    PairOpts o;
    o.b_channel = true;
    make(o);
    Buf src(p.a.pd, 256), dst(p.b.pd, 1024);
    src.fill(61);
    for (uint64_t i = 0; i < 3; i++)
        ASSERT_EQ(post_recv(p.b.qp, 200 + i, {dst.sge(size_t(i) * 256, 256)}), 0);
    pollfd pfd{p.b.channel->fd, POLLIN, 0};
    for (uint64_t round = 0; round < 3; round++) {
        // Long enough to count as a spinning application many times over.
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
        ibv_wc wc;
        while (std::chrono::steady_clock::now() < until)
            ASSERT_EQ(ibv_poll_cq(p.b.rcq, 1, &wc), 0);
        ASSERT_EQ(ibv_req_notify_cq(p.b.rcq, 0), 0);
        ASSERT_EQ(post_send(p.a.qp, round, {src.sge(0, 64)}), 0);
        ASSERT_EQ(poll(&pfd, 1, 10000), 1) << "round " << round;
        ibv_cq *ev_cq = nullptr;
        void *ev_ctx = nullptr;
        ASSERT_EQ(ibv_get_cq_event(p.b.channel, &ev_cq, &ev_ctx), 0);
        ibv_ack_cq_events(ev_cq, 1);
        expect_one(p.b.rcq, {200 + round, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 64});
        expect_one(p.a.scq, {round, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
        EXPECT_EQ(0, std::memcmp(dst.data() + round * 256, src.data(), 64));
    }
}

// ---------------------------------------------------------------------------
// Errors

TEST_F(Rc, WrongRkeyIsRemoteAccessErrorAndFlushesTheRest) {
    make();
    Buf src(p.a.pd, 4096), local(p.a.pd, 4096), dst(p.b.pd, 4096), rbuf(p.b.pd, 4096);
    src.fill(70);
    dst.set(0);
    Pair::sync_with(p.b);
    ASSERT_EQ(post_recv(p.b.qp, 90, {rbuf.sge(0, 4096)}), 0);
    ASSERT_EQ(post_recv(p.b.qp, 91, {rbuf.sge(0, 4096)}), 0);
    // Same slot, other random bits: a key the peer never handed out.
    ASSERT_EQ(post_rdma(p.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 100)}, dst.addr(),
                        dst.rkey() ^ 0xFF000000u),
              0);
    ASSERT_EQ(post_rdma(p.a.qp, 2, IBV_WR_RDMA_WRITE, {src.sge(0, 100)}, dst.addr(), dst.rkey()),
              0);
    ASSERT_EQ(post_send(p.a.qp, 3, {src.sge(0, 10)}), 0);
    ASSERT_EQ(post_rdma(p.a.qp, 4, IBV_WR_RDMA_READ, {local.sge(0, 64)}, dst.addr(), dst.rkey()),
              0);
    std::vector<ibv_wc> sc = poll_n(p.a.scq, 4);
    ASSERT_EQ(sc.size(), 4u);
    expect_wc(sc[0], {1, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, p.a.qpn()});
    for (int i = 1; i < 4; i++)
        expect_wc(sc[size_t(i)], {uint64_t(i + 1), IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, p.a.qpn()});
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_ERR);
    // The responder enters the error state too, flushing its receives.
    EXPECT_EQ(qp_state(p.b.qp), IBV_QPS_ERR);
    std::vector<ibv_wc> rc = poll_n(p.b.rcq, 2);
    ASSERT_EQ(rc.size(), 2u);
    expect_wc(rc[0], {90, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, p.b.qpn()});
    expect_wc(rc[1], {91, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, p.b.qpn()});
    Pair::sync_with(p.b);
    EXPECT_TRUE(all_bytes(dst.data(), dst.size(), 0));
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
}

// One fresh pair per case: each ends with both QPs in the error state.
struct RemoteErrorCase {
    const char *name;
    unsigned mr_access;   // access of B's target MR
    unsigned b_qp_access; // B's QP access flags
    ibv_wr_opcode op;     // WRITE, READ or an atomic
    int64_t offset;       // from the MR start
    uint32_t len;
};

TEST_F(Rc, RemoteAccessViolations) {
    const unsigned kNoRead =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    const RemoteErrorCase cases[] = {
        {"write past the end", kAllAccess, kAllAccess, IBV_WR_RDMA_WRITE, 4096 - 8, 16},
        {"write of the last byte plus one", kAllAccess, kAllAccess, IBV_WR_RDMA_WRITE, 4096, 1},
        {"write before the start", kAllAccess, kAllAccess, IBV_WR_RDMA_WRITE, -8, 16},
        {"multi-packet write past the end", kAllAccess, kAllAccess, IBV_WR_RDMA_WRITE, 0, 5000},
        {"read past the end", kAllAccess, kAllAccess, IBV_WR_RDMA_READ, 100, 4000},
        {"read of an MR without REMOTE_READ", kNoRead, kAllAccess, IBV_WR_RDMA_READ, 0, 64},
        {"atomic on an MR without REMOTE_ATOMIC",
         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, kAllAccess,
         IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8},
        {"write to a QP without REMOTE_WRITE", kAllAccess,
         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
         IBV_WR_RDMA_WRITE, 0, 64},
        {"read from a QP without REMOTE_READ", kAllAccess, kNoRead, IBV_WR_RDMA_READ, 0, 64},
        {"atomic to a QP without REMOTE_ATOMIC", kAllAccess,
         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
         IBV_WR_ATOMIC_CMP_AND_SWP, 0, 8},
    };
    for (const RemoteErrorCase &c : cases) {
        SCOPED_TRACE(c.name);
        Pair q;
        PairOpts o;
        o.b_access = c.b_qp_access;
        ASSERT_NO_FATAL_FAILURE(make(q, o));
        Buf src(q.a.pd, 8192), dst(q.b.pd, 4096, c.mr_access);
        ASSERT_TRUE(dst.ok());
        src.fill(71);
        dst.set(0x3C);
        Pair::sync_with(q.b);
        uint64_t raddr = uint64_t(int64_t(dst.addr()) + c.offset);
        if (c.op == IBV_WR_RDMA_WRITE || c.op == IBV_WR_RDMA_READ)
            ASSERT_EQ(post_rdma(q.a.qp, 1, c.op, {src.sge(0, c.len)}, raddr, dst.rkey()), 0);
        else
            ASSERT_EQ(post_atomic(q.a.qp, 1, c.op, src.sge(0, 8), raddr, dst.rkey(), 0, 1), 0);
        ASSERT_EQ(post_rdma(q.a.qp, 2, IBV_WR_RDMA_WRITE, {src.sge(0, 8)}, dst.addr(), dst.rkey()),
                  0);
        std::vector<ibv_wc> sc = poll_n(q.a.scq, 2);
        ASSERT_EQ(sc.size(), 2u);
        expect_wc(sc[0], {1, IBV_WC_REM_ACCESS_ERR, IBV_WC_SEND, q.a.qpn()});
        expect_wc(sc[1], {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, q.a.qpn()});
        EXPECT_EQ(qp_state(q.a.qp), IBV_QPS_ERR);
        EXPECT_EQ(qp_state(q.b.qp), IBV_QPS_ERR);
        Pair::sync_with(q.b);
        EXPECT_TRUE(all_bytes(dst.data(), dst.size(), 0x3C));
        EXPECT_TRUE(dst.guards_intact());
    }
}

TEST_F(Rc, SendLargerThanReceiveBuffer) {
    struct Case {
        ibv_mtu mtu;
        uint32_t recv_len, send_len;
    } cases[] = {{IBV_MTU_1024, 100, 200}, {IBV_MTU_256, 600, 1300}, {IBV_MTU_1024, 0, 1}};
    for (const Case &c : cases) {
        SCOPED_TRACE("receive " + std::to_string(c.recv_len) + ", send " +
                     std::to_string(c.send_len));
        Pair q;
        PairOpts o;
        o.mtu = c.mtu;
        ASSERT_NO_FATAL_FAILURE(make(q, o));
        Buf src(q.a.pd, 4096), dst(q.b.pd, 4096);
        src.fill(72);
        dst.set(0);
        ASSERT_EQ(post_recv(q.b.qp, 40, one(dst, 0, c.recv_len)), 0);
        ASSERT_EQ(post_recv(q.b.qp, 41, {dst.sge(2048, 2048)}), 0);
        ASSERT_EQ(post_send(q.a.qp, 1, {src.sge(0, c.send_len)}), 0);
        ASSERT_EQ(post_send(q.a.qp, 2, {src.sge(0, 10)}), 0);
        std::vector<ibv_wc> sc = poll_n(q.a.scq, 2);
        ASSERT_EQ(sc.size(), 2u);
        expect_wc(sc[0], {1, IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND, q.a.qpn()});
        expect_wc(sc[1], {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, q.a.qpn()});
        std::vector<ibv_wc> rc = poll_n(q.b.rcq, 2);
        ASSERT_EQ(rc.size(), 2u);
        expect_wc(rc[0], {40, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, q.b.qpn()});
        expect_wc(rc[1], {41, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, q.b.qpn()});
        EXPECT_EQ(qp_state(q.a.qp), IBV_QPS_ERR);
        EXPECT_EQ(qp_state(q.b.qp), IBV_QPS_ERR);
        EXPECT_TRUE(dst.guards_intact());
        EXPECT_TRUE(all_bytes(dst.data() + c.recv_len, 2048 - c.recv_len, 0));
    }
}

TEST_F(Rc, RnrRetryZeroFailsWithoutReceive) {
    for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_RDMA_WRITE_WITH_IMM}) {
        SCOPED_TRACE(op == IBV_WR_SEND ? "SEND" : "WRITE_WITH_IMM");
        Pair q;
        PairOpts o;
        o.rnr_retry = 0;
        ASSERT_NO_FATAL_FAILURE(make(q, o));
        Buf src(q.a.pd, 256), dst(q.b.pd, 256);
        src.fill(73);
        ASSERT_EQ(post_rdma(q.a.qp, 1, op, {src.sge(0, 64)}, dst.addr(), dst.rkey()), 0);
        ASSERT_EQ(post_send(q.a.qp, 2, {src.sge(0, 8)}), 0);
        std::vector<ibv_wc> sc = poll_n(q.a.scq, 2);
        ASSERT_EQ(sc.size(), 2u);
        expect_wc(sc[0], {1, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND, q.a.qpn()});
        expect_wc(sc[1], {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, q.a.qpn()});
        EXPECT_EQ(qp_state(q.a.qp), IBV_QPS_ERR);
        // Receiver not ready is no error for the responder.
        EXPECT_EQ(qp_state(q.b.qp), IBV_QPS_RTS);
    }
}

TEST_F(Rc, RnrRetriesUntilReceiveIsPosted) {
    PairOpts o;
    o.rnr_retry = 7;      // infinite
    o.min_rnr_timer = 10; // 0.96 ms
    make(o);
    Buf src(p.a.pd, 8192), dst(p.b.pd, 8192);
    src.fill(74);
    dst.set(0);
    ASSERT_EQ(post_send(p.a.qp, 1, {src.sge(0, 5000)}), 0);
    ASSERT_EQ(post_send_imm(p.a.qp, 2, {src.sge(5000, 10)}, 99), 0);
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(drain(p.a.scq).empty());
    ASSERT_EQ(post_recv(p.b.qp, 20, {dst.sge(0, 6000)}), 0);
    ASSERT_EQ(post_recv(p.b.qp, 21, {dst.sge(6000, 100)}), 0);
    expect_one(p.a.scq, {1, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.a.scq, {2, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {20, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 5000});
    expect_one(p.b.rcq, {21, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 10, IBV_WC_WITH_IMM, 99});
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), 5000));
    EXPECT_TRUE(same_bytes(dst.data() + 6000, src.data() + 5000, 10));
    EXPECT_TRUE(all_bytes(dst.data() + 5000, 1000, 0));
}

TEST_F(Rc, UnreachablePeerExhaustsRetries) {
    enum How { kDestroyed, kError, kReset };
    for (How how : {kDestroyed, kError, kReset}) {
        SCOPED_TRACE(how == kDestroyed ? "peer QP destroyed"
                     : how == kError   ? "peer QP in ERR"
                                       : "peer QP in RESET");
        Pair q;
        PairOpts o;
        o.timeout = 8; // 1 ms
        o.retry_cnt = 2;
        ASSERT_NO_FATAL_FAILURE(make(q, o));
        Buf src(q.a.pd, 4096), dst(q.b.pd, 4096);
        if (how == kDestroyed)
            ASSERT_NO_FATAL_FAILURE(q.destroy_b_qp());
        else
            ASSERT_EQ(to_state(q.b.qp, how == kError ? IBV_QPS_ERR : IBV_QPS_RESET), 0);
        auto start = Clock::now();
        ASSERT_EQ(
            post_rdma(q.a.qp, 1, IBV_WR_RDMA_WRITE, {src.sge(0, 3000)}, dst.addr(), dst.rkey()), 0);
        ASSERT_EQ(post_send(q.a.qp, 2, {src.sge(0, 10)}), 0);
        std::vector<ibv_wc> sc = poll_n(q.a.scq, 2, 5s);
        auto took = Clock::now() - start;
        ASSERT_EQ(sc.size(), 2u);
        expect_wc(sc[0], {1, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND, q.a.qpn()});
        expect_wc(sc[1], {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, q.a.qpn()});
        EXPECT_EQ(qp_state(q.a.qp), IBV_QPS_ERR);
        // Three transmissions 1 ms apart, plus timer granularity.
        EXPECT_LT(took, 1s);
        EXPECT_GE(took, 2ms);
    }
}

TEST_F(Rc, LocalProtectionErrors) {
    struct Case {
        const char *name;
        bool bad_key, out_of_range, read_into_readonly;
    } cases[] = {{"unregistered lkey", true, false, false},
                 {"range beyond the MR", false, true, false},
                 {"READ into an MR without LOCAL_WRITE", false, false, true}};
    for (const Case &c : cases) {
        SCOPED_TRACE(c.name);
        Pair q;
        ASSERT_NO_FATAL_FAILURE(make(q, PairOpts{}));
        Buf src(q.a.pd, 4096), ro(q.a.pd, 4096, IBV_ACCESS_REMOTE_READ), dst(q.b.pd, 4096);
        ASSERT_TRUE(ro.ok());
        dst.set(0);
        ro.set(0x77);
        Pair::sync_with(q.b);
        ibv_sge sge = src.sge(0, 100);
        if (c.bad_key) sge.lkey ^= 0xFF000000u;
        if (c.out_of_range) sge.length = 4097;
        if (c.read_into_readonly)
            ASSERT_EQ(
                post_rdma(q.a.qp, 1, IBV_WR_RDMA_READ, {ro.sge(0, 64)}, dst.addr(), dst.rkey()), 0);
        else
            ASSERT_EQ(post_rdma(q.a.qp, 1, IBV_WR_RDMA_WRITE, {sge}, dst.addr(), dst.rkey()), 0);
        ASSERT_EQ(post_send(q.a.qp, 2, {src.sge(0, 10)}), 0);
        std::vector<ibv_wc> sc = poll_n(q.a.scq, 2);
        ASSERT_EQ(sc.size(), 2u);
        expect_wc(sc[0], {1, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND, q.a.qpn()});
        expect_wc(sc[1], {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, q.a.qpn()});
        EXPECT_EQ(qp_state(q.a.qp), IBV_QPS_ERR);
        Pair::sync_with(q.b);
        EXPECT_TRUE(all_bytes(dst.data(), dst.size(), 0));
        EXPECT_TRUE(all_bytes(ro.data(), ro.size(), 0x77));
    }
}

TEST_F(Rc, PostingBeforeRtsIsRefused) {
    PairOpts o;
    o.connect = false;
    make(o);
    Buf src(p.a.pd, 256);
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_RESET);
    EXPECT_EQ(post_send(p.a.qp, 1, {src.sge(0, 8)}), EINVAL);
    EXPECT_EQ(post_recv(p.a.qp, 1, {src.sge(0, 8)}), EINVAL);
    ASSERT_EQ(to_init(p.a.qp, kAllAccess), 0);
    ASSERT_EQ(to_init(p.b.qp, kAllAccess), 0);
    EXPECT_EQ(post_send(p.a.qp, 2, {src.sge(0, 8)}), EINVAL);
    // Receives may be posted from INIT on.
    EXPECT_EQ(post_recv(p.a.qp, 3, {src.sge(0, 8)}), 0);
    ASSERT_EQ(to_rtr(p.a.qp, p.b.gid, p.b.qpn(), 0, IBV_MTU_1024, 1, 1), 0);
    EXPECT_EQ(post_send(p.a.qp, 4, {src.sge(0, 8)}), EINVAL);
    EXPECT_TRUE(drain(p.a.scq, 20ms).empty());
    EXPECT_TRUE(drain(p.a.rcq).empty());
}

TEST_F(Rc, PostingInErrorFlushes) {
    make();
    Buf src(p.a.pd, 256), dst(p.a.pd, 256);
    ASSERT_EQ(post_recv(p.a.qp, 10, {dst.sge(0, 64)}), 0);
    ASSERT_EQ(to_state(p.a.qp, IBV_QPS_ERR), 0);
    expect_one(p.a.rcq, {10, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, p.a.qpn()});
    EXPECT_EQ(post_send(p.a.qp, 1, {src.sge(0, 8)}), 0);
    EXPECT_EQ(post_send(p.a.qp, 2, {src.sge(0, 8)}, 0), 0); // unsignaled, still reported
    EXPECT_EQ(post_recv(p.a.qp, 11, {dst.sge(0, 64)}), 0);
    expect_one(p.a.scq, {1, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.a.scq, {2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.a.rcq, {11, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, p.a.qpn()});
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_ERR);
    // RESET then the full bring-up again makes the QP usable.
    ASSERT_EQ(to_state(p.a.qp, IBV_QPS_RESET), 0);
    ASSERT_EQ(to_state(p.b.qp, IBV_QPS_RESET), 0);
    ASSERT_EQ(to_init(p.a.qp, kAllAccess), 0);
    ASSERT_EQ(to_init(p.b.qp, kAllAccess), 0);
    ASSERT_EQ(to_rtr(p.a.qp, p.b.gid, p.b.qpn(), 500, IBV_MTU_1024, 1, 1), 0);
    ASSERT_EQ(to_rtr(p.b.qp, p.a.gid, p.a.qpn(), 100, IBV_MTU_1024, 1, 1), 0);
    ASSERT_EQ(to_rts(p.a.qp, 100, 14, 7, 7, 1), 0);
    ASSERT_EQ(to_rts(p.b.qp, 500, 14, 7, 7, 1), 0);
    Buf bdst(p.b.pd, 256);
    ASSERT_EQ(post_recv(p.b.qp, 12, {bdst.sge(0, 64)}), 0);
    src.fill(80);
    ASSERT_EQ(post_send(p.a.qp, 3, {src.sge(0, 64)}), 0);
    expect_one(p.a.scq, {3, IBV_WC_SUCCESS, IBV_WC_SEND, p.a.qpn()});
    expect_one(p.b.rcq, {12, IBV_WC_SUCCESS, IBV_WC_RECV, p.b.qpn(), 64});
    EXPECT_TRUE(same_bytes(bdst.data(), src.data(), 64));
}

TEST_F(Rc, InvalidStateTransitions) {
    PairOpts o;
    o.connect = false;
    make(o);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 1;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    const int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    EXPECT_EQ(ibv_modify_qp(p.a.qp, &a, rts_mask), EINVAL); // RESET -> RTS
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_RESET);
    EXPECT_EQ(to_rtr(p.a.qp, p.b.gid, p.b.qpn(), 0, IBV_MTU_1024, 1, 1), EINVAL); // RESET -> RTR
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_RESET);
    ASSERT_EQ(to_init(p.a.qp, kAllAccess), 0);
    EXPECT_EQ(ibv_modify_qp(p.a.qp, &a, rts_mask), EINVAL); // INIT -> RTS
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_INIT);
    // INIT -> RTR without the required address vector.
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = p.b.qpn();
    r.max_dest_rd_atomic = 1;
    r.min_rnr_timer = 1;
    EXPECT_EQ(ibv_modify_qp(p.a.qp, &r,
                            IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              EINVAL);
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_INIT);
    ASSERT_EQ(to_rtr(p.a.qp, p.b.gid, p.b.qpn(), 0, IBV_MTU_1024, 1, 1), 0);
    EXPECT_EQ(to_init(p.a.qp, kAllAccess), EINVAL); // RTR -> INIT
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_RTR);
    ASSERT_EQ(ibv_modify_qp(p.a.qp, &a, rts_mask), 0);
    EXPECT_EQ(qp_state(p.a.qp), IBV_QPS_RTS);
}

TEST_F(Rc, RegisterRemoteWriteRequiresLocalWrite) {
    make();
    std::vector<uint8_t> mem(4096);
    for (int access : {int(IBV_ACCESS_REMOTE_WRITE), int(IBV_ACCESS_REMOTE_ATOMIC),
                       int(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)}) {
        errno = 0;
        ibv_mr *mr = ibv_reg_mr(p.a.pd, mem.data(), mem.size(), access);
        EXPECT_EQ(mr, nullptr) << "access " << access;
        EXPECT_EQ(errno, EINVAL);
        if (mr) ibv_dereg_mr(mr);
    }
    const int read_only = IBV_ACCESS_REMOTE_READ;
    ibv_mr *mr = ibv_reg_mr(p.a.pd, mem.data(), mem.size(), read_only);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(Rc, QueueOverflowIsEnomem) {
    PairOpts o;
    o.send_wr = 8;
    o.recv_wr = 4;
    make(o);
    Buf src(p.a.pd, 4096), dst(p.b.pd, 4096), rbuf(p.b.pd, 64);
    src.fill(90);
    dst.set(0);
    Pair::sync_with(p.b);
    // Nine WRITEs in one chain into an 8-deep send queue: the ninth is
    // refused, the eight before it still run.
    constexpr int kN = 9;
    std::vector<ibv_sge> sg(kN);
    std::vector<ibv_send_wr> wr(kN);
    for (int i = 0; i < kN; i++) {
        sg[size_t(i)] = src.sge(size_t(i) * 100, 100);
        wr[size_t(i)] = {};
        wr[size_t(i)].wr_id = uint64_t(i);
        wr[size_t(i)].next = i + 1 < kN ? &wr[size_t(i) + 1] : nullptr;
        wr[size_t(i)].sg_list = &sg[size_t(i)];
        wr[size_t(i)].num_sge = 1;
        wr[size_t(i)].opcode = IBV_WR_RDMA_WRITE;
        wr[size_t(i)].send_flags = IBV_SEND_SIGNALED;
        wr[size_t(i)].wr.rdma.remote_addr = dst.addr(size_t(i) * 100);
        wr[size_t(i)].wr.rdma.rkey = dst.rkey();
    }
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(ibv_post_send(p.a.qp, wr.data(), &bad), ENOMEM);
    EXPECT_EQ(bad, &wr[kN - 1]);
    std::vector<ibv_wc> sc = poll_n(p.a.scq, kN - 1);
    ASSERT_EQ(sc.size(), size_t(kN - 1));
    for (int i = 0; i < kN - 1; i++)
        expect_wc(sc[size_t(i)], {uint64_t(i), IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), (kN - 1) * 100));
    EXPECT_TRUE(all_bytes(dst.data() + (kN - 1) * 100, 100, 0));

    // The receive queue: four fit, the fifth does not.
    for (uint64_t i = 0; i < 4; i++)
        EXPECT_EQ(post_recv(p.b.qp, i, {rbuf.sge(0, 64)}), 0);
    EXPECT_EQ(post_recv(p.b.qp, 4, {rbuf.sge(0, 64)}), ENOMEM);

    // Post-time validation: too many SGEs for the QP.
    std::vector<ibv_sge> many(o.send_sge + 1, src.sge(0, 1));
    ibv_send_wr w = send_wr(50, IBV_WR_SEND, many);
    EXPECT_EQ(post(p.a.qp, w), EINVAL);
}

} // namespace
