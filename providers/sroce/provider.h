/* SPDX-License-Identifier: MIT */
/*
 * The entry points that the libibverbs shim calls for objects owned by sroce.
 *
 * libibverbs dispatches most exported verbs through a private per-context
 * table that only its own providers can fill, so the shim intercepts each
 * exported function and routes calls on sroce objects here.  Every function
 * has the signature and error convention of the libibverbs function of the
 * same name without the sroce_ prefix (NULL + errno, or a positive errno).
 */
#ifndef SROCE_PROVIDER_H
#define SROCE_PROVIDER_H

#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices from the sroce configuration; the array and devices live for the
 * whole process.  Returns the count, sets *devs (never NULL). */
int sroce_device_list(struct ibv_device ***devs);
int sroce_owns_device(const struct ibv_device *dev);
static inline int sroce_owns_context(const struct ibv_context *ctx) {
    return ctx && sroce_owns_device(ctx->device);
}

__be64 sroce_get_device_guid(struct ibv_device *dev);
int sroce_get_device_index(struct ibv_device *dev);
/* Serves ibv_read_sysfs_file() for paths below a sroce device's ibdev_path;
 * returns -2 when the path is not a sroce one (caller forwards). */
int sroce_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

struct ibv_context *sroce_open_device(struct ibv_device *dev);
/* Whether fd refers to the command FD of an open sroce context (a dup of
 * it, or one received from another process). */
int sroce_is_cmd_fd(int fd);
int sroce_close_device(struct ibv_context *ctx);
int sroce_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr);
int sroce_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
int sroce_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
int sroce_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index,
                         enum ibv_gid_type *type);
int sroce_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                       struct ibv_gid_entry *entry, uint32_t flags);
ssize_t sroce_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                              size_t max_entries, uint32_t flags);
int sroce_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey);
int sroce_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey);

int sroce_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event);
void sroce_ack_async_event(struct ibv_async_event *event);

struct ibv_pd *sroce_alloc_pd(struct ibv_context *ctx);
/* Object import (import.cpp); a sroce context's command FD is one of ours
 * when sroce_is_cmd_fd() says so. */
struct ibv_context *sroce_import_device(int cmd_fd);
struct ibv_pd *sroce_import_pd(struct ibv_context *ctx, uint32_t pd_handle);
void sroce_unimport_pd(struct ibv_pd *pd);
struct ibv_mr *sroce_import_mr(struct ibv_pd *pd, uint32_t mr_handle);
void sroce_unimport_mr(struct ibv_mr *mr);
int sroce_dealloc_pd(struct ibv_pd *pd);

struct ibv_mr *sroce_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                            unsigned int access);
int sroce_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                   int access);
int sroce_dereg_mr(struct ibv_mr *mr);

struct ibv_comp_channel *sroce_create_comp_channel(struct ibv_context *ctx);
int sroce_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *sroce_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                               struct ibv_comp_channel *channel, int comp_vector);
int sroce_resize_cq(struct ibv_cq *cq, int cqe);
int sroce_destroy_cq(struct ibv_cq *cq);
int sroce_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
void sroce_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);

struct ibv_srq *sroce_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int sroce_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask);
int sroce_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
int sroce_destroy_srq(struct ibv_srq *srq);

struct ibv_qp *sroce_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int sroce_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                   struct ibv_qp_init_attr *init_attr);
int sroce_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
int sroce_destroy_qp(struct ibv_qp *qp);
struct ibv_qp_ex *sroce_qp_to_qp_ex(struct ibv_qp *qp);

int sroce_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
int sroce_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);

struct ibv_ah *sroce_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int sroce_destroy_ah(struct ibv_ah *ah);

/* Write-commit (see <infiniband/verbs_ext.h>). */
int sroce_query_commit_caps(struct ibv_context *ctx, struct ibv_commit_caps *caps);
int sroce_qp_set_commit_peer(struct ibv_qp *qp, uint32_t peer_commit_caps);
const struct ibv_qp_commit_ops *sroce_qp_to_commit_ops(struct ibv_qp_ex *qp);
/* ECE: how connection managers agree on native commits (docs/connection-manager.md). */
int sroce_query_ece(struct ibv_qp *qp, struct ibv_ece *ece);
int sroce_set_ece(struct ibv_qp *qp, struct ibv_ece *ece);
/* What a QP offering `offer` and a peer answering `peer_options` agree on:
 * the common flags under the tag, or 0 (IBTA sequences only).  Shared with
 * the kernel devices libsroce.so serves. */
static inline uint32_t sroce_ece_agree(uint32_t offer, uint32_t peer_options) {
    uint32_t agreed = 0;
    if ((peer_options & IBV_COMMIT_ECE_TAG_MASK) == IBV_COMMIT_ECE_TAG)
        agreed = peer_options & offer;
    return (agreed & IBV_COMMIT_ECE_CAPS_MASK) ? agreed : 0;
}

/* Test persistence domain: every range the engine makes durable (FLUSH,
 * commits) is also reported to `hook` before the operation is acknowledged,
 * so a harness can keep an image of what would survive power loss.  Set it
 * before traffic starts; NULL removes it.  Exported as SROCE_PRIVATE_1. */
void sroce_set_persist_hook(void (*hook)(void *ctx, const void *addr, size_t len), void *ctx);

#ifdef __cplusplus
}
#endif

#endif
