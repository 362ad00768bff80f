/* SPDX-License-Identifier: MIT */
/*
 * Atomics: what an RC QP executes at the target, one 64-bit element per
 * operation, as libfabric's verbs provider offers them:
 *
 *   fi_atomic        FI_SUM (FETCH_ADD, the old value to a scratch word),
 *                    FI_ATOMIC_WRITE (IBTA ATOMIC WRITE, where the device
 *                    has it: sroce, and RNICs under a libibverbs with
 *                    ibv_wr_atomic_write)
 *   fi_fetch_atomic  FI_SUM, FI_ATOMIC_READ (FETCH_ADD of 0)
 *   fi_compare_atomic FI_CSWAP (CMP_AND_SWP)
 *
 * on FI_UINT64 and FI_INT64, naturally aligned target addresses.  An
 * ATOMIC WRITE is a single-copy atomic 8-byte placement: with FI_COMMIT
 * semantics elsewhere it is the commit word of a log.
 */
#include "pmof.h"

#include <string.h>

enum atomic_kind { ATOMIC_ADD, ATOMIC_CSWAP, ATOMIC_WRITE };

struct atomic_req {
    enum atomic_kind kind;
    uint64_t operand, compare;
    void *result; /* fetched value; NULL: into the domain's scratch word */
    void *result_desc;
    uint64_t addr, key;
    void *context;
    uint64_t flags;
};

static bool datatype_ok(enum fi_datatype t) {
    return t == FI_UINT64 || t == FI_INT64;
}

/* How (op) maps onto the device for each call family; -FI_EOPNOTSUPP
 * where it does not. */
static int map_write(const struct pmof_domain *dom, enum fi_op op, enum atomic_kind *k) {
    if (op == FI_SUM)
        *k = ATOMIC_ADD;
    else if (op == FI_ATOMIC_WRITE && dom->atomic_write)
        *k = ATOMIC_WRITE;
    else
        return -FI_EOPNOTSUPP;
    return 0;
}

static int map_fetch(enum fi_op op, enum atomic_kind *k) {
    if (op != FI_SUM && op != FI_ATOMIC_READ) return -FI_EOPNOTSUPP;
    *k = ATOMIC_ADD;
    return 0;
}

static ssize_t atomic_post(struct pmof_ep *ep, const struct atomic_req *r) {
    struct pmof_domain *dom = ep->dom;
    struct ibv_sge sge = {0};
    uint64_t cq_flags = FI_ATOMIC | (r->kind == ATOMIC_WRITE || !r->result ? FI_WRITE : FI_READ);
    enum pmof_cntr_kind cntr = cq_flags & FI_READ ? PMOF_CNTR_READ : PMOF_CNTR_WRITE;
    struct pmof_op *op;
    ssize_t ret;

    if ((r->key >> 32) & ~(PMOF_KEY_CLASS_MASK >> 32)) return -FI_EINVAL;
    /* The target executes only naturally aligned 64-bit atomics. */
    if (r->addr & 7) return -FI_EINVAL;
    if (r->kind != ATOMIC_WRITE) {
        const struct pmof_mr *mr = r->result ? r->result_desc : dom->scratch;
        if (!mr || mr->mr_fid.fid.fclass != FI_CLASS_MR || !mr->ibv || mr->bounce)
            return -FI_EINVAL;
        sge = (struct ibv_sge){.addr = (uintptr_t)(r->result ? r->result : &dom->scratch_word),
                               .length = 8,
                               .lkey = mr->ibv->lkey};
    }
    ret = pmof_ep_check_tx(ep);
    if (ret) return ret;
    pmof_lock(&ep->tx_lock);
    pmof_tx_start(ep);
    op = pmof_tx_op(ep, r->context, r->flags, cq_flags, 8, cntr);
    if (!op) {
        pmof_tx_abort(ep);
        pmof_unlock(&ep->tx_lock);
        return -FI_EAGAIN;
    }
    pmof_tx_wr(ep, op, (r->flags & FI_FENCE) ? IBV_SEND_FENCE : 0);
    switch (r->kind) {
    case ATOMIC_ADD:
        ibv_wr_atomic_fetch_add(ep->qpx, (uint32_t)r->key, r->addr, r->operand);
        break;
    case ATOMIC_CSWAP:
        ibv_wr_atomic_cmp_swp(ep->qpx, (uint32_t)r->key, r->addr, r->compare, r->operand);
        break;
    case ATOMIC_WRITE:
        ibv_wr_atomic_write(ep->qpx, (uint32_t)r->key, r->addr, &r->operand);
        break;
    }
    if (r->kind != ATOMIC_WRITE) ibv_wr_set_sge_list(ep->qpx, 1, &sge);
    ret = pmof_tx_post(ep);
    pmof_unlock(&ep->tx_lock);
    return ret;
}

/* One element of the operand (count 1, system memory). */
static int operand(const struct fi_ioc *ioc, size_t count, void **desc, uint64_t *v) {
    const struct pmof_mr *mr = desc ? desc[0] : NULL;

    if (count != 1 || !ioc || ioc->count != 1 || !ioc->addr) return -FI_EINVAL;
    if (mr && mr->mr_fid.fid.fclass == FI_CLASS_MR && mr->iface != FI_HMEM_SYSTEM)
        return -FI_EOPNOTSUPP;
    memcpy(v, ioc->addr, sizeof(*v));
    return 0;
}

static int target(const struct fi_rma_ioc *rma, size_t count, uint64_t *addr, uint64_t *key) {
    if (count != 1 || !rma || rma->count != 1) return -FI_EINVAL;
    *addr = rma->addr;
    *key = rma->key;
    return 0;
}

/* The one element a fetching operation returns into. */
static int result_of(struct atomic_req *r, struct fi_ioc *resultv, void **result_desc,
                     size_t result_count) {
    if (result_count != 1 || !resultv || resultv->count != 1 || !resultv->addr || !result_desc)
        return -FI_EINVAL;
    r->result = resultv->addr;
    r->result_desc = result_desc[0];
    return 0;
}

static ssize_t atomic_writemsg(struct pmof_ep *ep, const struct fi_msg_atomic *msg,
                               uint64_t flags) {
    struct atomic_req r = {.context = msg ? msg->context : NULL, .flags = flags};
    int ret;

    if (!msg || !datatype_ok(msg->datatype)) return -FI_EOPNOTSUPP;
    if ((ret = map_write(ep->dom, msg->op, &r.kind))) return ret;
    if ((ret = operand(msg->msg_iov, msg->iov_count, msg->desc, &r.operand))) return ret;
    if ((ret = target(msg->rma_iov, msg->rma_iov_count, &r.addr, &r.key))) return ret;
    return atomic_post(ep, &r);
}

static ssize_t atomic_readwritemsg(struct pmof_ep *ep, const struct fi_msg_atomic *msg,
                                   struct fi_ioc *resultv, void **result_desc, size_t result_count,
                                   uint64_t flags) {
    struct atomic_req r = {.context = msg ? msg->context : NULL, .flags = flags};
    int ret;

    if (!msg || !datatype_ok(msg->datatype)) return -FI_EOPNOTSUPP;
    if ((ret = map_fetch(msg->op, &r.kind))) return ret;
    if (msg->op == FI_SUM && (ret = operand(msg->msg_iov, msg->iov_count, msg->desc, &r.operand)))
        return ret;
    if ((ret = target(msg->rma_iov, msg->rma_iov_count, &r.addr, &r.key))) return ret;
    if ((ret = result_of(&r, resultv, result_desc, result_count))) return ret;
    return atomic_post(ep, &r);
}

static ssize_t atomic_compwritemsg(struct pmof_ep *ep, const struct fi_msg_atomic *msg,
                                   const struct fi_ioc *comparev, void **compare_desc,
                                   size_t compare_count, struct fi_ioc *resultv, void **result_desc,
                                   size_t result_count, uint64_t flags) {
    struct atomic_req r = {
        .kind = ATOMIC_CSWAP, .context = msg ? msg->context : NULL, .flags = flags};
    int ret;

    if (!msg || !datatype_ok(msg->datatype) || msg->op != FI_CSWAP) return -FI_EOPNOTSUPP;
    if ((ret = operand(msg->msg_iov, msg->iov_count, msg->desc, &r.operand))) return ret;
    if ((ret = operand(comparev, compare_count, compare_desc, &r.compare))) return ret;
    if ((ret = target(msg->rma_iov, msg->rma_iov_count, &r.addr, &r.key))) return ret;
    if ((ret = result_of(&r, resultv, result_desc, result_count))) return ret;
    return atomic_post(ep, &r);
}

int pmof_atomic_valid(const struct pmof_domain *dom, int family, enum fi_datatype datatype,
                      enum fi_op op, size_t *count) {
    enum atomic_kind k;
    int ret;

    if (!datatype_ok(datatype)) return -FI_EOPNOTSUPP;
    if (family == PMOF_ATOMIC_WRITE)
        ret = map_write(dom, op, &k);
    else if (family == PMOF_ATOMIC_FETCH)
        ret = map_fetch(op, &k);
    else
        ret = op == FI_CSWAP ? 0 : -FI_EOPNOTSUPP;
    if (!ret && count) *count = 1;
    return ret;
}

/* ------------------------------------------------ the fi_ops_atomic calls */

/* The endpoint's transmit flags, minus what only a write or message has. */
static uint64_t default_flags(struct fid_ep *ep_fid) {
    return pmof_ep_op_flags(ep_fid) & ~(FI_REMOTE_CQ_DATA | FI_IMMED | FI_COMMIT);
}

/* Arguments are checked before an RDM endpoint connects to the peer, so
 * that a bad call fails at once rather than with -FI_EAGAIN first. */
static int precheck(const struct fi_msg_atomic *msg) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov || msg->rma_iov->count != 1)
        return -FI_EINVAL;
    if (msg->rma_iov->addr & 7) return -FI_EINVAL;
    if (msg->op != FI_ATOMIC_READ &&
        (msg->iov_count != 1 || !msg->msg_iov || msg->msg_iov->count != 1))
        return -FI_EINVAL;
    return 0;
}

/* The fi_msg_atomic of a call that names one target word. */
static struct fi_msg_atomic atomic_msg(const struct fi_ioc *iov, void **desc, size_t count,
                                       fi_addr_t dest_addr, const struct fi_rma_ioc *rma,
                                       enum fi_datatype datatype, enum fi_op op, void *context) {
    return (struct fi_msg_atomic){.msg_iov = iov,
                                  .desc = desc,
                                  .iov_count = count,
                                  .addr = dest_addr,
                                  .rma_iov = rma,
                                  .rma_iov_count = 1,
                                  .datatype = datatype,
                                  .op = op,
                                  .context = context};
}

#define RESOLVE(ep_fid, msg)                                                                       \
    ssize_t err_ = precheck(msg);                                                                  \
    if (err_) return err_;                                                                         \
    struct pmof_ep *ep = pmof_ep_for(ep_fid, (msg)->addr, &err_);                                  \
    if (!ep) return err_

static ssize_t a_writemsg(struct fid_ep *ep_fid, const struct fi_msg_atomic *msg, uint64_t flags) {
    RESOLVE(ep_fid, msg);
    return atomic_writemsg(ep, msg, flags & ~PMOF_NO_COMPLETION);
}

static ssize_t a_writev(struct fid_ep *ep_fid, const struct fi_ioc *iov, void **desc, size_t count,
                        fi_addr_t dest_addr, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                        enum fi_op op, void *context) {
    struct fi_rma_ioc rma = {.addr = addr, .count = 1, .key = key};
    struct fi_msg_atomic msg = atomic_msg(iov, desc, count, dest_addr, &rma, datatype, op, context);
    RESOLVE(ep_fid, &msg);
    return atomic_writemsg(ep, &msg, default_flags(ep_fid));
}

static ssize_t a_write(struct fid_ep *ep_fid, const void *buf, size_t count, void *desc,
                       fi_addr_t dest_addr, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                       enum fi_op op, void *context) {
    struct fi_ioc ioc = {.addr = (void *)buf, .count = count};
    return a_writev(ep_fid, &ioc, &desc, 1, dest_addr, addr, key, datatype, op, context);
}

static ssize_t a_inject(struct fid_ep *ep_fid, const void *buf, size_t count, fi_addr_t dest_addr,
                        uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op) {
    struct fi_ioc ioc = {.addr = (void *)buf, .count = count};
    struct fi_rma_ioc rma = {.addr = addr, .count = 1, .key = key};
    struct fi_msg_atomic msg = {.msg_iov = &ioc,
                                .iov_count = 1,
                                .addr = dest_addr,
                                .rma_iov = &rma,
                                .rma_iov_count = 1,
                                .datatype = datatype,
                                .op = op};
    RESOLVE(ep_fid, &msg);
    return atomic_writemsg(ep, &msg, PMOF_INJECT);
}

static ssize_t a_readwritemsg(struct fid_ep *ep_fid, const struct fi_msg_atomic *msg,
                              struct fi_ioc *resultv, void **result_desc, size_t result_count,
                              uint64_t flags) {
    RESOLVE(ep_fid, msg);
    return atomic_readwritemsg(ep, msg, resultv, result_desc, result_count,
                               flags & ~PMOF_NO_COMPLETION);
}

static ssize_t a_readwritev(struct fid_ep *ep_fid, const struct fi_ioc *iov, void **desc,
                            size_t count, struct fi_ioc *resultv, void **result_desc,
                            size_t result_count, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                            enum fi_datatype datatype, enum fi_op op, void *context) {
    struct fi_rma_ioc rma = {.addr = addr, .count = 1, .key = key};
    struct fi_msg_atomic msg = atomic_msg(iov, desc, count, dest_addr, &rma, datatype, op, context);
    RESOLVE(ep_fid, &msg);
    return atomic_readwritemsg(ep, &msg, resultv, result_desc, result_count, default_flags(ep_fid));
}

static ssize_t a_readwrite(struct fid_ep *ep_fid, const void *buf, size_t count, void *desc,
                           void *result, void *result_desc, fi_addr_t dest_addr, uint64_t addr,
                           uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context) {
    /* FI_ATOMIC_READ has no operand. */
    uint64_t zero = 0;
    struct fi_ioc ioc = {.addr = buf ? (void *)buf : &zero, .count = count};
    struct fi_ioc res = {.addr = result, .count = count};
    return a_readwritev(ep_fid, &ioc, &desc, 1, &res, &result_desc, 1, dest_addr, addr, key,
                        datatype, op, context);
}

static ssize_t a_compwritemsg(struct fid_ep *ep_fid, const struct fi_msg_atomic *msg,
                              const struct fi_ioc *comparev, void **compare_desc,
                              size_t compare_count, struct fi_ioc *resultv, void **result_desc,
                              size_t result_count, uint64_t flags) {
    RESOLVE(ep_fid, msg);
    return atomic_compwritemsg(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                               result_count, flags & ~PMOF_NO_COMPLETION);
}

static ssize_t a_compwritev(struct fid_ep *ep_fid, const struct fi_ioc *iov, void **desc,
                            size_t count, const struct fi_ioc *comparev, void **compare_desc,
                            size_t compare_count, struct fi_ioc *resultv, void **result_desc,
                            size_t result_count, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                            enum fi_datatype datatype, enum fi_op op, void *context) {
    struct fi_rma_ioc rma = {.addr = addr, .count = 1, .key = key};
    struct fi_msg_atomic msg = atomic_msg(iov, desc, count, dest_addr, &rma, datatype, op, context);
    RESOLVE(ep_fid, &msg);
    return atomic_compwritemsg(ep, &msg, comparev, compare_desc, compare_count, resultv,
                               result_desc, result_count, default_flags(ep_fid));
}

static ssize_t a_compwrite(struct fid_ep *ep_fid, const void *buf, size_t count, void *desc,
                           const void *compare, void *compare_desc, void *result, void *result_desc,
                           fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                           enum fi_datatype datatype, enum fi_op op, void *context) {
    struct fi_ioc ioc = {.addr = (void *)buf, .count = count};
    struct fi_ioc cmp = {.addr = (void *)compare, .count = count};
    struct fi_ioc res = {.addr = result, .count = count};
    return a_compwritev(ep_fid, &ioc, &desc, 1, &cmp, &compare_desc, 1, &res, &result_desc, 1,
                        dest_addr, addr, key, datatype, op, context);
}

static int a_writevalid(struct fid_ep *ep_fid, enum fi_datatype datatype, enum fi_op op,
                        size_t *count) {
    return pmof_atomic_valid(pmof_ep_domain(ep_fid), PMOF_ATOMIC_WRITE, datatype, op, count);
}

static int a_readwritevalid(struct fid_ep *ep_fid, enum fi_datatype datatype, enum fi_op op,
                            size_t *count) {
    return pmof_atomic_valid(pmof_ep_domain(ep_fid), PMOF_ATOMIC_FETCH, datatype, op, count);
}

static int a_compwritevalid(struct fid_ep *ep_fid, enum fi_datatype datatype, enum fi_op op,
                            size_t *count) {
    return pmof_atomic_valid(pmof_ep_domain(ep_fid), PMOF_ATOMIC_COMPARE, datatype, op, count);
}

struct fi_ops_atomic pmof_atomic_ops = {
    .size = sizeof(struct fi_ops_atomic),
    .write = a_write,
    .writev = a_writev,
    .writemsg = a_writemsg,
    .inject = a_inject,
    .readwrite = a_readwrite,
    .readwritev = a_readwritev,
    .readwritemsg = a_readwritemsg,
    .compwrite = a_compwrite,
    .compwritev = a_compwritev,
    .compwritemsg = a_compwritemsg,
    .writevalid = a_writevalid,
    .readwritevalid = a_readwritevalid,
    .compwritevalid = a_compwritevalid,
};
