/* SPDX-License-Identifier: MIT */
/*
 * fi_commit: earlier writes made durable, range by range, with one
 * completion.  Each range becomes an IBTA FLUSH (placement from the key's
 * class, selectivity "range"); a FLUSH covers every write before it on the
 * QP, so the ranges are durable once the last FLUSH completes, and only
 * that one is signaled.  Between manual-commit endpoints the ranges go to
 * the target application instead (pmof_manual.c).
 */
#include "pmof.h"

ssize_t pmof_commit(struct fi_pmof_ep_ops *ops, const struct fi_rma_iov *iov, size_t count,
                    fi_addr_t dest_addr, uint64_t flags, void *context) {
    (void)dest_addr;
    return pmof_commit_ep(container_of(ops, struct pmof_ep, pmof_ops), iov, count, flags, context);
}

ssize_t pmof_commit_ep(struct pmof_ep *ep, const struct fi_rma_iov *iov, size_t count,
                       uint64_t flags, void *context) {
    ssize_t ret;

    if (!count || !iov) return -FI_EINVAL;
    if (flags & ~(FI_COMPLETION | FI_COMMIT)) return -FI_EBADFLAGS;
    for (size_t i = 0; i < count; i++)
        if ((iov[i].key >> 32) & ~(PMOF_KEY_CLASS_MASK >> 32)) return -FI_EINVAL;
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    if (count > ep->tx.size / 2) return -FI_EINVAL;
    if (pmof_manual_active(ep)) return pmof_manual_commit(ep, iov, count, flags, context);
    if (!pmof_path_initiates(ep->dom->commit_path)) return -FI_EOPNOTSUPP;

    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    for (size_t i = 0; i < count; i++) {
        bool last = i + 1 == count;
        uint8_t type = (iov[i].key & PMOF_KEY_PMEM) ? IBV_FLUSH_PERSISTENT : IBV_FLUSH_GLOBAL;
        struct pmof_op *op = last ? pmof_tx_op(ep, context, flags | FI_COMPLETION,
                                               FI_RMA | FI_COMMIT, 0, PMOF_CNTR_WRITE)
                                  : pmof_tx_op(ep, NULL, PMOF_NO_COMPLETION, 0, 0, PMOF_CNTR_NONE);
        if (!op) {
            pmof_tx_abort(ep);
            pmof_unlock(&ep->tx_lock);
            return -FI_EAGAIN;
        }
        pmof_tx_wr(ep, op, 0);
        ibv_wr_flush(ep->qpx, (uint32_t)iov[i].key, iov[i].addr, iov[i].len, type, IBV_FLUSH_RANGE);
    }
    ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    return ret;
}
