// SPDX-License-Identifier: MIT
/*
 * remote_log - an append-only log kept in a file on another host, made
 * durable with write-commit (<infiniband/verbs_ext.h>).
 *
 * The target (--server) maps a file MAP_SHARED and registers it with
 * IBV_ACCESS_FLUSH_PERSISTENT.  The file holds
 *
 *   offset 0    the commit record: head index H (8 bytes), meaning
 *               "records 1..H are complete and durable"
 *   offset 8    a magic number naming the file as a remote_log log
 *   offset 64   record 1, record 2, ...: a header (sequence number, payload
 *               length, checksum), then the payload, padded to 8 bytes
 *
 * The initiator appends each record with two work requests:
 *
 *   1. an ordinary RDMA WRITE of the record into the next free space;
 *   2. an ORDERED write-commit of the new head index to offset 0, with the
 *      record's sequence number as immediate data.
 *
 * ORDERED makes the target persist the record (every earlier write to the
 * rkey) before it places the new head, so a crash at any moment leaves a
 * head that points only at complete records: the log needs no recovery scan
 * beyond H.  The initiator's IBV_WC_RDMA_WRITE_COMMIT completion means the
 * head, and so the record, is durable; the target's receive completion with
 * the immediate tells the target's software the same thing.
 *
 * With --pmem the target maps the file through libpmem's pmem_map_file().
 * On a DAX file system over persistent memory libpmem then vouches for the
 * mapping (pmem_is_pmem), and the RNIC makes each commit durable by writing
 * back CPU cache lines instead of calling msync.  libpmem recognises only
 * mappings it made itself, which is why an ordinary mmap never takes that
 * path.
 *
 * Native write-commit opcodes are used only when the target declared them:
 * it sends its ibv_query_commit_caps() flags along with its QP number, and
 * the initiator hands them to ibv_qp_set_commit_peer().  Without that (or
 * with --no-native) the same promise is kept with IBTA FLUSH sequences.
 *
 * Build:  cc -o remote_log remote_log.c $(pkg-config --cflags --libs libibverbs-ext libpmem)
 * Run on two sroce links on loopback (see sroce(8)):
 *         sroce link add sroce0 netdev lo addr 127.0.0.1
 *         sroce link add sroce1 netdev lo addr 127.0.0.2
 *         ./remote_log --server -d sroce0 -g 1 --file /var/tmp/log &
 *         ./remote_log -d sroce1 -g 1 -n 1000 127.0.0.1
 *         ./remote_log --verify /var/tmp/log
 */
#define _GNU_SOURCE /* getopt_long, htole64 and friends */
#include <infiniband/verbs_ext.h>
#include <libpmem.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    DEPTH = 16,     /* records in flight at the initiator */
    RQ_DEPTH = 64,  /* receives the target keeps posted for the immediates */
    LOG_START = 64, /* first record; the commit record has a cache line to itself */
    EXIT_USAGE = 2,
    EXIT_WC = 3, /* a work completion failed (the peer died, access error, ...) */
};

static const uint64_t log_magic = 0x31676f6c2d6d6472ULL; /* "rdm-log1" */

/* A record header as stored in the file, little-endian. */
struct record_hdr {
    uint64_t seq;
    uint32_t len; /* payload bytes */
    uint32_t sum; /* record_sum() of seq, len and payload */
};

struct options {
    bool server, native, pmem;
    const char *dev, *host, *file, *verify;
    int gid_index, port;
    uint64_t records, size;
    uint32_t record_size;
};

/* What each side tells the other over TCP, every number big-endian. */
struct conn_info {
    uint64_t qpn, psn, mtu;
    uint8_t gid[16];
    uint64_t rkey, addr, size; /* the target's log */
    uint64_t commit_caps;      /* the target's ibv_query_commit_caps() flags */
};

/* One end of the connection. */
struct end {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    uint8_t rd_atomic; /* FLUSH, like READ, takes a responder resource */
    uint32_t psn;
};

static void die(int status, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fputs("remote_log: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

static size_t align8(size_t n) {
    return (n + 7) & ~(size_t)7;
}

/* FNV-1a: short, and enough to catch a torn or missing record. */
static uint32_t fnv1a(uint32_t h, const void *data, size_t len) {
    const uint8_t *p = data;

    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static uint32_t record_sum(uint64_t seq, uint32_t len, const void *payload) {
    uint64_t seq_le = htole64(seq);
    uint32_t len_le = htole32(len);
    uint32_t h = fnv1a(2166136261u, &seq_le, sizeof(seq_le));

    h = fnv1a(h, &len_le, sizeof(len_le));
    return fnv1a(h, payload, len);
}

/* Builds record seq at buf; returns the bytes it takes in the log. */
static size_t make_record(uint8_t *buf, uint64_t seq, uint32_t len) {
    struct record_hdr hdr;
    char text[32];
    int n = snprintf(text, sizeof(text), "record %llu. ", (unsigned long long)seq);
    uint8_t *payload = buf + sizeof(hdr);

    for (uint32_t i = 0; i < len; i++)
        payload[i] = (uint8_t)text[i % (unsigned)n];
    hdr.seq = htole64(seq);
    hdr.len = htole32(len);
    hdr.sum = htole32(record_sum(seq, len, payload));
    memcpy(buf, &hdr, sizeof(hdr));
    memset(payload + len, 0, align8(sizeof(hdr) + len) - sizeof(hdr) - len);
    return align8(sizeof(hdr) + len);
}

/* --verify: offline check of a log file.  Records past the head may be
 * torn (a crash between a record and its commit); those before may not. */
static int verify_log(const char *path) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    uint64_t head, magic, off = LOG_START;
    const uint8_t *log;

    if (fd < 0 || fstat(fd, &st)) die(1, "%s: %s", path, strerror(errno));
    if ((uint64_t)st.st_size < LOG_START) die(1, "%s: not a remote_log file (too short)", path);
    log = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (log == MAP_FAILED) die(1, "mmap %s: %s", path, strerror(errno));
    memcpy(&head, log, 8);
    memcpy(&magic, log + 8, 8);
    head = le64toh(head);
    if (le64toh(magic) != log_magic) die(1, "%s: not a remote_log file (bad magic)", path);

    for (uint64_t seq = 1; seq <= head; seq++) {
        struct record_hdr hdr;
        const char *bad = NULL;

        if (off + sizeof(hdr) > (uint64_t)st.st_size) {
            bad = "past the end of the file";
        } else {
            memcpy(&hdr, log + off, sizeof(hdr));
            if (le64toh(hdr.seq) != seq)
                bad = "wrong sequence number";
            else if (off + sizeof(hdr) + le32toh(hdr.len) > (uint64_t)st.st_size)
                bad = "length past the end of the file";
            else if (record_sum(seq, le32toh(hdr.len), log + off + sizeof(hdr)) != le32toh(hdr.sum))
                bad = "bad checksum";
        }
        if (bad) {
            printf("log bad: head %llu, record %llu at offset %llu: %s\n", (unsigned long long)head,
                   (unsigned long long)seq, (unsigned long long)off, bad);
            return 1;
        }
        off += align8(sizeof(hdr) + le32toh(hdr.len));
    }
    printf("log ok: %llu records\n", (unsigned long long)head);
    munmap((void *)log, (size_t)st.st_size);
    close(fd);
    return 0;
}

/* ------------------------------------------------------------------ TCP */

static void send_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;

    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(1, "TCP send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

/* false when the peer closed the connection */
static bool recv_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;

    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die(1, "TCP receive: %s", strerror(errno));
        if (n == 0) return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static int tcp_accept_one(int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t sl = sizeof(sa);
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), fd;

    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 1))
        die(1, "TCP port %d: %s", port, strerror(errno));
    /* With -p 0 the kernel picks the port; scripts read it from here. */
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    printf("remote_log: listening on port %d\n", ntohs(sa.sin_port));
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) die(1, "accept: %s", strerror(errno));
    close(lfd);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int tcp_connect(const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    char service[8];
    int one = 1, fd, rc;

    snprintf(service, sizeof(service), "%d", port);
    rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) die(1, "%s: %s", host, gai_strerror(rc));
    /* The target may still be starting: retry for about 10 s. */
    for (int attempt = 0;; attempt++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die(1, "socket: %s", strerror(errno));
        if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) break;
        if (errno != ECONNREFUSED || attempt == 100)
            die(1, "connect to %s port %d: %s", host, port, strerror(errno));
        close(fd);
        usleep(100 * 1000);
    }
    freeaddrinfo(ai);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* ---------------------------------------------------------------- verbs */

static void open_end(struct end *e, const char *name, int gid_index, int cqe) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_port_attr port;
    struct ibv_device_attr attr;

    if (!list) die(1, "ibv_get_device_list: %s", strerror(errno));
    for (int i = 0; list[i] && !e->ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name)) e->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!e->ctx) die(1, "cannot open device %s", name);
    if (ibv_query_port(e->ctx, 1, &port) || ibv_query_gid(e->ctx, 1, gid_index, &e->gid) ||
        ibv_query_device(e->ctx, &attr))
        die(1, "%s: cannot query port 1, GID %d or the device", name, gid_index);
    e->mtu = port.active_mtu;
    e->rd_atomic = (uint8_t)(attr.max_qp_rd_atom < 16 ? attr.max_qp_rd_atom : 16);
    e->psn = (uint32_t)(time(NULL) ^ getpid()) & 0xffffff;
    e->pd = ibv_alloc_pd(e->ctx);
    /* A completion channel lets both sides sleep between completions
     * instead of spinning on the CQ. */
    e->channel = ibv_create_comp_channel(e->ctx);
    e->cq = e->channel ? ibv_create_cq(e->ctx, cqe, NULL, e->channel, 0) : NULL;
    if (!e->pd || !e->cq) die(1, "ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
}

static void create_qp(struct end *e, uint64_t send_ops, uint32_t send_wr, uint32_t recv_wr) {
    struct ibv_qp_init_attr_ex attr = {
        .qp_type = IBV_QPT_RC,
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .cap = {.max_send_wr = send_wr,
                .max_recv_wr = recv_wr,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = 8},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = e->pd,
        .send_ops_flags = send_ops,
    };

    e->qp = ibv_create_qp_ex(e->ctx, &attr);
    if (!e->qp) die(1, "ibv_create_qp_ex: %s", strerror(errno));
}

static void fill_info(const struct end *e, struct conn_info *info) {
    memset(info, 0, sizeof(*info));
    info->qpn = htobe64(e->qp->qp_num);
    info->psn = htobe64(e->psn);
    info->mtu = htobe64(e->mtu);
    memcpy(info->gid, e->gid.raw, 16);
}

/* RESET -> INIT -> RTR -> RTS, aimed at the peer's QP. */
static void connect_qp(struct end *e, const struct conn_info *peer, int gid_index,
                       unsigned access) {
    enum ibv_mtu peer_mtu = (enum ibv_mtu)be64toh(peer->mtu);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};

    if (ibv_modify_qp(e->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die(1, "QP to INIT: %s", strerror(errno));

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = e->mtu < peer_mtu ? e->mtu : peer_mtu;
    a.dest_qp_num = (uint32_t)be64toh(peer->qpn);
    a.rq_psn = (uint32_t)be64toh(peer->psn);
    a.max_dest_rd_atomic = e->rd_atomic;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 64;
    if (ibv_modify_qp(e->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die(1, "QP to RTR: %s", strerror(errno));

    /* A commit is acknowledged only after the target's msync, which can
     * stall for a long time when the disk is busy: timeout 18 (about 1 s)
     * and 7 retries give it some 8 s, and still bound how long a dead
     * target goes unnoticed.  RNR retries are unlimited, since the target
     * reposts its receives as fast as it can. */
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = e->psn;
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = e->rd_atomic;
    if (ibv_modify_qp(e->qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
        die(1, "QP to RTS: %s", strerror(errno));
}

/* Up to max completions; sleeps on the channel (and on fd, if not -1) for
 * at most wait_ms when there are none.  Returns 0 on a timeout or when only
 * fd became readable. */
static int wait_cq(struct end *e, struct ibv_wc *wc, int max, int fd, int wait_ms) {
    struct pollfd pf[2] = {{.fd = e->channel->fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
    int n = ibv_poll_cq(e->cq, max, wc);

    if (n) goto out;
    if (ibv_req_notify_cq(e->cq, 0)) die(1, "ibv_req_notify_cq: %s", strerror(errno));
    /* A completion that arrived before the CQ was armed raises no event. */
    n = ibv_poll_cq(e->cq, max, wc);
    if (n) goto out;
    if (poll(pf, fd >= 0 ? 2 : 1, wait_ms) > 0 && (pf[0].revents & POLLIN)) {
        struct ibv_cq *cq;
        void *cq_ctx;

        if (ibv_get_cq_event(e->channel, &cq, &cq_ctx) == 0) ibv_ack_cq_events(cq, 1);
    }
    n = ibv_poll_cq(e->cq, max, wc);
out:
    if (n < 0) die(1, "ibv_poll_cq failed");
    return n;
}

static void post_recv(struct end *e) {
    /* An immediate needs a receive WQE but no buffer. */
    struct ibv_recv_wr wr = {.wr_id = 0, .num_sge = 0}, *bad;
    int err = ibv_post_recv(e->qp, &wr, &bad);

    if (err) die(1, "ibv_post_recv: %s", strerror(err));
}

static void close_end(struct end *e) {
    if (e->qp) ibv_destroy_qp(e->qp);
    if (e->mr) ibv_dereg_mr(e->mr);
    if (e->cq) ibv_destroy_cq(e->cq);
    if (e->channel) ibv_destroy_comp_channel(e->channel);
    if (e->pd) ibv_dealloc_pd(e->pd);
    if (e->ctx) ibv_close_device(e->ctx);
}

/* --------------------------------------------------------------- target */

static int run_server(const struct options *o) {
    struct end e = {0};
    struct conn_info me, peer;
    struct ibv_commit_caps caps = {0};
    struct ibv_wc wc[16];
    uint64_t durable = 0, done = 0, head;
    bool client_done = false;
    time_t last_print = time(NULL);
    uint8_t *log;
    int fd = -1, sock, is_pmem = 0;
    uint64_t magic = htole64(log_magic);

    if (o->pmem) {
        size_t mapped = 0;

        /* pmem_map_file keeps what an existing file holds: start afresh,
         * with a zeroed log, as without --pmem. */
        if (unlink(o->file) && errno != ENOENT) die(1, "%s: %s", o->file, strerror(errno));
        log = pmem_map_file(o->file, o->size, PMEM_FILE_CREATE, 0600, &mapped, &is_pmem);
        if (!log) die(1, "pmem_map_file %s: %s", o->file, pmem_errormsg());
        if (mapped != o->size)
            die(1, "%s: mapped %zu bytes, not %llu", o->file, mapped, (unsigned long long)o->size);
        memcpy(log + 8, &magic, 8);
        /* On persistent memory a cache-line write-back makes the empty log
         * durable; anywhere else it takes msync, file size included. */
        if (is_pmem)
            pmem_persist(log, LOG_START);
        else if (pmem_msync(log, LOG_START))
            die(1, "msync %s: %s", o->file, strerror(errno));
    } else {
        /* A fresh, zeroed log on a file system that can make it durable
         * (registration for persistence fails with EINVAL on tmpfs). */
        fd = open(o->file, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)o->size)) die(1, "%s: %s", o->file, strerror(errno));
        log = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (log == MAP_FAILED) die(1, "mmap %s: %s", o->file, strerror(errno));
        memcpy(log + 8, &magic, 8);
        /* The empty log, and the file's size, are durable before anyone can
         * commit into it. */
        if (fsync(fd)) die(1, "fsync %s: %s", o->file, strerror(errno));
    }
    /* The same test the RNIC applies when the log is registered: it decides
     * whether commits persist by cache-line write-back or by msync. */
    if (pmem_is_pmem(log, o->size))
        printf("target memory: persistent memory (pmem_is_pmem=1)\n");
    else
        printf("target memory: not persistent memory (pmem_is_pmem=0)\n");

    open_end(&e, o->dev, o->gid_index, RQ_DEPTH + 1);
    e.mr = ibv_reg_mr(e.pd, log, o->size,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_FLUSH_PERSISTENT);
    if (!e.mr) die(1, "ibv_reg_mr(%s, FLUSH_PERSISTENT): %s", o->file, strerror(errno));
    /* The target only receives; it sends nothing. */
    create_qp(&e, 0, 1, RQ_DEPTH);
    if (ibv_query_commit_caps(e.ctx, &caps))
        caps.flags = 0; /* no write-commit here: the initiator falls back to IBTA FLUSH */

    sock = tcp_accept_one(o->port);
    if (!recv_all(sock, &peer, sizeof(peer))) die(1, "the initiator closed the connection");
    /* The QP must allow the persistent FLUSH the commits ask for. */
    connect_qp(&e, &peer, o->gid_index, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_PERSISTENT);
    /* Receives for the immediates, in place before the initiator can send. */
    for (int i = 0; i < RQ_DEPTH; i++)
        post_recv(&e);
    fill_info(&e, &me);
    me.rkey = htobe64(e.mr->rkey);
    me.addr = htobe64((uintptr_t)log);
    me.size = htobe64(o->size);
    me.commit_caps = htobe64(caps.flags);
    send_all(sock, &me, sizeof(me));
    printf("remote_log: serving %s (%llu bytes), commit caps 0x%x\n", o->file,
           (unsigned long long)o->size, caps.flags);

    /* Each immediate says: records up to this sequence number are durable.
     * The initiator tells over TCP when it has sent its last record. */
    while (!client_done || durable < done) {
        int n = wait_cq(&e, wc, 16, client_done ? -1 : sock, 1000);
        struct pollfd pf = {.fd = sock, .events = POLLIN};

        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                die(EXIT_WC, "receive failed: %s", ibv_wc_status_str(wc[i].status));
            if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc[i].wc_flags & IBV_WC_WITH_IMM))
                die(1, "unexpected completion (opcode %d)", (int)wc[i].opcode);
            /* The immediate carries the low 32 bits of the sequence number;
             * commits arrive in order, one per record. */
            if (ntohl(wc[i].imm_data) != (uint32_t)(durable + 1))
                die(1, "immediate %u after record %llu", ntohl(wc[i].imm_data),
                    (unsigned long long)durable);
            durable++;
            post_recv(&e);
        }
        if (n && time(NULL) != last_print) {
            last_print = time(NULL);
            printf("durable up to %llu\n", (unsigned long long)durable);
        }
        if (!client_done && poll(&pf, 1, 0) > 0) {
            if (!recv_all(sock, &done, sizeof(done)))
                die(1, "the initiator went away after %llu durable records",
                    (unsigned long long)durable);
            done = be64toh(done);
            client_done = true;
        }
    }
    /* Nothing writes the log any more: the head names the last record. */
    memcpy(&head, log, 8);
    if (le64toh(head) != durable)
        die(1, "head index %llu after %llu commits", (unsigned long long)le64toh(head),
            (unsigned long long)durable);
    head = htobe64(durable);
    send_all(sock, &head, sizeof(head));
    printf("remote_log: %llu records durable in %s\n", (unsigned long long)durable, o->file);

    close(sock);
    close_end(&e);
    if (o->pmem) {
        pmem_unmap(log, o->size);
    } else {
        munmap(log, o->size);
        close(fd);
    }
    return 0;
}

/* ------------------------------------------------------------ initiator */

static int run_client(const struct options *o) {
    struct end e = {0};
    struct conn_info me, peer;
    const size_t slot = align8(sizeof(struct record_hdr) + o->record_size);
    uint64_t rkey, raddr, caps, posted = 0, committed = 0, confirmed;
    time_t last_completion = time(NULL);
    uint8_t *ring;
    struct ibv_qp_ex *qpx;
    struct ibv_wc wc[DEPTH];
    int sock;

    open_end(&e, o->dev, o->gid_index, DEPTH + 1);
    /* Room for DEPTH records being sent; a slot is reused only once its
     * record is committed. */
    ring = calloc(DEPTH, slot);
    e.mr = ring ? ibv_reg_mr(e.pd, ring, DEPTH * slot, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!e.mr) die(1, "ibv_reg_mr: %s", strerror(errno));
    /* Write-commit is a send operation the QP must be created with.  Only
     * the commits are signaled: their completion covers the write before. */
    create_qp(&e, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_COMMIT, 2 * DEPTH, 1);
    qpx = ibv_qp_to_qp_ex(e.qp);
    if (!ibv_qp_to_commit_ops(qpx)) die(1, "%s has no write-commit", o->dev);

    sock = tcp_connect(o->host, o->port);
    fill_info(&e, &me);
    send_all(sock, &me, sizeof(me));
    if (!recv_all(sock, &peer, sizeof(peer))) die(1, "the target closed the connection");
    rkey = be64toh(peer.rkey);
    raddr = be64toh(peer.addr);
    caps = be64toh(peer.commit_caps);
    if (o->records > (be64toh(peer.size) - LOG_START) / slot)
        die(1, "%llu records of %zu bytes do not fit in the target's %llu-byte log",
            (unsigned long long)o->records, slot, (unsigned long long)be64toh(peer.size));

    /* Native commit opcodes only to a target that declared them. */
    if (o->native && (caps & IBV_COMMIT_CAP_NATIVE)) {
        if (ibv_qp_set_commit_peer(e.qp, (uint32_t)caps)) die(1, "ibv_qp_set_commit_peer failed");
        printf("remote_log: native write-commit\n");
    } else {
        printf("remote_log: IBTA fallback (WRITE + FLUSH)\n");
    }
    connect_qp(&e, &peer, o->gid_index, 0);

    while (committed < o->records) {
        /* Keep up to DEPTH records in flight. */
        while (posted < o->records && posted - committed < DEPTH) {
            uint64_t seq = posted + 1;
            uint8_t *rec = ring + (seq % DEPTH) * slot;
            uint64_t head = htole64(seq);
            int err;

            make_record(rec, seq, o->record_size);
            ibv_wr_start(qpx);
            /* 1. The record, into the next free space of the log. */
            qpx->wr_id = seq;
            qpx->wr_flags = 0;
            ibv_wr_rdma_write(qpx, (uint32_t)rkey, raddr + LOG_START + (seq - 1) * slot);
            ibv_wr_set_sge(qpx, e.mr->lkey, (uintptr_t)rec, (uint32_t)slot);
            /* 2. The commit record: the new head, placed only once the
             * record is durable, and itself durable when this completes.
             * Inline data is copied at posting, so head may go away. */
            qpx->wr_flags = IBV_SEND_SIGNALED;
            err = ibv_wr_rdma_write_commit_imm(qpx, (uint32_t)rkey, raddr, IBV_WRITE_COMMIT_ORDERED,
                                               htonl((uint32_t)seq));
            if (err) {
                ibv_wr_abort(qpx);
                die(1, "ibv_wr_rdma_write_commit_imm: %s", strerror(err));
            }
            ibv_wr_set_inline_data(qpx, &head, sizeof(head));
            err = ibv_wr_complete(qpx);
            if (err) die(1, "posting record %llu: %s", (unsigned long long)seq, strerror(err));
            posted = seq;
        }

        int n = wait_cq(&e, wc, DEPTH, -1, 1000);
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                die(EXIT_WC, "record %llu: %s (%llu records committed)",
                    (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status),
                    (unsigned long long)committed);
            if (wc[i].opcode != IBV_WC_RDMA_WRITE_COMMIT || wc[i].wr_id != committed + 1)
                die(1, "unexpected completion (opcode %d, wr_id %llu)", (int)wc[i].opcode,
                    (unsigned long long)wc[i].wr_id);
            committed = wc[i].wr_id;
            printf("committed %llu\n", (unsigned long long)committed);
        }
        if (n)
            last_completion = time(NULL);
        else if (time(NULL) - last_completion > 60)
            die(1, "no completion for 60 s (%llu records committed)",
                (unsigned long long)committed);
    }

    /* Tell the target we are done and wait until it has seen every commit. */
    confirmed = htobe64(committed);
    send_all(sock, &confirmed, sizeof(confirmed));
    if (!recv_all(sock, &confirmed, sizeof(confirmed)) || be64toh(confirmed) != committed)
        die(1, "the target did not confirm %llu records", (unsigned long long)committed);
    printf("remote_log: %llu records committed\n", (unsigned long long)committed);

    close(sock);
    close_end(&e);
    free(ring);
    return 0;
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *out) {
    fprintf(out,
            "Usage: remote_log --server -d DEV -g GID_INDEX [-p PORT] --file PATH [--size BYTES]\n"
            "                  [--pmem]\n"
            "       remote_log -d DEV -g GID_INDEX [-p PORT] [-n RECORDS] [--record-size B]\n"
            "                  [--no-native] HOST\n"
            "       remote_log --verify PATH\n"
            "An append-only log in a file at the target, written over RDMA: each record is\n"
            "followed by an ordered write-commit of the log's head index.\n"
            "  --server           be the target: keep the log in PATH\n"
            "  -d, --ib-dev DEV   RDMA device\n"
            "  -g, --gid-index N  GID index (1: the IPv4 GID of RoCE on sroce)\n"
            "  -p, --port N       TCP port of the connection setup (default 18700;\n"
            "                     0 at the target picks one and prints it)\n"
            "  --file PATH        the log file, created or truncated (not on tmpfs)\n"
            "  --size BYTES       size of the log file, suffix K, M or G (default 16M)\n"
            "  --pmem             map the log with libpmem (pmem_map_file): on a DAX file\n"
            "                     system over persistent memory, commits then persist by\n"
            "                     cache-line write-back\n"
            "  -n RECORDS         records to append (default 1000)\n"
            "  --record-size B    payload bytes per record (default 100)\n"
            "  --no-native        do not declare the target's native commit opcodes:\n"
            "                     use the IBTA FLUSH sequences\n"
            "  --verify PATH      check a log file: the head and every record before it\n"
            "  -h, --help         print this help\n"
            "Exit status: 0 success, 1 error, 2 usage, 3 a work completion failed.\n");
}

static uint64_t parse_num(const char *s, const char *what, uint64_t min, uint64_t max) {
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end && strchr("KMG", *end)) {
        int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : 30;

        if (v > (max >> shift)) errno = ERANGE;
        v <<= shift;
        end++;
    }
    if (errno || end == s || *end || *s == '-' || v < min || v > max) {
        fprintf(stderr, "remote_log: invalid %s '%s'\n", what, s);
        exit(EXIT_USAGE);
    }
    return v;
}

int main(int argc, char **argv) {
    enum { O_SERVER = 256, O_FILE, O_SIZE, O_RECORD_SIZE, O_NO_NATIVE, O_VERIFY, O_PMEM };
    static const struct option long_opts[] = {
        {"server", no_argument, NULL, O_SERVER},
        {"ib-dev", required_argument, NULL, 'd'},
        {"gid-index", required_argument, NULL, 'g'},
        {"port", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, O_FILE},
        {"size", required_argument, NULL, O_SIZE},
        {"records", required_argument, NULL, 'n'},
        {"record-size", required_argument, NULL, O_RECORD_SIZE},
        {"no-native", no_argument, NULL, O_NO_NATIVE},
        {"verify", required_argument, NULL, O_VERIFY},
        {"pmem", no_argument, NULL, O_PMEM},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    struct options o = {
        .native = true,
        .gid_index = 1,
        .port = 18700,
        .records = 1000,
        .size = 16 << 20,
        .record_size = 100,
    };
    int c;

    while ((c = getopt_long(argc, argv, "d:g:p:n:h", long_opts, NULL)) != -1) {
        switch (c) {
        case O_SERVER:
            o.server = true;
            break;
        case 'd':
            o.dev = optarg;
            break;
        case 'g':
            o.gid_index = (int)parse_num(optarg, "GID index", 0, 255);
            break;
        case 'p':
            o.port = (int)parse_num(optarg, "port", 0, 65535);
            break;
        case O_FILE:
            o.file = optarg;
            break;
        case O_SIZE:
            o.size = parse_num(optarg, "size", LOG_START + 4096, UINT64_MAX >> 1);
            break;
        case 'n':
            o.records = parse_num(optarg, "record count", 1, UINT64_MAX >> 16);
            break;
        case O_RECORD_SIZE:
            o.record_size = (uint32_t)parse_num(optarg, "record size", 0, 1 << 24);
            break;
        case O_NO_NATIVE:
            o.native = false;
            break;
        case O_VERIFY:
            o.verify = optarg;
            break;
        case O_PMEM:
            o.pmem = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) o.host = argv[optind++];
    /* Every line reaches a pipe or file at once: scripts follow progress. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (o.verify && !o.server && !o.host && !o.dev) return verify_log(o.verify);
    if (optind != argc || !o.dev || (o.server ? (o.host || !o.file) : (!o.host || o.pmem))) {
        usage(stderr);
        return EXIT_USAGE;
    }
    return o.server ? run_server(&o) : run_client(&o);
}
