/* SPDX-License-Identifier: MIT */
/* rma.*: one-sided reads and writes from the client into a region the
 * server registered, plus a few latency/bandwidth figures. */
#include "fabtest.h"

#include <string.h>
#include <time.h>

#include "ft_rma.h"

int ft_rma_open(struct ft_run *r, struct ft_rma *e, const struct ft_pair_cfg *cfg, size_t len,
                uint64_t tgt_flags) {
    int ret = FT_OK;

    memset(e, 0, sizeof(*e));
    FT_TRY(ft_pair_open(r, &e->p, cfg));
    e->c = &e->p.s[FT_CLI];
    e->s = &e->p.s[FT_SRV];
    FT_TRY(ft_buf_alloc(&e->p, e->c, len, FT_ACC_LOCAL, 0, &e->loc));
    FT_TRY(ft_buf_alloc(&e->p, e->s, len, FT_ACC_REMOTE | FT_ACC_LOCAL, tgt_flags, &e->tgt));
out:
    return ret;
}

int ft_rma_close(struct ft_run *r, struct ft_rma *e, int ret) {
    ret = ft_pair_stop(&e->p, ret);
    if (ft_buf_free(r, &e->loc)) ret = FT_FAIL;
    if (ft_buf_free(r, &e->tgt)) ret = FT_FAIL;
    return ft_pair_close(&e->p, ret);
}

/* Without FI_DELIVERY_COMPLETE a write's completion does not promise the
 * data is in the target's memory yet: wait for it, progressing the target. */
int ft_wait_pattern(struct ft_pair *p, const void *buf, size_t len, unsigned seed,
                    const char *what) {
    uint64_t start = ft_now_us();

    while (ft_check(buf, len, seed) != len) {
        if (ft_progress(p)) return FT_FAIL;
        if (ft_now_us() - start > FT_TIMEOUT_MS * 1000ULL)
            return ft_expect_pattern(p->r, buf, len, seed, what);
    }
    return FT_OK;
}

/* ------------------------------------------------------------ write/read */

static int write_one(struct ft_rma *e, size_t len, unsigned seed) {
    struct ft_pair *p = &e->p;
    struct ft_run *r = p->r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    ft_fill(e->loc.buf, len, seed);
    memset(e->tgt.buf, 0, len + (len < e->tgt.len));
    FT_POST(p, fi_write(e->c->ep, e->loc.buf, len, e->loc.desc, e->c->peer, e->tgt.raddr,
                        e->tgt.key, &ctx));
    FT_TRY(ft_expect_comp(p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(ft_wait_pattern(p, e->tgt.buf, len, seed, "written target region"));
    FT_EXPECT(len == e->tgt.len || !e->tgt.buf[len], "write of %zu bytes wrote past its end", len);
out:
    return ret;
}

static int read_one(struct ft_rma *e, size_t len, unsigned seed) {
    struct ft_pair *p = &e->p;
    struct ft_run *r = p->r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    ft_fill(e->tgt.buf, len, seed);
    memset(e->loc.buf, 0, len);
    FT_POST(p, fi_read(e->c->ep, e->loc.buf, len, e->loc.desc, e->c->peer, e->tgt.raddr, e->tgt.key,
                       &ctx));
    FT_TRY(ft_expect_comp(p, &e->c->tx, &ctx, FI_RMA | FI_READ, SIZE_MAX, NULL));
    FT_TRY(ft_expect_pattern(r, e->loc.buf, len, seed, "read data"));
out:
    return ret;
}

static int sweep(struct ft_run *r, int (*one)(struct ft_rma *, size_t, unsigned)) {
    struct ft_rma e;
    size_t sizes[8];
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, FT_MAX_SIZE, 0));
    size_t n = ft_sizes(e.c->info, sizes, 8);
    for (size_t i = 0; i < n; i++)
        FT_TRY(one(&e, sizes[i], (unsigned)i + 20));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_write(struct ft_run *r) {
    return sweep(r, write_one);
}
static int t_read(struct ft_run *r) {
    return sweep(r, read_one);
}

/* ------------------------------------------------------------ vectors */

#define FT_MAX_IOV 4

/* Entry lengths: ones too large to go inline, and ones small enough that
 * the whole list does (a provider gathers them into the request). */
static const size_t ft_large_lens[FT_MAX_IOV] = {300, 4000, 17, 1200};
static const size_t ft_small_lens[FT_MAX_IOV] = {7, 40, 13, 60};

static size_t iovs_of(struct ft_rma *e, struct iovec *iov, void **desc, size_t count,
                      const size_t *lens) {
    size_t off = 0, total = 0;

    for (size_t i = 0; i < count; i++) {
        off += 128;
        iov[i] = (struct iovec){e->loc.buf + off, lens[i]};
        desc[i] = e->loc.desc;
        off += lens[i];
        total += lens[i];
    }
    return total;
}

static size_t local_iovs(struct ft_rma *e, struct iovec *iov, void **desc, size_t count) {
    return iovs_of(e, iov, desc, count, ft_large_lens);
}

static size_t iov_limit(const struct ft_rma *e) {
    size_t lim = e->c->info->tx_attr->iov_limit;
    return lim > FT_MAX_IOV ? FT_MAX_IOV : lim;
}

static int writev_one(struct ft_rma *e, size_t count, const size_t *lens) {
    struct iovec iov[FT_MAX_IOV];
    void *desc[FT_MAX_IOV];
    struct ft_pair *p = &e->p;
    struct ft_run *r = p->r;
    struct fi_context2 ctx;
    int ret = FT_OK;

    memset(e->loc.buf, 0, 8192);
    memset(e->tgt.buf, 0, 8192);
    size_t total = iovs_of(e, iov, desc, count, lens);
    uint8_t stream[8192];
    ft_fill(stream, total, 30 + (unsigned)count);
    for (size_t i = 0, pos = 0; i < count; pos += iov[i].iov_len, i++)
        memcpy(iov[i].iov_base, stream + pos, iov[i].iov_len);
    FT_POST(p, fi_writev(e->c->ep, iov, desc, count, e->c->peer, e->tgt.raddr, e->tgt.key, &ctx));
    FT_TRY(ft_expect_comp(p, &e->c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(ft_wait_pattern(p, e->tgt.buf, total, 30 + (unsigned)count, "target of fi_writev"));
out:
    return ret;
}

static int readv_one(struct ft_rma *e, size_t count) {
    struct iovec iov[FT_MAX_IOV];
    void *desc[FT_MAX_IOV];
    struct ft_pair *p = &e->p;
    struct ft_run *r = p->r;
    struct fi_context2 ctx;
    uint8_t stream[8192];
    int ret = FT_OK;

    memset(e->loc.buf, 0, 8192);
    size_t total = local_iovs(e, iov, desc, count);
    ft_fill(e->tgt.buf, total, 40 + (unsigned)count);
    ft_fill(stream, total, 40 + (unsigned)count);
    FT_POST(p, fi_readv(e->c->ep, iov, desc, count, e->c->peer, e->tgt.raddr, e->tgt.key, &ctx));
    FT_TRY(ft_expect_comp(p, &e->c->tx, &ctx, FI_RMA | FI_READ, SIZE_MAX, NULL));
    for (size_t i = 0, pos = 0; i < count; pos += iov[i].iov_len, i++) {
        FT_EXPECT(!memcmp(iov[i].iov_base, stream + pos, iov[i].iov_len),
                  "fi_readv iov %zu of %zu holds wrong data", i, count);
        FT_EXPECT(!((uint8_t *)iov[i].iov_base)[-1], "fi_readv wrote between iovs");
    }
out:
    return ret;
}

static int t_writev_readv(struct ft_run *r) {
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 65536, 0));
    size_t lim = iov_limit(&e);
    if (lim < 2) {
        ret = ft_skip(r, "tx iov_limit %zu", lim);
        goto out;
    }
    for (size_t count = 2; count <= lim; count++) {
        FT_TRY(writev_one(&e, count, ft_large_lens));
        FT_TRY(writev_one(&e, count, ft_small_lens));
        FT_TRY(readv_one(&e, count));
    }
out:
    return ft_rma_close(r, &e, ret);
}

/* fi_cq_read with count 0 while a successful completion is queued reads
 * nothing: -FI_EAGAIN (or 0), never -FI_EAVAIL, which is for errors only.
 * Two writes complete; a read of one leaves the other queued (the first
 * read takes in everything the device has, after a pause long enough for
 * both on loopback). */
static int t_cq_read_zero(struct ft_run *r) {
    struct ft_rma e;
    struct fi_context2 ctx[2];
    struct fi_cq_tagged_entry ent; /* the harness opens its CQs FI_CQ_FORMAT_TAGGED */
    int ret = FT_OK;
    ssize_t rc;

    FT_TRY(ft_rma_open(r, &e, NULL, 4096, 0));
    /* Others' writes may wait for the application (tcp's do, whatever its
     * data_progress says). */
    if (!ft_is_pmof_prov(r->opts)) {
        ret = ft_skip(r, "needs completions that arrive without a read (pmof)");
        goto out;
    }
    ft_fill(e.loc.buf, 64, 9);
    for (int i = 0; i < 2; i++)
        FT_POST(&e.p, fi_write(e.c->ep, e.loc.buf, 64, e.loc.desc, e.c->peer, e.tgt.raddr,
                               e.tgt.key, &ctx[i]));
    nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL);
    /* The harness keeps what it read for ft_expect_comp; read the CQ raw. */
    FT_EXPECT(e.c->tx.n == 0, "the harness already read %zu completions", e.c->tx.n);
    do {
        rc = fi_cq_read(e.c->tx.cq, &ent, 1);
    } while (rc == -FI_EAGAIN);
    FT_EXPECT(rc == 1, "fi_cq_read(1) = %zd (%s)", rc, fi_strerror((int)-rc));
    rc = fi_cq_read(e.c->tx.cq, &ent, 0);
    FT_EXPECT(rc == -FI_EAGAIN || rc == 0, "fi_cq_read(0) with a success queued = %zd (%s)", rc,
              fi_strerror((int)-rc));
    do {
        rc = fi_cq_read(e.c->tx.cq, &ent, 1);
    } while (rc == -FI_EAGAIN);
    FT_EXPECT(rc == 1 && ent.op_context == &ctx[1], "second completion: %zd", rc);
    /* Only now, the completions read, does this thread see the engine's
     * writes to the target (no earlier synchronisation with its thread). */
    FT_TRY(ft_expect_pattern(r, e.tgt.buf, 64, 9, "written target region"));
out:
    return ft_rma_close(r, &e, ret);
}

static int t_writemsg(struct ft_run *r) {
    struct iovec iov[2];
    void *desc[2];
    struct fi_rma_iov rma[2];
    struct fi_context2 ctx;
    uint8_t stream[8192];
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 65536, 0));
    if (iov_limit(&e) < 2) {
        ret = ft_skip(r, "tx iov_limit %zu", iov_limit(&e));
        goto out;
    }
    size_t nrma = e.c->info->tx_attr->rma_iov_limit >= 2 ? 2 : 1;
    size_t total = local_iovs(&e, iov, desc, 2);
    ft_fill(stream, total, 50);
    memcpy(iov[0].iov_base, stream, iov[0].iov_len);
    memcpy(iov[1].iov_base, stream + iov[0].iov_len, iov[1].iov_len);
    /* Remote ranges split differently from the local ones, 256 bytes apart. */
    size_t half = nrma == 2 ? total / 2 : total;
    rma[0] = (struct fi_rma_iov){e.tgt.raddr, half, e.tgt.key};
    rma[1] = (struct fi_rma_iov){e.tgt.raddr + half + 256, total - half, e.tgt.key};
    struct fi_msg_rma msg = {.msg_iov = iov,
                             .desc = desc,
                             .iov_count = 2,
                             .addr = e.c->peer,
                             .rma_iov = rma,
                             .rma_iov_count = nrma,
                             .context = &ctx};
    FT_POST(&e.p, fi_writemsg(e.c->ep, &msg, FI_COMPLETION));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    FT_TRY(ft_wait_pattern(&e.p, e.tgt.buf, half, 50, "first remote range"));
    if (nrma == 2) {
        FT_EXPECT(!memcmp(e.tgt.buf + half + 256, stream + half, total - half),
                  "second remote range holds wrong data");
        for (size_t i = 0; i < 256; i++)
            FT_EXPECT(!e.tgt.buf[half + i], "gap written");
    } else {
        ft_note(r, "rma_iov_limit 1: one remote range");
    }
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ writedata */

static int t_writedata(struct ft_run *r) {
    struct fi_context2 ctx, rxc;
    struct ft_comp comp;
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 65536, 0));
    size_t dsize = e.c->info->domain_attr->cq_data_size;
    if (!dsize) {
        ret = ft_skip(r, "cq_data_size 0");
        goto out;
    }
    uint64_t data = 0xfedcba9876543210ULL & (dsize >= 8 ? ~0ULL : (1ULL << (8 * dsize)) - 1);
    /* Remote CQ data may consume a posted receive. */
    FT_POST(&e.p, fi_recv(e.s->ep, e.tgt.buf + 32768, 64, e.tgt.desc, FI_ADDR_UNSPEC, &rxc));
    ft_fill(e.loc.buf, 4096, 60);
    FT_POST(&e.p, fi_writedata(e.c->ep, e.loc.buf, 4096, e.loc.desc, data, e.c->peer, e.tgt.raddr,
                               e.tgt.key, &ctx));
    FT_TRY(
        ft_expect_comp(&e.p, &e.s->rx, NULL, FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA, SIZE_MAX, &comp));
    FT_TRY(ft_deviation(r, !(comp.e.flags & FI_RMA),
                        "remote write completion flags %#llx lack FI_RMA",
                        (unsigned long long)comp.e.flags));
    FT_EXPECT(comp.e.data == data, "remote CQ data %#llx, expected %#llx",
              (unsigned long long)comp.e.data, (unsigned long long)data);
    FT_TRY(ft_expect_pattern(r, e.tgt.buf, 4096, 60, "target at its remote completion"));
    ft_note(r, "target completion context %s",
            comp.e.op_context == &rxc ? "= the posted receive" : "not the posted receive");
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ inject */

static int t_inject_write(struct ft_run *r) {
    struct fi_context2 ctx;
    uint8_t src[256];
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 4096, 0));
    size_t len = e.c->info->tx_attr->inject_size;
    if (!len) {
        ret = ft_skip(r, "inject_size 0");
        goto out;
    }
    if (len > sizeof(src)) len = sizeof(src);
    ft_fill(src, len, 70);
    FT_POST(&e.p, fi_inject_write(e.c->ep, src, len, e.c->peer, e.tgt.raddr, e.tgt.key));
    memset(src, 0xee, len);
    if (!(e.c->info->tx_attr->msg_order & FI_ORDER_RAW)) {
        ft_note(r, "no FI_ORDER_RAW: checked at the target");
        FT_TRY(ft_wait_pattern(&e.p, e.tgt.buf, len, 70, "target of fi_inject_write"));
    }
    FT_POST(&e.p,
            fi_read(e.c->ep, e.loc.buf, len, e.loc.desc, e.c->peer, e.tgt.raddr, e.tgt.key, &ctx));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &ctx, FI_RMA | FI_READ, SIZE_MAX, NULL));
    FT_TRY(ft_expect_pattern(r, e.loc.buf, len, 70, "read back after fi_inject_write"));
    FT_TRY(ft_expect_quiet(&e.p, &e.c->tx, 100, "fi_inject_write"));
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ bad key */

static int t_bad_key(struct ft_run *r) {
    struct fi_context2 ctx;
    struct ft_comp comp;
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 4096, 0));
    ft_fill(e.loc.buf, 64, 80);
    FT_POST(&e.p, fi_write(e.c->ep, e.loc.buf, 64, e.loc.desc, e.c->peer, e.tgt.raddr,
                           e.tgt.key + 12345, &ctx));
    FT_TRY(ft_wait_comp(&e.p, &e.c->tx, &ctx, &comp));
    /* libfabric 1.17 tcp completes a write once sent; the target then finds
     * the key unknown and drops the connection, so the error never reaches
     * this write (with FI_DELIVERY_COMPLETE it ends in FI_ECANCELED). */
    if (!ft_strict(r) && (!comp.is_err || (comp.err != FI_EACCES && comp.err != FI_EIO &&
                                           comp.err != FI_EREMOTEIO))) {
        if (comp.is_err)
            ret = ft_skip(r, "%s fails a bad-key write with err %d (%s)", r->opts->prov, comp.err,
                          fi_strerror(comp.err));
        else
            ret = ft_skip(r,
                          "%s completes a bad-key write successfully (keys are checked after "
                          "the initiator's completion)",
                          r->opts->prov);
        goto out;
    }
    FT_EXPECT(comp.is_err, "write with a bad key completed successfully");
    FT_EXPECT(comp.err == FI_EACCES || comp.err == FI_EIO || comp.err == FI_EREMOTEIO,
              "write with a bad key: err %d (%s), expected FI_EACCES, FI_EIO or FI_EREMOTEIO",
              comp.err, fi_strerror(comp.err));
    ft_note(r, "err %s",
            comp.err == FI_EACCES ? "FI_EACCES"
            : comp.err == FI_EIO  ? "FI_EIO"
                                  : "FI_EREMOTEIO");
    FT_EXPECT(ft_check(e.tgt.buf, 64, 80) != 64, "the target region took the write");
out:
    return ft_rma_close(r, &e, ret);
}

/* ------------------------------------------------------------ performance */

#define FT_WINDOW 32

static int batch(struct ft_rma *e, bool write, size_t len, size_t n) {
    struct fi_context2 ctx[FT_WINDOW];
    struct ft_pair *p = &e->p;
    struct ft_run *r = p->r;
    int ret = FT_OK;

    for (size_t i = 0; i < n; i++) {
        if (write)
            FT_POST(p, fi_write(e->c->ep, e->loc.buf, len, e->loc.desc, e->c->peer, e->tgt.raddr,
                                e->tgt.key, &ctx[i]));
        else
            FT_POST(p, fi_read(e->c->ep, e->loc.buf, len, e->loc.desc, e->c->peer, e->tgt.raddr,
                               e->tgt.key, &ctx[i]));
    }
    for (size_t i = 0; i < n; i++)
        FT_TRY(ft_expect_comp(p, &e->c->tx, &ctx[i], FI_RMA | (write ? FI_WRITE : FI_READ),
                              SIZE_MAX, NULL));
out:
    return ret;
}

static int measure(struct ft_run *r, const char *name, bool write, size_t window) {
    static const size_t sizes[] = {64, 65536};
    struct ft_rma e;
    int ret = FT_OK;

    FT_TRY(ft_rma_open(r, &e, NULL, 65536, 0));
    size_t tx_size = e.c->info->tx_attr->size;
    if (window > tx_size && tx_size) window = tx_size;
    for (size_t i = 0; i < 2; i++) {
        size_t iters = sizes[i] == 64 ? 2000 : 200;
        FT_TRY(batch(&e, write, sizes[i], window)); /* warm up */
        uint64_t t0 = ft_now_us();
        for (size_t k = 0; k < iters / window; k++)
            FT_TRY(batch(&e, write, sizes[i], window));
        double us = (double)(ft_now_us() - t0);
        size_t ops = iters / window * window;
        if (window == 1)
            ft_note(r, "%zu B: %.2f us", sizes[i], us / (double)ops);
        else
            ft_note(r, "%zu B: %.1f MB/s", sizes[i], (double)(ops * sizes[i]) / us);
    }
    ft_diag("%s: %s", name, r->note);
out:
    return ft_rma_close(r, &e, ret);
}

static int t_write_lat(struct ft_run *r) {
    return measure(r, "rma.write_lat", true, 1);
}
static int t_write_bw(struct ft_run *r) {
    return measure(r, "rma.write_bw", true, FT_WINDOW);
}
static int t_read_bw(struct ft_run *r) {
    return measure(r, "rma.read_bw", false, FT_WINDOW);
}

const struct ft_test ft_rma_tests[] = {
    {"rma.write", t_write},
    {"rma.read", t_read},
    {"rma.writev_readv", t_writev_readv},
    {"rma.writemsg", t_writemsg},
    {"rma.cq_read_zero", t_cq_read_zero},
    {"rma.writedata", t_writedata},
    {"rma.inject_write", t_inject_write},
    {"rma.bad_key", t_bad_key},
    {"rma.write_lat", t_write_lat},
    {"rma.write_bw", t_write_bw},
    {"rma.read_bw", t_read_bw},
    {NULL, NULL},
};
