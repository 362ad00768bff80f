// SPDX-License-Identifier: MIT
//
// The crash-consistency domain of the verbs tests (tests/unit/
// persist_domain.hpp) through the libfabric provider pmof: the same
// log-append-then-commit plans, posted with fi_writemsg (plain, FI_COMMIT,
// FI_COMMIT | FI_FENCE) and fi_commit, while a second thread powers the
// target off at random moments and checks every image against what the
// polled completions had promised.
//
// Both endpoints live in this process, so the engine's persist hook sees
// every range the target makes durable.  Run under `sroce exec` with a
// sroce link on PMOF_CRASH_ADDR and FI_PROVIDER_PATH at the provider
// (tests/integration/test_pmof_crash.sh).  SROCE_TEST_SEED replays a seed.
#include "persist_domain.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext_pmof.h>
#include <rdma/fi_rma.h>

#include <netinet/in.h>

using namespace crash;

namespace {

Domain g_domain;

class HookEnv : public ::testing::Environment {
  public:
    // Before the provider opens a device, so no persist goes unreported.
    void SetUp() override { g_domain.install(); }
    void TearDown() override { g_domain.uninstall(); }
};

[[maybe_unused]] ::testing::Environment *const g_env =
    ::testing::AddGlobalTestEnvironment(new HookEnv);

const char *addr() {
    const char *a = getenv("PMOF_CRASH_ADDR");
    return a && *a ? a : "127.0.24.1";
}

uint64_t seed_or(uint64_t fallback) {
    const char *s = getenv("SROCE_TEST_SEED");
    return s && *s ? std::strtoull(s, nullptr, 0) : fallback;
}

#define FI_OK(call)                                                                                \
    do {                                                                                           \
        int rc_ = int(call);                                                                       \
        ASSERT_EQ(rc_, 0) << #call << ": " << fi_strerror(-rc_);                                   \
    } while (0)

// The plan's operations as libfabric calls on the initiator's endpoint.
// Only durability points ask for a completion (FI_SELECTIVE_COMPLETION),
// as only they are signaled on the verbs QP.
struct FabricInitiator {
    fid_ep *ep;
    fid_cq *cq;
    void *desc;         // the source image's registration
    const uint8_t *src; // the source image, same layout as the target
    uint64_t raddr, key, mr_len;
    std::vector<fi_context2> ctx; // one per op: a completion names its op

    ssize_t write(const Op &op, size_t i, uint64_t flags) {
        iovec iov{const_cast<uint8_t *>(src + op.off), op.len};
        fi_rma_iov rma{raddr + op.off, op.len, key};
        fi_msg_rma msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.rma_iov = &rma;
        msg.rma_iov_count = 1;
        msg.context = &ctx[i];
        return fi_writemsg(ep, &msg, flags);
    }

    ssize_t post_one(const Op &op, size_t i) {
        uint64_t flags = info(op.kind).point ? FI_COMPLETION : 0;
        fi_rma_iov range{raddr + op.off, op.len, key};
        switch (op.kind) {
        case Kind::kWrite:
            return write(op, i, flags);
        case Kind::kAtomicWrite: {
            // The commit word: an aligned 8-byte write, which the domain
            // places single-copy atomically (fi_pmof_query's
            // atomicity_unit), injected so that no registration is needed.
            iovec iov{const_cast<uint64_t *>(&op.value), sizeof(op.value)};
            fi_rma_iov rma{raddr + op.off, sizeof(op.value), key};
            fi_msg_rma msg{};
            msg.msg_iov = &iov;
            msg.iov_count = 1;
            msg.rma_iov = &rma;
            msg.rma_iov_count = 1;
            msg.context = &ctx[i];
            return fi_writemsg(ep, &msg, flags | FI_INJECT);
        }
        case Kind::kFlushRange:
            return fi_commit(ep, &range, 1, 0, flags, &ctx[i]);
        case Kind::kFlushMr:
            range = {raddr, mr_len, key};
            return fi_commit(ep, &range, 1, 0, flags, &ctx[i]);
        case Kind::kWriteCommit:
            return write(op, i, flags | FI_COMMIT);
        case Kind::kWriteCommitOrdered:
            return write(op, i, flags | FI_COMMIT | FI_FENCE);
        }
        return -FI_EINVAL;
    }

    size_t post(const Plan &plan, size_t first, size_t n, std::string &failure) {
        for (size_t i = first; i < first + n; i++) {
            ssize_t rc = post_one(plan.ops[i], i);
            if (rc == -FI_EAGAIN) return i - first; // room comes with completions
            if (rc) {
                failure = strf("%s: %s", plan.op_desc(i).c_str(), fi_strerror(int(-rc)));
                return i - first;
            }
        }
        return n;
    }

    int poll(uint64_t *ids, int max, std::string &failure) {
        fi_cq_entry e[16];
        ssize_t n = fi_cq_read(cq, e, size_t(std::min(max, 16)));
        if (n == -FI_EAGAIN) return 0;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            ssize_t rc = fi_cq_readerr(cq, &err, 0);
            if (rc < 0 || !err.op_context)
                failure = strf("an error completion fi_cq_readerr cannot give (%zd)", rc);
            else
                failure = strf("op %td completed with %s",
                               static_cast<fi_context2 *>(err.op_context) - ctx.data(),
                               fi_strerror(err.err));
            return -1;
        }
        if (n < 0) {
            failure = strf("fi_cq_read: %s", fi_strerror(int(-n)));
            return -1;
        }
        for (ssize_t i = 0; i < n; i++)
            ids[i] = uint64_t(static_cast<fi_context2 *>(e[i].op_context) - ctx.data());
        return int(n);
    }
};

// A connected pair of FI_EP_MSG endpoints of pmof on one device: the
// initiator, and the target with the plan's MR (a file on /var/tmp,
// registered FI_PMEM).
class Pair {
  public:
    // Endpoints before their CQs and EQs, everything before its domain.
    ~Pair() {
        close(mr_t_);
        close(mr_s_);
        for (fid_ep *ep : ep_)
            close(ep);
        close(pep_);
        for (fid_cq *cq : cq_)
            close(cq);
        for (fid_eq *eq : eq_)
            close(eq);
        for (fid_domain *d : dom_)
            close(d);
        close(fab_);
        if (info_) fi_freeinfo(info_);
    }

    void open(const Plan &plan, FileMr &dst) {
        fi_info *hints = make_hints();
        ASSERT_NE(hints, nullptr);
        int rc = fi_getinfo(FI_VERSION(1, 17), addr(), nullptr, FI_SOURCE, hints, &info_);
        ASSERT_EQ(rc, 0) << "fi_getinfo(pmof, " << addr() << "): " << fi_strerror(-rc);

        fi_eq_attr eqa{};
        eqa.wait_obj = FI_WAIT_UNSPEC;
        fi_cq_attr cqa{};
        cqa.format = FI_CQ_FORMAT_CONTEXT;
        cqa.size = 1024;
        FI_OK(fi_fabric(info_->fabric_attr, &fab_, nullptr));
        for (fid_eq *&eq : eq_)
            FI_OK(fi_eq_open(fab_, &eqa, &eq, nullptr));
        FI_OK(fi_passive_ep(fab_, info_, &pep_, nullptr));
        FI_OK(fi_pep_bind(pep_, &eq_[1]->fid, 0));
        FI_OK(fi_listen(pep_));
        sockaddr_in sin{};
        size_t alen = sizeof(sin);
        FI_OK(fi_getname(&pep_->fid, &sin, &alen));

        // The initiator connects to the listener's address.
        fi_info *cinfo = nullptr;
        rc = fi_getinfo(FI_VERSION(1, 17), addr(), std::to_string(ntohs(sin.sin_port)).c_str(), 0,
                        hints, &cinfo);
        fi_freeinfo(hints);
        ASSERT_EQ(rc, 0) << fi_strerror(-rc);
        ASSERT_NO_FATAL_FAILURE(endpoint(0, cinfo, cqa));
        rc = fi_connect(ep_[0], cinfo->dest_addr, nullptr, 0);
        fi_freeinfo(cinfo);
        FI_OK(rc);

        fi_eq_cm_entry cm{};
        ASSERT_NO_FATAL_FAILURE(wait_event(1, FI_CONNREQ, cm));
        ASSERT_NO_FATAL_FAILURE(endpoint(1, cm.info, cqa));
        rc = fi_accept(ep_[1], nullptr, 0);
        fi_freeinfo(cm.info);
        FI_OK(rc);
        ASSERT_NO_FATAL_FAILURE(wait_event(1, FI_CONNECTED, cm));
        ASSERT_NO_FATAL_FAILURE(wait_event(0, FI_CONNECTED, cm));

        fi_pmof_attr pa{};
        pa.size = sizeof(pa);
        FI_OK(fi_pmof_query(dom_[0], &pa));
        ASSERT_TRUE(pa.commit_flags & FI_COMMIT) << "the initiator's domain cannot commit";
        ASSERT_GE(pa.atomicity_unit, sizeof(uint64_t)) << "the commit word would tear";

        FI_OK(fi_mr_reg(dom_[0], const_cast<uint8_t *>(plan.image.data()), plan.image.size(),
                        FI_WRITE, 0, 0, 0, &mr_s_, nullptr));
        FI_OK(fi_mr_reg(dom_[1], dst.data(), plan.mr_len, FI_REMOTE_WRITE, 0, 0, FI_PMEM, &mr_t_,
                        nullptr));
    }

    FabricInitiator initiator(const Plan &plan, FileMr &dst) {
        return FabricInitiator{ep_[0],
                               cq_[0],
                               fi_mr_desc(mr_s_),
                               plan.image.data(),
                               uint64_t(uintptr_t(dst.data())),
                               fi_mr_key(mr_t_),
                               plan.mr_len,
                               std::vector<fi_context2>(plan.ops.size())};
    }

  private:
    static fi_info *make_hints() {
        fi_info *h = fi_allocinfo();
        if (!h) return nullptr;
        h->ep_attr->type = FI_EP_MSG;
        h->caps = FI_RMA | FI_RMA_PMEM;
        h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        h->fabric_attr->prov_name = strdup("pmof");
        return h;
    }

    template <class T>
    static void close(T *obj) {
        if (obj) {
            EXPECT_EQ(fi_close(&obj->fid), 0);
        }
    }

    void endpoint(int i, fi_info *fi, const fi_cq_attr &cqa) {
        FI_OK(fi_domain(fab_, fi, &dom_[i], nullptr));
        fi_cq_attr a = cqa;
        FI_OK(fi_cq_open(dom_[i], &a, &cq_[i], nullptr));
        FI_OK(fi_endpoint(dom_[i], fi, &ep_[i], nullptr));
        FI_OK(fi_ep_bind(ep_[i], &eq_[i]->fid, 0));
        FI_OK(fi_ep_bind(ep_[i], &cq_[i]->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION));
        FI_OK(fi_enable(ep_[i]));
    }

    void wait_event(int i, uint32_t want, fi_eq_cm_entry &cm) {
        uint32_t ev = 0;
        for (int tries = 0; tries < 300; tries++) {
            // FI_EP_MSG control progress is manual in pmof: a connection
            // moves on (address and route, the request) when its
            // endpoint's EQ is read, so one thread waiting for both sides
            // peeks at the other's.
            uint32_t other;
            uint8_t peek[256];
            fi_eq_read(eq_[1 - i], &other, peek, sizeof(peek), FI_PEEK);
            ssize_t n = fi_eq_sread(eq_[i], &ev, &cm, sizeof(cm), 100, 0);
            if (n == -FI_EAGAIN) continue;
            if (n == -FI_EAVAIL) {
                fi_eq_err_entry err{};
                fi_eq_readerr(eq_[i], &err, 0);
                FAIL() << "EQ error: " << fi_strerror(err.err);
            }
            ASSERT_GT(n, 0) << fi_strerror(int(-n));
            ASSERT_EQ(ev, want) << "unexpected EQ event " << ev;
            return;
        }
        // Why nothing came: often the other side's EQ knows.
        fi_eq_err_entry err{};
        ssize_t n = fi_eq_readerr(eq_[1 - i], &err, 0);
        FAIL() << "no EQ event " << want << " in 30 s"
               << (n > 0 ? std::string("; the other EQ: ") + fi_strerror(err.err) : "");
    }

    fi_info *info_ = nullptr;
    fid_fabric *fab_ = nullptr;
    fid_domain *dom_[2] = {};
    fid_eq *eq_[2] = {};
    fid_cq *cq_[2] = {};
    fid_pep *pep_ = nullptr;
    fid_ep *ep_[2] = {};
    fid_mr *mr_s_ = nullptr, *mr_t_ = nullptr;
};

void run(const Plan &plan, const RunOpts &o, RunResult &res) {
    FileMr dst(plan.mr_len);
    ASSERT_NE(dst.data(), nullptr) << "mapping a file on /var/tmp: " << std::strerror(errno);
    Pair pair;
    ASSERT_NO_FATAL_FAILURE(pair.open(plan, dst));
    FabricInitiator ini = pair.initiator(plan, dst);
    drive_plan(g_domain, ini, dst.data(), plan, o, res);
}

void expect_clean(const Plan &plan, const RunResult &res, uint64_t seed) {
    std::printf("[ crash    ] seed %" PRIu64 ": %s\n", seed, res.summary(plan).c_str());
    std::fflush(stdout);
    EXPECT_EQ(res.during.count, 0u) << "seed " << seed << ": " << res.during.text();
    EXPECT_EQ(res.final.count, 0u) << "seed " << seed << ": " << res.final.text();
    EXPECT_GE(res.power_offs, kMinPowerOffs);
    EXPECT_GT(res.inflight_power_offs, res.power_offs / 4);
    EXPECT_GT(res.domain.ranges, 0u);
    EXPECT_EQ(res.domain.foreign, 0u);
}

RunOpts opts(uint64_t seed) {
    RunOpts o;
    o.seed = seed;
    o.min_power_offs = kMinPowerOffs;
    // Room in pmof's send queue (tx_attr->size 384) for the unsignaled
    // operations between points.
    o.send_wr = 256;
    return o;
}

// FLUSHes become fi_commit of a range or of the whole region, the commit
// word an 8-byte write.
TEST(PmofCrash, CommitsAndFiCommit) {
    uint64_t seed = seed_or(11);
    Plan plan = random_plan(seed, Shape{.records = kSanitized ? 300u : 1200u});
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, opts(seed), res));
    expect_clean(plan, res, seed);
}

// Records whose last piece is a FI_COMMIT write, half of them with
// FI_FENCE: every completed commit is durable at every power-off, and no
// fenced one ahead of the records before it.
TEST(PmofCrash, WriteCommitsPlainAndFenced) {
    uint64_t seed = seed_or(12);
    Plan plan =
        random_plan(seed, Shape{.records = kSanitized ? 300u : 1200u, .commit_record_chance = 0.5});
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, opts(seed), res));
    expect_clean(plan, res, seed);
}

// The harness bites through the provider too: told that every point
// completed when the run stopped halfway, the last image must fail.
TEST(PmofCrash, NegativeFabricatedCompletionIsCaught) {
    Plan plan = random_plan(13, Shape{.records = 200});
    size_t cut = plan.points[plan.points.size() / 2];
    RunOpts o = opts(13);
    o.min_power_offs = 0;
    o.gap_us = 500;
    o.stop_before = cut + 1;
    o.claim = int64_t(plan.points.size()) - 1;
    RunResult res;
    ASSERT_NO_FATAL_FAILURE(run(plan, o, res));
    EXPECT_EQ(res.during.count, 0u) << res.during.text();
    ASSERT_GT(res.final.count, 0u);
    std::printf("[ caught   ] %s\n", res.final.first.front().c_str());
}

} // namespace
