/* SPDX-License-Identifier: MIT */
/*
 * <rdma/fi_ext_pmof.h> - persistent-memory extensions of the libfabric
 * provider "pmof" (fi_pmof(7)).
 *
 * The names and signatures are the proposals' own: FI_PMEM, FI_UNCACHED,
 * FI_COMMIT, FI_IMMED (Intel's proposal of libfabric and libibverbs
 * extensions for remote persistent memory, version 0.63 of July 2016),
 * fi_commit(), FI_COMMIT_MANUAL, FI_COMMIT_EVENT, struct fi_eq_commit_entry,
 * fi_eq_event_handler_t and fi_eq_register_handler() (the OFIWG proposal
 * "Proposal for enhancement to support additional Persistent Memory use
 * cases", 2020).  Functions libfabric lacks reach the provider through
 * fi_open_ops(); the static inline wrappers below do that, so programs link
 * against libfabric only and get -FI_ENOSYS from any other provider.
 *
 * Values live in the ranges libfabric leaves to providers: operation flags
 * 60-62, mode bit 60, EQ events and errors marked FI_PROV_SPECIFIC.
 */
#ifndef FI_EXT_PMOF_H
#define FI_EXT_PMOF_H

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Capability (fi_info.caps) and fi_mr_reg() flag: the region is persistent
 * memory; FI_COMMIT to it completes once the data is persistent.  The same
 * bit as libfabric's FI_RMA_PMEM, which is accepted everywhere too. */
#ifndef FI_PMEM
#define FI_PMEM FI_RMA_PMEM
#endif

/* fi_writemsg() flag: complete only once this write and every earlier write
 * on the endpoint to the same key are durable at the target - persistent
 * for FI_PMEM regions, globally visible otherwise.  With FI_FENCE the target
 * makes the earlier writes durable before it places this one. */
#ifndef FI_COMMIT
#define FI_COMMIT (1ULL << 60)
#endif

/* fi_writemsg() flag, only with FI_COMMIT (alone: -FI_EINVAL): the write's
 * `data` reaches the target's receive CQ (FI_REMOTE_CQ_DATA) once the write
 * is durable. */
#ifndef FI_IMMED
#define FI_IMMED (1ULL << 61)
#endif

/* fi_mr_reg() flag: remote writes into the region are placed with
 * non-temporal stores, so making them persistent costs no cache write-back. */
#ifndef FI_UNCACHED
#define FI_UNCACHED (1ULL << 62)
#endif

/* FI_FENCE combined with FI_COMMIT, by the name Intel's presentation "PMoF -
 * OFA libfabric API Case Study" (Storage Developer Conference 2016) gives it. */
#ifndef FI_ORDERED
#define FI_ORDERED FI_FENCE
#endif

/* Mode bit (fi_info.mode, domain_attr.mode): commits to the endpoint are
 * made durable by the target application (software-emulated persistence).
 * Requested by the application; the provider then delivers FI_COMMIT_EVENT
 * to the target's EQ, or calls its handler, for each fi_commit(). */
#ifndef FI_COMMIT_MANUAL
#define FI_COMMIT_MANUAL (1ULL << 60)
#endif

/* EQ event of a commit request in FI_COMMIT_MANUAL mode; the event data is
 * a struct fi_eq_commit_entry. */
#ifndef FI_COMMIT_EVENT
/* libfabric 1.x's FI_PROV_SPECIFIC bit (2.x dropped the name). */
#define FI_COMMIT_EVENT ((1U << 31) | 1)
#endif

struct fi_eq_commit_entry {
    fid_t fid;                    /* endpoint the commit arrived on */
    const struct fi_rma_iov *iov; /* ranges to make durable (provider memory,
                                     valid until acknowledged) */
    size_t count;                 /* number of ranges */
    uint64_t flags;               /* FI_COMMIT, FI_PMEM if a range is FI_PMEM */
};

typedef ssize_t (*fi_eq_event_handler_t)(struct fid_eq *eq, uint64_t event_type, void *event_data,
                                         uint64_t len, void *context);

/* fi_open_ops() names: versioned, each table only grows by appending. */
#define FI_PMOF_EP_OPS_1 "pmof_ep_ops_v1"
#define FI_PMOF_EQ_OPS_1 "pmof_eq_ops_v1"
#define FI_PMOF_DOMAIN_OPS_1 "pmof_domain_ops_v1"

struct fi_pmof_ep_ops {
    size_t size;
    ssize_t (*commit)(struct fi_pmof_ep_ops *ops, const struct fi_rma_iov *iov, size_t count,
                      fi_addr_t dest_addr, uint64_t flags, void *context);
};

struct fi_pmof_eq_ops {
    size_t size;
    int (*register_handler)(struct fi_pmof_eq_ops *ops, uint64_t event_type,
                            fi_eq_event_handler_t handler, void *context);
    int (*commit_ack)(struct fi_pmof_eq_ops *ops, const struct fi_eq_commit_entry *entry,
                      int status);
};

/* What the domain's transport guarantees (fi_pmof_query()). */
struct fi_pmof_attr {
    size_t size;           /* set by the caller: sizeof(struct fi_pmof_attr) */
    uint64_t commit_flags; /* FI_COMMIT, FI_IMMED, FI_FENCE that FI_COMMIT takes */
    uint64_t mr_flags;     /* FI_PMEM, FI_UNCACHED that fi_mr_reg takes */
    size_t atomicity_unit; /* bytes a remote write places single-copy atomically */
    int native;            /* 1: commits travel as one operation (sroce) */
};

struct fi_pmof_domain_ops {
    size_t size;
    int (*query)(struct fi_pmof_domain_ops *ops, struct fi_pmof_attr *attr);
};

/*
 * Makes `count` ranges of earlier writes to `dest_addr` durable: one
 * completion, with `context`, on the endpoint's transmit CQ once every range
 * is durable.  Each range is (key, addr, len) of a region the peer
 * registered; ranges of FI_PMEM regions become persistent, others globally
 * visible.
 */
static inline ssize_t fi_commit(struct fid_ep *ep, const struct fi_rma_iov *iov, size_t count,
                                fi_addr_t dest_addr, uint64_t flags, void *context) {
    struct fi_pmof_ep_ops *ops;
    int ret = fi_open_ops(&ep->fid, FI_PMOF_EP_OPS_1, 0, (void **)&ops, NULL);

    if (ret) return ret;
    return ops->commit(ops, iov, count, dest_addr, flags, context);
}

/*
 * Calls `handler` for each event of `event_type` instead of queueing it
 * (today: FI_COMMIT_EVENT).  For a commit, the handler's return value is the
 * acknowledgement: 0 completes the initiator's fi_commit, a negative
 * libfabric error completes it in error.  NULL removes the handler.
 */
static inline ssize_t fi_eq_register_handler(struct fid_eq *eq, uint64_t event_type,
                                             fi_eq_event_handler_t handler, void *context) {
    struct fi_pmof_eq_ops *ops;
    int ret = fi_open_ops(&eq->fid, FI_PMOF_EQ_OPS_1, 0, (void **)&ops, NULL);

    if (ret) return ret;
    return ops->register_handler(ops, event_type, handler, context);
}

/*
 * Acknowledges a commit read with fi_eq_read() as FI_COMMIT_EVENT, once the
 * application has made its ranges durable: status 0 completes the
 * initiator's fi_commit, a negative libfabric error completes it in error.
 * `entry` is the event as read; its iov is released.
 */
static inline int fi_eq_commit_ack(struct fid_eq *eq, const struct fi_eq_commit_entry *entry,
                                   int status) {
    struct fi_pmof_eq_ops *ops;
    int ret = fi_open_ops(&eq->fid, FI_PMOF_EQ_OPS_1, 0, (void **)&ops, NULL);

    if (ret) return ret;
    return ops->commit_ack(ops, entry, status);
}

/* The domain's persistence guarantees, the atomicity unit among them. */
static inline int fi_pmof_query(struct fid_domain *domain, struct fi_pmof_attr *attr) {
    struct fi_pmof_domain_ops *ops;
    int ret = fi_open_ops(&domain->fid, FI_PMOF_DOMAIN_OPS_1, 0, (void **)&ops, NULL);

    if (ret) return ret;
    return ops->query(ops, attr);
}

#ifdef __cplusplus
}
#endif

#endif /* FI_EXT_PMOF_H */
