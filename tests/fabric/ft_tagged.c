/* SPDX-License-Identifier: MIT */
/* tagged.*: tagged messages (FI_TAGGED) of RDM endpoints: matching by tag
 * and ignore mask, in order, before and after the receive is posted, eager
 * and rendezvous sizes, truncation, remote CQ data, inject, FI_PEEK,
 * FI_CLAIM and FI_DISCARD, and untagged messages beside them. */
#include "fabtest.h"
#include "ft_rma.h"

#include <rdma/fi_tagged.h>
#include <string.h>

/* Past pmof's eager size (8 KiB by default): read by the receiver. */
#define BIG (256 * 1024)
/* Rendezvous in pmof, eager in ofi_rxm, whose rendezvous sends never
 * complete when the receiver discards them. */
#define MID 12000

static int open_tagged(struct ft_run *r, struct ft_pair *p) {
    struct ft_pair_cfg cfg = {.caps = FI_TAGGED};

    if (r->opts->ep_type != FI_EP_RDM)
        return ft_skip(r, "tagged messages are tested on FI_EP_RDM endpoints");
    return ft_pair_open(r, p, &cfg);
}

struct tbufs {
    struct ft_buf tx, rx;
};

static int tbufs_alloc(struct ft_pair *p, size_t len, struct tbufs *b) {
    int ret = FT_OK;

    FT_TRY(ft_buf_alloc(p, &p->s[FT_CLI], len, FT_ACC_LOCAL, 0, &b->tx));
    FT_TRY(ft_buf_alloc(p, &p->s[FT_SRV], len, FT_ACC_LOCAL, 0, &b->rx));
out:
    return ret;
}

static int tbufs_free(struct ft_run *r, struct ft_pair *p, struct tbufs *b, int ret) {
    ret = ft_pair_stop(p, ret);
    if (ft_buf_free(r, &b->tx)) ret = FT_FAIL;
    if (ft_buf_free(r, &b->rx)) ret = FT_FAIL;
    return ret;
}

/* A successful tagged receive completion of `len` bytes with `tag`. */
static int expect_trecv(struct ft_pair *p, void *ctx, size_t len, uint64_t tag) {
    struct ft_run *r = p->r;
    struct ft_comp c;
    int ret = FT_OK;

    FT_TRY(ft_expect_comp(p, &p->s[FT_SRV].rx, ctx, FI_TAGGED | FI_RECV, len, &c));
    FT_EXPECT(c.tag == tag, "receive completion has tag %#llx, expected %#llx",
              (unsigned long long)c.tag, (unsigned long long)tag);
out:
    return ret;
}

static int expect_tsend(struct ft_pair *p, void *ctx) {
    return ft_expect_comp(p, &p->s[FT_CLI].tx, ctx, FI_TAGGED | FI_SEND, SIZE_MAX, NULL);
}

/* Client to server, every size of the sweep and the rendezvous one, with
 * the receive posted first; then the server answers, the other way. */
static int t_pingpong(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0}, back = {0};
    size_t sizes[10];
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    size_t n = ft_sizes(p.s[FT_CLI].info, sizes, 9);
    size_t max = sizes[n - 1] > BIG + 3 ? sizes[n - 1] : BIG + 3;
    sizes[n++] = BIG + 3;
    FT_TRY(tbufs_alloc(&p, max, &b));
    FT_TRY(ft_buf_alloc(&p, &p.s[FT_SRV], max, FT_ACC_LOCAL, 0, &back.tx));
    FT_TRY(ft_buf_alloc(&p, &p.s[FT_CLI], max, FT_ACC_LOCAL, 0, &back.rx));
    for (size_t i = 0; i < n; i++) {
        struct fi_context2 rc, sc;
        uint64_t tag = 0x1000 + i;

        ft_fill(b.tx.buf, sizes[i], (unsigned)i);
        memset(b.rx.buf, 0, sizes[i]);
        FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, sizes[i], b.rx.desc, FI_ADDR_UNSPEC, tag, 0,
                             &rc));
        FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, sizes[i], b.tx.desc, p.s[FT_CLI].peer, tag,
                             &sc));
        FT_TRY(expect_trecv(&p, &rc, sizes[i], tag));
        FT_TRY(ft_expect_pattern(r, b.rx.buf, sizes[i], (unsigned)i, "tagged message"));
        FT_TRY(expect_tsend(&p, &sc));

        ft_fill(back.tx.buf, sizes[i], (unsigned)i + 50);
        FT_POST(&p, fi_trecv(p.s[FT_CLI].ep, back.rx.buf, sizes[i], back.rx.desc, FI_ADDR_UNSPEC,
                             ~tag, 0, &rc));
        FT_POST(&p, fi_tsend(p.s[FT_SRV].ep, back.tx.buf, sizes[i], back.tx.desc, p.s[FT_SRV].peer,
                             ~tag, &sc));
        FT_TRY(ft_expect_comp(&p, &p.s[FT_CLI].rx, &rc, FI_TAGGED | FI_RECV, sizes[i], NULL));
        FT_TRY(ft_expect_pattern(r, back.rx.buf, sizes[i], (unsigned)i + 50, "answer"));
        FT_TRY(ft_expect_comp(&p, &p.s[FT_SRV].tx, &sc, FI_TAGGED | FI_SEND, SIZE_MAX, NULL));
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    ret = tbufs_free(r, &p, &back, ret);
    return ft_pair_close(&p, ret);
}

/* Messages that arrive before their receives: each receive, posted in the
 * reverse order of the sends, gets the message with its tag; a large
 * one's send completes only once its receive has taken it. */
static int t_unexpected(struct ft_run *r) {
    static const size_t len[4] = {16, 4000, BIG, 0};
    struct ft_pair p = {0};
    struct ft_buf tx[4] = {0}, rx[4] = {0};
    struct fi_context2 sc[4], rc[4];
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    for (int i = 0; i < 4; i++) {
        FT_TRY(ft_buf_alloc(&p, &p.s[FT_CLI], BIG, FT_ACC_LOCAL, 0, &tx[i]));
        FT_TRY(ft_buf_alloc(&p, &p.s[FT_SRV], BIG, FT_ACC_LOCAL, 0, &rx[i]));
        ft_fill(tx[i].buf, len[i], 7u + (unsigned)i);
        FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, tx[i].buf, len[i], tx[i].desc, p.s[FT_CLI].peer,
                             100 + (uint64_t)i, &sc[i]));
    }
    /* The small ones complete at the sender without a receive. */
    FT_TRY(expect_tsend(&p, &sc[0]));
    FT_TRY(expect_tsend(&p, &sc[1]));
    FT_TRY(expect_tsend(&p, &sc[3]));
    if (ft_is_pmof_prov(r->opts))
        FT_TRY(ft_expect_quiet(&p, &p.s[FT_CLI].tx, 200, "a rendezvous send before its receive"));
    for (int i = 3; i >= 0; i--) {
        FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, rx[i].buf, BIG, rx[i].desc, FI_ADDR_UNSPEC,
                             100 + (uint64_t)i, 0, &rc[i]));
        FT_TRY(expect_trecv(&p, &rc[i], len[i], 100 + (uint64_t)i));
        FT_TRY(ft_expect_pattern(r, rx[i].buf, len[i], 7u + (unsigned)i, "unexpected message"));
    }
    FT_TRY(expect_tsend(&p, &sc[2]));
out:
    for (int i = 0; i < 4; i++) {
        if (ft_buf_free(r, &tx[i])) ret = FT_FAIL;
        if (ft_buf_free(r, &rx[i])) ret = FT_FAIL;
    }
    return ft_pair_close(&p, ret);
}

/* The ignore mask: a receive for 0xAB00 ignoring the low byte takes 0xAB42
 * and not 0xAC00; messages of one tag match receives in the order sent. */
static int t_ignore_order(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc[4], sc[4];
    uint8_t *rx;
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, 4096, &b));
    rx = b.rx.buf;
    for (int i = 0; i < 4; i++)
        ft_fill(b.tx.buf + i * 64, 64, 20u + (unsigned)i);
    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, rx, 64, b.rx.desc, FI_ADDR_UNSPEC, 0xAB00, 0xFF, &rc[0]));
    FT_POST(&p,
            fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 64, b.tx.desc, p.s[FT_CLI].peer, 0xAC00, &sc[0]));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf + 64, 64, b.tx.desc, p.s[FT_CLI].peer, 0xAB42,
                         &sc[1]));
    FT_TRY(expect_trecv(&p, &rc[0], 64, 0xAB42));
    FT_TRY(ft_expect_pattern(r, rx, 64, 21, "the message matched through the ignore mask"));
    FT_TRY(ft_expect_quiet(&p, &p.s[FT_SRV].rx, 100, "tag 0xAC00 must not match"));
    /* Two more of one tag, then their receives: first sent, first taken. */
    FT_POST(&p,
            fi_tsend(p.s[FT_CLI].ep, b.tx.buf + 128, 64, b.tx.desc, p.s[FT_CLI].peer, 7, &sc[2]));
    FT_POST(&p,
            fi_tsend(p.s[FT_CLI].ep, b.tx.buf + 192, 64, b.tx.desc, p.s[FT_CLI].peer, 7, &sc[3]));
    for (int i = 0; i < 4; i++)
        FT_TRY(expect_tsend(&p, &sc[i]));
    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, rx + 64, 64, b.rx.desc, FI_ADDR_UNSPEC, 7, 0, &rc[1]));
    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, rx + 128, 64, b.rx.desc, FI_ADDR_UNSPEC, 7, 0, &rc[2]));
    FT_POST(&p,
            fi_trecv(p.s[FT_SRV].ep, rx + 192, 64, b.rx.desc, FI_ADDR_UNSPEC, 0xAC00, 0, &rc[3]));
    FT_TRY(expect_trecv(&p, &rc[1], 64, 7));
    FT_TRY(expect_trecv(&p, &rc[2], 64, 7));
    FT_TRY(expect_trecv(&p, &rc[3], 64, 0xAC00));
    FT_TRY(ft_expect_pattern(r, rx + 64, 64, 22, "first of tag 7"));
    FT_TRY(ft_expect_pattern(r, rx + 128, 64, 23, "second of tag 7"));
    FT_TRY(ft_expect_pattern(r, rx + 192, 64, 20, "tag 0xAC00"));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* A message longer than its receive: FI_ETRUNC with the bytes that fitted
 * and olen for the rest, eager and rendezvous. */
static int t_truncate(struct ft_run *r) {
    static const size_t len[2] = {1000, BIG};
    struct ft_pair p = {0};
    struct tbufs b = {0};
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    /* ofi_rxm (the reference run) loses every receive after a truncated
     * one: only the first case there. */
    for (int i = 0; i < (ft_strict(r) ? 2 : 1); i++) {
        struct fi_context2 rc, sc;
        struct ft_comp c;
        size_t half = len[i] / 2;

        ft_fill(b.tx.buf, len[i], 40u + (unsigned)i);
        memset(b.rx.buf, 0, BIG);
        FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, half, b.rx.desc, FI_ADDR_UNSPEC, 5, 0, &rc));
        FT_POST(&p,
                fi_tsend(p.s[FT_CLI].ep, b.tx.buf, len[i], b.tx.desc, p.s[FT_CLI].peer, 5, &sc));
        FT_TRY(ft_expect_err(&p, &p.s[FT_SRV].rx, &rc, &c));
        FT_EXPECT(c.err == FI_ETRUNC, "truncated receive: err %d (%s), expected FI_ETRUNC", c.err,
                  fi_strerror(c.err));
        FT_TRY(ft_deviation(r, c.olen != len[i] - half, "truncated receive: olen %zu, expected %zu",
                            c.olen, len[i] - half));
        FT_TRY(ft_deviation(r, ft_check(b.rx.buf, half, 40u + (unsigned)i) != half,
                            "truncated receive: the part that fitted was not placed"));
        FT_EXPECT(((uint8_t *)b.rx.buf)[half] == 0, "a byte past the receive was written");
        FT_TRY(expect_tsend(&p, &sc));
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* fi_tsenddata: the tag and the data in the receive completion. */
static int t_data(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    for (int i = 0; i < 2; i++) {
        size_t len = i ? BIG : 32;
        struct fi_context2 rc, sc;
        struct ft_comp c;

        ft_fill(b.tx.buf, len, 60u + (unsigned)i);
        FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, len, b.rx.desc, FI_ADDR_UNSPEC, 99, 0, &rc));
        FT_POST(&p, fi_tsenddata(p.s[FT_CLI].ep, b.tx.buf, len, b.tx.desc, 0xC0DE0000u + i,
                                 p.s[FT_CLI].peer, 99, &sc));
        FT_TRY(ft_expect_comp(&p, &p.s[FT_SRV].rx, &rc, FI_TAGGED | FI_RECV | FI_REMOTE_CQ_DATA,
                              len, &c));
        FT_EXPECT(c.e.data == 0xC0DE0000u + (unsigned)i, "remote CQ data %#llx",
                  (unsigned long long)c.e.data);
        FT_EXPECT(c.tag == 99, "tag %#llx", (unsigned long long)c.tag);
        FT_TRY(ft_expect_pattern(r, b.rx.buf, len, 60u + (unsigned)i, "message with data"));
        FT_TRY(expect_tsend(&p, &sc));
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* fi_tinject of the inject size arrives; one byte more is refused. */
static int t_inject(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc;
    uint8_t msg[4096];
    size_t size;
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    size = p.s[FT_CLI].info->tx_attr->inject_size;
    if (!size) {
        ret = ft_skip(r, "inject_size 0");
        goto out;
    }
    FT_EXPECT(size < sizeof(msg), "inject_size %zu", size);
    FT_TRY(tbufs_alloc(&p, sizeof(msg), &b));
    ft_fill(msg, size, 77);
    FT_POST(&p,
            fi_trecv(p.s[FT_SRV].ep, b.rx.buf, sizeof(msg), b.rx.desc, FI_ADDR_UNSPEC, 3, 0, &rc));
    FT_POST(&p, fi_tinject(p.s[FT_CLI].ep, msg, size, p.s[FT_CLI].peer, 3));
    memset(msg, 0, size); /* the buffer is free at return */
    FT_TRY(expect_trecv(&p, &rc, size, 3));
    FT_TRY(ft_expect_pattern(r, b.rx.buf, size, 77, "injected message"));
    ssize_t rc2 = fi_tinject(p.s[FT_CLI].ep, msg, size + 1, p.s[FT_CLI].peer, 3);
    FT_TRY(ft_deviation(r, rc2 != -FI_EINVAL, "fi_tinject of inject_size + 1 = %zd (%s)", rc2,
                        fi_strerror((int)-rc2)));
    FT_TRY(ft_expect_quiet(&p, &p.s[FT_CLI].tx, 50, "fi_tinject"));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* FI_PEEK finds nothing (FI_ENOMSG), then a message without taking it;
 * FI_PEEK | FI_CLAIM reserves it for an FI_CLAIM receive; FI_PEEK |
 * FI_DISCARD drops one, which no receive gets afterwards. */
static int t_peek_claim(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 pc, rc, sc[3];
    struct iovec iov;
    struct fi_msg_tagged msg = {.addr = FI_ADDR_UNSPEC};
    struct ft_comp c;
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    msg.msg_iov = &iov;
    msg.desc = &b.rx.desc;
    msg.iov_count = 1;
    iov = (struct iovec){.iov_base = b.rx.buf, .iov_len = BIG};

    msg.tag = 0x51;
    msg.context = &pc;
    FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_PEEK));
    FT_TRY(ft_expect_err(&p, &p.s[FT_SRV].rx, &pc, &c));
    FT_EXPECT(c.err == FI_ENOMSG, "FI_PEEK of nothing: err %d (%s), expected FI_ENOMSG", c.err,
              fi_strerror(c.err));

    ft_fill(b.tx.buf, 300, 81);
    ft_fill(b.tx.buf + 300, MID, 82);
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 300, b.tx.desc, p.s[FT_CLI].peer, 0x51, &sc[0]));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf + 300, MID, b.tx.desc, p.s[FT_CLI].peer, 0x52,
                         &sc[1]));
    FT_TRY(expect_tsend(&p, &sc[0]));
    /* Peeking until it is there: arrival is asynchronous. */
    for (int tries = 0;; tries++) {
        FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_PEEK));
        FT_TRY(ft_wait_comp(&p, &p.s[FT_SRV].rx, &pc, &c));
        if (!c.is_err) break;
        FT_EXPECT(c.err == FI_ENOMSG && tries < 1000, "FI_PEEK: err %d (%s)", c.err,
                  fi_strerror(c.err));
        ft_sleep_ms(1);
    }
    FT_EXPECT(c.e.len == 300 && c.tag == 0x51, "FI_PEEK found len %zu tag %#llx", c.e.len,
              (unsigned long long)c.tag);
    /* Claim it, then take it with FI_CLAIM. */
    FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_PEEK | FI_CLAIM));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_SRV].rx, &pc, FI_TAGGED | FI_RECV, 300, NULL));
    memset(b.rx.buf, 0, BIG);
    FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_CLAIM));
    FT_TRY(expect_trecv(&p, &pc, 300, 0x51));
    FT_TRY(ft_expect_pattern(r, b.rx.buf, 300, 81, "claimed message"));
    /* Discard the rendezvous one: its send completes, no receive gets it. */
    msg.tag = 0x52;
    for (int tries = 0;; tries++) {
        FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_PEEK | FI_DISCARD));
        FT_TRY(ft_wait_comp(&p, &p.s[FT_SRV].rx, &pc, &c));
        if (!c.is_err) break;
        FT_EXPECT(c.err == FI_ENOMSG && tries < 1000, "FI_PEEK | FI_DISCARD: err %d (%s)", c.err,
                  fi_strerror(c.err));
        ft_sleep_ms(1);
    }
    FT_TRY(expect_tsend(&p, &sc[1]));
    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, BIG, b.rx.desc, FI_ADDR_UNSPEC, 0x52, 0, &rc));
    FT_TRY(ft_expect_quiet(&p, &p.s[FT_SRV].rx, 100, "a discarded message"));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 8, b.tx.desc, p.s[FT_CLI].peer, 0x52, &sc[2]));
    FT_TRY(expect_trecv(&p, &rc, 8, 0x52));
    FT_TRY(expect_tsend(&p, &sc[2]));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* Untagged messages beside tagged ones: fi_recv takes only untagged ones,
 * in their order, whatever tagged traffic comes between. */
static int t_untagged(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc[3], sc[3];
    uint8_t *rx;
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, 3 * BIG, &b));
    rx = b.rx.buf;
    ft_fill(b.tx.buf, 100, 90);
    ft_fill(b.tx.buf + BIG, BIG, 91);
    ft_fill(b.tx.buf + 2 * BIG, 200, 92);
    FT_POST(&p, fi_recv(p.s[FT_SRV].ep, rx, BIG, b.rx.desc, FI_ADDR_UNSPEC, &rc[0]));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 100, b.tx.desc, p.s[FT_CLI].peer, 0, &sc[0]));
    FT_POST(&p, fi_send(p.s[FT_CLI].ep, b.tx.buf + BIG, BIG, b.tx.desc, p.s[FT_CLI].peer, &sc[1]));
    FT_POST(&p,
            fi_send(p.s[FT_CLI].ep, b.tx.buf + 2 * BIG, 200, b.tx.desc, p.s[FT_CLI].peer, &sc[2]));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_SRV].rx, &rc[0], FI_MSG | FI_RECV, BIG, NULL));
    FT_TRY(ft_expect_pattern(r, rx, BIG, 91, "first untagged message"));
    FT_POST(&p, fi_recv(p.s[FT_SRV].ep, rx + BIG, BIG, b.rx.desc, FI_ADDR_UNSPEC, &rc[1]));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_SRV].rx, &rc[1], FI_MSG | FI_RECV, 200, NULL));
    FT_TRY(ft_expect_pattern(r, rx + BIG, 200, 92, "second untagged message"));
    FT_POST(&p,
            fi_trecv(p.s[FT_SRV].ep, rx + 2 * BIG, BIG, b.rx.desc, FI_ADDR_UNSPEC, 0, 0, &rc[2]));
    FT_TRY(expect_trecv(&p, &rc[2], 100, 0));
    FT_TRY(ft_expect_pattern(r, rx + 2 * BIG, 100, 90, "the tagged message"));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_CLI].tx, &sc[0], FI_TAGGED | FI_SEND, SIZE_MAX, NULL));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_CLI].tx, &sc[1], FI_MSG | FI_SEND, SIZE_MAX, NULL));
    FT_TRY(ft_expect_comp(&p, &p.s[FT_CLI].tx, &sc[2], FI_MSG | FI_SEND, SIZE_MAX, NULL));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* Scatter and gather: three send entries into two receive entries, cut
 * at other places, eager and rendezvous. */
static int t_iov(struct ft_run *r) {
    static const size_t small[3] = {100, 1, 2000}, big[3] = {100000, 50000, 70001};
    struct ft_pair p = {0};
    struct tbufs b = {0};
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    for (int k = 0; k < 2; k++) {
        const size_t *part = k ? big : small;
        size_t total = part[0] + part[1] + part[2], cut = total / 3 + 7;
        struct iovec tx[3] = {{b.tx.buf, part[0]},
                              {(uint8_t *)b.tx.buf + part[0] + 5, part[1]},
                              {(uint8_t *)b.tx.buf + part[0] + part[1] + 10, part[2]}};
        struct iovec rx[2] = {{b.rx.buf, cut}, {(uint8_t *)b.rx.buf + cut + 3, total - cut}};
        void *txd[3] = {b.tx.desc, b.tx.desc, b.tx.desc}, *rxd[2] = {b.rx.desc, b.rx.desc};
        struct fi_context2 rc, sc;
        size_t iov_limit = p.s[FT_CLI].info->tx_attr->iov_limit;

        if (iov_limit < 3 || p.s[FT_SRV].info->rx_attr->iov_limit < 2) {
            ret = ft_skip(r, "iov_limit %zu", iov_limit);
            goto out;
        }
        for (int i = 0; i < 3; i++)
            ft_fill(tx[i].iov_base, tx[i].iov_len, 200u + (unsigned)(10 * k + i));
        memset(b.rx.buf, 0, BIG);
        FT_POST(&p, fi_trecvv(p.s[FT_SRV].ep, rx, rxd, 2, FI_ADDR_UNSPEC, 11, 0, &rc));
        FT_POST(&p, fi_tsendv(p.s[FT_CLI].ep, tx, txd, 3, p.s[FT_CLI].peer, 11, &sc));
        FT_TRY(expect_trecv(&p, &rc, total, 11));
        FT_TRY(expect_tsend(&p, &sc));
        /* Put the received bytes end to end and compare with each part. */
        memmove((uint8_t *)b.rx.buf + cut, rx[1].iov_base, rx[1].iov_len);
        for (size_t i = 0, off = 0; i < 3; off += part[i], i++)
            FT_TRY(ft_expect_pattern(r, (uint8_t *)b.rx.buf + off, part[i],
                                     200u + (unsigned)(10 * k + (int)i), "gathered part"));
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* FI_DIRECTED_RECV: a receive for another source leaves the message to
 * the receive posted after it for this one. */
static int t_directed(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.caps = FI_TAGGED | FI_DIRECTED_RECV};
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc[2], sc;
    uint8_t name[256];
    size_t len = sizeof(name);
    fi_addr_t other = FI_ADDR_NOTAVAIL;
    int ret = FT_OK;

    if (r->opts->ep_type != FI_EP_RDM)
        return ft_skip(r, "tagged messages are tested on FI_EP_RDM endpoints");
    FT_TRY(ft_pair_open(r, &p, &cfg));
    if (!(p.s[FT_SRV].info->caps & FI_DIRECTED_RECV)) {
        ret = ft_skip(r, "no FI_DIRECTED_RECV");
        goto out;
    }
    FT_TRY(tbufs_alloc(&p, 4096, &b));
    /* Another source: the server's own name. */
    FT_CHK(fi_getname(&p.s[FT_SRV].ep->fid, name, &len));
    FT_EXPECT(fi_av_insert(p.s[FT_SRV].av, name, 1, &other, 0, NULL) == 1 &&
                  other != p.s[FT_SRV].peer,
              "fi_av_insert of a second address");
    ft_fill(b.tx.buf, 64, 33);
    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, 64, b.rx.desc, other, 5, 0, &rc[0]));
    FT_POST(&p,
            fi_trecv(p.s[FT_SRV].ep, b.rx.buf + 64, 64, b.rx.desc, p.s[FT_SRV].peer, 5, 0, &rc[1]));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 64, b.tx.desc, p.s[FT_CLI].peer, 5, &sc));
    FT_TRY(expect_trecv(&p, &rc[1], 64, 5));
    FT_TRY(ft_expect_pattern(r, b.rx.buf + 64, 64, 33, "the directed receive"));
    FT_TRY(expect_tsend(&p, &sc));
    FT_TRY(ft_expect_quiet(&p, &p.s[FT_SRV].rx, 100, "a receive for another source"));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* Sends and receives without descriptors, as Open MPI's ofi MTL posts
 * them: pmof copies eager messages into its send buffers and registers
 * rendezvous memory itself (FI_MR_LOCAL notwithstanding). */
static int t_no_desc(struct ft_run *r) {
    static const size_t len[2] = {2000, BIG};
    struct ft_pair p = {0};
    struct tbufs b = {0};
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    if (!ft_strict(r)) {
        ret = ft_skip(r, "FI_MR_LOCAL asks for descriptors");
        goto out;
    }
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    for (int i = 0; i < 2; i++) {
        struct fi_context2 rc, sc;

        ft_fill(b.tx.buf, len[i], 110u + (unsigned)i);
        memset(b.rx.buf, 0, len[i]);
        FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, len[i], NULL, FI_ADDR_UNSPEC, 21, 0, &rc));
        FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, len[i], NULL, p.s[FT_CLI].peer, 21, &sc));
        FT_TRY(expect_trecv(&p, &rc, len[i], 21));
        FT_TRY(ft_expect_pattern(r, b.rx.buf, len[i], 110u + (unsigned)i, "message without desc"));
        FT_TRY(expect_tsend(&p, &sc));
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* Endpoints closed with messages left over: a rendezvous send without its
 * receive (its memory registered by pmof), an unexpected message, and a
 * claimed one no receive took.  Every close must succeed, the domains'
 * too (nothing left registered); the sanitizer runs see leaks. */
static int t_close_pending(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 sc[2], pc;
    struct ft_comp c;
    struct fi_msg_tagged msg = {.addr = FI_ADDR_UNSPEC, .tag = 0x77, .context = &pc};
    int ret = open_tagged(r, &p);

    FT_TRY(ret);
    if (!ft_strict(r)) {
        ret = ft_skip(r, "FI_MR_LOCAL asks for descriptors");
        goto out;
    }
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, BIG, NULL, p.s[FT_CLI].peer, 0x76, &sc[0]));
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, 100, b.tx.desc, p.s[FT_CLI].peer, 0x77, &sc[1]));
    FT_TRY(expect_tsend(&p, &sc[1]));
    for (int tries = 0;; tries++) {
        FT_POST(&p, fi_trecvmsg(p.s[FT_SRV].ep, &msg, FI_PEEK | FI_CLAIM));
        FT_TRY(ft_wait_comp(&p, &p.s[FT_SRV].rx, &pc, &c));
        if (!c.is_err) break;
        FT_EXPECT(c.err == FI_ENOMSG && tries < 1000, "FI_PEEK | FI_CLAIM: err %d", c.err);
        ft_sleep_ms(1);
    }
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* fi_writedata to an endpoint with FI_TAGGED: the data reaches the target's
 * CQ, consuming its next untagged receive as without FI_TAGGED, and
 * messages go on to the receives after it. */
static int t_writedata(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.caps = FI_TAGGED};
    struct fi_context2 wc, rc[2], sc;
    struct ft_comp c;
    struct ft_rma e;
    int ret = FT_OK;

    if (r->opts->ep_type != FI_EP_RDM)
        return ft_skip(r, "tagged messages are tested on FI_EP_RDM endpoints");
    FT_TRY(ft_rma_open(r, &e, &cfg, 65536, 0));
    if (!e.c->info->domain_attr->cq_data_size) {
        ret = ft_skip(r, "cq_data_size 0");
        goto out;
    }
    FT_POST(&e.p, fi_recv(e.s->ep, e.tgt.buf + 32768, 64, e.tgt.desc, FI_ADDR_UNSPEC, &rc[0]));
    FT_POST(&e.p, fi_recv(e.s->ep, e.tgt.buf + 40000, 64, e.tgt.desc, FI_ADDR_UNSPEC, &rc[1]));
    ft_fill(e.loc.buf, 4096, 61);
    FT_POST(&e.p, fi_writedata(e.c->ep, e.loc.buf, 4096, e.loc.desc, 0x1234, e.c->peer, e.tgt.raddr,
                               e.tgt.key, &wc));
    FT_TRY(ft_expect_comp(&e.p, &e.s->rx, NULL, FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA, SIZE_MAX, &c));
    FT_EXPECT(c.e.data == 0x1234, "remote CQ data %#llx", (unsigned long long)c.e.data);
    FT_TRY(ft_deviation(r, c.e.op_context != &rc[0],
                        "the write's completion did not consume the first receive"));
    FT_TRY(ft_expect_pattern(r, e.tgt.buf, 4096, 61, "target at its remote completion"));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &wc, FI_RMA | FI_WRITE, SIZE_MAX, NULL));
    ft_fill(e.loc.buf + 8192, 64, 62);
    FT_POST(&e.p, fi_send(e.c->ep, e.loc.buf + 8192, 64, e.loc.desc, e.c->peer, &sc));
    FT_TRY(
        ft_expect_comp(&e.p, &e.s->rx, ft_strict(r) ? &rc[1] : NULL, FI_MSG | FI_RECV, 64, NULL));
    FT_TRY(ft_expect_comp(&e.p, &e.c->tx, &sc, FI_MSG | FI_SEND, SIZE_MAX, NULL));
out:
    return ft_rma_close(r, &e, ret);
}

/* An RDM endpoint with FI_TAGGED and one without cannot talk (every
 * message of the first carries a header): pmof refuses the connection,
 * either way, and says so with -FI_ECONNREFUSED, never misreading one
 * message. */
static int t_mismatch(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.caps = FI_TAGGED, .cli_caps_off = FI_TAGGED};
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc, sc;
    int ret = FT_OK;

    if (r->opts->ep_type != FI_EP_RDM)
        return ft_skip(r, "tagged messages are tested on FI_EP_RDM endpoints");
    if (!ft_strict(r)) return ft_skip(r, "how a provider refuses this is its own");
    FT_TRY(ft_pair_open(r, &p, &cfg));
    FT_TRY(tbufs_alloc(&p, 64, &b));
    FT_EXPECT(p.s[FT_CLI].info->caps & FI_MSG, "client info without FI_MSG");
    FT_POST(&p, fi_recv(p.s[FT_SRV].ep, b.rx.buf, 64, b.rx.desc, FI_ADDR_UNSPEC, &rc));
    for (int i = 0; i < 2; i++) {
        struct ft_side *s = &p.s[i ? FT_SRV : FT_CLI];
        void *buf = i ? b.rx.buf : b.tx.buf, *desc = i ? b.rx.desc : b.tx.desc;
        uint64_t t0 = ft_now_us();
        ssize_t rc2;

        while ((rc2 = fi_send(s->ep, buf, 8, desc, s->peer, &sc)) == -FI_EAGAIN &&
               ft_now_us() - t0 < FT_TIMEOUT_MS * 1000ULL)
            FT_TRY(ft_progress(&p));
        FT_EXPECT(rc2 == -FI_ECONNREFUSED, "%s: fi_send to a peer of the other kind = %zd (%s)",
                  s->name, rc2, fi_strerror((int)-rc2));
    }
    FT_TRY(ft_expect_quiet(&p, &p.s[FT_SRV].rx, 50, "a refused peer"));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

/* A test that ends with operations posted, as a failing one does: a
 * rendezvous send and its receive, scattered as in tagged.iov, and a
 * receive nothing matches.  The endpoints close with them under way, then
 * the clean-up frees the buffers, which nothing may touch any more. */
static int t_abandon(struct ft_run *r) {
    struct ft_pair p = {0};
    struct tbufs b = {0};
    struct fi_context2 rc[2], sc;
    int ret;

    /* Seen with libfabric 1.17: a NULL dereference in ofi_rxm's endpoint
     * close, whatever the order of the clean-up. */
    if (strstr(r->opts->prov, "ofi_rxm"))
        return ft_skip(r, "ofi_rxm crashes in fi_close of an endpoint with a rendezvous under way");
    ret = open_tagged(r, &p);
    FT_TRY(ret);
    FT_TRY(tbufs_alloc(&p, BIG, &b));
    size_t half = BIG / 2;
    struct iovec rx[2] = {{b.rx.buf, half}, {(uint8_t *)b.rx.buf + half, half}};
    void *rxd[2] = {b.rx.desc, b.rx.desc};
    size_t iov_limit = p.s[FT_SRV].info->rx_attr->iov_limit;

    FT_POST(&p, fi_trecv(p.s[FT_SRV].ep, b.rx.buf, 64, b.rx.desc, FI_ADDR_UNSPEC, 5, 0, &rc[0]));
    if (iov_limit >= 2)
        FT_POST(&p, fi_trecvv(p.s[FT_SRV].ep, rx, rxd, 2, FI_ADDR_UNSPEC, 6, 0, &rc[1]));
    else
        FT_POST(&p,
                fi_trecv(p.s[FT_SRV].ep, b.rx.buf, BIG, b.rx.desc, FI_ADDR_UNSPEC, 6, 0, &rc[1]));
    ft_fill(b.tx.buf, BIG, 93);
    FT_POST(&p, fi_tsend(p.s[FT_CLI].ep, b.tx.buf, BIG, b.tx.desc, p.s[FT_CLI].peer, 6, &sc));
    /* Far enough for the rendezvous to start, not to end. */
    for (int i = 0; i < 2; i++)
        FT_TRY(ft_progress(&p));
out:
    ret = tbufs_free(r, &p, &b, ret);
    return ft_pair_close(&p, ret);
}

const struct ft_test ft_tagged_tests[] = {
    {"tagged.pingpong", t_pingpong},
    {"tagged.unexpected", t_unexpected},
    {"tagged.ignore_order", t_ignore_order},
    {"tagged.truncate", t_truncate},
    {"tagged.data", t_data},
    {"tagged.inject", t_inject},
    {"tagged.peek_claim", t_peek_claim},
    {"tagged.untagged", t_untagged},
    {"tagged.iov", t_iov},
    {"tagged.writedata", t_writedata},
    {"tagged.directed", t_directed},
    {"tagged.no_desc", t_no_desc},
    {"tagged.close_pending", t_close_pending},
    {"tagged.mismatch", t_mismatch},
    {"tagged.abandon", t_abandon},
    {NULL, NULL},
};
