// SPDX-License-Identifier: MIT
//
// exit_busy: a program that ends without destroying anything while its
// device is busy, for test_exit_busy.sh.  Nothing a verbs library keeps for
// the life of the process may be torn down while the library's own threads
// (progress threads, the agent resumer) or the application's still use it.
//
//   exit_busy -d DEVICE [-g GIDIDX] [--mode exit|return|worker-exit] [--ms MS]
//
// It opens DEVICE, makes a PD, two RC QPs connected to each other (each with
// a CQ and MR of its own), an SRQ and a UD QP with receives posted, an XRC
// domain on a file and, when the device has an rdma_cm file, an open one.
// Then one thread per RC QP posts RDMA WRITEs and SENDs to the other as fast
// as its send queue allows, polling its CQ and reposting receives, while a
// third thread keeps allocating and freeing control objects (PDs,
// contexts, XRC domains, device lists, rdma_cm files).  MS milliseconds
// (default 20) after the first 256 completions, the program ends in the
// middle of it all:
//
//   exit         main() calls exit(0) (the default)
//   return       main() returns 0
//   worker-exit  the first posting thread calls exit(0) between two posts
//
// It prints "exit_busy: MODE after N completions" just before.  Exit status
// 0 then; 1 on a usage or setup error, 3 on a failed work completion or
// verb in a thread (which exits at once with _exit()).
//
// Besides the C library (the rdma_cm file is opened and closed as
// librdmacm does it), only standard libibverbs calls are used; it reaches
// sroce devices under `sroce exec`.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

enum { SQ_DEPTH = 64, RQ_DEPTH = 64, BATCH = 16, MSG = 512, SLOTS = 64 };
enum mode { MODE_EXIT, MODE_RETURN, MODE_WORKER_EXIT };

// One RC QP and what only its posting thread touches.
struct side {
    int index;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    // SLOTS send slots, SLOTS receive slots, then SLOTS that the peer's
    // WRITEs land in: no CPU touches them once the QPs run.
    uint8_t *buf;
    struct side *peer;
    pthread_t thread;
};

// Everything lives in static storage: whatever the program made is still
// reachable, from any thread, while exit() runs.
static struct {
    const char *dev_name;
    int gid_index;
    enum mode mode;
    int ms;
    struct ibv_device **list;
    struct ibv_device *dev;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    struct side side[2];
    struct ibv_cq *ud_cq;
    struct ibv_qp *ud_qp;
    struct ibv_srq *srq;
    struct ibv_mr *aux_mr;
    uint8_t *aux_buf;
    int xrcd_fd;
    struct ibv_xrcd *xrcd;
    int cm_fd;
    pthread_t churner;
    _Atomic uint64_t completions;
    _Atomic int exit_now;
} g;

static void fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("exit_busy: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    // Never exit(): the main thread may be running the exit handlers.
    _exit(status);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq, struct ibv_mr *mr, uint8_t *addr,
                      uint64_t id) {
    struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = MSG, .lkey = mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
    int rc = srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
    if (rc) fail(3, "post receive: %s", strerror(rc));
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what) {
    int rc = ibv_modify_qp(qp, a, mask);
    if (rc) fail(1, "modify QP to %s: %s", what, strerror(rc));
}

static void to_init(struct ibv_qp *qp, int ud) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (ud) {
        a.qkey = 0x11111111;
        mask |= IBV_QP_QKEY;
    } else {
        a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        mask |= IBV_QP_ACCESS_FLAGS;
    }
    modify(qp, &a, mask, "INIT");
}

// RC QP `s` to RTS, connected to its peer on the same device.
static void connect_rc(struct side *s) {
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = g.mtu,
        .dest_qp_num = s->peer->qp->qp_num,
        .rq_psn = 0,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 1,
        .ah_attr = {.is_global = 1, .port_num = 1},
    };
    a.ah_attr.grh.dgid = g.gid;
    a.ah_attr.grh.sgid_index = (uint8_t)g.gid_index;
    a.ah_attr.grh.hop_limit = 64;
    modify(s->qp, &a,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7; // a receiver that fell behind is waited for
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    modify(s->qp, &a,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
}

static void make_side(struct side *s) {
    size_t len = 3 * SLOTS * MSG;
    s->buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->buf == MAP_FAILED) fail(1, "mmap: %s", strerror(errno));
    s->mr = ibv_reg_mr(g.pd, s->buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!s->mr) fail(1, "ibv_reg_mr: %s", strerror(errno));
    s->cq = ibv_create_cq(g.ctx, SQ_DEPTH + RQ_DEPTH + 16, NULL, NULL, 0);
    if (!s->cq) fail(1, "ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = s->cq,
        .recv_cq = s->cq,
        .cap = {.max_send_wr = SQ_DEPTH,
                .max_recv_wr = RQ_DEPTH,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    s->qp = ibv_create_qp(g.pd, &ia);
    if (!s->qp) fail(1, "ibv_create_qp RC: %s", strerror(errno));
    to_init(s->qp, 0);
    for (int i = 0; i < RQ_DEPTH; i++)
        post_recv(s->qp, NULL, s->mr, s->buf + (SLOTS + i % SLOTS) * MSG, (uint64_t)i);
}

// The objects nobody posts to, left to the end like the rest.
static void make_idle_objects(void) {
    g.aux_buf = calloc(RQ_DEPTH, MSG);
    if (!g.aux_buf) fail(1, "out of memory");
    g.aux_mr = ibv_reg_mr(g.pd, g.aux_buf, RQ_DEPTH * MSG, IBV_ACCESS_LOCAL_WRITE);
    if (!g.aux_mr) fail(1, "ibv_reg_mr: %s", strerror(errno));
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = RQ_DEPTH, .max_sge = 1}};
    g.srq = ibv_create_srq(g.pd, &sa);
    if (!g.srq) fail(1, "ibv_create_srq: %s", strerror(errno));
    for (int i = 0; i < RQ_DEPTH / 2; i++)
        post_recv(NULL, g.srq, g.aux_mr, g.aux_buf + i * MSG, (uint64_t)i);

    g.ud_cq = ibv_create_cq(g.ctx, RQ_DEPTH, NULL, NULL, 0);
    if (!g.ud_cq) fail(1, "ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = g.ud_cq,
        .recv_cq = g.ud_cq,
        .cap = {.max_send_wr = 8,
                .max_recv_wr = RQ_DEPTH / 2,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_UD,
    };
    g.ud_qp = ibv_create_qp(g.pd, &ia);
    if (!g.ud_qp) fail(1, "ibv_create_qp UD: %s", strerror(errno));
    to_init(g.ud_qp, 1);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
    modify(g.ud_qp, &a, IBV_QP_STATE, "RTR");
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    modify(g.ud_qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
    for (int i = RQ_DEPTH / 2; i < RQ_DEPTH; i++)
        post_recv(g.ud_qp, NULL, g.aux_mr, g.aux_buf + i * MSG, (uint64_t)i);

    // An XRC domain on a file, which the process shares by the file's inode.
    g.xrcd_fd = memfd_create("exit_busy-xrcd", MFD_CLOEXEC);
    if (g.xrcd_fd < 0) fail(1, "memfd_create: %s", strerror(errno));
    struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                    .fd = g.xrcd_fd,
                                    .oflags = O_CREAT};
    g.xrcd = ibv_open_xrcd(g.ctx, &xa);
    if (!g.xrcd) fail(1, "ibv_open_xrcd: %s", strerror(errno));

    // What librdmacm opens, when the device has one.
    g.cm_fd = open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
    if (g.cm_fd < 0) printf("exit_busy: no rdma_cm file: %s\n", strerror(errno));
}

// Posts a WRITE and a SEND to the peer while the send queue has room, and
// reaps completions, reposting every receive that completed.
static void *poster(void *arg) {
    struct side *s = arg;
    uint32_t outstanding = 0, slot = 0;
    uint64_t deadline = g.mode == MODE_WORKER_EXIT && s->index == 0 ? UINT64_MAX : 0;
    for (;;) {
        while (outstanding + 2 <= SQ_DEPTH) {
            uint8_t *src = s->buf + slot * MSG;
            struct ibv_sge sge = {.addr = (uintptr_t)src, .length = MSG, .lkey = s->mr->lkey};
            struct ibv_send_wr send = {
                .wr_id = 2,
                .sg_list = &sge,
                .num_sge = 1,
                .opcode = IBV_WR_SEND,
                .send_flags = IBV_SEND_SIGNALED,
            };
            struct ibv_send_wr write = {
                .wr_id = 1,
                .next = &send,
                .sg_list = &sge,
                .num_sge = 1,
                .opcode = IBV_WR_RDMA_WRITE,
                .send_flags = IBV_SEND_SIGNALED,
                .wr.rdma = {.remote_addr = (uintptr_t)s->peer->buf + (2 * SLOTS + slot) * MSG,
                            .rkey = s->peer->mr->rkey},
            };
            struct ibv_send_wr *bad;
            int rc = ibv_post_send(s->qp, &write, &bad);
            if (rc) fail(3, "ibv_post_send: %s", strerror(rc));
            outstanding += 2;
            slot = (slot + 1) % SLOTS;
        }
        struct ibv_wc wc[BATCH];
        int n = ibv_poll_cq(s->cq, BATCH, wc);
        if (n < 0) fail(3, "ibv_poll_cq: %d", n);
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                fail(3, "QP %u: work completion %s (opcode %d)", s->qp->qp_num,
                     ibv_wc_status_str(wc[i].status), (int)wc[i].opcode);
            if (wc[i].opcode & IBV_WC_RECV) {
                uint64_t id = wc[i].wr_id;
                post_recv(s->qp, NULL, s->mr, s->buf + (SLOTS + id % SLOTS) * MSG, id);
            } else {
                outstanding--;
                atomic_fetch_add(&g.completions, 1);
            }
        }
        if (deadline && atomic_load(&g.exit_now)) {
            if (deadline == UINT64_MAX) deadline = now_ms() + (uint64_t)g.ms;
            if (now_ms() >= deadline) {
                printf("exit_busy: worker-exit after %llu completions\n",
                       (unsigned long long)atomic_load(&g.completions));
                exit(0);
            }
        }
    }
    return NULL;
}

// Control-path verbs in a loop: each takes and gives back what the library
// keeps for the whole process (device list, contexts, PD handles, XRC
// domains by file, rdma_cm files).  Not ibv_reg_mr(): sroce asks libpmem
// about the memory, and libpmem's own destructor (a lock it destroys) runs
// at exit like any other library's.
static void *churner(void *arg) {
    (void)arg;
    for (unsigned i = 0;; i++) {
        struct ibv_pd *pd = ibv_alloc_pd(g.ctx);
        if (!pd) fail(3, "ibv_alloc_pd: %s", strerror(errno));
        int rc = ibv_dealloc_pd(pd);
        if (rc) fail(3, "ibv_dealloc_pd: %s", strerror(rc));

        struct ibv_xrcd_init_attr xa = {.comp_mask =
                                            IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                        .fd = g.xrcd_fd,
                                        .oflags = O_CREAT};
        struct ibv_xrcd *x = ibv_open_xrcd(g.ctx, &xa);
        if (!x) fail(3, "ibv_open_xrcd: %s", strerror(errno));
        rc = ibv_close_xrcd(x);
        if (rc) fail(3, "ibv_close_xrcd: %s", strerror(rc));

        int n;
        struct ibv_device **list = ibv_get_device_list(&n);
        if (!list) fail(3, "ibv_get_device_list: %s", strerror(errno));
        ibv_free_device_list(list);

        if (i % 8 == 0) {
            struct ibv_context *c = ibv_open_device(g.dev);
            if (!c) fail(3, "ibv_open_device: %s", strerror(errno));
            rc = ibv_close_device(c);
            if (rc) fail(3, "ibv_close_device: %s", strerror(rc));
        }
        if (g.cm_fd >= 0 && i % 32 == 0) {
            int fd = open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
            if (fd < 0) fail(3, "open rdma_cm: %s", strerror(errno));
            close(fd);
        }
    }
    return NULL;
}

static void usage(void) {
    fprintf(stderr, "usage: exit_busy -d DEVICE [-g GIDIDX] [--mode exit|return|worker-exit] "
                    "[--ms MS]\n");
    exit(1);
}

static void parse(int argc, char **argv) {
    static const struct option longs[] = {
        {"mode", required_argument, NULL, 'm'},
        {"ms", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0},
    };
    g.gid_index = 1;
    g.ms = 20;
    int c;
    while ((c = getopt_long(argc, argv, "d:g:", longs, NULL)) != -1) {
        switch (c) {
        case 'd':
            g.dev_name = optarg;
            break;
        case 'g':
            g.gid_index = atoi(optarg);
            break;
        case 'm':
            if (!strcmp(optarg, "exit"))
                g.mode = MODE_EXIT;
            else if (!strcmp(optarg, "return"))
                g.mode = MODE_RETURN;
            else if (!strcmp(optarg, "worker-exit"))
                g.mode = MODE_WORKER_EXIT;
            else
                usage();
            break;
        case 't':
            g.ms = atoi(optarg);
            break;
        default:
            usage();
        }
    }
    if (!g.dev_name || optind != argc || g.ms < 0) usage();
}

int main(int argc, char **argv) {
    parse(argc, argv);
    int n;
    // The list stays: its device is opened again by the churner.
    g.list = ibv_get_device_list(&n);
    if (!g.list) fail(1, "ibv_get_device_list: %s", strerror(errno));
    for (int i = 0; i < n && !g.dev; i++)
        if (!strcmp(ibv_get_device_name(g.list[i]), g.dev_name)) g.dev = g.list[i];
    if (!g.dev) fail(1, "device %s not found", g.dev_name);
    g.ctx = ibv_open_device(g.dev);
    if (!g.ctx) fail(1, "ibv_open_device %s: %s", g.dev_name, strerror(errno));
    struct ibv_port_attr pa;
    if (ibv_query_port(g.ctx, 1, &pa)) fail(1, "ibv_query_port: %s", strerror(errno));
    g.mtu = pa.active_mtu;
    if (ibv_query_gid(g.ctx, 1, g.gid_index, &g.gid))
        fail(1, "ibv_query_gid %d: %s", g.gid_index, strerror(errno));
    g.pd = ibv_alloc_pd(g.ctx);
    if (!g.pd) fail(1, "ibv_alloc_pd: %s", strerror(errno));

    for (int i = 0; i < 2; i++) {
        g.side[i].index = i;
        g.side[i].peer = &g.side[1 - i];
        make_side(&g.side[i]);
    }
    for (int i = 0; i < 2; i++)
        connect_rc(&g.side[i]);
    make_idle_objects();

    for (int i = 0; i < 2; i++) {
        int rc = pthread_create(&g.side[i].thread, NULL, poster, &g.side[i]);
        if (rc) fail(1, "pthread_create: %s", strerror(rc));
    }
    int rc = pthread_create(&g.churner, NULL, churner, NULL);
    if (rc) fail(1, "pthread_create: %s", strerror(rc));

    // The clock starts once both directions carry traffic.
    uint64_t give_up = now_ms() + 30000;
    while (atomic_load(&g.completions) < 256) {
        if (now_ms() > give_up)
            fail(1, "no traffic: %llu completions in 30 s",
                 (unsigned long long)atomic_load(&g.completions));
        usleep(1000);
    }
    if (g.mode == MODE_WORKER_EXIT) {
        atomic_store(&g.exit_now, 1);
        pthread_join(g.side[0].thread, NULL);
        fail(1, "the posting thread returned");
    }
    usleep((useconds_t)g.ms * 1000);
    printf("exit_busy: %s after %llu completions\n", g.mode == MODE_EXIT ? "exit" : "return",
           (unsigned long long)atomic_load(&g.completions));
    if (g.mode == MODE_EXIT) exit(0);
    return 0;
}
