/* SPDX-License-Identifier: MIT */
/*
 * RMA, and the durability a write asks for.
 *
 *   flags                          verbs
 *   (none)                         RDMA WRITE (WITH IMMEDIATE for FI_REMOTE_CQ_DATA)
 *   FI_COMMIT, FI_COMMIT_COMPLETE  write-commit: persistent for a FI_PMEM key,
 *                                  globally visible otherwise
 *   FI_DELIVERY_COMPLETE           write-commit, global visibility
 *   + FI_FENCE                     IBV_WRITE_COMMIT_ORDERED
 *   + FI_IMMED / FI_REMOTE_CQ_DATA write-commit with immediate: the target's
 *                                  completion comes once the data is durable
 *   FI_IMMED without FI_COMMIT     -FI_EINVAL
 *
 * Between manual-commit endpoints, durable writes are committed by the
 * target application instead (pmof_manual.c).
 *
 * sroce carries a write-commit natively to a peer that agreed to it (ECE)
 * and as IBTA WRITE + FLUSH sequences to any other.  On other devices with
 * IBTA FLUSH the provider posts those sequences itself; on devices without
 * it durability is refused (-FI_EOPNOTSUPP), never pretended.
 */
#include "pmof.h"

#include <arpa/inet.h>
#include <string.h>

static uint32_t key_rkey(uint64_t key) {
    return (uint32_t)key;
}

static bool key_pmem(uint64_t key) {
    return (key & PMOF_KEY_PMEM) != 0;
}

static ssize_t check_key(uint64_t key) {
    return (key >> 32) & ~(PMOF_KEY_CLASS_MASK >> 32) ? -FI_EINVAL : 0;
}

/* IBTA placement for a key's class: FI_DELIVERY_COMPLETE asks visibility. */
static uint8_t placement(uint64_t key, uint64_t flags) {
    if (key_pmem(key) && (flags & (FI_COMMIT | FI_COMMIT_COMPLETE))) return IBV_FLUSH_PERSISTENT;
    return IBV_FLUSH_GLOBAL;
}

/* A device with IBTA FLUSH but no write-commit verb: the sequences sroce
 * would send, posted here: [FLUSH(MR)] WRITE FLUSH [WRITE_IMM 0].  The
 * last FLUSH covers the whole region for FI_COMMIT, whose promise takes in
 * every earlier write to the key, and the write's range for
 * FI_COMMIT_COMPLETE and FI_DELIVERY_COMPLETE, whose promise is this write
 * only.  Slots are taken in posting order, the application's last. */
static ssize_t post_flush_sequence(struct pmof_ep *ep, const struct iovec *iov, size_t count,
                                   const struct ibv_sge *sge, int nsge, bool inl, uint64_t addr,
                                   uint64_t key, uint64_t data, void *context, uint64_t flags,
                                   uint64_t cq_flags, size_t total) {
    uint8_t type = placement(key, flags);
    bool imm = flags & (FI_IMMED | FI_REMOTE_CQ_DATA);
    struct pmof_op *op;

    if (flags & FI_FENCE) {
        op = pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, 0, 0, PMOF_CNTR_NONE);
        if (!op) return -FI_EAGAIN;
        pmof_tx_wr(ep, op, 0);
        ibv_wr_flush(ep->qpx, key_rkey(key), addr, total ? total : 1, type, IBV_FLUSH_MR);
    }
    op = pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, 0, 0, PMOF_CNTR_NONE);
    if (!op) return -FI_EAGAIN;
    pmof_tx_wr(ep, op, inl ? IBV_SEND_INLINE : 0);
    ibv_wr_rdma_write(ep->qpx, key_rkey(key), addr);
    pmof_wr_set_payload(ep, iov, count, sge, nsge, inl);
    op = imm ? pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, 0, 0, PMOF_CNTR_NONE)
             : pmof_tx_op(ep, context, flags, cq_flags, total, PMOF_CNTR_WRITE);
    if (!op) return -FI_EAGAIN;
    pmof_tx_wr(ep, op, 0);
    ibv_wr_flush(ep->qpx, key_rkey(key), addr, total ? total : 1, type,
                 (flags & FI_COMMIT) ? IBV_FLUSH_MR : IBV_FLUSH_RANGE);
    if (imm) {
        op = pmof_tx_op(ep, context, flags, cq_flags, total, PMOF_CNTR_WRITE);
        if (!op) return -FI_EAGAIN;
        pmof_tx_wr(ep, op, 0);
        ibv_wr_rdma_write_imm(ep->qpx, key_rkey(key), addr, htonl((uint32_t)data));
        ibv_wr_set_sge_list(ep->qpx, 0, NULL);
    }
    return 0;
}

ssize_t pmof_rma_write(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       uint64_t addr, uint64_t key, uint64_t data, void *context, uint64_t flags) {
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    size_t total = 0;
    bool durable = flags & PMOF_DURABLE_FLAGS;
    bool inl, manual;
    int nsge = 0;
    struct pmof_op *op;
    uint64_t cq_flags = FI_RMA | FI_WRITE;
    ssize_t ret;

    struct iovec staged[PMOF_IOV_LIMIT];

    if ((flags & FI_IMMED) && !(flags & FI_COMMIT)) return -FI_EINVAL;
    int sret = pmof_hmem_prepare(ep->dom, &iov, desc, count, staged, true, NULL);
    if (sret) return sret;
    if (count > ep->dom->tx_iov_limit || (count && !iov)) return -FI_EINVAL;
    ret = check_key(key);
    if (ret) return ret;
    manual = pmof_manual_active(ep);
    if (durable && !manual && !pmof_path_initiates(ep->dom->commit_path)) return -FI_EOPNOTSUPP;
    for (size_t i = 0; i < count; i++)
        total += iov[i].iov_len;
    if ((flags & FI_INJECT) && total > ep->max_inline) return -FI_EINVAL;
    if (total > PMOF_MAX_MSG_SIZE) return -FI_EMSGSIZE;
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    inl = total <= ep->max_inline;
    if (!inl) {
        nsge = pmof_fill_sge(iov, desc, count, sge, &total);
        if (nsge < 0) return nsge;
    }
    if (durable) cq_flags |= FI_COMMIT;
    if (durable && manual)
        return pmof_manual_write(ep, iov, count, sge, nsge, inl, total, addr, key, data, context,
                                 flags);

    pmof_lock(&ep->tx_lock);
    if (manual) {
        ret = pmof_manual_note_write(ep, addr, total, key);
        if (ret) goto out;
    }
    pmof_tx_start(ep);
    if (durable && ep->dom->commit_path == PMOF_COMMIT_FLUSH) {
        ret = post_flush_sequence(ep, iov, count, sge, nsge, inl, addr, key, data, context, flags,
                                  cq_flags, total);
        if (ret) {
            pmof_tx_abort(ep);
            goto out;
        }
        ret = pmof_tx_post(ep);
        goto out;
    }
    op = pmof_tx_op(ep, context, flags, cq_flags, total, PMOF_CNTR_WRITE);
    if (!op) {
        pmof_tx_abort(ep);
        ret = -FI_EAGAIN;
        goto out;
    }
    if (durable) {
        uint32_t cflags = 0;

        if (placement(key, flags) == IBV_FLUSH_GLOBAL) cflags |= IBV_WRITE_COMMIT_GLOBAL;
        if (flags & FI_FENCE) cflags |= IBV_WRITE_COMMIT_ORDERED;
        pmof_tx_wr(ep, op, inl ? IBV_SEND_INLINE : 0);
        if (flags & (FI_IMMED | FI_REMOTE_CQ_DATA))
            ep->commit_ops->wr_rdma_write_commit_imm(ep->qpx, key_rkey(key), addr, cflags,
                                                     htonl((uint32_t)data));
        else
            ep->commit_ops->wr_rdma_write_commit(ep->qpx, key_rkey(key), addr, cflags);
        pmof_wr_set_payload(ep, iov, count, sge, nsge, inl);
    } else {
        pmof_tx_wr(ep, op, (inl ? IBV_SEND_INLINE : 0) | ((flags & FI_FENCE) ? IBV_SEND_FENCE : 0));
        if (flags & FI_REMOTE_CQ_DATA)
            ibv_wr_rdma_write_imm(ep->qpx, key_rkey(key), addr, htonl((uint32_t)data));
        else
            ibv_wr_rdma_write(ep->qpx, key_rkey(key), addr);
        pmof_wr_set_payload(ep, iov, count, sge, nsge, inl);
    }
    ret = pmof_tx_post(ep);
out:
    pmof_unlock(&ep->tx_lock);
    return ret;
}

ssize_t pmof_rma_read(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                      uint64_t addr, uint64_t key, void *context, uint64_t flags) {
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    size_t total;
    struct pmof_op *op;
    int n;
    ssize_t ret = check_key(key);

    if (ret) return ret;
    struct iovec staged[PMOF_IOV_LIMIT];
    struct pmof_hmem_io hio;
    int sret = pmof_hmem_prepare(ep->dom, &iov, desc, count, staged, false, &hio);
    if (sret) return sret;
    if (count > ep->dom->tx_iov_limit || (count && !iov)) return -FI_EINVAL;
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    n = pmof_fill_sge(iov, desc, count, sge, &total);
    if (n < 0) return n;
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, context, flags, FI_RMA | FI_READ, total, PMOF_CNTR_READ);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        return -FI_EAGAIN;
    }
    op->hmem = hio;
    pmof_tx_wr(ep, op, (flags & FI_FENCE) ? IBV_SEND_FENCE : 0);
    ibv_wr_rdma_read(ep->qpx, key_rkey(key), addr);
    pmof_wr_set_payload(ep, NULL, 0, sge, n, false);
    ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    return ret;
}

static struct pmof_ep *to_ep(struct fid_ep *ep_fid) {
    return container_of(ep_fid, struct pmof_ep, ep_fid);
}

static ssize_t rma_readmsg(struct fid_ep *ep_fid, const struct fi_msg_rma *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return pmof_rma_read(to_ep(ep_fid), msg->msg_iov, msg->desc, msg->iov_count,
                         msg->rma_iov[0].addr, msg->rma_iov[0].key, msg->context, flags);
}

static ssize_t rma_readv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context) {
    (void)src_addr;
    return pmof_rma_read(to_ep(ep_fid), iov, desc, count, addr, key, context,
                         to_ep(ep_fid)->tx_op_flags);
}

static ssize_t rma_read(struct fid_ep *ep_fid, void *buf, size_t len, void *desc,
                        fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return rma_readv(ep_fid, &iov, &desc, 1, src_addr, addr, key, context);
}

static ssize_t rma_writemsg(struct fid_ep *ep_fid, const struct fi_msg_rma *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return pmof_rma_write(to_ep(ep_fid), msg->msg_iov, msg->desc, msg->iov_count,
                          msg->rma_iov[0].addr, msg->rma_iov[0].key, msg->data, msg->context,
                          flags);
}

/* Calls without flags take the endpoint's (FI_COMMIT_COMPLETE among them),
 * minus what only a message can carry. */
static uint64_t default_flags(struct pmof_ep *ep) {
    return ep->tx_op_flags & ~(FI_REMOTE_CQ_DATA | FI_IMMED);
}

static ssize_t rma_writev(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                          fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context) {
    (void)dest_addr;
    return pmof_rma_write(to_ep(ep_fid), iov, desc, count, addr, key, 0, context,
                          default_flags(to_ep(ep_fid)));
}

static ssize_t rma_write(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                         fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rma_writev(ep_fid, &iov, &desc, 1, dest_addr, addr, key, context);
}

static ssize_t rma_writedata(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                             uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                             void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_rma_write(to_ep(ep_fid), &iov, &desc, 1, addr, key, data, context,
                          default_flags(to_ep(ep_fid)) | FI_REMOTE_CQ_DATA);
}

static ssize_t rma_inject(struct fid_ep *ep_fid, const void *buf, size_t len, fi_addr_t dest_addr,
                          uint64_t addr, uint64_t key) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_rma_write(to_ep(ep_fid), &iov, NULL, 1, addr, key, 0, NULL,
                          default_flags(to_ep(ep_fid)) | PMOF_INJECT);
}

static ssize_t rma_injectdata(struct fid_ep *ep_fid, const void *buf, size_t len, uint64_t data,
                              fi_addr_t dest_addr, uint64_t addr, uint64_t key) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    (void)dest_addr;
    return pmof_rma_write(to_ep(ep_fid), &iov, NULL, 1, addr, key, data, NULL,
                          default_flags(to_ep(ep_fid)) | PMOF_INJECT | FI_REMOTE_CQ_DATA);
}

struct fi_ops_rma pmof_rma_ops = {
    .size = sizeof(struct fi_ops_rma),
    .read = rma_read,
    .readv = rma_readv,
    .readmsg = rma_readmsg,
    .write = rma_write,
    .writev = rma_writev,
    .writemsg = rma_writemsg,
    .inject = rma_inject,
    .writedata = rma_writedata,
    .injectdata = rma_injectdata,
};
