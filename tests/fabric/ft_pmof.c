/* SPDX-License-Identifier: MIT */
/* pmof.*: the persistent-memory extensions of <rdma/fi_ext_pmof.h>.  They
 * run only on a domain fi_pmof_query() accepts, except wrappers_enosys,
 * which checks that any other provider refuses them cleanly. */
#include "fabtest.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ft_rma.h"

#define FT_PMOF_LEN 65536

/* Decides before opening anything special (hints another provider may
 * refuse) whether the pmof tests apply. */
static int pmof_probe(struct ft_run *r, bool transport_commits) {
    struct fi_pmof_attr attr;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    ret = ft_require_pmof(r, d.domain, &attr);
    /* A domain whose device executes its peers' FLUSHes but cannot send
     * one (Linux rxe under a libibverbs older than rdma-core 45). */
    if (ret == FT_OK && transport_commits && !(attr.commit_flags & FI_COMMIT))
        ret = ft_skip(r, "a target-only domain: it cannot commit its own writes (commit_flags 0)");
out:
    return ft_dom_close(r, &d, ret);
}

static int pmof_open(struct ft_run *r, struct ft_rma *e, const struct ft_pair_cfg *cfg,
                     struct fi_pmof_attr *attr) {
    int ret;

    memset(e, 0, sizeof(*e));
    /* Manual commits need no more than the transport's writes, apart from
     * the mixed tests, where one side is not manual. */
    ret = pmof_probe(r, !cfg || !(cfg->mode & FI_COMMIT_MANUAL) || cfg->plain[0] || cfg->plain[1]);
    FT_TRY(ret);
    FT_TRY(ft_rma_open(r, e, cfg, FT_PMOF_LEN, FI_PMEM));
    FT_TRY(ft_require_pmof(r, e->c->domain, attr));
out:
    return ret;
}

static struct fi_msg_rma rma_msg(struct ft_rma *e, struct iovec *iov, struct fi_rma_iov *rma,
                                 size_t off, size_t len, void *ctx) {
    *iov = (struct iovec){e->loc.buf + off, len};
    *rma = (struct fi_rma_iov){e->tgt.raddr + off, len, e->tgt.key};
    return (struct fi_msg_rma){.msg_iov = iov,
                               .desc = &e->loc.desc,
                               .iov_count = 1,
                               .addr = e->c->peer,
                               .rma_iov = rma,
                               .rma_iov_count = 1,
                               .context = ctx};
}

/* fi_writemsg of loc[off, off+len) to the same offset of the target. */
static int post_writemsg(struct ft_rma *e, size_t off, size_t len, unsigned seed, uint64_t flags,
                         uint64_t data, void *ctx) {
    struct ft_run *r = e->p.r;
    struct fi_rma_iov rma;
    struct iovec iov;
    int ret = FT_OK;

    ft_fill(e->loc.buf + off, len, seed);
    struct fi_msg_rma msg = rma_msg(e, &iov, &rma, off, len, ctx);
    msg.data = data;
    FT_POST(&e->p, fi_writemsg(e->c->ep, &msg, flags));
out:
    return ret;
}

static int post_write(struct ft_rma *e, size_t off, size_t len, unsigned seed, void *ctx) {
    struct ft_run *r = e->p.r;
    int ret = FT_OK;

    ft_fill(e->loc.buf + off, len, seed);
    FT_POST(&e->p, fi_write(e->c->ep, e->loc.buf + off, len, e->loc.desc, e->c->peer,
                            e->tgt.raddr + off, e->tgt.key, ctx));
out:
    return ret;
}

/* A commit's completion promises the data is there: no waiting. */
static int durable(struct ft_rma *e, size_t off, size_t len, unsigned seed, const char *what) {
    return ft_expect_pattern(e->p.r, e->tgt.buf + off, len, seed, what);
}

/* ------------------------------------------------------ written back? */

/* kB of the mapping holding `addr` that were written and not yet written
 * back to the file (/proc/self/smaps), or -1.  FI_PMEM targets here are
 * file mappings, which the target makes durable with msync: a commit that
 * completed leaves none, a plain write leaves its page dirty.  Checking
 * the bytes alone could not tell a commit from a plain write. */
static long dirty_kb(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    uintptr_t a = (uintptr_t)addr, lo, hi;
    char line[512];
    bool in = false;
    long kb = -1, v;

    if (!f) return -1;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, ' ') > strchr(line, '-')) {
            if (in) break;
            in = a >= lo && a < hi;
            if (in) kb = 0;
        } else if (in && (sscanf(line, "Shared_Dirty: %ld kB", &v) == 1 ||
                          sscanf(line, "Private_Dirty: %ld kB", &v) == 1)) {
            kb += v;
        }
    }
    fclose(f);
    return kb;
}

/* Writes the target's file back, then dirties it with a plain write of
 * [off, off+len) and checks that shows (*observable false if this kernel
 * does not report it, or the file system never writes back - ramfs -, and
 * the durability checks are skipped). */
static int dirty_target(struct ft_rma *e, size_t off, size_t len, bool *observable) {
    struct ft_run *r = e->p.r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    FT_EXPECT(!msync(e->tgt.buf, e->tgt.map_len, MS_SYNC), "msync of the target failed");
    bool cleaned = dirty_kb(e->tgt.buf) == 0;
    FT_TRY(post_write(e, off, len, 77, &ctx));
    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(ft_wait_pattern(&e->p, e->tgt.buf + off, len, 77, "plain write"));
    *observable = cleaned && dirty_kb(e->tgt.buf + off) > 0;
    if (!*observable) ft_note(r, "dirty pages of the target not observable: write-back unchecked");
out:
    return ret;
}

/* The same with a store of the target itself into [off, off+len), for
 * tests whose plain writes are commits too. */
static int dirty_locally(struct ft_rma *e, size_t off, size_t len, bool *observable) {
    struct ft_run *r = e->p.r;
    int ret = FT_OK;

    FT_EXPECT(!msync(e->tgt.buf, e->tgt.map_len, MS_SYNC), "msync of the target failed");
    bool cleaned = dirty_kb(e->tgt.buf) == 0;
    memset(e->tgt.buf + off, 0xee, len);
    *observable = cleaned && dirty_kb(e->tgt.buf + off) > 0;
    if (!*observable) ft_note(r, "dirty pages of the target not observable: write-back unchecked");
out:
    return ret;
}

static int written_back(struct ft_rma *e, bool observable, const char *what) {
    long kb = observable ? dirty_kb(e->tgt.buf) : 0;

    if (kb) return ft_fail(e->p.r, "%s: %ld kB of the target not written back", what, kb);
    return FT_OK;
}

/* ------------------------------------------------------------ query */

static int t_query(struct ft_run *r) {
    struct fi_pmof_attr attr;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(ft_require_pmof(r, d.domain, &attr));
    FT_EXPECT(attr.atomicity_unit > 0, "atomicity_unit 0");
    /* Only a device that is not sroce may be a commit target only. */
    FT_EXPECT((attr.commit_flags & FI_COMMIT) || (!attr.native && !attr.commit_flags),
              "commit_flags %#llx lack FI_COMMIT", (unsigned long long)attr.commit_flags);
    FT_EXPECT(attr.mr_flags & FI_PMEM, "mr_flags %#llx lack FI_PMEM",
              (unsigned long long)attr.mr_flags);
    ft_note(r, "atomicity_unit %zu, commit_flags %#llx, mr_flags %#llx, native %d",
            attr.atomicity_unit, (unsigned long long)attr.commit_flags,
            (unsigned long long)attr.mr_flags, attr.native);
out:
    return ft_dom_close(r, &d, ret);
}

/* ------------------------------------------------------------ FI_COMMIT */

static int t_commit_write(struct ft_run *r) {
    static const size_t sizes[] = {8, 64, 4096, FT_PMOF_LEN};
    struct fi_pmof_attr attr;
    struct fi_context2 ctx;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        bool observable;
        memset(e.tgt.buf, 0, FT_PMOF_LEN);
        /* A plain write to the same key first: the commit covers it. */
        FT_TRY(dirty_target(&e, FT_PMOF_LEN - 64, 64, &observable));
        FT_TRY(post_writemsg(&e, 0, sizes[i], (unsigned)i, FI_COMMIT | FI_COMPLETION, 0, &ctx));
        FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
        FT_TRY(durable(&e, 0, sizes[i], (unsigned)i, "target at FI_COMMIT completion"));
        FT_TRY(written_back(&e, observable, "at FI_COMMIT completion"));
    }
out:
    return ft_rma_close(r, &e, ret);
}

static int t_commit_complete_default(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.tx_op_flags = FI_COMMIT_COMPLETE};
    struct fi_pmof_attr attr;
    struct fi_context2 ctx;
    struct ft_rma e;
    int ret = pmof_open(r, &e, &cfg, &attr);

    FT_TRY(ret);
    FT_EXPECT(e.c->info->tx_attr->op_flags & FI_COMMIT_COMPLETE,
              "tx op_flags %#llx lost FI_COMMIT_COMPLETE",
              (unsigned long long)e.c->info->tx_attr->op_flags);
    bool observable;
    FT_TRY(dirty_locally(&e, 0, 4096, &observable));
    FT_TRY(post_write(&e, 0, 4096, 3, &ctx));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(durable(&e, 0, 4096, 3, "target at FI_COMMIT_COMPLETE completion"));
    FT_TRY(written_back(&e, observable, "at FI_COMMIT_COMPLETE completion"));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_immed(struct ft_run *r) {
    const uint64_t data = 0x1122334455667788ULL;
    struct fi_context2 ctx, rxc;
    struct fi_pmof_attr attr;
    struct ft_comp comp;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    FT_EXPECT(attr.commit_flags & FI_IMMED, "commit_flags lack FI_IMMED");
    uint64_t mask = e.c->info->domain_attr->cq_data_size >= 8
                        ? ~0ULL
                        : (1ULL << (8 * e.c->info->domain_attr->cq_data_size)) - 1;
    FT_POST(&e.p, fi_recv(e.s->ep, e.tgt.buf + 32768, 64, e.tgt.desc, FI_ADDR_UNSPEC, &rxc));
    FT_TRY(post_writemsg(&e, 0, 4096, 4, FI_COMMIT | FI_IMMED | FI_COMPLETION, data & mask, &ctx));
    FT_TRY(ft_expect_comp(&e.p, &e.s->rx, NULL, FI_REMOTE_CQ_DATA, SIZE_MAX, &comp));
    FT_TRY(durable(&e, 0, 4096, 4, "target at its FI_IMMED completion"));
    FT_EXPECT(comp.e.data == (data & mask), "FI_IMMED data %#llx, expected %#llx",
              (unsigned long long)comp.e.data, (unsigned long long)(data & mask));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_immed_alone(struct ft_run *r) {
    struct fi_pmof_attr attr;
    struct fi_context2 ctx;
    struct fi_rma_iov rma;
    struct iovec iov;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    ft_fill(e.loc.buf, 64, 5);
    struct fi_msg_rma msg = rma_msg(&e, &iov, &rma, 0, 64, &ctx);
    ssize_t rc = fi_writemsg(e.c->ep, &msg, FI_IMMED | FI_COMPLETION);
    FT_EXPECT(rc == -FI_EINVAL, "fi_writemsg(FI_IMMED without FI_COMMIT) = %zd (%s)", rc,
              fi_strerror((int)-rc));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 100, "refused FI_IMMED write"));
    FT_TRY(ft_expect_quiet(&e.p, &e.s->rx, 0, "refused FI_IMMED write"));
    FT_EXPECT(ft_check(e.tgt.buf, 64, 5) != 64, "the refused write reached the target");
out:
    return ft_rma_close(r, &e, ret);
}

static int t_fenced(struct ft_run *r) {
    struct fi_context2 ctx[4];
    struct fi_pmof_attr attr;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    bool observable;
    FT_TRY(dirty_locally(&e, 0, 4 * 4096, &observable));
    for (int i = 0; i < 3; i++)
        FT_TRY(post_write(&e, 4096 * i, 4096, 10 + i, &ctx[i]));
    FT_TRY(post_writemsg(&e, 3 * 4096, 4096, 13, FI_COMMIT | FI_FENCE | FI_COMPLETION, 0, &ctx[3]));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx[3], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    for (int i = 0; i < 4; i++)
        FT_TRY(durable(&e, 4096 * i, 4096, 10 + i, "write at the fenced commit's completion"));
    FT_TRY(written_back(&e, observable, "at the fenced commit's completion"));
    for (int i = 0; i < 3; i++)
        FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx[i], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ fi_commit */

/* Three plain writes at 0, 8 KiB, 16 KiB, their completions collected,
 * and the ranges a commit of them names. */
static int three_writes(struct ft_rma *e, struct fi_rma_iov *rma, unsigned seed) {
    static const size_t lens[3] = {100, 4096, 777};
    struct fi_context2 ctx[3];
    int ret = FT_OK;

    for (int i = 0; i < 3; i++) {
        FT_TRY(post_write(e, 8192 * i, lens[i], seed + i, &ctx[i]));
        rma[i] = (struct fi_rma_iov){e->tgt.raddr + 8192 * i, lens[i], e->tgt.key};
    }
    for (int i = 0; i < 3; i++)
        FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx[i], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ret;
}

static int three_durable(struct ft_rma *e, const struct fi_rma_iov *rma, unsigned seed) {
    int ret = FT_OK;

    for (int i = 0; i < 3; i++)
        FT_TRY(durable(e, 8192 * i, rma[i].len, seed + i, "range at fi_commit completion"));
out:
    return ret;
}

static int expect_commit_done(struct ft_rma *e, void *ctx) {
    struct ft_run *r = e->p.r;
    struct ft_comp comp;
    int ret = FT_OK;

    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, ctx, 0, SIZE_MAX, &comp));
    FT_EXPECT((comp.e.flags & FI_COMMIT) ||
                  (comp.e.flags & (FI_RMA | FI_WRITE)) == (FI_RMA | FI_WRITE),
              "fi_commit completion flags %#llx: neither FI_COMMIT nor FI_RMA|FI_WRITE",
              (unsigned long long)comp.e.flags);
out:
    return ret;
}

static int t_fi_commit(struct ft_run *r) {
    struct fi_pmof_attr attr;
    struct fi_rma_iov rma[3];
    struct fi_context2 ctx;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    bool observable;
    FT_TRY(dirty_target(&e, 0, 64, &observable));
    FT_TRY(three_writes(&e, rma, 20));
    FT_POST(&e.p, fi_commit(e.c->ep, rma, 3, e.c->peer, 0, &ctx));
    FT_TRY(expect_commit_done(&e, &ctx));
    FT_TRY(three_durable(&e, rma, 20));
    FT_TRY(written_back(&e, observable, "at fi_commit completion"));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 50, "after fi_commit"));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_fi_commit_zero(struct ft_run *r) {
    struct fi_pmof_attr attr;
    struct fi_rma_iov rma;
    struct fi_context2 ctx;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    rma = (struct fi_rma_iov){e.tgt.raddr, 64, e.tgt.key};
    ssize_t rc = fi_commit(e.c->ep, &rma, 0, e.c->peer, 0, &ctx);
    FT_EXPECT(rc == -FI_EINVAL, "fi_commit(count 0) = %zd (%s), expected -FI_EINVAL", rc,
              fi_strerror((int)-rc));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 100, "refused fi_commit"));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_fi_commit_badkey(struct ft_run *r) {
    struct fi_pmof_attr attr;
    struct fi_rma_iov rma[3];
    struct fi_context2 ctx;
    struct ft_comp comp;
    struct ft_rma e;
    int ret = pmof_open(r, &e, NULL, &attr);

    FT_TRY(ret);
    FT_TRY(three_writes(&e, rma, 30));
    rma[1].key += 12345;
    FT_POST(&e.p, fi_commit(e.c->ep, rma, 3, e.c->peer, 0, &ctx));
    FT_TRY(ft_expect_err(&e.p, &e.c->tx, &ctx, &comp));
    ft_note(r, "err %d (%s)", comp.err, fi_strerror(comp.err));
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ manual mode */

static int manual_open(struct ft_run *r, struct ft_rma *e) {
    struct ft_pair_cfg cfg = {.mode = FI_COMMIT_MANUAL, .rdm_eq = true};
    struct fi_pmof_attr attr;
    int ret = pmof_open(r, e, &cfg, &attr);

    FT_TRY(ret);
    if (!(e->p.info->mode & FI_COMMIT_MANUAL) || !(e->s->info->mode & FI_COMMIT_MANUAL))
        ret = ft_skip(r, "the provider did not keep FI_COMMIT_MANUAL in info->mode");
out:
    return ret;
}

struct commit_check {
    const struct fi_rma_iov *want;
    size_t count;
    const struct fid *fid;
    ssize_t status;
    atomic_int calls;
    atomic_int bad;
};

static bool same_ranges(const struct commit_check *c, const struct fi_eq_commit_entry *e) {
    if (!c->want || e->count != c->count || !e->iov) return false;
    for (size_t i = 0; i < c->count; i++)
        if (e->iov[i].key != c->want[i].key || e->iov[i].addr != c->want[i].addr ||
            e->iov[i].len != c->want[i].len)
            return false;
    return true;
}

/* Runs in whatever thread the provider delivers commits from. */
static ssize_t commit_handler(struct fid_eq *eq, uint64_t type, void *data, uint64_t len,
                              void *context) {
    struct commit_check *c = context;
    const struct fi_eq_commit_entry *e = data;

    (void)eq;
    if (type != FI_COMMIT_EVENT || len != sizeof(*e) || !same_ranges(c, e) || e->fid != c->fid)
        atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add(&c->calls, 1);
    return c->status;
}

static int handler_round(struct ft_rma *e, struct commit_check *chk, ssize_t status,
                         unsigned seed) {
    struct ft_run *r = e->p.r;
    struct fi_rma_iov rma[3];
    struct fi_context2 ctx;
    struct ft_comp comp;
    int ret = FT_OK;

    chk->status = status;
    FT_TRY(three_writes(e, rma, seed));
    chk->want = rma;
    chk->count = 3;
    int before = atomic_load(&chk->calls);
    FT_POST(&e->p, fi_commit(e->c->ep, rma, 3, e->c->peer, 0, &ctx));
    if (status) {
        FT_TRY(ft_expect_err(&e->p, &e->c->tx, &ctx, &comp));
        FT_EXPECT(comp.err == (int)-status, "handler said %zd, initiator got err %d (%s)", status,
                  comp.err, fi_strerror(comp.err));
    } else {
        FT_TRY(expect_commit_done(e, &ctx));
        FT_TRY(three_durable(e, rma, seed));
    }
    FT_EXPECT(atomic_load(&chk->calls) == before + 1, "handler called %d times for one commit",
              atomic_load(&chk->calls) - before);
    FT_EXPECT(!atomic_load(&chk->bad), "the handler saw a wrong event, length, fid or ranges");
out:
    chk->want = NULL;
    return ret;
}

static int t_manual_handler(struct ft_run *r) {
    struct commit_check chk = {0};
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    chk.fid = &e.s->ep->fid;
    FT_CHK(fi_eq_register_handler(e.s->eq.eq, FI_COMMIT_EVENT, commit_handler, &chk));
    FT_TRY(handler_round(&e, &chk, 0, 40));
    FT_TRY(handler_round(&e, &chk, -FI_EIO, 50));
    FT_CHK(fi_eq_register_handler(e.s->eq.eq, FI_COMMIT_EVENT, NULL, NULL));
    for (size_t i = 0; i < e.s->eq.n; i++)
        FT_EXPECT(e.s->eq.q[i].event != FI_COMMIT_EVENT, "a handled commit was also queued");
out:
    return ft_rma_close(r, &e, ret);
}

static int t_manual_eq(struct ft_run *r) {
    struct fi_rma_iov rma[3];
    struct fi_context2 ctx;
    struct ft_eqev ev;
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    FT_TRY(three_writes(&e, rma, 60));
    FT_POST(&e.p, fi_commit(e.c->ep, rma, 3, e.c->peer, 0, &ctx));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    FT_EXPECT(ev.len == (ssize_t)sizeof(struct fi_eq_commit_entry),
              "FI_COMMIT_EVENT length %zd, expected %zu", ev.len,
              sizeof(struct fi_eq_commit_entry));
    struct commit_check want = {.want = rma, .count = 3};
    FT_EXPECT(same_ranges(&want, &ev.u.commit), "FI_COMMIT_EVENT ranges differ from fi_commit's");
    FT_EXPECT(ev.u.commit.fid == &e.s->ep->fid, "FI_COMMIT_EVENT fid is not the target endpoint");
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 50, "commit before its acknowledgement"));
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0));
    FT_TRY(expect_commit_done(&e, &ctx));
out:
    return ft_rma_close(r, &e, ret);
}

/* A target application that persists what it is asked to: msync of each
 * range of its file mapping, and a record of the ranges. */
#define PMOF_T_RANGES 8

struct persister {
    struct ft_rma *e;
    struct fi_rma_iov seen[2][PMOF_T_RANGES];
    size_t nseen[2];
    atomic_int calls;
};

static int persist_ranges(struct ft_rma *e, const struct fi_eq_commit_entry *ce) {
    for (size_t i = 0; i < ce->count; i++) {
        uint8_t *p = e->tgt.buf + (ce->iov[i].addr - e->tgt.raddr);
        uintptr_t lo = (uintptr_t)p & ~(uintptr_t)4095;
        if (ce->iov[i].key != e->tgt.key || p < e->tgt.buf ||
            p + ce->iov[i].len > e->tgt.buf + e->tgt.len)
            return -FI_EINVAL;
        if (msync((void *)lo, (uintptr_t)p + ce->iov[i].len - lo, MS_SYNC)) return -FI_EIO;
    }
    return 0;
}

static ssize_t persist_handler(struct fid_eq *eq, uint64_t type, void *data, uint64_t len,
                               void *context) {
    struct persister *ps = context;
    const struct fi_eq_commit_entry *ce = data;
    int n = atomic_fetch_add(&ps->calls, 1);

    (void)eq;
    if (type != FI_COMMIT_EVENT || len != sizeof(*ce)) return -FI_EINVAL;
    if (n < 2) {
        ps->nseen[n] = ce->count < PMOF_T_RANGES ? ce->count : PMOF_T_RANGES;
        memcpy(ps->seen[n], ce->iov, ps->nseen[n] * sizeof(*ce->iov));
    }
    return persist_ranges(ps->e, ce);
}

static bool has_range(const struct fi_rma_iov *v, size_t n, uint64_t addr, uint64_t len) {
    for (size_t i = 0; i < n; i++)
        if (v[i].addr <= addr && v[i].addr + v[i].len >= addr + len) return true;
    return false;
}

/* FI_COMMIT on a write: the target application is asked for this write
 * and the earlier plain write to the same key, and the initiator's
 * completion comes once it has persisted them. */
static int t_manual_write(struct ft_run *r) {
    struct persister ps = {0};
    struct fi_context2 ctx;
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    ps.e = &e;
    FT_CHK(fi_eq_register_handler(e.s->eq.eq, FI_COMMIT_EVENT, persist_handler, &ps));
    bool observable;
    FT_TRY(dirty_target(&e, FT_PMOF_LEN - 64, 64, &observable));
    FT_TRY(post_writemsg(&e, 0, 4096, 21, FI_COMMIT | FI_COMPLETION, 0, &ctx));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_EXPECT(atomic_load(&ps.calls) == 1, "the handler ran %d times", atomic_load(&ps.calls));
    FT_EXPECT(has_range(ps.seen[0], ps.nseen[0], e.tgt.raddr, 4096),
              "the commit event lacks the write's range");
    FT_EXPECT(has_range(ps.seen[0], ps.nseen[0], e.tgt.raddr + FT_PMOF_LEN - 64, 64),
              "the commit event lacks the earlier write to the same key");
    FT_TRY(durable(&e, 0, 4096, 21, "target at the manual FI_COMMIT completion"));
    FT_TRY(written_back(&e, observable, "at the manual FI_COMMIT completion"));
out:
    return ft_rma_close(r, &e, ret);
}

/* FI_IMMED: the target's CQ sees the data only once its application has
 * acknowledged the commit. */
static int t_manual_immed(struct ft_run *r) {
    struct fi_context2 ctx, rxc;
    struct ft_comp comp;
    struct ft_eqev ev;
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    uint64_t data = e.c->info->domain_attr->cq_data_size >= 4 ? 0x5a5a1234 : 0;
    FT_POST(&e.p, fi_recv(e.s->ep, e.tgt.buf + 32768, 64, e.tgt.desc, FI_ADDR_UNSPEC, &rxc));
    FT_TRY(post_writemsg(&e, 0, 512, 22, FI_COMMIT | FI_IMMED | FI_COMPLETION, data, &ctx));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    FT_TRY(ft_expect_quiet(&e.p, &e.s->rx, 50, "FI_IMMED data before the acknowledgement"));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 0, "FI_IMMED write before the acknowledgement"));
    FT_EXPECT(has_range(ev.u.commit.iov, ev.u.commit.count, e.tgt.raddr, 512),
              "the commit event lacks the write's range");
    FT_CHK(persist_ranges(&e, &ev.u.commit));
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0));
    FT_TRY(ft_expect_comp(&e.p, &e.s->rx, NULL, FI_REMOTE_CQ_DATA, SIZE_MAX, &comp));
    FT_EXPECT(comp.e.data == data, "FI_IMMED data %#llx, expected %#llx",
              (unsigned long long)comp.e.data, (unsigned long long)data);
    FT_TRY(durable(&e, 0, 512, 22, "target at its FI_IMMED completion"));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ft_rma_close(r, &e, ret);
}

/* FI_FENCE: the earlier plain writes are committed first, and the fenced
 * write is not placed before the target application acknowledged them. */
static int t_manual_fenced(struct ft_run *r) {
    struct fi_context2 ctx[4];
    struct ft_eqev ev;
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    memset(e.tgt.buf, 0, 4 * 4096);
    for (int i = 0; i < 3; i++)
        FT_TRY(post_write(&e, 4096 * i, 4096, 30 + i, &ctx[i]));
    FT_TRY(post_writemsg(&e, 3 * 4096, 4096, 33, FI_COMMIT | FI_FENCE | FI_COMPLETION, 0, &ctx[3]));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    FT_EXPECT(has_range(ev.u.commit.iov, ev.u.commit.count, e.tgt.raddr, 3 * 4096),
              "the first commit event does not cover the three earlier writes");
    FT_EXPECT(!has_range(ev.u.commit.iov, ev.u.commit.count, e.tgt.raddr + 3 * 4096, 4096),
              "the first commit event names the fenced write too");
    /* Time for a wrongly placed write to land. */
    FT_TRY(ft_expect_quiet(&e.p, &e.s->rx, 50, "a receive"));
    FT_EXPECT(ft_check(e.tgt.buf + 3 * 4096, 4096, 33) != 4096,
              "the fenced write was placed before the earlier writes were acknowledged");
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    FT_EXPECT(has_range(ev.u.commit.iov, ev.u.commit.count, e.tgt.raddr + 3 * 4096, 4096),
              "the second commit event lacks the fenced write");
    FT_TRY(durable(&e, 3 * 4096, 4096, 33, "fenced write at its commit event"));
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx[3], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    for (int i = 0; i < 3; i++)
        FT_TRY(durable(&e, 4096 * i, 4096, 30 + i, "earlier write at the fenced completion"));
out:
    return ft_rma_close(r, &e, ret);
}

/* What the manual API refuses, and an application's error reaching the
 * initiator through fi_eq_commit_ack. */
static int t_manual_errors(struct ft_run *r) {
    struct fi_rma_iov rma[33];
    struct fi_eq_commit_entry bogus = {0};
    struct fi_context2 ctx;
    struct ft_comp comp;
    struct ft_eqev ev;
    struct ft_rma e;
    size_t sz = 0, szlen = sizeof(sz);
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    for (int i = 0; i < 33; i++)
        rma[i] = (struct fi_rma_iov){e.tgt.raddr + 64 * (uint64_t)i, 64, e.tgt.key};
    ssize_t rc = fi_eq_register_handler(e.s->eq.eq, FI_CONNECTED, persist_handler, NULL);
    FT_EXPECT(rc == -FI_ENOSYS, "a handler for FI_CONNECTED = %zd, expected -FI_ENOSYS", rc);
    rc = fi_eq_commit_ack(e.s->eq.eq, &bogus, 0);
    FT_EXPECT(rc == -FI_ENOENT, "acknowledging no commit = %zd, expected -FI_ENOENT", rc);
    if (r->opts->ep_type == FI_EP_MSG) {
        FT_CHK(fi_getopt(&e.c->ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &sz, &szlen));
        FT_EXPECT(sz == 51, "FI_OPT_CM_DATA_SIZE %zu, expected 51 (3 bytes name the control QP)",
                  sz);
    }
    FT_POST(&e.p, fi_commit(e.c->ep, rma, 2, e.c->peer, 0, &ctx));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    rc = fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 1);
    FT_EXPECT(rc == -FI_EINVAL, "acknowledging with status 1 = %zd, expected -FI_EINVAL", rc);
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, -FI_ENOSPC));
    rc = fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0);
    FT_EXPECT(rc == -FI_ENOENT, "acknowledging twice = %zd, expected -FI_ENOENT", rc);
    FT_TRY(ft_expect_err(&e.p, &e.c->tx, &ctx, &comp));
    FT_EXPECT(comp.err == FI_ENOSPC, "the initiator got err %d (%s), expected FI_ENOSPC", comp.err,
              fi_strerror(comp.err));
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------- manual-commit ranges */

/*
 * fi_pmof(7): the ranges a commit handler is given lie inside regions the
 * target registered in the endpoint's domain, live, with FI_REMOTE_WRITE,
 * each named by its own key, and FI_PMEM is set only for a region
 * registered with it.  A commit that names anything else is refused
 * (FI_EACCES; FI_EINVAL for a malformed request) before the application
 * hears of it.
 */
enum { RG_PMEM, RG_VOL, RG_NREGIONS };

/* A target application that trusts what it is handed, and a record of
 * everything it was handed that fi_pmof(7) says it never is. */
struct range_guard {
    const struct ft_buf *regions[RG_NREGIONS];
    atomic_int calls;
    atomic_int outside;  /* ranges in none of the regions, under its key */
    atomic_int bad_pmem; /* FI_PMEM other than the regions say */
    atomic_int bad_type;
};

static int guard_region(const struct range_guard *g, const struct fi_rma_iov *v) {
    for (int i = 0; i < RG_NREGIONS; i++) {
        const struct ft_buf *b = g->regions[i];
        if (v->key == b->key && v->addr >= b->raddr && v->len <= b->len &&
            v->addr - b->raddr <= b->len - v->len)
            return i;
    }
    return -1;
}

static ssize_t guard_handler(struct fid_eq *eq, uint64_t type, void *data, uint64_t len,
                             void *context) {
    struct range_guard *g = context;
    const struct fi_eq_commit_entry *ce = data;
    bool pmem = false;

    (void)eq;
    atomic_fetch_add(&g->calls, 1);
    if (type != FI_COMMIT_EVENT || len != sizeof(*ce)) {
        atomic_fetch_add(&g->bad_type, 1);
        return 0;
    }
    for (size_t i = 0; i < ce->count; i++) {
        int k = guard_region(g, &ce->iov[i]);
        if (k < 0) atomic_fetch_add(&g->outside, 1);
        pmem |= k == RG_PMEM;
    }
    if (pmem != ((ce->flags & FI_PMEM) != 0)) atomic_fetch_add(&g->bad_pmem, 1);
    return 0;
}

struct bad_commit {
    const char *what;
    struct fi_rma_iov iov[3];
    size_t count;
    int err; /* the initiator's completion: FI_EACCES or FI_EINVAL */
};

/* One refused commit: the error reaches the initiator, nothing the
 * target application. */
static int refused(struct ft_rma *e, struct range_guard *g, const struct bad_commit *b) {
    struct ft_run *r = e->p.r;
    struct fi_context2 ctx;
    struct ft_comp comp;
    int ret = FT_OK, before = atomic_load(&g->calls);

    FT_POST(&e->p, fi_commit(e->c->ep, b->iov, b->count, e->c->peer, 0, &ctx));
    FT_TRY(ft_expect_err(&e->p, &e->c->tx, &ctx, &comp));
    FT_EXPECT(comp.err == b->err, "commit of %s: the initiator got err %d (%s), expected %d (%s)",
              b->what, comp.err, fi_strerror(comp.err), b->err, fi_strerror(b->err));
    FT_EXPECT(comp.e.op_context == &ctx, "commit of %s: the error names another context", b->what);
    FT_EXPECT(atomic_load(&g->calls) == before,
              "commit of %s: the target's handler was called (%d ranges outside its regions)",
              b->what, atomic_load(&g->outside));
out:
    return ret;
}

/* Writes [off, off+len) of the pattern `seed` to `b` at the same offset. */
static int write_region(struct ft_rma *e, const struct ft_buf *b, size_t off, size_t len,
                        unsigned seed) {
    struct ft_run *r = e->p.r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    ft_fill(e->loc.buf + off, len, seed);
    FT_POST(&e->p, fi_write(e->c->ep, e->loc.buf + off, len, e->loc.desc, e->c->peer,
                            b->raddr + off, b->key, &ctx));
    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ret;
}

/* A valid commit after the refused ones: the handler gets exactly it, with
 * FI_PMEM as the regions say, and the data is there, byte for byte. */
static int accepted(struct ft_rma *e, struct range_guard *g, const struct ft_buf *vol,
                    bool with_pmem, unsigned seed) {
    struct ft_run *r = e->p.r;
    struct fi_rma_iov rma[2];
    struct fi_context2 ctx;
    size_t n = 0;
    int ret = FT_OK, before = atomic_load(&g->calls);

    if (with_pmem) {
        FT_TRY(write_region(e, &e->tgt, 0, 4096, seed));
        rma[n++] = (struct fi_rma_iov){e->tgt.raddr, 4096, e->tgt.key};
    }
    FT_TRY(write_region(e, vol, 64, 64, seed + 1));
    rma[n++] = (struct fi_rma_iov){vol->raddr + 64, 64, vol->key};
    FT_POST(&e->p, fi_commit(e->c->ep, rma, n, e->c->peer, 0, &ctx));
    FT_TRY(expect_commit_done(e, &ctx));
    FT_EXPECT(atomic_load(&g->calls) == before + 1, "a valid commit called the handler %d times",
              atomic_load(&g->calls) - before);
    if (with_pmem) FT_TRY(durable(e, 0, 4096, seed, "persistent region at the commit"));
    FT_TRY(ft_expect_pattern(r, vol->buf + 64, 64, seed + 1, "volatile region at the commit"));
out:
    return ret;
}

static int t_manual_ranges(struct ft_run *r) {
    struct ft_buf vol = {0}, ro = {0}, gone = {0};
    struct range_guard g = {0};
    struct fi_rma_iov over[33];
    struct fi_context2 ctx;
    struct ft_eqev ev;
    struct ft_rma e;
    int ret = manual_open(r, &e);

    FT_TRY(ret);
    /* Regions of the target: the FI_PMEM one of the fixture, a volatile
     * one, one peers may only read, and one closed before the commits. */
    FT_TRY(ft_buf_alloc(&e.p, e.s, 4096, FT_ACC_REMOTE | FT_ACC_LOCAL, 0, &vol));
    FT_TRY(ft_buf_alloc(&e.p, e.s, 4096, FI_REMOTE_READ | FT_ACC_LOCAL, 0, &ro));
    FT_TRY(ft_buf_alloc(&e.p, e.s, 4096, FT_ACC_REMOTE | FT_ACC_LOCAL, 0, &gone));
    FT_CHK(fi_close(&gone.mr->fid));
    gone.mr = NULL;
    g.regions[RG_PMEM] = &e.tgt;
    g.regions[RG_VOL] = &vol;
    FT_CHK(fi_eq_register_handler(e.s->eq.eq, FI_COMMIT_EVENT, guard_handler, &g));

    /* fi_pmof(7): a key is the rkey with the region's class above it. */
    const uint64_t t = e.tgt.raddr, len = e.tgt.len, tk = e.tgt.key, vk = vol.key;
    const uint64_t pmem_class = tk & ~0xffffffffULL, nokey = tk + 12345;
    FT_EXPECT(pmem_class && !(vk & ~0xffffffffULL),
              "keys %#llx (FI_PMEM) and %#llx carry no class above the rkey",
              (unsigned long long)tk, (unsigned long long)vk);
    FT_EXPECT(nokey != vk && nokey != ro.key && nokey != gone.key, "key %#llx is taken",
              (unsigned long long)nokey);
    const struct bad_commit bad[] = {
        {"a range partly past the region's end", {{t + len - 64, 128, tk}}, 1, FI_EACCES},
        {"a range partly before the region", {{t - 64, 128, tk}}, 1, FI_EACCES},
        {"a range one byte longer than the region", {{t, len + 1, tk}}, 1, FI_EACCES},
        {"a range to the end of the address space", {{t, UINT64_MAX - t, tk}}, 1, FI_EACCES},
        {"a range whose address + length wraps", {{t + 64, UINT64_MAX - 8, tk}}, 1, FI_EINVAL},
        {"a key of no region", {{t, 64, nokey}}, 1, FI_EACCES},
        {"key 0", {{t, 64, 0}}, 1, FI_EACCES},
        {"the key of a closed region", {{gone.raddr, 64, gone.key}}, 1, FI_EACCES},
        {"a region without FI_REMOTE_WRITE", {{ro.raddr, 64, ro.key}}, 1, FI_EACCES},
        {"a volatile region's key with FI_PMEM", {{vol.raddr, 64, vk | pmem_class}}, 1, FI_EACCES},
        {"a persistent region's key without FI_PMEM", {{t, 64, tk & 0xffffffffULL}}, 1, FI_EACCES},
        {"one region's memory under another's key", {{t, 64, vk}}, 1, FI_EACCES},
        {"one bad range after good ones",
         {{t, 100, tk}, {vol.raddr, 64, vk}, {t + len - 8, 16, tk}},
         3,
         FI_EACCES},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        FT_TRY(refused(&e, &g, &bad[i]));
        /* The connection serves the next commit as before. */
        if (i % 4 == 3) FT_TRY(accepted(&e, &g, &vol, true, 60 + (unsigned)i));
    }
    /* More ranges than a request holds: refused at the call. */
    for (int i = 0; i < 33; i++)
        over[i] = (struct fi_rma_iov){t + 64 * (uint64_t)i, 64, tk};
    ssize_t rc = fi_commit(e.c->ep, over, 33, e.c->peer, 0, &ctx);
    FT_EXPECT(rc == -FI_EINVAL, "fi_commit of 33 ranges = %zd (%s), expected -FI_EINVAL", rc,
              fi_strerror((int)-rc));
    FT_TRY(accepted(&e, &g, &vol, true, 80));
    FT_TRY(accepted(&e, &g, &vol, false, 82));
    FT_EXPECT(!atomic_load(&g.outside) && !atomic_load(&g.bad_pmem) && !atomic_load(&g.bad_type),
              "the handler was given %d ranges outside the regions, %d wrong FI_PMEM flags",
              atomic_load(&g.outside), atomic_load(&g.bad_pmem));

    /* Without a handler: a refused commit queues no FI_COMMIT_EVENT, so
     * the first one read is the valid commit's. */
    FT_CHK(fi_eq_register_handler(e.s->eq.eq, FI_COMMIT_EVENT, NULL, NULL));
    FT_TRY(refused(&e, &g, &bad[0]));
    FT_TRY(refused(&e, &g, &bad[9])); /* the forged FI_PMEM class */
    FT_TRY(write_region(&e, &vol, 0, 512, 90));
    struct fi_rma_iov ok = {vol.raddr, 512, vk};
    FT_POST(&e.p, fi_commit(e.c->ep, &ok, 1, e.c->peer, 0, &ctx));
    FT_TRY(ft_wait_event(&e.p, &e.s->eq, FI_COMMIT_EVENT, &ev));
    struct commit_check want = {.want = &ok, .count = 1};
    FT_EXPECT(same_ranges(&want, &ev.u.commit),
              "the first FI_COMMIT_EVENT is not the valid commit's (%zu ranges, key %#llx)",
              ev.u.commit.count,
              ev.u.commit.count ? (unsigned long long)ev.u.commit.iov[0].key : 0ULL);
    FT_EXPECT(!(ev.u.commit.flags & FI_PMEM), "FI_PMEM on a commit of a volatile region");
    FT_CHK(fi_eq_commit_ack(e.s->eq.eq, &ev.u.commit, 0));
    FT_TRY(expect_commit_done(&e, &ctx));
    FT_TRY(ft_expect_pattern(r, vol.buf, 512, 90, "volatile region at the commit"));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 50, "after the commits"));
out:
    ret = ft_pair_stop(&e.p, ret);
    if (ft_buf_free(r, &vol)) ret = FT_FAIL;
    if (ft_buf_free(r, &ro)) ret = FT_FAIL;
    if (ft_buf_free(r, &gone)) ret = FT_FAIL;
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------- mixed connections */

/*
 * One end manual, the other not: fi_pmof(7) has such a connection commit
 * through the transport, so its commits complete without the target
 * application and no FI_COMMIT_EVENT reaches either EQ.
 *
 * `plain` is the pair's side (FT_SRV, FT_CLI) without the mode.  The
 * client initiates, unless `target_connects`: then the server does, so
 * that the initiator is the end that accepted the connection (for RDM the
 * client makes it with a send of its own first).  The provider decides
 * differently on the two ends (the connecting one from the reply, the
 * accepting one from the request), so each mixed test runs both ways.
 */
static int mixed_open(struct ft_run *r, struct ft_rma *e, int plain, bool target_connects) {
    struct ft_pair_cfg cfg = {.mode = FI_COMMIT_MANUAL, .rdm_eq = true};
    struct fi_pmof_attr attr;
    struct fi_context2 sctx, rctx;
    int ret;

    cfg.plain[plain] = true;
    ret = pmof_open(r, e, &cfg, &attr);
    FT_TRY(ret);
    for (int i = 0; i < 2; i++) {
        bool manual = (e->p.s[i].info->mode & FI_COMMIT_MANUAL) != 0;
        if (manual == (i == plain))
            return ft_skip(r, "the provider offered no %s info for the %s",
                           manual ? "non-manual" : "FI_COMMIT_MANUAL", e->p.s[i].name);
    }
    if (!target_connects) goto out;
    FT_TRY(ft_buf_free(r, &e->loc));
    FT_TRY(ft_buf_free(r, &e->tgt));
    e->c = &e->p.s[FT_SRV];
    e->s = &e->p.s[FT_CLI];
    FT_TRY(ft_buf_alloc(&e->p, e->c, FT_PMOF_LEN, FT_ACC_LOCAL, 0, &e->loc));
    FT_TRY(ft_buf_alloc(&e->p, e->s, FT_PMOF_LEN, FT_ACC_REMOTE | FT_ACC_LOCAL, FI_PMEM, &e->tgt));
    if (r->opts->ep_type != FI_EP_RDM) goto out;
    FT_POST(&e->p, fi_recv(e->c->ep, e->loc.buf, 64, e->loc.desc, FI_ADDR_UNSPEC, &rctx));
    FT_POST(&e->p, fi_send(e->s->ep, e->tgt.buf, 8, e->tgt.desc, e->s->peer, &sctx));
    FT_TRY(ft_expect_comp(&e->p, &e->s->tx, &sctx, FI_SEND, SIZE_MAX, NULL));
    FT_TRY(ft_expect_comp(&e->p, &e->c->rx, &rctx, FI_RECV, 8, NULL));
out:
    return ret;
}

/* fi_pmof(7) gives the size by the endpoint's mode: an application sizes
 * its connection data before it knows what its peer is. */
static int mixed_cm_data_size(struct ft_rma *e, int plain) {
    struct ft_run *r = e->p.r;
    int ret = FT_OK;

    if (r->opts->ep_type != FI_EP_MSG) return FT_OK;
    for (int i = 0; i < 2; i++) {
        size_t sz = 0, szlen = sizeof(sz), want = i == plain ? 54 : 51;
        FT_CHK(fi_getopt(&e->p.s[i].ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &sz, &szlen));
        FT_EXPECT(sz == want, "%s FI_OPT_CM_DATA_SIZE %zu, expected %zu", e->p.s[i].name, sz, want);
    }
out:
    return ret;
}

/* FI_COMMIT on a write, after a plain write to the same key. */
static int mixed_commit_write(struct ft_rma *e) {
    struct fi_context2 ctx;
    bool observable;
    int ret = FT_OK;

    FT_TRY(dirty_target(e, FT_PMOF_LEN - 64, 64, &observable));
    FT_TRY(post_writemsg(e, 0, 4096, 41, FI_COMMIT | FI_COMPLETION, 0, &ctx));
    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(durable(e, 0, 4096, 41, "target at the mixed FI_COMMIT completion"));
    FT_TRY(durable(e, FT_PMOF_LEN - 64, 64, 77, "earlier plain write at FI_COMMIT completion"));
    FT_TRY(written_back(e, observable, "at the mixed FI_COMMIT completion"));
out:
    return ret;
}

/* fi_commit of more ranges than a manual commit may name (32): the
 * transport takes them. */
#define MIXED_RANGES 33

static int mixed_fi_commit(struct ft_rma *e) {
    struct fi_context2 ctx, wctx[MIXED_RANGES];
    struct fi_rma_iov rma[MIXED_RANGES];
    struct ft_run *r = e->p.r;
    bool observable;
    int ret = FT_OK;

    FT_TRY(dirty_target(e, 0, 64, &observable));
    for (int i = 0; i < MIXED_RANGES; i++) {
        FT_TRY(post_write(e, 1024 * (size_t)i, 100 + (size_t)i, 100 + (unsigned)i, &wctx[i]));
        rma[i] =
            (struct fi_rma_iov){e->tgt.raddr + 1024 * (uint64_t)i, 100 + (uint64_t)i, e->tgt.key};
    }
    for (int i = 0; i < MIXED_RANGES; i++)
        FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &wctx[i], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_POST(&e->p, fi_commit(e->c->ep, rma, MIXED_RANGES, e->c->peer, 0, &ctx));
    FT_TRY(expect_commit_done(e, &ctx));
    for (int i = 0; i < MIXED_RANGES; i++)
        FT_TRY(durable(e, 1024 * (size_t)i, rma[i].len, 100 + (unsigned)i,
                       "range at the mixed fi_commit completion"));
    FT_TRY(written_back(e, observable, "at the mixed fi_commit completion"));
out:
    return ret;
}

/* FI_IMMED: the data reaches the target's CQ once the write is durable,
 * with no acknowledgement of its application in between. */
static int mixed_immed(struct ft_rma *e) {
    struct fi_context2 ctx, rxc;
    struct ft_run *r = e->p.r;
    struct ft_comp comp;
    int ret = FT_OK;

    uint64_t data = e->c->info->domain_attr->cq_data_size >= 4 ? 0x3c3c5678 : 0;
    FT_POST(&e->p, fi_recv(e->s->ep, e->tgt.buf + 32768, 64, e->tgt.desc, FI_ADDR_UNSPEC, &rxc));
    FT_TRY(post_writemsg(e, 0, 512, 42, FI_COMMIT | FI_IMMED | FI_COMPLETION, data, &ctx));
    FT_TRY(ft_expect_comp(&e->p, &e->s->rx, &rxc, FI_REMOTE_CQ_DATA, SIZE_MAX, &comp));
    FT_TRY(durable(e, 0, 512, 42, "target at its mixed FI_IMMED completion"));
    FT_EXPECT(comp.e.data == data, "FI_IMMED data %#llx, expected %#llx",
              (unsigned long long)comp.e.data, (unsigned long long)data);
    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ret;
}

/* FI_FENCE: the earlier plain writes are durable at the fenced commit's
 * completion. */
static int mixed_fenced(struct ft_rma *e) {
    struct fi_context2 ctx[4];
    bool observable;
    int ret = FT_OK;

    FT_TRY(dirty_locally(e, 0, 4 * 4096, &observable));
    for (int i = 0; i < 3; i++)
        FT_TRY(post_write(e, 4096 * (size_t)i, 4096, 43 + (unsigned)i, &ctx[i]));
    FT_TRY(post_writemsg(e, 3 * 4096, 4096, 46, FI_COMMIT | FI_FENCE | FI_COMPLETION, 0, &ctx[3]));
    FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx[3], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    for (int i = 0; i < 4; i++)
        FT_TRY(durable(e, 4096 * (size_t)i, 4096, 43 + (unsigned)i,
                       "write at the mixed fenced commit's completion"));
    FT_TRY(written_back(e, observable, "at the mixed fenced commit's completion"));
    for (int i = 0; i < 3; i++)
        FT_TRY(ft_expect_comp(&e->p, &e->c->tx, &ctx[i], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ret;
}

/* Neither EQ got a commit event, and the target's holds none unanswered
 * (fi_eq_commit_ack of any entry: -FI_ENOENT). */
static int mixed_no_events(struct ft_rma *e) {
    struct fi_eq_commit_entry bogus = {0};
    struct ft_run *r = e->p.r;
    int ret = FT_OK;

    FT_TRY(ft_expect_quiet(&e->p, &e->s->rx, 50, "after the commits"));
    for (int i = 0; i < 2; i++) {
        const struct ft_eq *q = &e->p.s[i].eq;
        for (size_t k = 0; k < q->n; k++)
            FT_EXPECT(q->q[k].is_err || q->q[k].event != FI_COMMIT_EVENT,
                      "FI_COMMIT_EVENT on the %s of a mixed connection", q->name);
    }
    ssize_t rc = fi_eq_commit_ack(e->s->eq.eq, &bogus, 0);
    FT_EXPECT(rc == -FI_ENOENT, "fi_eq_commit_ack on the target's EQ = %zd, expected -FI_ENOENT",
              rc);
out:
    return ret;
}

static int mixed_round(struct ft_run *r, int plain, bool target_connects) {
    struct ft_rma e;
    int ret = mixed_open(r, &e, plain, target_connects);

    FT_TRY(ret);
    FT_TRY(mixed_cm_data_size(&e, plain));
    FT_TRY(mixed_commit_write(&e));
    FT_TRY(mixed_fi_commit(&e));
    FT_TRY(mixed_immed(&e));
    FT_TRY(mixed_fenced(&e));
    FT_TRY(mixed_no_events(&e));
out:
    return ft_rma_close(r, &e, ret);
}

/* `manual_initiator`: the end that writes and commits is the manual one. */
static int mixed(struct ft_run *r, bool manual_initiator) {
    int ret = FT_OK;

    for (int target_connects = 0; target_connects < 2 && ret == FT_OK; target_connects++) {
        int initiator = target_connects ? FT_SRV : FT_CLI;
        ret = mixed_round(r, manual_initiator ? 1 - initiator : initiator, target_connects);
    }
    return ret;
}

static int t_mixed_manual_initiator(struct ft_run *r) {
    return mixed(r, true);
}

static int t_mixed_manual_target(struct ft_run *r) {
    return mixed(r, false);
}

/* ------------------------------------------------------------ elsewhere */

static ssize_t never_called(struct fid_eq *eq, uint64_t type, void *data, uint64_t len,
                            void *context) {
    (void)eq, (void)type, (void)data, (void)len, (void)context;
    return 0;
}

static int wrappers_on(struct ft_pair *p, struct fid_eq *eq) {
    struct ft_side *c = &p->s[FT_CLI];
    struct fi_rma_iov rma = {0, 8, 1};
    struct fi_eq_commit_entry entry = {0};
    struct fi_pmof_attr attr = {.size = sizeof(attr)};
    struct ft_run *r = p->r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    ssize_t rc = fi_commit(c->ep, &rma, 1, c->peer, 0, &ctx);
    FT_EXPECT(rc == -FI_ENOSYS, "fi_commit = %zd (%s)", rc, fi_strerror((int)-rc));
    rc = fi_eq_register_handler(eq, FI_COMMIT_EVENT, never_called, NULL);
    FT_EXPECT(rc == -FI_ENOSYS, "fi_eq_register_handler = %zd (%s)", rc, fi_strerror((int)-rc));
    rc = fi_eq_commit_ack(eq, &entry, 0);
    FT_EXPECT(rc == -FI_ENOSYS, "fi_eq_commit_ack = %zd (%s)", rc, fi_strerror((int)-rc));
    rc = fi_pmof_query(c->domain, &attr);
    FT_EXPECT(rc == -FI_ENOSYS, "fi_pmof_query = %zd (%s)", rc, fi_strerror((int)-rc));
    FT_TRY(ft_expect_quiet(p, &c->tx, 50, "refused fi_commit"));
out:
    return ret;
}

static int t_wrappers_enosys(struct ft_run *r) {
    struct fi_eq_attr ea = {.size = 8, .wait_obj = FI_WAIT_UNSPEC};
    struct fid_eq *own = NULL;
    struct ft_pair p = {0};
    int ret = FT_OK;

    if (ft_is_pmof_prov(r->opts)) return ft_skip(r, "pmof implements the extensions");
    FT_TRY(ft_pair_open(r, &p, NULL));
    struct fid_eq *eq = p.s[FT_SRV].eq.eq;
    if (!eq) FT_CHK(fi_eq_open(p.fabric, &ea, &own, NULL));
    FT_TRY(wrappers_on(&p, eq ? eq : own));
out:
    if (own && fi_close(&own->fid)) ret = ft_fail(r, "fi_close(eq) failed");
    return ft_pair_close(&p, ret);
}

const struct ft_test ft_pmof_tests[] = {
    {"pmof.query", t_query},
    {"pmof.commit_write", t_commit_write},
    {"pmof.commit_complete_default", t_commit_complete_default},
    {"pmof.immed", t_immed},
    {"pmof.immed_alone", t_immed_alone},
    {"pmof.fenced", t_fenced},
    {"pmof.fi_commit", t_fi_commit},
    {"pmof.fi_commit_zero", t_fi_commit_zero},
    {"pmof.fi_commit_badkey", t_fi_commit_badkey},
    {"pmof.manual_handler", t_manual_handler},
    {"pmof.manual_eq", t_manual_eq},
    {"pmof.manual_write", t_manual_write},
    {"pmof.manual_immed", t_manual_immed},
    {"pmof.manual_fenced", t_manual_fenced},
    {"pmof.manual_errors", t_manual_errors},
    {"pmof.manual_ranges", t_manual_ranges},
    {"pmof.mixed_manual_initiator", t_mixed_manual_initiator},
    {"pmof.mixed_manual_target", t_mixed_manual_target},
    {"pmof.wrappers_enosys", t_wrappers_enosys},
    {NULL, NULL},
};
