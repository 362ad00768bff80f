/* SPDX-License-Identifier: MIT */
/*
 * fi_getinfo: one fi_info per RDMA device and endpoint type, matched
 * against the application's hints the way libfabric's utility code does
 * for its built-in providers (which an external provider cannot link).
 *
 * Devices are discovered at the first call: their attributes, their IP
 * addresses (the RoCE GIDs) and how they make remote writes durable.  A
 * device that cannot does not advertise FI_RMA_PMEM, except through
 * FI_COMMIT_MANUAL, where the target application persists; one that can
 * only as a target (its libibverbs cannot post a FLUSH) advertises it to
 * applications that ask for no FI_WRITE.
 */
#include "pmof.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Undocumented flag libfabric's utility providers (ofi_rxm) pass when they
 * look for a core provider to layer over; unchanged from 1.6 to 2.x. */
#define PMOF_OFI_CORE_PROV_ONLY (1ULL << 59)

#define PMOF_PRIMARY_CAPS                                                                          \
    (FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_SEND |   \
     FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_LOCAL_COMM | FI_REMOTE_COMM | FI_HMEM)
#define PMOF_SECONDARY_CAPS (FI_FENCE | FI_RMA_PMEM | FI_SOURCE)
/* What each side of an endpoint may carry (fi_getinfo(3)): the domain-wide
 * FI_LOCAL_COMM and FI_REMOTE_COMM belong to neither. */
#define PMOF_TX_CAPS                                                                               \
    (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_HMEM | FI_SEND | FI_READ | FI_WRITE | FI_FENCE | \
     FI_RMA_PMEM)
#define PMOF_RX_CAPS                                                                               \
    (FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_RMA | FI_ATOMIC | FI_HMEM | FI_RECV |              \
     FI_REMOTE_READ | FI_REMOTE_WRITE | FI_RMA_PMEM | FI_SOURCE)
#define PMOF_TX_OP_FLAGS                                                                           \
    (FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE |                \
     FI_COMMIT_COMPLETE | FI_COMPLETION | FI_COMMIT)
#define PMOF_RX_OP_FLAGS (FI_COMPLETION)
/* libfabric 2 deprecates these (a warning wherever they are named), yet
 * applications written for 1.x still pass them: their values, which the
 * ABI fixes. */
#define PMOF_MR_UNSPEC 0
#define PMOF_MR_BASIC (1 << 0)
#define PMOF_MR_SCALABLE (1 << 1)
#define PMOF_LOCAL_MR (1ULL << 55)
#define PMOF_ORDER_STRICT 0x1FFULL
#define PMOF_ORDER_DATA (1ULL << 16)

/* Every tag bit is matched: libfabric's "generic" format, which its public
 * headers do not name (ofi_rxm returns the same). */
#define PMOF_TAG_FORMAT 0xAAAAAAAAAAAAAAAAULL

#define PMOF_MR_MODE (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY)
#define PMOF_MSG_ORDER                                                                             \
    (FI_ORDER_RAR | FI_ORDER_RAW | FI_ORDER_RAS | FI_ORDER_WAW | FI_ORDER_WAS | FI_ORDER_SAW |     \
     FI_ORDER_SAS)

struct pmof_dev {
    char name[IBV_SYSFS_NAME_MAX];
    /* librdmacm's, open until the process ends: its port is looked at
     * again for every fi_getinfo(), since ports go down and up. */
    struct ibv_context *ctx;
    struct ibv_device_attr_ex attr;
    struct ibv_port_attr port;
    uint64_t subnet_prefix;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    bool has_in4, has_in6;
    enum pmof_commit_path commit_path;
    bool sroce; /* has the commit verbs, whichever path commits take */
};

static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pmof_dev *devs;
static size_t ndevs;
static bool devs_loaded;

enum pmof_commit_path pmof_device_commit_path(struct ibv_context *verbs,
                                              struct ibv_commit_caps *caps) {
    memset(caps, 0, sizeof(*caps));
    struct ibv_device_attr_ex attr;

    /* The commit verbs carry every commit only where they reach any peer
     * (sroce); a kernel device that has them natively only (Linux rxe with
     * rxe-patches/ under libsroce.so) is an RNIC with FLUSH here. */
    if (ibv_query_commit_caps(verbs, caps) == 0 && (caps->flags & IBV_COMMIT_CAP_ANY_PEER)) {
        if (!pmof_params.commit_flush) return PMOF_COMMIT_VERBS;
        /* sroce posts FLUSH as an RNIC does: the provider's own sequences
         * run against a real FLUSH responder. */
        caps->flags = IBV_COMMIT_CAP_FLUSH;
        caps->atomicity_unit = 8;
        return PMOF_COMMIT_FLUSH;
    }
    memset(caps, 0, sizeof(*caps));
    if (ibv_query_device_ex(verbs, NULL, &attr) ||
        !(attr.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_GLOBAL) ||
        !(attr.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_PERSISTENT))
        return PMOF_COMMIT_NONE;
    caps->atomicity_unit = 8;
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
    caps->flags = IBV_COMMIT_CAP_FLUSH;
    return PMOF_COMMIT_FLUSH;
#else
    /* Only a libibverbs that has ibv_wr_flush reaches an RNIC's FLUSH
     * (older ones have no such entry in their providers' QPs), but the
     * responder is the kernel's: it needs only the access bits, which
     * every libibverbs passes through. */
    return PMOF_COMMIT_FLUSH_TARGET;
#endif
}

bool pmof_device_is_sroce(struct ibv_context *verbs) {
    struct ibv_commit_caps caps;

    memset(&caps, 0, sizeof(caps));
    return ibv_query_commit_caps(verbs, &caps) == 0 && (caps.flags & IBV_COMMIT_CAP_ANY_PEER);
}

size_t pmof_device_tx_iov_limit(const struct ibv_device_attr_ex *attr, bool sroce) {
    /* Linux rxe (vendor 0xFFFFFF, as sroce, which has the commit verbs)
     * with rdma-core's provider before v64 sums an ibv_wr_set_sge_list
     * list as n times its first entry: the request then fails or, shorter,
     * silently sends too little.  Its version cannot be asked, so rxe
     * gathers no lists at all. */
    if (attr->orig_attr.vendor_id == 0xFFFFFF && !sroce) return 1;
    if (attr->orig_attr.max_sge > 0 && attr->orig_attr.max_sge < PMOF_IOV_LIMIT)
        return (size_t)attr->orig_attr.max_sge;
    return PMOF_IOV_LIMIT;
}

static void load_addresses(struct ibv_context *ctx, struct pmof_dev *d) {
    struct ibv_gid_entry gids[64];
    ssize_t n = ibv_query_gid_table(ctx, gids, 64, 0);

    for (ssize_t i = 0; i < n; i++) {
        const uint8_t *raw = gids[i].gid.raw;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

        if (gids[i].port_num != 1 || gids[i].gid_type != IBV_GID_TYPE_ROCE_V2) continue;
        if (memcmp(raw, v4mapped, 12) == 0) {
            if (d->has_in4) continue;
            d->in4.sin_family = AF_INET;
            memcpy(&d->in4.sin_addr, raw + 12, 4);
            d->has_in4 = true;
        } else if (!(raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80) && !d->has_in6) {
            d->in6.sin6_family = AF_INET6;
            memcpy(&d->in6.sin6_addr, raw, 16);
            d->has_in6 = true;
        }
    }
}

static int load_devices(void) {
    int n = 0;
    struct ibv_context **list;

    pthread_mutex_lock(&devs_lock);
    if (devs_loaded) goto out;
    list = rdma_get_devices(&n);
    if (!list) n = 0;
    devs = calloc(n ? (size_t)n : 1, sizeof(*devs));
    if (!devs) {
        if (list) rdma_free_devices(list);
        pthread_mutex_unlock(&devs_lock);
        return -FI_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        struct pmof_dev *d = &devs[ndevs];
        struct ibv_commit_caps caps;
        union ibv_gid gid;

        if (ibv_query_device_ex(list[i], NULL, &d->attr) || ibv_query_port(list[i], 1, &d->port))
            continue;
        /* RoCE only: the connection manager runs over IP. */
        if (d->port.link_layer != IBV_LINK_LAYER_ETHERNET) continue;
        snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(list[i]->device));
        d->ctx = list[i];
        if (ibv_query_gid(list[i], 1, 0, &gid) == 0)
            d->subnet_prefix = be64toh(gid.global.subnet_prefix);
        load_addresses(list[i], d);
        if (!d->has_in4 && !d->has_in6) continue;
        d->commit_path = pmof_device_commit_path(list[i], &caps);
        d->sroce = pmof_device_is_sroce(list[i]);
        ndevs++;
    }
    if (list) rdma_free_devices(list);
    devs_loaded = true;
out:
    pthread_mutex_unlock(&devs_lock);
    return 0;
}

void pmof_info_cleanup(void) {
    pthread_mutex_lock(&devs_lock);
    free(devs);
    devs = NULL;
    ndevs = 0;
    devs_loaded = false;
    pthread_mutex_unlock(&devs_lock);
}

size_t pmof_sockaddr_len(const struct sockaddr *sa) {
    if (!sa) return 0;
    switch (sa->sa_family) {
    case AF_INET:
        return sizeof(struct sockaddr_in);
    case AF_INET6:
        return sizeof(struct sockaddr_in6);
    default:
        return 0;
    }
}

void pmof_sockaddr_clear_port(struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) ((struct sockaddr_in *)sa)->sin_port = 0;
    if (sa->sa_family == AF_INET6) ((struct sockaddr_in6 *)sa)->sin6_port = 0;
}

static bool sockaddr_same_ip(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

static bool sockaddr_is_any(const struct sockaddr *a) {
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &in6addr_any, 16) == 0;
    return false;
}

static void fabric_name(const struct pmof_dev *d, char *buf, size_t len) {
    snprintf(buf, len, "RoCE-0x%016llx", (unsigned long long)d->subnet_prefix);
}

bool pmof_fabric_name_ok(const char *name) {
    if (!name) return false;
    if (load_devices()) return false;
    for (size_t i = 0; i < ndevs; i++) {
        char fab[64];
        fabric_name(&devs[i], fab, sizeof(fab));
        if (strcmp(fab, name) == 0) return true;
    }
    return false;
}

/* ------------------------------------------------------------ addresses */

struct pmof_addrs {
    struct sockaddr_storage src, dest;
    bool has_src, has_dest;
};

static int resolve_node(const char *node, const char *service, bool passive,
                        struct sockaddr_storage *out) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    int ret;

    if (passive) hints.ai_flags = AI_PASSIVE;
    ret = getaddrinfo(node, service, &hints, &ai);
    if (ret) {
        PMOF_INFO(FI_LOG_CORE, "cannot resolve %s:%s: %s\n", node ? node : "*",
                  service ? service : "0", gai_strerror(ret));
        return -FI_ENODATA;
    }
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        if (p->ai_family == AF_INET || p->ai_family == AF_INET6) {
            memcpy(out, p->ai_addr, p->ai_addrlen);
            freeaddrinfo(ai);
            return 0;
        }
    }
    freeaddrinfo(ai);
    return -FI_ENODATA;
}

static int copy_hint_addr(const void *addr, size_t len, struct sockaddr_storage *out) {
    if (!addr) return 0;
    if (len < sizeof(sa_family_t) || len > sizeof(*out) || pmof_sockaddr_len(addr) == 0 ||
        pmof_sockaddr_len(addr) > len)
        return -FI_ENODATA;
    memcpy(out, addr, pmof_sockaddr_len(addr));
    return 1;
}

static int gather_addrs(const char *node, const char *service, uint64_t flags,
                        const struct fi_info *hints, struct pmof_addrs *a) {
    int ret;

    memset(a, 0, sizeof(*a));
    if (hints) {
        if (hints->addr_format != FI_FORMAT_UNSPEC && hints->addr_format != FI_SOCKADDR &&
            hints->addr_format != FI_SOCKADDR_IN && hints->addr_format != FI_SOCKADDR_IN6)
            return -FI_ENODATA;
        ret = copy_hint_addr(hints->src_addr, hints->src_addrlen, &a->src);
        if (ret < 0) return ret;
        a->has_src = ret;
        ret = copy_hint_addr(hints->dest_addr, hints->dest_addrlen, &a->dest);
        if (ret < 0) return ret;
        a->has_dest = ret;
    }
    if (node || service) {
        bool source = (flags & FI_SOURCE) || !node;
        ret = resolve_node(node, service, source, source ? &a->src : &a->dest);
        if (ret) return ret;
        if (source)
            a->has_src = true;
        else
            a->has_dest = true;
    }
    return 0;
}

/* The device and source address the route to `dest` leaves from. */
static int route_source(const struct pmof_addrs *a, char *dev, size_t devlen,
                        struct sockaddr_storage *src) {
    struct sockaddr_storage from = a->src;
    struct rdma_cm_id *id;
    int ret;

    /* The probe binds the source: its port may be taken already (by the
     * passive endpoint in hints->handle, say), and the route does not
     * depend on it. */
    pmof_sockaddr_clear_port((struct sockaddr *)&from);
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) return -FI_ENODATA;
    ret = rdma_resolve_addr(id, a->has_src ? (struct sockaddr *)&from : NULL,
                            (struct sockaddr *)&a->dest, pmof_params.cm_timeout_ms);
    if (ret || !id->verbs) {
        PMOF_INFO(FI_LOG_CORE, "no RDMA route to the destination: %s\n", strerror(errno));
        rdma_destroy_id(id);
        return -FI_ENODATA;
    }
    snprintf(dev, devlen, "%s", ibv_get_device_name(id->verbs->device));
    memcpy(src, rdma_get_local_addr(id), pmof_sockaddr_len(rdma_get_local_addr(id)));
    rdma_destroy_id(id);
    pmof_sockaddr_clear_port((struct sockaddr *)src);
    return 0;
}

/* --------------------------------------------------------------- matching */

#define NOMATCH(...)                                                                               \
    do {                                                                                           \
        PMOF_INFO(FI_LOG_CORE, __VA_ARGS__);                                                       \
        return false;                                                                              \
    } while (0)

static uint64_t dev_caps(const struct pmof_dev *d) {
    uint64_t caps = PMOF_PRIMARY_CAPS | FI_FENCE;

    if (pmof_path_initiates(d->commit_path)) caps |= FI_RMA_PMEM;
    if (d->attr.orig_attr.atomic_cap == IBV_ATOMIC_NONE) caps &= ~FI_ATOMIC;
    return caps;
}

/* What pmof needs of registrations for these capabilities (fi_domain(3)
 * ties each MR mode to what uses it): descriptors for the local buffers of
 * messages and of RMA and atomics (FI_MR_LOCAL); keys it chooses over
 * virtual addresses for a peer's RMA and atomics; memory that is mapped for
 * both.  Tagged messages alone register what they need themselves. */
static int mr_mode_needed(uint64_t caps) {
    int need = 0;

    if (caps & (FI_MSG | FI_RMA | FI_ATOMIC)) need |= FI_MR_LOCAL | FI_MR_ALLOCATED;
    if (caps & (FI_RMA | FI_ATOMIC)) need |= FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
    return need;
}

static bool mr_mode_ok(uint32_t version, const struct fi_info *hints, uint64_t caps, int *out_mode,
                       uint64_t *out_mode_bits) {
    int user = hints && hints->domain_attr ? hints->domain_attr->mr_mode : PMOF_MR_UNSPEC;
    uint64_t user_mode = hints ? hints->mode : 0;

    *out_mode_bits = 0;
    if (FI_VERSION_LT(version, FI_VERSION(1, 5)) || (user & PMOF_MR_BASIC)) {
        if (user != PMOF_MR_UNSPEC && user != PMOF_MR_BASIC) NOMATCH("mr_mode: only FI_MR_BASIC\n");
        if (!(user_mode & PMOF_LOCAL_MR)) NOMATCH("mr_mode FI_MR_BASIC needs mode FI_LOCAL_MR\n");
        *out_mode = PMOF_MR_BASIC;
        *out_mode_bits = PMOF_LOCAL_MR;
        return true;
    }
    if (user & PMOF_MR_SCALABLE) NOMATCH("mr_mode FI_MR_SCALABLE is not supported\n");
    /* From 1.5 on, hints list the modes the application can work with:
     * none (0) is a list too, which pmof's needs are not within. */
    if (hints && hints->domain_attr) {
        int need = mr_mode_needed(caps);
        /* Local registration through the old mode bit: the MR mode returned
         * stays within the hints (fi_domain(3)). */
        bool local_by_mode =
            (need & FI_MR_LOCAL) && !(user & FI_MR_LOCAL) && (user_mode & PMOF_LOCAL_MR);

        if (local_by_mode) need &= ~FI_MR_LOCAL;
        if ((user & need) != need)
            NOMATCH("mr_mode 0x%x lacks 0x%x (LOCAL|VIRT_ADDR|ALLOCATED|PROV_KEY)\n", user, need);
        *out_mode = need;
        if (local_by_mode) *out_mode_bits = PMOF_LOCAL_MR;
        return true;
    }
    *out_mode = PMOF_MR_MODE;
    return true;
}

static bool ep_attr_ok(const struct fi_ep_attr *h, enum fi_ep_type type) {
    if (!h) return true;
    if (h->type != FI_EP_UNSPEC && h->type != type) return false;
    if (h->protocol != FI_PROTO_UNSPEC && h->protocol != FI_PROTO_RDMA_CM_IB_RC)
        NOMATCH("protocol %u not supported\n", h->protocol);
    if (h->max_msg_size > PMOF_MAX_MSG_SIZE) NOMATCH("max_msg_size too large\n");
    if (h->tx_ctx_cnt > 1 && h->tx_ctx_cnt != FI_SHARED_CONTEXT)
        NOMATCH("scalable endpoints are not supported\n");
    if (h->rx_ctx_cnt > 1 && h->rx_ctx_cnt != FI_SHARED_CONTEXT)
        NOMATCH("scalable endpoints are not supported\n");
    if (h->tx_ctx_cnt == FI_SHARED_CONTEXT || h->rx_ctx_cnt == FI_SHARED_CONTEXT)
        NOMATCH("shared contexts are not supported\n");
    if (h->max_order_raw_size > PMOF_MAX_MSG_SIZE || h->max_order_war_size > PMOF_MAX_MSG_SIZE ||
        h->max_order_waw_size > PMOF_MAX_MSG_SIZE)
        NOMATCH("ordering size too large\n");
    return true;
}

/* A FI_EP_MSG endpoint's connection advances when its EQ is read (the
 * rdma_cm events are handled there); RDM connections are the provider's
 * own, served by its threads. */
static enum fi_progress control_progress(enum fi_ep_type type) {
    return type == FI_EP_MSG ? FI_PROGRESS_MANUAL : FI_PROGRESS_AUTO;
}

/* Counters a domain offers: software objects, bounded only by memory. */
#define PMOF_CNTR_CNT 1024

static bool domain_attr_ok(const struct fi_domain_attr *h, const struct pmof_dev *d,
                           enum fi_ep_type type) {
    const struct ibv_device_attr *a = &d->attr.orig_attr;

    if (!h) return true;
    if (h->name && strcmp(h->name, d->name)) return false;
    if (h->control_progress == FI_PROGRESS_AUTO && control_progress(type) != FI_PROGRESS_AUTO)
        NOMATCH("control progress FI_PROGRESS_AUTO: FI_EP_MSG connections advance in "
                "fi_eq_read\n");
    if (h->mr_key_size > 8) NOMATCH("mr_key_size %zu > 8\n", h->mr_key_size);
    if (h->cq_data_size > 4) NOMATCH("cq_data_size %zu > 4\n", h->cq_data_size);
    if (h->av_type == FI_AV_MAP || h->av_type == FI_AV_TABLE || h->av_type == FI_AV_UNSPEC)
        ;
    else
        NOMATCH("av_type %d\n", h->av_type);
    if (h->caps & ~(FI_LOCAL_COMM | FI_REMOTE_COMM)) NOMATCH("domain caps not supported\n");
    if (h->max_ep_tx_ctx > 1 || h->max_ep_rx_ctx > 1 || h->max_ep_stx_ctx || h->max_ep_srx_ctx)
        NOMATCH("scalable endpoints and shared contexts are not supported\n");
    /* fi_getinfo(3): the limits returned are at least those asked for. */
    if (h->cq_cnt > (size_t)a->max_cq || h->ep_cnt > (size_t)a->max_qp ||
        h->tx_ctx_cnt > (size_t)a->max_qp || h->rx_ctx_cnt > (size_t)a->max_qp ||
        h->mr_cnt > (size_t)a->max_mr || h->cntr_cnt > PMOF_CNTR_CNT || h->mr_iov_limit > 1 ||
        h->max_err_data > PMOF_CM_DATA_MAX)
        NOMATCH("domain limits beyond %s's\n", d->name);
    return true;
}

static bool tx_attr_ok(const struct fi_tx_attr *h, size_t max_inline, size_t iov_limit) {
    if (!h) return true;
    if (h->op_flags & ~PMOF_TX_OP_FLAGS)
        NOMATCH("tx op_flags 0x%llx\n", (unsigned long long)h->op_flags);
    if (h->inject_size > max_inline) NOMATCH("inject_size %zu > %zu\n", h->inject_size, max_inline);
    if (h->iov_limit > iov_limit) NOMATCH("tx iov_limit %zu > %zu\n", h->iov_limit, iov_limit);
    if (h->rma_iov_limit > 1) NOMATCH("rma_iov_limit %zu > 1\n", h->rma_iov_limit);
    if (h->msg_order & ~PMOF_MSG_ORDER) NOMATCH("tx msg_order not supported\n");
    if (h->comp_order & ~(PMOF_ORDER_STRICT | PMOF_ORDER_DATA)) NOMATCH("tx comp_order\n");
    if (h->size > 16384) NOMATCH("tx size %zu\n", h->size);
    return true;
}

static bool rx_attr_ok(const struct fi_rx_attr *h) {
    if (!h) return true;
    if (h->op_flags & ~PMOF_RX_OP_FLAGS) NOMATCH("rx op_flags not supported\n");
    if (h->iov_limit > PMOF_IOV_LIMIT) NOMATCH("rx iov_limit %zu\n", h->iov_limit);
    if (h->msg_order & ~PMOF_MSG_ORDER) NOMATCH("rx msg_order not supported\n");
    if (h->total_buffered_recv) NOMATCH("buffered receives are not supported\n");
    if (h->size > 16384) NOMATCH("rx size %zu\n", h->size);
    return true;
}

/* Caps the application gets: what it asked among the primary caps (every
 * direction if it named none), and the secondary caps it may use. */
static uint64_t grant_caps(uint64_t asked, uint64_t offered) {
    uint64_t caps;

    if (!asked) return offered;
    caps = (asked & PMOF_PRIMARY_CAPS) | (offered & PMOF_SECONDARY_CAPS & ~FI_RMA_PMEM) |
           (asked & FI_RMA_PMEM);
    if ((caps & (FI_MSG | FI_TAGGED)) && !(caps & (FI_SEND | FI_RECV))) caps |= FI_SEND | FI_RECV;
    if ((caps & (FI_RMA | FI_ATOMIC)) &&
        !(caps & (FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)))
        caps |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    if (!(caps & (FI_LOCAL_COMM | FI_REMOTE_COMM))) caps |= FI_LOCAL_COMM | FI_REMOTE_COMM;
    /* FI_RMA_PMEM is granted whenever the device has it, as libfabric's
     * secondary caps are: an application that did not ask still learns;
     * but fi_getinfo(3) has it require FI_RMA. */
    if (caps & FI_RMA) caps |= offered & FI_RMA_PMEM;
    return caps;
}

/* ---------------------------------------------------------------- build */

static int set_addr(void **dst, size_t *dstlen, uint32_t *fmt, const struct sockaddr_storage *ss) {
    size_t len = pmof_sockaddr_len((const struct sockaddr *)ss);

    *dst = malloc(len);
    if (!*dst) return -FI_ENOMEM;
    memcpy(*dst, ss, len);
    *dstlen = len;
    *fmt = ss->ss_family == AF_INET ? FI_SOCKADDR_IN : FI_SOCKADDR_IN6;
    return 0;
}

/* `manual`: the FI_COMMIT_MANUAL form, whose target application makes the
 * ranges durable, so any device offers FI_RMA_PMEM. */
static struct fi_info *build_info(uint32_t version, const struct pmof_dev *d, enum fi_ep_type type,
                                  const struct fi_info *hints, const struct pmof_addrs *a,
                                  bool manual) {
    struct fi_info *fi;
    int mr_mode;
    uint64_t mode_bits;
    size_t max_inline = (size_t)pmof_params.inline_size;
    char fab[64];
    uint64_t offered = dev_caps(d) | (manual ? FI_RMA_PMEM : 0);
    uint64_t asked = hints ? hints->caps : 0;

    /* Tags are matched in software behind RDM endpoints' connections; a
     * MSG endpoint is one verbs QP, which matches in order only. */
    if (type == FI_EP_MSG) offered &= ~(FI_TAGGED | FI_DIRECTED_RECV);
    if ((asked & ~offered) & (FI_TAGGED | FI_DIRECTED_RECV)) {
        PMOF_INFO(FI_LOG_CORE, "FI_TAGGED and FI_DIRECTED_RECV are for FI_EP_RDM endpoints\n");
        return NULL;
    }

    /* A target-only device is persistent memory to an application that
     * does not write itself (FI_WRITE, named or implied). */
    if (d->commit_path == PMOF_COMMIT_FLUSH_TARGET && !(grant_caps(asked, offered) & FI_WRITE))
        offered |= FI_RMA_PMEM;

    if (hints && hints->ep_attr && !ep_attr_ok(hints->ep_attr, type)) return NULL;
    if (asked & ~(PMOF_PRIMARY_CAPS | PMOF_SECONDARY_CAPS)) {
        PMOF_INFO(FI_LOG_CORE, "caps 0x%llx not supported\n",
                  (unsigned long long)(asked & ~(PMOF_PRIMARY_CAPS | PMOF_SECONDARY_CAPS)));
        return NULL;
    }
    if ((asked & FI_ATOMIC) && !(offered & FI_ATOMIC)) {
        PMOF_INFO(FI_LOG_CORE, "%s has no atomics\n", d->name);
        return NULL;
    }
    if ((asked & FI_RMA_PMEM) && !(asked & FI_RMA)) {
        PMOF_INFO(FI_LOG_CORE, "FI_RMA_PMEM without FI_RMA\n");
        return NULL;
    }
    if ((asked & FI_RMA_PMEM) && !(offered & FI_RMA_PMEM)) {
        PMOF_INFO(FI_LOG_CORE, "%s cannot make remote writes durable (FI_RMA_PMEM)\n", d->name);
        return NULL;
    }
    if (hints && hints->domain_attr && !domain_attr_ok(hints->domain_attr, d, type)) return NULL;
    if (hints &&
        !tx_attr_ok(hints->tx_attr, max_inline, pmof_device_tx_iov_limit(&d->attr, d->sroce)))
        return NULL;
    if (hints && !rx_attr_ok(hints->rx_attr)) return NULL;
    if (!mr_mode_ok(version, hints, grant_caps(asked, offered), &mr_mode, &mode_bits)) return NULL;
    fabric_name(d, fab, sizeof(fab));
    if (hints && hints->fabric_attr && hints->fabric_attr->name &&
        strcmp(hints->fabric_attr->name, fab))
        return NULL;

    fi = fi_allocinfo();
    if (!fi) return NULL;
    fi->caps = grant_caps(asked, offered);
    fi->mode = mode_bits | (manual ? FI_COMMIT_MANUAL : 0);
    fi->ep_attr->type = type;
    fi->ep_attr->protocol = FI_PROTO_RDMA_CM_IB_RC;
    fi->ep_attr->protocol_version = 1;
    fi->ep_attr->max_msg_size = PMOF_MAX_MSG_SIZE;
    fi->ep_attr->msg_prefix_size = 0;
    fi->ep_attr->max_order_raw_size = PMOF_MAX_MSG_SIZE;
    fi->ep_attr->max_order_war_size = PMOF_MAX_MSG_SIZE;
    fi->ep_attr->max_order_waw_size = PMOF_MAX_MSG_SIZE;
    fi->ep_attr->tx_ctx_cnt = 1;
    fi->ep_attr->rx_ctx_cnt = 1;

    fi->domain_attr->name = strdup(d->name);
    fi->domain_attr->threading = FI_THREAD_SAFE;
    fi->domain_attr->control_progress = control_progress(type);
    fi->domain_attr->data_progress = FI_PROGRESS_AUTO;
    fi->domain_attr->resource_mgmt = FI_RM_ENABLED;
    fi->domain_attr->av_type = FI_AV_UNSPEC;
    fi->domain_attr->mr_mode = mr_mode;
    fi->domain_attr->mr_key_size = 8;
    fi->domain_attr->cq_data_size = 4;
    fi->domain_attr->cq_cnt = d->attr.orig_attr.max_cq;
    fi->domain_attr->ep_cnt = d->attr.orig_attr.max_qp;
    fi->domain_attr->tx_ctx_cnt = d->attr.orig_attr.max_qp;
    fi->domain_attr->rx_ctx_cnt = d->attr.orig_attr.max_qp;
    fi->domain_attr->max_ep_tx_ctx = 1;
    fi->domain_attr->max_ep_rx_ctx = 1;
    fi->domain_attr->max_ep_stx_ctx = 0;
    fi->domain_attr->max_ep_srx_ctx = 0;
    fi->domain_attr->cntr_cnt = PMOF_CNTR_CNT;
    fi->domain_attr->mr_iov_limit = 1;
    fi->domain_attr->mr_cnt = d->attr.orig_attr.max_mr;
    fi->domain_attr->caps = FI_LOCAL_COMM | FI_REMOTE_COMM;
    fi->domain_attr->mode = 0;
    fi->domain_attr->max_err_data = PMOF_CM_DATA_MAX;

    fi->fabric_attr->name = strdup(fab);
    fi->fabric_attr->prov_version = PMOF_PROV_VERSION;

    fi->tx_attr->caps = fi->caps & PMOF_TX_CAPS;
    fi->tx_attr->mode = 0;
    fi->tx_attr->op_flags = FI_TRANSMIT_COMPLETE;
    fi->tx_attr->msg_order = PMOF_MSG_ORDER;
    fi->tx_attr->comp_order = PMOF_ORDER_STRICT;
    fi->tx_attr->inject_size = max_inline;
    fi->tx_attr->size = (size_t)pmof_params.tx_size;
    fi->tx_attr->iov_limit = pmof_device_tx_iov_limit(&d->attr, d->sroce);
    fi->tx_attr->rma_iov_limit = 1;

    fi->rx_attr->caps = fi->caps & PMOF_RX_CAPS;
    fi->rx_attr->mode = FI_RX_CQ_DATA;
    fi->rx_attr->op_flags = 0;
    fi->rx_attr->msg_order = PMOF_MSG_ORDER;
    fi->rx_attr->comp_order = PMOF_ORDER_STRICT | PMOF_ORDER_DATA;
    fi->rx_attr->size = (size_t)pmof_params.rx_size;
    fi->rx_attr->iov_limit = PMOF_IOV_LIMIT;
    fi->mode |= FI_RX_CQ_DATA;

    if (hints) {
        /* What the application chose among what is offered. */
        if (hints->domain_attr) {
            if (hints->domain_attr->threading != FI_THREAD_UNSPEC)
                fi->domain_attr->threading = hints->domain_attr->threading;
            if (hints->domain_attr->control_progress != FI_PROGRESS_UNSPEC)
                fi->domain_attr->control_progress = hints->domain_attr->control_progress;
            if (hints->domain_attr->data_progress != FI_PROGRESS_UNSPEC)
                fi->domain_attr->data_progress = hints->domain_attr->data_progress;
            if (hints->domain_attr->av_type != FI_AV_UNSPEC)
                fi->domain_attr->av_type = hints->domain_attr->av_type;
            if (hints->domain_attr->resource_mgmt == FI_RM_DISABLED)
                fi->domain_attr->resource_mgmt = FI_RM_DISABLED;
        }
        if (hints->tx_attr) {
            if (hints->tx_attr->op_flags) fi->tx_attr->op_flags = hints->tx_attr->op_flags;
            if (hints->tx_attr->size) fi->tx_attr->size = hints->tx_attr->size;
            if (hints->tx_attr->inject_size) fi->tx_attr->inject_size = hints->tx_attr->inject_size;
        }
        if (hints->rx_attr) {
            if (hints->rx_attr->op_flags) fi->rx_attr->op_flags = hints->rx_attr->op_flags;
            if (hints->rx_attr->size) fi->rx_attr->size = hints->rx_attr->size;
        }
        /* The immediate data of an RMA write consumes a posted receive:
         * offered with RMA only to applications that take that mode, as
         * libfabric's verbs does (a message's data comes with the receive
         * it consumes anyway); a mode bit stays only where the application
         * set it. */
        if (!(hints->mode & FI_RX_CQ_DATA)) fi->mode &= ~FI_RX_CQ_DATA;
        if (!(hints->mode & FI_RX_CQ_DATA) &&
            !(hints->rx_attr && (hints->rx_attr->mode & FI_RX_CQ_DATA))) {
            fi->rx_attr->mode &= ~FI_RX_CQ_DATA;
            if (fi->caps & FI_RMA) {
                fi->domain_attr->cq_data_size = 0;
                /* fi_getinfo(3): a non-zero size asked for is given or
                 * the call fails. */
                if (hints->domain_attr && hints->domain_attr->cq_data_size) {
                    PMOF_INFO(FI_LOG_CORE, "cq_data_size with FI_RMA needs the FI_RX_CQ_DATA "
                                           "mode\n");
                    goto err;
                }
            }
        }
    }
    if (type == FI_EP_MSG) fi->domain_attr->av_type = FI_AV_UNSPEC;
    if (type == FI_EP_RDM) {
        /* Receives name their sender (fi_cq_readfrom). */
        fi->caps |= FI_SOURCE;
        fi->rx_attr->caps |= FI_SOURCE;
        if (fi->domain_attr->av_type == FI_AV_UNSPEC) fi->domain_attr->av_type = FI_AV_TABLE;
    }
    if (fi->caps & PMOF_HEADED_CAPS) {
        /* Every message carries a header, which the inject size leaves
         * room for unless the application chose it. */
        fi->ep_attr->mem_tag_format = PMOF_TAG_FORMAT;
        if (!(hints && hints->tx_attr && hints->tx_attr->inject_size))
            fi->tx_attr->inject_size =
                max_inline > PMOF_MSG_HDR_LEN ? max_inline - PMOF_MSG_HDR_LEN : 0;
    }

    if (a->has_src) {
        if (set_addr(&fi->src_addr, &fi->src_addrlen, &fi->addr_format, &a->src)) goto err;
    } else {
        struct sockaddr_storage ss = {0};
        bool want6 = hints && hints->addr_format == FI_SOCKADDR_IN6;
        if (want6 ? d->has_in6 : d->has_in4)
            memcpy(&ss, want6 ? (void *)&d->in6 : (void *)&d->in4,
                   want6 ? sizeof(d->in6) : sizeof(d->in4));
        else
            memcpy(&ss, d->has_in4 ? (void *)&d->in4 : (void *)&d->in6,
                   d->has_in4 ? sizeof(d->in4) : sizeof(d->in6));
        if (set_addr(&fi->src_addr, &fi->src_addrlen, &fi->addr_format, &ss)) goto err;
    }
    if (a->has_dest && set_addr(&fi->dest_addr, &fi->dest_addrlen, &fi->addr_format, &a->dest))
        goto err;
    if (hints && hints->addr_format == FI_SOCKADDR) fi->addr_format = FI_SOCKADDR;
    if (hints && (hints->addr_format == FI_SOCKADDR_IN || hints->addr_format == FI_SOCKADDR_IN6) &&
        hints->addr_format != fi->addr_format)
        goto err;
    if (!fi->domain_attr->name || !fi->fabric_attr->name) goto err;
    return fi;
err:
    fi_freeinfo(fi);
    return NULL;
}

static bool dev_has_ip(const struct pmof_dev *d, const struct sockaddr *sa) {
    if (sockaddr_is_any(sa)) return true;
    if (sa->sa_family == AF_INET && d->has_in4) return sockaddr_same_ip((void *)&d->in4, sa);
    if (sa->sa_family == AF_INET6 && d->has_in6) return sockaddr_same_ip((void *)&d->in6, sa);
    return false;
}

/* A device whose port is down (its address is not on the host, its net
 * device is down) offers nothing, as libfabric's verbs provider has it. */
static bool port_active(const struct pmof_dev *d) {
    struct ibv_port_attr port;

    if (ibv_query_port(d->ctx, 1, &port) == 0 && port.state == IBV_PORT_ACTIVE) return true;
    PMOF_INFO(FI_LOG_CORE, "%s: port 1 is not active\n", d->name);
    return false;
}

int pmof_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                 const struct fi_info *hints, struct fi_info **info) {
    struct pmof_addrs a;
    char route_dev[IBV_SYSFS_NAME_MAX] = "";
    struct fi_info *head = NULL, *tail = NULL;
    static const enum fi_ep_type types[] = {FI_EP_MSG, FI_EP_RDM};
    int ret;

    *info = NULL;
    if ((flags & PMOF_OFI_CORE_PROV_ONLY) && !pmof_params.allow_layering) {
        PMOF_INFO(FI_LOG_CORE, "not offered to utility providers (they drop FI_COMMIT); "
                               "FI_PMOF_ALLOW_LAYERING=1 allows it\n");
        return -FI_ENODATA;
    }
    ret = load_devices();
    if (ret) return ret;
    if (!ndevs) return -FI_ENODATA;
    ret = gather_addrs(node, service, flags, hints, &a);
    if (ret) return ret;
    /* fi_getinfo(3): a passive endpoint in hints->handle comes back in
     * every info; an active endpoint made from one leaves from where it
     * is bound (fi_endpoint(3)), so that is the infos' source. */
    struct pmof_pep *pep = hints ? pmof_pep_of(hints->handle) : NULL;
    if (pep && pep->id && !a.has_src) {
        const struct sockaddr *bound = rdma_get_local_addr(pep->id);
        if ((bound->sa_family == AF_INET || bound->sa_family == AF_INET6) &&
            !sockaddr_is_any(bound)) {
            memcpy(&a.src, bound, pmof_sockaddr_len(bound));
            a.has_src = true;
        }
    }
    if (a.has_dest && !a.has_src && hints && hints->domain_attr && hints->domain_attr->name) {
        /* A domain named with a destination (fi_pingpong -d): leave from
         * its address, as `-s` would, rather than the one the route picks,
         * so two devices of one host can talk to each other. */
        for (size_t i = 0; i < ndevs; i++) {
            const struct pmof_dev *d = &devs[i];
            if (strcmp(d->name, hints->domain_attr->name)) continue;
            if (a.dest.ss_family == AF_INET && d->has_in4) {
                memcpy(&a.src, &d->in4, sizeof(d->in4));
                a.has_src = true;
            } else if (a.dest.ss_family == AF_INET6 && d->has_in6) {
                memcpy(&a.src, &d->in6, sizeof(d->in6));
                a.has_src = true;
            }
        }
    }
    if (a.has_dest) {
        struct sockaddr_storage src;
        ret = route_source(&a, route_dev, sizeof(route_dev), &src);
        if (ret) return ret;
        if (!a.has_src || sockaddr_is_any((struct sockaddr *)&a.src)) {
            a.src = src;
            a.has_src = true;
        }
    }
    bool want_manual = hints && (hints->mode & FI_COMMIT_MANUAL);
    for (size_t i = 0; i < ndevs; i++) {
        const struct pmof_dev *d = &devs[i];

        if (route_dev[0] && strcmp(route_dev, d->name)) continue;
        if (a.has_src && !route_dev[0] && !dev_has_ip(d, (struct sockaddr *)&a.src)) continue;
        if (!port_active(d)) continue;
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            /* The transport's persistence first; FI_COMMIT_MANUAL after it
             * for applications that take that mode (or alone, with
             * FI_PMOF_COMMIT_MANUAL). */
            for (int manual = 0; manual < 2; manual++) {
                if (manual && !want_manual) continue;
                if (!manual && want_manual && pmof_params.commit_manual) continue;
                struct fi_info *fi = build_info(version, d, types[t], hints, &a, manual);
                if (!fi) continue;
                if (tail)
                    tail->next = fi;
                else
                    head = fi;
                tail = fi;
            }
        }
    }
    if (!head) return -FI_ENODATA;
    if (hints && hints->handle && hints->handle->fclass == FI_CLASS_PEP)
        for (struct fi_info *fi = head; fi; fi = fi->next)
            fi->handle = hints->handle;
    *info = head;
    return 0;
}
