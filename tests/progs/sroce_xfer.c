// SPDX-License-Identifier: MIT
//
// sroce_xfer: a verbs client/server that drives a reproducible random mix of
// RC operations across one QP pair and checks every byte that arrives.
//
//   server: sroce_xfer -d DEV [-g GIDIDX] [-p PORT] [--hold-ms MS]
//   client: sroce_xfer -d DEV [-g GIDIDX] [-p PORT] [-n ITERS] [--seed S] SERVER
//
// Exit status: 0 success, 1 setup or usage error, 2 data mismatch,
// 3 work completion error, 4 no completion for --stall-ms.
//
// Only standard libibverbs calls are used, so the program runs unchanged on
// any RoCE device, including sroce under `sroce exec`.
//
// How the mix is verified without the peers sharing state at run time:
// every operation's parameters and payload are pure functions of (seed,
// iteration), so the server can recompute what a SEND or WRITE_WITH_IMM must
// contain from the iteration number carried in the message.  Writes are read
// back into a second buffer; atomics are checked against a model of the
// remote words, which is exact because an RC responder executes requests in
// PSN order.  Each SEND / WRITE_WITH_IMM is answered by a small credit SEND,
// which bounds how far the client can run ahead of the server's checks and
// keeps the server's receive queue from ever running dry.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

enum {
    EXIT_SETUP = 1,
    EXIT_MISMATCH = 2,
    EXIT_WC = 3,
    EXIT_STALL = 4,
};

enum { N_ATOMIC_WORDS = 16, N_FADD_WORDS = 8, MAX_DEPTH = 256, MAX_INLINE = 128 };

#define MAGIC_HELLO 0x73786665726f6331ull // "sxferoc1"
#define MAGIC_REPLY 0x73786665726f6332ull
#define MAGIC_DONE 0x73786665726f6333ull
#define MAGIC_RESULT 0x73786665726f6334ull

enum op_type { OP_WRITE_READ, OP_SEND, OP_WRITE_IMM, OP_FETCH_ADD, OP_CMP_SWP, OP_NTYPES };

struct options {
    const char *dev;
    int gid_index;
    int port;
    const char *server;
    uint64_t iters;
    bool iters_set;
    uint64_t seed;
    uint32_t max_size;
    uint32_t depth;
    int timeout;
    int retry;
    int mtu; // bytes, 0 = port's active MTU
    int hold_ms;
    int stall_ms;
    bool stream;
    bool verbose;
    unsigned ops;        // bit per enum op_type
    uint32_t flow_label; // this side's AV's grh.flow_label
    uint8_t tclass;      // its grh.traffic_class
    uint8_t hop_limit;   // its grh.hop_limit
};

static struct options opt = {
    .gid_index = 1,
    .hop_limit = 64,
    .port = 18600,
    .iters = 1000,
    .seed = 1,
    .max_size = 256 * 1024,
    .depth = 8,
    .timeout = 14,
    .retry = 7,
    .stall_ms = 30000,
    .ops = (1u << OP_NTYPES) - 1,
};

static const char *role = "xfer";
// Operations finished so far, for the report on a failed completion.
static uint64_t ops_done;

static void die(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", role);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stdout);
    exit(status);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

// ---------------------------------------------------------------------------
// Deterministic randomness and payload patterns

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r) {
    r->s += 0x9e3779b97f4a7c15ull;
    return mix64(r->s);
}

static uint64_t rng_below(struct rng *r, uint64_t n) {
    return n ? rng_next(r) % n : 0;
}

static uint64_t pattern_key(uint64_t iter) {
    return mix64(opt.seed ^ mix64(iter ^ 0x5a5a5a5aull));
}

// Byte `pos` of the payload of a message whose key is `key`: any sub-range of
// a message can be regenerated on its own.
static void pattern_fill(uint8_t *dst, uint64_t key, uint64_t pos, size_t len) {
    while (len) {
        uint64_t word = mix64(key + (pos >> 3));
        unsigned shift = (unsigned)(pos & 7);
        size_t take = 8 - shift;
        if (take > len) take = len;
        uint64_t le = htole64(word);
        memcpy(dst, (const uint8_t *)&le + shift, take);
        dst += take;
        pos += take;
        len -= take;
    }
}

// Sizes spread over all orders of magnitude up to max, so short messages,
// MTU boundaries and long multi-packet messages are all common.
static uint32_t random_size(struct rng *r, uint32_t max) {
    unsigned bits = 0;
    while (bits < 31 && (1u << (bits + 1)) <= max)
        bits++;
    unsigned e = (unsigned)rng_below(r, bits + 1);
    uint64_t span = (e >= bits) ? max : (1ull << (e + 1));
    uint32_t s = (uint32_t)(1 + rng_below(r, span));
    return s > max ? max : s;
}

static const char *op_name[OP_NTYPES] = {"write+read", "send", "write_imm", "fetch_add", "cmp_swp"};

// Everything about one iteration that both peers can recompute.
struct op_params {
    enum op_type type;
    uint32_t len;    // payload length
    uint32_t off;    // offset in the remote slot
    uint32_t suboff; // write+read: part read back, relative to off
    uint32_t sublen;
    uint32_t loff; // offset in the local slot
    unsigned nsge;
    bool with_imm; // send
    bool inline_data;
    bool signal_write; // write+read: whether the WRITE itself is signaled
    unsigned word;     // atomics: which remote word
    uint64_t add_or_swap;
    bool cmp_should_match;
};

static struct op_params derive(uint64_t iter) {
    struct rng r = {mix64(opt.seed * 0x2545f4914f6cdd1dull + iter)};
    struct op_params p = {0};
    uint32_t max = opt.max_size;
    static const unsigned weight[OP_NTYPES] = {35, 20, 20, 13, 12};
    unsigned total = 0;
    for (int i = 0; i < OP_NTYPES; i++)
        if (opt.ops & (1u << i)) total += weight[i];
    uint64_t t = rng_below(&r, total);
    p.type = OP_WRITE_READ;
    for (int i = 0; i < OP_NTYPES; i++) {
        if (!(opt.ops & (1u << i))) continue;
        if (t < weight[i]) {
            p.type = (enum op_type)i;
            break;
        }
        t -= weight[i];
    }
    switch (p.type) {
    case OP_WRITE_READ:
        p.len = random_size(&r, max);
        p.off = (uint32_t)rng_below(&r, max - p.len + 1);
        if (rng_below(&r, 2)) {
            p.suboff = 0;
            p.sublen = p.len;
        } else {
            p.sublen = (uint32_t)(1 + rng_below(&r, p.len));
            p.suboff = (uint32_t)rng_below(&r, p.len - p.sublen + 1);
        }
        p.loff = (uint32_t)rng_below(&r, max - p.len + 1);
        p.nsge = (unsigned)(1 + rng_below(&r, 3));
        p.signal_write = rng_below(&r, 2);
        p.inline_data = p.len <= MAX_INLINE && rng_below(&r, 2);
        break;
    case OP_SEND:
        p.len = random_size(&r, max);
        if (p.len < 8) p.len = 8; // room for the iteration header
        p.loff = (uint32_t)rng_below(&r, max - p.len + 1);
        p.nsge = (unsigned)(1 + rng_below(&r, 3));
        p.with_imm = rng_below(&r, 2);
        p.inline_data = p.len <= MAX_INLINE && rng_below(&r, 2);
        break;
    case OP_WRITE_IMM:
        p.len = rng_below(&r, 32) ? random_size(&r, max) : 0;
        p.off = (uint32_t)rng_below(&r, max - p.len + 1);
        p.loff = (uint32_t)rng_below(&r, max - p.len + 1);
        p.nsge = p.len ? (unsigned)(1 + rng_below(&r, 3)) : 0;
        p.inline_data = p.len && p.len <= MAX_INLINE && rng_below(&r, 2);
        break;
    case OP_FETCH_ADD:
        p.len = 8;
        p.word = (unsigned)rng_below(&r, N_FADD_WORDS);
        p.add_or_swap = rng_next(&r) >> rng_below(&r, 64);
        break;
    case OP_CMP_SWP:
        p.len = 8;
        p.word = N_FADD_WORDS + (unsigned)rng_below(&r, N_ATOMIC_WORDS - N_FADD_WORDS);
        p.add_or_swap = rng_next(&r);
        p.cmp_should_match = rng_below(&r, 4) != 0;
        break;
    default:
        break;
    }
    return p;
}

// ---------------------------------------------------------------------------
// TCP side channel: fixed arrays of big-endian 64-bit words

static void write_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(EXIT_SETUP, "side channel send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

// Returns false on a clean end of stream before the first byte.
static bool read_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die(EXIT_SETUP, "side channel receive: %s", strerror(errno));
        if (n == 0) {
            if (got == 0) return false;
            die(EXIT_SETUP, "side channel closed mid-message");
        }
        got += (size_t)n;
    }
    return true;
}

enum { MSG_WORDS = 24 };

static void send_words(int fd, const uint64_t *w) {
    uint64_t be[MSG_WORDS];
    for (int i = 0; i < MSG_WORDS; i++)
        be[i] = htobe64(w[i]);
    write_all(fd, be, sizeof be);
}

static bool recv_words(int fd, uint64_t *w) {
    uint64_t be[MSG_WORDS];
    if (!read_all(fd, be, sizeof be)) return false;
    for (int i = 0; i < MSG_WORDS; i++)
        w[i] = be64toh(be[i]);
    return true;
}

static int tcp_listen(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die(EXIT_SETUP, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        die(EXIT_SETUP, "bind TCP port %d: %s", port, strerror(errno));
    if (listen(fd, 1) < 0) die(EXIT_SETUP, "listen: %s", strerror(errno));
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    // Scripts pass -p 0 and read the port from here.
    printf("%s: listening on port %d\n", role, ntohs(sa.sin_port));
    fflush(stdout);
    return fd;
}

static int tcp_connect(const char *host, int port) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc) die(EXIT_SETUP, "%s: %s", host, gai_strerror(rc));
    int fd = -1;
    // The server may still be starting up.
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            close(fd);
            fd = -1;
        }
        if (fd < 0) usleep(100 * 1000);
    }
    freeaddrinfo(res);
    if (fd < 0) die(EXIT_SETUP, "cannot connect to %s:%d", host, port);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

// ---------------------------------------------------------------------------
// Verbs resources

struct rdma {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf;
    size_t buf_len;
    union ibv_gid gid;
    struct ibv_port_attr port;
    int rd_atomic;
    uint32_t psn;
    uint32_t sq_size, rq_size;
};

static void open_device(struct rdma *r) {
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) die(EXIT_SETUP, "ibv_get_device_list: %s", strerror(errno));
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n; i++)
        if (!opt.dev || strcmp(ibv_get_device_name(list[i]), opt.dev) == 0) {
            dev = list[i];
            break;
        }
    if (!dev) die(EXIT_SETUP, "device %s not found", opt.dev ? opt.dev : "(any)");
    r->ctx = ibv_open_device(dev);
    if (!r->ctx)
        die(EXIT_SETUP, "ibv_open_device %s: %s", ibv_get_device_name(dev), strerror(errno));
    ibv_free_device_list(list);

    if (ibv_query_port(r->ctx, 1, &r->port)) die(EXIT_SETUP, "ibv_query_port: %s", strerror(errno));
    if (ibv_query_gid(r->ctx, 1, opt.gid_index, &r->gid))
        die(EXIT_SETUP, "ibv_query_gid index %d: %s", opt.gid_index, strerror(errno));
    struct ibv_device_attr da;
    if (ibv_query_device(r->ctx, &da)) die(EXIT_SETUP, "ibv_query_device: %s", strerror(errno));
    r->rd_atomic = da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16;
    if (da.max_qp_init_rd_atom < r->rd_atomic) r->rd_atomic = da.max_qp_init_rd_atom;
    if (r->rd_atomic < 1) r->rd_atomic = 1;

    r->pd = ibv_alloc_pd(r->ctx);
    if (!r->pd) die(EXIT_SETUP, "ibv_alloc_pd: %s", strerror(errno));
    r->channel = ibv_create_comp_channel(r->ctx);
    if (!r->channel) die(EXIT_SETUP, "ibv_create_comp_channel: %s", strerror(errno));
    srand48((long)(now_ms() ^ (uint64_t)getpid()));
    r->psn = (uint32_t)lrand48() & 0xffffff;
}

static void create_qp(struct rdma *r, uint32_t sq, uint32_t rq, size_t buf_len, int access) {
    r->sq_size = sq;
    r->rq_size = rq;
    r->buf_len = buf_len;
    if (posix_memalign((void **)&r->buf, 4096, buf_len))
        die(EXIT_SETUP, "out of memory for %zu bytes", buf_len);
    memset(r->buf, 0, buf_len);
    r->mr = ibv_reg_mr(r->pd, r->buf, buf_len, access);
    if (!r->mr) die(EXIT_SETUP, "ibv_reg_mr: %s", strerror(errno));
    r->cq = ibv_create_cq(r->ctx, (int)(sq + rq + 16), NULL, r->channel, 0);
    if (!r->cq) die(EXIT_SETUP, "ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = r->cq,
        .recv_cq = r->cq,
        .cap = {.max_send_wr = sq,
                .max_recv_wr = rq,
                .max_send_sge = 4,
                .max_recv_sge = 1,
                .max_inline_data = MAX_INLINE},
        .qp_type = IBV_QPT_RC,
    };
    r->qp = ibv_create_qp(r->pd, &ia);
    if (!r->qp) die(EXIT_SETUP, "ibv_create_qp: %s", strerror(errno));
    if (ia.cap.max_inline_data < MAX_INLINE)
        die(EXIT_SETUP, "device offers only %u bytes of inline data", ia.cap.max_inline_data);
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = 1,
        .qp_access_flags =
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
    };
    if (ibv_modify_qp(r->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die(EXIT_SETUP, "modify QP to INIT: %s", strerror(errno));
}

static enum ibv_mtu mtu_enum(int bytes) {
    switch (bytes) {
    case 256:
        return IBV_MTU_256;
    case 512:
        return IBV_MTU_512;
    case 1024:
        return IBV_MTU_1024;
    case 2048:
        return IBV_MTU_2048;
    case 4096:
        return IBV_MTU_4096;
    default:
        return 0;
    }
}

static enum ibv_mtu local_mtu(const struct rdma *r) {
    enum ibv_mtu m = r->port.active_mtu;
    if (opt.mtu && mtu_enum(opt.mtu) < m) m = mtu_enum(opt.mtu);
    return m;
}

// Enhanced connection establishment over the side channel, as rdma_cm does
// it in REQ and REP: each side offers its QP's ECE options and sets the
// peer's before the QP is connected (a device without ECE offers nothing).
static void offer_ece(struct rdma *r, uint64_t w[2]) {
    struct ibv_ece ece = {0};
    if (ibv_query_ece(r->qp, &ece)) ece.vendor_id = ece.options = 0;
    w[0] = ece.vendor_id;
    w[1] = ece.options;
}

static void accept_ece(struct rdma *r, const uint64_t w[2]) {
    struct ibv_ece ece = {.vendor_id = (uint32_t)w[0], .options = (uint32_t)w[1]};
    if (!ece.vendor_id) return;
    int err = ibv_set_ece(r->qp, &ece);
    // Another vendor's options are not this device's business.
    if (err && err != EINVAL && err != EOPNOTSUPP)
        die(EXIT_SETUP, "ibv_set_ece: %s", strerror(err));
}

static void connect_qp(struct rdma *r, uint32_t dqpn, uint32_t dpsn, const uint8_t *dgid,
                       enum ibv_mtu mtu) {
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = dqpn,
        .rq_psn = dpsn,
        .max_dest_rd_atomic = (uint8_t)r->rd_atomic,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1, .sl = 0},
    };
    memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)opt.gid_index;
    a.ah_attr.grh.hop_limit = opt.hop_limit;
    a.ah_attr.grh.flow_label = opt.flow_label;
    a.ah_attr.grh.traffic_class = opt.tclass;
    if (ibv_modify_qp(r->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die(EXIT_SETUP, "modify QP to RTR: %s", strerror(errno));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)opt.timeout;
    a.retry_cnt = (uint8_t)opt.retry;
    a.rnr_retry = 7;
    a.sq_psn = r->psn;
    a.max_rd_atomic = (uint8_t)r->rd_atomic;
    if (ibv_modify_qp(r->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die(EXIT_SETUP, "modify QP to RTS: %s", strerror(errno));
}

static void gid_to_words(const union ibv_gid *g, uint64_t *w) {
    memcpy(&w[0], g->raw, 8);
    memcpy(&w[1], g->raw + 8, 8);
    w[0] = be64toh(w[0]);
    w[1] = be64toh(w[1]);
}

static void words_to_gid(const uint64_t *w, uint8_t *raw) {
    uint64_t a = htobe64(w[0]), b = htobe64(w[1]);
    memcpy(raw, &a, 8);
    memcpy(raw + 8, &b, 8);
}

// A failed completion is the transport's verdict, not a data problem: report
// it in a form that scripts can match and give it its own exit status.
static void check_wc(const struct ibv_wc *wc) {
    if (wc->status == IBV_WC_SUCCESS) return;
    printf("%s: %" PRIu64 " operations completed before the error\n", role, ops_done);
    printf("wc error: %s (status %d) opcode %d wr_id %" PRIu64 "\n", ibv_wc_status_str(wc->status),
           (int)wc->status, (int)wc->opcode, wc->wr_id);
    fflush(stdout);
    exit(EXIT_WC);
}

// Polls the CQ, sleeping on the completion channel (and on `extra_fd` when
// >= 0) when there is nothing to do.  Returns the number of completions; 0
// means only extra_fd became readable or `wait_ms` passed.
static int wait_cq(struct rdma *r, struct ibv_wc *wc, int max, int extra_fd, int wait_ms) {
    int n = ibv_poll_cq(r->cq, max, wc);
    if (n) goto out;
    if (ibv_req_notify_cq(r->cq, 0)) die(EXIT_SETUP, "ibv_req_notify_cq: %s", strerror(errno));
    // Completions that raced with arming the CQ would not fire the channel.
    n = ibv_poll_cq(r->cq, max, wc);
    if (n) goto out;
    struct pollfd pf[2] = {{.fd = r->channel->fd, .events = POLLIN},
                           {.fd = extra_fd, .events = POLLIN}};
    int rc = poll(pf, extra_fd >= 0 ? 2 : 1, wait_ms);
    if (rc < 0 && errno != EINTR) die(EXIT_SETUP, "poll: %s", strerror(errno));
    if (rc > 0 && (pf[0].revents & POLLIN)) {
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        if (ibv_get_cq_event(r->channel, &ev_cq, &ev_ctx))
            die(EXIT_SETUP, "ibv_get_cq_event: %s", strerror(errno));
        ibv_ack_cq_events(ev_cq, 1);
    }
    n = ibv_poll_cq(r->cq, max, wc);
out:
    if (n < 0) die(EXIT_SETUP, "ibv_poll_cq failed");
    return n;
}

static void post_send(struct rdma *r, struct ibv_send_wr *wr) {
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(r->qp, wr, &bad);
    if (rc)
        die(EXIT_SETUP, "ibv_post_send (opcode %d, wr_id %" PRIu64 "): %s", (int)bad->opcode,
            bad->wr_id, strerror(rc));
}

static void post_recv(struct rdma *r, uint64_t wr_id, void *addr, uint32_t len) {
    struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    int rc = ibv_post_recv(r->qp, &wr, &bad);
    if (rc) die(EXIT_SETUP, "ibv_post_recv: %s", strerror(rc));
}

// Splits [addr, addr+len) into n contiguous SGEs of pseudo-random sizes.
static int split_sges(struct ibv_sge *sge, unsigned n, uint8_t *addr, uint32_t len, uint32_t lkey,
                      uint64_t salt) {
    if (len == 0) return 0;
    if (n > len) n = len;
    struct rng rr = {salt};
    uint32_t left = len;
    for (unsigned i = 0; i < n; i++) {
        uint32_t take = (i == n - 1) ? left : (uint32_t)(1 + rng_below(&rr, left - (n - 1 - i)));
        sge[i].addr = (uintptr_t)addr;
        sge[i].length = take;
        sge[i].lkey = lkey;
        addr += take;
        left -= take;
    }
    return (int)n;
}

// Reports the first differing byte and exits with the mismatch status.
static void compare_or_die(const uint8_t *got, const uint8_t *want, size_t len, const char *what,
                           uint64_t iter) {
    if (memcmp(got, want, len) == 0) return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    size_t bad = 0;
    for (size_t j = i; j < len; j++)
        bad += got[j] != want[j];
    die(EXIT_MISMATCH,
        "data mismatch: %s iteration %" PRIu64 ": byte %zu of %zu is 0x%02x, expected 0x%02x "
        "(%zu bytes differ)",
        what, iter, i, len, got[i], want[i], bad);
}

// ---------------------------------------------------------------------------
// Shared buffer layouts (offsets from the start of each side's MR)

struct layout {
    uint32_t depth, max;
    size_t a, b, c, d, total; // region starts
};

// Server: rw slots | write-imm ring | receive buffers | atomic words
// Client: source slots | read-back slots | atomic results + credits | final read
static struct layout make_layout(uint32_t depth, uint32_t max) {
    struct layout l = {.depth = depth, .max = max};
    size_t slot = ((size_t)max + 63) & ~(size_t)63;
    l.a = 0;
    l.b = l.a + slot * depth;
    l.c = l.b + slot * depth;
    l.d = l.c + slot * depth;
    l.total = l.d + 4096;
    return l;
}

static size_t slot_bytes(const struct layout *l) {
    return ((size_t)l->max + 63) & ~(size_t)63;
}

// ---------------------------------------------------------------------------
// Client

enum wr_kind { WK_WRITE = 1, WK_READ, WK_SEND, WK_WRITE_IMM, WK_ATOMIC, WK_FINAL, WK_RECV };

static uint64_t make_wrid(enum wr_kind k, uint32_t slot) {
    return ((uint64_t)k << 32) | slot;
}

struct unit {
    bool busy;
    uint64_t iter;
    struct op_params p;
    int pending; // completions (and credits) still expected
    uint64_t expect_atomic;
};

struct client_stats {
    uint64_t ops, bytes, by_type[OP_NTYPES];
};

static void run_client(void) {
    role = "xfer client";
    struct rdma r = {0};
    open_device(&r);
    if (opt.depth < 1 || opt.depth > MAX_DEPTH) die(EXIT_SETUP, "--depth must be 1..%d", MAX_DEPTH);
    struct layout L = make_layout(opt.depth, opt.max_size);
    size_t slot = slot_bytes(&L);
    uint32_t credit_bufs = opt.depth;
    create_qp(&r, 2 * opt.depth + 4, credit_bufs, L.total,
              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    uint8_t *src = r.buf + L.a, *dst = r.buf + L.b;
    uint64_t *atomic_res = (uint64_t *)(r.buf + L.c);
    uint64_t *credit = atomic_res + opt.depth;
    uint64_t *final_words = (uint64_t *)(r.buf + L.d);
    for (uint32_t i = 0; i < credit_bufs; i++)
        post_recv(&r, make_wrid(WK_RECV, i), &credit[i], 8);

    int fd = tcp_connect(opt.server, opt.port);
    uint64_t w[MSG_WORDS] = {MAGIC_HELLO, opt.seed,
                             opt.depth,   opt.max_size,
                             opt.stream,  r.qp->qp_num,
                             r.psn,       0,
                             0,           (uint64_t)local_mtu(&r),
                             opt.ops};
    gid_to_words(&r.gid, &w[7]);
    offer_ece(&r, &w[11]);
    send_words(fd, w);
    if (!recv_words(fd, w) || w[0] != MAGIC_REPLY) die(EXIT_SETUP, "bad reply from server");
    accept_ece(&r, &w[8]);
    uint32_t dqpn = (uint32_t)w[1], dpsn = (uint32_t)w[2];
    uint8_t dgid[16];
    words_to_gid(&w[3], dgid);
    uint32_t rkey = (uint32_t)w[5];
    uint64_t raddr = w[6];
    enum ibv_mtu mtu = (enum ibv_mtu)w[7];
    connect_qp(&r, dqpn, dpsn, dgid, mtu);
    printf("%s: connected, QP %u to QP %u, MTU %d%s\n", role, r.qp->qp_num, dqpn, 128 << mtu,
           opt.stream ? ", streaming" : "");
    // The server connects its QP before replying, so ours may start sending.

    uint64_t remote_rw = raddr + L.a, remote_ring = raddr + L.b, remote_atomic = raddr + L.d;
    struct unit units[MAX_DEPTH] = {0};
    uint32_t free_slots[MAX_DEPTH], nfree = 0;
    for (uint32_t i = opt.depth; i-- > 0;)
        free_slots[nfree++] = i;
    // SEND / WRITE_WITH_IMM in flight, oldest first: credits come back in this order.
    uint64_t msg_iter[MAX_DEPTH];
    uint32_t msg_slot[MAX_DEPTH], msg_head = 0, msg_count = 0;
    uint64_t msgs_sent = 0;
    uint64_t model[N_ATOMIC_WORDS] = {0};
    struct client_stats st = {0};
    uint8_t *expect = malloc(opt.max_size ? opt.max_size : 1);
    if (!expect) die(EXIT_SETUP, "out of memory");

    uint64_t limit = opt.stream && !opt.iters_set ? UINT64_MAX : opt.iters;
    uint64_t next_iter = 0, done = 0, last_progress = now_ms();
    uint64_t t0 = now_ms();
    struct ibv_wc wc[32];

    while (done < limit) {
        while (next_iter < limit && nfree) {
            uint32_t s = free_slots[--nfree];
            struct unit *u = &units[s];
            uint64_t iter = next_iter++;
            u->busy = true;
            u->iter = iter;
            uint8_t *lslot = src + slot * s;
            if (opt.stream) {
                // Throughput only: the payload is whatever is in the buffer.
                u->p = (struct op_params){.type = OP_WRITE_READ, .len = opt.max_size};
                struct ibv_sge sge = {(uintptr_t)lslot, opt.max_size, r.mr->lkey};
                struct ibv_send_wr wr = {.wr_id = make_wrid(WK_WRITE, s),
                                         .sg_list = &sge,
                                         .num_sge = 1,
                                         .opcode = IBV_WR_RDMA_WRITE,
                                         .send_flags = IBV_SEND_SIGNALED};
                wr.wr.rdma.remote_addr = remote_rw + slot * s;
                wr.wr.rdma.rkey = rkey;
                u->pending = 1;
                post_send(&r, &wr);
                continue;
            }
            struct op_params p = derive(iter);
            u->p = p;
            uint64_t key = pattern_key(iter);
            struct ibv_sge sge[4];
            struct ibv_send_wr wr = {.sg_list = sge};
            switch (p.type) {
            case OP_WRITE_READ: {
                pattern_fill(lslot + p.loff, key, 0, p.len);
                wr.wr_id = make_wrid(WK_WRITE, s);
                wr.num_sge = split_sges(sge, p.nsge, lslot + p.loff, p.len, r.mr->lkey, key);
                wr.opcode = IBV_WR_RDMA_WRITE;
                wr.send_flags = (p.signal_write ? IBV_SEND_SIGNALED : 0) |
                                (p.inline_data ? IBV_SEND_INLINE : 0);
                wr.wr.rdma.remote_addr = remote_rw + slot * s + p.off;
                wr.wr.rdma.rkey = rkey;
                post_send(&r, &wr);
                // Stale bytes from an earlier round must not pass the check.
                uint8_t *back = dst + slot * s + p.loff;
                memset(back, 0xEE ^ (uint8_t)iter, p.sublen);
                struct ibv_send_wr rd = {.sg_list = sge, .opcode = IBV_WR_RDMA_READ};
                rd.wr_id = make_wrid(WK_READ, s);
                rd.num_sge = split_sges(sge, 4 - p.nsge, back, p.sublen, r.mr->lkey, ~key);
                rd.send_flags = IBV_SEND_SIGNALED;
                rd.wr.rdma.remote_addr = remote_rw + slot * s + p.off + p.suboff;
                rd.wr.rdma.rkey = rkey;
                post_send(&r, &rd);
                u->pending = 1 + p.signal_write;
                st.bytes += p.len + p.sublen;
                break;
            }
            case OP_SEND:
            case OP_WRITE_IMM: {
                pattern_fill(lslot + p.loff, key, 0, p.len);
                if (p.type == OP_SEND) {
                    uint64_t hdr = htole64(iter);
                    memcpy(lslot + p.loff, &hdr, 8);
                }
                wr.num_sge = split_sges(sge, p.nsge, lslot + p.loff, p.len, r.mr->lkey, key);
                wr.send_flags = IBV_SEND_SIGNALED | (p.inline_data ? IBV_SEND_INLINE : 0);
                if (p.type == OP_SEND) {
                    wr.wr_id = make_wrid(WK_SEND, s);
                    wr.opcode = p.with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
                } else {
                    wr.wr_id = make_wrid(WK_WRITE_IMM, s);
                    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                    // The server's ring slot follows from the message count.
                    wr.wr.rdma.remote_addr = remote_ring + slot * (msgs_sent % opt.depth) + p.off;
                    wr.wr.rdma.rkey = rkey;
                }
                wr.imm_data = htonl((uint32_t)iter);
                uint32_t q = (msg_head + msg_count) % MAX_DEPTH;
                msg_iter[q] = iter;
                msg_slot[q] = s;
                msg_count++;
                msgs_sent++;
                post_send(&r, &wr);
                u->pending = 2; // local completion + credit
                st.bytes += p.len;
                break;
            }
            case OP_FETCH_ADD:
            case OP_CMP_SWP: {
                sge[0] = (struct ibv_sge){(uintptr_t)&atomic_res[s], 8, r.mr->lkey};
                atomic_res[s] = 0xdeadbeefdeadbeefull;
                wr.wr_id = make_wrid(WK_ATOMIC, s);
                wr.num_sge = 1;
                wr.send_flags = IBV_SEND_SIGNALED;
                wr.wr.atomic.remote_addr = remote_atomic + 8 * p.word;
                wr.wr.atomic.rkey = rkey;
                u->expect_atomic = model[p.word];
                if (p.type == OP_FETCH_ADD) {
                    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                    wr.wr.atomic.compare_add = p.add_or_swap;
                    model[p.word] += p.add_or_swap;
                } else {
                    wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
                    wr.wr.atomic.compare_add = p.cmp_should_match ? model[p.word] : ~model[p.word];
                    wr.wr.atomic.swap = p.add_or_swap;
                    if (p.cmp_should_match) model[p.word] = p.add_or_swap;
                }
                post_send(&r, &wr);
                u->pending = 1;
                st.bytes += 8;
                break;
            }
            default:
                break;
            }
        }

        int n = wait_cq(&r, wc, 32, -1, 100);
        if (n == 0) {
            if (opt.stall_ms && now_ms() - last_progress > (uint64_t)opt.stall_ms) {
                fprintf(stderr,
                        "%s: no completion for %d ms: %" PRIu64 " of %" PRIu64
                        " iterations done, %u in flight, %u credits owed\n",
                        role, opt.stall_ms, done, next_iter, opt.depth - nfree, msg_count);
                for (uint32_t i = 0; i < opt.depth; i++)
                    if (units[i].busy)
                        fprintf(stderr, "  slot %u: iteration %" PRIu64 " %s len %u pending %d\n",
                                i, units[i].iter, op_name[units[i].p.type], units[i].p.len,
                                units[i].pending);
                exit(EXIT_STALL);
            }
            continue;
        }
        last_progress = now_ms();
        for (int i = 0; i < n; i++) {
            check_wc(&wc[i]);
            enum wr_kind k = (enum wr_kind)(wc[i].wr_id >> 32);
            uint32_t s = (uint32_t)wc[i].wr_id;
            if (k == WK_RECV) {
                uint64_t it = le64toh(credit[s]);
                if (!msg_count)
                    die(EXIT_MISMATCH, "credit for iteration %" PRIu64 " with no message in flight",
                        it);
                if (it != msg_iter[msg_head])
                    die(EXIT_MISMATCH, "credit for iteration %" PRIu64 ", expected %" PRIu64, it,
                        msg_iter[msg_head]);
                s = msg_slot[msg_head];
                msg_head = (msg_head + 1) % MAX_DEPTH;
                msg_count--;
                post_recv(&r, make_wrid(WK_RECV, (uint32_t)wc[i].wr_id),
                          &credit[(uint32_t)wc[i].wr_id], 8);
            } else if (s >= opt.depth || !units[s].busy) {
                die(EXIT_MISMATCH, "completion with unknown wr_id %" PRIu64, wc[i].wr_id);
            }
            struct unit *u = &units[s];
            if (k == WK_READ && !opt.stream) {
                uint8_t *back = dst + slot * s + u->p.loff;
                pattern_fill(expect, pattern_key(u->iter), u->p.suboff, u->p.sublen);
                compare_or_die(back, expect, u->p.sublen, "RDMA READ of written data", u->iter);
            } else if (k == WK_ATOMIC) {
                if (atomic_res[s] != u->expect_atomic)
                    die(EXIT_MISMATCH,
                        "%s iteration %" PRIu64 " on word %u returned 0x%" PRIx64
                        ", expected 0x%" PRIx64,
                        op_name[u->p.type], u->iter, u->p.word, atomic_res[s], u->expect_atomic);
            }
            if (--u->pending == 0) {
                u->busy = false;
                free_slots[nfree++] = s;
                done++;
                ops_done = done;
                st.ops++;
                st.by_type[u->p.type]++;
                if (opt.stream) st.bytes += opt.max_size;
            }
        }
    }

    if (!opt.stream) {
        // Every atomic result was checked one by one; this also proves no
        // replayed or lost atomic changed the words afterwards.
        struct ibv_sge sge = {(uintptr_t)final_words, 8 * N_ATOMIC_WORDS, r.mr->lkey};
        struct ibv_send_wr rd = {.wr_id = make_wrid(WK_FINAL, 0),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_READ,
                                 .send_flags = IBV_SEND_SIGNALED};
        rd.wr.rdma.remote_addr = remote_atomic;
        rd.wr.rdma.rkey = rkey;
        post_send(&r, &rd);
        uint64_t start = now_ms();
        for (;;) {
            int n = wait_cq(&r, wc, 1, -1, 100);
            if (n == 1) {
                check_wc(&wc[0]);
                break;
            }
            if (opt.stall_ms && now_ms() - start > (uint64_t)opt.stall_ms)
                die(EXIT_STALL, "final RDMA READ did not complete");
        }
        for (int i = 0; i < N_ATOMIC_WORDS; i++)
            if (final_words[i] != model[i])
                die(EXIT_MISMATCH, "atomic word %d is 0x%" PRIx64 ", expected 0x%" PRIx64, i,
                    final_words[i], model[i]);
    }
    uint64_t elapsed = now_ms() - t0;

    memset(w, 0, sizeof w);
    w[0] = MAGIC_DONE;
    w[1] = done;
    w[2] = msgs_sent;
    for (int i = 0; i < N_ATOMIC_WORDS && !opt.stream; i++)
        w[3 + i] = model[i];
    send_words(fd, w);
    // Our QP stays up until the server answers, so ACKs for its last credits
    // can still be retransmitted on a lossy link.
    if (!recv_words(fd, w) || w[0] != MAGIC_RESULT) die(EXIT_SETUP, "no result from server");
    if (w[1] != 0) die((int)w[1], "server reported failure (exit status %" PRIu64 ")", w[1]);

    if (opt.verbose)
        for (int t = 0; t < OP_NTYPES; t++)
            printf("%s: %-10s %" PRIu64 "\n", role, op_name[t], st.by_type[t]);
    printf("%s: %" PRIu64 " ms, %.1f MB/s\n", role, elapsed,
           elapsed ? (double)st.bytes / 1000.0 / (double)elapsed : 0.0);
    printf("xfer: %" PRIu64 " ops, %" PRIu64 " bytes, OK\n", st.ops, st.bytes);
    fflush(stdout);
    close(fd);
    free(expect);
    ibv_destroy_qp(r.qp);
    ibv_destroy_cq(r.cq);
    ibv_dereg_mr(r.mr);
    free(r.buf);
    ibv_destroy_comp_channel(r.channel);
    ibv_dealloc_pd(r.pd);
    ibv_close_device(r.ctx);
    exit(0);
}

// ---------------------------------------------------------------------------
// Server

static void run_server(void) {
    role = "xfer server";
    struct rdma r = {0};
    open_device(&r);
    int lfd = tcp_listen(opt.port);
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) die(EXIT_SETUP, "accept: %s", strerror(errno));
    close(lfd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    uint64_t w[MSG_WORDS];
    if (!recv_words(fd, w) || w[0] != MAGIC_HELLO) die(EXIT_SETUP, "bad hello from client");
    // The client's choices define the payloads this side must expect.
    opt.seed = w[1];
    opt.depth = (uint32_t)w[2];
    opt.max_size = (uint32_t)w[3];
    opt.stream = w[4] != 0;
    opt.ops = (unsigned)w[10];
    uint32_t dqpn = (uint32_t)w[5], dpsn = (uint32_t)w[6];
    uint8_t dgid[16];
    words_to_gid(&w[7], dgid);
    enum ibv_mtu mtu = (enum ibv_mtu)w[9];
    if (local_mtu(&r) < mtu) mtu = local_mtu(&r);
    if (opt.depth < 1 || opt.depth > MAX_DEPTH || opt.max_size == 0)
        die(EXIT_SETUP, "client asked for depth %u, max size %u", opt.depth, opt.max_size);

    struct layout L = make_layout(opt.depth, opt.max_size);
    size_t slot = slot_bytes(&L);
    uint32_t nrecv = opt.depth;
    create_qp(&r, 2 * opt.depth + 4, nrecv, L.total,
              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                  IBV_ACCESS_REMOTE_ATOMIC);
    uint8_t *ring = r.buf + L.b, *rbuf = r.buf + L.c;
    uint64_t *atomic_words = (uint64_t *)(r.buf + L.d);
    for (uint32_t i = 0; i < nrecv; i++)
        post_recv(&r, i, rbuf + slot * i, opt.max_size);
    uint64_t client_ece[2] = {w[11], w[12]};
    accept_ece(&r, client_ece);
    connect_qp(&r, dqpn, dpsn, dgid, mtu);

    memset(w, 0, sizeof w);
    w[0] = MAGIC_REPLY;
    w[1] = r.qp->qp_num;
    w[2] = r.psn;
    gid_to_words(&r.gid, &w[3]);
    w[5] = r.mr->rkey;
    w[6] = (uintptr_t)r.buf;
    w[7] = (uint64_t)mtu;
    offer_ece(&r, &w[8]); // what both agreed on, after accept_ece
    send_words(fd, w);
    printf("%s: connected, QP %u to QP %u, MTU %d\n", role, r.qp->qp_num, dqpn, 128 << mtu);

    uint8_t *expect = malloc(opt.max_size);
    if (!expect) die(EXIT_SETUP, "out of memory");
    uint64_t msgs = 0, bytes = 0, last_iter = 0;
    uint32_t sends_out = 0;
    // Credits owed but not yet posted because the send queue is full.
    uint64_t owed[MAX_DEPTH];
    uint32_t owed_head = 0, owed_count = 0;
    bool client_done = false;
    uint64_t client_msgs = 0, client_model[N_ATOMIC_WORDS] = {0};
    struct ibv_wc wc[32];

    for (;;) {
        while (owed_count && sends_out < r.sq_size) {
            uint64_t credit = htole64(owed[owed_head]);
            struct ibv_sge sge = {(uintptr_t)&credit, 8, 0};
            struct ibv_send_wr wr = {.wr_id = owed[owed_head],
                                     .sg_list = &sge,
                                     .num_sge = 1,
                                     .opcode = IBV_WR_SEND,
                                     .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
            post_send(&r, &wr);
            sends_out++;
            owed_head = (owed_head + 1) % MAX_DEPTH;
            owed_count--;
        }
        if (client_done && msgs == client_msgs && !owed_count && !sends_out) break;
        int n = wait_cq(&r, wc, 32, client_done ? -1 : fd, 200);
        if (n == 0 && !client_done) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            if (poll(&pf, 1, 0) > 0) {
                if (!recv_words(fd, w)) {
                    if (opt.stream) break; // the client went away; nothing to check
                    die(EXIT_SETUP, "client closed the connection early");
                }
                if (w[0] != MAGIC_DONE) die(EXIT_SETUP, "unexpected message from client");
                client_done = true;
                client_msgs = w[2];
                memcpy(client_model, &w[3], sizeof client_model);
            }
        }
        for (int i = 0; i < n; i++) {
            check_wc(&wc[i]);
            if (wc[i].opcode == IBV_WC_SEND) {
                sends_out--;
                continue;
            }
            uint32_t b = (uint32_t)wc[i].wr_id;
            uint64_t iter;
            if (wc[i].opcode == IBV_WC_RECV) {
                uint8_t *buf = rbuf + slot * b;
                if (wc[i].byte_len < 8)
                    die(EXIT_MISMATCH, "SEND of %u bytes is too short", wc[i].byte_len);
                memcpy(&iter, buf, 8);
                iter = le64toh(iter);
                struct op_params p = derive(iter);
                if (p.type != OP_SEND)
                    die(EXIT_MISMATCH, "SEND names iteration %" PRIu64 ", which is a %s", iter,
                        op_name[p.type]);
                if ((wc[i].wc_flags & IBV_WC_WITH_IMM) != (p.with_imm ? IBV_WC_WITH_IMM : 0u))
                    die(EXIT_MISMATCH, "SEND iteration %" PRIu64 ": immediate flag wrong", iter);
                if (p.with_imm && ntohl(wc[i].imm_data) != (uint32_t)iter)
                    die(EXIT_MISMATCH, "SEND iteration %" PRIu64 ": immediate 0x%x", iter,
                        ntohl(wc[i].imm_data));
                if (wc[i].byte_len != p.len)
                    die(EXIT_MISMATCH, "SEND iteration %" PRIu64 ": %u bytes, expected %u", iter,
                        wc[i].byte_len, p.len);
                pattern_fill(expect, pattern_key(iter), 0, p.len);
                uint64_t hdr = htole64(iter);
                memcpy(expect, &hdr, 8);
                compare_or_die(buf, expect, p.len, "SEND payload", iter);
                bytes += p.len;
            } else if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                if (!(wc[i].wc_flags & IBV_WC_WITH_IMM))
                    die(EXIT_MISMATCH, "WRITE_WITH_IMM completion without IBV_WC_WITH_IMM");
                // The immediate holds the low 32 bits; iterations only grow.
                uint32_t lo = ntohl(wc[i].imm_data);
                iter = (last_iter & ~0xffffffffull) | lo;
                if (iter < last_iter) iter += 1ull << 32;
                struct op_params p = derive(iter);
                if (p.type != OP_WRITE_IMM)
                    die(EXIT_MISMATCH, "WRITE_WITH_IMM names iteration %" PRIu64 ", which is a %s",
                        iter, op_name[p.type]);
                uint8_t *data = ring + slot * (msgs % opt.depth) + p.off;
                pattern_fill(expect, pattern_key(iter), 0, p.len);
                compare_or_die(data, expect, p.len, "RDMA WRITE_WITH_IMM data", iter);
                bytes += p.len;
            } else {
                die(EXIT_MISMATCH, "unexpected completion opcode %d", (int)wc[i].opcode);
            }
            if (msgs && iter <= last_iter)
                die(EXIT_MISMATCH, "message for iteration %" PRIu64 " after iteration %" PRIu64,
                    iter, last_iter);
            last_iter = iter;
            msgs++;
            ops_done = msgs;
            post_recv(&r, b, rbuf + slot * b, opt.max_size);
            owed[(owed_head + owed_count) % MAX_DEPTH] = iter;
            owed_count++;
        }
    }

    uint64_t status = 0;
    if (client_done && !opt.stream)
        for (int i = 0; i < N_ATOMIC_WORDS; i++)
            if (atomic_words[i] != client_model[i]) {
                fprintf(stderr,
                        "%s: atomic word %d is 0x%" PRIx64 " in memory, client expects 0x%" PRIx64
                        "\n",
                        role, i, atomic_words[i], client_model[i]);
                status = EXIT_MISMATCH;
            }
    if (client_done) {
        memset(w, 0, sizeof w);
        w[0] = MAGIC_RESULT;
        w[1] = status;
        w[2] = msgs;
        send_words(fd, w);
    }
    if (opt.hold_ms > 0) usleep((useconds_t)opt.hold_ms * 1000);
    if (status) exit((int)status);
    printf("xfer: %" PRIu64 " ops, %" PRIu64 " bytes, OK\n", msgs, bytes);
    fflush(stdout);
    close(fd);
    free(expect);
    ibv_destroy_qp(r.qp);
    ibv_destroy_cq(r.cq);
    ibv_dereg_mr(r.mr);
    free(r.buf);
    ibv_destroy_comp_channel(r.channel);
    ibv_dealloc_pd(r.pd);
    ibv_close_device(r.ctx);
    exit(0);
}

// ---------------------------------------------------------------------------

static void usage(FILE *f) {
    fprintf(f, "usage: sroce_xfer -d DEV [options]            (server)\n"
               "       sroce_xfer -d DEV [options] SERVER     (client)\n"
               "  -d, --ib-dev DEV      RDMA device\n"
               "  -g, --gid-index N     local GID index (default 1)\n"
               "  -p, --port N          TCP port of the side channel (default 18600;\n"
               "                        0 on the server picks one and prints it)\n"
               "  -n, --iters N         operations to run (default 1000)\n"
               "      --seed N          seed of the operation mix (default 1)\n"
               "      --max-size N      largest message in bytes (default 262144)\n"
               "      --depth N         operations in flight (default 8)\n"
               "      --timeout N       QP local ACK timeout exponent (default 14)\n"
               "      --retry N         QP retry count (default 7)\n"
               "      --mtu N           path MTU in bytes (default: the port's)\n"
               "      --hold-ms N       server: keep the QP N ms after the run ends\n"
               "      --stream          client: RDMA WRITE without checks until an error\n"
               "                        (or -n operations, when given)\n"
               "      --stall-ms N      give up after N ms without a completion (default\n"
               "                        30000, 0 = never)\n"
               "      --flow-label N    flow label of this side's packets (default 0)\n"
               "      --tclass N        their traffic class (IPv4 TOS; default 0)\n"
               "      --hop-limit N     their hop limit (IPv4 TTL; default 64)\n"
               "      --ops LIST        operation types to mix, comma-separated, from\n"
               "                        write (write + read back), send, imm (write with\n"
               "                        immediate), fadd, cswp (default: all)\n"
               "  -v, --verbose         per-operation-type counts\n"
               "exit status: 0 OK, 1 setup error, 2 data mismatch, 3 completion error,\n"
               "4 stalled\n");
}

static uint64_t parse_num(const char *s, const char *what, uint64_t min, uint64_t max) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *s == '\0' || *end != '\0' || *s == '-' || v < min || v > max) {
        fprintf(stderr, "sroce_xfer: invalid %s '%s' (%" PRIu64 "..%" PRIu64 ")\n", what, s, min,
                max);
        exit(EXIT_SETUP);
    }
    return v;
}

static unsigned parse_ops(const char *list) {
    static const char *names[OP_NTYPES] = {"write", "send", "imm", "fadd", "cswp"};
    unsigned mask = 0;
    char *copy = strdup(list), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < OP_NTYPES && strcmp(tok, names[i]) != 0)
            i++;
        if (i == OP_NTYPES) {
            fprintf(stderr, "sroce_xfer: unknown operation type '%s' in --ops\n", tok);
            exit(EXIT_SETUP);
        }
        mask |= 1u << i;
    }
    free(copy);
    if (!mask) {
        fprintf(stderr, "sroce_xfer: --ops is empty\n");
        exit(EXIT_SETUP);
    }
    return mask;
}

int main(int argc, char **argv) {
    enum {
        O_SEED = 256,
        O_MAX_SIZE,
        O_DEPTH,
        O_TIMEOUT,
        O_RETRY,
        O_MTU,
        O_HOLD,
        O_STREAM,
        O_STALL,
        O_OPS,
        O_FLOW_LABEL,
        O_TCLASS,
        O_HOP_LIMIT
    };
    static const struct option longopts[] = {
        {"ib-dev", required_argument, NULL, 'd'},
        {"gid-index", required_argument, NULL, 'g'},
        {"port", required_argument, NULL, 'p'},
        {"iters", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, O_SEED},
        {"max-size", required_argument, NULL, O_MAX_SIZE},
        {"depth", required_argument, NULL, O_DEPTH},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"retry", required_argument, NULL, O_RETRY},
        {"mtu", required_argument, NULL, O_MTU},
        {"hold-ms", required_argument, NULL, O_HOLD},
        {"stream", no_argument, NULL, O_STREAM},
        {"stall-ms", required_argument, NULL, O_STALL},
        {"ops", required_argument, NULL, O_OPS},
        {"flow-label", required_argument, NULL, O_FLOW_LABEL},
        {"tclass", required_argument, NULL, O_TCLASS},
        {"hop-limit", required_argument, NULL, O_HOP_LIMIT},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "d:g:p:n:vh", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            opt.dev = optarg;
            break;
        case 'g':
            opt.gid_index = (int)parse_num(optarg, "GID index", 0, 255);
            break;
        case 'p':
            opt.port = (int)parse_num(optarg, "port", 0, 65535);
            break;
        case 'n':
            opt.iters = parse_num(optarg, "iteration count", 0, UINT64_MAX);
            opt.iters_set = true;
            break;
        case O_SEED:
            opt.seed = parse_num(optarg, "seed", 0, UINT64_MAX);
            break;
        case O_MAX_SIZE:
            opt.max_size = (uint32_t)parse_num(optarg, "max size", 8, 1u << 30);
            break;
        case O_DEPTH:
            opt.depth = (uint32_t)parse_num(optarg, "depth", 1, MAX_DEPTH);
            break;
        case O_TIMEOUT:
            opt.timeout = (int)parse_num(optarg, "timeout", 0, 31);
            break;
        case O_RETRY:
            opt.retry = (int)parse_num(optarg, "retry count", 0, 7);
            break;
        case O_MTU:
            opt.mtu = (int)parse_num(optarg, "MTU", 256, 4096);
            if (!mtu_enum(opt.mtu)) {
                fprintf(stderr, "sroce_xfer: MTU must be 256, 512, 1024, 2048 or 4096\n");
                return EXIT_SETUP;
            }
            break;
        case O_HOLD:
            opt.hold_ms = (int)parse_num(optarg, "hold time", 0, 3600000);
            break;
        case O_STREAM:
            opt.stream = true;
            break;
        case O_STALL:
            opt.stall_ms = (int)parse_num(optarg, "stall time", 0, 3600000);
            break;
        case O_OPS:
            opt.ops = parse_ops(optarg);
            break;
        case O_FLOW_LABEL:
            opt.flow_label = (uint32_t)parse_num(optarg, "flow label", 0, 0xFFFFF);
            break;
        case O_TCLASS:
            opt.tclass = (uint8_t)parse_num(optarg, "traffic class", 0, 255);
            break;
        case O_HOP_LIMIT:
            opt.hop_limit = (uint8_t)parse_num(optarg, "hop limit", 1, 255);
            break;
        case 'v':
            opt.verbose = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_SETUP;
        }
    }
    if (optind < argc) opt.server = argv[optind++];
    if (optind < argc) {
        usage(stderr);
        return EXIT_SETUP;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (opt.server)
        run_client();
    else
        run_server();
    return 0;
}
