// SPDX-License-Identifier: MIT
/*
 * The two sides of a run.
 *
 * Client (given the server's address): posts the durable writes and measures
 * them.  Latency: one operation at a time, timed from just before the post
 * to the poll that returns the completion ending it (for write-send, the
 * target's answer).  Bandwidth: up to -t operations in flight, post and
 * completion times kept per operation for perftest's peak figure.  After
 * each size it reads the written slots back over RDMA and compares them byte
 * for byte with what it wrote.
 *
 * Server: holds the target memory.  It is passive (waits on TCP) unless the
 * method needs its CPU: with --imm it consumes one receive per operation and
 * checks that the immediate data count up in order; with write-send it
 * persists each announced range and answers.  After each size it checks the
 * target memory itself and reports to the client, which fails if it does.
 *
 * TCP exchange, in fixed-size messages (perf_common.c):
 *   client HELLO (test parameters, QP)  ->  server REPLY (QP, target)
 *   per size: BEGIN -> READY, the run, END (operations, figures) -> DONE
 *   BYE
 * Either side that gives up sends ERROR with the reason instead.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include "perf_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* HELLO: parameters in words 0..19, the client's QP from 20.  REPLY: the
 * server's QP from 0, then the target. */
enum { HELLO_QP = 20, QP_WORDS = 10 };
enum { R_RKEY = QP_WORDS, R_ADDR, R_LEN, R_KIND, R_IS_PMEM, R_FLUSH_ACCESS };
/* END: operations, then the row's figures. */
enum { E_OPS, E_BYTES, E_ITERS, E_V };
/* DONE */
enum { D_STATUS, D_RECEIVES };

static void *alloc_pages(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) perf_die("cannot allocate %zu bytes: %s", len, strerror(errno));
    return p;
}

static size_t page_round(size_t n) {
    return (n + 4095) & ~(size_t)4095;
}

/* Whether operations leave data at the target that can be checked. */
static bool writes_data(const struct perf_opts *o) {
    return o->method != M_FLUSH || o->write;
}

static uint64_t send_ops_flags(const struct perf_opts *o) {
    uint64_t f = IBV_QP_EX_WITH_RDMA_READ; /* the data check reads back */

    switch (o->method) {
    case M_WRITE:
        f |= o->imm ? IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM : IBV_QP_EX_WITH_RDMA_WRITE;
        break;
    case M_NATIVE:
        f |= IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
        break;
    case M_WRITE_FLUSH:
        f |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH;
        if (o->imm) f |= IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
        break;
    case M_WRITE_READ:
        f |= IBV_QP_EX_WITH_RDMA_WRITE;
        if (o->imm) f |= IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
        break;
    case M_WRITE_SEND:
        f |= IBV_QP_EX_WITH_RDMA_WRITE |
             (o->imm ? IBV_QP_EX_WITH_SEND_WITH_IMM : IBV_QP_EX_WITH_SEND);
        break;
    case M_FLUSH:
        f |= IBV_QP_EX_WITH_FLUSH | (o->write ? IBV_QP_EX_WITH_RDMA_WRITE : 0);
        break;
    case M_ATOMIC_WRITE:
        f |= IBV_QP_EX_WITH_ATOMIC_WRITE | (o->flush ? IBV_QP_EX_WITH_FLUSH : 0);
        break;
    }
    return f;
}

/* Receives each side keeps posted: the server one per operation that can
 * be in flight and then some, so that it never answers "not ready". */
static unsigned server_receives(const struct perf_opts *o) {
    return 2 * o->tx_depth + 16;
}

/* ============================================================== client */

struct run {
    uint64_t size, nslots;
    unsigned window, k;
    uint64_t posted, completed, sends_done;
    unsigned sq_used;
    uint64_t *tposted, *tcompleted; /* bandwidth with -n */
    uint64_t t_first, t_last, t_post;
};

static void client_handle_wc(struct perf_conn *c, struct run *r, const struct ibv_wc *wc,
                             uint64_t now) {
    const struct perf_opts *o = c->o;

    perf_check_wc(wc, "a durable write");
    if (wc->opcode == IBV_WC_RECV) {
        /* write-send: the target's answer, which ends an operation */
        const uint8_t *a = c->aux + c->ans_off + (size_t)wc->wr_id * PERF_MSG_SLOT;
        uint64_t idx;

        memcpy(&idx, a, 8);
        if (o->method != M_WRITE_SEND || wc->byte_len != 8 || idx != r->completed)
            perf_die("unexpected answer from the target (operation %llu, expected %llu)",
                     (unsigned long long)idx, (unsigned long long)r->completed);
        perf_post_recv(c, c->ans_off, (unsigned)wc->wr_id, true);
    } else {
        if (wc->opcode != perf_final_opcode(o))
            perf_die("unexpected completion opcode %s (%d) for %s, expected %s",
                     perf_wc_opcode_name(wc->opcode), (int)wc->opcode, perf_method_name(o),
                     perf_wc_opcode_name(perf_final_opcode(o)));
        r->sq_used -= r->k;
        if (o->method == M_WRITE_SEND) {
            if (wc->wr_id != r->sends_done)
                perf_die("SEND completions out of order: %llu after %llu",
                         (unsigned long long)wc->wr_id, (unsigned long long)r->sends_done);
            r->sends_done++;
            return;
        }
        if (wc->wr_id != r->completed)
            perf_die("completions out of order: operation %llu completed when %llu was next",
                     (unsigned long long)wc->wr_id, (unsigned long long)r->completed);
        /* The verb reports the bytes it made durable. */
        if (o->method == M_NATIVE && wc->byte_len != r->size)
            perf_die("write-commit completion reports %u bytes for a %llu-byte write", wc->byte_len,
                     (unsigned long long)r->size);
    }
    if (r->tcompleted) r->tcompleted[r->completed] = now;
    r->t_last = now;
    r->completed++;
}

static bool can_post_n(const struct perf_conn *c, const struct run *r, unsigned n) {
    /* One send-queue entry stays free for the READ of the data check. */
    return r->posted - r->completed + n <= r->window && r->sq_used + n * r->k <= c->sq_len - 1;
}

static bool can_post(const struct perf_conn *c, const struct run *r) {
    return can_post_n(c, r, 1);
}

/* Posts n operations in one batch. */
static void client_post_n(struct perf_conn *c, struct run *r, unsigned n) {
    struct perf_op ops[PERF_MAX_POST_LIST];

    for (unsigned i = 0; i < n; i++) {
        const uint64_t index = r->posted + i, slot = index % r->nslots;

        ops[i] =
            (struct perf_op){.index = index, .slot = slot, .size = r->size, .nslots = r->nslots};
        if (writes_data(c->o) && c->o->method != M_ATOMIC_WRITE)
            perf_stamp_slot(c->buf + slot * perf_stride(r->size), r->size, slot, index);
    }
    r->t_post = perf_now_ns();
    if (!r->posted) r->t_first = r->t_post;
    if (r->tposted)
        for (unsigned i = 0; i < n; i++)
            r->tposted[r->posted + i] = r->t_post;
    r->sq_used += perf_post_ops(c, ops, n);
    r->posted += n;
}

static void client_post(struct perf_conn *c, struct run *r) {
    client_post_n(c, r, 1);
}

/* Waits for completions and handles them. */
static void client_poll(struct perf_conn *c, struct run *r) {
    struct ibv_wc wc[16];
    int n = perf_poll(c, wc, 16, false);
    const uint64_t now = perf_now_ns();

    for (int i = 0; i < n; i++)
        client_handle_wc(c, r, &wc[i], now);
}

static uint64_t run_latency(struct perf_conn *c, struct run *r, uint64_t **samples_out) {
    const struct perf_opts *o = c->o;
    const uint64_t end = o->duration ? perf_now_ns() + (uint64_t)o->duration * 1000000000u : 0;
    uint64_t cap = o->duration ? 65536 : o->iters, n = 0;
    uint64_t *samples = malloc(cap * sizeof(*samples));

    if (!samples) perf_die("out of memory");
    while (o->duration ? perf_now_ns() < end : n < o->iters) {
        const uint64_t want = r->posted + 1;

        /* write-send: the SEND of the previous operation may complete after
         * its answer; wait for it outside the measurement. */
        while (!can_post(c, r))
            client_poll(c, r);
        client_post(c, r);
        while (r->completed < want)
            client_poll(c, r);
        if (n == cap) {
            cap *= 2;
            samples = realloc(samples, cap * sizeof(*samples));
            if (!samples) perf_die("out of memory");
        }
        samples[n++] = r->t_last - r->t_post;
    }
    *samples_out = samples;
    return n;
}

static void run_bandwidth(struct perf_conn *c, struct run *r) {
    const struct perf_opts *o = c->o;
    const uint64_t end = o->duration ? perf_now_ns() + (uint64_t)o->duration * 1000000000u : 0;
    bool stop = false;

    for (;;) {
        for (;;) {
            unsigned n = o->post_list < r->window ? o->post_list : r->window;

            if (!o->duration && o->iters - r->posted < n) n = (unsigned)(o->iters - r->posted);
            if (stop || !n || !can_post_n(c, r, n)) break;
            client_post_n(c, r, n);
            if (o->duration ? r->t_post >= end : r->posted == o->iters) stop = true;
        }
        if (stop && r->completed == r->posted) break;
        client_poll(c, r);
        if (o->duration && !stop && r->t_last >= end) stop = true;
    }
}

/* Every send-queue entry back, so that the data check's READ is alone. */
static void client_drain(struct perf_conn *c, struct run *r) {
    while (r->sq_used)
        client_poll(c, r);
}

static void client_check_data(struct perf_conn *c, const struct run *r) {
    const struct perf_opts *o = c->o;
    const uint64_t touched = r->completed < r->nslots ? r->completed : r->nslots;
    uint64_t bad_byte = 0;
    int64_t bad;

    if (!writes_data(o) || !r->completed) return;
    perf_read_back(c, 0, touched * perf_stride(r->size));
    bad = perf_check_region(c->aux + c->verify_off, o, r->size, r->completed, &bad_byte);
    if (bad >= 0)
        perf_die("data check failed: after %llu operations of %llu bytes, slot %lld of the "
                 "target differs from what was written at byte %llu (read back over RDMA)",
                 (unsigned long long)r->completed, (unsigned long long)r->size, (long long)bad,
                 (unsigned long long)bad_byte);
}

static void client_size(struct perf_conn *c, uint64_t size, unsigned index,
                        struct perf_result *res) {
    const struct perf_opts *o = c->o;
    struct run r = {.size = size,
                    .nslots = perf_nslots(o, size),
                    .window = perf_window(o, size),
                    .k = perf_wrs_per_op(o)};
    struct perf_msg m = {.type = MSG_BEGIN};
    uint64_t *samples = NULL;

    for (uint64_t s = 0; s < r.nslots && writes_data(o); s++)
        perf_fill_slot(c->buf + s * perf_stride(size), size, s);
    if (o->bw && !o->duration) {
        r.tposted = malloc(o->iters * sizeof(uint64_t));
        r.tcompleted = malloc(o->iters * sizeof(uint64_t));
        if (!r.tposted || !r.tcompleted) perf_die("out of memory");
    }
    m.w[0] = index;
    m.w[1] = size;
    perf_send_msg(c->sock, &m);
    perf_expect_msg(c->sock, &m, MSG_READY);

    if (o->bw) {
        run_bandwidth(c, &r);
        client_drain(c, &r);
        perf_bw_result(res, o, size, r.tposted, r.tcompleted, r.completed, r.t_first, r.t_last,
                       !o->duration);
    } else {
        uint64_t n = run_latency(c, &r, &samples);
        client_drain(c, &r);
        perf_lat_result(res, size, samples, n);
    }
    client_check_data(c, &r);

    memset(&m, 0, sizeof(m));
    m.type = MSG_END;
    m.w[E_OPS] = r.completed;
    m.w[E_BYTES] = res->bytes;
    m.w[E_ITERS] = res->iters;
    for (int i = 0; i < 7; i++)
        m.w[E_V + i] = perf_double_bits(res->v[i]);
    perf_send_msg(c->sock, &m);
    perf_expect_msg(c->sock, &m, MSG_DONE);
    if (m.w[D_STATUS]) {
        perf_die_sock = -1;
        perf_die("server: %s", m.text);
    }
    perf_print_row(o, res);
    free(samples);
    free(r.tposted);
    free(r.tcompleted);
}

static void client_check_peer(struct perf_conn *c) {
    const struct perf_opts *o = c->o;
    const uint32_t caps = c->peer.commit_caps;
    const int placement = perf_placement(o, c->target.kind);

    if (o->method == M_NATIVE) {
        if (!(caps & IBV_COMMIT_CAP_NATIVE))
            perf_die("--method native: the server's device has no native write-commit "
                     "(commit caps %#x); use an IBTA method (write-flush, write-read, "
                     "write-send)",
                     caps);
        if (o->ordered && !(caps & IBV_COMMIT_CAP_ORDERED))
            perf_die("--ordered: the server's device has no ordered write-commit (caps %#x)", caps);
        if (o->imm && !(caps & IBV_COMMIT_CAP_IMMED))
            perf_die("--imm: the server's device has no write-commit with immediate data "
                     "(caps %#x)",
                     caps);
    }
    if (perf_needs_flush(o) && o->method != M_NATIVE) {
        unsigned need = placement == IBV_FLUSH_PERSISTENT ? IBV_ACCESS_FLUSH_PERSISTENT
                                                          : IBV_ACCESS_FLUSH_GLOBAL;
        if (c->target.kind == TARGET_DRAM && placement == IBV_FLUSH_PERSISTENT)
            perf_die("--placement persistent: the server's target memory is dram, which can "
                     "only be made globally visible; use --placement global or a file or "
                     "pmem target (--target-mem at the server)");
        if (!(c->target.mr_flush_access & need))
            perf_die("the server's target memory was not registered for %s FLUSH",
                     placement == IBV_FLUSH_PERSISTENT ? "persistent" : "global");
    }
}

static int run_client(const struct perf_opts *o) {
    struct perf_conn c = {.o = o, .target_fd = -1, .sock = -1};
    struct ibv_commit_caps caps;
    struct perf_msg m = {.type = MSG_HELLO};
    struct perf_result results[PERF_MAX_SIZE_LOG2 + 1];
    uint64_t sizes[PERF_MAX_SIZE_LOG2 + 1];
    const unsigned nsizes = perf_sizes(o, sizes), k = perf_wrs_per_op(o);
    const uint64_t region = perf_region_len(o);
    unsigned sq, cqe;
    int err;

    perf_peer_name = "server";
    if (o->rdma_cm) perf_cm_resolve(&c);
    perf_open_device(&c);
    err = perf_ext_query_commit_caps(c.ctx, &caps);
    c.me.commit_caps = err ? 0 : caps.flags;
    if (o->method == M_NATIVE) {
        const char *dev = ibv_get_device_name(c.ctx->device);
        if (err == ENOSYS)
            perf_die("--method native: device %s has no native write-commit: the verbs "
                     "library in this process lacks the write-commit extension "
                     "(ibv_query_commit_caps); run under `sroce exec`, or use an IBTA "
                     "method (write-flush, write-read, write-send)",
                     dev);
        if (err)
            perf_die("--method native: device %s has no native write-commit "
                     "(ibv_query_commit_caps: %s)",
                     dev, strerror(err));
        if (!(caps.flags & IBV_COMMIT_CAP_NATIVE))
            perf_die("--method native: device %s has no native write-commit (commit caps %#x)", dev,
                     caps.flags);
    }

    /* Source slots laid out as the target's; then the read-back area, the
     * READ scratch, and for write-send the requests and answers. */
    c.buf_len = region;
    c.buf = alloc_pages(region);
    c.buf_mr = ibv_reg_mr(c.pd, c.buf, region, IBV_ACCESS_LOCAL_WRITE);
    if (!c.buf_mr)
        perf_die("ibv_reg_mr(%llu bytes): %s", (unsigned long long)region, strerror(errno));
    c.n_req = 2 * o->tx_depth + 2;
    c.n_recv = o->method == M_WRITE_SEND ? 2 * o->tx_depth + 8 : 0;
    c.verify_off = 0;
    c.scratch_off = region;
    c.req_off = region + 64;
    c.ans_off = c.req_off + (size_t)c.n_req * PERF_MSG_SLOT;
    c.aux_len = page_round(c.ans_off + (size_t)c.n_recv * PERF_MSG_SLOT);
    c.aux = alloc_pages(c.aux_len);
    c.aux_mr = ibv_reg_mr(c.pd, c.aux, c.aux_len, IBV_ACCESS_LOCAL_WRITE);
    if (!c.aux_mr) perf_die("ibv_reg_mr(%zu bytes): %s", c.aux_len, strerror(errno));

    /* write-send: a SEND may still be unacknowledged after its answer, so
     * the send queue holds two windows. */
    sq = o->tx_depth * k * (o->method == M_WRITE_SEND ? 2 : 1) + 1;
    cqe = sq + c.n_recv + 16;
    perf_create_cq(&c, cqe);
    perf_create_qp(&c, send_ops_flags(o), sq, c.n_recv ? c.n_recv : 1, o->inline_size);
    if (o->method == M_NATIVE) {
        c.commit_ops = perf_ext_commit_ops(c.qpx);
        if (!c.commit_ops)
            perf_die("--method native: device %s has no write-commit work requests",
                     ibv_get_device_name(c.ctx->device));
    }
    c.me.rkey = c.buf_mr->rkey;
    c.me.vaddr = (uintptr_t)c.buf;
    /* The server takes its device from this request, so it comes before
     * HELLO; its answer is awaited after REPLY. */
    if (o->rdma_cm) perf_cm_connect(&c);

    c.sock = perf_tcp_connect(o->host, o->port);
    perf_die_sock = c.sock;
    perf_pack_params(o, m.w);
    perf_pack_qp(&c.me, m.w + HELLO_QP);
    perf_send_msg(c.sock, &m);
    perf_expect_msg(c.sock, &m, MSG_REPLY);
    perf_unpack_qp(&c.peer, m.w);
    c.target.rkey = (uint32_t)m.w[R_RKEY];
    c.target.addr = m.w[R_ADDR];
    c.target.len = m.w[R_LEN];
    c.target.kind = (enum perf_target)m.w[R_KIND];
    c.target.is_pmem = m.w[R_IS_PMEM];
    c.target.mr_flush_access = (uint32_t)m.w[R_FLUSH_ACCESS];
    if (c.target.len < region)
        perf_die("the server's target region (%llu bytes) is smaller than the test needs",
                 (unsigned long long)c.target.len);
    client_check_peer(&c);

    if (o->rdma_cm) {
        perf_cm_wait_established(&c);
        /* The connection's ECE exchange selects the opcodes; a peer that
         * did not take part would get IBTA sequences under the native name. */
        if (o->method == M_NATIVE && !c.cm_native)
            perf_die("--method native: the connection set-up did not agree on native "
                     "write-commit (the server's device does not offer it in ECE); use an "
                     "IBTA method (write-flush, write-read, write-send)");
    } else {
        err = perf_declare_peer(&c, o->method == M_NATIVE);
        if (err) perf_die("ibv_qp_set_commit_peer: %s", strerror(err));
        perf_connect_qp(&c, 0);
    }
    for (unsigned i = 0; i < c.n_recv; i++)
        perf_post_recv(&c, c.ans_off, i, true);

    perf_print_header(&c);
    perf_print_columns(o);
    for (unsigned i = 0; i < nsizes; i++)
        client_size(&c, sizes[i], i, &results[i]);
    perf_print_rule();

    memset(&m, 0, sizeof(m));
    m.type = MSG_BYE;
    perf_send_msg(c.sock, &m);
    perf_die_sock = -1;
    if (o->out_json) perf_write_json(o, c.target.kind, results, nsizes);
    perf_close(&c);
    return 0;
}

/* ============================================================== server */

struct service {
    uint64_t size;
    uint64_t seen;     /* receives consumed */
    uint64_t expected; /* from END; UINT64_MAX before it */
    unsigned answers_out;
    uint64_t answers;
    char error[PERF_MSG_TEXT]; /* first problem, reported in DONE */
};

static void service_error(struct service *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void service_error(struct service *s, const char *fmt, ...) {
    va_list ap;

    if (s->error[0]) return;
    va_start(ap, fmt);
    vsnprintf(s->error, sizeof(s->error), fmt, ap);
    va_end(ap);
}

static void server_answer(struct perf_conn *c, struct service *s, uint64_t idx) {
    const unsigned slot = (unsigned)(s->answers % c->n_req);
    uint8_t *a = c->aux + c->ans_off + (size_t)slot * PERF_MSG_SLOT;
    int err;

    memcpy(a, &idx, 8);
    ibv_wr_start(c->qpx);
    c->qpx->wr_id = idx;
    c->qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(c->qpx);
    ibv_wr_set_sge(c->qpx, c->aux_mr->lkey, (uintptr_t)a, 8);
    err = ibv_wr_complete(c->qpx);
    if (err)
        perf_die("posting the answer to operation %llu: %s", (unsigned long long)idx,
                 strerror(err));
    s->answers++;
    s->answers_out++;
}

static void server_handle_wc(struct perf_conn *c, struct service *s, const struct ibv_wc *wc) {
    const struct perf_opts *o = c->o;

    perf_check_wc(wc, o->method == M_WRITE_SEND ? "a request or answer" : "a receive");
    if (wc->opcode == IBV_WC_SEND) {
        s->answers_out--;
        return;
    }
    if (o->imm) {
        const uint32_t got = ntohl(wc->imm_data);
        if (!(wc->wc_flags & IBV_WC_WITH_IMM))
            service_error(s, "operation %llu delivered no immediate data",
                          (unsigned long long)s->seen);
        else if (got != (uint32_t)s->seen)
            service_error(s, "immediate data out of order: %u arrived when %u was expected", got,
                          (uint32_t)s->seen);
    }
    if (o->method == M_WRITE_SEND) {
        const uint8_t *req = c->aux + c->req_off + (size_t)wc->wr_id * PERF_MSG_SLOT;
        uint64_t msg[3];

        memcpy(msg, req, sizeof(msg));
        if (wc->opcode != IBV_WC_RECV || wc->byte_len != sizeof(msg))
            service_error(s, "unexpected request (opcode %s, %u bytes)",
                          perf_wc_opcode_name(wc->opcode), wc->byte_len);
        else if (msg[2] != s->seen)
            service_error(s, "request for operation %llu when %llu was expected",
                          (unsigned long long)msg[2], (unsigned long long)s->seen);
        else if (msg[0] > c->buf_len || msg[1] > c->buf_len - msg[0])
            service_error(s, "request for bytes %llu..+%llu outside the target region",
                          (unsigned long long)msg[0], (unsigned long long)msg[1]);
        else
            perf_persist(c, msg[0], msg[1]);
        /* Answer even a bad request, so that the client does not hang: the
         * problem is reported when the size ends. */
        while (s->answers_out >= c->n_req) {
            struct ibv_wc w;
            int n = ibv_poll_cq(c->send_cq, 1, &w);
            if (n < 0) perf_die("ibv_poll_cq failed");
            if (n) server_handle_wc(c, s, &w);
        }
        server_answer(c, s, s->seen);
    } else if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
        service_error(s, "unexpected receive completion (opcode %s)",
                      perf_wc_opcode_name(wc->opcode));
    }
    s->seen++;
    perf_post_recv(c, c->req_off, (unsigned)wc->wr_id, o->method == M_WRITE_SEND);
}

/* Consumes receives, and answers write-send requests, until the client's
 * END has come over TCP and every receive it announces has been seen. */
static void server_service(struct perf_conn *c, struct service *s, struct perf_msg *end) {
    const struct perf_opts *o = c->o;
    uint64_t deadline = 0;
    unsigned idle = 0;

    s->expected = UINT64_MAX;
    while (s->seen < s->expected || s->answers_out) {
        struct ibv_wc wc[16];
        int n = ibv_poll_cq(c->cq, 16, wc), m = 0;

        /* Answers complete on a CQ of their own (see run_server). */
        if (n >= 0 && c->send_cq != c->cq) {
            m = ibv_poll_cq(c->send_cq, 16 - n, wc + n);
            if (m > 0) n += m;
        }
        if (n < 0 || m < 0) perf_die("ibv_poll_cq failed");
        for (int i = 0; i < n; i++)
            server_handle_wc(c, s, &wc[i]);
        if (n) {
            idle = 0;
            continue;
        }
        if (s->expected == UINT64_MAX) {
            struct pollfd pf[2] = {{.fd = c->sock, .events = POLLIN},
                                   {.fd = c->channel ? c->channel->fd : -1, .events = POLLIN}};
            int timeout = 0;

            /* Busy polling looks at the socket now and then; with -e the
             * server sleeps on the socket and the completion channel. */
            if (o->use_event) {
                if (!c->cq_armed) {
                    if (ibv_req_notify_cq(c->cq, 0) ||
                        (c->send_cq != c->cq && ibv_req_notify_cq(c->send_cq, 0)))
                        perf_die("ibv_req_notify_cq failed");
                    c->cq_armed = 1;
                    continue;
                }
                timeout = 1000;
            } else if (++idle % 256) {
                continue;
            }
            if (poll(pf, 2, timeout) < 0 && errno != EINTR) perf_die("poll: %s", strerror(errno));
            if (pf[1].revents & POLLIN) {
                struct ibv_cq *ev_cq;
                void *ev_ctx;
                if (!ibv_get_cq_event(c->channel, &ev_cq, &ev_ctx)) {
                    ibv_ack_cq_events(ev_cq, 1);
                    c->cq_armed = 0;
                }
            }
            if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                perf_expect_msg(c->sock, end, MSG_END);
                s->expected = end->w[E_OPS];
                deadline = perf_now_ns() + (uint64_t)PERF_DRAIN_TIMEOUT_MS * 1000000u;
            }
        } else if (perf_now_ns() > deadline) {
            service_error(s, "%llu receives arrived for %llu operations",
                          (unsigned long long)s->seen, (unsigned long long)s->expected);
            break;
        }
    }
    if (s->seen > s->expected && !s->error[0])
        service_error(s, "%llu receives arrived for %llu operations", (unsigned long long)s->seen,
                      (unsigned long long)s->expected);
}

static void server_size(struct perf_conn *c, const struct perf_msg *begin,
                        struct perf_result *res) {
    const struct perf_opts *o = c->o;
    struct service s = {.size = begin->w[1]};
    struct perf_msg m = {.type = MSG_READY};
    uint64_t sizes[PERF_MAX_SIZE_LOG2 + 1], bad_byte = 0;
    const unsigned nsizes = perf_sizes(o, sizes);
    int64_t bad;

    if (begin->w[0] >= nsizes || sizes[begin->w[0]] != s.size)
        perf_die("the client asks for size %llu, which is not among this test's sizes",
                 (unsigned long long)s.size);
    perf_send_msg(c->sock, &m);
    if (perf_server_active(o))
        server_service(c, &s, &m);
    else
        perf_expect_msg(c->sock, &m, MSG_END);

    /* The bytes in the target memory itself, whatever the client read. */
    if (!s.error[0] && writes_data(o) && m.w[E_OPS]) {
        bad = perf_check_region(c->buf, o, s.size, m.w[E_OPS], &bad_byte);
        if (bad >= 0)
            service_error(&s,
                          "data check failed at the target: after %llu operations of %llu "
                          "bytes, slot %lld differs at byte %llu",
                          (unsigned long long)m.w[E_OPS], (unsigned long long)s.size,
                          (long long)bad, (unsigned long long)bad_byte);
    }
    res->bytes = m.w[E_BYTES];
    res->iters = m.w[E_ITERS];
    for (int i = 0; i < 7; i++)
        res->v[i] = perf_bits_double(m.w[E_V + i]);

    memset(&m, 0, sizeof(m));
    m.type = MSG_DONE;
    m.w[D_STATUS] = s.error[0] != 0;
    m.w[D_RECEIVES] = s.seen;
    snprintf(m.text, sizeof(m.text), "%s", s.error);
    perf_send_msg(c->sock, &m);
    if (s.error[0]) {
        perf_die_sock = -1;
        perf_die("%s", s.error);
    }
    perf_print_row(o, res);
}

static int run_server(const struct perf_opts *o) {
    struct perf_conn c = {.o = o, .target_fd = -1, .sock = -1};
    struct ibv_commit_caps caps;
    struct perf_msg m;
    struct perf_result results[PERF_MAX_SIZE_LOG2 + 1];
    unsigned nres = 0, access;
    char why[PERF_MSG_TEXT];
    const char *mismatch;
    const bool active = perf_server_active(o);
    int lfd, err;

    perf_peer_name = "client";
    /* -R: the device is the one the client's request arrives on. */
    if (o->rdma_cm)
        perf_cm_listen(&c);
    else
        perf_open_device(&c);

    lfd = perf_tcp_listen(o->port);
    printf("\n************************************\n"
           "* Waiting for client to connect... *\n"
           "************************************\n");
    c.sock = perf_tcp_accept(lfd);
    close(lfd);
    perf_die_sock = c.sock;
    perf_expect_msg(c.sock, &m, MSG_HELLO);
    mismatch = perf_compare_params(o, m.w, why, sizeof(why));
    if (mismatch) perf_die("%s", mismatch);
    perf_unpack_qp(&c.peer, m.w + HELLO_QP);
    if (o->rdma_cm) {
        perf_cm_get_request(&c);
        perf_open_device(&c);
    }
    err = perf_ext_query_commit_caps(c.ctx, &caps);
    c.me.commit_caps = err ? 0 : caps.flags;
    if (o->method == M_NATIVE && !(c.me.commit_caps & IBV_COMMIT_CAP_NATIVE))
        perf_die("--method native: the server's device %s has no native write-commit (%s)",
                 ibv_get_device_name(c.ctx->device),
                 err == ENOSYS ? "the verbs library lacks the write-commit extension"
                               : "ibv_query_commit_caps reports none");
    if (perf_needs_flush(o) && o->method != M_NATIVE && o->target == TARGET_DRAM &&
        o->placement == IBV_FLUSH_PERSISTENT)
        perf_die("--placement persistent: the target memory is dram, which can only be made "
                 "globally visible; use --placement global or --target-mem file:PATH");

    perf_setup_target(&c, perf_region_len(o));
    c.n_recv = active ? server_receives(o) : 0;
    c.n_req = o->method == M_WRITE_SEND ? c.n_recv : 0;
    c.req_off = 0;
    c.ans_off = (size_t)c.n_recv * PERF_MSG_SLOT;
    if (c.n_recv) {
        c.aux_len = page_round(c.ans_off + (size_t)c.n_req * PERF_MSG_SLOT);
        c.aux = alloc_pages(c.aux_len);
        c.aux_mr = ibv_reg_mr(c.pd, c.aux, c.aux_len, IBV_ACCESS_LOCAL_WRITE);
        if (!c.aux_mr) perf_die("ibv_reg_mr(%zu bytes): %s", c.aux_len, strerror(errno));
    }
    perf_create_cq(&c, c.n_recv + c.n_req + 16);
    /* Answers get a CQ of their own: the server waits for a free answer
     * slot without taking the next request out of order. */
    if (o->method == M_WRITE_SEND) {
        c.send_cq = ibv_create_cq(c.ctx, (int)c.n_req + 16, NULL, c.channel, 0);
        if (!c.send_cq) perf_die("ibv_create_cq: %s", strerror(errno));
    }
    perf_create_qp(&c, o->method == M_WRITE_SEND ? IBV_QP_EX_WITH_SEND : 0,
                   c.n_req ? c.n_req + 1 : 1, c.n_recv ? c.n_recv : 1, 0);
    if (!o->rdma_cm) {
        err = perf_declare_peer(&c, o->method == M_NATIVE);
        if (err) perf_die("ibv_qp_set_commit_peer: %s", strerror(err));
    }
    access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | c.target.mr_flush_access;
    if (o->tool == TOOL_ATOMIC_WRITE) access |= IBV_ACCESS_REMOTE_ATOMIC;
    if (o->rdma_cm)
        perf_cm_accept(&c, access);
    else
        perf_connect_qp(&c, access);
    /* In place before the client can send anything: it waits for REPLY. */
    for (unsigned i = 0; i < c.n_recv; i++)
        perf_post_recv(&c, c.req_off, i, o->method == M_WRITE_SEND);

    memset(&m, 0, sizeof(m));
    m.type = MSG_REPLY;
    perf_pack_qp(&c.me, m.w);
    m.w[R_RKEY] = c.target.rkey;
    m.w[R_ADDR] = c.target.addr;
    m.w[R_LEN] = c.target.len;
    m.w[R_KIND] = c.target.kind;
    m.w[R_IS_PMEM] = c.target.is_pmem;
    m.w[R_FLUSH_ACCESS] = c.target.mr_flush_access;
    perf_send_msg(c.sock, &m);
    if (o->rdma_cm) perf_cm_wait_established(&c);

    perf_print_header(&c);
    perf_print_columns(o);
    for (;;) {
        if (!perf_recv_msg(c.sock, &m)) perf_die("the client closed the connection");
        if (m.type == MSG_BYE) break;
        if (m.type == MSG_ERROR) {
            perf_die_sock = -1;
            perf_die("client: %s", m.text);
        }
        if (m.type != MSG_BEGIN || nres > PERF_MAX_SIZE_LOG2)
            perf_die("protocol error: unexpected message %llu", (unsigned long long)m.type);
        server_size(&c, &m, &results[nres++]);
    }
    perf_print_rule();
    perf_die_sock = -1;
    if (o->out_json) perf_write_json(o, c.target.kind, results, nres);
    perf_close(&c);
    return 0;
}

int perf_main(enum perf_tool tool, bool bw, int argc, char **argv) {
    struct perf_opts o;

    perf_parse_args(&o, tool, bw, argc, argv);
    /* Rows reach a pipe or a file as they are printed. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    return o.host ? run_client(&o) : run_server(&o);
}
