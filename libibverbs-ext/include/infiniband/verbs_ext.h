/* SPDX-License-Identifier: MIT */
/*
 * PMoF extensions to libibverbs: remote persistence verbs.
 *
 * Part 1 - upstream names.  rdma-core 44 added IBTA ATOMIC WRITE and
 * rdma-core 45 FLUSH, each with a member appended to struct ibv_qp_ex
 * (wr_atomic_write, then wr_flush).  This header supplies exactly the
 * upstream names and values that <infiniband/verbs.h> lacks, so code written
 * for rdma-core >= 45 builds unchanged against rdma-core 39 and later.
 * PMOF_VERBS_HAVE_ATOMIC_WRITE and PMOF_VERBS_HAVE_UPSTREAM_FLUSH tell which
 * case applies; they are decided when the project is configured against the
 * system's headers.
 */
#ifndef INFINIBAND_VERBS_EXT_H
#define INFINIBAND_VERBS_EXT_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext_config.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ibv_device_attr_ex.device_cap_flags_ex: these come with the kernel's uapi
 * headers (Linux >= 6.2), not with rdma-core, so they are checked apart. */
#if !PMOF_VERBS_HAVE_DEVICE_FLUSH_BITS
#define IB_UVERBS_DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define IB_UVERBS_DEVICE_FLUSH_PERSISTENT (1ULL << 39)
#define IB_UVERBS_DEVICE_ATOMIC_WRITE (1ULL << 40)
#endif

#if !PMOF_VERBS_HAVE_ATOMIC_WRITE
/* ibv_qp_init_attr_ex.send_ops_flags, enum ibv_wr_opcode and enum
 * ibv_wc_opcode values of ATOMIC WRITE. */
#define IBV_QP_EX_WITH_ATOMIC_WRITE (1 << 12)
#define IBV_WR_ATOMIC_WRITE ((enum ibv_wr_opcode)15)
#define IBV_WC_ATOMIC_WRITE ((enum ibv_wc_opcode)9)
#endif

#if !PMOF_VERBS_HAVE_UPSTREAM_FLUSH

/* Memory region and QP access flags (ibv_reg_mr, ibv_modify_qp). */
#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8)
#define IBV_ACCESS_FLUSH_PERSISTENT (1 << 9)

/* ibv_qp_init_attr_ex.send_ops_flags */
#define IBV_QP_EX_WITH_FLUSH (1 << 11)

/* enum ibv_wr_opcode and enum ibv_wc_opcode values. */
#define IBV_WR_FLUSH ((enum ibv_wr_opcode)14)
#define IBV_WC_FLUSH ((enum ibv_wc_opcode)8)

/* Placement type of a FLUSH (may be combined). */
enum ibv_placement_type {
    IBV_FLUSH_GLOBAL = 1U << 0,
    IBV_FLUSH_PERSISTENT = 1U << 1,
};

/* Selectivity level of a FLUSH. */
enum ibv_selectivity_level {
    IBV_FLUSH_RANGE = 0,
    IBV_FLUSH_MR,
};

/*
 * rdma-core 45's struct ibv_qp_ex over the system's shorter one: the members
 * it appends, at the offsets they have there.  Providers of this project lay
 * their QPs out that way, so programs built against either header reach the
 * same entry points.
 */
struct ibv_qp_ex_flush {
    struct ibv_qp_ex qpx;
#if !PMOF_VERBS_HAVE_ATOMIC_WRITE
    void (*wr_atomic_write)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                            const void *atomic_wr);
#endif
    void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                     uint8_t type, uint8_t level);
};

static inline void ibv_wr_flush(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                                size_t len, uint8_t type, uint8_t level) {
    ((struct ibv_qp_ex_flush *)qp)->wr_flush(qp, rkey, remote_addr, len, type, level);
}

#if !PMOF_VERBS_HAVE_ATOMIC_WRITE
static inline void ibv_wr_atomic_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                                       const void *atomic_wr) {
    ((struct ibv_qp_ex_flush *)qp)->wr_atomic_write(qp, rkey, remote_addr, atomic_wr);
}
#endif

#endif /* !PMOF_VERBS_HAVE_UPSTREAM_FLUSH */

/*
 * Part 2 - write-commit: a remote write made durable at the target with one
 * verb.  Completion (IBV_WC_RDMA_WRITE_COMMIT) means this write's data and
 * every earlier write on the QP to the same rkey are durable at the target:
 * persistent (the default; the target MR must be registered with
 * IBV_ACCESS_FLUSH_PERSISTENT) or, with IBV_WRITE_COMMIT_GLOBAL, globally
 * visible (the target MR needs IBV_ACCESS_FLUSH_GLOBAL).  The target QP needs
 * the matching IBV_ACCESS_FLUSH_* access flag.
 *
 * A peer that declared IBV_COMMIT_CAP_NATIVE (ibv_qp_set_commit_peer) gets
 * the native opcodes; any other peer gets the same semantics as IBTA
 * sequences: WRITE + FLUSH(MR); ordered: FLUSH(MR) + WRITE + FLUSH(MR); with
 * immediate data a final zero-length WRITE WITH IMMEDIATE.
 *
 * Kernel devices whose sysfs directory has commit_caps (Linux rxe with
 * rxe-patches/) get these functions too in a program that uses libsroce.so,
 * with native peers only: to any other peer ibv_wr_complete() returns
 * EOPNOTSUPP and posts nothing of the batch.
 */

/* ibv_qp_init_attr_ex.send_ops_flags */
#define IBV_QP_EX_WITH_RDMA_WRITE_COMMIT (1ULL << 32)

/* Completion opcode of a write-commit at the initiator. */
#define IBV_WC_RDMA_WRITE_COMMIT ((enum ibv_wc_opcode)64)

enum ibv_write_commit_flags {
    /* The target makes every earlier write to the rkey durable before it
     * places this one (log records, then the commit record). */
    IBV_WRITE_COMMIT_ORDERED = 1 << 0,
    /* Global visibility is the durability asked for (volatile target MR). */
    IBV_WRITE_COMMIT_GLOBAL = 1 << 1,
};

enum ibv_commit_cap_flags {
    IBV_COMMIT_CAP_NATIVE = 1 << 0,  /* native write-commit opcodes */
    IBV_COMMIT_CAP_ORDERED = 1 << 1, /* IBV_WRITE_COMMIT_ORDERED */
    IBV_COMMIT_CAP_IMMED = 1 << 2,   /* ibv_wr_rdma_write_commit_imm */
    IBV_COMMIT_CAP_FLUSH = 1 << 3,   /* IBTA FLUSH and ATOMIC WRITE */
    /* Write-commits reach any peer: those without IBV_COMMIT_CAP_NATIVE as
     * IBTA sequences (a local property, never offered in ECE). */
    IBV_COMMIT_CAP_ANY_PEER = 1 << 4,
    /* The transport resends only the packets a loss took, holding those
     * received past a gap, when both peers have it (sroce). */
    IBV_COMMIT_CAP_SELECTIVE_REPEAT = 1 << 5,
};

enum ibv_commit_method {
    IBV_COMMIT_METHOD_CACHE_FLUSH = 1 << 0, /* persistent memory: cache-line write-back */
    IBV_COMMIT_METHOD_MSYNC = 1 << 1,       /* file mappings: msync */
    IBV_COMMIT_METHOD_FENCE = 1 << 2,       /* volatile memory: global visibility */
    IBV_COMMIT_METHOD_NONTEMPORAL = 1 << 3, /* IBV_ACCESS_UNCACHED placement */
};

/*
 * Placement hint for ibv_reg_mr(): remote writes into this region are placed
 * with non-temporal stores, bypassing the target's caches, so persisting them
 * later costs no cache-line write-back.  An optional access flag: providers
 * that do not know it ignore it, as rdma-core specifies for optional flags.
 */
#define IBV_ACCESS_UNCACHED (IBV_ACCESS_OPTIONAL_FIRST << 9)

struct ibv_commit_caps {
    uint32_t comp_mask;           /* must be 0 */
    uint32_t flags;               /* enum ibv_commit_cap_flags */
    uint32_t atomicity_unit;      /* bytes written single-copy atomically (8) */
    uint32_t persistence_methods; /* enum ibv_commit_method */
};

/* What the device can do; EOPNOTSUPP for devices without write-commit. */
int ibv_query_commit_caps(struct ibv_context *context, struct ibv_commit_caps *caps);

/* Declares the connected peer's capabilities (its ibv_query_commit_caps()
 * flags, exchanged by the application with the QP number); until a peer
 * declares IBV_COMMIT_CAP_NATIVE only IBTA opcodes are sent to it. */
int ibv_qp_set_commit_peer(struct ibv_qp *qp, uint32_t peer_commit_caps);

/*
 * Peers connected through rdma_cm need no ibv_qp_set_commit_peer(): they
 * agree on native commits in the connection's ECE exchange (ibv_query_ece,
 * ibv_set_ece, which librdmacm calls).  A reliable QP offers vendor ID
 * IBV_COMMIT_ECE_VENDOR_ID and options IBV_COMMIT_ECE_TAG | its
 * enum ibv_commit_cap_flags; after ibv_set_ece() with the peer's offer,
 * ibv_query_ece() returns what both share (options 0: nothing, IBTA
 * sequences only).
 */
#define IBV_COMMIT_ECE_VENDOR_ID 0xFFFFFFu
#define IBV_COMMIT_ECE_TAG 0x5C000000u
#define IBV_COMMIT_ECE_TAG_MASK 0xFF000000u
#define IBV_COMMIT_ECE_CAPS_MASK 0x0000002Fu

/* Whether ECE options (from ibv_query_ece() once the connection is set up)
 * select native write-commit opcodes. */
static inline int ibv_commit_ece_native(const struct ibv_ece *ece) {
    return ece->vendor_id == IBV_COMMIT_ECE_VENDOR_ID &&
           (ece->options & IBV_COMMIT_ECE_TAG_MASK) == IBV_COMMIT_ECE_TAG &&
           (ece->options & IBV_COMMIT_CAP_NATIVE);
}

/* The write-commit work requests of a QP's provider (NULL and errno
 * EOPNOTSUPP when it has none). */
struct ibv_qp_commit_ops {
    void (*wr_rdma_write_commit)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                                 uint32_t flags);
    void (*wr_rdma_write_commit_imm)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                                     uint32_t flags, __be32 imm_data);
};
const struct ibv_qp_commit_ops *ibv_qp_to_commit_ops(struct ibv_qp_ex *qp);

/* Between ibv_wr_start() and ibv_wr_complete(), followed by
 * ibv_wr_set_sge*() or ibv_wr_set_inline_data*().  Returns EOPNOTSUPP (and
 * posts nothing) when the QP's provider lacks write-commit. */
static inline int ibv_wr_rdma_write_commit(struct ibv_qp_ex *qp, uint32_t rkey,
                                           uint64_t remote_addr, uint32_t flags) {
    const struct ibv_qp_commit_ops *ops = ibv_qp_to_commit_ops(qp);

    if (!ops) return EOPNOTSUPP;
    ops->wr_rdma_write_commit(qp, rkey, remote_addr, flags);
    return 0;
}

/* Write-commit whose target also gets a receive completion carrying
 * imm_data once the data is durable. */
static inline int ibv_wr_rdma_write_commit_imm(struct ibv_qp_ex *qp, uint32_t rkey,
                                               uint64_t remote_addr, uint32_t flags,
                                               __be32 imm_data) {
    const struct ibv_qp_commit_ops *ops = ibv_qp_to_commit_ops(qp);

    if (!ops) return EOPNOTSUPP;
    ops->wr_rdma_write_commit_imm(qp, rkey, remote_addr, flags, imm_data);
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* INFINIBAND_VERBS_EXT_H */
