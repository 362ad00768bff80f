// SPDX-License-Identifier: MIT
//
// a19_check: the RDMA operations of IBTA 1.5 Annex A19 - FLUSH and ATOMIC
// WRITE - between two RC endpoints connected with rdma_cm, every completion
// and every byte checked.  It uses libibverbs' extended posting API
// (ibv_wr_*) and <infiniband/verbs_ext.h> only, so it runs against any
// device whose provider posts them: sroce under `sroce exec`, Linux rxe
// with rdma-core >= 45 (ATOMIC WRITE from rdma-core 44).
//
//   server: a19_check --server [-a ADDR] [-p PORT] [--pmem FILE --size N]
//                     [--connections N]
//   client: a19_check [-p PORT] [--case CASE] SERVER
//
// The server registers three regions and hands them to each client in the
// connection's private data: A, the target (FILE mapped - a device DAX, an
// NVDIMM-backed file - with global and persistent FLUSH access, else memory
// with global FLUSH access only), B without FLUSH access, C with global
// FLUSH access only.  The QP's FLUSH access comes from the connection
// manager, which grants the placement types the device executes (Linux from
// 6.2 on, or with rxe-patches/; sroce's agent).
//
// Client cases:
//   ops (default)  (what the local provider can post of it) for each
//                  placement type A has (global; persistent) and
//                  each selectivity level (range; MR): WRITE a pattern,
//                  FLUSH, READ it back; then ATOMIC WRITE an 8-byte value,
//                  READ it back.  FLUSH completes IBV_WC_FLUSH, ATOMIC WRITE
//                  IBV_WC_ATOMIC_WRITE.
//   no-flush-access     FLUSH of B                -> IBV_WC_REM_ACCESS_ERR
//   no-persistent-access  persistent FLUSH of C   -> IBV_WC_REM_ACCESS_ERR
//   misaligned-atomic-write  ATOMIC WRITE at A+4  -> IBV_WC_REM_INV_REQ_ERR
//   commit         native write-commits into A (persistent when A is, else
//                  global visibility): plain, ORDERED, with immediate data,
//                  one packet and several; each completes
//                  IBV_WC_RDMA_WRITE_COMMIT with byte_len L and is read
//                  back.  The server reports the immediate data it received
//                  ("N immediate completions"), each with byte_len 0.
//   commit-no-access       write-commit to B        -> IBV_WC_REM_ACCESS_ERR
//   commit-global-only     persistent write-commit to C -> IBV_WC_REM_ACCESS_ERR
//   commit-refused  the QP forgets what ECE agreed (ibv_set_ece with no
//                  options), then write-commits a pattern over one a plain
//                  WRITE put there: a device whose commits reach any peer
//                  (sroce) sends the IBTA sequence, read back; a kernel
//                  device with native write-commits only must refuse it -
//                  ibv_wr_complete() EOPNOTSUPP, nothing of the batch sent
//                  (the first pattern reads back), the QP still usable.
// The commit cases print whether the connection's ECE exchange agreed on
// native write-commits ("ECE: native write-commits" or "ECE: IBTA
// sequences"); --declare-native declares the server native instead
// (ibv_qp_set_commit_peer), for a server whose side takes no part in ECE.
// They need sroce's libibverbs extension: `sroce exec` with sroce, or
// libsroce.so preloaded with a kernel rxe that rxe-patches/ gave
// write-commits (the commit_caps file of its sysfs directory); a kernel
// device can post write-commits to a native peer only.  The server needs it
// too to take part in ECE.
//
// Exit status: 0 success, 1 usage or setup error, 2 data mismatch, 3 wrong
// completion, 77 the local provider cannot post an operation the case needs.

#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>
#include <rdma/rdma_cma.h>

#include "perf_common.h" // perf_ext_*: the write-commit verbs, found at run time

enum { EXIT_SETUP = 1, EXIT_MISMATCH = 2, EXIT_WC = 3, EXIT_UNSUPPORTED = 77 };
enum { REGION_LEN = 64 * 1024, WC_WAIT_MS = 20000, SERVER_RECVS = 4 };

// What the server gives each client (private data of the ACCEPT, little
// endian on the wire).
struct regions {
    uint64_t addr_a, addr_b, addr_c;
    uint32_t rkey_a, rkey_b, rkey_c;
    uint32_t len;
    uint32_t persistent; // A takes persistent FLUSHes
};

static const char *role = "a19_check";

static void die(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(status);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

// The next event on the channel, which must be `want`.
static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch,
                                          enum rdma_cm_event_type want) {
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev)) die(EXIT_SETUP, "rdma_get_cm_event: %s", strerror(errno));
    if (ev->event != want)
        die(EXIT_SETUP, "rdma_cm: %s (status %d), expected %s", rdma_event_str(ev->event),
            ev->status, rdma_event_str(want));
    return ev;
}

static uint64_t device_caps(struct ibv_context *ctx) {
    struct ibv_device_attr_ex attr;
    memset(&attr, 0, sizeof(attr));
    if (ibv_query_device_ex(ctx, NULL, &attr))
        die(EXIT_SETUP, "ibv_query_device_ex: %s", strerror(errno));
    return attr.device_cap_flags_ex;
}

// The FLUSH access flags of the placement types the device executes.
static int device_flush_access(struct ibv_context *ctx) {
    uint64_t caps = device_caps(ctx);
    return ((caps & IB_UVERBS_DEVICE_FLUSH_GLOBAL) ? IBV_ACCESS_FLUSH_GLOBAL : 0) |
           ((caps & IB_UVERBS_DEVICE_FLUSH_PERSISTENT) ? IBV_ACCESS_FLUSH_PERSISTENT : 0);
}

static void *alloc_region(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die(EXIT_SETUP, "mmap: %s", strerror(errno));
    memset(p, 0, len);
    return p;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len, int access, const char *what) {
    struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
    if (!mr) die(EXIT_SETUP, "ibv_reg_mr (%s, access %#x): %s", what, access, strerror(errno));
    return mr;
}

// --- server ----------------------------------------------------------------

static void run_server(const char *addr, const char *port, const char *pmem, size_t pmem_size,
                       int connections) {
    role = "a19_check server";
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) die(EXIT_SETUP, "rdma_create_event_channel: %s", strerror(errno));
    struct rdma_cm_id *listener;
    if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
        die(EXIT_SETUP, "rdma_create_id: %s", strerror(errno));
    struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP}, *ai;
    if (rdma_getaddrinfo(addr, port, &hints, &ai))
        die(EXIT_SETUP, "rdma_getaddrinfo %s:%s: %s", addr ? addr : "*", port, strerror(errno));
    if (rdma_bind_addr(listener, ai->ai_src_addr) || rdma_listen(listener, 4))
        die(EXIT_SETUP, "rdma_bind_addr/listen: %s", strerror(errno));
    rdma_freeaddrinfo(ai);
    printf("%s: listening on port %s\n", role, port);
    fflush(stdout);

    for (int n = 0; n < connections; n++) {
        struct rdma_cm_event *ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
        struct rdma_cm_id *id = ev->id;
        rdma_ack_cm_event(ev);
        struct ibv_context *ctx = id->verbs;
        int flush = device_flush_access(ctx); // the region's: the QP's is the CM's
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        if (!pd) die(EXIT_SETUP, "ibv_alloc_pd: %s", strerror(errno));

        const int plain = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        size_t len_a = REGION_LEN;
        void *a;
        bool persistent = false;
        if (pmem) {
            int fd = open(pmem, O_RDWR);
            if (fd < 0) die(EXIT_SETUP, "%s: %s", pmem, strerror(errno));
            len_a = pmem_size;
            a = mmap(NULL, len_a, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (a == MAP_FAILED) die(EXIT_SETUP, "mmap %s: %s", pmem, strerror(errno));
            close(fd);
            persistent = flush & IBV_ACCESS_FLUSH_PERSISTENT;
        } else {
            a = alloc_region(len_a);
        }
        int access_a = plain | (flush & (persistent ? ~0 : IBV_ACCESS_FLUSH_GLOBAL));
        struct ibv_mr *mr_a = reg(pd, a, len_a, access_a, "A");
        struct ibv_mr *mr_b = reg(pd, alloc_region(REGION_LEN), REGION_LEN, plain, "B");
        struct ibv_mr *mr_c = reg(pd, alloc_region(REGION_LEN), REGION_LEN,
                                  plain | (flush & IBV_ACCESS_FLUSH_GLOBAL), "C");

        struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        if (!cq) die(EXIT_SETUP, "ibv_create_cq: %s", strerror(errno));
        struct ibv_qp_init_attr qa = {.send_cq = cq,
                                      .recv_cq = cq,
                                      .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 4,
                                              .max_recv_wr = SERVER_RECVS,
                                              .max_send_sge = 1,
                                              .max_recv_sge = 1}};
        if (rdma_create_qp(id, pd, &qa)) die(EXIT_SETUP, "rdma_create_qp: %s", strerror(errno));
        // For write-commits with immediate data: empty receives.
        for (int i = 0; i < SERVER_RECVS; i++) {
            struct ibv_recv_wr rw = {.wr_id = (uint64_t)i}, *bad;
            if (ibv_post_recv(id->qp, &rw, &bad))
                die(EXIT_SETUP, "ibv_post_recv: %s", strerror(errno));
        }
        struct regions r = {.addr_a = htole64((uintptr_t)a),
                            .addr_b = htole64((uintptr_t)mr_b->addr),
                            .addr_c = htole64((uintptr_t)mr_c->addr),
                            .rkey_a = htole32(mr_a->rkey),
                            .rkey_b = htole32(mr_b->rkey),
                            .rkey_c = htole32(mr_c->rkey),
                            .len = htole32((uint32_t)(len_a < REGION_LEN ? len_a : REGION_LEN)),
                            .persistent = htole32(persistent)};
        struct rdma_conn_param cp = {.private_data = &r,
                                     .private_data_len = sizeof(r),
                                     .responder_resources = 4,
                                     .initiator_depth = 4};
        if (rdma_accept(id, &cp)) die(EXIT_SETUP, "rdma_accept: %s", strerror(errno));
        printf("%s: connection %d: region A %s%s\n", role, n + 1, pmem ? pmem : "memory",
               persistent ? " (persistent FLUSH)" : "");
        fflush(stdout);
        // A short client may be done and gone before its RTU reaches this
        // side (late or lost, it is not retransmitted once the peer leaves):
        // the disconnect can come without the ESTABLISHED before it.
        if (rdma_get_cm_event(ch, &ev)) die(EXIT_SETUP, "rdma_get_cm_event: %s", strerror(errno));
        if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
            rdma_ack_cm_event(ev);
            ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
        } else if (ev->event != RDMA_CM_EVENT_DISCONNECTED) {
            die(EXIT_SETUP, "rdma_cm: %s (status %d) on an accepted connection",
                rdma_event_str(ev->event), ev->status);
        }
        rdma_ack_cm_event(ev);
        // Immediate data of write-commits; the disconnect flushes the rest.
        struct ibv_wc wc[SERVER_RECVS];
        int got = ibv_poll_cq(cq, SERVER_RECVS, wc), imms = 0;
        for (int i = 0; i < got; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) continue;
            if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc[i].wc_flags & IBV_WC_WITH_IMM) ||
                wc[i].byte_len != 0)
                die(EXIT_WC, "receive completion: opcode %d, flags %#x, byte_len %u", wc[i].opcode,
                    wc[i].wc_flags, wc[i].byte_len);
            printf("%s: immediate data %#x, byte_len 0\n", role, be32toh(wc[i].imm_data));
            imms++;
        }
        if (imms) printf("%s: connection %d: %d immediate completions\n", role, n + 1, imms);
        fflush(stdout);
        rdma_destroy_qp(id);
        ibv_destroy_cq(cq);
        ibv_dereg_mr(mr_a);
        ibv_dereg_mr(mr_b);
        ibv_dereg_mr(mr_c);
        ibv_dealloc_pd(pd);
        rdma_destroy_id(id);
        if (pmem) munmap(a, len_a);
    }
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
}

// --- client ----------------------------------------------------------------

struct client {
    struct rdma_cm_id *id;
    struct ibv_qp_ex *qpx;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *buf; // 2 x REGION_LEN: what is written, what is read back
    struct regions r;
    bool can_flush, can_atomic_write;
};

static struct ibv_wc wait_wc(struct client *c, uint64_t wr_id) {
    struct ibv_wc wc;
    uint64_t end = now_ms() + WC_WAIT_MS;
    for (;;) {
        int n = ibv_poll_cq(c->cq, 1, &wc);
        if (n < 0) die(EXIT_SETUP, "ibv_poll_cq: %d", n);
        if (n == 1) break;
        if (now_ms() > end) die(EXIT_WC, "no completion for work request %" PRIu64, wr_id);
    }
    if (wc.wr_id != wr_id)
        die(EXIT_WC, "completion of work request %" PRIu64 ", expected %" PRIu64, wc.wr_id, wr_id);
    return wc;
}

// Posts the one work request `post` adds and returns its completion.
#define POST(c, id, ...)                                                                           \
    ({                                                                                             \
        uint64_t post_id_ = (id);                                                                  \
        ibv_wr_start((c)->qpx);                                                                    \
        (c)->qpx->wr_id = post_id_;                                                                \
        (c)->qpx->wr_flags = IBV_SEND_SIGNALED;                                                    \
        __VA_ARGS__;                                                                               \
        if (ibv_wr_complete((c)->qpx))                                                             \
            die(EXIT_SETUP, "ibv_wr_complete (work request %" PRIu64 "): %s", post_id_,            \
                strerror(errno));                                                                  \
        wait_wc((c), post_id_);                                                                    \
    })

static void expect_wc(const struct ibv_wc *wc, enum ibv_wc_status status, enum ibv_wc_opcode op,
                      const char *what) {
    if (wc->status != status)
        die(EXIT_WC, "%s: completion status %s (%d), expected %s", what,
            ibv_wc_status_str(wc->status), wc->status, ibv_wc_status_str(status));
    if (status == IBV_WC_SUCCESS && wc->opcode != op)
        die(EXIT_WC, "%s: completion opcode %d, expected %d", what, wc->opcode, op);
}

static void fill(uint8_t *p, size_t len, uint64_t seed) {
    for (size_t i = 0; i < len; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 56);
    }
}

static void connect_client(struct client *c, const char *host, const char *port) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) die(EXIT_SETUP, "rdma_create_event_channel: %s", strerror(errno));
    if (rdma_create_id(ch, &c->id, NULL, RDMA_PS_TCP))
        die(EXIT_SETUP, "rdma_create_id: %s", strerror(errno));
    struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *ai;
    if (rdma_getaddrinfo(host, port, &hints, &ai))
        die(EXIT_SETUP, "rdma_getaddrinfo %s:%s: %s", host, port, strerror(errno));
    if (rdma_resolve_addr(c->id, NULL, ai->ai_dst_addr, 5000))
        die(EXIT_SETUP, "rdma_resolve_addr: %s", strerror(errno));
    rdma_freeaddrinfo(ai);
    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(c->id, 5000)) die(EXIT_SETUP, "rdma_resolve_route: %s", strerror(errno));
    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));

    struct ibv_context *ctx = c->id->verbs;
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (!pd) die(EXIT_SETUP, "ibv_alloc_pd: %s", strerror(errno));
    c->buf = alloc_region(2 * REGION_LEN);
    c->mr = reg(pd, c->buf, 2 * REGION_LEN, IBV_ACCESS_LOCAL_WRITE, "local");
    c->cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (!c->cq) die(EXIT_SETUP, "ibv_create_cq: %s", strerror(errno));
    // Ask for FLUSH, ATOMIC WRITE and write-commit; a provider that cannot
    // post one refuses the QP, so ask again without it (rdma-core 44's rxe:
    // no FLUSH, but write-commit with rxe-patches/ and libsroce.so).
    static const uint64_t tries[] = {IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE |
                                         IBV_QP_EX_WITH_RDMA_WRITE_COMMIT,
                                     IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE,
                                     IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_COMMIT,
                                     IBV_QP_EX_WITH_ATOMIC_WRITE, 0};
    int err = 0;
    for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
        struct ibv_qp_init_attr_ex qa = {
            .send_cq = c->cq,
            .recv_cq = c->cq,
            .qp_type = IBV_QPT_RC,
            .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            .pd = pd,
            .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | tries[i]};
        if (rdma_create_qp_ex(c->id, &qa) == 0) {
            c->can_flush = tries[i] & IBV_QP_EX_WITH_FLUSH;
            c->can_atomic_write = tries[i] & IBV_QP_EX_WITH_ATOMIC_WRITE;
            err = 0;
            break;
        }
        err = errno;
    }
    if (err || !c->id->qp) die(EXIT_SETUP, "rdma_create_qp_ex: %s", strerror(err));
    c->qpx = ibv_qp_to_qp_ex(c->id->qp);
    if (!c->qpx) die(EXIT_SETUP, "ibv_qp_to_qp_ex: no extended QP");

    struct rdma_conn_param cp = {
        .responder_resources = 4, .initiator_depth = 4, .retry_count = 7, .rnr_retry_count = 7};
    if (rdma_connect(c->id, &cp)) die(EXIT_SETUP, "rdma_connect: %s", strerror(errno));
    struct rdma_cm_event *ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
    if (ev->param.conn.private_data_len < sizeof(struct regions))
        die(EXIT_SETUP, "the server sent %u bytes of private data, not its regions",
            ev->param.conn.private_data_len);
    memcpy(&c->r, ev->param.conn.private_data, sizeof(c->r));
    rdma_ack_cm_event(ev);
    c->r.addr_a = le64toh(c->r.addr_a);
    c->r.addr_b = le64toh(c->r.addr_b);
    c->r.addr_c = le64toh(c->r.addr_c);
    c->r.rkey_a = le32toh(c->r.rkey_a);
    c->r.rkey_b = le32toh(c->r.rkey_b);
    c->r.rkey_c = le32toh(c->r.rkey_c);
    c->r.len = le32toh(c->r.len);
    c->r.persistent = le32toh(c->r.persistent);
    if (c->r.len < 4096) die(EXIT_SETUP, "the server's region A is only %u bytes", c->r.len);
}

static void need(bool have, const char *what) {
    if (!have) {
        printf("%s: this provider cannot post %s: skipped\n", role, what);
        exit(EXIT_UNSUPPORTED);
    }
}

// READs [off, off + len) of A back and compares it with what was written.
static void read_back(struct client *c, uint64_t *wr, uint32_t off, uint32_t len,
                      const char *what) {
    uint8_t *got = c->buf + REGION_LEN;
    memset(got, 0xA5, len);
    struct ibv_wc wc = POST(c, ++*wr, ibv_wr_rdma_read(c->qpx, c->r.rkey_a, c->r.addr_a + off);
                            ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)got, len));
    expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "READ");
    if (memcmp(got, c->buf + off, len)) {
        for (uint32_t i = 0; i < len; i++)
            if (got[i] != c->buf[off + i])
                die(EXIT_MISMATCH, "%s: byte %u of A reads %#x, written %#x", what, off + i, got[i],
                    c->buf[off + i]);
    }
}

static void case_ops(struct client *c) {
    if (!c->can_flush && !c->can_atomic_write) need(false, "FLUSH or ATOMIC WRITE");
    uint64_t wr = 0;
    int checks = 0;
    if (!c->can_flush)
        printf("%s: this provider cannot post FLUSH (rdma-core >= 45 posts it): "
               "ATOMIC WRITE only\n",
               role);
    for (int t = 0; c->can_flush && t < 2; t++) {
        uint8_t type = t ? IBV_FLUSH_PERSISTENT : IBV_FLUSH_GLOBAL;
        if (type == IBV_FLUSH_PERSISTENT && !c->r.persistent) {
            printf("%s: region A takes no persistent FLUSH: global only\n", role);
            break;
        }
        for (uint8_t level = IBV_FLUSH_RANGE; level <= IBV_FLUSH_MR; level++) {
            char what[64];
            snprintf(what, sizeof(what), "FLUSH %s %s", t ? "persistent" : "global",
                     level == IBV_FLUSH_MR ? "MR" : "range");
            uint32_t off = 512u * (uint32_t)(2 * t + level), len = 3000;
            fill(c->buf + off, len, wr + 77);
            struct ibv_wc wc =
                POST(c, ++wr, ibv_wr_rdma_write(c->qpx, c->r.rkey_a, c->r.addr_a + off);
                     ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)(c->buf + off), len));
            expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE");
            wc = POST(c, ++wr,
                      ibv_wr_flush(c->qpx, c->r.rkey_a, c->r.addr_a + off, len, type, level));
            expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_FLUSH, what);
            read_back(c, &wr, off, len, what);
            printf("%s: %s: IBV_WC_FLUSH, %u bytes read back intact\n", role, what, len);
            checks++;
        }
    }
    if (!c->can_atomic_write) {
        printf("%s: this provider cannot post ATOMIC WRITE: skipped\n", role);
        printf("%s: ops: %d FLUSH kinds checked\n", role, checks);
        return;
    }
    uint32_t off = 8192;
    fill(c->buf + off, 8, 0xA19);
    struct ibv_wc wc =
        POST(c, ++wr, ibv_wr_atomic_write(c->qpx, c->r.rkey_a, c->r.addr_a + off, c->buf + off));
    expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE, "ATOMIC WRITE");
    read_back(c, &wr, off, 8, "ATOMIC WRITE");
    printf("%s: ATOMIC WRITE: IBV_WC_ATOMIC_WRITE, 8 bytes read back intact\n", role);
    printf("%s: ops: %d FLUSH kinds and ATOMIC WRITE checked\n", role, checks);
}

// A native write-commit of A's [off, off + len) with `flags`, read back.
static void commit_one(struct client *c, uint64_t *wr, uint32_t off, uint32_t len, uint32_t flags,
                       bool imm, const char *what) {
    const struct ibv_qp_commit_ops *ops = perf_ext_commit_ops(c->qpx);
    if (!ops) need(false, "write-commit");
    fill(c->buf + off, len, *wr + 991);
    struct ibv_wc wc =
        POST(c, ++*wr,
             imm ? ops->wr_rdma_write_commit_imm(c->qpx, c->r.rkey_a, c->r.addr_a + off, flags,
                                                 htobe32(0xC0DE0000u + off))
                 : ops->wr_rdma_write_commit(c->qpx, c->r.rkey_a, c->r.addr_a + off, flags);
             ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)(c->buf + off), len));
    expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE_COMMIT, what);
    if (wc.byte_len != len) die(EXIT_WC, "%s: byte_len %u, expected %u", what, wc.byte_len, len);
    read_back(c, wr, off, len, what);
    printf("%s: %s: IBV_WC_RDMA_WRITE_COMMIT, %u bytes read back intact\n", role, what, len);
}

static bool declare = false; // --declare-native

// The peer's native write-commits: agreed in ECE, or declared.
static void declare_native(struct client *c) {
    if (!perf_ext_present())
        need(false, "write-commit (no libibverbs extension: run under sroce exec)");
    if (!declare) {
        struct ibv_ece ece = {0};
        int err = ibv_query_ece(c->id->qp, &ece);
        bool native = !err && ibv_commit_ece_native(&ece);
        printf("%s: ECE: %s (vendor ID %#x, options %#x)\n", role,
               native ? "native write-commits" : "IBTA sequences", err ? 0 : ece.vendor_id,
               err ? 0 : ece.options);
        return;
    }
    int err = perf_ext_set_commit_peer(c->id->qp, IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED |
                                                      IBV_COMMIT_CAP_IMMED);
    if (err) die(EXIT_SETUP, "ibv_qp_set_commit_peer: %s", strerror(err));
    printf("%s: the server declared native\n", role);
}

static void case_commit(struct client *c) {
    declare_native(c);
    uint32_t global = c->r.persistent ? 0 : IBV_WRITE_COMMIT_GLOBAL;
    uint64_t wr = 0;
    commit_one(c, &wr, 16384, 200, global, false, "commit, one packet");
    commit_one(c, &wr, 20480, 5000, global, false, "commit, several packets");
    commit_one(c, &wr, 28672, 300, global | IBV_WRITE_COMMIT_ORDERED, false, "ordered commit");
    commit_one(c, &wr, 32768, 100, global, true, "commit with immediate data");
    commit_one(c, &wr, 36864, 6000, global | IBV_WRITE_COMMIT_ORDERED, true,
               "ordered commit with immediate data, several packets");
    printf("%s: commit: 5 write-commits (%s) checked\n", role,
           global ? "global visibility" : "persistent");
}

static void case_commit_error(struct client *c, uint32_t rkey, uint64_t addr, const char *what) {
    declare_native(c);
    const struct ibv_qp_commit_ops *ops = perf_ext_commit_ops(c->qpx);
    if (!ops) need(false, "write-commit");
    struct ibv_wc wc = POST(c, 1, ops->wr_rdma_write_commit(c->qpx, rkey, addr, 0);
                            ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)c->buf, 64));
    expect_wc(&wc, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE_COMMIT, what);
}

static void case_commit_refused(struct client *c) {
    struct ibv_commit_caps caps = {0};
    const struct ibv_qp_commit_ops *ops = perf_ext_commit_ops(c->qpx);
    if (!ops || perf_ext_query_commit_caps(c->id->verbs, &caps)) need(false, "write-commit");
    declare_native(c); // what ECE agreed, before it is forgotten
    struct ibv_ece none = {.vendor_id = IBV_COMMIT_ECE_VENDOR_ID};
    if (ibv_set_ece(c->id->qp, &none)) die(EXIT_SETUP, "ibv_set_ece: %s", strerror(errno));
    const uint32_t off = 40960, len = 3000;
    uint64_t wr = 0;
    uint32_t global = c->r.persistent ? 0 : IBV_WRITE_COMMIT_GLOBAL;
    fill(c->buf + off, len, 77);
    struct ibv_wc wc = POST(c, ++wr, ibv_wr_rdma_write(c->qpx, c->r.rkey_a, c->r.addr_a + off);
                            ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)(c->buf + off), len));
    expect_wc(&wc, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "plain WRITE");
    if (caps.flags & IBV_COMMIT_CAP_ANY_PEER) {
        commit_one(c, &wr, off, len, global, false, "commit-refused");
        printf("%s: commit-refused: IBTA sequences, %u bytes read back intact\n", role, len);
        return;
    }
    uint8_t first[3000];
    memcpy(first, c->buf + off, len);
    fill(c->buf + off, len, 78);
    ibv_wr_start(c->qpx);
    c->qpx->wr_id = ++wr;
    c->qpx->wr_flags = IBV_SEND_SIGNALED;
    ops->wr_rdma_write_commit(c->qpx, c->r.rkey_a, c->r.addr_a + off, global);
    ibv_wr_set_sge(c->qpx, c->mr->lkey, (uintptr_t)(c->buf + off), len);
    int err = ibv_wr_complete(c->qpx);
    if (err != EOPNOTSUPP)
        die(EXIT_WC, "commit-refused: ibv_wr_complete returned %d (%s), expected EOPNOTSUPP", err,
            strerror(err));
    memcpy(c->buf + off, first, len);
    read_back(c, &wr, off, len, "commit-refused");
    printf("%s: commit-refused: ibv_wr_complete EOPNOTSUPP, nothing posted, the QP goes on\n",
           role);
}

static void case_error(struct client *c, const char *name) {
    struct ibv_wc wc;
    if (!strcmp(name, "no-flush-access")) {
        need(c->can_flush, "FLUSH (rdma-core >= 45 posts it)");
        wc = POST(
            c, 1,
            ibv_wr_flush(c->qpx, c->r.rkey_b, c->r.addr_b, 64, IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE));
        expect_wc(&wc, IBV_WC_REM_ACCESS_ERR, IBV_WC_FLUSH,
                  "FLUSH of a region without FLUSH access");
    } else if (!strcmp(name, "no-persistent-access")) {
        need(c->can_flush, "FLUSH (rdma-core >= 45 posts it)");
        wc = POST(c, 1,
                  ibv_wr_flush(c->qpx, c->r.rkey_c, c->r.addr_c, 64, IBV_FLUSH_PERSISTENT,
                               IBV_FLUSH_RANGE));
        expect_wc(&wc, IBV_WC_REM_ACCESS_ERR, IBV_WC_FLUSH,
                  "persistent FLUSH of a region registered for global visibility only");
    } else if (!strcmp(name, "commit-no-access")) {
        case_commit_error(c, c->r.rkey_b, c->r.addr_b,
                          "write-commit to a region without FLUSH access");
        wc.status = IBV_WC_REM_ACCESS_ERR;
    } else if (!strcmp(name, "commit-global-only")) {
        case_commit_error(c, c->r.rkey_c, c->r.addr_c,
                          "persistent write-commit to a region registered for global visibility");
        wc.status = IBV_WC_REM_ACCESS_ERR;
    } else if (!strcmp(name, "misaligned-atomic-write")) {
        need(c->can_atomic_write, "ATOMIC WRITE");
        fill(c->buf, 8, 5);
        wc = POST(c, 1, ibv_wr_atomic_write(c->qpx, c->r.rkey_a, c->r.addr_a + 4, c->buf));
        expect_wc(&wc, IBV_WC_REM_INV_REQ_ERR, IBV_WC_ATOMIC_WRITE, "misaligned ATOMIC WRITE");
    } else {
        die(EXIT_SETUP, "unknown case '%s'", name);
    }
    printf("%s: %s: %s as expected\n", role, name, ibv_wc_status_str(wc.status));
}

static void usage(FILE *f) {
    fprintf(f, "usage: a19_check --server [-a ADDR] [-p PORT] [--pmem FILE --size BYTES] "
               "[--connections N]\n"
               "       a19_check [-p PORT] [--case ops|no-flush-access|no-persistent-access|"
               "misaligned-atomic-write|commit|commit-no-access|commit-global-only|"
               "commit-refused] "
               "[--declare-native] SERVER\n");
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"server", no_argument, NULL, 's'},     {"port", required_argument, NULL, 'p'},
        {"addr", required_argument, NULL, 'a'}, {"pmem", required_argument, NULL, 'm'},
        {"size", required_argument, NULL, 'z'}, {"connections", required_argument, NULL, 'n'},
        {"case", required_argument, NULL, 'c'}, {"declare-native", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0}};
    bool server = false;
    const char *port = "18515", *addr = NULL, *pmem = NULL, *cname = "ops";
    size_t size = 0;
    int connections = 1, o;
    while ((o = getopt_long(argc, argv, "sp:a:c:h", longopts, NULL)) != -1) {
        switch (o) {
        case 's':
            server = true;
            break;
        case 'p':
            port = optarg;
            break;
        case 'a':
            addr = optarg;
            break;
        case 'm':
            pmem = optarg;
            break;
        case 'z':
            size = strtoull(optarg, NULL, 0);
            break;
        case 'n':
            connections = atoi(optarg);
            break;
        case 'c':
            cname = optarg;
            break;
        case 'd':
            declare = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_SETUP;
        }
    }
    if (server) {
        if (optind != argc || connections < 1 || (pmem && size < 4096)) {
            usage(stderr);
            return EXIT_SETUP;
        }
        run_server(addr, port, pmem, size, connections);
        return 0;
    }
    if (optind != argc - 1) {
        usage(stderr);
        return EXIT_SETUP;
    }
    role = "a19_check client";
    struct client c = {0};
    connect_client(&c, argv[optind], port);
    if (!strcmp(cname, "ops"))
        case_ops(&c);
    else if (!strcmp(cname, "commit"))
        case_commit(&c);
    else if (!strcmp(cname, "commit-refused"))
        case_commit_refused(&c);
    else
        case_error(&c, cname);
    rdma_disconnect(c.id);
    return 0;
}
