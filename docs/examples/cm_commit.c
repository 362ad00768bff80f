// SPDX-License-Identifier: MIT
/*
 * cm_commit - durable remote writes over a connection made by rdma_cm, with
 * no ibv_qp_set_commit_peer(): the two QPs agree on native write-commit
 * opcodes in the connection's ECE exchange, which librdmacm drives through
 * ibv_query_ece() and ibv_set_ece() (see <infiniband/verbs_ext.h>).
 *
 * The server exposes a region of memory registered for FLUSH; the client
 * write-commits COUNT slots into it, each with a pattern of its own, reads
 * the region back with RDMA READ and compares it byte for byte, and then
 * disconnects; the server compares its region once more.
 *
 *   1. The client's REQ offers the commit capabilities of its QP (ECE).
 *   2. The server's QP keeps what both share; its REP answers with that.
 *      A server whose QP librdmacm does not manage (--no-ece: created by the
 *      program and moved through rdma_init_qp_attr(), as with a kernel rxe
 *      or an RNIC without these opcodes) answers with nothing, and the
 *      client's commits become IBTA sequences (WRITE + FLUSH) with the same
 *      promise.
 *   3. rdma_cm grants remote READ, WRITE and atomics only; the server adds
 *      FLUSH access to its QP, then SENDs the region's address and rkey,
 *      which is what the client waits for before it writes.
 *
 * Build:  cc -o cm_commit cm_commit.c $(pkg-config --cflags --libs libibverbs-ext librdmacm)
 * Run on two sroce links on loopback (see sroce(8)):
 *         sroce link add sroce0 netdev lo addr 127.0.0.1
 *         sroce link add sroce1 netdev lo addr 127.0.0.2
 *         sroce exec -- ./cm_commit -s -b 127.0.0.1 &
 *         sroce exec -- ./cm_commit -c 127.0.0.1 -b 127.0.0.2 -n 100 --expect native
 *
 * Exit status: 0 success, 1 setup or connection error, 2 usage, 3 a work
 * completion failed, 4 data mismatch, 5 the commit opcodes were not the
 * ones --expect names.
 */
#define _GNU_SOURCE /* getopt_long */
#include <infiniband/verbs_ext.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum {
    EXIT_SETUP = 1,
    EXIT_USAGE = 2,
    EXIT_WC = 3,
    EXIT_DATA = 4,
    EXIT_EXPECT = 5,
    DEPTH = 16, /* commits in flight */
};

/* What the client asks for (REQ private data) and what the server answers
 * (a SEND once its QP may take FLUSH), big-endian. */
struct request {
    uint32_t count, size;
};
struct region {
    uint64_t addr;
    uint32_t rkey, len;
};

struct opts {
    bool server, no_ece;
    const char *connect, *bind;
    const char *port;
    uint32_t count, size;
    const char *expect; /* NULL, "native" or "ibta" */
};

static const char *prog = "cm_commit";

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static void usage(FILE *out) {
    fprintf(out,
            "Usage: %s -s [-b ADDR] [-p PORT] [--no-ece]\n"
            "       %s -c SERVER [-b ADDR] [-p PORT] [-n COUNT] [-S SIZE] "
            "[--expect native|ibta]\n"
            "  -s, --server         wait for a client on ADDR (default: any) and PORT\n"
            "  -c, --connect=HOST   write-commit COUNT slots into HOST's region\n"
            "  -b, --bind=ADDR      local address (picks the device)\n"
            "  -p, --port=PORT      rdma_cm port (default 7700)\n"
            "  -n, --count=COUNT    slots to commit (default 64)\n"
            "  -S, --size=SIZE      bytes per slot (default 4096)\n"
            "      --no-ece         server: a QP librdmacm does not manage, so no ECE answer\n"
            "      --expect=KIND    client: fail unless the commits are native or ibta\n",
            prog, prog);
}

/* The byte `i` of slot `k`: both sides compute it. */
static uint8_t pattern(uint32_t k, uint32_t i) {
    return (uint8_t)(k * 131u + i * 7u + 1u);
}

static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch,
                                          enum rdma_cm_event_type want) {
    struct rdma_cm_event *ev;

    if (rdma_get_cm_event(ch, &ev)) die(EXIT_SETUP, "rdma_get_cm_event: %s", strerror(errno));
    if (ev->event != want)
        die(EXIT_SETUP, "%s (status %d) instead of %s", rdma_event_str(ev->event), ev->status,
            rdma_event_str(want));
    return ev;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq) {
    struct ibv_wc wc;
    int n;

    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        ;
    if (n < 0) die(EXIT_WC, "ibv_poll_cq failed");
    if (wc.status != IBV_WC_SUCCESS)
        die(EXIT_WC, "work completion %llu: %s", (unsigned long long)wc.wr_id,
            ibv_wc_status_str(wc.status));
    return wc;
}

static uint8_t *alloc_region(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) die(EXIT_SETUP, "cannot allocate %zu bytes", len);
    return p;
}

static struct sockaddr *resolve(const char *host, const char *port, struct addrinfo **ai) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    int err = getaddrinfo(host, port, &hints, ai);

    if (err) die(EXIT_SETUP, "%s: %s", host ? host : "any", gai_strerror(err));
    return (*ai)->ai_addr;
}

/* ------------------------------------------------------------- server */

/* --no-ece: the program moves its own QP, as librdmacm would, plus FLUSH. */
static struct ibv_qp *external_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq,
                                  unsigned flush_access) {
    struct ibv_qp_init_attr ia = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = {4, 4, 1, 1, 0}};
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    struct ibv_qp_attr a;
    int mask;

    if (!qp) die(EXIT_SETUP, "ibv_create_qp: %s", strerror(errno));
    for (enum ibv_qp_state s = IBV_QPS_INIT; s <= IBV_QPS_RTS; s++) {
        a.qp_state = s;
        if (rdma_init_qp_attr(id, &a, &mask))
            die(EXIT_SETUP, "rdma_init_qp_attr: %s", strerror(errno));
        if (s == IBV_QPS_INIT) a.qp_access_flags |= flush_access;
        if (ibv_modify_qp(qp, &a, mask)) die(EXIT_SETUP, "QP to state %d: %s", s, strerror(errno));
    }
    return qp;
}

static int run_server(const struct opts *o) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *listen_id, *id;
    struct rdma_cm_event *ev;
    struct addrinfo *ai;
    struct request req;
    const unsigned flush = IBV_ACCESS_FLUSH_GLOBAL;

    if (!ch) die(EXIT_SETUP, "rdma_create_event_channel: %s", strerror(errno));
    if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
        die(EXIT_SETUP, "rdma_create_id: %s", strerror(errno));
    if (rdma_bind_addr(listen_id, resolve(o->bind, o->port, &ai)))
        die(EXIT_SETUP, "rdma_bind_addr: %s", strerror(errno));
    freeaddrinfo(ai);
    if (rdma_listen(listen_id, 1)) die(EXIT_SETUP, "rdma_listen: %s", strerror(errno));
    printf("listening on port %s\n", o->port);
    fflush(stdout);

    ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    id = ev->id;
    if (ev->param.conn.private_data_len < sizeof(req))
        die(EXIT_SETUP, "the request carries %u bytes, not %zu", ev->param.conn.private_data_len,
            sizeof(req));
    memcpy(&req, ev->param.conn.private_data, sizeof(req));
    rdma_ack_cm_event(ev);
    const uint32_t count = be32toh(req.count), size = be32toh(req.size);
    if (!count || !size || (uint64_t)count * size > (1u << 30))
        die(EXIT_SETUP, "a request for %u slots of %u bytes", count, size);
    const size_t len = (size_t)count * size;

    struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
    struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
    if (!cq) die(EXIT_SETUP, "ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
    uint8_t *buf = alloc_region(len);
    struct region info_buf;
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, len,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ | (int)flush);
    struct ibv_mr *info_mr = mr ? ibv_reg_mr(pd, &info_buf, sizeof(info_buf), 0) : NULL;
    if (!info_mr) die(EXIT_SETUP, "ibv_reg_mr: %s", strerror(errno));

    struct ibv_qp *qp;
    struct rdma_conn_param param = {.responder_resources = 16, .initiator_depth = 16};
    if (o->no_ece) {
        qp = external_qp(id, pd, cq, flush);
        param.qp_num = qp->qp_num;
        if (rdma_accept(id, &param)) die(EXIT_SETUP, "rdma_accept: %s", strerror(errno));
    } else {
        struct ibv_qp_init_attr ia = {
            .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = {4, 4, 1, 1, 0}};
        if (rdma_create_qp(id, pd, &ia)) die(EXIT_SETUP, "rdma_create_qp: %s", strerror(errno));
        qp = id->qp;
        if (rdma_accept(id, &param)) die(EXIT_SETUP, "rdma_accept: %s", strerror(errno));
        /* rdma_accept() sets rdma_cm's access on the way to RTR. */
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS,
                                .qp_access_flags =
                                    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | flush};
        if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS))
            die(EXIT_SETUP, "QP FLUSH access: %s", strerror(errno));
    }
    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ESTABLISHED));

    info_buf = (struct region){htobe64((uintptr_t)buf), htobe32(mr->rkey), htobe32((uint32_t)len)};
    struct ibv_sge sge = {(uintptr_t)&info_buf, sizeof(info_buf), info_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(qp, &wr, &bad)) die(EXIT_SETUP, "ibv_post_send: %s", strerror(errno));
    wait_wc(cq);

    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_DISCONNECTED));
    for (uint32_t k = 0; k < count; k++)
        for (uint32_t i = 0; i < size; i++)
            if (buf[(size_t)k * size + i] != pattern(k, i))
                die(EXIT_DATA, "slot %u byte %u: %#x, expected %#x", k, i,
                    buf[(size_t)k * size + i], pattern(k, i));
    printf("server: %u slots of %u bytes as written\n", count, size);

    if (o->no_ece)
        ibv_destroy_qp(qp);
    else
        rdma_destroy_qp(id);
    ibv_dereg_mr(info_mr);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    rdma_destroy_id(id);
    rdma_destroy_id(listen_id);
    rdma_destroy_event_channel(ch);
    munmap(buf, len);
    return 0;
}

/* ------------------------------------------------------------- client */

static void post_commit(struct ibv_qp_ex *qpx, struct ibv_mr *mr, const uint8_t *src,
                        const struct region *r, uint32_t k, uint32_t size) {
    ibv_wr_start(qpx);
    qpx->wr_id = k;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    /* DRAM at the server: global visibility is the durability it offers. */
    if (ibv_wr_rdma_write_commit(qpx, r->rkey, r->addr + (uint64_t)k * size,
                                 IBV_WRITE_COMMIT_GLOBAL))
        die(EXIT_SETUP, "ibv_wr_rdma_write_commit: not supported by this device");
    ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)(src + (size_t)k * size), size);
    if (ibv_wr_complete(qpx)) die(EXIT_SETUP, "ibv_wr_complete: %s", strerror(errno));
}

static int run_client(const struct opts *o) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct rdma_cm_event *ev;
    struct addrinfo *dst, *src = NULL;
    const size_t len = (size_t)o->count * o->size;

    if (!ch) die(EXIT_SETUP, "rdma_create_event_channel: %s", strerror(errno));
    if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
        die(EXIT_SETUP, "rdma_create_id: %s", strerror(errno));
    if (rdma_resolve_addr(id, o->bind ? resolve(o->bind, NULL, &src) : NULL,
                          resolve(o->connect, o->port, &dst), 2000))
        die(EXIT_SETUP, "rdma_resolve_addr: %s", strerror(errno));
    freeaddrinfo(dst);
    if (src) freeaddrinfo(src);
    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(id, 2000)) die(EXIT_SETUP, "rdma_resolve_route: %s", strerror(errno));
    rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));

    struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
    struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 2 * DEPTH + 4, NULL, NULL, 0) : NULL;
    if (!cq) die(EXIT_SETUP, "ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
    uint8_t *src_buf = alloc_region(len), *back = alloc_region(len);
    struct region r;
    struct ibv_mr *mr = ibv_reg_mr(pd, src_buf, len, 0);
    struct ibv_mr *back_mr = mr ? ibv_reg_mr(pd, back, len, IBV_ACCESS_LOCAL_WRITE) : NULL;
    struct ibv_mr *r_mr = back_mr ? ibv_reg_mr(pd, &r, sizeof(r), IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!r_mr) die(EXIT_SETUP, "ibv_reg_mr: %s", strerror(errno));
    for (uint32_t k = 0; k < o->count; k++)
        for (uint32_t i = 0; i < o->size; i++)
            src_buf[(size_t)k * o->size + i] = pattern(k, i);

    struct ibv_qp_init_attr_ex ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {2 * DEPTH + 2, 2, 1, 1, 0},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = pd,
        .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE_COMMIT | IBV_QP_EX_WITH_RDMA_READ,
    };
    if (rdma_create_qp_ex(id, &ia)) die(EXIT_SETUP, "rdma_create_qp_ex: %s", strerror(errno));
    struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(id->qp);
    struct ibv_sge rsge = {(uintptr_t)&r, sizeof(r), r_mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 0, .sg_list = &rsge, .num_sge = 1}, *rbad;
    if (ibv_post_recv(id->qp, &rwr, &rbad)) die(EXIT_SETUP, "ibv_post_recv: %s", strerror(errno));

    struct request req = {htobe32(o->count), htobe32(o->size)};
    struct rdma_conn_param param = {.private_data = &req,
                                    .private_data_len = sizeof(req),
                                    .responder_resources = 16,
                                    .initiator_depth = 16,
                                    .retry_count = 7,
                                    .rnr_retry_count = 7};
    if (rdma_connect(id, &param)) die(EXIT_SETUP, "rdma_connect: %s", strerror(errno));
    ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
    rdma_ack_cm_event(ev);

    struct ibv_ece ece = {0};
    const bool native = !ibv_query_ece(id->qp, &ece) && ibv_commit_ece_native(&ece);
    /* Without ECE, two sroce ends still agree in their first packets. */
    printf("ECE: vendor %#x options %#x: %s commit opcodes agreed in the connection set-up\n",
           ece.vendor_id, ece.options, native ? "native" : "no");
    if (o->expect && strcmp(o->expect, native ? "native" : "ibta"))
        die(EXIT_EXPECT, "expected %s commit opcodes", o->expect);

    if (wait_wc(cq).opcode != IBV_WC_RECV) die(EXIT_WC, "the server's answer is not a SEND");
    r.addr = be64toh(r.addr);
    r.rkey = be32toh(r.rkey);
    r.len = be32toh(r.len);
    if (r.len < len) die(EXIT_SETUP, "the server's region has %u bytes, not %zu", r.len, len);

    uint32_t posted = 0, done = 0;
    while (done < o->count) {
        while (posted < o->count && posted - done < DEPTH)
            post_commit(qpx, mr, src_buf, &r, posted++, o->size);
        struct ibv_wc wc = wait_wc(cq);
        if (wc.opcode != IBV_WC_RDMA_WRITE_COMMIT || wc.wr_id != done)
            die(EXIT_WC, "completion %llu opcode %d, expected commit %u",
                (unsigned long long)wc.wr_id, wc.opcode, done);
        done++;
    }

    ibv_wr_start(qpx);
    qpx->wr_id = UINT32_MAX;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_read(qpx, r.rkey, r.addr);
    ibv_wr_set_sge(qpx, back_mr->lkey, (uintptr_t)back, (uint32_t)len);
    if (ibv_wr_complete(qpx)) die(EXIT_SETUP, "RDMA READ: %s", strerror(errno));
    wait_wc(cq);
    if (memcmp(back, src_buf, len)) {
        size_t i = 0;
        while (back[i] == src_buf[i])
            i++;
        die(EXIT_DATA, "read back: byte %zu is %#x, wrote %#x", i, back[i], src_buf[i]);
    }
    printf("client: %u commits of %u bytes, read back and compared\n", o->count, o->size);

    rdma_disconnect(id);
    rdma_destroy_qp(id);
    ibv_dereg_mr(r_mr);
    ibv_dereg_mr(back_mr);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    munmap(src_buf, len);
    munmap(back, len);
    return 0;
}

static uint32_t number(const char *s, const char *what, uint32_t max) {
    char *end;
    unsigned long v = strtoul(s, &end, 0);

    if (!*s || *end || !v || v > max) die(EXIT_USAGE, "invalid %s '%s'", what, s);
    return (uint32_t)v;
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"server", no_argument, NULL, 's'},      {"connect", required_argument, NULL, 'c'},
        {"bind", required_argument, NULL, 'b'},  {"port", required_argument, NULL, 'p'},
        {"count", required_argument, NULL, 'n'}, {"size", required_argument, NULL, 'S'},
        {"no-ece", no_argument, NULL, 'E'},      {"expect", required_argument, NULL, 'x'},
        {"help", no_argument, NULL, 'h'},        {0, 0, 0, 0}};
    struct opts o = {.port = "7700", .count = 64, .size = 4096};
    int c;

    while ((c = getopt_long(argc, argv, "sc:b:p:n:S:h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            o.server = true;
            break;
        case 'c':
            o.connect = optarg;
            break;
        case 'b':
            o.bind = optarg;
            break;
        case 'p':
            number(optarg, "port", 65535);
            o.port = optarg;
            break;
        case 'n':
            o.count = number(optarg, "count", 1u << 20);
            break;
        case 'S':
            o.size = number(optarg, "size", 1u << 24);
            break;
        case 'E':
            o.no_ece = true;
            break;
        case 'x':
            if (strcmp(optarg, "native") && strcmp(optarg, "ibta"))
                die(EXIT_USAGE, "--expect: native or ibta, not '%s'", optarg);
            o.expect = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc || o.server == !!o.connect) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if ((uint64_t)o.count * o.size > (1u << 30)) die(EXIT_USAGE, "at most 1 GiB in all");
    return o.server ? run_server(&o) : run_client(&o);
}
