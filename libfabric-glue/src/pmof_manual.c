/* SPDX-License-Identifier: MIT */
/*
 * FI_COMMIT_MANUAL: software-emulated persistence, where the target
 * application makes the ranges durable itself, as the OFIWG proposal
 * "Proposal for enhancement to support additional Persistent Memory use
 * cases" (2020) defines it with fi_commit() and EQ event handlers.
 *
 * Each connection between two manual endpoints gets a second RC QP, the
 * control QP, whose number travels in the CM private data.  A commit is
 *
 *   initiator                                   target
 *   drain: a signaled WRITE (the write itself,
 *   or zero bytes for fi_commit) - its
 *   completion means every earlier write on
 *   the connection is placed
 *   REQ {cookie, ranges} on the control QP --->  FI_COMMIT_EVENT: the EQ's
 *                                                handler, or fi_eq_read and
 *                                                later fi_eq_commit_ack
 *   completion (or error) <--------------------  ACK {cookie, status}
 *
 * FI_FENCE first commits the extents written earlier without a commit and
 * posts the write once they are acknowledged; FI_IMMED posts the
 * immediate data (a zero-length WRITE WITH IMMEDIATE) once the ACK has
 * come, so the target's CQ sees it only after the data is durable.  The
 * follow-ups use send slots reserved when the write was posted, so the
 * control thread never waits for the application to reap completions.
 *
 * One thread per domain serves every control QP: a shared CQ with a
 * completion channel.  While a drain is outstanding it also progresses the
 * initiator's transmit CQ every few tens of microseconds, so that a commit
 * moves on even when the application waits elsewhere (the provider's data
 * progress is automatic); an application that reads its CQ moves it on at
 * once.  While commits wait for their ACK it sends the peer a PING now and
 * then: a target that died answers nothing, and the control QP's retries
 * running out fail those commits instead of leaving them waiting forever.  Work request ids carry
 * the control block's unique id, so completions of a closed endpoint's QP find nothing and are
 * dropped.
 *
 * Locks: m->lock (send slots, records) and m->ep_lock (the endpoint
 * pointer and its pins) are leaves; the thread pins the endpoint before
 * it takes the endpoint's tx_lock or a CQ's lock, never while holding
 * either leaf.
 */
#include "pmof.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MANUAL_DEPTH 16                 /* commits in flight per endpoint */
#define MANUAL_RECVS (2 * MANUAL_DEPTH) /* the peer's REQs and ACKs of ours */
#define MANUAL_SENDS (4 * MANUAL_DEPTH) /* ours, with room for unreaped ones */
#define MANUAL_SLOT 1024
#define MANUAL_CQE_PER_QP (MANUAL_RECVS + MANUAL_SENDS)
#define MANUAL_WR_RECV (1ULL << 16)
#define MANUAL_WR_PING (1ULL << 17)
#define MANUAL_PING_MS 500

_Static_assert(PMOF_MANUAL_MSG_MAX <= MANUAL_SLOT, "a control message fits a slot");

enum mrec_step {
    MREC_FREE,
    MREC_DRAIN_FENCE, /* FI_FENCE: earlier extents, waiting for placement */
    MREC_REQ_FENCE,   /* their REQ sent, waiting for the ACK */
    MREC_DRAIN,       /* the write (or zero bytes) posted, not yet placed */
    MREC_REQ,         /* REQ sent, waiting for the ACK */
};

/* An initiator's commit in flight. */
struct pmof_mrec {
    enum mrec_step step;
    uint16_t gen;
    void *context;
    uint64_t cq_flags;
    size_t len;
    bool report;
    uint32_t reserved; /* send slots held for the follow-ups */
    struct pmof_manual_range ranges[PMOF_MANUAL_IOV_MAX];
    uint32_t count;
    /* the write itself; with FI_FENCE posted once the earlier extents are
     * durable, from these */
    struct pmof_manual_range write_range;
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    int nsge;
    void *inl; /* inline data, copied: FI_INJECT frees the buffer at return */
    size_t inl_len;
    /* FI_IMMED / FI_REMOTE_CQ_DATA */
    bool imm;
    uint32_t data;
};

struct pmof_mctl {
    struct pmof_mdom *md;
    struct pmof_mctl *next; /* md->list */
    atomic_int refs;
    uint32_t uid;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf; /* MANUAL_RECVS receive slots, then MANUAL_SENDS send slots */
    atomic_bool up, dead;
    pthread_mutex_t lock;
    uint32_t send_free[MANUAL_SENDS];
    uint32_t nsend_free;
    struct pmof_mrec recs[MANUAL_DEPTH];
    pthread_mutex_t ep_lock;
    pthread_cond_t ep_cond;
    struct pmof_ep *ep;
    int pins;
    atomic_int draining; /* drains posted, not yet completed */
    atomic_int waiting;  /* REQs sent, not yet acknowledged */
    atomic_bool ping_out;
    /* extents written without a commit, by key (the endpoint's tx_lock) */
    struct pmof_manual_range dirty[PMOF_MANUAL_IOV_MAX - 1];
    uint32_t ndirty;
};

struct pmof_mdom {
    struct pmof_domain *dom;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    int cqe;
    pthread_t thread;
    bool thread_running;
    int stop_fd;
    int wake_fd;
    pthread_mutex_t lock; /* list, cqe */
    struct pmof_mctl *list;
    size_t nctl;
    uint32_t next_uid;
    atomic_int draining; /* of all its endpoints */
    atomic_int waiting;
    uint64_t last_ping_ms;
};

/* A commit delivered as FI_COMMIT_EVENT, until fi_eq_commit_ack. */
struct pmof_mpend {
    struct pmof_mpend *next;
    struct pmof_mctl *m;
    uint64_t cookie;
    struct fi_eq_commit_entry entry;
    struct fi_rma_iov iov[PMOF_MANUAL_IOV_MAX];
};

/* ------------------------------------------------------------ lifetime */

static void mctl_unref(struct pmof_mctl *m) {
    if (atomic_fetch_sub(&m->refs, 1) != 1) return;
    if (m->qp) ibv_destroy_qp(m->qp);
    if (m->mr) ibv_dereg_mr(m->mr);
    for (int i = 0; i < MANUAL_DEPTH; i++)
        free(m->recs[i].inl);
    free(m->buf);
    pthread_mutex_destroy(&m->lock);
    pthread_mutex_destroy(&m->ep_lock);
    pthread_cond_destroy(&m->ep_cond);
    free(m);
}

/* The endpoint, kept open until mctl_unpin; NULL once it is closing. */
static struct pmof_ep *mctl_pin(struct pmof_mctl *m) {
    struct pmof_ep *ep;

    pthread_mutex_lock(&m->ep_lock);
    ep = m->ep;
    if (ep) m->pins++;
    pthread_mutex_unlock(&m->ep_lock);
    return ep;
}

static void mctl_unpin(struct pmof_mctl *m) {
    pthread_mutex_lock(&m->ep_lock);
    if (--m->pins == 0) pthread_cond_broadcast(&m->ep_cond);
    pthread_mutex_unlock(&m->ep_lock);
}

static struct pmof_mctl *mctl_find(struct pmof_mdom *md, uint32_t uid) {
    struct pmof_mctl *m;

    pthread_mutex_lock(&md->lock);
    for (m = md->list; m && m->uid != uid; m = m->next)
        ;
    if (m) atomic_fetch_add(&m->refs, 1);
    pthread_mutex_unlock(&md->lock);
    return m;
}

bool pmof_manual_active(const struct pmof_ep *ep) {
    return ep->mctl && atomic_load(&ep->mctl->up) && !atomic_load(&ep->mctl->dead);
}

uint32_t pmof_manual_qpn(const struct pmof_ep *ep) {
    return ep->mctl ? ep->mctl->qp->qp_num : 0;
}

/* The EQ and fid a target's commit events go to: the RDM endpoint's for
 * its hidden connections. */
static struct pmof_eq *target_eq(struct pmof_ep *ep, fid_t *fid) {
    if (ep->rdm) {
        *fid = &ep->rdm->ep_fid.fid;
        return ep->rdm->user_eq;
    }
    *fid = &ep->ep_fid.fid;
    return ep->eq;
}

/* ------------------------------------------------------------- sending */

static uint64_t wr_id(const struct pmof_mctl *m, uint32_t slot, bool recv) {
    return (uint64_t)m->uid << 32 | (recv ? MANUAL_WR_RECV : 0) | slot;
}

static uint8_t *slot_buf(struct pmof_mctl *m, uint32_t slot, bool recv) {
    return m->buf + (size_t)(recv ? slot : MANUAL_RECVS + slot) * MANUAL_SLOT;
}

static int post_recv(struct pmof_mctl *m, uint32_t slot) {
    struct ibv_sge sge = {(uintptr_t)slot_buf(m, slot, true), MANUAL_SLOT, m->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id(m, slot, true), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;

    return ibv_post_recv(m->qp, &wr, &bad);
}

/* Sends one control message; -FI_E* when the control QP cannot take it. */
static int ctl_send(struct pmof_mctl *m, const uint8_t *msg, size_t len, uint64_t tag) {
    struct ibv_send_wr wr = {.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED, .num_sge = 1};
    struct ibv_send_wr *bad;
    struct ibv_sge sge;
    uint32_t slot;
    int ret;

    if (atomic_load(&m->dead)) return -FI_ENOTCONN;
    pthread_mutex_lock(&m->lock);
    if (!m->nsend_free) {
        /* Cannot happen while the peer keeps to MANUAL_DEPTH. */
        pthread_mutex_unlock(&m->lock);
        PMOF_WARN(FI_LOG_EP_DATA, "control QP %u: no send slot\n", m->qp->qp_num);
        return -FI_EAGAIN;
    }
    slot = m->send_free[--m->nsend_free];
    memcpy(slot_buf(m, slot, false), msg, len);
    sge = (struct ibv_sge){(uintptr_t)slot_buf(m, slot, false), (uint32_t)len, m->mr->lkey};
    wr.wr_id = wr_id(m, slot, false) | tag;
    wr.sg_list = &sge;
    ret = ibv_post_send(m->qp, &wr, &bad);
    if (ret) m->send_free[m->nsend_free++] = slot;
    pthread_mutex_unlock(&m->lock);
    if (ret) PMOF_WARN(FI_LOG_EP_DATA, "control QP %u: %s\n", m->qp->qp_num, strerror(ret));
    return ret ? pmof_errno(ret) : 0;
}

static void send_ack(struct pmof_mctl *m, uint64_t cookie, int status) {
    uint8_t msg[PMOF_MANUAL_MSG_MAX];
    size_t len = pmof_manual_encode_ack(msg, cookie, status);

    if (ctl_send(m, msg, len, 0))
        PMOF_WARN(FI_LOG_EP_DATA, "commit acknowledgement lost: the initiator's QP fails\n");
}

static uint64_t rec_cookie(const struct pmof_mctl *m, const struct pmof_mrec *r) {
    return (uint64_t)r->gen << 16 | (uint64_t)(r - m->recs);
}

static int send_req(struct pmof_mctl *m, struct pmof_mrec *r) {
    uint8_t msg[PMOF_MANUAL_MSG_MAX];
    size_t len = pmof_manual_encode_req(msg, rec_cookie(m, r), r->ranges, r->count);

    return ctl_send(m, msg, len, 0);
}

/* ------------------------------------------------------------- records */

static struct pmof_mrec *rec_get(struct pmof_mctl *m) {
    struct pmof_mrec *r = NULL;

    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < MANUAL_DEPTH && !r; i++)
        if (m->recs[i].step == MREC_FREE) r = &m->recs[i];
    if (r) {
        uint16_t gen = (uint16_t)(r->gen + 1);
        free(r->inl);
        memset(r, 0, sizeof(*r));
        r->gen = gen;
        r->step = MREC_DRAIN;
    }
    pthread_mutex_unlock(&m->lock);
    return r;
}

static void drain_add(struct pmof_mctl *m, int n) {
    atomic_fetch_add(&m->draining, n);
    if (atomic_fetch_add(&m->md->draining, n) == 0 && n > 0) {
        /* Wake the thread into its progress loop. */
        uint64_t one = 1;
        if (write(m->md->wake_fd, &one, sizeof(one)) < 0) PMOF_WARN(FI_LOG_EP_DATA, "wake: %m\n");
    }
}

static void waiting_add(struct pmof_mctl *m, int n) {
    atomic_fetch_add(&m->waiting, n);
    atomic_fetch_add(&m->md->waiting, n);
}

static void rec_put(struct pmof_ep *ep, struct pmof_mrec *r) {
    struct pmof_mctl *m = ep->mctl;

    if (r->reserved) atomic_fetch_sub(&ep->tx_reserved, r->reserved);
    pthread_mutex_lock(&m->lock);
    r->reserved = 0;
    r->step = MREC_FREE;
    pthread_mutex_unlock(&m->lock);
}

static void rec_complete(struct pmof_ep *ep, struct pmof_mrec *r, int err) {
    struct pmof_cntr *cntr = ep->cntrs[PMOF_CNTR_WRITE];
    struct pmof_cq_entry e = {
        .op_context = r->context,
        .flags = r->cq_flags,
        .len = r->len,
        .src_addr = FI_ADDR_NOTAVAIL,
        .err = err,
        .prov_errno = err ? -err : 0,
    };
    bool report = err ? !ep->tx_cq_internal : r->report;

    rec_put(ep, r);
    if (ep->closing) return;
    if (report && pmof_cq_push(ep->tx_cq, &e))
        PMOF_WARN(FI_LOG_CQ, "a commit completion was lost (no memory)\n");
    if (cntr) (err ? pmof_cntr_err : pmof_cntr_inc)(cntr);
}

/* ----------------------------------------------------- the initiator */

/* Room for the drain and the follow-ups of `r` (tx_lock held). */
static bool ring_room(struct pmof_ep *ep, uint32_t n) {
    uint64_t used = ep->tx.head - __atomic_load_n(&ep->tx.tail, __ATOMIC_ACQUIRE);

    return used + atomic_load(&ep->tx_reserved) + n <= ep->tx.size;
}

/* Posts the drain of `r`: `fill` adds the verbs request after the slot. */
static ssize_t post_drain(struct pmof_ep *ep, struct pmof_mrec *r, const struct iovec *iov,
                          size_t count, const struct ibv_sge *sge, int nsge, bool inl,
                          uint64_t addr, uint64_t key) {
    struct pmof_op *op;

    if (!ring_room(ep, 1 + r->reserved)) {
        pmof_cq_progress(ep->tx_cq);
        if (!ring_room(ep, 1 + r->reserved)) return -FI_EAGAIN;
    }
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, r->context, PMOF_NO_COMPLETION, r->cq_flags, r->len, PMOF_CNTR_NONE);
    if (!op) {
        pmof_tx_abort(ep);
        return -FI_EAGAIN;
    }
    /* Its completion carries the commit on, whatever the caller asked. */
    op->mrec = r;
    op->signaled = true;
    ep->unsignaled = 0;
    pmof_tx_wr(ep, op, inl ? IBV_SEND_INLINE : 0);
    ibv_wr_rdma_write(ep->qpx, (uint32_t)key, addr);
    pmof_wr_set_payload(ep, iov, count, sge, nsge, inl);
    if (r->reserved) atomic_fetch_add(&ep->tx_reserved, r->reserved);
    ssize_t ret = pmof_tx_post(ep);
    if (ret && r->reserved) atomic_fetch_sub(&ep->tx_reserved, r->reserved);
    if (!ret) drain_add(ep->mctl, 1);
    return ret;
}

ssize_t pmof_manual_commit(struct pmof_ep *ep, const struct fi_rma_iov *iov, size_t count,
                           uint64_t flags, void *context) {
    struct pmof_mctl *m = ep->mctl;
    struct pmof_mrec *r;
    ssize_t ret;

    if (count > PMOF_MANUAL_IOV_MAX) return -FI_EINVAL;
    r = rec_get(m);
    if (!r) return -FI_EAGAIN;
    r->context = context;
    r->cq_flags = FI_RMA | FI_COMMIT;
    r->report = pmof_ep_wants_completion(ep, true, flags | FI_COMPLETION);
    r->count = (uint32_t)count;
    for (size_t i = 0; i < count; i++)
        r->ranges[i] = (struct pmof_manual_range){iov[i].addr, iov[i].len, iov[i].key};
    pmof_lock(&ep->tx_lock);
    ret = post_drain(ep, r, NULL, 0, NULL, 0, false, iov[0].addr, iov[0].key);
    pmof_unlock(&ep->tx_lock);
    if (ret) rec_put(ep, r);
    return ret;
}

static struct pmof_manual_range *dirty_find(struct pmof_mctl *m, uint64_t key) {
    for (uint32_t i = 0; i < m->ndirty; i++)
        if (m->dirty[i].key == key) return &m->dirty[i];
    return NULL;
}

static void dirty_take(struct pmof_mctl *m, struct pmof_manual_range *d) {
    *d = m->dirty[--m->ndirty];
}

int pmof_manual_note_write(struct pmof_ep *ep, uint64_t addr, uint64_t len, uint64_t key) {
    struct pmof_mctl *m = ep->mctl;
    struct pmof_manual_range *d = dirty_find(m, key);

    if (!len) return 0;
    if (!d) {
        if (m->ndirty == PMOF_MANUAL_IOV_MAX - 1) {
            PMOF_WARN(FI_LOG_EP_DATA,
                      "FI_COMMIT_MANUAL tracks %d keys written without a commit; commit first\n",
                      PMOF_MANUAL_IOV_MAX - 1);
            return -FI_ENOSPC;
        }
        d = &m->dirty[m->ndirty++];
        *d = (struct pmof_manual_range){addr, len, key};
        return 0;
    }
    /* One extent per key: the hull of what was written. */
    uint64_t end = d->addr + d->len > addr + len ? d->addr + d->len : addr + len;
    if (addr < d->addr) d->addr = addr;
    d->len = end - d->addr;
    return 0;
}

ssize_t pmof_manual_write(struct pmof_ep *ep, const struct iovec *iov, size_t count,
                          const struct ibv_sge *sge, int nsge, bool inl, size_t total,
                          uint64_t addr, uint64_t key, uint64_t data, void *context,
                          uint64_t flags) {
    struct pmof_mctl *m = ep->mctl;
    struct pmof_mrec *r = rec_get(m);
    struct pmof_manual_range *d;
    ssize_t ret;

    if (!r) return -FI_EAGAIN;
    r->context = context;
    r->cq_flags = FI_RMA | FI_WRITE | FI_COMMIT;
    r->len = total;
    r->report = pmof_ep_wants_completion(ep, true, flags);
    r->imm = (flags & (FI_IMMED | FI_REMOTE_CQ_DATA)) != 0;
    r->data = (uint32_t)data;
    r->write_range = (struct pmof_manual_range){addr, total, key};
    r->reserved = r->imm ? 1 : 0;

    pmof_lock(&ep->tx_lock);
    if ((flags & FI_FENCE) && m->ndirty) {
        /* Every earlier extent first; this write once they are durable. */
        r->reserved++;
        for (uint32_t i = 0; i < m->ndirty; i++)
            r->ranges[r->count++] = m->dirty[i];
        if (inl) {
            r->inl = malloc(total ? total : 1);
            if (!r->inl) {
                ret = -FI_ENOMEM;
                goto out;
            }
            for (size_t i = 0, off = 0; i < count; off += iov[i].iov_len, i++)
                memcpy((uint8_t *)r->inl + off, iov[i].iov_base, iov[i].iov_len);
            r->inl_len = total;
        } else {
            memcpy(r->sge, sge, (size_t)nsge * sizeof(*sge));
            r->nsge = nsge;
        }
        r->step = MREC_DRAIN_FENCE;
        ret = post_drain(ep, r, NULL, 0, NULL, 0, false, r->ranges[0].addr, r->ranges[0].key);
        if (!ret) m->ndirty = 0;
        goto out;
    }
    /* This write, and what was written earlier to the same key. */
    r->ranges[r->count++] = r->write_range;
    d = dirty_find(m, key);
    if (d) r->ranges[r->count++] = *d;
    ret = post_drain(ep, r, iov, count, sge, nsge, inl, addr, key);
    if (!ret && d) dirty_take(m, d);
out:
    pmof_unlock(&ep->tx_lock);
    if (ret) rec_put(ep, r);
    return ret;
}

int pmof_manual_placed(struct pmof_ep *ep, struct pmof_mrec *r) {
    struct pmof_mctl *m = ep->mctl;
    int ret;

    drain_add(m, -1);
    pthread_mutex_lock(&m->lock);
    r->step = r->step == MREC_DRAIN_FENCE ? MREC_REQ_FENCE : MREC_REQ;
    pthread_mutex_unlock(&m->lock);
    ret = send_req(m, r);
    if (ret)
        rec_put(ep, r);
    else
        waiting_add(m, 1);
    return ret;
}

void pmof_manual_drain_failed(struct pmof_ep *ep, struct pmof_mrec *r) {
    drain_add(ep->mctl, -1);
    rec_put(ep, r);
}

/* From the control thread: a write or WRITE WITH IMMEDIATE in a slot the
 * commit reserved. */
static int post_followup(struct pmof_ep *ep, struct pmof_mrec *r, bool write) {
    struct pmof_op *op;
    int ret;

    pmof_lock(&ep->tx_lock);
    /* The slot stops being reserved and is used at once, under the lock
     * that posting takes, so no other request can take it meanwhile. */
    atomic_fetch_sub(&ep->tx_reserved, 1);
    r->reserved--;
    if (pmof_ep_check_tx(ep)) {
        pmof_unlock(&ep->tx_lock);
        return -FI_ENOTCONN;
    }
    pmof_tx_start(ep);
    if (write) {
        op = pmof_tx_op_reserved(ep, r->context, PMOF_NO_COMPLETION, r->cq_flags, r->len);
        op->mrec = r;
        op->signaled = true;
        pmof_tx_wr(ep, op, r->inl ? IBV_SEND_INLINE : 0);
        ibv_wr_rdma_write(ep->qpx, (uint32_t)r->write_range.key, r->write_range.addr);
        if (r->inl)
            ibv_wr_set_inline_data(ep->qpx, r->inl, r->inl_len);
        else
            ibv_wr_set_sge_list(ep->qpx, (size_t)r->nsge, r->sge);
    } else {
        /* The commit's own completion: an ordinary request from here on. */
        op = pmof_tx_op_reserved(ep, r->context, r->report ? FI_COMPLETION : PMOF_NO_COMPLETION,
                                 r->cq_flags, r->len);
        op->report = r->report;
        op->cntr = PMOF_CNTR_WRITE;
        op->signaled = true;
        pmof_tx_wr(ep, op, 0);
        ibv_wr_rdma_write_imm(ep->qpx, (uint32_t)r->write_range.key, r->write_range.addr,
                              htonl(r->data));
        ibv_wr_set_sge_list(ep->qpx, 0, NULL);
    }
    ret = (int)pmof_tx_post(ep);
    if (!ret && write) drain_add(ep->mctl, 1);
    pmof_unlock(&ep->tx_lock);
    return ret;
}

static void on_ack(struct pmof_mctl *m, const struct pmof_manual_msg *msg) {
    uint32_t idx = (uint32_t)(msg->cookie & 0xffff);
    uint16_t gen = (uint16_t)(msg->cookie >> 16);
    struct pmof_mrec *r = NULL;
    enum mrec_step step = MREC_FREE;
    struct pmof_ep *ep;

    pthread_mutex_lock(&m->lock);
    if (idx < MANUAL_DEPTH && (msg->cookie >> 32) == 0 && m->recs[idx].gen == gen) {
        r = &m->recs[idx];
        step = r->step;
    }
    pthread_mutex_unlock(&m->lock);
    if (step != MREC_REQ && step != MREC_REQ_FENCE) {
        PMOF_WARN(FI_LOG_EP_DATA, "control QP %u: acknowledgement of no commit dropped\n",
                  m->qp->qp_num);
        return;
    }
    waiting_add(m, -1);
    ep = mctl_pin(m);
    if (!ep) return;
    if (msg->status) {
        rec_complete(ep, r, -msg->status);
    } else if (step == MREC_REQ_FENCE) {
        pthread_mutex_lock(&m->lock);
        r->step = MREC_DRAIN;
        r->count = 0;
        r->ranges[r->count++] = r->write_range;
        pthread_mutex_unlock(&m->lock);
        int ret = post_followup(ep, r, true);
        if (ret) rec_complete(ep, r, -ret);
    } else if (r->imm) {
        int ret = post_followup(ep, r, false);
        if (ret)
            rec_complete(ep, r, -ret);
        else
            rec_put(ep, r);
    } else {
        rec_complete(ep, r, 0);
    }
    mctl_unpin(m);
}

/* The control QP failed (the peer is gone): every commit waiting for an
 * ACK fails; those still draining fail when their REQ cannot be sent. */
static void ctl_failed(struct pmof_mctl *m) {
    struct pmof_ep *ep;

    if (atomic_exchange(&m->dead, true)) return;
    ep = mctl_pin(m);
    if (!ep) return;
    for (int i = 0; i < MANUAL_DEPTH; i++) {
        struct pmof_mrec *r = &m->recs[i];
        pthread_mutex_lock(&m->lock);
        bool waiting = r->step == MREC_REQ || r->step == MREC_REQ_FENCE;
        pthread_mutex_unlock(&m->lock);
        if (!waiting) continue;
        waiting_add(m, -1);
        rec_complete(ep, r, -FI_EIO);
    }
    mctl_unpin(m);
}

/* -------------------------------------------------------- the target */

/* A peer's ranges, before the application sees any of them: each inside
 * a region of the endpoint's domain that is registered now with remote
 * write access, named by that region's key.  FI_PMEM comes from those
 * regions, never from the peer.  0, or -FI_EACCES for the whole commit. */
static int check_ranges(struct pmof_mctl *m, struct pmof_ep *ep, const struct pmof_manual_msg *msg,
                        uint64_t *flags) {
    for (uint32_t i = 0; i < msg->count; i++) {
        const struct pmof_manual_range *r = &msg->ranges[i];
        int ret = pmof_mr_check_range(ep->dom, r->addr, r->len, r->key, flags);

        if (!ret) continue;
        PMOF_WARN(FI_LOG_EP_DATA,
                  "control QP %u: commit refused: range %u (key %#llx, addr %#llx, %llu bytes) "
                  "is not inside a region the peer may write\n",
                  m->qp->qp_num, i, (unsigned long long)r->key, (unsigned long long)r->addr,
                  (unsigned long long)r->len);
        return ret;
    }
    return 0;
}

static void on_req(struct pmof_mctl *m, const struct pmof_manual_msg *msg) {
    struct pmof_mpend *p;
    struct pmof_ep *ep = mctl_pin(m);
    struct pmof_eq *eq;
    fi_eq_event_handler_t handler;
    uint64_t flags = FI_COMMIT;
    void *hctx;
    fid_t fid;
    int err;

    if (!ep) {
        send_ack(m, msg->cookie, -FI_ENOTCONN);
        return;
    }
    err = check_ranges(m, ep, msg, &flags);
    if (err) {
        send_ack(m, msg->cookie, err);
        goto out;
    }
    eq = target_eq(ep, &fid);
    p = eq ? calloc(1, sizeof(*p)) : NULL;
    if (!p) {
        send_ack(m, msg->cookie, eq ? -FI_ENOMEM : -FI_ENOEQ);
        goto out;
    }
    p->m = m;
    p->cookie = msg->cookie;
    p->entry.fid = fid;
    p->entry.iov = p->iov;
    p->entry.count = msg->count;
    p->entry.flags = flags;
    for (uint32_t i = 0; i < msg->count; i++)
        p->iov[i] =
            (struct fi_rma_iov){msg->ranges[i].addr, msg->ranges[i].len, msg->ranges[i].key};
    pmof_lock(&eq->lock);
    handler = eq->commit_handler;
    hctx = eq->commit_handler_ctx;
    if (!handler) {
        p->next = eq->pending;
        eq->pending = p;
        atomic_fetch_add(&m->refs, 1);
    }
    pmof_unlock(&eq->lock);
    if (handler) {
        ssize_t r = handler(&eq->eq_fid, FI_COMMIT_EVENT, &p->entry, sizeof(p->entry), hctx);
        send_ack(m, msg->cookie, r < 0 ? (r < INT32_MIN ? -FI_EIO : (int)r) : 0);
        free(p);
    } else if (pmof_eq_push(eq, FI_COMMIT_EVENT, &p->entry, sizeof(p->entry), false)) {
        pmof_lock(&eq->lock);
        eq->pending = p->next; /* still first: pushes and acks both take the lock */
        pmof_unlock(&eq->lock);
        send_ack(m, msg->cookie, -FI_ENOMEM);
        mctl_unref(m);
        free(p);
    }
out:
    mctl_unpin(m);
}

int pmof_commit_ack(struct fi_pmof_eq_ops *ops, const struct fi_eq_commit_entry *entry,
                    int status) {
    struct pmof_eq *eq = container_of(ops, struct pmof_eq, pmof_ops);
    struct pmof_mpend **pp, *p = NULL;

    if (!entry || status > 0) return -FI_EINVAL;
    pmof_lock(&eq->lock);
    for (pp = &eq->pending; *pp; pp = &(*pp)->next) {
        if ((*pp)->entry.iov != entry->iov) continue;
        p = *pp;
        *pp = p->next;
        break;
    }
    pmof_unlock(&eq->lock);
    if (!p) return -FI_ENOENT;
    send_ack(p->m, p->cookie, status);
    mctl_unref(p->m);
    free(p);
    return 0;
}

/* Commits an EQ still holds for `m` (NULL: all) are answered with
 * `status`, and their queued events removed: their ranges would dangle. */
void pmof_manual_eq_release(struct pmof_eq *eq, struct pmof_mctl *m, int status) {
    struct pmof_mpend **pp = &eq->pending, *gone = NULL;

    pmof_lock(&eq->lock);
    while (*pp) {
        struct pmof_mpend *p = *pp;
        if (m && p->m != m) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        p->next = gone;
        gone = p;
    }
    for (struct pmof_mpend *p = gone; p; p = p->next) {
        /* Drop the queued FI_COMMIT_EVENT that names p->iov, if unread. */
        struct pmof_slist_entry **link = &eq->queue.head, *prev = NULL;
        while (*link) {
            struct pmof_eq_entry *e = (struct pmof_eq_entry *)*link;
            const struct fi_eq_commit_entry *ce = (const void *)e->data;
            if (!e->err && e->event == FI_COMMIT_EVENT && e->len == sizeof(*ce) &&
                ce->iov == p->iov) {
                *link = (*link)->next;
                if (eq->queue.tail == &e->link) eq->queue.tail = prev;
                free(e);
                break;
            }
            prev = *link;
            link = &(*link)->next;
        }
    }
    pmof_eq_resignal(eq);
    pmof_unlock(&eq->lock);
    while (gone) {
        struct pmof_mpend *p = gone;
        gone = p->next;
        if (status) send_ack(p->m, p->cookie, status);
        mctl_unref(p->m);
        free(p);
    }
}

/* ------------------------------------------------------ control thread */

static void handle_wc(struct pmof_mdom *md, const struct ibv_wc *wc) {
    struct pmof_mctl *m = mctl_find(md, (uint32_t)(wc->wr_id >> 32));
    uint32_t slot = (uint32_t)(wc->wr_id & 0xffff);
    bool recv = wc->wr_id & MANUAL_WR_RECV;
    struct pmof_manual_msg msg;

    if (!m) return; /* a closed endpoint's */
    if (!recv) {
        if (wc->wr_id & MANUAL_WR_PING) atomic_store(&m->ping_out, false);
        pthread_mutex_lock(&m->lock);
        if (slot < MANUAL_SENDS) m->send_free[m->nsend_free++] = slot;
        pthread_mutex_unlock(&m->lock);
        if (wc->status != IBV_WC_SUCCESS) ctl_failed(m);
        goto out;
    }
    if (wc->status != IBV_WC_SUCCESS || slot >= MANUAL_RECVS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR) ctl_failed(m);
        goto out;
    }
    const uint8_t *buf = slot_buf(m, slot, true);
    bool ok = pmof_manual_parse(buf, wc->byte_len, &msg);
    /* A malformed commit request is answered, or its sender would wait. */
    uint64_t cookie = 0;
    bool req = !ok && pmof_manual_req_cookie(buf, wc->byte_len, &cookie);
    if (post_recv(m, slot)) ctl_failed(m);
    if (!ok) {
        PMOF_WARN(FI_LOG_EP_DATA, "control QP %u: malformed %s (%u bytes) %s\n", m->qp->qp_num,
                  req ? "commit request" : "message", wc->byte_len, req ? "refused" : "dropped");
        if (req) send_ack(m, cookie, -FI_EINVAL);
        goto out;
    }
    if (msg.type == PMOF_MANUAL_REQ)
        on_req(m, &msg);
    else if (msg.type == PMOF_MANUAL_ACK)
        on_ack(m, &msg);
out:
    mctl_unref(m);
}

/* Progresses the transmit CQs of the endpoints with a drain outstanding. */
static void progress_drains(struct pmof_mdom *md) {
    struct pmof_mctl *ms[64];
    size_t n = 0;

    pthread_mutex_lock(&md->lock);
    for (struct pmof_mctl *m = md->list; m && n < 64; m = m->next) {
        if (!atomic_load(&m->draining)) continue;
        atomic_fetch_add(&m->refs, 1);
        ms[n++] = m;
    }
    pthread_mutex_unlock(&md->lock);
    for (size_t i = 0; i < n; i++) {
        struct pmof_ep *ep = mctl_pin(ms[i]);
        if (ep) {
            pmof_cq_progress(ep->tx_cq);
            mctl_unpin(ms[i]);
        }
        mctl_unref(ms[i]);
    }
}

/* A PING on every control QP with commits waiting (and none in flight). */
static void ping_waiting(struct pmof_mdom *md) {
    uint8_t msg[PMOF_MANUAL_MSG_MAX];
    size_t len = pmof_manual_encode_ping(msg);

    md->last_ping_ms = pmof_now_ms();
    pthread_mutex_lock(&md->lock);
    for (struct pmof_mctl *m = md->list; m; m = m->next) {
        if (!atomic_load(&m->waiting) || atomic_exchange(&m->ping_out, true)) continue;
        if (ctl_send(m, msg, len, MANUAL_WR_PING)) atomic_store(&m->ping_out, false);
    }
    pthread_mutex_unlock(&md->lock);
}

static void *ctl_thread(void *arg) {
    struct pmof_mdom *md = arg;
    struct pollfd fds[3] = {{.fd = md->ch->fd, .events = POLLIN},
                            {.fd = md->stop_fd, .events = POLLIN},
                            {.fd = md->wake_fd, .events = POLLIN}};

    for (;;) {
        /* A drain is outstanding: look again soon; commits wait for an
         * ACK: check on their peers now and then. */
        struct timespec soon = {0, 50 * 1000}, later = {0, 100 * 1000 * 1000};
        bool draining = atomic_load(&md->draining) > 0;
        bool waiting = atomic_load(&md->waiting) > 0;
        struct ibv_cq *cq;
        struct ibv_wc wc[16];
        void *ctx;
        int n;

        if (ppoll(fds, 3, draining ? &soon : waiting ? &later : NULL, NULL) < 0) continue;
        if (fds[1].revents) break;
        if (fds[2].revents) {
            uint64_t v;
            if (read(md->wake_fd, &v, sizeof(v)) < 0) v = 0;
        }
        if (draining) progress_drains(md);
        if (waiting && pmof_now_ms() - md->last_ping_ms >= MANUAL_PING_MS) ping_waiting(md);
        if (!(fds[0].revents & POLLIN) || ibv_get_cq_event(md->ch, &cq, &ctx)) continue;
        ibv_ack_cq_events(cq, 1);
        ibv_req_notify_cq(cq, 0);
        while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
            /* Sends first: their slots may be needed by the ACKs below. */
            for (int i = 0; i < n; i++)
                if (!(wc[i].wr_id & MANUAL_WR_RECV)) handle_wc(md, &wc[i]);
            for (int i = 0; i < n; i++)
                if (wc[i].wr_id & MANUAL_WR_RECV) handle_wc(md, &wc[i]);
        }
    }
    return NULL;
}

static void mdom_free(struct pmof_mdom *md) {
    if (md->thread_running) {
        uint64_t one = 1;
        if (write(md->stop_fd, &one, sizeof(one)) < 0) PMOF_WARN(FI_LOG_DOMAIN, "stop: %m\n");
        pthread_join(md->thread, NULL);
    }
    if (md->cq) ibv_destroy_cq(md->cq);
    if (md->ch) ibv_destroy_comp_channel(md->ch);
    if (md->stop_fd >= 0) close(md->stop_fd);
    if (md->wake_fd >= 0) close(md->wake_fd);
    pthread_mutex_destroy(&md->lock);
    free(md);
}

static int mdom_get(struct pmof_domain *dom, struct pmof_mdom **out) {
    struct pmof_mdom *md;
    int ret;

    pthread_mutex_lock(&dom->manual_lock);
    md = dom->manual;
    if (md) goto out;
    md = calloc(1, sizeof(*md));
    if (!md) {
        pthread_mutex_unlock(&dom->manual_lock);
        return -FI_ENOMEM;
    }
    pthread_mutex_init(&md->lock, NULL);
    md->dom = dom;
    md->next_uid = 1;
    md->cqe = 4 * MANUAL_CQE_PER_QP;
    md->stop_fd = eventfd(0, EFD_CLOEXEC);
    md->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    md->ch = ibv_create_comp_channel(dom->verbs);
    md->cq = md->ch ? ibv_create_cq(dom->verbs, md->cqe, md, md->ch, 0) : NULL;
    if (md->stop_fd < 0 || md->wake_fd < 0 || !md->cq || ibv_req_notify_cq(md->cq, 0)) {
        ret = pmof_errno(errno ? errno : EIO);
        goto err;
    }
    pmof_pin_library();
    ret = pthread_create(&md->thread, NULL, ctl_thread, md);
    if (ret) {
        ret = pmof_errno(ret);
        goto err;
    }
    md->thread_running = true;
    dom->manual = md;
out:
    pthread_mutex_unlock(&dom->manual_lock);
    *out = md;
    return 0;
err:
    pthread_mutex_unlock(&dom->manual_lock);
    mdom_free(md);
    return ret;
}

void pmof_manual_domain_close(struct pmof_domain *dom) {
    if (dom->manual) mdom_free(dom->manual);
    dom->manual = NULL;
}

/* ------------------------------------------------------ the endpoint */

int pmof_manual_ep_init(struct pmof_ep *ep) {
    struct ibv_qp_init_attr attr = {
        .cap = {.max_send_wr = MANUAL_SENDS,
                .max_recv_wr = MANUAL_RECVS,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT};
    struct pmof_mdom *md = NULL;
    struct pmof_mctl *m;
    size_t bytes = (size_t)(MANUAL_RECVS + MANUAL_SENDS) * MANUAL_SLOT;
    int mask, ret = mdom_get(ep->dom, &md);

    if (ret) return ret;
    m = calloc(1, sizeof(*m));
    if (!m) return -FI_ENOMEM;
    atomic_init(&m->refs, 1);
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->ep_lock, NULL);
    pthread_cond_init(&m->ep_cond, NULL);
    m->md = md;
    m->ep = ep;
    for (uint32_t i = 0; i < MANUAL_SENDS; i++)
        m->send_free[m->nsend_free++] = i;
    m->buf = aligned_alloc(4096, bytes);
    if (!m->buf) {
        ret = -FI_ENOMEM;
        goto err;
    }
    m->mr = ibv_reg_mr(ep->dom->pd, m->buf, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!m->mr) {
        ret = pmof_errno(errno);
        goto err;
    }
    /* The shared CQ grows with the QPs that use it. */
    pthread_mutex_lock(&md->lock);
    if ((md->nctl + 1) * MANUAL_CQE_PER_QP > (size_t)md->cqe) {
        int cqe = md->cqe * 2;
        if (ibv_resize_cq(md->cq, cqe) == 0) md->cqe = cqe;
    }
    bool room = (md->nctl + 1) * MANUAL_CQE_PER_QP <= (size_t)md->cqe;
    pthread_mutex_unlock(&md->lock);
    if (!room) {
        PMOF_WARN(FI_LOG_EP_CTRL, "the control CQ cannot grow for another endpoint\n");
        ret = -FI_ENOSPC;
        goto err;
    }
    attr.send_cq = attr.recv_cq = md->cq;
    m->qp = ibv_create_qp(ep->dom->pd, &attr);
    if (!m->qp) {
        ret = pmof_errno(errno);
        goto err;
    }
    if (rdma_init_qp_attr(ep->id, &qa, &mask)) {
        ret = pmof_errno(errno);
        goto err;
    }
    qa.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    ret = ibv_modify_qp(m->qp, &qa, mask);
    if (ret) {
        ret = pmof_errno(ret);
        goto err;
    }
    /* Its id before its first work request: completions carry it. */
    pthread_mutex_lock(&md->lock);
    m->uid = md->next_uid++;
    if (!md->next_uid) md->next_uid = 1;
    pthread_mutex_unlock(&md->lock);
    for (uint32_t i = 0; i < MANUAL_RECVS; i++) {
        ret = post_recv(m, i);
        if (ret) {
            ret = pmof_errno(ret);
            goto err;
        }
    }
    pthread_mutex_lock(&md->lock);
    m->next = md->list;
    md->list = m;
    md->nctl++;
    pthread_mutex_unlock(&md->lock);
    ep->mctl = m;
    return 0;
err:
    m->ep = NULL;
    mctl_unref(m);
    return ret;
}

int pmof_manual_connect(struct pmof_ep *ep, uint32_t peer_qpn) {
    struct pmof_mctl *m = ep->mctl;
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_RTR};
    int mask, ret;

    /* The path of the connection, to the peer's control QP; both control
     * QPs start at PSN 0. */
    if (rdma_init_qp_attr(ep->id, &qa, &mask)) return pmof_errno(errno);
    qa.dest_qp_num = peer_qpn;
    qa.rq_psn = 0;
    if (!qa.max_dest_rd_atomic) qa.max_dest_rd_atomic = 1;
    ret = ibv_modify_qp(m->qp, &qa, mask);
    if (ret) return pmof_errno(ret);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RTS;
    if (rdma_init_qp_attr(ep->id, &qa, &mask)) return pmof_errno(errno);
    qa.sq_psn = 0;
    qa.rnr_retry = 7;
    ret = ibv_modify_qp(m->qp, &qa, mask | IBV_QP_RNR_RETRY);
    if (ret) return pmof_errno(ret);
    atomic_store(&m->up, true);
    return 0;
}

void pmof_manual_ep_close(struct pmof_ep *ep) {
    struct pmof_mctl *m = ep->mctl;
    struct pmof_mdom *md;
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};
    struct pmof_eq *eq;
    fid_t fid;

    if (!m) return;
    md = m->md;
    pthread_mutex_lock(&m->ep_lock);
    m->ep = NULL;
    while (m->pins)
        pthread_cond_wait(&m->ep_cond, &m->ep_lock);
    pthread_mutex_unlock(&m->ep_lock);
    atomic_store(&m->dead, true);
    /* Drains still posted are dropped with the endpoint's completions. */
    atomic_fetch_sub(&md->draining, atomic_exchange(&m->draining, 0));
    atomic_fetch_sub(&md->waiting, atomic_exchange(&m->waiting, 0));
    ibv_modify_qp(m->qp, &qa, IBV_QP_STATE);
    pthread_mutex_lock(&md->lock);
    for (struct pmof_mctl **pp = &md->list; *pp; pp = &(*pp)->next) {
        if (*pp != m) continue;
        *pp = m->next;
        md->nctl--;
        break;
    }
    pthread_mutex_unlock(&md->lock);
    eq = target_eq(ep, &fid);
    if (eq) pmof_manual_eq_release(eq, m, 0);
    ep->mctl = NULL;
    mctl_unref(m);
}
