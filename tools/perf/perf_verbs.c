// SPDX-License-Identifier: MIT
/*
 * Devices, queue pairs and the target memory of the benchmarks.
 *
 * The tools link against the system's libibverbs only, so that they run on
 * any verbs device: sroce (under `sroce exec`, which preloads libsroce.so),
 * a kernel rxe or an RNIC.  The write-commit functions of
 * <infiniband/verbs_ext.h> exist only where libsroce.so is loaded; they are
 * looked up at run time, and without them --method native fails with a
 * clear message while the IBTA methods keep working.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "perf_common.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------- extension symbols */

typedef int (*query_caps_fn)(struct ibv_context *, struct ibv_commit_caps *);
typedef int (*set_peer_fn)(struct ibv_qp *, uint32_t);
typedef const struct ibv_qp_commit_ops *(*commit_ops_fn)(struct ibv_qp_ex *);

static struct {
    bool resolved;
    query_caps_fn query_caps;
    set_peer_fn set_peer;
    commit_ops_fn commit_ops;
} ext;

static void resolve_ext(void) {
    if (ext.resolved) return;
    ext.resolved = true;
    /* Function pointers from dlsym's void *: POSIX guarantees the
     * conversion, ISO C does not, hence the memcpy. */
    void *p = dlsym(RTLD_DEFAULT, "ibv_query_commit_caps");
    memcpy(&ext.query_caps, &p, sizeof(p));
    p = dlsym(RTLD_DEFAULT, "ibv_qp_set_commit_peer");
    memcpy(&ext.set_peer, &p, sizeof(p));
    p = dlsym(RTLD_DEFAULT, "ibv_qp_to_commit_ops");
    memcpy(&ext.commit_ops, &p, sizeof(p));
}

bool perf_ext_present(void) {
    resolve_ext();
    return ext.query_caps && ext.set_peer && ext.commit_ops;
}

int perf_ext_query_commit_caps(struct ibv_context *ctx, struct ibv_commit_caps *caps) {
    memset(caps, 0, sizeof(*caps));
    if (!perf_ext_present()) return ENOSYS;
    return ext.query_caps(ctx, caps);
}

int perf_ext_set_commit_peer(struct ibv_qp *qp, uint32_t caps) {
    if (!perf_ext_present()) return ENOSYS;
    return ext.set_peer(qp, caps);
}

int perf_declare_peer(struct perf_conn *c, bool native) {
    uint32_t caps = c->peer.commit_caps;
    if (native) return perf_ext_set_commit_peer(c->qp, caps);
    caps &= IBV_COMMIT_CAP_SELECTIVE_REPEAT;
    /* A loss-recovery preference: a device that cannot take it goes on with
     * IBTA's go-back-N. */
    if (caps) (void)perf_ext_set_commit_peer(c->qp, caps);
    return 0;
}

const struct ibv_qp_commit_ops *perf_ext_commit_ops(struct ibv_qp_ex *qpx) {
    if (!perf_ext_present()) return NULL;
    return ext.commit_ops(qpx);
}

/* -------------------------------------------------------------- device */

static bool ipv4_mapped(const union ibv_gid *g) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(g->raw, prefix, 12);
}

void perf_open_device(struct perf_conn *c) {
    const struct perf_opts *o = c->o;
    struct ibv_device **list;
    struct ibv_device_attr attr;
    struct ibv_port_attr port;
    int n = 0;

    if (c->ctx) {
        /* -R: librdmacm's context of the device the address resolved to. */
        if (o->dev && strcmp(ibv_get_device_name(c->ctx->device), o->dev))
            perf_die("-d %s: the connection goes through device %s", o->dev,
                     ibv_get_device_name(c->ctx->device));
        goto opened;
    }
    list = ibv_get_device_list(&n);
    if (!list || !n) {
        const char *why = list ? "" : strerror(errno);
        if (o->dev)
            perf_die("IB device '%s' not found: no RDMA devices%s%s", o->dev, *why ? ": " : "",
                     why);
        perf_die("no RDMA devices found%s%s", *why ? ": " : "", why);
    }
    for (int i = 0; i < n && !c->ctx; i++) {
        if (o->dev && strcmp(ibv_get_device_name(list[i]), o->dev)) continue;
        c->ctx = ibv_open_device(list[i]);
        if (!c->ctx)
            perf_die("cannot open device %s: %s", ibv_get_device_name(list[i]), strerror(errno));
    }
    if (!c->ctx) {
        char names[256] = "";
        for (int i = 0; i < n; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof(names) - l, "%s%s", i ? ", " : "",
                     ibv_get_device_name(list[i]));
        }
        perf_die("IB device '%s' not found (devices: %s)", o->dev, names);
    }
    ibv_free_device_list(list);

opened:
    if (ibv_query_device(c->ctx, &attr)) perf_die("ibv_query_device: %s", strerror(errno));
    if (ibv_query_port(c->ctx, (uint8_t)o->ib_port, &port))
        perf_die("%s has no port %d", ibv_get_device_name(c->ctx->device), o->ib_port);
    if (port.state != IBV_PORT_ACTIVE)
        perf_die("port %d of %s is not active (state %s)", o->ib_port,
                 ibv_get_device_name(c->ctx->device), ibv_port_state_str(port.state));
    c->active_mtu = port.active_mtu;
    c->max_msg = port.max_msg_sz ? port.max_msg_sz : 1u << 30;
    c->is_roce = port.link_layer == IBV_LINK_LAYER_ETHERNET;
    c->max_rd_atomic = attr.max_qp_rd_atom < 16 ? (uint32_t)attr.max_qp_rd_atom : 16;
    if (!c->max_rd_atomic) c->max_rd_atomic = 1;

    c->gid_index = o->gid_index < 0 ? 0 : o->gid_index;
    if (o->gid_index < 0 && c->is_roce) {
        for (int i = 0; i < port.gid_tbl_len; i++) {
            union ibv_gid g;
            if (!ibv_query_gid(c->ctx, (uint8_t)o->ib_port, i, &g) && ipv4_mapped(&g)) {
                c->gid_index = i;
                break;
            }
        }
    }
    if (ibv_query_gid(c->ctx, (uint8_t)o->ib_port, c->gid_index, &c->me.gid))
        perf_die("%s port %d has no GID index %d", ibv_get_device_name(c->ctx->device), o->ib_port,
                 c->gid_index);
    c->me.lid = port.lid;

    if (o->mtu) {
        enum ibv_mtu want = o->mtu == 256    ? IBV_MTU_256
                            : o->mtu == 512  ? IBV_MTU_512
                            : o->mtu == 1024 ? IBV_MTU_1024
                            : o->mtu == 2048 ? IBV_MTU_2048
                                             : IBV_MTU_4096;
        if (want > c->active_mtu)
            perf_die("MTU %d is larger than the active MTU of the port (%d)", o->mtu,
                     128 << c->active_mtu);
        c->active_mtu = want;
    }
    c->me.mtu = c->active_mtu;
    c->me.rd_atomic = c->max_rd_atomic;

    c->pd = ibv_alloc_pd(c->ctx);
    if (!c->pd) perf_die("ibv_alloc_pd: %s", strerror(errno));
}

void perf_create_cq(struct perf_conn *c, unsigned cqe) {
    if (c->o->use_event) {
        c->channel = ibv_create_comp_channel(c->ctx);
        if (!c->channel) perf_die("ibv_create_comp_channel: %s", strerror(errno));
        /* The server waits on the channel and its TCP socket together. */
        fcntl(c->channel->fd, F_SETFL, fcntl(c->channel->fd, F_GETFL) | O_NONBLOCK);
    }
    c->cq = ibv_create_cq(c->ctx, (int)cqe, NULL, c->channel, 0);
    if (!c->cq) perf_die("ibv_create_cq(%u entries): %s", cqe, strerror(errno));
}

void perf_create_qp(struct perf_conn *c, uint64_t send_ops, uint32_t send_wr, uint32_t recv_wr,
                    uint32_t inline_size) {
    struct ibv_qp_init_attr_ex attr = {
        .qp_type = IBV_QPT_RC,
        .send_cq = c->send_cq ? c->send_cq : c->cq,
        .recv_cq = c->cq,
        .cap = {.max_send_wr = send_wr,
                .max_recv_wr = recv_wr,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = inline_size},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = c->pd,
        .send_ops_flags = send_ops,
    };

    /* rdma_cm moves its QP to INIT with the access the connection allows. */
    if (c->cm_id)
        c->qp = rdma_create_qp_ex(c->cm_id, &attr) ? NULL : c->cm_id->qp;
    else
        c->qp = ibv_create_qp_ex(c->ctx, &attr);
    if (!c->qp) {
        int err = errno;
        if (err == EOPNOTSUPP)
            perf_die("%s cannot create a QP for this test: it lacks a verb the method uses "
                     "(FLUSH, ATOMIC WRITE or write-commit)",
                     ibv_get_device_name(c->ctx->device));
        perf_die("ibv_create_qp_ex(send %u, recv %u, inline %u): %s", send_wr, recv_wr, inline_size,
                 strerror(err));
    }
    if (!c->send_cq) c->send_cq = c->cq;
    c->qpx = ibv_qp_to_qp_ex(c->qp);
    if (!c->qpx) perf_die("ibv_qp_to_qp_ex: %s", strerror(errno));
    c->sq_len = send_wr;
    c->me.qpn = c->qp->qp_num;
    srand48((long)(perf_now_ns() ^ (uint64_t)getpid()));
    c->me.psn = (uint32_t)lrand48() & 0xffffff;
}

/* RESET -> INIT -> RTR -> RTS, aimed at the peer's QP. */
void perf_connect_qp(struct perf_conn *c, unsigned access) {
    const struct perf_opts *o = c->o;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .port_num = (uint8_t)o->ib_port, .qp_access_flags = access};

    if (ibv_modify_qp(c->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        perf_die("QP to INIT (access %#x): %s", access, strerror(errno));

    c->path_mtu = c->me.mtu < c->peer.mtu ? (enum ibv_mtu)c->me.mtu : (enum ibv_mtu)c->peer.mtu;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = c->path_mtu;
    a.dest_qp_num = c->peer.qpn;
    a.rq_psn = c->peer.psn;
    a.max_dest_rd_atomic = (uint8_t)c->max_rd_atomic;
    a.min_rnr_timer = 1;
    a.ah_attr.port_num = (uint8_t)o->ib_port;
    a.ah_attr.dlid = c->peer.lid;
    if (c->is_roce) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = c->peer.gid;
        a.ah_attr.grh.sgid_index = (uint8_t)c->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    if (ibv_modify_qp(c->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        perf_die("QP to RTR: %s", strerror(errno));

    /* An msync at the target can take long when the disk is busy; timeout
     * 18 (about 1 s) keeps such a commit from being retransmitted. */
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = c->me.psn;
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic =
        (uint8_t)(c->max_rd_atomic < c->peer.rd_atomic ? c->max_rd_atomic : c->peer.rd_atomic);
    if (ibv_modify_qp(c->qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
        perf_die("QP to RTS: %s", strerror(errno));
}

/* ------------------------------------------------------------- rdma_cm */

enum { CM_TIMEOUT_MS = 60000, CM_RESOLVE_MS = 2000 };

/* The next event on the channel, which must be `want`; anything else, or
 * nothing within CM_TIMEOUT_MS, ends the test with what happened. */
static struct rdma_cm_event *cm_expect(struct perf_conn *c, enum rdma_cm_event_type want) {
    struct pollfd p = {.fd = c->cm_channel->fd, .events = POLLIN};
    struct rdma_cm_event *ev;
    int n;

    do
        n = poll(&p, 1, CM_TIMEOUT_MS);
    while (n < 0 && errno == EINTR);
    if (n < 0) perf_die("poll on the rdma_cm channel: %s", strerror(errno));
    if (!n) perf_die("rdma_cm: no %s within %d s", rdma_event_str(want), CM_TIMEOUT_MS / 1000);
    if (rdma_get_cm_event(c->cm_channel, &ev)) perf_die("rdma_get_cm_event: %s", strerror(errno));
    if (ev->event != want) {
        const enum rdma_cm_event_type got = ev->event;
        const int status = ev->status;

        rdma_ack_cm_event(ev);
        if (got == RDMA_CM_EVENT_REJECTED)
            perf_die("rdma_cm: the %s rejected the connection (status %d): is it running "
                     "with -R on port %d?",
                     perf_peer_name, status, c->o->port);
        perf_die("rdma_cm: %s (status %d) while waiting for %s", rdma_event_str(got), status,
                 rdma_event_str(want));
    }
    return ev;
}

static void cm_channel(struct perf_conn *c) {
    c->cm_channel = rdma_create_event_channel();
    if (!c->cm_channel)
        perf_die("rdma_create_event_channel: %s (is rdma_ucm available? run under "
                 "`sroce exec` for sroce devices)",
                 strerror(errno));
}

/* -R -d DEV: DEV's IPv4 address (from its GID table) is the source of the
 * connection, since the route alone may pick another device. */
static void cm_source(const struct perf_opts *o, struct sockaddr_in *src) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = NULL;
    union ibv_gid g;

    for (int i = 0; list && list[i] && !ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), o->dev)) ctx = ibv_open_device(list[i]);
    if (list) ibv_free_device_list(list);
    if (!ctx) perf_die("IB device '%s' not found", o->dev);
    for (int i = o->gid_index < 0 ? 0 : o->gid_index; i < 256; i++) {
        if (ibv_query_gid(ctx, (uint8_t)o->ib_port, i, &g)) break;
        if (ipv4_mapped(&g)) {
            *src = (struct sockaddr_in){.sin_family = AF_INET};
            memcpy(&src->sin_addr, g.raw + 12, 4);
            ibv_close_device(ctx);
            return;
        }
        if (o->gid_index >= 0) break;
    }
    ibv_close_device(ctx);
    perf_die("-R: device %s has no IPv4 GID%s to connect from", o->dev,
             o->gid_index < 0 ? "" : " at that index");
}

void perf_cm_resolve(struct perf_conn *c) {
    const struct perf_opts *o = c->o;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    struct sockaddr_in src;
    char port[8];
    int err;

    if (o->dev) cm_source(o, &src);
    cm_channel(c);
    if (rdma_create_id(c->cm_channel, &c->cm_id, NULL, RDMA_PS_TCP))
        perf_die("rdma_create_id: %s", strerror(errno));
    snprintf(port, sizeof(port), "%d", o->port);
    err = getaddrinfo(o->host, port, &hints, &ai);
    if (err) perf_die("cannot resolve %s: %s", o->host, gai_strerror(err));
    err = rdma_resolve_addr(c->cm_id, o->dev ? (struct sockaddr *)&src : NULL, ai->ai_addr,
                            CM_RESOLVE_MS);
    freeaddrinfo(ai);
    if (err) perf_die("rdma_resolve_addr %s: %s", o->host, strerror(errno));
    rdma_ack_cm_event(cm_expect(c, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(c->cm_id, CM_RESOLVE_MS))
        perf_die("rdma_resolve_route %s: %s", o->host, strerror(errno));
    rdma_ack_cm_event(cm_expect(c, RDMA_CM_EVENT_ROUTE_RESOLVED));
    c->ctx = c->cm_id->verbs;
}

void perf_cm_listen(struct perf_conn *c) {
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->o->port)};

    cm_channel(c);
    if (rdma_create_id(c->cm_channel, &c->cm_listen, NULL, RDMA_PS_TCP))
        perf_die("rdma_create_id: %s", strerror(errno));
    if (rdma_bind_addr(c->cm_listen, (struct sockaddr *)&any))
        perf_die("rdma_bind_addr(port %d): %s", c->o->port, strerror(errno));
    if (rdma_listen(c->cm_listen, 1)) perf_die("rdma_listen: %s", strerror(errno));
}

void perf_cm_get_request(struct perf_conn *c) {
    struct rdma_cm_event *ev = cm_expect(c, RDMA_CM_EVENT_CONNECT_REQUEST);

    c->cm_id = ev->id;
    rdma_ack_cm_event(ev);
    c->ctx = c->cm_id->verbs;
}

static struct rdma_conn_param cm_param(const struct perf_conn *c) {
    return (struct rdma_conn_param){.responder_resources = (uint8_t)c->max_rd_atomic,
                                    .initiator_depth = (uint8_t)c->max_rd_atomic,
                                    .retry_count = 7,
                                    .rnr_retry_count = 7};
}

void perf_cm_connect(struct perf_conn *c) {
    struct rdma_conn_param p = cm_param(c);

    if (rdma_connect(c->cm_id, &p)) perf_die("rdma_connect: %s", strerror(errno));
}

void perf_cm_accept(struct perf_conn *c, unsigned access) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .qp_access_flags = access};
    struct rdma_conn_param p = cm_param(c);

    if (rdma_accept(c->cm_id, &p)) perf_die("rdma_accept: %s", strerror(errno));
    /* rdma_cm grants remote READ, WRITE and atomics, and sets them again on
     * the way to RTR; FLUSH and the commits need the QP's FLUSH access too.
     * The client sends nothing before REPLY, which follows this. */
    if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS))
        perf_die("QP access %#x: %s", access, strerror(errno));
}

void perf_cm_wait_established(struct perf_conn *c) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    struct ibv_ece ece = {0};

    rdma_ack_cm_event(cm_expect(c, RDMA_CM_EVENT_ESTABLISHED));
    if (ibv_query_qp(c->qp, &a, IBV_QP_PATH_MTU, &ia))
        perf_die("ibv_query_qp: %s", strerror(errno));
    c->path_mtu = a.path_mtu;
    c->cm_native = !ibv_query_ece(c->qp, &ece) && ibv_commit_ece_native(&ece);
}

/* ------------------------------------------------------- target memory */

static unsigned target_access(const struct perf_conn *c) {
    const struct perf_opts *o = c->o;
    unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

    if (o->tool == TOOL_ATOMIC_WRITE) access |= IBV_ACCESS_REMOTE_ATOMIC;
    if (perf_needs_flush(o)) {
        /* Volatile memory offers global visibility only: sroce and rxe
         * refuse FLUSH_PERSISTENT on it. */
        access |= IBV_ACCESS_FLUSH_GLOBAL;
        if (o->target != TARGET_DRAM) access |= IBV_ACCESS_FLUSH_PERSISTENT;
    }
    return access;
}

void perf_setup_target(struct perf_conn *c, uint64_t len) {
    const struct perf_opts *o = c->o;
    const unsigned access = target_access(c);
    int is_pmem = 0;

    c->buf_len = len;
    switch (o->target) {
    case TARGET_DRAM:
        c->buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->buf == MAP_FAILED)
            perf_die("cannot allocate %llu bytes: %s", (unsigned long long)len, strerror(errno));
        break;
    case TARGET_FILE:
        c->target_fd = open(o->target_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (c->target_fd < 0 || ftruncate(c->target_fd, (off_t)len))
            perf_die("target file %s: %s", o->target_path, strerror(errno));
        c->buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->target_fd, 0);
        if (c->buf == MAP_FAILED) perf_die("mmap %s: %s", o->target_path, strerror(errno));
        /* The file's size is durable before anything is committed into it. */
        if (fsync(c->target_fd)) perf_die("fsync %s: %s", o->target_path, strerror(errno));
        break;
    case TARGET_PMEM:
        c->buf = pmem_map_file(o->target_path, len, PMEM_FILE_CREATE, 0644, &c->map_len, &is_pmem);
        if (!c->buf) perf_die("pmem_map_file %s: %s", o->target_path, pmem_errormsg());
        break;
    }
    /* Touch every page now, so that first-touch faults do not land in the
     * measurement. */
    memset(c->buf, 0, len);
    if (o->target == TARGET_FILE && msync(c->buf, len, MS_SYNC))
        perf_die("msync %s: %s", o->target_path, strerror(errno));
    if (o->target == TARGET_PMEM) {
        if (is_pmem)
            pmem_persist(c->buf, len);
        else if (pmem_msync(c->buf, len))
            perf_die("msync %s: %s", o->target_path, strerror(errno));
    }

    c->buf_mr = ibv_reg_mr(c->pd, c->buf, len, (int)access);
    if (!c->buf_mr) {
        int err = errno;
        if (err == EINVAL && (access & IBV_ACCESS_FLUSH_PERSISTENT))
            perf_die("cannot register %s for persistent FLUSH (%s): the file must be on a file "
                     "system that can make it durable (not tmpfs or /dev/shm)",
                     o->target_path, strerror(err));
        perf_die("ibv_reg_mr(%llu bytes, access %#x): %s", (unsigned long long)len, access,
                 strerror(err));
    }
    c->target.rkey = c->buf_mr->rkey;
    c->target.addr = (uintptr_t)c->buf;
    c->target.len = len;
    c->target.kind = o->target;
    c->target.is_pmem = is_pmem;
    c->target.mr_flush_access = access & (IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT);
    c->me.rkey = c->buf_mr->rkey;
    c->me.vaddr = (uintptr_t)c->buf;
}

void perf_persist(struct perf_conn *c, uint64_t off, uint64_t len) {
    uint8_t *p = c->buf + off;

    switch (c->target.kind) {
    case TARGET_DRAM:
        /* Nothing to write back: the store fence orders the placed data
         * before the answer. */
        atomic_thread_fence(memory_order_seq_cst);
        break;
    case TARGET_FILE: {
        uintptr_t start = (uintptr_t)p & ~(uintptr_t)4095;
        if (msync((void *)start, (uintptr_t)p + len - start, MS_SYNC))
            perf_die("msync %s: %s", c->o->target_path, strerror(errno));
        break;
    }
    case TARGET_PMEM:
        if (c->target.is_pmem)
            pmem_persist(p, len);
        else if (pmem_msync(p, len))
            perf_die("msync %s: %s", c->o->target_path, strerror(errno));
        break;
    }
}

void perf_close(struct perf_conn *c) {
    if (c->cm_id) {
        rdma_disconnect(c->cm_id);
        if (c->qp) rdma_destroy_qp(c->cm_id);
    } else if (c->qp) {
        ibv_destroy_qp(c->qp);
    }
    if (c->send_cq && c->send_cq != c->cq) ibv_destroy_cq(c->send_cq);
    if (c->cq) ibv_destroy_cq(c->cq);
    if (c->channel) ibv_destroy_comp_channel(c->channel);
    if (c->buf_mr) ibv_dereg_mr(c->buf_mr);
    if (c->aux_mr) ibv_dereg_mr(c->aux_mr);
    if (c->pd) ibv_dealloc_pd(c->pd);
    /* librdmacm owns the context of a connection it made. */
    if (c->cm_id)
        rdma_destroy_id(c->cm_id);
    else if (c->ctx)
        ibv_close_device(c->ctx);
    if (c->cm_listen) rdma_destroy_id(c->cm_listen);
    if (c->cm_channel) rdma_destroy_event_channel(c->cm_channel);
    if (c->buf) {
        if (!c->o->host && c->o->target == TARGET_PMEM)
            pmem_unmap(c->buf, c->map_len);
        else
            munmap(c->buf, c->buf_len);
    }
    if (c->aux) munmap(c->aux, c->aux_len);
    if (c->target_fd >= 0) close(c->target_fd);
    if (c->sock >= 0) close(c->sock);
}

/* --------------------------------------------------------- completions */

int perf_poll(struct perf_conn *c, struct ibv_wc *wc, int max, bool nonblock) {
    for (;;) {
        int n = ibv_poll_cq(c->cq, max, wc);

        if (n < 0) perf_die("ibv_poll_cq failed");
        if (n > 0 || nonblock) return n;
        if (!c->o->use_event) continue;
        if (!c->cq_armed) {
            if (ibv_req_notify_cq(c->cq, 0)) perf_die("ibv_req_notify_cq failed");
            c->cq_armed = 1;
            /* A completion may have arrived before the CQ was armed. */
            continue;
        }
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        struct pollfd pf = {.fd = c->channel->fd, .events = POLLIN};
        /* The channel is non-blocking (see perf_create_cq): wait here. */
        if (poll(&pf, 1, -1) < 0 && errno != EINTR) perf_die("poll: %s", strerror(errno));
        if (ibv_get_cq_event(c->channel, &ev_cq, &ev_ctx)) {
            if (errno != EAGAIN) perf_die("ibv_get_cq_event: %s", strerror(errno));
            continue;
        }
        ibv_ack_cq_events(ev_cq, 1);
        c->cq_armed = 0;
    }
}

const char *perf_wc_opcode_name(enum ibv_wc_opcode op) {
    switch ((int)op) {
    case IBV_WC_SEND:
        return "SEND";
    case IBV_WC_RDMA_WRITE:
        return "RDMA_WRITE";
    case IBV_WC_RDMA_READ:
        return "RDMA_READ";
    case IBV_WC_ATOMIC_WRITE:
        return "ATOMIC_WRITE";
    case IBV_WC_FLUSH:
        return "FLUSH";
    case IBV_WC_RDMA_WRITE_COMMIT:
        return "RDMA_WRITE_COMMIT";
    case IBV_WC_RECV:
        return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM:
        return "RECV_RDMA_WITH_IMM";
    default:
        return "other";
    }
}

void perf_check_wc(const struct ibv_wc *wc, const char *what) {
    if (wc->status == IBV_WC_SUCCESS) return;
    perf_die("%s failed: completion status %s (%d), opcode %s, wr_id %llu", what,
             ibv_wc_status_str(wc->status), (int)wc->status, perf_wc_opcode_name(wc->opcode),
             (unsigned long long)wc->wr_id);
}

void perf_post_recv(struct perf_conn *c, size_t base, unsigned slot, bool with_buffer) {
    struct ibv_sge sge = {.addr = (uintptr_t)(c->aux + base + (size_t)slot * PERF_MSG_SLOT),
                          .length = PERF_MSG_SLOT,
                          .lkey = c->aux_mr ? c->aux_mr->lkey : 0};
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = with_buffer ? 1 : 0}, *bad;

    if (ibv_post_recv(c->qp, &wr, &bad)) perf_die("ibv_post_recv: %s", strerror(errno));
}

/* The READ back of the data check: one READ at a time, each waited for,
 * so that it never competes with the measurement. */
void perf_read_back(struct perf_conn *c, uint64_t off, uint64_t len) {
    const uint64_t chunk = c->max_msg < (4u << 20) ? c->max_msg : (4u << 20);
    uint8_t *dst = c->aux + c->verify_off;

    for (uint64_t done = 0; done < len;) {
        uint64_t n = len - done < chunk ? len - done : chunk;
        struct ibv_wc wc;
        int err;

        ibv_wr_start(c->qpx);
        c->qpx->wr_id = UINT64_MAX;
        c->qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_read(c->qpx, c->target.rkey, c->target.addr + off + done);
        ibv_wr_set_sge(c->qpx, c->aux_mr->lkey, (uintptr_t)(dst + off + done), (uint32_t)n);
        err = ibv_wr_complete(c->qpx);
        if (err) perf_die("posting the READ of the data check: %s", strerror(err));
        perf_poll(c, &wc, 1, false);
        perf_check_wc(&wc, "the READ of the data check");
        if (wc.opcode != IBV_WC_RDMA_READ || wc.wr_id != UINT64_MAX)
            perf_die("unexpected completion during the data check (opcode %s, wr_id %llu)",
                     perf_wc_opcode_name(wc.opcode), (unsigned long long)wc.wr_id);
        done += n;
    }
}
