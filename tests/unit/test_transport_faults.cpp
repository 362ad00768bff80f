// SPDX-License-Identifier: MIT
//
// The RC transport under the engine's own fault injector: each device's NIC
// drops, duplicates or reorders the datagrams it receives (SROCE_FAULT), and
// thousands of mixed WRITE/READ/SEND/ATOMIC operations of random sizes must
// still all complete successfully with byte-exact data.  SROCE_FAULT is read
// when a device's NIC is created, so each case opens (and closes) its own
// contexts on 127.0.1.3 and 127.0.1.4, addresses no other test uses.
#include "rc_pair.hpp"

#include <random>

using namespace rctest;

namespace {

ibv_device *g_dev[2];

const std::string &devices() {
    static const std::string err = find_devices("rcf0", "127.0.1.3", "rcf1", "127.0.1.4", g_dev);
    return err;
}

struct FaultCase {
    const char *name;
    const char *spec; // SROCE_FAULT without the seed
    uint64_t seed;    // of the injector and of the workload
    // Both QPs agree on selective repeat (wire-protocol.md §5.6.1) rather than
    // IBTA's go-back-N.
    bool selective = false;
};

// SROCE_TEST_SEED=N shifts every seed, for soak runs over many schedules.
uint64_t seed_offset() {
    const char *s = getenv("SROCE_TEST_SEED");
    return s ? std::strtoull(s, nullptr, 0) : 0;
}

void PrintTo(const FaultCase &c, std::ostream *os) {
    *os << c.name << " (" << c.spec << ")";
}

class Faults : public ::testing::TestWithParam<FaultCase> {};

// Closes a context when the case ends, after the pair using it is gone.
struct ContextCloser {
    ibv_context *ctx;
    ~ContextCloser() {
        if (ctx) {
            EXPECT_EQ(ibv_close_device(ctx), 0);
        }
    }
};

// Opens device i with SROCE_FAULT set to `spec` ("" for none): a NIC reads
// it when it is created, i.e. on the first open of its device.
ibv_context *open_with_faults(int i, const std::string &spec) {
    setenv("SROCE_FAULT", spec.c_str(), 1);
    ibv_context *ctx = open_device(g_dev[i]);
    unsetenv("SROCE_FAULT");
    return ctx;
}

// Both QPs of a pair agree on selective repeat (wire-protocol.md §5.6.1)
// rather than IBTA's go-back-N.
void agree_selective_repeat(Pair &p) {
    ASSERT_EQ(ibv_qp_set_commit_peer(p.a.qp, IBV_COMMIT_CAP_SELECTIVE_REPEAT), 0);
    ASSERT_EQ(ibv_qp_set_commit_peer(p.b.qp, IBV_COMMIT_CAP_SELECTIVE_REPEAT), 0);
}

enum Kind { kWrite, kRead, kSend, kFetchAdd, kCmpSwap };

struct Op {
    Kind kind;
    int slot;
    size_t len;
    size_t roff;     // READ: where in the peer's read-only buffer
    uint64_t expect; // atomics: the value the responder must return
};

constexpr int kOps = 3000;
constexpr int kSlots = 32;             // operations in flight
constexpr size_t kSlotLen = 32 * 1024; // largest operation
constexpr size_t kTail = 16;           // bytes past each operation that must stay zero

// Every operation owns a slot (a disjoint range in each buffer) until it
// completes, so its data can be checked exactly then.  READs read anywhere in
// a buffer filled once: a duplicate READ request may be served again after
// the READ completed, so its source is never rewritten.  Atomics go to two
// words of their own; the QP executes requests in order, so the value each
// one returns is known when it is posted.
class Workload {
  public:
    Workload(Pair &p, uint64_t seed)
        : p_(p), rng_(seed), a_src_(p.a.pd, kSlots * kSlotLen), a_dst_(p.a.pd, kSlots * kSlotLen),
          b_wmem_(p.b.pd, kSlots * kSlotLen), b_rmem_(p.b.pd, kSlots * kSlotLen),
          b_recv_(p.b.pd, kSlots * kSlotLen), b_atom_(p.b.pd, 64) {}

    void run() {
        ASSERT_TRUE(a_src_.ok() && a_dst_.ok() && b_wmem_.ok() && b_rmem_.ok() && b_recv_.ok() &&
                    b_atom_.ok());
        b_rmem_.fill(rng_());
        b_atom_.set(0);
        b_atom_.word(0) = fa_model_ = rng_();
        b_atom_.word(8) = cs_model_ = rng_();
        Pair::sync_with(p_.b);
        for (int s = kSlots - 1; s >= 0; s--)
            free_.push_back(s);
        ops_.reserve(kOps);
        while (completed_ < kOps) {
            while (!free_.empty() && int(ops_.size()) < kOps)
                ASSERT_NO_FATAL_FAILURE(issue());
            std::vector<ibv_wc> wcs = poll_n(p_.a.scq, 1);
            ASSERT_EQ(wcs.size(), 1u) << "no completion after " << completed_ << " of " << kOps
                                      << "; in flight: " << in_flight();
            ASSERT_NO_FATAL_FAILURE(complete(wcs[0]));
        }
        EXPECT_TRUE(drain(p_.a.scq, 20ms).empty());
        EXPECT_TRUE(drain(p_.b.rcq).empty());
        Pair::sync_with(p_.b);
        EXPECT_EQ(b_atom_.word(0), fa_model_);
        EXPECT_EQ(b_atom_.word(8), cs_model_);
        EXPECT_TRUE(all_bytes(b_atom_.data() + 16, 48, 0));
        EXPECT_TRUE(a_src_.guards_intact() && a_dst_.guards_intact() && b_wmem_.guards_intact() &&
                    b_rmem_.guards_intact() && b_recv_.guards_intact() && b_atom_.guards_intact());
    }

  private:
    std::string in_flight() const {
        static const char *const names[] = {"WRITE", "READ", "SEND", "FETCH_ADD", "CMP_SWAP"};
        std::string out;
        for (size_t i = size_t(completed_); i < ops_.size(); i++)
            out += std::string(names[ops_[i].kind]) + "(" + std::to_string(ops_[i].len) + ") ";
        return out;
    }

    size_t random_len() {
        unsigned r = rng_() % 100;
        if (r < 50) return rng_() % 257;
        if (r < 85) return rng_() % 4097;
        return rng_() % kSlotLen + 1;
    }

    static std::vector<ibv_sge> range(const Buf &b, size_t off, size_t len) {
        if (!len) return {};
        return {b.sge(off, len)};
    }

    void issue() {
        const uint64_t id = ops_.size();
        Op op{};
        unsigned r = rng_() % 100;
        op.kind = r < 30 ? kWrite : r < 55 ? kRead : r < 80 ? kSend : r < 90 ? kFetchAdd : kCmpSwap;
        op.slot = free_.back();
        free_.pop_back();
        op.len = (op.kind == kFetchAdd || op.kind == kCmpSwap) ? 8 : random_len();
        const size_t off = size_t(op.slot) * kSlotLen;
        const size_t clear = std::min(op.len + kTail, kSlotLen);
        ibv_qp *qp = p_.a.qp;
        switch (op.kind) {
        case kWrite:
            fill_pattern(a_src_.data() + off, op.len, id);
            std::memset(b_wmem_.data() + off, 0, clear);
            Pair::sync_with(p_.b);
            ASSERT_EQ(post_rdma(qp, id, IBV_WR_RDMA_WRITE, range(a_src_, off, op.len),
                                b_wmem_.addr(off), b_wmem_.rkey()),
                      0);
            break;
        case kRead:
            op.roff = rng_() % (b_rmem_.size() - op.len + 1);
            std::memset(a_dst_.data() + off, 0, clear);
            ASSERT_EQ(post_rdma(qp, id, IBV_WR_RDMA_READ, range(a_dst_, off, op.len),
                                b_rmem_.addr(op.roff), b_rmem_.rkey()),
                      0);
            break;
        case kSend:
            fill_pattern(a_src_.data() + off, op.len, id);
            std::memset(b_recv_.data() + off, 0, clear);
            ASSERT_EQ(post_recv(p_.b.qp, id, {b_recv_.sge(off, kSlotLen)}), 0);
            ASSERT_EQ(post_send(qp, id, range(a_src_, off, op.len)), 0);
            break;
        case kFetchAdd: {
            uint64_t add = rng_();
            op.expect = fa_model_;
            fa_model_ += add;
            a_dst_.word(off) = ~op.expect;
            ASSERT_EQ(post_atomic(qp, id, IBV_WR_ATOMIC_FETCH_AND_ADD, a_dst_.sge(off, 8),
                                  b_atom_.addr(0), b_atom_.rkey(), add),
                      0);
            break;
        }
        case kCmpSwap: {
            bool match = rng_() % 10 < 7;
            uint64_t compare = match ? cs_model_ : cs_model_ ^ 1, swap = rng_();
            op.expect = cs_model_;
            if (match) cs_model_ = swap;
            a_dst_.word(off) = ~op.expect;
            ASSERT_EQ(post_atomic(qp, id, IBV_WR_ATOMIC_CMP_AND_SWP, a_dst_.sge(off, 8),
                                  b_atom_.addr(8), b_atom_.rkey(), compare, swap),
                      0);
            break;
        }
        }
        ops_.push_back(op);
    }

    void complete(const ibv_wc &wc) {
        // A send queue completes in order.
        ASSERT_EQ(wc.wr_id, uint64_t(completed_));
        const Op &op = ops_[size_t(completed_)];
        const size_t off = size_t(op.slot) * kSlotLen;
        const size_t tail = std::min(op.len + kTail, kSlotLen) - op.len;
        SCOPED_TRACE("operation " + std::to_string(completed_) + " kind " +
                     std::to_string(op.kind) + " length " + std::to_string(op.len));
        const uint32_t q = p_.a.qpn();
        switch (op.kind) {
        case kWrite:
            expect_wc(wc, {wc.wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, q});
            Pair::sync_with(p_.b);
            EXPECT_TRUE(same_bytes(b_wmem_.data() + off, a_src_.data() + off, op.len));
            EXPECT_TRUE(all_bytes(b_wmem_.data() + off + op.len, tail, 0));
            break;
        case kRead:
            expect_wc(wc, {wc.wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, q, int64_t(op.len)});
            EXPECT_TRUE(same_bytes(a_dst_.data() + off, b_rmem_.data() + op.roff, op.len));
            EXPECT_TRUE(all_bytes(a_dst_.data() + off + op.len, tail, 0));
            break;
        case kSend: {
            expect_wc(wc, {wc.wr_id, IBV_WC_SUCCESS, IBV_WC_SEND, q});
            // The receive completed before the ACK that completed the send left.
            std::vector<ibv_wc> rc = poll_n(p_.b.rcq, 1);
            ASSERT_EQ(rc.size(), 1u);
            expect_wc(rc[0], {wc.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, p_.b.qpn(), int64_t(op.len)});
            EXPECT_TRUE(same_bytes(b_recv_.data() + off, a_src_.data() + off, op.len));
            EXPECT_TRUE(all_bytes(b_recv_.data() + off + op.len, tail, 0));
            break;
        }
        case kFetchAdd:
        case kCmpSwap:
            expect_wc(wc, {wc.wr_id, IBV_WC_SUCCESS,
                           op.kind == kFetchAdd ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP, q, 8});
            EXPECT_EQ(a_dst_.word(off), op.expect);
            break;
        }
        ASSERT_FALSE(::testing::Test::HasFailure()) << "stopping at the first bad operation";
        free_.push_back(op.slot);
        completed_++;
    }

    Pair &p_;
    std::mt19937_64 rng_;
    Buf a_src_, a_dst_, b_wmem_, b_rmem_, b_recv_, b_atom_;
    std::vector<Op> ops_;
    std::vector<int> free_;
    int completed_ = 0;
    uint64_t fa_model_ = 0, cs_model_ = 0;
};

TEST_P(Faults, MixedTrafficCompletesExactly) {
    ASSERT_EQ(devices(), "");
    const FaultCase &fc = GetParam();
    // The previous case closed both devices, so these opens create NICs.
    const uint64_t seed = fc.seed + seed_offset();
    std::string spec = fc.spec;
    if (!spec.empty()) spec += ",seed=" + std::to_string(seed);
    ContextCloser ca{open_with_faults(0, spec)}, cb{open_with_faults(1, spec)};
    ASSERT_NE(ca.ctx, nullptr) << std::strerror(errno);
    ASSERT_NE(cb.ctx, nullptr) << std::strerror(errno);

    Pair p;
    PairOpts o;
    o.mtu = IBV_MTU_1024;
    o.send_wr = o.recv_wr = 2 * kSlots;
    o.send_sge = o.recv_sge = 1;
    o.rd_atomic = 8;
    // 67 ms: short enough to recover a lost tail packet quickly, long enough
    // that a peer's progress thread starved by a loaded machine does not
    // burn all retries on spurious timeouts.
    o.timeout = 14;
    o.retry_cnt = 7;
    o.rnr_retry = 7;
    ASSERT_NO_FATAL_FAILURE(p.setup(ca.ctx, cb.ctx, o));
    if (fc.selective) {
        ASSERT_NO_FATAL_FAILURE(agree_selective_repeat(p));
    }
    Workload w(p, seed);
    w.run();
}

// Selective repeat when the SACKs naming the gaps are lost: the responder
// loses packets 3 and 10 of one 64-packet WRITE, the requester the first two
// datagrams it receives (the SACKs the burst caused), so it knows of neither
// gap until its recovery timer resends the oldest packet.  Filling that gap
// reveals the second: the fill must be acknowledged (and a resend asks for
// an acknowledgement), or the requester keeps resending a packet already
// received and only the retransmit timer - with no retry left, an error -
// would move it on.
TEST(SelectiveRepeat, AcknowledgesEveryFilledGap) {
    ASSERT_EQ(devices(), "");
    ContextCloser ca{open_with_faults(0, "drop_at=1,drop_at=2")};
    ContextCloser cb{open_with_faults(1, "drop_at=3,drop_at=10")};
    ASSERT_NE(ca.ctx, nullptr) << std::strerror(errno);
    ASSERT_NE(cb.ctx, nullptr) << std::strerror(errno);

    Pair p;
    PairOpts o;
    o.mtu = IBV_MTU_1024;
    o.timeout = 18; // 1.07 s: far beyond the recovery timer's few milliseconds
    o.retry_cnt = 0;
    ASSERT_NO_FATAL_FAILURE(p.setup(ca.ctx, cb.ctx, o));
    ASSERT_NO_FATAL_FAILURE(agree_selective_repeat(p));
    constexpr size_t kLen = 64 * 1024;
    Buf src(p.a.pd, kLen), dst(p.b.pd, kLen);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.fill(41);
    dst.set(0);
    ASSERT_EQ(post_rdma(p.a.qp, 7, IBV_WR_RDMA_WRITE, {src.sge(0, kLen)}, dst.addr(), dst.rkey()),
              0);
    expect_one(p.a.scq, {7, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, p.a.qpn()});
    Pair::sync_with(p.b);
    EXPECT_TRUE(same_bytes(dst.data(), src.data(), kLen));
    EXPECT_TRUE(dst.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(
    Injector, Faults,
    ::testing::Values(FaultCase{"none", "", 1}, FaultCase{"drop", "drop=0.05", 2},
                      FaultCase{"dup", "dup=0.05", 3}, FaultCase{"reorder", "reorder=0.05", 4},
                      FaultCase{"all", "drop=0.05,dup=0.05,reorder=0.05", 5},
                      FaultCase{"drop_selective", "drop=0.05", 6, true},
                      FaultCase{"all_selective", "drop=0.05,dup=0.05,reorder=0.05", 7, true},
                      FaultCase{"drop30_selective", "drop=0.3", 8, true}),
    [](const ::testing::TestParamInfo<FaultCase> &i) { return std::string(i.param.name); });

} // namespace
