/* SPDX-License-Identifier: MIT */
/*
 * Connected endpoints: one RC QP each, owned by the provider rather than
 * by librdmacm, so that its FLUSH access is in place before the peer can
 * send a commit (librdmacm would reset the access flags on the way to RTR)
 * and so that native commits are agreed through ECE by the provider.
 *
 * Every work request has a slot in a ring (wr_id points at it).  Requests
 * without a completion go unsignaled, and one in every half ring is
 * signaled anyway, so that the ring drains: an RC completion retires every
 * earlier request.
 */
#include "pmof.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- the ring */

static int ring_init(struct pmof_ring *r, uint32_t size) {
    r->ops = calloc(size, sizeof(*r->ops));
    r->size = size;
    r->head = r->tail = 0;
    return r->ops ? 0 : -FI_ENOMEM;
}

static uint64_t ring_tail(const struct pmof_ring *r) {
    return __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
}

/* Full when the outstanding and the reserved requests fill it. */
static bool tx_full(struct pmof_ep *ep) {
    return ep->tx.head - ring_tail(&ep->tx) + atomic_load(&ep->tx_reserved) >= ep->tx.size;
}

bool pmof_ep_wants_completion(const struct pmof_ep *ep, bool tx, uint64_t flags) {
    if (flags & PMOF_NO_COMPLETION) return false;
    if (tx ? ep->tx_cq_internal : ep->rx_cq_internal) return false;
    if (!(tx ? ep->tx_selective : ep->rx_selective)) return true;
    return (flags & FI_COMPLETION) != 0;
}

static struct pmof_op *tx_op_at_head(struct pmof_ep *ep, void *context, uint64_t flags,
                                     uint64_t cq_flags, size_t len, enum pmof_cntr_kind cntr) {
    struct pmof_op *op = &ep->tx.ops[ep->tx.head % ep->tx.size];

    op->ep = ep;
    op->rdm = NULL;
    op->mrec = NULL;
    op->seq = ep->tx.head++;
    op->context = context;
    op->flags = cq_flags;
    op->len = len;
    op->buf = NULL;
    op->report = pmof_ep_wants_completion(ep, true, flags);
    op->cntr = cntr;
    op->hmem.mr = NULL;
    op->bounce = false;
    op->trecv = NULL;
    op->tsend = 0;
    op->tbuf = 0;
    /* Counters count every request, so theirs are signaled too. */
    op->signaled = op->report || ep->cntrs[cntr] || ++ep->unsignaled >= ep->tx.size / 2;
    if (op->signaled) ep->unsignaled = 0;
    return op;
}

struct pmof_op *pmof_tx_op(struct pmof_ep *ep, void *context, uint64_t flags, uint64_t cq_flags,
                           size_t len, enum pmof_cntr_kind cntr) {
    if (tx_full(ep)) {
        pmof_cq_progress(ep->tx_cq);
        if (tx_full(ep)) return NULL;
    }
    return tx_op_at_head(ep, context, flags, cq_flags, len, cntr);
}

struct pmof_op *pmof_tx_op_reserved(struct pmof_ep *ep, void *context, uint64_t flags,
                                    uint64_t cq_flags, size_t len) {
    return tx_op_at_head(ep, context, flags, cq_flags, len, PMOF_CNTR_NONE);
}

void pmof_tx_start(struct pmof_ep *ep) {
    ep->tx_start_head = ep->tx.head;
    ep->tx_start_unsignaled = ep->unsignaled;
    ibv_wr_start(ep->qpx);
}

void pmof_tx_wr(struct pmof_ep *ep, struct pmof_op *op, unsigned int send_flags) {
    ep->qpx->wr_id = (uintptr_t)op;
    ep->qpx->wr_flags = send_flags | (op->signaled ? IBV_SEND_SIGNALED : 0);
}

ssize_t pmof_tx_post(struct pmof_ep *ep) {
    int ret = ibv_wr_complete(ep->qpx);

    if (ret) {
        ep->tx.head = ep->tx_start_head;
        ep->unsignaled = ep->tx_start_unsignaled;
        PMOF_WARN(FI_LOG_EP_DATA, "posting failed: %s\n", strerror(ret));
        return pmof_errno(ret);
    }
    return 0;
}

void pmof_tx_abort(struct pmof_ep *ep) {
    ibv_wr_abort(ep->qpx);
    ep->tx.head = ep->tx_start_head;
    ep->unsignaled = ep->tx_start_unsignaled;
}

void pmof_wr_set_payload(struct pmof_ep *ep, const struct iovec *iov, size_t count,
                         const struct ibv_sge *sge, int nsge, bool inl) {
    uint8_t buf[PMOF_INLINE_MAX];
    size_t len = 0;

    if (!inl) {
        ibv_wr_set_sge_list(ep->qpx, (size_t)nsge, sge);
        return;
    }
    /* One buffer, never a list: rdma-core's rxe provider before v64 leaves
     * an inline list's length at 0 (the request then carries nothing, and
     * a write of nothing even passes a bad key).  The copy is at most
     * PMOF_INLINE_MAX bytes, which the device copies anyway. */
    if (count == 1) {
        ibv_wr_set_inline_data(ep->qpx, iov[0].iov_base, iov[0].iov_len);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        memcpy(buf + len, iov[i].iov_base, iov[i].iov_len);
        len += iov[i].iov_len;
    }
    ibv_wr_set_inline_data(ep->qpx, buf, len);
}

int pmof_fill_sge(const struct iovec *iov, void **desc, size_t count, struct ibv_sge *sge,
                  size_t *total) {
    size_t n = 0;

    *total = 0;
    if (count > PMOF_IOV_LIMIT || (count && !iov)) return -FI_EINVAL;
    for (size_t i = 0; i < count; i++) {
        struct pmof_mr *mr = desc ? desc[i] : NULL;

        if (!iov[i].iov_len) continue;
        if (!mr || mr->mr_fid.fid.fclass != FI_CLASS_MR || !mr->ibv) return -FI_EINVAL;
        if (iov[i].iov_len > PMOF_MAX_MSG_SIZE - *total) return -FI_EMSGSIZE;
        sge[n].addr = (uintptr_t)iov[i].iov_base;
        sge[n].length = (uint32_t)iov[i].iov_len;
        sge[n].lkey = mr->ibv->lkey;
        *total += iov[i].iov_len;
        n++;
    }
    return (int)n;
}

ssize_t pmof_ep_check_tx(struct pmof_ep *ep) {
    if (ep->state == PMOF_EP_CONNECTED) return 0;
    if (ep->state == PMOF_EP_ERROR || ep->state == PMOF_EP_SHUTDOWN) return -FI_ENOTCONN;
    return -FI_EOPBADSTATE;
}

/* --------------------------------------------------------- completions */

int pmof_wc_errno(enum ibv_wc_status s) {
    switch (s) {
    case IBV_WC_LOC_LEN_ERR:
        return FI_ETRUNC;
    case IBV_WC_WR_FLUSH_ERR:
        return FI_ECANCELED;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return FI_EACCES;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return FI_ETIMEDOUT;
    case IBV_WC_REM_INV_REQ_ERR:
        return FI_EINVAL;
    case IBV_WC_REM_OP_ERR:
        return FI_EREMOTEIO;
    default:
        return FI_EIO;
    }
}

void pmof_recv_entry(const struct ibv_wc *wc, struct pmof_cq_entry *out,
                     struct pmof_cntr *const *cntrs, struct pmof_cntr **cntr) {
    out->len = wc->byte_len;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        out->flags = FI_RMA | FI_REMOTE_WRITE;
        out->buf = NULL;
        out->len = 0;
        *cntr = cntrs[PMOF_CNTR_REMOTE_WRITE];
    }
    if (wc->wc_flags & IBV_WC_WITH_IMM) {
        out->flags |= FI_REMOTE_CQ_DATA;
        out->data = ntohl(wc->imm_data);
    }
}

bool pmof_ep_complete(struct pmof_ep *ep, const struct ibv_wc *wc, struct pmof_cq_entry *out,
                      struct pmof_cntr **cntr) {
    /* A copy: once the tail moves past it, the slot may be posted again. */
    const struct pmof_op op = *(struct pmof_op *)(uintptr_t)wc->wr_id;
    const struct pmof_op *slot = (struct pmof_op *)(uintptr_t)wc->wr_id;
    /* A failed request's opcode is undefined; the slot tells. */
    bool recv = slot >= ep->rx.ops && slot < ep->rx.ops + ep->rx.size;

    *cntr = ep->cntrs[op.cntr];
    memset(out, 0, sizeof(*out));
    out->op_context = op.context;
    out->flags = op.flags;
    out->src_addr = FI_ADDR_NOTAVAIL;
    if (wc->status != IBV_WC_SUCCESS) {
        out->err = pmof_wc_errno(wc->status);
        out->prov_errno = wc->status;
        out->len = op.len;
        if (wc->status != IBV_WC_WR_FLUSH_ERR) ep->state = PMOF_EP_ERROR;
        PMOF_INFO(FI_LOG_CQ, "completion error: %s\n", ibv_wc_status_str(wc->status));
    } else if (recv) {
        out->buf = op.buf;
        pmof_recv_entry(wc, out, ep->cntrs, cntr);
        if (wc->opcode == IBV_WC_RECV) pmof_hmem_complete(&op.hmem, wc->byte_len);
    } else if (op.hmem.mr) {
        pmof_hmem_complete(&op.hmem, op.len);
    }
    __atomic_store_n(recv ? &ep->rx.tail : &ep->tx.tail, op.seq + 1, __ATOMIC_RELEASE);
    if (!recv && op.tbuf) pmof_tagged_sbuf_put(ep->rdm, op.tbuf);
    if (!recv && (op.trecv || op.tsend || op.bounce)) {
        /* A rendezvous of an FI_TAGGED endpoint (a READ, an RTS, a FIN):
         * its end is reported there. */
        *cntr = NULL;
        if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
            ep->state = PMOF_EP_ERROR;
        pmof_tagged_tx_complete(ep, &op, wc);
        return false;
    }
    if (ep->closing) return false;
    if (op.mrec) {
        /* A manual commit's drain: on success the commit goes on, and only
         * its end reaches the CQ and the write counter. */
        int err = wc->status == IBV_WC_SUCCESS ? pmof_manual_placed(ep, op.mrec) : 0;
        if (wc->status != IBV_WC_SUCCESS) pmof_manual_drain_failed(ep, op.mrec);
        *cntr = NULL;
        if (wc->status == IBV_WC_SUCCESS && !err) return false;
        *cntr = ep->cntrs[PMOF_CNTR_WRITE];
        if (err) {
            out->err = -err;
            out->prov_errno = 0;
            out->len = op.len;
        }
        return !ep->tx_cq_internal;
    }
    /* Errors reach the application even for requests it asked no
     * completion of, as long as it has a CQ to read them from. */
    if (wc->status != IBV_WC_SUCCESS) return !(recv ? ep->rx_cq_internal : ep->tx_cq_internal);
    return op.report;
}

/* ------------------------------------------------------------------ QP */

int pmof_ep_create_qp(struct pmof_ep *ep) {
    struct pmof_domain *dom = ep->dom;
    struct ibv_qp_init_attr_ex attr = {
        .send_cq = ep->tx_cq->ibv,
        .recv_cq = ep->rx_cq->ibv,
        .cap =
            {
                .max_send_wr = ep->tx.size,
                .max_recv_wr = ep->rx.size,
                .max_send_sge = PMOF_IOV_LIMIT,
                .max_recv_sge = PMOF_IOV_LIMIT,
                .max_inline_data = (uint32_t)ep->info->tx_attr->inject_size,
            },
        .qp_type = IBV_QPT_RC,
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = dom->pd,
        .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_READ,
    };
    struct ibv_qp_attr qa;
    int mask, ret;

    if (ep->srq) {
        attr.srq = ep->srq;
        attr.cap.max_recv_wr = attr.cap.max_recv_sge = 0;
    }
    if (dom->scratch)
        attr.send_ops_flags |=
            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
    if (dom->atomic_write) attr.send_ops_flags |= IBV_QP_EX_WITH_ATOMIC_WRITE;
    if (dom->commit_path == PMOF_COMMIT_VERBS)
        attr.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE_COMMIT | IBV_QP_EX_WITH_FLUSH;
    else if (dom->commit_path == PMOF_COMMIT_FLUSH)
        attr.send_ops_flags |= IBV_QP_EX_WITH_FLUSH;
    ep->qp = ibv_create_qp_ex(dom->verbs, &attr);
    if (!ep->qp) {
        ret = errno;
        PMOF_WARN(FI_LOG_EP_CTRL, "ibv_create_qp_ex: %s\n", strerror(ret));
        return pmof_errno(ret);
    }
    ep->qpx = ibv_qp_to_qp_ex(ep->qp);
    ep->max_inline =
        attr.cap.max_inline_data < PMOF_INLINE_MAX ? attr.cap.max_inline_data : PMOF_INLINE_MAX;
    if (dom->commit_path == PMOF_COMMIT_VERBS) ep->commit_ops = ibv_qp_to_commit_ops(ep->qpx);

    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    if (rdma_init_qp_attr(ep->id, &qa, &mask)) {
        ret = errno;
        PMOF_WARN(FI_LOG_EP_CTRL, "rdma_init_qp_attr(INIT): %s\n", strerror(ret));
        return pmof_errno(ret);
    }
    /* What librdmacm grants, and the FLUSH access commits need. */
    qa.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
    if (dom->commit_path != PMOF_COMMIT_NONE)
        qa.qp_access_flags |= IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;
    ret = ibv_modify_qp(ep->qp, &qa, mask);
    if (ret) {
        PMOF_WARN(FI_LOG_EP_CTRL, "QP to INIT: %s\n", strerror(ret));
        return pmof_errno(ret);
    }
    if (ep->info->mode & FI_COMMIT_MANUAL) return pmof_manual_ep_init(ep);
    return 0;
}

static int qp_to(struct pmof_ep *ep, enum ibv_qp_state state) {
    struct ibv_qp_attr qa = {.qp_state = state};
    int mask, ret;

    if (rdma_init_qp_attr(ep->id, &qa, &mask)) return pmof_errno(errno);
    if (state == IBV_QPS_RTR) {
        qa.max_dest_rd_atomic = qa.max_dest_rd_atomic ? qa.max_dest_rd_atomic : 1;
    }
    ret = ibv_modify_qp(ep->qp, &qa, mask);
    if (ret) PMOF_WARN(FI_LOG_EP_CTRL, "QP to state %d: %s\n", state, strerror(ret));
    return pmof_errno(ret);
}

int pmof_ep_qp_to_rts(struct pmof_ep *ep) {
    int ret = qp_to(ep, IBV_QPS_RTR);
    return ret ? ret : qp_to(ep, IBV_QPS_RTS);
}

void pmof_ep_qp_to_error(struct pmof_ep *ep) {
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};

    if (ep->qp) ibv_modify_qp(ep->qp, &qa, IBV_QP_STATE);
}

/* ---------------------------------------------------------- fi_ops_ep */

static int ep_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    switch (optname) {
    case FI_OPT_CM_DATA_SIZE:
        if (!optval || !optlen) return -FI_EINVAL;
        if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
        *(size_t *)optval =
            pmof_cm_user_max((ep->info->mode & FI_COMMIT_MANUAL) ? PMOF_CM_COMMIT_MANUAL : 0);
        *optlen = sizeof(size_t);
        return 0;
    default:
        return -FI_ENOPROTOOPT;
    }
}

static int ep_setopt(fid_t fid, int level, int optname, const void *optval, size_t optlen) {
    (void)fid, (void)optname, (void)optval, (void)optlen;
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    return -FI_ENOPROTOOPT;
}

static ssize_t ep_cancel(fid_t fid, void *context) {
    (void)fid, (void)context;
    /* A posted verbs request cannot be taken back. */
    return -FI_ENOENT;
}

static ssize_t ep_rx_size_left(struct fid_ep *ep_fid) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    return ep->qp ? (ssize_t)(ep->rx.size - (ep->rx.head - ring_tail(&ep->rx))) : -FI_EOPBADSTATE;
}

static ssize_t ep_tx_size_left(struct fid_ep *ep_fid) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    return ep->qp ? (ssize_t)(ep->tx.size - (ep->tx.head - ring_tail(&ep->tx))) : -FI_EOPBADSTATE;
}

static struct fi_ops_ep ep_base_ops = {
    .size = sizeof(struct fi_ops_ep),
    .cancel = ep_cancel,
    .getopt = ep_getopt,
    .setopt = ep_setopt,
    .tx_ctx = NULL,
    .rx_ctx = NULL,
    .rx_size_left = ep_rx_size_left,
    .tx_size_left = ep_tx_size_left,
};

/* -------------------------------------------------------------- binding */

static int bind_cq(struct pmof_ep *ep, struct pmof_cq *cq, uint64_t flags) {
    if (flags & ~(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) return -FI_EBADFLAGS;
    if (!(flags & (FI_TRANSMIT | FI_RECV))) return -FI_EINVAL;
    if (cq->dom != ep->dom) return -FI_EINVAL;
    if (ep->qp) return -FI_EOPBADSTATE;
    if (flags & FI_TRANSMIT) {
        if (ep->tx_cq) return -FI_EINVAL;
        ep->tx_cq = cq;
        ep->tx_selective = flags & FI_SELECTIVE_COMPLETION;
        atomic_fetch_add(&cq->refs, 1);
    }
    if (flags & FI_RECV) {
        if (ep->rx_cq) return -FI_EINVAL;
        ep->rx_cq = cq;
        ep->rx_selective = flags & FI_SELECTIVE_COMPLETION;
        atomic_fetch_add(&cq->refs, 1);
    }
    return 0;
}

/* The counter kinds, in enum pmof_cntr_kind order, by binding flag. */
const uint64_t pmof_cntr_flags[PMOF_CNTR_KINDS] = {
    FI_SEND, FI_RECV, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE,
};

int pmof_bind_cntr(struct pmof_cntr **cntrs, struct pmof_cntr *c, uint64_t flags) {
    if (flags & ~(FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE))
        return -FI_EBADFLAGS;
    for (int k = 0; k < PMOF_CNTR_KINDS; k++)
        if ((flags & pmof_cntr_flags[k]) && cntrs[k]) return -FI_EINVAL;
    for (int k = 0; k < PMOF_CNTR_KINDS; k++) {
        if (!(flags & pmof_cntr_flags[k])) continue;
        cntrs[k] = c;
        atomic_fetch_add(&c->refs, 1);
    }
    return 0;
}

int pmof_ops_flag_control(uint64_t *tx_flags, uint64_t *rx_flags, int command, void *arg) {
    uint64_t *flags = arg;

    if (!flags || !(*flags & (FI_TRANSMIT | FI_RECV))) return -FI_EINVAL;
    if (command == FI_GETOPSFLAG) {
        *flags = (*flags & FI_TRANSMIT) ? *tx_flags : *rx_flags;
        return 0;
    }
    *((*flags & FI_TRANSMIT) ? tx_flags : rx_flags) = *flags & ~(FI_TRANSMIT | FI_RECV);
    return 0;
}

static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    if (!bfid) return -FI_EINVAL;
    switch (bfid->fclass) {
    case FI_CLASS_EQ: {
        struct pmof_eq *eq = container_of(bfid, struct pmof_eq, eq_fid.fid);
        if (ep->eq) return -FI_EINVAL;
        if (rdma_migrate_id(ep->id, eq->channel)) return pmof_errno(errno);
        ep->eq = eq;
        atomic_fetch_add(&eq->refs, 1);
        return 0;
    }
    case FI_CLASS_CQ:
        return bind_cq(ep, container_of(bfid, struct pmof_cq, cq_fid.fid), flags);
    case FI_CLASS_CNTR:
        if (ep->qp) return -FI_EOPBADSTATE;
        return pmof_bind_cntr(ep->cntrs, container_of(bfid, struct pmof_cntr, cntr_fid.fid), flags);
    default:
        return -FI_ENOSYS;
    }
}

/* A direction bound to counters only still needs a verbs CQ. */
static int internal_cq(struct pmof_ep *ep, struct pmof_cq **cq) {
    struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
    struct fid_cq *fid;
    int ret = pmof_cq_open(&ep->dom->domain_fid, &attr, &fid, NULL);

    if (ret) return ret;
    *cq = container_of(fid, struct pmof_cq, cq_fid);
    atomic_fetch_add(&(*cq)->refs, 1);
    return 0;
}

static int ep_enable(struct pmof_ep *ep) {
    int ret;

    if (ep->qp) return 0;
    if (!ep->eq) return -FI_ENOEQ;
    if (!ep->tx_cq) {
        ret = internal_cq(ep, &ep->tx_cq);
        if (ret) return ret;
        ep->tx_cq_internal = true;
    }
    if (!ep->rx_cq) {
        ret = internal_cq(ep, &ep->rx_cq);
        if (ret) return ret;
        ep->rx_cq_internal = true;
    }
    for (int k = 0; k < PMOF_CNTR_KINDS; k++) {
        if (!ep->cntrs[k]) continue;
        bool tx = k == PMOF_CNTR_SEND || k == PMOF_CNTR_READ || k == PMOF_CNTR_WRITE;
        ret = pmof_cntr_watch_cq(ep->cntrs[k], tx ? ep->tx_cq : ep->rx_cq);
        if (ret) return ret;
    }
    if (!ep->id->verbs) {
        PMOF_WARN(FI_LOG_EP_CTRL, "endpoint has no device: give its info a source address\n");
        return -FI_EOPBADSTATE;
    }
    if (ep->id->verbs != ep->dom->verbs) {
        PMOF_WARN(FI_LOG_EP_CTRL, "endpoint address is on %s, domain is %s\n",
                  ibv_get_device_name(ep->id->verbs->device),
                  ibv_get_device_name(ep->dom->verbs->device));
        return -FI_EINVAL;
    }
    ret = pmof_ep_create_qp(ep);
    if (ret) return ret;
    return pmof_ep_set_local_ece(ep);
}

static int ep_control(struct fid *fid, int command, void *arg) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    switch (command) {
    case FI_ENABLE:
        return ep_enable(ep);
    case FI_GETOPSFLAG:
    case FI_SETOPSFLAG:
        return pmof_ops_flag_control(&ep->tx_op_flags, &ep->rx_op_flags, command, arg);
    default:
        return -FI_ENOSYS;
    }
}

static int ep_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                       void *context) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    (void)context;
    if (flags) return -FI_EBADFLAGS;
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, FI_PMOF_EP_OPS_1)) return -FI_ENOSYS;
    *ops = &ep->pmof_ops;
    return 0;
}

static void unref_cq(struct pmof_cq *cq, bool internal) {
    if (!cq) return;
    atomic_fetch_sub(&cq->refs, 1);
    if (internal) fi_close(&cq->cq_fid.fid);
}

static int ep_close(struct fid *fid) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    /* Completions still queued are dropped from here on; the control
     * thread no longer reaches this endpoint once its QP is closed. */
    ep->closing = true;
    pmof_manual_ep_close(ep);
    if (ep->qp) {
        /* Requests still queued are dropped, not completed. */
        int ret = ibv_destroy_qp(ep->qp);
        if (ret) return pmof_errno(ret);
        /* Completions already in the CQs point into this endpoint: taken
         * out now, and dropped. */
        pmof_cq_progress(ep->tx_cq);
        pmof_cq_progress(ep->rx_cq);
    }
    pmof_tagged_ep_close(ep);
    if (ep->id) rdma_destroy_id(ep->id);
    if (ep->eq) atomic_fetch_sub(&ep->eq->refs, 1);
    for (int k = 0; k < PMOF_CNTR_KINDS; k++) {
        if (!ep->cntrs[k]) continue;
        if (ep->tx_cq_internal) pmof_cntr_unwatch_cq(ep->cntrs[k], ep->tx_cq);
        if (ep->rx_cq_internal) pmof_cntr_unwatch_cq(ep->cntrs[k], ep->rx_cq);
        atomic_fetch_sub(&ep->cntrs[k]->refs, 1);
    }
    unref_cq(ep->tx_cq, ep->tx_cq_internal);
    unref_cq(ep->rx_cq, ep->rx_cq_internal);
    free(ep->connreq);
    free(ep->tx.ops);
    free(ep->rx.ops);
    pmof_lock_destroy(&ep->tx_lock);
    pmof_lock_destroy(&ep->rx_lock);
    fi_freeinfo(ep->info);
    atomic_fetch_sub(&ep->dom->refs, 1);
    free(ep);
    return 0;
}

static struct fi_ops ep_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = ep_close,
    .bind = ep_bind,
    .control = ep_control,
    .ops_open = ep_ops_open,
    .ops_set = pmof_fid_ops_set_enosys,
};

extern struct fi_ops_cm pmof_ep_cm_ops;

/* An active endpoint's rdma_cm id: bound to the info's source and, with a
 * destination, resolved at once (synchronously), so that the QP can be
 * created at fi_enable, before fi_connect. */
static int ep_open_id(struct pmof_ep *ep, const struct fi_info *info) {
    struct sockaddr *src = info->src_addr, *dst = info->dest_addr;

    if (rdma_create_id(NULL, &ep->id, &ep->ep_fid.fid, RDMA_PS_TCP)) return pmof_errno(errno);
    if (dst) {
        if (rdma_resolve_addr(ep->id, src, dst, pmof_params.cm_timeout_ms)) {
            PMOF_WARN(FI_LOG_EP_CTRL, "cannot resolve the destination: %s\n", strerror(errno));
            return pmof_errno(errno == ENODEV ? EHOSTUNREACH : errno);
        }
        ep->resolved = true;
    } else if (src && rdma_bind_addr(ep->id, src)) {
        return pmof_errno(errno);
    }
    return 0;
}

/* fi_endpoint(3): an active endpoint made with a passive one in
 * info->handle takes its rdma_cm id, and with it the address (and port) the
 * passive endpoint was bound to; the passive endpoint keeps nothing but
 * its closing.  Back on a channel of its own, as ep_open_id's ids are,
 * until an EQ is bound. */
static int ep_take_pep_id(struct pmof_ep *ep, const struct fi_info *info, struct pmof_pep *pep) {
    struct rdma_cm_id *id = pep->id;

    if (pep->eq && rdma_migrate_id(id, NULL)) return pmof_errno(errno);
    if (info->dest_addr &&
        rdma_resolve_addr(id, NULL, info->dest_addr, pmof_params.cm_timeout_ms)) {
        int ret = pmof_errno(errno == ENODEV ? EHOSTUNREACH : errno);

        PMOF_WARN(FI_LOG_EP_CTRL, "cannot resolve the destination: %s\n", fi_strerror(-ret));
        /* The passive endpoint as it was: still usable. */
        if (pep->eq) rdma_migrate_id(id, pep->eq->channel);
        return ret;
    }
    ep->resolved = info->dest_addr != NULL;
    if (pep->eq) {
        atomic_fetch_sub(&pep->eq->refs, 1);
        pep->eq = NULL;
    }
    pep->id = NULL;
    ep->id = id;
    id->context = &ep->ep_fid.fid;
    return 0;
}

int pmof_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **out,
                  void *context) {
    struct pmof_domain *dom = container_of(domain, struct pmof_domain, domain_fid);
    struct pmof_pep *pep = NULL;
    struct pmof_ep *ep;
    int ret = -FI_ENOMEM;

    if (!info || !info->ep_attr || !out) return -FI_EINVAL;
    if (info->ep_attr->type == FI_EP_RDM) return pmof_rdm_endpoint(dom, info, out, context);
    if (info->ep_attr->type != FI_EP_MSG) return -FI_EINVAL;
    if (info->handle && info->handle->fclass == FI_CLASS_PEP) {
        pep = pmof_pep_of(info->handle);
        if (!pep) return -FI_EINVAL;
        /* A listener keeps its id; one already taken has none. */
        if (pep->listening || !pep->id) return -FI_EOPBADSTATE;
    } else if (info->handle && info->handle->fclass != FI_CLASS_CONNREQ) {
        return -FI_EINVAL;
    }
    ep = calloc(1, sizeof(*ep));
    if (!ep) return -FI_ENOMEM;
    ep->dom = dom;
    ep->info = fi_dupinfo(info);
    if (!ep->info) goto err;
    ep->tx_op_flags = info->tx_attr ? info->tx_attr->op_flags : 0;
    ep->rx_op_flags = info->rx_attr ? info->rx_attr->op_flags : 0;
    if (ring_init(&ep->tx, info->tx_attr && info->tx_attr->size ? (uint32_t)info->tx_attr->size
                                                                : (uint32_t)pmof_params.tx_size) ||
        ring_init(&ep->rx, info->rx_attr && info->rx_attr->size ? (uint32_t)info->rx_attr->size
                                                                : (uint32_t)pmof_params.rx_size))
        goto err;
    /* Manual commits post their follow-ups from the control thread. */
    pmof_lock_init(&ep->tx_lock, dom->thread_safe || (info->mode & FI_COMMIT_MANUAL));
    pmof_lock_init(&ep->rx_lock, dom->thread_safe);
    ep->ep_fid.fid.fclass = FI_CLASS_EP;
    ep->ep_fid.fid.context = context;
    ep->ep_fid.fid.ops = &ep_fi_ops;
    ep->ep_fid.ops = &ep_base_ops;
    ep->ep_fid.cm = &pmof_ep_cm_ops;
    ep->ep_fid.msg = &pmof_msg_ops;
    ep->ep_fid.rma = &pmof_rma_ops;
    ep->ep_fid.tagged = &pmof_tagged_ops_enosys;
    ep->ep_fid.atomic = &pmof_atomic_ops;
    ep->ep_fid.collective = &pmof_collective_ops_enosys;
    ep->pmof_ops.size = sizeof(ep->pmof_ops);
    ep->pmof_ops.commit = pmof_commit;
    if (pep) {
        ep->info->handle = NULL;
        ret = ep_take_pep_id(ep, info, pep);
        if (ret) goto err;
    } else if (info->handle) {
        struct pmof_connreq *cr = container_of(info->handle, struct pmof_connreq, handle);
        /* The request's id becomes this endpoint's; the info keeps only a
         * dangling handle, which fi_freeinfo does not follow. */
        ep->connreq = cr;
        ep->id = cr->id;
        ep->id->context = &ep->ep_fid.fid;
        ep->peer_flags = cr->peer_flags;
        ep->resolved = true;
        ep->info->handle = NULL;
    } else {
        ret = ep_open_id(ep, info);
        if (ret) goto err;
    }
    atomic_fetch_add(&dom->refs, 1);
    *out = &ep->ep_fid;
    return 0;
err:
    if (ep->id && !ep->connreq) rdma_destroy_id(ep->id);
    free(ep->tx.ops);
    free(ep->rx.ops);
    fi_freeinfo(ep->info);
    free(ep);
    return ret;
}
