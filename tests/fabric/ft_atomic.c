/* SPDX-License-Identifier: MIT */
/* atomic.*: fi_atomic, fi_fetch_atomic, fi_compare_atomic on 64-bit words
 * of the target, the *valid calls and fi_query_atomic.  A provider without
 * FI_ATOMIC skips them. */
#include "fabtest.h"

#include <rdma/fi_atomic.h>
#include <string.h>

#include "ft_rma.h"

#define FT_ATOMIC_LEN 4096

/* An RMA pair whose hints ask FI_ATOMIC; skips if the provider has none. */
static int atomic_open(struct ft_run *r, struct ft_rma *e) {
    struct fi_info *hints = ft_hints(r->opts, r->opts->ep_type), *info = NULL;
    struct ft_pair_cfg cfg = {.caps = FI_ATOMIC};
    int ret = FT_OK, rc;

    memset(e, 0, sizeof(*e));
    FT_EXPECT(hints, "out of memory");
    hints->caps |= FI_ATOMIC;
    FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
    if (rc == -FI_ENODATA) {
        ret = ft_skip(r, "%s offers no FI_ATOMIC", r->opts->prov);
        goto out;
    }
    FT_EXPECT(!rc, "fi_getinfo(FI_ATOMIC) = %d (%s)", rc, fi_strerror(-rc));
    FT_EXPECT(info->caps & FI_ATOMIC, "info caps %#llx lack FI_ATOMIC",
              (unsigned long long)info->caps);
    FT_TRY(ft_rma_open(r, e, &cfg, FT_ATOMIC_LEN, 0));
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static uint64_t *word(struct ft_rma *e, size_t off) {
    return (uint64_t *)((uint8_t *)e->tgt.buf + off);
}

/* One operation's completion on the initiator's transmit CQ. */
static int wait_atomic(struct ft_rma *e, void *ctx, uint64_t dir) {
    return ft_expect_comp(&e->p, &e->c->tx, ctx, FI_ATOMIC | dir, SIZE_MAX, NULL);
}

static int t_valid(struct ft_run *r) {
    struct ft_rma e;
    struct fi_atomic_attr attr;
    size_t count = 0;
    int ret = atomic_open(r, &e), rc;

    FT_TRY(ret);
    FT_CHK(fi_atomicvalid(e.c->ep, FI_UINT64, FI_SUM, &count));
    FT_EXPECT(count >= 1, "fi_atomicvalid(FI_UINT64, FI_SUM) count %zu", count);
    FT_CHK(fi_fetch_atomicvalid(e.c->ep, FI_UINT64, FI_ATOMIC_READ, &count));
    FT_CHK(fi_compare_atomicvalid(e.c->ep, FI_UINT64, FI_CSWAP, &count));
    FT_CHK(fi_query_atomic(e.c->domain, FI_UINT64, FI_CSWAP, &attr, FI_COMPARE_ATOMIC));
    FT_EXPECT(attr.size == 8, "fi_query_atomic size %zu", attr.size);
    if (ft_is_pmof_prov(r->opts)) {
        /* What a 64-bit verbs atomic cannot do is refused, not emulated. */
        rc = fi_atomicvalid(e.c->ep, FI_UINT8, FI_SUM, &count);
        FT_EXPECT(rc == -FI_EOPNOTSUPP, "fi_atomicvalid(FI_UINT8) = %d", rc);
        rc = fi_atomicvalid(e.c->ep, FI_UINT64, FI_PROD, &count);
        FT_EXPECT(rc == -FI_EOPNOTSUPP, "fi_atomicvalid(FI_PROD) = %d", rc);
        rc = fi_query_atomic(e.c->domain, FI_DOUBLE, FI_SUM, &attr, 0);
        FT_EXPECT(rc == -FI_EOPNOTSUPP, "fi_query_atomic(FI_DOUBLE) = %d", rc);
    }
out:
    return ft_rma_close(r, &e, ret);
}

/* FI_SUM with and without the old value, then FI_ATOMIC_READ. */
static int t_fetch_add(struct ft_run *r) {
    struct ft_rma e;
    struct fi_context2 ctx;
    int ret = atomic_open(r, &e);
    uint64_t *res, add = 2;

    FT_TRY(ret);
    res = (uint64_t *)e.loc.buf;
    *word(&e, 64) = 40;
    *res = 0;
    FT_POST(&e.p, fi_fetch_atomic(e.c->ep, &add, 1, NULL, res, e.loc.desc, e.c->peer,
                                  e.tgt.raddr + 64, e.tgt.key, FI_UINT64, FI_SUM, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_READ));
    FT_EXPECT(*res == 40, "fetch-and-add returned %llu, expected 40", (unsigned long long)*res);
    FT_EXPECT(*word(&e, 64) == 42, "target %llu after +2", (unsigned long long)*word(&e, 64));
    add = 3;
    FT_POST(&e.p, fi_atomic(e.c->ep, &add, 1, NULL, e.c->peer, e.tgt.raddr + 64, e.tgt.key,
                            FI_UINT64, FI_SUM, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_WRITE));
    FT_POST(&e.p, fi_fetch_atomic(e.c->ep, NULL, 1, NULL, res, e.loc.desc, e.c->peer,
                                  e.tgt.raddr + 64, e.tgt.key, FI_UINT64, FI_ATOMIC_READ, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_READ));
    FT_EXPECT(*res == 45, "atomic read returned %llu, expected 45", (unsigned long long)*res);
    FT_EXPECT(*word(&e, 64) == 45, "target %llu after +3", (unsigned long long)*word(&e, 64));
out:
    return ft_rma_close(r, &e, ret);
}

/* A compare-and-swap that matches, then one that does not. */
static int t_cswap(struct ft_run *r) {
    struct ft_rma e;
    struct fi_context2 ctx;
    int ret = atomic_open(r, &e);
    uint64_t *res, swap = 7, cmp = 45;

    FT_TRY(ret);
    res = (uint64_t *)e.loc.buf;
    *word(&e, 128) = 45;
    FT_POST(&e.p, fi_compare_atomic(e.c->ep, &swap, 1, NULL, &cmp, NULL, res, e.loc.desc, e.c->peer,
                                    e.tgt.raddr + 128, e.tgt.key, FI_UINT64, FI_CSWAP, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_READ));
    FT_EXPECT(*res == 45 && *word(&e, 128) == 7, "matching CSWAP: old %llu, target %llu",
              (unsigned long long)*res, (unsigned long long)*word(&e, 128));
    swap = 1;
    cmp = 99;
    FT_POST(&e.p, fi_compare_atomic(e.c->ep, &swap, 1, NULL, &cmp, NULL, res, e.loc.desc, e.c->peer,
                                    e.tgt.raddr + 128, e.tgt.key, FI_UINT64, FI_CSWAP, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_READ));
    FT_EXPECT(*res == 7 && *word(&e, 128) == 7, "failing CSWAP: old %llu, target %llu",
              (unsigned long long)*res, (unsigned long long)*word(&e, 128));
out:
    return ft_rma_close(r, &e, ret);
}

/* FI_ATOMIC_WRITE, where offered (an IBTA ATOMIC WRITE on pmof). */
static int t_write(struct ft_run *r) {
    struct ft_rma e;
    struct fi_context2 ctx;
    size_t count;
    int ret = atomic_open(r, &e);
    uint64_t v = 0x1122334455667788ull;

    FT_TRY(ret);
    if (fi_atomicvalid(e.c->ep, FI_UINT64, FI_ATOMIC_WRITE, &count)) {
        ret = ft_skip(r, "FI_ATOMIC_WRITE is not offered");
        goto out;
    }
    FT_POST(&e.p, fi_atomic(e.c->ep, &v, 1, NULL, e.c->peer, e.tgt.raddr + 256, e.tgt.key,
                            FI_UINT64, FI_ATOMIC_WRITE, &ctx));
    FT_TRY(wait_atomic(&e, &ctx, FI_WRITE));
    FT_EXPECT(*word(&e, 256) == v, "target %#llx after FI_ATOMIC_WRITE",
              (unsigned long long)*word(&e, 256));
out:
    return ft_rma_close(r, &e, ret);
}

/* The target executes only naturally aligned words; pmof says so at once. */
static int t_misaligned(struct ft_run *r) {
    struct ft_rma e;
    struct fi_context2 ctx;
    int ret, rc;
    uint64_t add = 1;

    if (!ft_is_pmof_prov(r->opts)) return ft_skip(r, "pmof's argument check");
    ret = atomic_open(r, &e);
    FT_TRY(ret);
    rc = (int)fi_atomic(e.c->ep, &add, 1, NULL, e.c->peer, e.tgt.raddr + 4, e.tgt.key, FI_UINT64,
                        FI_SUM, &ctx);
    FT_EXPECT(rc == -FI_EINVAL, "fi_atomic at a misaligned address = %d, expected -FI_EINVAL", rc);
    rc = (int)fi_atomic(e.c->ep, &add, 2, NULL, e.c->peer, e.tgt.raddr, e.tgt.key, FI_UINT64,
                        FI_SUM, &ctx);
    FT_EXPECT(rc == -FI_EINVAL, "fi_atomic of 2 elements = %d, expected -FI_EINVAL", rc);
out:
    return ft_rma_close(r, &e, ret);
}

const struct ft_test ft_atomic_tests[] = {
    {"atomic.valid", t_valid}, {"atomic.fetch_add", t_fetch_add},   {"atomic.cswap", t_cswap},
    {"atomic.write", t_write}, {"atomic.misaligned", t_misaligned}, {NULL, NULL},
};
