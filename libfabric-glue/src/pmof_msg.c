/* SPDX-License-Identifier: MIT */
/* Messages: receives are posted to the QP's receive queue as they come;
 * sends go inline when they fit (always for fi_inject). */
#include "pmof.h"

#include <arpa/inet.h>
#include <string.h>

static ssize_t post_recv(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                         void *context, uint64_t flags) {
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    struct ibv_recv_wr wr = {0}, *bad;
    struct pmof_ring *r = &ep->rx;
    struct pmof_op *op;
    size_t total;
    int n, ret;

    struct iovec staged[PMOF_IOV_LIMIT];
    struct pmof_hmem_io hio;
    int sret = pmof_hmem_prepare(ep->dom, &iov, desc, count, staged, false, &hio);
    if (sret) return sret;
    if (!ep->qp || ep->srq) return -FI_EOPBADSTATE;
    if (count > PMOF_IOV_LIMIT || (count && !iov)) return -FI_EINVAL;
    n = pmof_fill_sge(iov, desc, count, sge, &total);
    if (n < 0) return n;
    pmof_lock(&ep->rx_lock);
    if (r->head - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) >= r->size) {
        pmof_unlock(&ep->rx_lock);
        return -FI_EAGAIN;
    }
    op = &r->ops[r->head % r->size];
    op->ep = ep;
    op->rdm = NULL;
    op->seq = r->head;
    op->context = context;
    op->flags = FI_MSG | FI_RECV;
    op->len = total;
    op->buf = count ? iov[0].iov_base : NULL;
    op->report = pmof_ep_wants_completion(ep, false, flags);
    op->signaled = true;
    op->cntr = PMOF_CNTR_RECV;
    op->hmem = hio;
    wr.wr_id = (uintptr_t)op;
    wr.sg_list = sge;
    wr.num_sge = n;
    ret = ibv_post_recv(ep->qp, &wr, &bad);
    if (!ret) r->head++;
    pmof_unlock(&ep->rx_lock);
    return ret ? pmof_errno(ret) : 0;
}

static ssize_t msg_recvmsg(struct fid_ep *ep_fid, const struct fi_msg *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);

    if (!msg) return -FI_EINVAL;
    return post_recv(ep, msg->msg_iov, msg->desc, msg->iov_count, msg->context, flags);
}

static ssize_t msg_recvv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src_addr, void *context) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);

    (void)src_addr;
    return post_recv(ep, iov, desc, count, context, ep->rx_op_flags);
}

static ssize_t msg_recv(struct fid_ep *ep_fid, void *buf, size_t len, void *desc,
                        fi_addr_t src_addr, void *context) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return msg_recvv(ep_fid, &iov, &desc, 1, src_addr, context);
}

/* Sends (flags: FI_INJECT, FI_REMOTE_CQ_DATA, FI_FENCE, FI_COMPLETION). */
ssize_t pmof_post_send(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       uint64_t data, void *context, uint64_t flags) {
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    size_t total = 0;
    bool inject = flags & FI_INJECT;
    struct pmof_op *op;
    unsigned int sflags = 0;
    ssize_t ret;
    int n = 0;
    struct iovec staged[PMOF_IOV_LIMIT];

    int sret = pmof_hmem_prepare(ep->dom, &iov, desc, count, staged, true, NULL);
    if (sret) return sret;
    if (count > ep->dom->tx_iov_limit || (count && !iov)) return -FI_EINVAL;
    for (size_t i = 0; i < count; i++)
        total += iov[i].iov_len;
    if (inject && total > ep->max_inline) return -FI_EINVAL;
    if (total > PMOF_MAX_MSG_SIZE) return -FI_EMSGSIZE;
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    /* Small sends go inline whether or not they are injected: no lkey
     * needed, and the buffer is free at return. */
    if (total <= ep->max_inline) {
        sflags |= IBV_SEND_INLINE;
    } else {
        n = pmof_fill_sge(iov, desc, count, sge, &total);
        if (n < 0) return n;
    }
    if (flags & FI_FENCE) sflags |= IBV_SEND_FENCE;
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, context, flags, FI_MSG | FI_SEND, total, PMOF_CNTR_SEND);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        return -FI_EAGAIN;
    }
    pmof_tx_wr(ep, op, sflags);
    if (flags & FI_REMOTE_CQ_DATA)
        ibv_wr_send_imm(ep->qpx, htonl((uint32_t)data));
    else
        ibv_wr_send(ep->qpx);
    pmof_wr_set_payload(ep, iov, count, sge, n, sflags & IBV_SEND_INLINE);
    ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    return ret;
}

static ssize_t msg_sendmsg(struct fid_ep *ep_fid, const struct fi_msg *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);

    if (!msg) return -FI_EINVAL;
    return pmof_post_send(ep, msg->msg_iov, msg->desc, msg->iov_count, msg->data, msg->context,
                          flags);
}

static ssize_t msg_sendv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t dest_addr, void *context) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);

    (void)dest_addr;
    return pmof_post_send(ep, iov, desc, count, 0, context, ep->tx_op_flags & ~FI_REMOTE_CQ_DATA);
}

static ssize_t msg_send(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                        fi_addr_t dest_addr, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return msg_sendv(ep_fid, &iov, &desc, 1, dest_addr, context);
}

static ssize_t msg_senddata(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                            uint64_t data, fi_addr_t dest_addr, void *context) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_post_send(ep, &iov, &desc, 1, data, context, ep->tx_op_flags | FI_REMOTE_CQ_DATA);
}

static ssize_t msg_inject(struct fid_ep *ep_fid, const void *buf, size_t len, fi_addr_t dest_addr) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_post_send(ep, &iov, NULL, 1, 0, NULL, PMOF_INJECT);
}

static ssize_t msg_injectdata(struct fid_ep *ep_fid, const void *buf, size_t len, uint64_t data,
                              fi_addr_t dest_addr) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_post_send(ep, &iov, NULL, 1, data, NULL, PMOF_INJECT | FI_REMOTE_CQ_DATA);
}

struct fi_ops_msg pmof_msg_ops = {
    .size = sizeof(struct fi_ops_msg),
    .recv = msg_recv,
    .recvv = msg_recvv,
    .recvmsg = msg_recvmsg,
    .send = msg_send,
    .sendv = msg_sendv,
    .sendmsg = msg_sendmsg,
    .inject = msg_inject,
    .senddata = msg_senddata,
    .injectdata = msg_injectdata,
};
