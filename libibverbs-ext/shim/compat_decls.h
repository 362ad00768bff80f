/* SPDX-License-Identifier: MIT */
/*
 * Prototypes of libibverbs exports that the installed development headers do
 * not declare (they live in rdma-core's private driver and marshalling
 * headers).  The shim has to define them with the same ABI so that binaries
 * and rdma-core libraries importing them keep resolving.
 */
#ifndef SROCE_SHIM_COMPAT_DECLS_H
#define SROCE_SHIM_COMPAT_DECLS_H

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GID types as reported by the private ibv_query_gid_type(): RoCE v1 and IB
 * GIDs share one value, unlike enum ibv_gid_type of verbs.h. */
enum ibv_gid_type_sysfs {
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0,
    IBV_GID_TYPE_SYSFS_ROCE_V2 = 1,
};

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs *type);

const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);

void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

/* Pre-rdma-core driver registration; libibverbs keeps only a non-default
 * IBVERBS_1.1 no-op stub for old binaries. */
typedef struct ibv_device *(*sroce_shim_driver_init_fn)(const char *uverbs_sys_path,
                                                        int abi_version);

#ifdef __cplusplus
}
#endif

#endif
