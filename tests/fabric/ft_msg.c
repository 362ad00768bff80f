/* SPDX-License-Identifier: MIT */
/* msg.*: connection management (FI_EP_MSG) and two-sided messages (both
 * endpoint types). */
#include "fabtest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int need_msg(struct ft_run *r) {
    return r->opts->ep_type == FI_EP_MSG ? FT_OK
                                         : ft_skip(r, "connection management is FI_EP_MSG only");
}

static struct ft_side *other(struct ft_pair *p, struct ft_side *s) {
    return s == &p->s[FT_SRV] ? &p->s[FT_CLI] : &p->s[FT_SRV];
}

/* ------------------------------------------------------------ connect */

static int check_connreq(struct ft_pair *p, const struct ft_eqev *ev) {
    struct ft_run *r = p->r;
    int ret = FT_OK;

    FT_EXPECT(ev->len >= (ssize_t)sizeof(struct fi_eq_cm_entry), "FI_CONNREQ entry length %zd",
              ev->len);
    FT_EXPECT(ev->u.cm.fid == &p->pep->fid, "FI_CONNREQ fid %p, expected the passive endpoint %p",
              (void *)ev->u.cm.fid, (void *)&p->pep->fid);
    FT_EXPECT(ev->u.cm.info, "FI_CONNREQ without info");
    FT_EXPECT(ev->u.cm.info->handle, "FI_CONNREQ info without handle");
    FT_EXPECT(!strcmp(ev->u.cm.info->fabric_attr->prov_name, r->opts->prov),
              "FI_CONNREQ info of provider '%s'", ev->u.cm.info->fabric_attr->prov_name);
out:
    return ret;
}

static int expect_connected(struct ft_pair *p, struct ft_side *s) {
    struct ft_run *r = p->r;
    struct ft_eqev ev;
    int ret = FT_OK;

    FT_TRY(ft_wait_event(p, &s->eq, FI_CONNECTED, &ev));
    FT_EXPECT(ev.u.cm.fid == &s->ep->fid, "%s FI_CONNECTED fid %p, expected %p", s->name,
              (void *)ev.u.cm.fid, (void *)&s->ep->fid);
    FT_EXPECT(ev.len == (ssize_t)sizeof(struct fi_eq_cm_entry),
              "%s FI_CONNECTED entry length %zd, expected %zu", s->name, ev.len,
              sizeof(struct fi_eq_cm_entry));
out:
    return ret;
}

static int t_connect(struct ft_run *r) {
    struct ft_pair p = {0};
    struct ft_eqev ev;
    int ret = need_msg(r);

    FT_TRY(ret);
    FT_TRY(ft_pair_prepare(r, &p, NULL));
    FT_TRY(ft_msg_listen(&p));
    FT_TRY(ft_msg_client(&p, NULL, NULL, 0));
    FT_TRY(ft_wait_event(&p, &p.s[FT_SRV].eq, FI_CONNREQ, &ev));
    ret = check_connreq(&p, &ev);
    if (ret) {
        fi_freeinfo(ev.u.cm.info);
        goto out;
    }
    FT_TRY(ft_msg_accept(&p, ev.u.cm.info));
    FT_TRY(expect_connected(&p, &p.s[FT_SRV]));
    FT_TRY(expect_connected(&p, &p.s[FT_CLI]));
out:
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ pingpong */

struct side_bufs {
    struct ft_buf tx, rx;
};

static int bufs_alloc(struct ft_pair *p, size_t len, struct side_bufs *b) {
    int ret = FT_OK;

    for (int i = 0; i < 2; i++) {
        FT_TRY(ft_buf_alloc(p, &p->s[i], len, FT_ACC_LOCAL, 0, &b[i].tx));
        FT_TRY(ft_buf_alloc(p, &p->s[i], len, FT_ACC_LOCAL, 0, &b[i].rx));
    }
out:
    return ret;
}

static int bufs_free(struct ft_run *r, struct ft_pair *p, struct side_bufs *b, int ret) {
    ret = ft_pair_stop(p, ret);
    for (int i = 0; i < 2; i++) {
        if (ft_buf_free(r, &b[i].tx)) ret = FT_FAIL;
        if (ft_buf_free(r, &b[i].rx)) ret = FT_FAIL;
    }
    return ret;
}

/* `from` sends `len` patterned bytes to the other side, into a receive
 * posted beforehand; both completions and the data are checked. */
static int one_way(struct ft_pair *p, struct side_bufs *b, int from, size_t len, unsigned seed) {
    struct ft_side *s = &p->s[from], *d = &p->s[1 - from];
    struct ft_buf *tx = &b[from].tx, *rx = &b[1 - from].rx;
    struct fi_context2 txc, rxc;
    struct ft_run *r = p->r;
    int ret = FT_OK;

    ft_fill(tx->buf, len, seed);
    memset(rx->buf, 0, len);
    FT_POST(p, fi_recv(d->ep, rx->buf, len, rx->desc, FI_ADDR_UNSPEC, &rxc));
    FT_POST(p, fi_send(s->ep, tx->buf, len, tx->desc, s->peer, &txc));
    FT_TRY(ft_expect_comp(p, &d->rx, &rxc, FI_RECV | FI_MSG, len, NULL));
    FT_TRY(ft_expect_pattern(r, rx->buf, len, seed, "received message"));
    FT_TRY(ft_expect_comp(p, &s->tx, &txc, FI_SEND | FI_MSG, SIZE_MAX, NULL));
out:
    return ret;
}

static int t_pingpong(struct ft_run *r) {
    struct side_bufs b[2] = {0};
    struct ft_pair p = {0};
    size_t sizes[8];
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    size_t n = ft_sizes(p.s[FT_CLI].info, sizes, 8);
    FT_TRY(bufs_alloc(&p, sizes[n - 1], b));
    for (size_t i = 0; i < n; i++) {
        FT_TRY(one_way(&p, b, FT_CLI, sizes[i], (unsigned)i));
        FT_TRY(one_way(&p, b, FT_SRV, sizes[i], (unsigned)i + 100));
    }
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ device memory */

/* A mock device: its "device memory" is host memory only these copies may
 * touch, and they count how often the provider calls them. */
static unsigned hmem_from_calls, hmem_to_calls;

/* Copies between buf and the iov, starting `offset` bytes into the iov. */
static size_t iov_copy(const struct iovec *iov, size_t count, uint64_t offset, void *buf,
                       size_t size, bool to_iov) {
    size_t done = 0;

    for (size_t i = 0; i < count && done < size; i++) {
        if (offset >= iov[i].iov_len) {
            offset -= iov[i].iov_len;
            continue;
        }
        size_t n = iov[i].iov_len - offset < size - done ? iov[i].iov_len - offset : size - done;
        uint8_t *dev = (uint8_t *)iov[i].iov_base + offset, *host = (uint8_t *)buf + done;
        memcpy(to_iov ? dev : host, to_iov ? host : dev, n);
        done += n;
        offset = 0;
    }
    return done;
}

static ssize_t mock_copy_from(void *dest, size_t size, enum fi_hmem_iface iface, uint64_t device,
                              const struct iovec *iov, size_t count, uint64_t offset) {
    (void)iface, (void)device;
    __atomic_add_fetch(&hmem_from_calls, 1, __ATOMIC_RELAXED);
    return (ssize_t)iov_copy(iov, count, offset, dest, size, false);
}

static ssize_t mock_copy_to(enum fi_hmem_iface iface, uint64_t device, const struct iovec *iov,
                            size_t count, uint64_t offset, const void *src, size_t size) {
    (void)iface, (void)device;
    __atomic_add_fetch(&hmem_to_calls, 1, __ATOMIC_RELAXED);
    return (ssize_t)iov_copy(iov, count, offset, (void *)src, size, true);
}

static int reg_device(struct ft_side *s, void *buf, size_t len, uint64_t access,
                      struct fid_mr **mr) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct fi_mr_attr attr = {
        .mr_iov = &iov,
        .iov_count = 1,
        .access = access,
        .requested_key = s->next_key++,
        .iface = FI_HMEM_ZE,
    };

    return fi_mr_regattr(s->domain, &attr, 0, mr);
}

/* Messages from and into device memory go through the application's copy
 * routines, the override ops of the OFIWG proposal "API for Libfabric
 * Overrides" (May 2020): both directions, inline-sized and not. */
static int t_hmem_override(struct ft_run *r) {
    struct fi_hmem_override_ops ops = {
        .size = sizeof(ops),
        .copy_from_hmem_iov = mock_copy_from,
        .copy_to_hmem_iov = mock_copy_to,
    };
    struct ft_pair_cfg cfg = {.hmem = &ops};
    struct ft_pair p = {0};
    struct fid_mr *txmr = NULL, *rxmr = NULL, *bad = NULL;
    static uint8_t txdev[65536], rxdev[65536];
    struct fi_context2 txc, rxc;
    int ret = FT_OK;

    if (!ft_strict(r))
        return ft_skip(r, "the override ops are pmof's (other providers: -FI_ENOSYS)");
    FT_TRY(ft_pair_open(r, &p, &cfg));
    struct ft_side *c = &p.s[FT_CLI], *s = &p.s[FT_SRV];
    FT_CHK(reg_device(c, txdev, sizeof(txdev), FI_SEND, &txmr));
    FT_CHK(reg_device(s, rxdev, sizeof(rxdev), FI_RECV, &rxmr));
    /* Peers cannot reach device memory through its host copy. */
    int rc = reg_device(s, rxdev, 4096, FI_REMOTE_WRITE, &bad);
    if (rc) bad = NULL;
    FT_EXPECT(rc == -FI_EOPNOTSUPP,
              "device memory for FI_REMOTE_WRITE: %d, expected -FI_EOPNOTSUPP", rc);
    static const size_t lens[] = {64, 65536};
    for (unsigned i = 0; i < 2; i++) {
        unsigned from0 = hmem_from_calls, to0 = hmem_to_calls;
        ft_fill(txdev, lens[i], 40 + i);
        memset(rxdev, 0, lens[i]);
        FT_POST(&p, fi_recv(s->ep, rxdev, lens[i], fi_mr_desc(rxmr), FI_ADDR_UNSPEC, &rxc));
        FT_POST(&p, fi_send(c->ep, txdev, lens[i], fi_mr_desc(txmr), c->peer, &txc));
        FT_TRY(ft_expect_comp(&p, &s->rx, &rxc, FI_RECV | FI_MSG, lens[i], NULL));
        FT_TRY(ft_expect_comp(&p, &c->tx, &txc, FI_SEND | FI_MSG, SIZE_MAX, NULL));
        FT_TRY(ft_expect_pattern(r, rxdev, lens[i], 40 + i, "message in device memory"));
        FT_EXPECT(hmem_from_calls > from0 && hmem_to_calls > to0,
                  "%zu B: copy_from_hmem_iov called %u times, copy_to_hmem_iov %u times", lens[i],
                  hmem_from_calls - from0, hmem_to_calls - to0);
    }
    ft_note(r, "copy_from_hmem_iov %u calls, copy_to_hmem_iov %u calls", hmem_from_calls,
            hmem_to_calls);
out:
    ret = ft_pair_stop(&p, ret);
    if (bad) fi_close(&bad->fid);
    if (txmr) fi_close(&txmr->fid);
    if (rxmr) fi_close(&rxmr->fid);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ sendv/recvv */

#define FT_MAX_IOV 4

/* Places `count` segments of the given lengths at gapped offsets of buf. */
static size_t layout(struct iovec *iov, uint8_t *buf, const size_t *lens, size_t count) {
    size_t off = 0, total = 0;

    for (size_t i = 0; i < count; i++) {
        off += 64; /* a gap that must stay untouched */
        iov[i] = (struct iovec){buf + off, lens[i]};
        off += lens[i];
        total += lens[i];
    }
    return total;
}

static int iov_exchange(struct ft_pair *p, struct side_bufs *b, size_t count) {
    static const size_t tx_lens[FT_MAX_IOV] = {100, 3000, 7, 1000};
    static const size_t rx_lens[FT_MAX_IOV] = {1000, 7, 100, 3000};
    struct ft_side *c = &p->s[FT_CLI], *s = &p->s[FT_SRV];
    struct iovec txv[FT_MAX_IOV], rxv[FT_MAX_IOV];
    void *txd[FT_MAX_IOV], *rxd[FT_MAX_IOV];
    uint8_t stream[8192];
    struct fi_context2 txc, rxc;
    struct ft_run *r = p->r;
    int ret = FT_OK;

    /* Receive lengths are a permutation only when all four are used. */
    const size_t *rl = count == FT_MAX_IOV ? rx_lens : tx_lens;
    size_t total = layout(txv, b[FT_CLI].tx.buf, tx_lens, count);
    layout(rxv, b[FT_SRV].rx.buf, rl, count);
    ft_fill(stream, total, 9);
    for (size_t i = 0, pos = 0; i < count; pos += txv[i].iov_len, i++) {
        memcpy(txv[i].iov_base, stream + pos, txv[i].iov_len);
        txd[i] = b[FT_CLI].tx.desc;
        rxd[i] = b[FT_SRV].rx.desc;
    }
    FT_POST(p, fi_recvv(s->ep, rxv, rxd, count, FI_ADDR_UNSPEC, &rxc));
    FT_POST(p, fi_sendv(c->ep, txv, txd, count, c->peer, &txc));
    FT_TRY(ft_expect_comp(p, &s->rx, &rxc, FI_RECV | FI_MSG, total, NULL));
    FT_TRY(ft_expect_comp(p, &c->tx, &txc, FI_SEND | FI_MSG, SIZE_MAX, NULL));
    for (size_t i = 0, pos = 0; i < count; pos += rxv[i].iov_len, i++) {
        FT_EXPECT(!memcmp(rxv[i].iov_base, stream + pos, rxv[i].iov_len),
                  "receive iov %zu of %zu holds wrong data", i, count);
        const uint8_t *gap = (const uint8_t *)rxv[i].iov_base - 64;
        for (int k = 0; k < 64; k++)
            FT_EXPECT(!gap[k], "bytes between receive iovs written");
    }
out:
    return ret;
}

static int t_sendv(struct ft_run *r) {
    struct side_bufs b[2] = {0};
    struct ft_pair p = {0};
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    size_t lim = p.s[FT_CLI].info->tx_attr->iov_limit;
    if (p.s[FT_SRV].info->rx_attr->iov_limit < lim) lim = p.s[FT_SRV].info->rx_attr->iov_limit;
    if (lim > FT_MAX_IOV) lim = FT_MAX_IOV;
    if (lim < 2) {
        ret = ft_skip(r, "iov_limit %zu", lim);
        goto out;
    }
    FT_TRY(bufs_alloc(&p, 16384, b));
    for (size_t count = 2; count <= lim; count++) {
        memset(b[FT_SRV].rx.buf, 0, b[FT_SRV].rx.len);
        FT_TRY(iov_exchange(&p, b, count));
    }
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ inject */

static int inject_one(struct ft_pair *p, struct side_bufs *b, size_t len) {
    struct ft_side *c = &p->s[FT_CLI], *s = &p->s[FT_SRV];
    struct ft_buf *rx = &b[FT_SRV].rx;
    struct ft_run *r = p->r;
    struct fi_context2 rxc;
    uint8_t src[4096];
    int ret = FT_OK;

    ft_fill(src, len, 3);
    memset(rx->buf, 0, len);
    FT_POST(p, fi_recv(s->ep, rx->buf, len, rx->desc, FI_ADDR_UNSPEC, &rxc));
    FT_POST(p, fi_inject(c->ep, src, len, c->peer));
    /* fi_inject returns with the buffer free for reuse. */
    memset(src, 0xee, len);
    FT_TRY(ft_expect_comp(p, &s->rx, &rxc, FI_RECV | FI_MSG, len, NULL));
    FT_TRY(ft_expect_pattern(r, rx->buf, len, 3, "injected message"));
    FT_TRY(ft_expect_quiet(p, &c->tx, 100, "fi_inject"));
out:
    return ret;
}

static int t_inject(struct ft_run *r) {
    struct side_bufs b[2] = {0};
    struct ft_pair p = {0};
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    size_t max = p.s[FT_CLI].info->tx_attr->inject_size;
    if (!max) {
        ret = ft_skip(r, "inject_size 0");
        goto out;
    }
    if (max > 4096) max = 4096;
    FT_TRY(bufs_alloc(&p, 4096, b));
    FT_TRY(inject_one(&p, b, 1));
    FT_TRY(inject_one(&p, b, max));
    ft_note(r, "inject_size %zu", p.s[FT_CLI].info->tx_attr->inject_size);
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ selective */

static int t_selective(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.tx_bind_flags = FI_SELECTIVE_COMPLETION};
    struct fi_context2 quiet_ctx, loud_ctx, rxc[2];
    struct side_bufs b[2] = {0};
    struct ft_pair p = {0};
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, &cfg));
    struct ft_side *c = &p.s[FT_CLI], *s = &p.s[FT_SRV];
    FT_TRY(bufs_alloc(&p, 4096, b));
    struct ft_buf *tx = &b[FT_CLI].tx, *rx = &b[FT_SRV].rx;
    ft_fill(tx->buf, 4096, 5);
    for (int i = 0; i < 2; i++)
        FT_POST(&p, fi_recv(s->ep, rx->buf + 2048 * i, 2048, rx->desc, FI_ADDR_UNSPEC, &rxc[i]));
    FT_POST(&p, fi_send(c->ep, tx->buf, 2048, tx->desc, c->peer, &quiet_ctx));
    struct iovec iov = {tx->buf + 2048, 2048};
    struct fi_msg msg = {
        .msg_iov = &iov, .desc = &tx->desc, .iov_count = 1, .addr = c->peer, .context = &loud_ctx};
    FT_POST(&p, fi_sendmsg(c->ep, &msg, FI_COMPLETION));
    for (int i = 0; i < 2; i++)
        FT_TRY(ft_expect_comp(&p, &s->rx, &rxc[i], FI_RECV | FI_MSG, 2048, NULL));
    FT_TRY(ft_expect_pattern(r, rx->buf, 4096, 5, "received messages"));
    FT_TRY(ft_expect_comp(&p, &c->tx, &loud_ctx, FI_SEND | FI_MSG, SIZE_MAX, NULL));
    FT_TRY(ft_expect_quiet(&p, &c->tx, 100, "send without FI_COMPLETION"));
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ senddata */

static uint64_t data_mask(const struct fi_info *info) {
    size_t n = info->domain_attr->cq_data_size;
    return n >= 8 ? ~0ULL : (1ULL << (8 * n)) - 1;
}

static int t_senddata(struct ft_run *r) {
    struct side_bufs b[2] = {0};
    struct fi_context2 txc, rxc;
    struct ft_pair p = {0};
    struct ft_comp comp;
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    struct ft_side *c = &p.s[FT_CLI], *s = &p.s[FT_SRV];
    if (!c->info->domain_attr->cq_data_size) {
        ret = ft_skip(r, "cq_data_size 0");
        goto out;
    }
    uint64_t data = 0x0123456789abcdefULL & data_mask(c->info);
    FT_TRY(bufs_alloc(&p, 4096, b));
    ft_fill(b[FT_CLI].tx.buf, 256, 11);
    FT_POST(&p, fi_recv(s->ep, b[FT_SRV].rx.buf, 4096, b[FT_SRV].rx.desc, FI_ADDR_UNSPEC, &rxc));
    FT_POST(&p, fi_senddata(c->ep, b[FT_CLI].tx.buf, 256, b[FT_CLI].tx.desc, data, c->peer, &txc));
    FT_TRY(ft_expect_comp(&p, &s->rx, &rxc, FI_RECV | FI_MSG | FI_REMOTE_CQ_DATA, 256, &comp));
    FT_EXPECT(comp.e.data == data, "CQ data %#llx, expected %#llx", (unsigned long long)comp.e.data,
              (unsigned long long)data);
    FT_TRY(ft_expect_pattern(r, b[FT_SRV].rx.buf, 256, 11, "received message"));
    FT_TRY(ft_expect_comp(&p, &c->tx, &txc, FI_SEND | FI_MSG, SIZE_MAX, NULL));
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ truncation */

static int t_rx_too_small(struct ft_run *r) {
    struct side_bufs b[2] = {0};
    struct fi_context2 txc, rxc;
    struct ft_pair p = {0};
    struct ft_comp comp;
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    struct ft_side *c = &p.s[FT_CLI], *s = &p.s[FT_SRV];
    FT_TRY(bufs_alloc(&p, 4096, b));
    ft_fill(b[FT_CLI].tx.buf, 64, 1);
    FT_POST(&p, fi_recv(s->ep, b[FT_SRV].rx.buf, 16, b[FT_SRV].rx.desc, FI_ADDR_UNSPEC, &rxc));
    FT_POST(&p, fi_send(c->ep, b[FT_CLI].tx.buf, 64, b[FT_CLI].tx.desc, c->peer, &txc));
    FT_TRY(ft_expect_err(&p, &s->rx, &rxc, &comp));
    FT_EXPECT(comp.err == FI_ETRUNC || comp.err == FI_EIO,
              "truncated receive completed with err %d (%s), expected FI_ETRUNC or FI_EIO",
              comp.err, fi_strerror(comp.err));
    ft_note(r, "receiver err %s", comp.err == FI_ETRUNC ? "FI_ETRUNC" : "FI_EIO");
    /* A verbs receiver is not told how long the message was: olen 0
     * says "unknown". */
    FT_TRY(ft_deviation(r, comp.err == FI_ETRUNC && comp.olen != 48 && comp.olen != 0,
                        "FI_ETRUNC with olen %zu, expected 48 (or 0, unknown)", comp.olen));
    if (comp.err == FI_ETRUNC && !comp.olen) ft_note(r, "olen 0: overflow length unknown");
    FT_TRY(ft_wait_comp(&p, &c->tx, &txc, &comp));
    if (comp.is_err) ft_note(r, "sender err %d (%s)", comp.err, fi_strerror(comp.err));
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ reject */

static int t_reject(struct ft_run *r) {
    static const uint8_t data[8] = {'r', 'e', 'j', 'e', 'c', 't', '!', 0x5a};
    struct ft_pair p = {0};
    struct ft_eqev ev;
    int ret = need_msg(r);

    FT_TRY(ret);
    FT_TRY(ft_pair_prepare(r, &p, NULL));
    FT_TRY(ft_msg_listen(&p));
    FT_TRY(ft_msg_client(&p, NULL, NULL, 0));
    FT_TRY(ft_wait_event(&p, &p.s[FT_SRV].eq, FI_CONNREQ, &ev));
    int rc = fi_reject(p.pep, ev.u.cm.info->handle, data, sizeof(data));
    fi_freeinfo(ev.u.cm.info);
    FT_CHK(rc);
    FT_TRY(ft_wait_eq_any(&p, &p.s[FT_CLI].eq, &ev));
    FT_EXPECT(ev.is_err, "client got %s instead of an error event", ft_event_name(ev.event));
    FT_EXPECT(ev.err.err == FI_ECONNREFUSED, "reject gave err %d (%s), expected FI_ECONNREFUSED",
              ev.err.err, fi_strerror(ev.err.err));
    FT_EXPECT(ev.err.fid == &p.s[FT_CLI].ep->fid, "reject error fid %p, expected the endpoint",
              (void *)ev.err.fid);
    if (!ev.err.err_data_size) {
        ft_note(r, "no reject data delivered");
        goto out;
    }
    FT_EXPECT(ev.err.err_data_size >= sizeof(data) && !memcmp(ev.err.err_data, data, sizeof(data)),
              "reject data (%zu bytes) differs from the 8 bytes sent", ev.err.err_data_size);
out:
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ refused */

/* A port bound (so nobody else takes it) but not listening. */
static int reserve_port(struct ft_run *r, int *fd, char *service, size_t len) {
    struct sockaddr_storage ss = {0};
    socklen_t slen = sizeof(ss);
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    int ret = FT_OK;

    if (inet_pton(AF_INET, r->opts->addr, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        slen = sizeof(*in);
    } else if (inet_pton(AF_INET6, r->opts->addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        slen = sizeof(*in6);
    } else {
        return ft_skip(r, "%s is not a numeric IP address", r->opts->addr);
    }
    *fd = socket(ss.ss_family, SOCK_STREAM, 0);
    FT_EXPECT(*fd >= 0, "socket failed");
    FT_EXPECT(!bind(*fd, (struct sockaddr *)&ss, slen), "bind to %s failed", r->opts->addr);
    FT_EXPECT(!getsockname(*fd, (struct sockaddr *)&ss, &slen), "getsockname failed");
    snprintf(service, len, "%u", ntohs(ss.ss_family == AF_INET ? in->sin_port : in6->sin6_port));
out:
    return ret;
}

static int t_connect_refused(struct ft_run *r) {
    struct fi_info *info = NULL;
    struct ft_pair p = {0};
    struct ft_eqev ev;
    char service[16];
    int fd = -1, ret = need_msg(r);

    FT_TRY(ret);
    FT_TRY(reserve_port(r, &fd, service, sizeof(service)));
    FT_TRY(ft_pair_prepare(r, &p, NULL));
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, service, 0, p.hints, &info));
    ret = ft_side_open_ep(&p, &p.s[FT_CLI], info);
    info = NULL; /* the side owns it now, even if opening failed */
    FT_TRY(ret);
    int rc = fi_connect(p.s[FT_CLI].ep, p.s[FT_CLI].info->dest_addr, NULL, 0);
    if (rc == -FI_ECONNREFUSED) {
        ft_note(r, "fi_connect itself returned -FI_ECONNREFUSED");
        goto out;
    }
    FT_CHK(rc);
    FT_TRY(ft_wait_eq_any(&p, &p.s[FT_CLI].eq, &ev));
    FT_EXPECT(ev.is_err, "connect to a closed port gave %s", ft_event_name(ev.event));
    FT_EXPECT(ev.err.err == FI_ECONNREFUSED || ev.err.err == FI_ETIMEDOUT,
              "connect to a closed port gave err %d (%s)", ev.err.err, fi_strerror(ev.err.err));
    ft_note(r, "%s", ev.err.err == FI_ECONNREFUSED ? "FI_ECONNREFUSED" : "FI_ETIMEDOUT");
out:
    fi_freeinfo(info);
    if (fd >= 0) close(fd);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ shutdown */

static int t_shutdown(struct ft_run *r) {
    struct ft_pair p = {0};
    struct ft_eqev ev;
    int ret = need_msg(r);

    FT_TRY(ret);
    FT_TRY(ft_pair_open(r, &p, NULL));
    struct ft_side *c = &p.s[FT_CLI], *s = other(&p, c);
    FT_CHK(fi_shutdown(c->ep, 0));
    FT_TRY(ft_wait_event(&p, &s->eq, FI_SHUTDOWN, &ev));
    FT_EXPECT(ev.u.cm.fid == &s->ep->fid, "FI_SHUTDOWN fid %p, expected the server endpoint %p",
              (void *)ev.u.cm.fid, (void *)&s->ep->fid);
out:
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ pep handle */

static uint16_t port_of(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

/* fi_getinfo(3): a passive endpoint in hints->handle is copied to every
 * info's handle.  fi_endpoint(3): an active endpoint made from such an info
 * acquires the passive endpoint's properties (its bound address and port,
 * "to reserve the fabric address of an endpoint prior to knowing" its
 * side), and the passive endpoint is closed after it.  The server sees the
 * connection come from the passive endpoint's port; messages cross both
 * ways. */
static int t_pep_handle(struct ft_run *r) {
    struct ft_pair p = {0};
    struct fi_info *src = NULL, *hints = NULL, *info = NULL;
    struct fid_pep *cpep = NULL;
    struct side_bufs b[2] = {0};
    struct sockaddr_storage bound, srv, peer;
    size_t blen = sizeof(bound), slen = sizeof(srv), plen = sizeof(peer);
    char service[16];
    struct ft_side *s = &p.s[FT_SRV], *c = &p.s[FT_CLI];
    struct ft_eqev ev;
    int ret = need_msg(r);

    FT_TRY(ret);
    FT_TRY(ft_pair_prepare(r, &p, NULL));
    FT_TRY(ft_msg_listen(&p));
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, p.hints, &src));
    FT_CHK(fi_passive_ep(p.fabric, src, &cpep, NULL));
    FT_CHK(fi_getname(&cpep->fid, &bound, &blen));
    FT_EXPECT(port_of(&bound) != 0, "the client's passive endpoint has no port");
    FT_CHK(fi_getname(&p.pep->fid, &srv, &slen));
    snprintf(service, sizeof(service), "%u", port_of(&srv));
    hints = fi_dupinfo(p.hints);
    FT_EXPECT(hints, "fi_dupinfo");
    hints->handle = &cpep->fid;
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, service, 0, hints, &info));
    for (struct fi_info *fi = info; fi; fi = fi->next)
        FT_EXPECT(fi->handle == &cpep->fid, "an info's handle is %p, not the passive endpoint %p",
                  (void *)fi->handle, (void *)&cpep->fid);
    FT_TRY(ft_side_open_ep(&p, c, info));
    /* Spent: the application closes it (fi_endpoint(3)). */
    FT_CHK(fi_close(&cpep->fid));
    cpep = NULL;
    FT_CHK(fi_connect(c->ep, info->dest_addr, NULL, 0));
    FT_TRY(ft_wait_event(&p, &s->eq, FI_CONNREQ, &ev));
    ret = check_connreq(&p, &ev);
    if (ret) {
        fi_freeinfo(ev.u.cm.info);
        goto out;
    }
    FT_TRY(ft_msg_accept(&p, ev.u.cm.info));
    FT_TRY(expect_connected(&p, s));
    FT_TRY(expect_connected(&p, c));
    p.connected = true;
    FT_CHK(fi_getpeer(s->ep, &peer, &plen));
    FT_EXPECT(peer.ss_family == bound.ss_family && port_of(&peer) == port_of(&bound),
              "the server sees the client at port %u, not the passive endpoint's %u",
              port_of(&peer), port_of(&bound));
    FT_TRY(bufs_alloc(&p, 4096, b));
    FT_TRY(one_way(&p, b, FT_CLI, 4096, 41));
    FT_TRY(one_way(&p, b, FT_SRV, 4096, 42));
out:
    if (cpep) fi_close(&cpep->fid);
    if (hints) hints->handle = NULL;
    fi_freeinfo(hints);
    fi_freeinfo(src);
    if (info && c->info != info) fi_freeinfo(info);
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* pmof: a passive endpoint that listens, or whose id an active endpoint
 * took, makes no active endpoint (-FI_EOPBADSTATE), and a spent one
 * neither listens nor names an address. */
static int t_pep_handle_spent(struct ft_run *r) {
    struct ft_pair p = {0};
    struct fi_info *src = NULL, *info = NULL;
    struct fid_pep *cpep = NULL;
    struct fid_ep *ep = NULL, *ep2 = NULL;
    struct sockaddr_storage ss;
    size_t len = sizeof(ss);
    int ret = need_msg(r), rc;

    FT_TRY(ret);
    if (!ft_is_pmof_prov(r->opts))
        return ft_skip(r, "what a spent passive endpoint does is pmof's");
    FT_TRY(ft_pair_prepare(r, &p, NULL));
    FT_TRY(ft_msg_listen(&p));
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, p.hints, &src));
    FT_CHK(fi_domain(p.fabric, src, &p.s[FT_CLI].domain, NULL));
    info = fi_dupinfo(src);
    FT_EXPECT(info, "fi_dupinfo");
    struct fid_domain *dom = p.s[FT_CLI].domain;
    info->handle = &p.pep->fid;
    rc = fi_endpoint(dom, info, &ep, NULL);
    FT_EXPECT(rc == -FI_EOPBADSTATE, "fi_endpoint from a listening passive endpoint = %d (%s)", rc,
              fi_strerror(-rc));
    FT_CHK(fi_passive_ep(p.fabric, src, &cpep, NULL));
    info->handle = &cpep->fid;
    FT_CHK(fi_endpoint(dom, info, &ep, NULL));
    rc = fi_endpoint(dom, info, &ep2, NULL);
    FT_EXPECT(rc == -FI_EOPBADSTATE, "a second fi_endpoint from one passive endpoint = %d (%s)", rc,
              fi_strerror(-rc));
    rc = fi_listen(cpep);
    FT_EXPECT(rc == -FI_EOPBADSTATE, "fi_listen on a spent passive endpoint = %d (%s)", rc,
              fi_strerror(-rc));
    rc = fi_getname(&cpep->fid, &ss, &len);
    FT_EXPECT(rc == -FI_EOPBADSTATE, "fi_getname on a spent passive endpoint = %d (%s)", rc,
              fi_strerror(-rc));
    FT_CHK(fi_getname(&ep->fid, &ss, &len));
out:
    if (ep2) fi_close(&ep2->fid);
    if (ep) fi_close(&ep->fid);
    if (cpep) fi_close(&cpep->fid);
    if (info) info->handle = NULL;
    fi_freeinfo(info);
    fi_freeinfo(src);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ waiting */

struct sread_waiter {
    struct fid_cq *cq;
    struct fi_cq_tagged_entry e;
    atomic_long ret; /* fi_cq_sread's result once it returned; 1 until then */
};

static void *sread_forever(void *arg) {
    struct sread_waiter *w = arg;

    atomic_store(&w->ret, (long)fi_cq_sread(w->cq, &w->e, 1, NULL, -1));
    return NULL;
}

/* Reads one entry of `cq` by polling it alone (not through ft_progress,
 * which reads every CQ of the pair: a thread waits on the others). */
static int read_one(struct ft_run *r, struct fid_cq *cq, void *ctx, const char *what) {
    struct fi_cq_tagged_entry e;
    uint64_t t0 = ft_now_us();
    ssize_t n;

    while ((n = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN && ft_now_us() - t0 < 5000000)
        ;
    if (n != 1) return ft_fail(r, "%s: fi_cq_read = %zd (%s)", what, n, fi_strerror((int)-n));
    if (e.op_context != ctx) return ft_fail(r, "%s: the completion of another operation", what);
    return FT_OK;
}

/* fi_send, retried while it says -FI_EAGAIN (an RDM endpoint connecting),
 * driving progress through the sender's CQ alone. */
static ssize_t send_alone(struct ft_side *c, struct ft_buf *tx, size_t len, void *ctx) {
    struct fi_cq_tagged_entry e;
    uint64_t t0 = ft_now_us();
    ssize_t rc;

    while ((rc = fi_send(c->ep, tx->buf, len, tx->desc, c->peer, ctx)) == -FI_EAGAIN &&
           ft_now_us() - t0 < 5000000) {
        if (fi_cq_read(c->tx.cq, &e, 1) != -FI_EAGAIN) return -FI_EOTHER;
    }
    return rc;
}

static long wait_return(struct sread_waiter *w, unsigned ms) {
    for (unsigned i = 0; i < ms / 10 && atomic_load(&w->ret) == 1; i++)
        ft_sleep_ms(10);
    return atomic_load(&w->ret);
}

/* fi_cq(3) with a wait object to block on, traffic flowing: a thread in
 * fi_cq_sread (no timeout) on the receive CQ wakes for the message and
 * returns it, while a thread waiting on the send CQ of the same domain
 * does not return for it (until fi_cq_signal); and FI_GETWAIT's descriptor,
 * once fi_trywait says the CQ may be waited on, becomes readable for the
 * next message. */
static int t_cq_wait_traffic(struct ft_run *r) {
    enum { LEN = 4096 };
    struct ft_pair_cfg cfg = {.cq_wait = FI_WAIT_FD};
    struct sread_waiter rxw = {.ret = 1}, txw = {.ret = 1};
    struct side_bufs b[2] = {0};
    struct fi_context2 txc, rxc;
    struct ft_pair p = {0};
    struct ft_side *s = &p.s[FT_SRV], *c = &p.s[FT_CLI];
    pthread_t threads[2];
    int started = 0, ret = FT_OK, fd = -1, rc = 0;
    long got;

    FT_TRY(ft_pair_open(r, &p, &cfg));
    FT_TRY(bufs_alloc(&p, LEN, b));
    FT_EXPECT(s->rx.cq != s->tx.cq, "the server's CQs are one");
    ft_fill(b[FT_CLI].tx.buf, LEN, 31);
    FT_CHK(fi_recv(s->ep, b[FT_SRV].rx.buf, LEN, b[FT_SRV].rx.desc, FI_ADDR_UNSPEC, &rxc));
    rxw.cq = s->rx.cq;
    txw.cq = s->tx.cq;
    FT_EXPECT(!pthread_create(&threads[0], NULL, sread_forever, &rxw), "pthread_create");
    started++;
    FT_EXPECT(!pthread_create(&threads[1], NULL, sread_forever, &txw), "pthread_create");
    started++;
    ft_sleep_ms(50); /* both wait by now, or soon: either way */
    FT_CHK(send_alone(c, &b[FT_CLI].tx, LEN, &txc));
    FT_TRY(read_one(r, c->tx.cq, &txc, "the client's send"));
    got = wait_return(&rxw, 5000);
    FT_EXPECT(got == 1, "fi_cq_sread(no timeout) on the receive CQ = %ld (%s), 5 s after the send",
              got, got == 1 ? "still waiting" : fi_strerror((int)-got));
    FT_EXPECT(rxw.e.op_context == &rxc && rxw.e.len == LEN && (rxw.e.flags & FI_RECV),
              "fi_cq_sread returned another completion (len %zu, flags 0x%llx)", rxw.e.len,
              (unsigned long long)rxw.e.flags);
    FT_TRY(ft_expect_pattern(r, b[FT_SRV].rx.buf, LEN, 31, "message received in fi_cq_sread"));
    got = wait_return(&txw, 100);
    FT_EXPECT(got == 1, "fi_cq_sread on the idle send CQ returned %ld (%s) for the receive", got,
              fi_strerror((int)-got));
    FT_CHK(fi_cq_signal(s->tx.cq));
    got = wait_return(&txw, 5000);
    FT_EXPECT(got == -FI_EAGAIN || got == -FI_ECANCELED,
              "fi_cq_sread on the send CQ after fi_cq_signal = %ld (%s)", got,
              got == 1 ? "still waiting" : fi_strerror((int)-got));

    FT_CHK(fi_control(&s->rx.cq->fid, FI_GETWAIT, &fd));
    FT_CHK(fi_recv(s->ep, b[FT_SRV].rx.buf, LEN, b[FT_SRV].rx.desc, FI_ADDR_UNSPEC, &rxc));
    struct fid *fids[] = {&s->rx.cq->fid};
    for (int i = 0; i < 100 && (rc = fi_trywait(p.fabric, fids, 1)) == -FI_EAGAIN; i++)
        ft_sleep_ms(1);
    FT_EXPECT(rc == 0, "fi_trywait on an idle receive CQ = %d (%s)", rc, fi_strerror(-rc));
    ft_fill(b[FT_CLI].tx.buf, LEN, 32);
    FT_CHK(send_alone(c, &b[FT_CLI].tx, LEN, &txc));
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    FT_EXPECT(poll(&pfd, 1, 5000) == 1, "FI_GETWAIT's descriptor not readable 5 s after a send");
    FT_TRY(read_one(r, s->rx.cq, &rxc, "the receive FI_GETWAIT announced"));
    FT_TRY(ft_expect_pattern(r, b[FT_SRV].rx.buf, LEN, 32, "message announced by FI_GETWAIT"));
    FT_TRY(read_one(r, c->tx.cq, &txc, "the client's second send"));
out:
    /* Still blocked: wake them the only other way, so they can be joined. */
    for (int i = 0;
         i < 100 && started && (atomic_load(&rxw.ret) == 1 || atomic_load(&txw.ret) == 1); i++) {
        fi_cq_signal(s->rx.cq);
        fi_cq_signal(s->tx.cq);
        ft_sleep_ms(50);
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ AV reuse */

/* The server receives one message of `len` bytes from the client, sent
 * after the receive is posted, and reads its completion with the source
 * the provider reports (fi_cq_readfrom).  Both CQs are read all along: a
 * provider may need the server's to make the connection. */
static int from_client(struct ft_pair *p, struct side_bufs *b, size_t len, unsigned seed,
                       fi_addr_t *src) {
    struct ft_side *s = &p->s[FT_SRV], *c = &p->s[FT_CLI];
    struct fi_cq_tagged_entry e, te;
    struct fi_context2 txc, rxc;
    struct ft_run *r = p->r;
    bool sent = false, received = false, send_done = false;
    uint64_t t0 = ft_now_us();
    ssize_t n;
    int ret = FT_OK;

    ft_fill(b[FT_CLI].tx.buf, len, seed);
    memset(b[FT_SRV].rx.buf, 0, len);
    FT_CHK(fi_recv(s->ep, b[FT_SRV].rx.buf, len, b[FT_SRV].rx.desc, FI_ADDR_UNSPEC, &rxc));
    *src = FI_ADDR_UNSPEC;
    while (!(received && send_done) && ft_now_us() - t0 < 5000000) {
        if (!sent) {
            n = fi_send(c->ep, b[FT_CLI].tx.buf, len, b[FT_CLI].tx.desc, c->peer, &txc);
            FT_EXPECT(n == 0 || n == -FI_EAGAIN, "fi_send = %zd (%s)", n, fi_strerror((int)-n));
            sent = n == 0;
        }
        n = fi_cq_read(c->tx.cq, &te, 1);
        FT_EXPECT(n == 1 || n == -FI_EAGAIN, "fi_cq_read(client tx) = %zd", n);
        if (n == 1) {
            FT_EXPECT(te.op_context == &txc, "the completion of another send");
            send_done = true;
        }
        if (received) continue;
        n = fi_cq_readfrom(s->rx.cq, &e, 1, src);
        FT_EXPECT(n == 1 || n == -FI_EAGAIN, "fi_cq_readfrom = %zd (%s)", n, fi_strerror((int)-n));
        received = n == 1;
    }
    FT_EXPECT(received && send_done, "no %s within 5 s", received ? "send completion" : "message");
    FT_EXPECT(e.op_context == &rxc && e.len == len, "the completion of another receive");
    FT_TRY(ft_expect_pattern(r, b[FT_SRV].rx.buf, len, seed, "message from the client"));
out:
    return ret;
}

/* fi_av(3): "the removed address ... is invalid until it is returned
 * again by a new fi_av_insert".  An RDM server that removes its client's
 * address sees that client's next message come from FI_ADDR_NOTAVAIL, and
 * may not send to the removed fi_addr; inserted again, the client is the
 * fi_addr the insert returned, in completions and for sends. */
static int t_av_remove_reinsert(struct ft_run *r) {
    enum { LEN = 1024 };
    struct ft_pair_cfg cfg = {.caps = FI_SOURCE};
    struct side_bufs b[2] = {0};
    struct ft_pair p = {0};
    struct ft_side *s = &p.s[FT_SRV], *c = &p.s[FT_CLI];
    uint8_t name[256];
    size_t nlen = sizeof(name);
    fi_addr_t src, old, again = FI_ADDR_NOTAVAIL;
    struct fi_context2 txc;
    int ret = FT_OK;
    ssize_t rc;

    if (r->opts->ep_type != FI_EP_RDM) return ft_skip(r, "fi_addr_t names peers of RDM endpoints");
    FT_TRY(ft_pair_open(r, &p, &cfg));
    FT_TRY(bufs_alloc(&p, LEN, b));
    old = s->peer;
    FT_TRY(from_client(&p, b, LEN, 51, &src));
    FT_EXPECT(src == old, "a message from the client came from fi_addr %llu, not %llu",
              (unsigned long long)src, (unsigned long long)old);

    FT_CHK(fi_av_remove(s->av, &old, 1, 0));
    FT_TRY(from_client(&p, b, LEN, 52, &src));
    /* ofi_rxm (libfabric 1.17) still names the removed fi_addr here. */
    FT_TRY(ft_deviation(r, src != FI_ADDR_NOTAVAIL,
                        "after fi_av_remove, the client's message came from the removed fi_addr"));
    if (ft_is_pmof_prov(r->opts)) {
        rc = fi_send(s->ep, b[FT_SRV].tx.buf, LEN, b[FT_SRV].tx.desc, old, &txc);
        FT_EXPECT(rc == -FI_EINVAL, "fi_send to a removed fi_addr = %zd (%s)", rc,
                  fi_strerror((int)-rc));
    }

    FT_CHK(fi_getname(&c->ep->fid, name, &nlen));
    FT_EXPECT(fi_av_insert(s->av, name, 1, &again, 0, NULL) == 1 && again != FI_ADDR_NOTAVAIL,
              "fi_av_insert of the client again");
    FT_TRY(from_client(&p, b, LEN, 53, &src));
    FT_EXPECT(src == again, "inserted again as fi_addr %llu, the client's message came from %llu",
              (unsigned long long)again, (unsigned long long)src);
    s->peer = again;
    FT_TRY(one_way(&p, b, FT_SRV, LEN, 54));
out:
    ret = bufs_free(r, &p, b, ret);
    return ft_pair_close(&p, ret);
}

const struct ft_test ft_msg_tests[] = {
    {"msg.connect", t_connect},
    {"msg.pingpong", t_pingpong},
    {"msg.hmem_override", t_hmem_override},
    {"msg.sendv_recvv", t_sendv},
    {"msg.inject", t_inject},
    {"msg.sendmsg_selective", t_selective},
    {"msg.senddata", t_senddata},
    {"msg.rx_too_small", t_rx_too_small},
    {"msg.reject", t_reject},
    {"msg.connect_refused", t_connect_refused},
    {"msg.shutdown", t_shutdown},
    {"msg.pep_handle", t_pep_handle},
    {"msg.pep_handle_spent", t_pep_handle_spent},
    {"msg.cq_wait_traffic", t_cq_wait_traffic},
    {"msg.av_remove_reinsert", t_av_remove_reinsert},
    {NULL, NULL},
};
