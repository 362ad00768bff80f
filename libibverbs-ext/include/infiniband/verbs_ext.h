/* SPDX-License-Identifier: MIT */
/*
 * PMoF extensions to libibverbs: remote persistence verbs.
 *
 * Part 1 - upstream names.  rdma-core 45 added IBTA FLUSH and completed
 * ATOMIC WRITE; Debian's rdma-core 44 lacks FLUSH.  This header supplies
 * exactly the upstream names and values when <infiniband/verbs.h> does not,
 * so code written for rdma-core >= 45 builds unchanged against either.
 * PMOF_VERBS_HAVE_UPSTREAM_FLUSH tells which case applies; it is decided when
 * the project is configured against the system's headers.
 */
#ifndef INFINIBAND_VERBS_EXT_H
#define INFINIBAND_VERBS_EXT_H

#include <infiniband/verbs.h>
#include <infiniband/verbs_ext_config.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
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

/* ibv_device_attr_ex.device_cap_flags_ex */
#define IB_UVERBS_DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define IB_UVERBS_DEVICE_FLUSH_PERSISTENT (1ULL << 39)
#define IB_UVERBS_DEVICE_ATOMIC_WRITE (1ULL << 40)

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
 * rdma-core >= 45 appends wr_flush to struct ibv_qp_ex right after
 * wr_atomic_write; providers of this project lay their QPs out that way, so
 * the member is reached at the same offset here.
 */
struct ibv_qp_ex_flush {
	struct ibv_qp_ex qpx;
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
};

static inline void ibv_wr_flush(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
				size_t len, uint8_t type, uint8_t level)
{
	((struct ibv_qp_ex_flush *)qp)->wr_flush(qp, rkey, remote_addr, len, type, level);
}

#endif /* !PMOF_VERBS_HAVE_UPSTREAM_FLUSH */

#ifdef __cplusplus
}
#endif

#endif /* INFINIBAND_VERBS_EXT_H */
