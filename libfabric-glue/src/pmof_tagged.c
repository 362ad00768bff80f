/* SPDX-License-Identifier: MIT */
/*
 * Tagged messages (FI_TAGGED) of RDM endpoints.
 *
 * Verbs matches a send with whatever receive is next, so an endpoint with
 * FI_TAGGED receives every message into buffers of its own and matches it
 * with the application's receives in software; its peers head every
 * message with a pmof_msg_hdr (pmof_wire.h), untagged ones included, and
 * agree on that when they connect (the hello's PMOF_RDM_HELLO_HEADERS).
 *
 * Up to the eager size a message travels behind its header and is copied
 * once, from the provider's buffer into the receive's (or, unexpected, into
 * memory of its own until a receive matches).  A larger one is announced
 * by an RTS naming the sender's memory (the application's registration
 * when it lets peers read, else one made for the occasion); the receiver,
 * once a receive matches, READs it straight into the receive's buffer and
 * answers with a FIN, which completes the send.
 *
 * Completions call in here with their CQ's lock held, so nothing here
 * posts from a completion: a READ or a FIN to post goes on a list of work
 * that pmof_tagged_progress runs, before the application's next read of a
 * CQ of the endpoint or post to it, or in the endpoint's CM thread, which
 * an eventfd wakes for it (data progress is automatic).  Entries produced off the CQ's own poll go
 * through pmof_cq_push.  Lock order: CQ, then tg->lock; tx_lock, then CQ.
 */
#include "pmof.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* An arrived message no receive has taken yet, or one being read. */
struct pmof_tmsg {
    struct pmof_tmsg *next;
    /* claimed (FI_PEEK | FI_CLAIM): on tg->claimed until taken */
    struct pmof_tmsg *cprev, *cnext;
    struct pmof_msg_hdr h;
    struct pmof_ep *ep; /* the connection it came on */
    fi_addr_t src;
    uint8_t *payload; /* EAGER: a copy of it */
};

/* A posted receive. */
struct pmof_trecv {
    struct pmof_trecv *next;
    bool tagged;
    uint64_t tag, ignore;
    fi_addr_t src; /* FI_ADDR_UNSPEC: any */
    void *context;
    bool report;
    struct iovec iov[PMOF_IOV_LIMIT];
    void *desc[PMOF_IOV_LIMIT];
    /* entries posted without a descriptor, registered to be READ into */
    struct ibv_mr *own_mr[PMOF_IOV_LIMIT];
    size_t count, total;
    struct pmof_hmem_io hmem;
    /* a rendezvous: the RTS, and READs not completed yet; on tg->reading
     * from the match to the end (a closing endpoint frees what is left) */
    struct pmof_trecv *rprev, *rnext;
    struct pmof_tmsg *msg;
    atomic_int reads_left;
    atomic_int status;
};

/* A rendezvous send waiting for its FIN. */
struct pmof_tsend {
    uint32_t gen;
    bool used;
    struct pmof_ep *ep; /* the connection its RTS went on: only its FIN counts */
    void *context;
    uint64_t cq_flags;
    size_t len;
    bool report;
    struct ibv_mr *mrs[PMOF_MSG_SEG_MAX];
    struct pmof_hmem_io hmem;
};

enum pmof_twork_kind { PMOF_TWORK_READ, PMOF_TWORK_FIN };

struct pmof_twork {
    struct pmof_twork *next;
    enum pmof_twork_kind kind;
    struct pmof_trecv *rv; /* READ */
    struct pmof_ep *ep;    /* FIN: where to */
    uint64_t cookie;
    int32_t status;
};

/* Free slot numbers of a fixed table (send buffers, rendezvous sends),
 * taken and given back under tg->lock: no search per message. */
struct slots {
    uint32_t *free, n;
};

static int slots_init(struct slots *sl, uint32_t count) {
    sl->free = calloc(count ? count : 1, sizeof(*sl->free));
    if (!sl->free) return -FI_ENOMEM;
    for (sl->n = 0; sl->n < count; sl->n++)
        sl->free[sl->n] = count - 1 - sl->n;
    return 0;
}

/* A slot's number from 1, or 0 when all are taken. */
static uint32_t slots_get(struct slots *sl) {
    return sl->n ? sl->free[--sl->n] + 1 : 0;
}

static void slots_put(struct slots *sl, uint32_t slot) {
    sl->free[sl->n++] = slot - 1;
}

struct pmof_tagged {
    pthread_mutex_t lock;
    /* posted receives, each kind in the order posted */
    struct pmof_trecv *posted[2], **posted_tail[2];
    size_t nposted, rx_size;
    /* unexpected messages, in arrival order, and their number and bytes */
    struct pmof_tmsg *unexp, **unexp_tail;
    size_t nunexp, unexp_bytes;
    /* claimed messages, and rendezvous receives being read */
    struct pmof_tmsg *claimed;
    struct pmof_trecv *reading;
    /* written when work is queued: the CM thread runs it */
    int work_fd;
    /* work left by completions */
    struct pmof_twork *work, **work_tail;
    atomic_flag busy;
    /* the provider's receive buffers */
    uint8_t *pool;
    struct ibv_mr *pool_mr;
    size_t buf_size, eager_size;
    /* rendezvous sends, found again by the cookie their FIN echoes */
    struct pmof_tsend *ts;
    uint32_t nts;
    struct slots ts_free;
    /* Rendezvous in flight end on the other CQ than the one the
     * application may be reading: READs on the transmit CQ, FINs on the
     * receive CQ.  While there are any, reading either polls both. */
    atomic_int reads_out, sends_out;
    /* Send buffers for eager messages the device cannot gather behind a
     * header (no descriptor, or no scatter entry left): copied there, the
     * buffer back at the send's completion. */
    uint8_t *sbufs;
    struct ibv_mr *sbuf_mr;
    struct slots sbuf_free;
};

#define PMOF_SEND_BUFS 64
/* What a peer may leave unmatched before its messages are dropped. */
#define PMOF_UNEXP_MAX 65536
#define PMOF_UNEXP_BYTES_MAX (256u << 20)

/* ------------------------------------------------------------- helpers */

static size_t iov_total(const struct iovec *iov, size_t count) {
    size_t n = 0;

    for (size_t i = 0; i < count; i++)
        n += iov[i].iov_len;
    return n;
}

/* Copies `len` bytes into the iov; returns how many fitted. */
static size_t copy_to_iov(const struct iovec *iov, size_t count, const uint8_t *src, size_t len) {
    size_t done = 0;

    for (size_t i = 0; i < count && done < len; i++) {
        size_t n = iov[i].iov_len < len - done ? iov[i].iov_len : len - done;
        memcpy(iov[i].iov_base, src + done, n);
        done += n;
    }
    return done;
}

static bool matches(const struct pmof_trecv *rv, const struct pmof_tmsg *m) {
    if (rv->tagged != !!(m->h.flags & PMOF_MSG_TAGGED)) return false;
    if (rv->src != FI_ADDR_UNSPEC && rv->src != m->src) return false;
    return !rv->tagged || (rv->tag | rv->ignore) == (m->h.tag | rv->ignore);
}

static uint64_t recv_flags(const struct pmof_tmsg *m) {
    uint64_t f = (m->h.flags & PMOF_MSG_TAGGED) ? FI_TAGGED | FI_RECV : FI_MSG | FI_RECV;
    return (m->h.flags & PMOF_MSG_CQ_DATA) ? f | FI_REMOTE_CQ_DATA : f;
}

static void msg_entry(const struct pmof_tmsg *m, void *context, struct pmof_cq_entry *e) {
    memset(e, 0, sizeof(*e));
    e->op_context = context;
    e->flags = recv_flags(m);
    e->len = m->h.len;
    e->tag = (m->h.flags & PMOF_MSG_TAGGED) ? m->h.tag : 0;
    e->data = (m->h.flags & PMOF_MSG_CQ_DATA) ? m->h.data : 0;
    e->src_addr = m->src;
}

static void msg_free(struct pmof_tmsg *m) {
    if (m) free(m->payload);
    free(m);
}

/* A receive that is over, with the message it took and what was
 * registered for it. */
static void trecv_free(struct pmof_trecv *rv) {
    for (size_t i = 0; i < PMOF_IOV_LIMIT; i++)
        if (rv->own_mr[i]) ibv_dereg_mr(rv->own_mr[i]);
    msg_free(rv->msg);
    free(rv);
}

/* Adds work (tg->lock held). */
static void work_push(struct pmof_tagged *tg, struct pmof_twork *w) {
    uint64_t one = 1;

    w->next = NULL;
    if (tg->work_tail == &tg->work)
        __atomic_store_n(&tg->work, w, __ATOMIC_RELEASE);
    else
        *tg->work_tail = w;
    tg->work_tail = &w->next;
    if (write(tg->work_fd, &one, sizeof(one)) < 0) {
        /* Full counter: the thread has a wake-up pending anyway. */
    }
}

/* A rendezvous began: one of its ends will come on the endpoint's other
 * CQ, so a thread asleep on either CQ looks at both from now on. */
static void wake_cqs(struct pmof_rdm *rdm) {
    pmof_cq_wake(rdm->tx_cq);
    if (rdm->rx_cq != rdm->tx_cq) pmof_cq_wake(rdm->rx_cq);
}

/* A FIN to answer an RTS with (tg->lock held); without memory the sender
 * never completes, which is all that can be done. */
static void queue_fin(struct pmof_tagged *tg, struct pmof_ep *ep, uint64_t cookie, int status) {
    struct pmof_twork *w = calloc(1, sizeof(*w));

    if (!w) {
        PMOF_WARN(FI_LOG_EP_DATA, "no memory for a FIN: the peer's send will not complete\n");
        return;
    }
    w->kind = PMOF_TWORK_FIN;
    w->ep = ep;
    w->cookie = cookie;
    w->status = status;
    work_push(tg, w);
}

static void count_recv(struct pmof_rdm *rdm, bool ok);

/* A matched RTS: its READs go on the work list (tg->lock held). */
static void queue_read(struct pmof_tagged *tg, struct pmof_trecv *rv) {
    struct pmof_twork *w = calloc(1, sizeof(*w));
    struct pmof_rdm *rdm = rv->msg->ep->rdm;

    if (!w) {
        /* The receive fails; the sender learns it from the FIN. */
        struct pmof_tmsg *m = rv->msg;
        struct pmof_cq_entry e;
        msg_entry(m, rv->context, &e);
        e.err = FI_ENOMEM;
        pmof_cq_push(rdm->rx_cq, &e);
        count_recv(rdm, false);
        queue_fin(tg, m->ep, m->h.cookie, -FI_ENOMEM);
        trecv_free(rv);
        return;
    }
    atomic_fetch_add(&tg->reads_out, 1);
    rv->rprev = NULL;
    rv->rnext = tg->reading;
    if (tg->reading) tg->reading->rprev = rv;
    tg->reading = rv;
    w->kind = PMOF_TWORK_READ;
    w->rv = rv;
    work_push(tg, w);
    wake_cqs(rdm);
}

/* ------------------------------------------------------------ receives */

/* Delivers an eager message into a receive: the entry is `e`.  Returns the
 * counter outcome: true for success. */
static bool deliver_eager(struct pmof_trecv *rv, const struct pmof_tmsg *m, const uint8_t *payload,
                          struct pmof_cq_entry *e) {
    size_t n = copy_to_iov(rv->iov, rv->count, payload, m->h.len);

    msg_entry(m, rv->context, e);
    e->buf = rv->count ? rv->iov[0].iov_base : NULL;
    e->len = n;
    pmof_hmem_complete(&rv->hmem, n);
    if (n < m->h.len) {
        e->err = FI_ETRUNC;
        e->olen = m->h.len - n;
        return false;
    }
    return true;
}

static void count_recv(struct pmof_rdm *rdm, bool ok) {
    struct pmof_cntr *c = rdm->cntrs[PMOF_CNTR_RECV];

    if (!c) return;
    if (ok)
        pmof_cntr_inc(c);
    else
        pmof_cntr_err(c);
}

/* The first posted receive `m` matches, taken off its list (lock held). */
static struct pmof_trecv *take_posted(struct pmof_tagged *tg, const struct pmof_tmsg *m) {
    int k = (m->h.flags & PMOF_MSG_TAGGED) ? 1 : 0;
    struct pmof_trecv **pp = &tg->posted[k];

    for (; *pp; pp = &(*pp)->next) {
        struct pmof_trecv *rv = *pp;
        if (!matches(rv, m)) continue;
        *pp = rv->next;
        if (!*pp) tg->posted_tail[k] = pp;
        tg->nposted--;
        return rv;
    }
    return NULL;
}

static struct pmof_tmsg *take_unexpected(struct pmof_tagged *tg, const struct pmof_trecv *rv,
                                         bool remove) {
    struct pmof_tmsg **pp = &tg->unexp;

    for (; *pp; pp = &(*pp)->next) {
        struct pmof_tmsg *m = *pp;
        if (!matches(rv, m)) continue;
        if (remove) {
            *pp = m->next;
            if (!*pp) tg->unexp_tail = pp;
            tg->nunexp--;
            if (m->h.type == PMOF_MSG_EAGER) tg->unexp_bytes -= m->h.len;
        }
        return m;
    }
    return NULL;
}

static int repost(struct pmof_rdm *rdm, struct pmof_op *op) {
    struct ibv_sge sge = {
        .addr = (uintptr_t)op->buf,
        .length = (uint32_t)rdm->tg->buf_size,
        .lkey = rdm->tg->pool_mr->lkey,
    };
    struct ibv_recv_wr wr = {.wr_id = (uintptr_t)op, .sg_list = &sge, .num_sge = 1}, *bad;
    int ret;

    pmof_lock(&rdm->rx_lock);
    ret = ibv_post_srq_recv(rdm->srq, &wr, &bad);
    pmof_unlock(&rdm->rx_lock);
    if (ret) PMOF_WARN(FI_LOG_EP_DATA, "cannot repost a receive buffer: %s\n", strerror(ret));
    return ret;
}

static void on_fin(struct pmof_rdm *rdm, struct pmof_ep *ep, const struct pmof_msg_hdr *h);

bool pmof_tagged_recv_complete(struct pmof_rdm *rdm, struct pmof_op *op, const struct ibv_wc *wc,
                               struct pmof_cq_entry *out, struct pmof_cntr **cntr) {
    struct pmof_tagged *tg = rdm->tg;
    struct pmof_conn *c = pmof_rdm_conn_by_qpn(rdm, wc->qp_num);
    struct pmof_tmsg m = {0}, *um = NULL;
    struct pmof_trecv *rv;
    bool report = false;

    *cntr = NULL;
    if (rdm->closing) return false;
    if (wc->status != IBV_WC_SUCCESS) {
        /* Only the queue's end flushes its buffers; a peer's fault fails
         * its QP, not the shared queue. */
        if (wc->status != IBV_WC_WR_FLUSH_ERR) repost(rdm, op);
        return false;
    }
    memset(out, 0, sizeof(*out));
    if (wc->opcode != IBV_WC_RECV) {
        /* A remote write with immediate data used the buffer.  Under
         * FI_RX_CQ_DATA it consumes the application's next untagged
         * receive, as it does on endpoints without FI_TAGGED. */
        out->flags = FI_MSG | FI_RECV;
        out->src_addr = pmof_rdm_src_addr(rdm, c);
        pmof_recv_entry(wc, out, rdm->cntrs, cntr);
        if (rdm->info->mode & FI_RX_CQ_DATA) {
            pthread_mutex_lock(&tg->lock);
            rv = tg->posted[0];
            if (rv) {
                tg->posted[0] = rv->next;
                if (!rv->next) tg->posted_tail[0] = &tg->posted[0];
                tg->nposted--;
                out->op_context = rv->context;
            }
            pthread_mutex_unlock(&tg->lock);
            free(rv);
        }
        repost(rdm, op);
        return true;
    }
    if (!c || !pmof_msg_parse(op->buf, wc->byte_len, &m.h)) {
        PMOF_WARN(FI_LOG_EP_DATA, "dropped a malformed message of %u bytes from QP %u\n",
                  wc->byte_len, wc->qp_num);
        repost(rdm, op);
        return false;
    }
    if (m.h.type == PMOF_MSG_FIN) {
        on_fin(rdm, c->ep, &m.h);
        repost(rdm, op);
        return false;
    }
    m.ep = c->ep;
    m.src = pmof_rdm_src_addr(rdm, c);
    pthread_mutex_lock(&tg->lock);
    rv = take_posted(tg, &m);
    if (rv && m.h.type == PMOF_MSG_EAGER) {
        bool ok = deliver_eager(rv, &m, (const uint8_t *)op->buf + PMOF_MSG_HDR_LEN, out);
        report = rv->report || !ok;
        count_recv(rdm, ok);
        free(rv);
    } else if (rv) {
        rv->msg = malloc(sizeof(*rv->msg));
        if (rv->msg) *rv->msg = m;
        if (rv->msg) {
            queue_read(tg, rv);
        } else {
            msg_entry(&m, rv->context, out);
            out->err = FI_ENOMEM;
            report = true;
            count_recv(rdm, false);
            queue_fin(tg, m.ep, m.h.cookie, -FI_ENOMEM);
            free(rv);
        }
    } else if (tg->nunexp >= PMOF_UNEXP_MAX || tg->unexp_bytes + m.h.len > PMOF_UNEXP_BYTES_MAX) {
        PMOF_WARN(FI_LOG_EP_DATA,
                  "%zu unexpected messages (%zu bytes) wait for receives: one more dropped\n",
                  tg->nunexp, tg->unexp_bytes);
        if (m.h.type == PMOF_MSG_RTS) queue_fin(tg, m.ep, m.h.cookie, -FI_ENOSPC);
        rv = NULL;
        um = NULL;
        m.h.type = 0; /* reported here, not below */
    } else if ((um = malloc(sizeof(*um)))) {
        *um = m;
        if (m.h.type == PMOF_MSG_EAGER && m.h.len) {
            um->payload = malloc(m.h.len);
            if (um->payload) memcpy(um->payload, (uint8_t *)op->buf + PMOF_MSG_HDR_LEN, m.h.len);
        }
        if (m.h.type == PMOF_MSG_EAGER && m.h.len && !um->payload) {
            free(um);
            um = NULL;
        } else {
            um->next = NULL;
            *tg->unexp_tail = um;
            tg->unexp_tail = &um->next;
            tg->nunexp++;
            if (m.h.type == PMOF_MSG_EAGER) tg->unexp_bytes += m.h.len;
        }
    }
    if (!rv && !um && m.h.type) {
        PMOF_WARN(FI_LOG_EP_DATA, "no memory for an unexpected message of %llu bytes: dropped\n",
                  (unsigned long long)m.h.len);
        if (m.h.type == PMOF_MSG_RTS) queue_fin(tg, m.ep, m.h.cookie, -FI_ENOMEM);
    }
    pthread_mutex_unlock(&tg->lock);
    repost(rdm, op);
    return report;
}

/* A rendezvous receive's READs are all done (or failed). */
static void read_done(struct pmof_rdm *rdm, struct pmof_trecv *rv) {
    struct pmof_tagged *tg = rdm->tg;
    struct pmof_tmsg *m = rv->msg;
    struct pmof_cq_entry e;
    int status = atomic_load(&rv->status);
    size_t n = m->h.len < rv->total ? m->h.len : rv->total;

    msg_entry(m, rv->context, &e);
    e.buf = rv->count ? rv->iov[0].iov_base : NULL;
    e.len = n;
    if (status) {
        e.err = -status;
    } else {
        pmof_hmem_complete(&rv->hmem, n);
        if (n < m->h.len) {
            e.err = FI_ETRUNC;
            e.olen = m->h.len - n;
        }
    }
    count_recv(rdm, !e.err);
    if ((rv->report || e.err) && !rdm->closing) pmof_cq_push(rdm->rx_cq, &e);
    pthread_mutex_lock(&tg->lock);
    queue_fin(tg, m->ep, m->h.cookie, status);
    if (rv->rprev)
        rv->rprev->rnext = rv->rnext;
    else
        tg->reading = rv->rnext;
    if (rv->rnext) rv->rnext->rprev = rv->rprev;
    pthread_mutex_unlock(&tg->lock);
    atomic_fetch_sub(&tg->reads_out, 1);
    trecv_free(rv);
}

/* One READ of a rendezvous: a piece that is contiguous on both sides. */
struct read_piece {
    uint64_t raddr;
    uint32_t rkey;
    struct ibv_sge sge;
};

#define READ_PIECES_MAX (PMOF_MSG_SEG_MAX + PMOF_IOV_LIMIT)

/* The local key of receive entry `i`: its descriptor's, or a registration
 * of its own for an application that passed none (Open MPI's, whatever
 * FI_MR_LOCAL says).  0 or -FI_E*. */
static int entry_lkey(struct pmof_trecv *rv, size_t i, struct pmof_domain *dom, uint32_t *lkey) {
    const struct pmof_mr *mr = rv->desc[i];

    if (mr && mr->mr_fid.fid.fclass == FI_CLASS_MR && mr->ibv) {
        *lkey = mr->ibv->lkey;
        return 0;
    }
    if (!rv->own_mr[i]) {
        rv->own_mr[i] =
            ibv_reg_mr(dom->pd, rv->iov[i].iov_base, rv->iov[i].iov_len, IBV_ACCESS_LOCAL_WRITE);
        if (!rv->own_mr[i]) return pmof_errno(errno);
    }
    *lkey = rv->own_mr[i]->lkey;
    return 0;
}

/* Cuts what fits of the sender's segments along the receive's iov, so
 * that every READ has one SGE (which any device takes).  Returns the
 * number of pieces, or -FI_E* when a receive entry cannot be registered. */
static int read_pieces(struct pmof_trecv *rv, const struct pmof_msg_hdr *h, struct pmof_domain *dom,
                       struct read_piece *out) {
    size_t want = h->len < rv->total ? h->len : rv->total;
    size_t li = 0, loff = 0, done = 0;
    int n = 0;

    for (uint32_t s = 0; s < h->count && done < want; s++) {
        size_t soff = 0;
        while (soff < h->segs[s].len && done < want) {
            uint32_t lkey = 0;
            size_t len;
            int ret;

            while (li < rv->count && loff == rv->iov[li].iov_len) {
                li++;
                loff = 0;
            }
            if (li == rv->count || n == READ_PIECES_MAX) return n;
            ret = entry_lkey(rv, li, dom, &lkey);
            if (ret) return ret;
            len = rv->iov[li].iov_len - loff;
            if (len > h->segs[s].len - soff) len = h->segs[s].len - soff;
            if (len > want - done) len = want - done;
            out[n].raddr = h->segs[s].addr + soff;
            out[n].rkey = h->segs[s].rkey;
            out[n].sge.addr = (uintptr_t)rv->iov[li].iov_base + loff;
            out[n].sge.length = (uint32_t)len;
            out[n].sge.lkey = lkey;
            n++;
            soff += len;
            loff += len;
            done += len;
        }
    }
    return n;
}

/* Posts the READs of a matched RTS: 0, or -FI_EAGAIN to try again later. */
static int post_reads(struct pmof_rdm *rdm, struct pmof_trecv *rv) {
    struct pmof_tmsg *m = rv->msg;
    struct pmof_ep *ep = m->ep;
    struct read_piece pc[READ_PIECES_MAX];
    int n = read_pieces(rv, &m->h, rdm->dom, pc);
    ssize_t ret;

    /* A QP in error flushes the READs, which fails the receive. */
    if (n <= 0) {
        if (n) atomic_store(&rv->status, n);
        read_done(rdm, rv);
        return 0;
    }
    atomic_store(&rv->reads_left, n);
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    for (int i = 0; i < n; i++) {
        struct pmof_op *op = pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, FI_RMA | FI_READ,
                                        pc[i].sge.length, PMOF_CNTR_NONE);
        if (!op) {
            pmof_tx_abort(ep);
            pmof_unlock(&ep->tx_lock);
            return -FI_EAGAIN;
        }
        op->trecv = rv;
        op->signaled = true;
        pmof_tx_wr(ep, op, 0);
        ibv_wr_rdma_read(ep->qpx, pc[i].rkey, pc[i].raddr);
        ibv_wr_set_sge(ep->qpx, pc[i].sge.lkey, pc[i].sge.addr, pc[i].sge.length);
    }
    ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    if (ret) {
        atomic_store(&rv->status, (int)ret);
        read_done(rdm, rv);
    }
    return 0;
}

/* ------------------------------------------------------------- sending */

/* The registered header of a ring slot, allocated at the first use. */
static int slot_header(struct pmof_ep *ep, const struct pmof_op *op, struct ibv_sge *sge,
                       const uint8_t *hdr, size_t len) {
    size_t slot = (size_t)(op - ep->tx.ops);

    if (!ep->msg_hdrs) {
        size_t bytes = (size_t)ep->tx.size * PMOF_MSG_CTRL_MAX;
        ep->msg_hdrs = malloc(bytes);
        if (!ep->msg_hdrs) return -FI_ENOMEM;
        ep->msg_hdr_mr = ibv_reg_mr(ep->dom->pd, ep->msg_hdrs, bytes, IBV_ACCESS_LOCAL_WRITE);
        if (!ep->msg_hdr_mr) {
            int err = errno;
            free(ep->msg_hdrs);
            ep->msg_hdrs = NULL;
            return pmof_errno(err);
        }
    }
    memcpy(ep->msg_hdrs + slot * PMOF_MSG_CTRL_MAX, hdr, len);
    sge->addr = (uintptr_t)(ep->msg_hdrs + slot * PMOF_MSG_CTRL_MAX);
    sge->length = (uint32_t)len;
    sge->lkey = ep->msg_hdr_mr->lkey;
    return 0;
}

/* Header and payload end to end in `out`. */
static size_t gather(uint8_t *out, const uint8_t *hdr, size_t hlen, const struct iovec *iov,
                     size_t count) {
    size_t len = hlen;

    memcpy(out, hdr, hlen);
    for (size_t i = 0; i < count; i++) {
        memcpy(out + len, iov[i].iov_base, iov[i].iov_len);
        len += iov[i].iov_len;
    }
    return len;
}

/*
 * One headed send on a connection (tx_lock held, batch started): the
 * header and `count` entries of payload, inline when they fit, else copied
 * into `sbuf` (a registered send buffer) when given, else from a header of
 * the slot's and the payload's own entries.  `op` is the request's slot.
 */
static int post_headed(struct pmof_ep *ep, struct pmof_op *op, const struct pmof_msg_hdr *h,
                       const struct iovec *iov, void **desc, size_t count, size_t total,
                       unsigned int sflags, const struct ibv_sge *sbuf) {
    uint8_t hdr[PMOF_MSG_CTRL_MAX];
    size_t hlen = pmof_msg_encode(hdr, h);
    struct ibv_sge sge[PMOF_IOV_LIMIT + 1];
    int n;

    pmof_tx_wr(ep, op, sflags | (hlen + total <= ep->max_inline ? IBV_SEND_INLINE : 0));
    ibv_wr_send(ep->qpx);
    if (hlen + total <= ep->max_inline) {
        uint8_t buf[PMOF_INLINE_MAX];
        ibv_wr_set_inline_data(ep->qpx, buf, gather(buf, hdr, hlen, iov, count));
        return 0;
    }
    if (sbuf) {
        size_t len = gather((uint8_t *)(uintptr_t)sbuf->addr, hdr, hlen, iov, count);
        ibv_wr_set_sge(ep->qpx, sbuf->lkey, sbuf->addr, (uint32_t)len);
        return 0;
    }
    n = slot_header(ep, op, &sge[0], hdr, hlen);
    if (n) return n;
    n = count ? pmof_fill_sge(iov, desc, count, sge + 1, &total) : 0;
    if (n < 0) return n;
    ibv_wr_set_sge_list(ep->qpx, (size_t)n + 1, sge);
    return 0;
}

/* Frees a rendezvous send's slot and its registrations; a cookie handed
 * out for it earlier names nothing from then on. */
static void tsend_release(struct pmof_tagged *tg, struct pmof_tsend *ts) {
    for (int i = 0; i < PMOF_MSG_SEG_MAX; i++)
        if (ts->mrs[i]) ibv_dereg_mr(ts->mrs[i]);
    pthread_mutex_lock(&tg->lock);
    memset(ts->mrs, 0, sizeof(ts->mrs));
    ts->used = false;
    ts->gen++;
    slots_put(&tg->ts_free, (uint32_t)(ts - tg->ts) + 1);
    pthread_mutex_unlock(&tg->lock);
}

static void tsend_finish(struct pmof_rdm *rdm, struct pmof_tsend *ts, int status) {
    struct pmof_cq_entry e = {0};
    struct pmof_cntr *c = rdm->cntrs[PMOF_CNTR_SEND];

    e.op_context = ts->context;
    e.flags = ts->cq_flags;
    e.len = ts->len;
    e.src_addr = FI_ADDR_NOTAVAIL;
    e.err = -status;
    if (c) {
        if (status)
            pmof_cntr_err(c);
        else
            pmof_cntr_inc(c);
    }
    if ((ts->report || status) && !rdm->closing) pmof_cq_push(rdm->tx_cq, &e);
    tsend_release(rdm->tg, ts);
    atomic_fetch_sub(&rdm->tg->sends_out, 1);
}

/* The send a cookie names, if it is still waiting; its cookie is spent
 * (a second FIN finds nothing), its slot stays taken until tsend_finish. */
static struct pmof_tsend *tsend_find(struct pmof_tagged *tg, uint64_t cookie,
                                     const struct pmof_ep *ep) {
    uint32_t idx = (uint32_t)cookie, gen = (uint32_t)(cookie >> 32);
    struct pmof_tsend *ts = NULL;

    pthread_mutex_lock(&tg->lock);
    /* Only the connection the RTS went on, so no other peer can complete
     * a send whose buffer is still being read. */
    if (idx && idx <= tg->nts && tg->ts[idx - 1].used && tg->ts[idx - 1].gen == gen &&
        tg->ts[idx - 1].ep == ep) {
        ts = &tg->ts[idx - 1];
        ts->gen++;
    }
    pthread_mutex_unlock(&tg->lock);
    return ts;
}

static void on_fin(struct pmof_rdm *rdm, struct pmof_ep *ep, const struct pmof_msg_hdr *h) {
    struct pmof_tsend *ts = tsend_find(rdm->tg, h->cookie, ep);

    if (!ts) {
        PMOF_WARN(FI_LOG_EP_DATA, "a FIN for no send (cookie 0x%llx): ignored\n",
                  (unsigned long long)h->cookie);
        return;
    }
    tsend_finish(rdm, ts, h->status ? -FI_EIO : 0);
}

void pmof_tagged_tx_complete(struct pmof_ep *ep, const struct pmof_op *op,
                             const struct ibv_wc *wc) {
    struct pmof_rdm *rdm = ep->rdm;

    if (!rdm || !rdm->tg) return;
    if (op->trecv) {
        struct pmof_trecv *rv = op->trecv;
        if (wc->status != IBV_WC_SUCCESS) {
            int zero = 0;
            atomic_compare_exchange_strong(&rv->status, &zero, -pmof_wc_errno(wc->status));
        }
        if (atomic_fetch_sub(&rv->reads_left, 1) == 1) read_done(rdm, rv);
        return;
    }
    /* An RTS that failed: no FIN will come. */
    if (op->tsend && wc->status != IBV_WC_SUCCESS) {
        struct pmof_tsend *ts = tsend_find(rdm->tg, op->tsend, ep);
        if (ts) tsend_finish(rdm, ts, -pmof_wc_errno(wc->status));
    }
}

static int post_fin(struct pmof_twork *w) {
    struct pmof_ep *ep = w->ep;
    struct pmof_msg_hdr h = {.type = PMOF_MSG_FIN, .cookie = w->cookie, .status = w->status};
    struct pmof_op *op;
    int ret;

    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, FI_MSG | FI_SEND, 0, PMOF_CNTR_NONE);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        return -FI_EAGAIN;
    }
    /* A FIN the QP flushes (the sender is gone) is nobody's error. */
    op->bounce = true;
    ret = post_headed(ep, op, &h, NULL, NULL, 0, 0, 0, NULL);
    if (ret) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        return ret;
    }
    ret = (int)pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    return ret;
}

bool pmof_tagged_has_work(struct pmof_rdm *rdm) {
    struct pmof_tagged *tg = rdm->tg;

    return tg && (__atomic_load_n(&tg->work, __ATOMIC_RELAXED) || atomic_load(&tg->reads_out) ||
                  atomic_load(&tg->sends_out));
}

void pmof_tagged_progress(struct pmof_rdm *rdm) {
    struct pmof_tagged *tg = rdm->tg;

    if (!tg) return;
    if (atomic_load(&tg->reads_out) && rdm->tx_cq != rdm->rx_cq) pmof_cq_progress(rdm->tx_cq);
    if (atomic_load(&tg->sends_out) && rdm->tx_cq != rdm->rx_cq) pmof_cq_progress(rdm->rx_cq);
    if (!__atomic_load_n(&tg->work, __ATOMIC_RELAXED)) return;
    if (atomic_flag_test_and_set(&tg->busy)) return;
    for (;;) {
        struct pmof_twork *w;
        int ret;

        pthread_mutex_lock(&tg->lock);
        w = tg->work;
        if (w) {
            __atomic_store_n(&tg->work, w->next, __ATOMIC_RELAXED);
            if (!w->next) tg->work_tail = &tg->work;
        }
        pthread_mutex_unlock(&tg->lock);
        if (!w) break;
        ret = w->kind == PMOF_TWORK_READ ? post_reads(rdm, w->rv) : post_fin(w);
        if (ret == -FI_EAGAIN) {
            /* The queue is full: first in line again, next time. */
            pthread_mutex_lock(&tg->lock);
            w->next = tg->work;
            __atomic_store_n(&tg->work, w, __ATOMIC_RELAXED);
            if (!w->next) tg->work_tail = &w->next;
            pthread_mutex_unlock(&tg->lock);
            break;
        }
        if (ret) PMOF_WARN(FI_LOG_EP_DATA, "cannot post a FIN: %s\n", fi_strerror(-ret));
        free(w);
    }
    atomic_flag_clear(&tg->busy);
}

/* A rendezvous send: registers the payload, posts the RTS. */
static ssize_t send_rts(struct pmof_rdm *rdm, struct pmof_ep *ep, struct pmof_msg_hdr *h,
                        const struct iovec *iov, void **desc, size_t count, size_t total,
                        void *context, uint64_t flags, uint64_t cq_flags, unsigned int sflags) {
    struct pmof_tagged *tg = rdm->tg;
    struct pmof_tsend *ts = NULL;
    struct pmof_op *op;
    uint32_t idx;
    ssize_t ret;

    pthread_mutex_lock(&tg->lock);
    idx = slots_get(&tg->ts_free);
    if (idx) {
        ts = &tg->ts[--idx];
        ts->used = true;
    }
    pthread_mutex_unlock(&tg->lock);
    if (!ts) return -FI_EAGAIN;
    ts->ep = ep;
    ts->context = context;
    ts->cq_flags = cq_flags;
    ts->len = total;
    ts->report = pmof_ep_wants_completion(ep, true, flags);
    h->type = PMOF_MSG_RTS;
    h->count = 0;
    h->cookie = (uint64_t)ts->gen << 32 | (idx + 1);
    for (size_t i = 0; i < count; i++) {
        const struct pmof_mr *mr = desc ? desc[i] : NULL;
        uintptr_t base = (uintptr_t)iov[i].iov_base;

        if (!iov[i].iov_len) continue;
        /* The application's registration when it lets peers read (send
         * buffers do), else one of our own until the FIN. */
        if (mr && mr->mr_fid.fid.fclass == FI_CLASS_MR && mr->ibv &&
            (mr->access & IBV_ACCESS_REMOTE_READ) && base >= (uintptr_t)mr->ibv->addr &&
            base + iov[i].iov_len <= (uintptr_t)mr->ibv->addr + mr->ibv->length) {
            h->segs[h->count].rkey = mr->ibv->rkey;
        } else {
            ts->mrs[h->count] =
                ibv_reg_mr(ep->dom->pd, iov[i].iov_base, iov[i].iov_len, IBV_ACCESS_REMOTE_READ);
            if (!ts->mrs[h->count]) {
                ret = pmof_errno(errno);
                goto fail;
            }
            h->segs[h->count].rkey = ts->mrs[h->count]->rkey;
        }
        h->segs[h->count].addr = base;
        h->segs[h->count].len = iov[i].iov_len;
        h->count++;
    }
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, cq_flags, 0, PMOF_CNTR_NONE);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        ret = -FI_EAGAIN;
        goto fail;
    }
    op->tsend = h->cookie;
    ret = post_headed(ep, op, h, NULL, NULL, 0, 0, sflags, NULL);
    if (ret)
        pmof_tx_abort(ep);
    else
        ret = pmof_tx_post(ep);
    if (!ret) {
        atomic_fetch_add(&tg->sends_out, 1);
        wake_cqs(rdm);
    }
    pmof_unlock(&ep->tx_lock);
    if (ret) goto fail;
    return 0;
fail:
    tsend_release(tg, ts);
    return ret;
}

/* A send buffer's number (from 1), or 0 when all are in use. */
static uint32_t sbuf_get(struct pmof_tagged *tg) {
    uint32_t b = 0;

    pthread_mutex_lock(&tg->lock);
    b = slots_get(&tg->sbuf_free);
    pthread_mutex_unlock(&tg->lock);
    return b;
}

void pmof_tagged_sbuf_put(struct pmof_rdm *rdm, uint32_t b) {
    struct pmof_tagged *tg = rdm ? rdm->tg : NULL;

    if (!tg || !b) return;
    pthread_mutex_lock(&tg->lock);
    slots_put(&tg->sbuf_free, b);
    pthread_mutex_unlock(&tg->lock);
}

static bool registered(void **desc, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const struct pmof_mr *mr = desc ? desc[i] : NULL;
        if (!mr || mr->mr_fid.fid.fclass != FI_CLASS_MR || !mr->ibv) return false;
    }
    return true;
}

ssize_t pmof_tagged_send(struct pmof_rdm *rdm, fi_addr_t dest, const struct iovec *iov, void **desc,
                         size_t count, uint64_t tag, uint64_t data, void *context, uint64_t flags,
                         bool tagged) {
    struct pmof_msg_hdr h = {.type = PMOF_MSG_EAGER, .tag = tagged ? tag : 0};
    uint64_t cq_flags = tagged ? FI_TAGGED | FI_SEND : FI_MSG | FI_SEND;
    struct iovec staged[PMOF_IOV_LIMIT];
    unsigned int sflags = (flags & FI_FENCE) ? IBV_SEND_FENCE : 0;
    struct pmof_op *op;
    struct pmof_ep *ep;
    struct ibv_sge sge;
    uint32_t sbuf = 0;
    size_t total;
    ssize_t ret = 0;

    if (!rdm->tg) return -FI_EOPBADSTATE; /* not enabled */
    pmof_tagged_progress(rdm);
    ep = pmof_rdm_conn(rdm, dest, &ret);
    if (!ep) return ret;
    ret = pmof_hmem_prepare(rdm->dom, &iov, desc, count, staged, true, NULL);
    if (ret) return ret;
    if (count > rdm->dom->tx_iov_limit || count > PMOF_MSG_SEG_MAX || (count && !iov))
        return -FI_EINVAL;
    total = iov_total(iov, count);
    if (total > PMOF_MAX_MSG_SIZE) return -FI_EMSGSIZE;
    if (!total) count = 0;
    if ((flags & FI_INJECT) && PMOF_MSG_HDR_LEN + total > ep->max_inline) return -FI_EINVAL;
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    h.len = total;
    h.flags = tagged ? PMOF_MSG_TAGGED : 0;
    if (flags & FI_REMOTE_CQ_DATA) {
        h.flags |= PMOF_MSG_CQ_DATA;
        h.data = data;
    }
    /* Eager: inline, or behind a header of its own when the device has an
     * SGE left for it and the payload is registered, or copied into a send
     * buffer; larger ones by rendezvous, which registers what it sends. */
    if (PMOF_MSG_HDR_LEN + total > ep->max_inline && total > rdm->tg->eager_size)
        return send_rts(rdm, ep, &h, iov, desc, count, total, context, flags, cq_flags, sflags);
    if (PMOF_MSG_HDR_LEN + total > ep->max_inline &&
        (count + 1 > rdm->dom->tx_iov_limit || !registered(desc, count))) {
        sbuf = sbuf_get(rdm->tg);
        if (!sbuf) return -FI_EAGAIN;
        sge = (struct ibv_sge){.addr = (uintptr_t)(rdm->tg->sbufs + (sbuf - 1) * rdm->tg->buf_size),
                               .lkey = rdm->tg->sbuf_mr->lkey};
    }
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, context, flags, cq_flags, total, PMOF_CNTR_SEND);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        if (sbuf) pmof_tagged_sbuf_put(rdm, sbuf);
        return -FI_EAGAIN;
    }
    if (sbuf) {
        /* Its completion gives the buffer back. */
        op->tbuf = sbuf;
        op->signaled = true;
    }
    ret = post_headed(ep, op, &h, iov, desc, count, total, sflags, sbuf ? &sge : NULL);
    if (ret)
        pmof_tx_abort(ep);
    else
        ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    if (ret && sbuf) pmof_tagged_sbuf_put(rdm, sbuf);
    return ret;
}

/* ------------------------------------------------------ posted receives */

static void discard(struct pmof_tagged *tg, struct pmof_tmsg *m) {
    if (m->h.type == PMOF_MSG_RTS) queue_fin(tg, m->ep, m->h.cookie, 0);
    msg_free(m);
}

ssize_t pmof_tagged_recv(struct pmof_rdm *rdm, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src, uint64_t tag, uint64_t ignore, void *context,
                         uint64_t flags, bool tagged) {
    struct pmof_tagged *tg = rdm->tg;
    struct pmof_trecv *rv;
    struct pmof_tmsg *m;
    struct pmof_cq_entry e;
    bool report;
    ssize_t ret;

    if (!tg) return -FI_EOPBADSTATE; /* not enabled */
    if (count > PMOF_IOV_LIMIT || (count && !iov)) return -FI_EINVAL;
    if ((flags & (FI_PEEK | FI_CLAIM | FI_DISCARD)) && !tagged) return -FI_EINVAL;
    if ((flags & FI_DISCARD) && !(flags & (FI_PEEK | FI_CLAIM))) return -FI_EINVAL;
    if ((flags & FI_CLAIM) && !context) return -FI_EINVAL;
    if (!(rdm->info->caps & FI_DIRECTED_RECV)) src = FI_ADDR_UNSPEC;
    report = !rdm->rx_selective || (flags & FI_COMPLETION);
    pmof_tagged_progress(rdm);

    rv = calloc(1, sizeof(*rv));
    if (!rv) return -FI_ENOMEM;
    rv->tagged = tagged;
    rv->tag = tag;
    rv->ignore = ignore;
    rv->src = src;
    rv->context = context;
    rv->report = report;
    if (!(flags & FI_PEEK) || (flags & FI_CLAIM)) {
        struct iovec staged[PMOF_IOV_LIMIT];
        const struct iovec *in = iov;
        ret = pmof_hmem_prepare(rdm->dom, &in, desc, count, staged, false, &rv->hmem);
        if (ret) {
            free(rv);
            return ret;
        }
        for (size_t i = 0; i < count; i++) {
            rv->iov[i] = in[i];
            rv->desc[i] = desc ? desc[i] : NULL;
        }
        rv->count = count;
        rv->total = iov_total(in, count);
    }

    pthread_mutex_lock(&tg->lock);
    if (flags & FI_PEEK) {
        /* FI_PEEK: report a match, take it only with FI_CLAIM or
         * FI_DISCARD. */
        m = take_unexpected(tg, rv, flags & (FI_CLAIM | FI_DISCARD));
        if (!m) {
            pthread_mutex_unlock(&tg->lock);
            memset(&e, 0, sizeof(e));
            e.op_context = context;
            e.flags = FI_TAGGED | FI_RECV;
            e.err = FI_ENOMSG;
            e.src_addr = FI_ADDR_NOTAVAIL;
            free(rv);
            return pmof_cq_push(rdm->rx_cq, &e);
        }
        msg_entry(m, context, &e);
        if (flags & FI_DISCARD)
            discard(tg, m);
        else if (flags & FI_CLAIM) {
            /* Kept where a closing endpoint finds it too. */
            m->cprev = NULL;
            m->cnext = tg->claimed;
            if (tg->claimed) tg->claimed->cprev = m;
            tg->claimed = m;
            ((struct fi_context *)context)->internal[0] = m;
        }
        pthread_mutex_unlock(&tg->lock);
        free(rv);
        pmof_tagged_progress(rdm);
        return pmof_cq_push(rdm->rx_cq, &e);
    }
    if (flags & FI_CLAIM) {
        m = ((struct fi_context *)context)->internal[0];
        ((struct fi_context *)context)->internal[0] = NULL;
        if (m) {
            if (m->cprev)
                m->cprev->cnext = m->cnext;
            else
                tg->claimed = m->cnext;
            if (m->cnext) m->cnext->cprev = m->cprev;
        }
        if (!m) {
            pthread_mutex_unlock(&tg->lock);
            free(rv);
            return -FI_EINVAL;
        }
    } else {
        m = take_unexpected(tg, rv, true);
    }
    if (!m) {
        if (tg->nposted >= tg->rx_size) {
            pthread_mutex_unlock(&tg->lock);
            free(rv);
            return -FI_EAGAIN;
        }
        int k = tagged ? 1 : 0;
        *tg->posted_tail[k] = rv;
        tg->posted_tail[k] = &rv->next;
        tg->nposted++;
        pthread_mutex_unlock(&tg->lock);
        return 0;
    }
    if (flags & FI_DISCARD) {
        msg_entry(m, context, &e);
        e.len = 0;
        discard(tg, m);
        pthread_mutex_unlock(&tg->lock);
        free(rv);
        pmof_tagged_progress(rdm);
        return pmof_cq_push(rdm->rx_cq, &e);
    }
    if (m->h.type == PMOF_MSG_RTS) {
        rv->msg = m;
        queue_read(tg, rv);
        pthread_mutex_unlock(&tg->lock);
        pmof_tagged_progress(rdm);
        return 0;
    }
    pthread_mutex_unlock(&tg->lock);
    bool ok = deliver_eager(rv, m, m->payload, &e);
    count_recv(rdm, ok);
    ret = (report || !ok) ? pmof_cq_push(rdm->rx_cq, &e) : 0;
    msg_free(m);
    free(rv);
    return ret;
}

int pmof_tagged_work_fd(struct pmof_rdm *rdm) {
    return rdm->tg ? rdm->tg->work_fd : -1;
}

void pmof_tagged_work_ack(struct pmof_rdm *rdm) {
    uint64_t v;

    if (rdm->tg && read(rdm->tg->work_fd, &v, sizeof(v)) < 0) {
        /* Nothing counted: another reader took it. */
    }
}

/* A connection is down: its rendezvous sends get no FIN any more. */
void pmof_tagged_conn_down(struct pmof_rdm *rdm, struct pmof_ep *ep) {
    struct pmof_tagged *tg = rdm->tg;

    if (!tg) return;
    for (uint32_t i = 0; i < tg->nts; i++) {
        struct pmof_tsend *ts = &tg->ts[i];
        bool fail;

        pthread_mutex_lock(&tg->lock);
        fail = ts->used && ts->ep == ep;
        if (fail) ts->gen++; /* its cookie is spent: a late FIN finds nothing */
        pthread_mutex_unlock(&tg->lock);
        if (fail) tsend_finish(rdm, ts, -FI_ECONNABORTED);
    }
}

size_t pmof_tagged_rx_left(struct pmof_rdm *rdm) {
    struct pmof_tagged *tg = rdm->tg;
    size_t n;

    if (!tg) return rdm->rx_size;
    pthread_mutex_lock(&tg->lock);
    n = tg->rx_size - tg->nposted;
    pthread_mutex_unlock(&tg->lock);
    return n;
}

/* ----------------------------------------------------------- the object */

int pmof_tagged_open(struct pmof_rdm *rdm) {
    struct pmof_tagged *tg = calloc(1, sizeof(*tg));
    size_t bytes;

    if (!tg) return -FI_ENOMEM;
    pthread_mutex_init(&tg->lock, NULL);
    for (int k = 0; k < 2; k++)
        tg->posted_tail[k] = &tg->posted[k];
    tg->unexp_tail = &tg->unexp;
    tg->work_tail = &tg->work;
    atomic_flag_clear(&tg->busy);
    tg->rx_size = rdm->rx_size;
    tg->work_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    tg->eager_size = (size_t)pmof_params.eager_size;
    /* An eager message and its header, an RTS, or an inline send (whose
     * inject size the header does not count) fit every buffer. */
    tg->buf_size = PMOF_MSG_HDR_LEN + tg->eager_size;
    if (tg->buf_size < PMOF_MSG_CTRL_MAX) tg->buf_size = PMOF_MSG_CTRL_MAX;
    if (tg->buf_size < PMOF_INLINE_MAX) tg->buf_size = PMOF_INLINE_MAX;
    tg->nts = rdm->info->tx_attr && rdm->info->tx_attr->size ? (uint32_t)rdm->info->tx_attr->size
                                                             : (uint32_t)pmof_params.tx_size;
    tg->ts = calloc(tg->nts, sizeof(*tg->ts));
    bytes = tg->buf_size * rdm->rx_size;
    tg->pool = malloc(bytes);
    tg->sbufs = malloc(tg->buf_size * PMOF_SEND_BUFS);

    rdm->tg = tg;
    if (tg->work_fd < 0) return pmof_errno(errno);
    if (!tg->ts || !tg->pool || !tg->sbufs || slots_init(&tg->sbuf_free, PMOF_SEND_BUFS) ||
        slots_init(&tg->ts_free, tg->nts))
        return -FI_ENOMEM;
    /* Cookies start anywhere: a FIN of an earlier run of the peer names
     * nothing. */
    for (uint32_t i = 0; i < tg->nts; i++)
        tg->ts[i].gen = (uint32_t)random() ^ (uint32_t)(uintptr_t)&tg->ts[i];
    tg->pool_mr = ibv_reg_mr(rdm->dom->pd, tg->pool, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!tg->pool_mr) return pmof_errno(errno);
    tg->sbuf_mr =
        ibv_reg_mr(rdm->dom->pd, tg->sbufs, tg->buf_size * PMOF_SEND_BUFS, IBV_ACCESS_LOCAL_WRITE);
    if (!tg->sbuf_mr) return pmof_errno(errno);
    return 0;
}

/* Fills the shared receive queue with the provider's buffers. */
int pmof_tagged_fill_srq(struct pmof_rdm *rdm) {
    for (uint32_t i = 0; i < rdm->rx_size; i++) {
        struct pmof_op *op = &rdm->rx_ops[i];
        int ret;

        memset(op, 0, sizeof(*op));
        op->rdm = rdm;
        op->bounce = true;
        op->buf = rdm->tg->pool + (size_t)i * rdm->tg->buf_size;
        ret = repost(rdm, op);
        if (ret) return pmof_errno(ret);
    }
    rdm->rx_free_count = 0;
    return 0;
}

void pmof_tagged_ep_close(struct pmof_ep *ep) {
    if (ep->msg_hdr_mr) ibv_dereg_mr(ep->msg_hdr_mr);
    free(ep->msg_hdrs);
    ep->msg_hdr_mr = NULL;
    ep->msg_hdrs = NULL;
}

void pmof_tagged_close(struct pmof_rdm *rdm) {
    struct pmof_tagged *tg = rdm->tg;

    if (!tg) return;
    for (int k = 0; k < 2; k++)
        while (tg->posted[k]) {
            struct pmof_trecv *rv = tg->posted[k];
            tg->posted[k] = rv->next;
            free(rv);
        }
    while (tg->unexp) {
        struct pmof_tmsg *m = tg->unexp;
        tg->unexp = m->next;
        msg_free(m);
    }
    /* A READ's work item names a receive on the reading list. */
    while (tg->work) {
        struct pmof_twork *w = tg->work;
        tg->work = w->next;
        free(w);
    }
    /* Receives whose READs the closed connections dropped, and claimed
     * messages no receive took. */
    while (tg->reading) {
        struct pmof_trecv *rv = tg->reading;
        tg->reading = rv->rnext;
        trecv_free(rv);
    }
    while (tg->claimed) {
        struct pmof_tmsg *m = tg->claimed;
        tg->claimed = m->cnext;
        msg_free(m);
    }
    if (tg->work_fd >= 0) close(tg->work_fd);
    for (uint32_t i = 0; tg->ts && i < tg->nts; i++)
        for (int s = 0; s < PMOF_MSG_SEG_MAX; s++)
            if (tg->ts[i].mrs[s]) ibv_dereg_mr(tg->ts[i].mrs[s]);
    if (tg->pool_mr) ibv_dereg_mr(tg->pool_mr);
    if (tg->sbuf_mr) ibv_dereg_mr(tg->sbuf_mr);
    free(tg->pool);
    free(tg->sbufs);
    free(tg->sbuf_free.free);
    free(tg->ts_free.free);
    free(tg->ts);
    pthread_mutex_destroy(&tg->lock);
    free(tg);
    rdm->tg = NULL;
}

/* ------------------------------------------------------ fi_ops_tagged */

static struct pmof_rdm *to_rdm(struct fid_ep *ep_fid) {
    return container_of(ep_fid, struct pmof_rdm, ep_fid);
}

static uint64_t tx_flags(struct pmof_rdm *rdm) {
    return rdm->tx_op_flags & ~(FI_REMOTE_CQ_DATA | FI_COMMIT | FI_IMMED);
}

static ssize_t t_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src,
                      uint64_t tag, uint64_t ignore, void *context) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return pmof_tagged_recv(to_rdm(ep), &iov, &desc, 1, src, tag, ignore, context,
                            to_rdm(ep)->rx_op_flags, true);
}

static ssize_t t_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       fi_addr_t src, uint64_t tag, uint64_t ignore, void *context) {
    return pmof_tagged_recv(to_rdm(ep), iov, desc, count, src, tag, ignore, context,
                            to_rdm(ep)->rx_op_flags, true);
}

static ssize_t t_recvmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return pmof_tagged_recv(to_rdm(ep), msg->msg_iov, msg->desc, msg->iov_count, msg->addr,
                            msg->tag, msg->ignore, msg->context, flags & ~PMOF_NO_COMPLETION, true);
}

static ssize_t t_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest,
                      uint64_t tag, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return pmof_tagged_send(to_rdm(ep), dest, &iov, &desc, 1, tag, 0, context, tx_flags(to_rdm(ep)),
                            true);
}

static ssize_t t_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       fi_addr_t dest, uint64_t tag, void *context) {
    return pmof_tagged_send(to_rdm(ep), dest, iov, desc, count, tag, 0, context,
                            tx_flags(to_rdm(ep)), true);
}

static ssize_t t_sendmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return pmof_tagged_send(to_rdm(ep), msg->addr, msg->msg_iov, msg->desc, msg->iov_count,
                            msg->tag, msg->data, msg->context, flags & ~PMOF_NO_COMPLETION, true);
}

static ssize_t t_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest,
                        uint64_t tag) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return pmof_tagged_send(to_rdm(ep), dest, &iov, NULL, 1, tag, 0, NULL, PMOF_INJECT, true);
}

static ssize_t t_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
                          fi_addr_t dest, uint64_t tag, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return pmof_tagged_send(to_rdm(ep), dest, &iov, &desc, 1, tag, data, context,
                            tx_flags(to_rdm(ep)) | FI_REMOTE_CQ_DATA, true);
}

static ssize_t t_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data,
                            fi_addr_t dest, uint64_t tag) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return pmof_tagged_send(to_rdm(ep), dest, &iov, NULL, 1, tag, data, NULL,
                            PMOF_INJECT | FI_REMOTE_CQ_DATA, true);
}

struct fi_ops_tagged pmof_tagged_ops = {
    .size = sizeof(struct fi_ops_tagged),
    .recv = t_recv,
    .recvv = t_recvv,
    .recvmsg = t_recvmsg,
    .send = t_send,
    .sendv = t_sendv,
    .sendmsg = t_sendmsg,
    .inject = t_inject,
    .senddata = t_senddata,
    .injectdata = t_injectdata,
};
