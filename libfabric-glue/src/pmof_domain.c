/* SPDX-License-Identifier: MIT */
/*
 * The domain (one RDMA device and its protection domain) and memory
 * registration.
 *
 * A key is the verbs rkey with the region's durability class above it
 * (PMOF_KEY_PMEM): the initiator of a commit asks for persistence or global
 * visibility from the key alone, as Intel's libfabric persistent-memory
 * proposal (version 0.63) wants keys to carry the region's attributes.
 */
#include "pmof.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------- MR */

/*
 * The regions of host memory a peer can name, by key, so that a manual
 * commit's ranges are checked against what the application registered: a
 * region leaves the table before it is deregistered, so a commit that
 * arrives after fi_close finds nothing.
 */
static struct pmof_mr **mr_bucket(struct pmof_domain *dom, uint64_t key) {
    return &dom->mr_table[((uint32_t)key * 0x9e3779b1u) >> 26];
}

_Static_assert(PMOF_MR_BUCKETS == 1 << (32 - 26), "mr_bucket takes the top 6 bits");

static void mr_table_add(struct pmof_mr *mr) {
    struct pmof_domain *dom = mr->dom;
    struct pmof_mr **b;

    pthread_mutex_lock(&dom->mr_lock);
    b = mr_bucket(dom, mr->mr_fid.key);
    mr->table_next = *b;
    *b = mr;
    mr->in_table = true;
    pthread_mutex_unlock(&dom->mr_lock);
}

static void mr_table_del(struct pmof_mr *mr) {
    struct pmof_domain *dom = mr->dom;

    pthread_mutex_lock(&dom->mr_lock);
    for (struct pmof_mr **pp = mr_bucket(dom, mr->mr_fid.key); *pp; pp = &(*pp)->table_next) {
        if (*pp != mr) continue;
        *pp = mr->table_next;
        break;
    }
    mr->in_table = false;
    pthread_mutex_unlock(&dom->mr_lock);
}

int pmof_mr_check_range(struct pmof_domain *dom, uint64_t addr, uint64_t len, uint64_t key,
                        uint64_t *flags) {
    int ret = -FI_EACCES;

    pthread_mutex_lock(&dom->mr_lock);
    for (struct pmof_mr *mr = *mr_bucket(dom, key); mr; mr = mr->table_next) {
        /* The whole key: one whose class bits differ names no region. */
        if (mr->mr_fid.key != key) continue;
        uint64_t base = (uintptr_t)mr->ibv->addr, size = mr->ibv->length;
        if ((mr->access & IBV_ACCESS_REMOTE_WRITE) && addr >= base && len <= size &&
            addr - base <= size - len) {
            *flags |= mr->flags & FI_PMEM;
            ret = 0;
        }
        break;
    }
    pthread_mutex_unlock(&dom->mr_lock);
    return ret;
}

static int mr_close(struct fid *fid) {
    struct pmof_mr *mr = container_of(fid, struct pmof_mr, mr_fid.fid);
    bool listed = mr->in_table;
    int ret;

    if (listed) mr_table_del(mr);
    ret = mr->ibv ? ibv_dereg_mr(mr->ibv) : 0;
    if (ret) {
        if (listed) mr_table_add(mr);
        return pmof_errno(ret);
    }
    free(mr->bounce);
    atomic_fetch_sub(&mr->dom->refs, 1);
    free(mr);
    return 0;
}

static struct fi_ops mr_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = mr_close,
    .bind = pmof_fid_bind_enosys,
    .control = pmof_fid_control_enosys,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

/* libfabric access bits to verbs', plus the FLUSH access a commit target
 * needs: a persistent region takes both placements (FI_DELIVERY_COMPLETE
 * asks a persistent region for visibility only), a volatile one global
 * visibility only. */
static int mr_access(const struct pmof_domain *dom, uint64_t access, uint64_t flags) {
    int a = 0;

    if (!(access & (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)))
        access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    if (access & (FI_RECV | FI_READ)) a |= IBV_ACCESS_LOCAL_WRITE;
    /* A send buffer is read by the receiver of a large tagged message
     * (rendezvous), as libfabric's verbs provider allows it for ofi_rxm. */
    if (access & (FI_REMOTE_READ | FI_SEND)) a |= IBV_ACCESS_REMOTE_READ;
    if (access & FI_REMOTE_WRITE)
        a |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    /* A device without remote persistence knows no FLUSH access; its
     * FI_PMEM regions are made durable by their application
     * (FI_COMMIT_MANUAL). */
    if ((access & FI_REMOTE_WRITE) && dom->commit_path != PMOF_COMMIT_NONE) {
        a |= IBV_ACCESS_FLUSH_GLOBAL;
        if (flags & FI_PMEM) a |= IBV_ACCESS_FLUSH_PERSISTENT;
        /* Non-temporal placement is sroce's; other devices have none. */
        if ((flags & FI_UNCACHED) && dom->commit_path == PMOF_COMMIT_VERBS)
            a |= IBV_ACCESS_UNCACHED;
    }
    return a;
}

static int mr_register(struct pmof_domain *dom, const struct fi_mr_attr *attr, uint64_t flags,
                       struct fid_mr **out) {
    struct pmof_mr *mr;
    const struct iovec *iov = attr->mr_iov;
    int access;

    if (attr->iov_count != 1 || !iov) return -FI_EINVAL;
    if (flags & ~(FI_PMEM | FI_UNCACHED | FI_HMEM_DEVICE_ONLY)) return -FI_EBADFLAGS;
    if (attr->iface != FI_HMEM_SYSTEM) {
        /* Device memory the NIC cannot reach: pmof copies through host
         * memory with the application's override ops.  Peers cannot reach
         * it either: their writes would land in the copy. */
        if (!dom->hmem_override) return -FI_EOPNOTSUPP;
        if (attr->access & (FI_REMOTE_READ | FI_REMOTE_WRITE)) return -FI_EOPNOTSUPP;
        if (flags & (FI_PMEM | FI_UNCACHED)) return -FI_EINVAL;
    }
    mr = calloc(1, sizeof(*mr));
    if (!mr) return -FI_ENOMEM;
    mr->mr_fid.fid.fclass = FI_CLASS_MR;
    mr->mr_fid.fid.context = attr->context;
    mr->mr_fid.fid.ops = &mr_fi_ops;
    mr->dom = dom;
    mr->flags = flags & (FI_PMEM | FI_UNCACHED);
    mr->iface = attr->iface;
    mr->device = attr->device.reserved;
    access = mr_access(dom, attr->access, flags);
    if (attr->iface != FI_HMEM_SYSTEM && iov->iov_len) {
        mr->len = iov->iov_len;
        mr->dev_base = (uintptr_t)iov->iov_base;
        mr->bounce = aligned_alloc(4096, (iov->iov_len + 4095) & ~(size_t)4095);
        mr->ibv = mr->bounce ? ibv_reg_mr(dom->pd, mr->bounce, iov->iov_len, access) : NULL;
        if (!mr->ibv) {
            free(mr->bounce);
            free(mr);
            return -FI_ENOMEM;
        }
        mr->mr_fid.key = mr->ibv->rkey;
        mr->access = access;
    } else if (attr->iface == FI_HMEM_SYSTEM) {
        /* Zero-length regions are valid in libfabric; verbs may refuse
         * them, so they get no verbs MR (and key 0). */
        if (iov->iov_len) {
            mr->ibv = ibv_reg_mr(dom->pd, iov->iov_base, iov->iov_len, access);
            if (!mr->ibv && (access & IBV_ACCESS_UNCACHED) && errno == EINVAL) {
                access &= ~IBV_ACCESS_UNCACHED;
                mr->ibv = ibv_reg_mr(dom->pd, iov->iov_base, iov->iov_len, access);
            }
            /* An RNIC refuses persistent FLUSH access to memory that is
             * not persistent (Linux rxe: anything but a DAX device).  In a
             * FI_COMMIT_MANUAL domain the application persists, so the
             * region only loses what it never used. */
            if (!mr->ibv && (access & IBV_ACCESS_FLUSH_PERSISTENT) && errno == EINVAL &&
                (dom->info->mode & FI_COMMIT_MANUAL)) {
                access &= ~IBV_ACCESS_FLUSH_PERSISTENT;
                mr->ibv = ibv_reg_mr(dom->pd, iov->iov_base, iov->iov_len, access);
            }
            if (!mr->ibv) {
                int err = errno;
                if ((access & IBV_ACCESS_FLUSH_PERSISTENT) && err == EINVAL)
                    PMOF_WARN(FI_LOG_MR,
                              "%s cannot make %p (%zu bytes) persistent: not persistent memory "
                              "(FI_PMEM)\n",
                              ibv_get_device_name(dom->verbs->device), iov->iov_base, iov->iov_len);
                else
                    PMOF_WARN(FI_LOG_MR, "ibv_reg_mr(%p, %zu) failed: %s\n", iov->iov_base,
                              iov->iov_len, strerror(err));
                free(mr);
                return pmof_errno(err);
            }
            mr->mr_fid.key = mr->ibv->rkey;
            mr->access = access;
        }
    }
    if (mr->flags & FI_PMEM) mr->mr_fid.key |= PMOF_KEY_PMEM;
    if (mr->flags & FI_UNCACHED) mr->mr_fid.key |= PMOF_KEY_UNCACHED;
    mr->mr_fid.mem_desc = mr;
    /* Device memory is reached through its host copy, never by a peer. */
    if (mr->ibv && !mr->bounce) mr_table_add(mr);
    atomic_fetch_add(&dom->refs, 1);
    *out = &mr->mr_fid;
    return 0;
}

int pmof_hmem_stage(const struct iovec *iov, void **desc, size_t count, struct iovec *out,
                    bool outbound, struct pmof_hmem_io *in) {
    if (in) memset(in, 0, sizeof(*in));
    for (size_t i = 0; i < count; i++) {
        struct pmof_mr *mr = desc ? desc[i] : NULL;
        uintptr_t a = (uintptr_t)iov[i].iov_base;
        const struct fi_hmem_override_ops *h;

        out[i] = iov[i];
        if (!mr || !mr->bounce || !iov[i].iov_len) continue;
        if (a < mr->dev_base || a + iov[i].iov_len > mr->dev_base + mr->len) return -FI_EINVAL;
        out[i].iov_base = (uint8_t *)mr->bounce + (a - mr->dev_base);
        h = &mr->dom->hmem_ops;
        if (outbound) {
            ssize_t n = h->copy_from_hmem_iov(out[i].iov_base, iov[i].iov_len, mr->iface,
                                              mr->device, &iov[i], 1, 0);
            if (n < 0) return (int)n;
            if ((size_t)n != iov[i].iov_len) return -FI_EIO;
        } else {
            /* One device destination per operation: its copy is made at
             * completion, from the single length the NIC reports. */
            if (!in || in->mr || count > 1) return -FI_EOPNOTSUPP;
            in->mr = mr;
            in->dev = iov[i].iov_base;
            in->host = out[i].iov_base;
        }
    }
    return 0;
}

void pmof_hmem_complete(const struct pmof_hmem_io *in, size_t len) {
    struct iovec dev = {.iov_base = in->dev, .iov_len = len};

    if (!in->mr || !len) return;
    in->mr->dom->hmem_ops.copy_to_hmem_iov(in->mr->iface, in->mr->device, &dev, 1, 0, in->host,
                                           len);
}

int pmof_mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                    struct fid_mr **mr) {
    struct pmof_domain *dom = container_of(fid, struct pmof_domain, domain_fid.fid);

    if (!attr || !mr) return -FI_EINVAL;
    return mr_register(dom, attr, flags, mr);
}

int pmof_mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access,
                 uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr,
                 void *context) {
    struct fi_mr_attr attr = {
        .mr_iov = iov,
        .iov_count = count,
        .access = access,
        .offset = offset,
        .requested_key = requested_key,
        .context = context,
        .iface = FI_HMEM_SYSTEM,
    };

    return pmof_mr_regattr(fid, &attr, flags, mr);
}

int pmof_mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
                uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    return pmof_mr_regv(fid, &iov, 1, access, offset, requested_key, flags, mr, context);
}

static struct fi_ops_mr domain_mr_ops = {
    .size = sizeof(struct fi_ops_mr),
    .reg = pmof_mr_reg,
    .regv = pmof_mr_regv,
    .regattr = pmof_mr_regattr,
};

/* --------------------------------------------------------------- domain */

/* The word fetch-less atomics return the old value to (dropped). */
static int scratch_open(struct pmof_domain *dom) {
    dom->scratch = calloc(1, sizeof(*dom->scratch));
    if (!dom->scratch) return -FI_ENOMEM;
    dom->scratch->mr_fid.fid.fclass = FI_CLASS_MR;
    dom->scratch->dom = dom;
    dom->scratch->ibv =
        ibv_reg_mr(dom->pd, &dom->scratch_word, sizeof(dom->scratch_word), IBV_ACCESS_LOCAL_WRITE);
    return dom->scratch->ibv ? 0 : pmof_errno(errno);
}

static void scratch_close(struct pmof_domain *dom) {
    if (!dom->scratch) return;
    if (dom->scratch->ibv) ibv_dereg_mr(dom->scratch->ibv);
    free(dom->scratch);
    dom->scratch = NULL;
}

struct ibv_comp_channel *pmof_domain_channel(struct pmof_domain *dom) {
    struct ibv_comp_channel *ch;

    pthread_mutex_lock(&dom->chan_lock);
    if (!dom->channel) {
        /* Taken by whichever thread waits, never blocking it. */
        ch = ibv_create_comp_channel(dom->verbs);
        if (ch && fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK)) {
            int err = errno;
            ibv_destroy_comp_channel(ch);
            errno = err;
            ch = NULL;
        }
        dom->channel = ch;
    }
    ch = dom->channel;
    pthread_mutex_unlock(&dom->chan_lock);
    return ch;
}

static int domain_close(struct fid *fid) {
    struct pmof_domain *dom = container_of(fid, struct pmof_domain, domain_fid.fid);
    int ret;

    if (atomic_load(&dom->refs)) return -FI_EBUSY;
    pmof_manual_domain_close(dom);
    scratch_close(dom);
    ret = ibv_dealloc_pd(dom->pd);
    if (ret) return pmof_errno(ret);
    if (dom->channel) ibv_destroy_comp_channel(dom->channel);
    rdma_free_devices(dom->dev_list);
    fi_freeinfo(dom->info);
    pthread_mutex_destroy(&dom->mr_lock);
    pthread_mutex_destroy(&dom->chan_lock);
    atomic_fetch_sub(&dom->fab->refs, 1);
    free(dom);
    return 0;
}

static int domain_query(struct fi_pmof_domain_ops *ops, struct fi_pmof_attr *attr) {
    struct pmof_domain *dom = container_of(ops, struct pmof_domain, pmof_ops);
    struct fi_pmof_attr a = {.size = sizeof(a)};

    if (!attr || attr->size < offsetof(struct fi_pmof_attr, native) + sizeof(int))
        return -FI_EINVAL;
    if (dom->commit_path == PMOF_COMMIT_FLUSH_TARGET) {
        a.mr_flags = FI_PMEM;
        a.atomicity_unit = dom->commit_caps.atomicity_unit;
    } else if (dom->commit_path != PMOF_COMMIT_NONE) {
        a.commit_flags = FI_COMMIT | FI_FENCE | FI_IMMED;
        a.mr_flags = dom->commit_path == PMOF_COMMIT_VERBS ? FI_PMEM | FI_UNCACHED : FI_PMEM;
        a.atomicity_unit = dom->commit_caps.atomicity_unit;
        a.native = (dom->commit_caps.flags & IBV_COMMIT_CAP_NATIVE) != 0;
    }
    memcpy(attr, &a, sizeof(a));
    return 0;
}

static int domain_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                           void *context) {
    struct pmof_domain *dom = container_of(fid, struct pmof_domain, domain_fid.fid);

    (void)context;
    if (flags) return -FI_EBADFLAGS;
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, FI_PMOF_DOMAIN_OPS_1) == 0) {
        *ops = &dom->pmof_ops;
        return 0;
    }
    return -FI_ENOSYS;
}

/* The application's device-memory copy routines, set through libfabric's
 * FI_SET_OPS_HMEM_OVERRIDE (the OFIWG proposal "API for Libfabric Overrides",
 * May 2020, as libfabric adopted it). */
static int domain_ops_set(struct fid *fid, const char *name, uint64_t flags, void *ops,
                          void *context) {
    struct pmof_domain *dom = container_of(fid, struct pmof_domain, domain_fid.fid);
    const struct fi_hmem_override_ops *h = ops;

    (void)context;
    if (!name || strcmp(name, FI_SET_OPS_HMEM_OVERRIDE)) return -FI_ENOSYS;
    if (flags) return -FI_EBADFLAGS;
    if (!h || h->size < sizeof(*h) || !h->copy_from_hmem_iov || !h->copy_to_hmem_iov)
        return -FI_EINVAL;
    dom->hmem_ops = *h;
    dom->hmem_override = true;
    return 0;
}

static int domain_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
    (void)fid, (void)bfid, (void)flags;
    /* FI_MR_COMPLETE events are not needed: registration is synchronous. */
    return -FI_ENOSYS;
}

static struct fi_ops domain_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = domain_close,
    .bind = domain_bind,
    .control = pmof_fid_control_enosys,
    .ops_open = domain_ops_open,
    .ops_set = domain_ops_set,
};

static int domain_scalable_ep(struct fid_domain *domain, struct fi_info *info, struct fid_ep **sep,
                              void *context) {
    (void)domain, (void)info, (void)sep, (void)context;
    return -FI_ENOSYS;
}

static int domain_poll_open(struct fid_domain *domain, struct fi_poll_attr *attr,
                            struct fid_poll **pollset) {
    (void)domain, (void)attr, (void)pollset;
    return -FI_ENOSYS;
}

static int domain_stx_ctx(struct fid_domain *domain, struct fi_tx_attr *attr, struct fid_stx **stx,
                          void *context) {
    (void)domain, (void)attr, (void)stx, (void)context;
    return -FI_ENOSYS;
}

static int domain_srx_ctx(struct fid_domain *domain, struct fi_rx_attr *attr, struct fid_ep **rx_ep,
                          void *context) {
    (void)domain, (void)attr, (void)rx_ep, (void)context;
    return -FI_ENOSYS;
}

static int domain_query_atomic(struct fid_domain *domain, enum fi_datatype datatype, enum fi_op op,
                               struct fi_atomic_attr *attr, uint64_t flags) {
    struct pmof_domain *dom = container_of(domain, struct pmof_domain, domain_fid);
    int family = (flags & FI_COMPARE_ATOMIC) ? PMOF_ATOMIC_COMPARE
                 : (flags & FI_FETCH_ATOMIC) ? PMOF_ATOMIC_FETCH
                                             : PMOF_ATOMIC_WRITE;
    size_t count;
    int ret;

    if (flags & ~(FI_COMPARE_ATOMIC | FI_FETCH_ATOMIC | FI_TAGGED)) return -FI_EBADFLAGS;
    if (!attr) return -FI_EINVAL;
    if (!dom->scratch) return -FI_EOPNOTSUPP;
    ret = pmof_atomic_valid(dom, family, datatype, op, &count);
    if (ret) return ret;
    attr->count = count;
    attr->size = sizeof(uint64_t);
    return 0;
}

static int domain_query_collective(struct fid_domain *domain, enum fi_collective_op coll,
                                   struct fi_collective_attr *attr, uint64_t flags) {
    (void)domain, (void)coll, (void)attr, (void)flags;
    return -FI_ENOSYS;
}

static int domain_endpoint2(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep,
                            uint64_t flags, void *context) {
    if (flags) return -FI_EBADFLAGS;
    return pmof_endpoint(domain, info, ep, context);
}

static struct fi_ops_domain domain_ops = {
    .size = sizeof(struct fi_ops_domain),
    .av_open = pmof_av_open,
    .cq_open = pmof_cq_open,
    .endpoint = pmof_endpoint,
    .scalable_ep = domain_scalable_ep,
    .cntr_open = pmof_cntr_open,
    .poll_open = domain_poll_open,
    .stx_ctx = domain_stx_ctx,
    .srx_ctx = domain_srx_ctx,
    .query_atomic = domain_query_atomic,
    .query_collective = domain_query_collective,
    .endpoint2 = domain_endpoint2,
};

int pmof_domain_open(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain,
                     void *context) {
    struct pmof_fabric *fab = container_of(fabric, struct pmof_fabric, fabric_fid);
    struct pmof_domain *dom;
    int n = 0;

    if (!info || !info->domain_attr || !info->domain_attr->name) return -FI_EINVAL;
    dom = calloc(1, sizeof(*dom));
    if (!dom) return -FI_ENOMEM;
    dom->info = fi_dupinfo(info);
    if (!dom->info) goto nomem;
    dom->dev_list = rdma_get_devices(&n);
    for (int i = 0; dom->dev_list && i < n; i++) {
        if (strcmp(ibv_get_device_name(dom->dev_list[i]->device), info->domain_attr->name) == 0)
            dom->verbs = dom->dev_list[i];
    }
    if (!dom->verbs) {
        PMOF_WARN(FI_LOG_DOMAIN, "no RDMA device %s\n", info->domain_attr->name);
        goto nodev;
    }
    if (ibv_query_device_ex(dom->verbs, NULL, &dom->dev_attr)) goto nodev;
    dom->pd = ibv_alloc_pd(dom->verbs);
    if (!dom->pd) goto nodev;
    dom->commit_path = pmof_device_commit_path(dom->verbs, &dom->commit_caps);
    bool sroce = pmof_device_is_sroce(dom->verbs);
    dom->tx_iov_limit = pmof_device_tx_iov_limit(&dom->dev_attr, sroce);
    /* sroce has ATOMIC WRITE; another device only under a libibverbs that
     * can post it. */
    dom->atomic_write =
        sroce || (PMOF_VERBS_HAVE_ATOMIC_WRITE &&
                  (dom->dev_attr.device_cap_flags_ex & IB_UVERBS_DEVICE_ATOMIC_WRITE));
    if (dom->dev_attr.orig_attr.atomic_cap != IBV_ATOMIC_NONE && scratch_open(dom)) goto nodev;
    pthread_mutex_init(&dom->manual_lock, NULL);
    pthread_mutex_init(&dom->mr_lock, NULL);
    pthread_mutex_init(&dom->chan_lock, NULL);
    dom->thread_safe = info->domain_attr->threading == FI_THREAD_SAFE ||
                       info->domain_attr->threading == FI_THREAD_UNSPEC;
    dom->fab = fab;
    dom->domain_fid.fid.fclass = FI_CLASS_DOMAIN;
    dom->domain_fid.fid.context = context;
    dom->domain_fid.fid.ops = &domain_fi_ops;
    dom->domain_fid.ops = &domain_ops;
    dom->domain_fid.mr = &domain_mr_ops;
    dom->pmof_ops.size = sizeof(dom->pmof_ops);
    dom->pmof_ops.query = domain_query;
    atomic_fetch_add(&fab->refs, 1);
    *domain = &dom->domain_fid;
    return 0;
nodev:
    scratch_close(dom);
    if (dom->pd) ibv_dealloc_pd(dom->pd);
    if (dom->dev_list) rdma_free_devices(dom->dev_list);
    fi_freeinfo(dom->info);
    free(dom);
    return -FI_ENODEV;
nomem:
    free(dom);
    return -FI_ENOMEM;
}
