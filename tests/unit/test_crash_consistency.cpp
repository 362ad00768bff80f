// SPDX-License-Identifier: MIT
//
// Crash consistency of IBTA FLUSH and ATOMIC WRITE against a test
// persistence domain (persist_domain.hpp): an append-only log with a commit
// word is written into a file-backed MR while the domain is "powered off" at
// random moments, and every image is checked against the completions the
// initiator had polled and against the commit word's ordering promise.
//
// Runs on a clean link and under the engine's fault injector.  SROCE_FAULT is
// read when a device's NIC is created, so each case opens its own devices
// (127.0.1.9 / 127.0.1.10, used by no other test) with the environment it
// needs and closes them again.  SROCE_TEST_SEED replays a failing seed.
#include "persist_domain.hpp"

using namespace rctest;
using namespace crash;

namespace {

Domain g_domain;
ibv_device *g_dev[2];

class Devices : public ::testing::Environment {
  public:
    void SetUp() override {
        // Before any device exists, so no persist can go unreported.
        g_domain.install();
        ASSERT_EQ(find_devices("cc0", "127.0.1.9", "cc1", "127.0.1.10", g_dev), "");
    }
    void TearDown() override { g_domain.uninstall(); }
};

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new Devices);

// What a negative control caught, for the log.
void show_caught(const Report &r) {
    if (!r.first.empty()) std::printf("[ caught   ] %s\n", r.first.front().c_str());
    std::fflush(stdout);
}

uint64_t seed_or(uint64_t fallback) {
    const char *s = getenv("SROCE_TEST_SEED");
    return s && *s ? std::strtoull(s, nullptr, 0) : fallback;
}

class CrashConsistency : public ::testing::Test {
  protected:
    // `fault`: an SROCE_FAULT value, or nullptr for a clean link.
    void open(const char *fault) {
        if (fault)
            setenv("SROCE_FAULT", fault, 1);
        else
            unsetenv("SROCE_FAULT");
        for (int i = 0; i < 2; i++) {
            ctx_[i] = open_device(g_dev[i]);
            ASSERT_NE(ctx_[i], nullptr) << std::strerror(errno);
        }
    }
    void TearDown() override {
        for (ibv_context *&c : ctx_)
            if (c) {
                EXPECT_EQ(ibv_close_device(c), 0);
                c = nullptr;
            }
        unsetenv("SROCE_FAULT");
    }
    void run(const Plan &plan, const RunOpts &o, RunResult &res) {
        run_plan(g_domain, ctx_[0], ctx_[1], plan, o, res);
    }

    ibv_context *ctx_[2] = {};
};

// A positive run: nothing may be violated, and the run must have been able
// to see a violation (power-offs while flushes were in flight, records made
// durable through the hook).
void expect_clean(const Plan &plan, const RunResult &res, uint64_t seed) {
    std::printf("[ crash    ] seed %" PRIu64 ": %s\n", seed, res.summary(plan).c_str());
    std::fflush(stdout);
    EXPECT_EQ(res.during.count, 0u) << "seed " << seed << ": " << res.during.text();
    EXPECT_EQ(res.final.count, 0u) << "seed " << seed << ": " << res.final.text();
    EXPECT_EQ(res.points, plan.points.size());
    EXPECT_GE(res.power_offs, kMinPowerOffs);
    EXPECT_GT(res.inflight_power_offs, res.power_offs / 4);
    EXPECT_GT(res.mid_flush_power_offs, 0u);
    EXPECT_GT(res.domain.ranges, 0u);
    EXPECT_EQ(res.domain.foreign, 0u);
}

TEST_F(CrashConsistency, CleanLink) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    uint64_t seed = seed_or(1);
    Plan plan = random_plan(seed, Shape{.records = kSanitized ? 500u : 2000u});
    RunOpts o;
    o.seed = seed;
    o.min_power_offs = kMinPowerOffs;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    expect_clean(plan, res, seed);
}

// Loss, duplication and reordering make the requester retransmit FLUSHes,
// ATOMIC WRITEs and the WRITEs before them: none may be executed twice (a
// replayed ATOMIC WRITE would move the commit word back), and go-back-N must
// not let a FLUSH overtake a WRITE it covers.
TEST_F(CrashConsistency, LossyLink) {
    uint64_t seed = seed_or(2);
    std::string fault = strf("drop=0.02,dup=0.02,reorder=0.02,seed=%" PRIu64, seed);
    ASSERT_NO_FATAL_FAILURE(open(fault.c_str()));
    Plan plan = random_plan(seed, Shape{.records = kSanitized ? 400u : 1500u});
    RunOpts o;
    o.seed = seed;
    o.min_power_offs = kMinPowerOffs;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    std::printf("[ crash    ] SROCE_FAULT=%s\n", fault.c_str());
    expect_clean(plan, res, seed);
}

// Write-commits, plain and ordered, mixed into the log, on the native and the
// IBTA path, over a lossy link: every acknowledged commit is durable at every
// power-off, and no ordered commit is ever durable ahead of the records it
// was ordered after.
class CrashConsistencyCommit : public CrashConsistency,
                               public ::testing::WithParamInterface<bool> {};

TEST_P(CrashConsistencyCommit, CommitsOnALossyLink) {
    uint64_t seed = seed_or(3);
    std::string fault = strf("drop=0.02,dup=0.02,reorder=0.02,seed=%" PRIu64, seed);
    ASSERT_NO_FATAL_FAILURE(open(fault.c_str()));
    Plan plan =
        random_plan(seed, Shape{.records = kSanitized ? 400u : 1500u, .commit_record_chance = 0.4});
    RunOpts o;
    o.seed = seed;
    o.min_power_offs = kMinPowerOffs;
    o.native_commit = GetParam();
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    expect_clean(plan, res, seed);
}

INSTANTIATE_TEST_SUITE_P(Paths, CrashConsistencyCommit, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return i.param ? "native" : "ibta_fallback";
                         });

// ---------------------------------------------------------------------------
// Negative controls: the harness must be able to fail.

// A FLUSH with placement type GLOBAL makes data visible, not durable, so the
// engine only fences and reports nothing to the hook.  Treated as durability
// points anyway, its completions must show up as lost records.
TEST_F(CrashConsistency, NegativeGlobalFlushIsNotPersistence) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    Shape s;
    s.records = 150;
    s.placement = IBV_FLUSH_GLOBAL;
    Plan plan = random_plan(3, s);
    RunOpts o;
    o.gap_us = 500;
    o.target_access = kAllAccess | IBV_ACCESS_FLUSH_GLOBAL;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    show_caught(res.final);
    EXPECT_EQ(res.points, plan.points.size()); // every GLOBAL FLUSH succeeded
    EXPECT_EQ(res.domain.ranges, 0u);
    EXPECT_GT(res.domain.fences, 0u);
    // Every record, and the commit word, is reported lost.
    EXPECT_EQ(res.final.count, plan.records.size() + 1) << res.final.text();
    std::string text = res.final.text();
    EXPECT_NE(text.find("record 0 MR["), std::string::npos) << text;
    EXPECT_NE(text.find("is not durable"), std::string::npos) << text;
    EXPECT_NE(text.find("FLUSH RANGE"), std::string::npos) << text;
    EXPECT_NE(text.find("GLOBAL"), std::string::npos) << text;
    EXPECT_NE(text.find("the commit word names 0 records"), std::string::npos) << text;
}

// The checker is told a FLUSH completed that was never posted.
TEST_F(CrashConsistency, NegativeFabricatedCompletionIsCaught) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    Plan plan = random_plan(4, Shape{.records = 200});
    // Stop after the point nearest the middle.
    size_t cut = plan.points[plan.points.size() / 2];
    RunOpts o;
    o.gap_us = 500;
    o.stop_before = cut + 1;
    o.claim = int64_t(plan.points.size()) - 1;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    show_caught(res.final);
    EXPECT_EQ(res.during.count, 0u) << res.during.text();
    ASSERT_GT(res.final.count, 0u);
    // The commit word comes first (it names fewer records than the last
    // commit promised), then the records.
    auto it = std::find_if(res.final.first.begin(), res.final.first.end(),
                           [](const std::string &m) { return m.find(": record ") != m.npos; });
    ASSERT_NE(it, res.final.first.end()) << res.final.text();
    const std::string &m = *it;
    EXPECT_NE(m.find("is not durable"), std::string::npos) << m;
    EXPECT_NE(m.find("promised by polled point"), std::string::npos) << m;
    // The first record named must be one that was never written.
    size_t r = 0;
    ASSERT_EQ(std::sscanf(m.c_str() + m.find(": record ") + 9, "%zu", &r), 1) << m;
    EXPECT_GT(plan.records[r].first_op, cut) << m;
}

// An application bug the ordering check must see: the commit word is written
// and flushed before the records it names were flushed.
TEST_F(CrashConsistency, NegativeCommitBeforeItsRecordsIsCaught) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    PlanBuilder b(5);
    b.record(kLogStart, 3000);
    b.record(4096, 20000, {7000});
    b.commit(2);
    b.flush_range(kCommitOff, 8);
    Plan plan = b.finish();
    RunOpts o;
    o.gap_us = 200;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    show_caught(res.final);
    EXPECT_EQ(res.points, 1u);
    ASSERT_EQ(res.final.count, 2u) << res.final.text();
    for (const std::string &m : res.final.first)
        EXPECT_NE(m.find("the commit word in the same image names 2 records"), std::string::npos)
            << m;
}

// An ordering promise no plain WRITE makes (the one an ordered commit will):
// record 1 is said to be placed only once record 0 is durable, then record 1
// alone is flushed.
TEST_F(CrashConsistency, NegativeBrokenOrderingPromiseIsCaught) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    PlanBuilder b(7);
    b.record(kLogStart, 5000);
    b.record(8192, 3000, {}, Kind::kWrite, 1);
    b.flush_range(8192, 3000);
    Plan plan = b.finish();
    RunOpts o;
    o.gap_us = 200;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    show_caught(res.final);
    ASSERT_EQ(res.final.count, 1u) << res.final.text();
    EXPECT_NE(res.final.first[0].find("record 1 MR[0x2000, +3000) (ops #1..#1) is (partly) "
                                      "durable, but record 0 is not"),
              std::string::npos)
        << res.final.text();
}

// The checker believes one record ends a byte early: that byte, durable
// through the FLUSH that covers the record, is one "no operation wrote".
TEST_F(CrashConsistency, NegativeBytesNoOperationWroteAreCaught) {
    ASSERT_NO_FATAL_FAILURE(open(nullptr));
    Plan plan = random_plan(6, Shape{.records = 100});
    Plan believed = plan;
    size_t r = 0;
    while (plan.records[r].len < 2)
        r++;
    believed.records[r].len--;
    uint64_t byte = plan.records[r].off + plan.records[r].len - 1;
    RunOpts o;
    o.gap_us = 500;
    o.believed = &believed;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    show_caught(res.final);
    ASSERT_GT(res.final.count, 0u);
    EXPECT_EQ(res.final.count, 1u) << res.final.text();
    EXPECT_NE(
        res.final.first[0].find(strf("MR offset 0x%" PRIx64 ", which no operation wrote", byte)),
        std::string::npos)
        << res.final.text();
}

} // namespace
