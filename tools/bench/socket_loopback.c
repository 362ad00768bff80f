// SPDX-License-Identifier: MIT
//
// socket_loopback: the ceiling for any transport built on kernel sockets on
// this host.  Two threads of one process exchange plain UDP datagrams or one
// TCP stream over a loopback address, so that sroce (which is such a
// transport) can be judged against what the kernel itself delivers in the
// same run.
//
//   socket_loopback [-P udp|tcp] [-m bw|lat] [-s SIZE] [-n ITERS | -D SECONDS]
//                   [-a ADDR] [-p PORT] [--busy] [--gso SEGS] [--out_json_file FILE]
//
// Bandwidth is goodput at the receiver: payload bytes that arrived, over the
// time from the sender's first call to the last arrival.  UDP datagrams the
// kernel dropped are not counted and are reported as loss.  Latency is the
// full round trip of a SIZE-byte ping-pong.
#define _GNU_SOURCE
#include "bench_common.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROG "socket_loopback"

// sendmmsg / recvmmsg batch: large enough that the per-call cost vanishes
// next to the per-datagram cost.
#define UDP_BATCH 32
#define UDP_MAX_PAYLOAD 65507
// The kernel accepts at most this many segments per GSO send (older kernels;
// newer ones allow more).
#define GSO_MAX_SEGS 64
#define TCP_MAX_SIZE (64u << 20)
// How long a UDP receiver waits after the sender finished before it decides
// the remaining datagrams were dropped.
#define UDP_DRAIN_MS 50
// No reply within this long ends a latency run with an error.
#define REPLY_TIMEOUT_S 2

struct opts {
    bool tcp, bw, busy;
    size_t size;
    uint64_t iters; // 0: run for `seconds`
    double seconds;
    const char *json;
    const char *addr_text;
    struct in_addr addr;
    uint16_t port; // 0: kernel-chosen
    unsigned gso;  // segments per UDP send, 0 = off
};

static void usage(FILE *f) {
    fprintf(f, "usage: " PROG " [-P udp|tcp] [-m bw|lat] [-s SIZE] [-n ITERS | -D SECONDS]\n"
               "                       [-a ADDR] [-p PORT] [--busy] [--gso SEGS] [--out_json_file "
               "FILE]\n"
               "  -P udp|tcp     protocol (default udp)\n"
               "  -m bw|lat      streaming goodput or ping-pong round trip (default bw)\n"
               "  -s SIZE        UDP datagram payload or TCP message size in bytes\n"
               "                 (default 4096 for bw, 36 for lat)\n"
               "  -n ITERS       datagrams / messages to send (bw) or round trips (lat)\n"
               "                 (default 200000 UDP bw, 20000 TCP bw, 10000 lat)\n"
               "  -D SECONDS     run for this long instead of a count\n"
               "  -a ADDR        loopback address to use (127.0.0.0/8, default 127.0.0.1)\n"
               "  -p PORT        receiver port; UDP also binds the sender to PORT+1\n"
               "                 (default: ports chosen by the kernel)\n"
               "  --busy         receivers spin on non-blocking calls instead of blocking\n"
               "  --gso SEGS     UDP bw: hand the kernel SEGS datagrams per send with UDP_SEGMENT\n"
               "                 and let the receiver take them coalesced with UDP_GRO\n"
               "  --out_json_file FILE  also write the result as JSON\n");
}

static bool parse_args(int argc, char **argv, struct opts *o) {
    enum { OPT_BUSY = 256, OPT_GSO, OPT_JSON };
    static const struct option longopts[] = {{"busy", no_argument, NULL, OPT_BUSY},
                                             {"gso", required_argument, NULL, OPT_GSO},
                                             {"out_json_file", required_argument, NULL, OPT_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    *o = (struct opts){.bw = true, .addr_text = "127.0.0.1"};
    struct bench_run_opts run = {.bw = &o->bw,
                                 .size = &o->size,
                                 .iters = &o->iters,
                                 .seconds = &o->seconds,
                                 .max_size = TCP_MAX_SIZE};
    uint64_t v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":P:m:s:n:D:a:p:h", longopts, NULL)) != -1) {
        int k = bench_parse_run_opt(PROG, c, optarg, &run);
        if (k < 0) return false;
        if (k) continue;
        switch (c) {
        case 'P':
            if (!strcmp(optarg, "udp"))
                o->tcp = false;
            else if (!strcmp(optarg, "tcp"))
                o->tcp = true;
            else {
                fprintf(stderr, PROG ": -P %s: expected udp or tcp\n", optarg);
                return false;
            }
            break;
        case 'a':
            o->addr_text = optarg;
            break;
        case 'p':
            if (!bench_parse_u64(PROG, "-p", optarg, 0, 65534, &v)) return false;
            o->port = (uint16_t)v;
            break;
        case OPT_BUSY:
            o->busy = true;
            break;
        case OPT_GSO:
            if (!bench_parse_u64(PROG, "--gso", optarg, 1, GSO_MAX_SEGS, &v)) return false;
            o->gso = (unsigned)v;
            break;
        case OPT_JSON:
            o->json = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case ':':
            fprintf(stderr, PROG ": option %s needs a value\n", argv[optind - 1]);
            return false;
        default:
            fprintf(stderr, PROG ": unknown option %s (see --help)\n", argv[optind - 1]);
            return false;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return false;
    }
    if (run.have_n && run.have_d) {
        fprintf(stderr, PROG ": -n and -D exclude each other\n");
        return false;
    }
    if (inet_pton(AF_INET, o->addr_text, &o->addr) != 1) {
        fprintf(stderr, PROG ": -a %s: not an IPv4 address\n", o->addr_text);
        return false;
    }
    if ((ntohl(o->addr.s_addr) >> 24) != 127) {
        fprintf(stderr, PROG ": -a %s: only loopback addresses (127.0.0.0/8) are allowed\n",
                o->addr_text);
        return false;
    }
    if (!run.have_size) o->size = o->bw ? 4096 : 36;
    if (!run.have_n && !run.have_d) o->iters = !o->bw ? 10000 : o->tcp ? 20000 : 200000;
    if (o->gso && (o->tcp || !o->bw)) {
        fprintf(stderr, PROG ": --gso applies to -P udp -m bw only\n");
        return false;
    }
    if (!o->tcp && o->size > UDP_MAX_PAYLOAD) {
        fprintf(stderr, PROG ": -s %zu: a UDP datagram carries at most %d bytes\n", o->size,
                UDP_MAX_PAYLOAD);
        return false;
    }
    if (o->gso && o->size * o->gso > UDP_MAX_PAYLOAD) {
        fprintf(stderr, PROG ": --gso %u with -s %zu: a GSO send carries at most %d bytes\n",
                o->gso, o->size, UDP_MAX_PAYLOAD);
        return false;
    }
    return true;
}

static const char *mode_name(const struct opts *o) {
    return o->busy ? "busy" : "blocking";
}

static void die_errno(const char *what) {
    fprintf(stderr, PROG ": %s: %s\n", what, strerror(errno));
    exit(1);
}

static struct sockaddr_in sockaddr_of(struct in_addr a, uint16_t port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = a};
    return sa;
}

static void set_timeout(int fd, int opt, double secs) {
    struct timeval tv = {(time_t)secs, (suseconds_t)((secs - (double)(time_t)secs) * 1e6)};
    if (setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv) < 0) die_errno("setsockopt timeout");
}

// Large socket buffers: the measurement is of the kernel path, not of a
// receiver that happens to lag behind for a moment.  The FORCE variants pass
// net.core.rmem_max when run as root.
static void big_buffers(int fd) {
    int buf = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
}

static int udp_bound(struct in_addr a, uint16_t port, struct sockaddr_in *bound) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) die_errno("socket");
    big_buffers(fd);
    struct sockaddr_in sa = sockaddr_of(a, port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        char what[64];
        snprintf(what, sizeof what, "bind UDP port %u", port);
        die_errno(what);
    }
    socklen_t len = sizeof *bound;
    if (getsockname(fd, (struct sockaddr *)bound, &len) < 0) die_errno("getsockname");
    return fd;
}

static void udp_pair(const struct opts *o, int *rx, int *tx) {
    struct sockaddr_in rx_sa, tx_sa;
    *rx = udp_bound(o->addr, o->port, &rx_sa);
    *tx = udp_bound(o->addr, o->port ? (uint16_t)(o->port + 1) : 0, &tx_sa);
    if (connect(*tx, (struct sockaddr *)&rx_sa, sizeof rx_sa) < 0 ||
        connect(*rx, (struct sockaddr *)&tx_sa, sizeof tx_sa) < 0)
        die_errno("connect UDP");
}

static void print_banner(const struct opts *o, const char *title, const char *detail) {
    printf("%s\n", BENCH_LINE);
    printf("                    %s\n", title);
    printf(" Address         : %s%s\n", o->addr_text, o->port ? "" : " (kernel-chosen ports)");
    printf(" %s\n", detail);
}

// ------------------------------------------------------------------ UDP bw

struct udp_bw {
    const struct opts *o;
    int rx, tx;
    atomic_bool ready, tx_done;
    uint64_t to_send; // datagrams; 0 = until the deadline
    // receiver results
    uint64_t rx_dgrams, rx_bytes;
    int64_t t_last;
    struct bench_peak peak;
    const char *err;
    int err_no;
};

static void *udp_bw_receiver(void *p) {
    struct udp_bw *b = p;
    bool gro = b->o->gso > 0;
    size_t bufsz = gro ? 65536 : b->o->size;
    unsigned batch = gro ? 8 : UDP_BATCH;
    char *buf = malloc(bufsz * batch);
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl[UDP_BATCH];
    if (!buf) {
        b->err = "out of memory";
        atomic_store(&b->ready, true);
        return NULL;
    }
    if (gro) {
        int one = 1;
        if (setsockopt(b->rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one) < 0) {
            b->err = "setsockopt UDP_GRO";
            b->err_no = errno;
            atomic_store(&b->ready, true);
            free(buf);
            return NULL;
        }
    }
    set_timeout(b->rx, SO_RCVTIMEO, UDP_DRAIN_MS / 1000.0);
    memset(msgs, 0, sizeof msgs);
    for (unsigned i = 0; i < batch; i++) {
        iov[i] = (struct iovec){buf + i * bufsz, bufsz};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    atomic_store(&b->ready, true);
    int64_t quiet_since = 0;
    for (;;) {
        for (unsigned i = 0; i < batch && gro; i++) {
            msgs[i].msg_hdr.msg_control = ctl[i].buf;
            msgs[i].msg_hdr.msg_controllen = sizeof ctl[i].buf;
        }
        int n = recvmmsg(b->rx, msgs, batch, b->o->busy ? MSG_DONTWAIT : MSG_WAITFORONE, NULL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                // Blocking: SO_RCVTIMEO expired.  Busy: nothing queued; the
                // sender's end is then judged by the same quiet period.
                if (atomic_load(&b->tx_done)) {
                    if (!b->o->busy) break;
                    int64_t now = bench_now_ns();
                    if (!quiet_since) quiet_since = now;
                    if (now - quiet_since > UDP_DRAIN_MS * 1000000LL) break;
                }
                continue;
            }
            b->err = "recvmmsg";
            b->err_no = errno;
            break;
        }
        int64_t now = bench_now_ns();
        quiet_since = 0;
        uint64_t bytes = 0;
        for (int i = 0; i < n; i++) {
            unsigned len = msgs[i].msg_len;
            uint64_t dgrams = 1;
            if (gro) {
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msgs[i].msg_hdr); cm;
                     cm = CMSG_NXTHDR(&msgs[i].msg_hdr, cm)) {
                    if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
                        int seg;
                        memcpy(&seg, CMSG_DATA(cm), sizeof seg);
                        if (seg > 0) dgrams = (len + (unsigned)seg - 1) / (unsigned)seg;
                    }
                }
            }
            b->rx_dgrams += dgrams;
            bytes += len;
        }
        b->rx_bytes += bytes;
        b->t_last = now;
        bench_peak_add(&b->peak, now, bytes);
        if (b->to_send && b->rx_dgrams >= b->to_send) break;
    }
    free(buf);
    return NULL;
}

static int run_udp_bw(const struct opts *o) {
    struct udp_bw b = {.o = o};
    udp_pair(o, &b.rx, &b.tx);
    b.to_send = o->iters;
    unsigned segs = o->gso ? o->gso : 1;
    if (o->gso) {
        int seg = (int)o->size;
        if (setsockopt(b.tx, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof seg) < 0)
            die_errno("setsockopt UDP_SEGMENT");
    }
    char detail[200];
    if (o->gso)
        snprintf(detail, sizeof detail,
                 "UDP goodput     : %zu-byte datagrams, %u per send via UDP_SEGMENT, receiver "
                 "UDP_GRO, sendmmsg batches of %d, %s receives",
                 o->size, o->gso, UDP_BATCH, mode_name(o));
    else
        snprintf(detail, sizeof detail,
                 "UDP goodput     : %zu-byte datagrams, sendmmsg/recvmmsg batches of %d, no "
                 "segmentation offload, %s receives",
                 o->size, UDP_BATCH, mode_name(o));
    print_banner(o, "UDP loopback bandwidth (" PROG ")", detail);

    size_t msg_bytes = o->size * segs;
    char *src = calloc(UDP_BATCH, msg_bytes);
    if (!src) die_errno("calloc");
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    memset(msgs, 0, sizeof msgs);
    for (int i = 0; i < UDP_BATCH; i++) {
        iov[i] = (struct iovec){src + (size_t)i * msg_bytes, msg_bytes};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }

    pthread_t t;
    if (pthread_create(&t, NULL, udp_bw_receiver, &b) != 0) die_errno("pthread_create");
    while (!atomic_load(&b.ready))
        sched_yield();

    uint64_t sent = 0; // datagrams
    int64_t t0 = bench_now_ns();
    int64_t deadline = o->iters ? 0 : t0 + (int64_t)(o->seconds * 1e9);
    const char *err = NULL;
    int err_no = 0;
    while (!b.err) {
        if (o->iters && sent >= o->iters) break;
        if (deadline && bench_now_ns() >= deadline) break;
        unsigned k = UDP_BATCH;
        uint64_t last_segs = segs;
        if (o->iters) {
            uint64_t left = o->iters - sent;
            uint64_t need = (left + segs - 1) / segs;
            if (need < k) {
                k = (unsigned)need;
                last_segs = left - (uint64_t)(k - 1) * segs;
            }
        }
        iov[k - 1].iov_len = (size_t)last_segs * o->size;
        unsigned done = 0;
        while (done < k) {
            int r = sendmmsg(b.tx, msgs + done, k - done, 0);
            if (r < 0) {
                // ENOBUFS: the device queue is full for a moment; ECONNREFUSED:
                // an ICMP error from an earlier datagram.  Neither ends the run.
                if (errno == EINTR || errno == ENOBUFS || errno == EAGAIN || errno == ECONNREFUSED)
                    continue;
                err = "sendmmsg";
                err_no = errno;
                break;
            }
            done += (unsigned)r;
        }
        // Every message but the last of the batch carries `segs` datagrams.
        sent += done == k ? (uint64_t)(k - 1) * segs + last_segs : (uint64_t)done * segs;
        iov[k - 1].iov_len = msg_bytes;
        if (err) break;
    }
    atomic_store(&b.tx_done, true);
    pthread_join(t, NULL);
    free(src);
    if (err || b.err) {
        fprintf(stderr, PROG ": %s: %s\n", err ? err : b.err, strerror(err ? err_no : b.err_no));
        return 1;
    }
    if (!b.rx_dgrams) {
        fprintf(stderr, PROG ": no datagram arrived\n");
        return 1;
    }
    struct bench_bw r =
        bench_bw_result(o->size, sent, b.rx_bytes, b.rx_dgrams, b.t_last - t0, &b.peak);
    r.has_loss = true;
    r.loss_pct = sent > b.rx_dgrams ? 100.0 * (double)(sent - b.rx_dgrams) / (double)sent : 0;
    bench_bw_header(true);
    bench_bw_row(&r);
    printf(" sent %" PRIu64 " datagrams, received %" PRIu64 "\n", sent, b.rx_dgrams);
    if (o->json &&
        !bench_json_bw(PROG, o->json, PROG, o->gso ? "udp-gso" : "udp", mode_name(o), &r))
        return 1;
    close(b.rx);
    close(b.tx);
    return 0;
}

// -------------------------------------------------------- ping-pong helpers

// Receives exactly len bytes (TCP) or one datagram (UDP).  Returns the byte
// count, 0 on end of stream or a zero-length datagram, -1 on error or
// timeout (errno set).
static ssize_t recv_msg(int fd, char *buf, size_t len, bool stream, bool busy, int64_t give_up) {
    size_t got = 0;
    int flags = busy ? MSG_DONTWAIT : 0;
    unsigned spins = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + got, len - got, flags);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (busy && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if ((++spins & 0xfff) == 0 && bench_now_ns() > give_up) {
                    errno = ETIMEDOUT;
                    return -1;
                }
                continue;
            }
            return -1;
        }
        if (r == 0 || !stream) return r;
        got += (size_t)r;
        if (got == len) return (ssize_t)got;
    }
}

static bool send_msg(int fd, const char *buf, size_t len) {
    size_t put = 0;
    while (put < len) {
        ssize_t r = send(fd, buf + put, len - put, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR || errno == ENOBUFS || errno == EAGAIN) continue;
            return false;
        }
        put += (size_t)r;
    }
    return true;
}

struct pong {
    const struct opts *o;
    int fd;      // UDP: the bound socket; TCP: the listener
    int conn_fd; // TCP: the accepted connection
    const char *err;
    int err_no;
};

static void *ponger(void *p) {
    struct pong *pg = p;
    const struct opts *o = pg->o;
    int fd = pg->fd;
    if (o->tcp) {
        fd = accept(pg->fd, NULL, NULL);
        if (fd < 0) {
            pg->err = "accept";
            pg->err_no = errno;
            return NULL;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pg->conn_fd = fd;
    }
    // The pinger ends the run (zero-length datagram / end of stream); this
    // only bounds the wait if it died.
    set_timeout(fd, SO_RCVTIMEO, 3 * REPLY_TIMEOUT_S);
    char *buf = malloc(o->size);
    if (!buf) {
        pg->err = "out of memory";
        return NULL;
    }
    for (;;) {
        int64_t give_up = bench_now_ns() + 3LL * REPLY_TIMEOUT_S * 1000000000LL;
        ssize_t r = recv_msg(fd, buf, o->size, o->tcp, o->busy, give_up);
        if (r <= 0) break;
        if (!send_msg(fd, buf, (size_t)r)) {
            pg->err = "send (reply)";
            pg->err_no = errno;
            break;
        }
    }
    free(buf);
    return NULL;
}

static int tcp_listener(const struct opts *o, struct sockaddr_in *bound) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die_errno("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = sockaddr_of(o->addr, o->port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        char what[64];
        snprintf(what, sizeof what, "bind TCP port %u", o->port);
        die_errno(what);
    }
    if (listen(fd, 1) < 0) die_errno("listen");
    socklen_t len = sizeof *bound;
    if (getsockname(fd, (struct sockaddr *)bound, &len) < 0) die_errno("getsockname");
    return fd;
}

static int tcp_connect(const struct sockaddr_in *to) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die_errno("socket");
    if (connect(fd, (const struct sockaddr *)to, sizeof *to) < 0) die_errno("connect TCP");
    return fd;
}

// --------------------------------------------------------------------- lat

static int run_lat(const struct opts *o) {
    struct pong pg = {.o = o, .conn_fd = -1};
    int fd;
    if (o->tcp) {
        struct sockaddr_in sa;
        pg.fd = tcp_listener(o, &sa);
        fd = tcp_connect(&sa);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    } else {
        udp_pair(o, &pg.fd, &fd);
    }
    set_timeout(fd, SO_RCVTIMEO, REPLY_TIMEOUT_S);
    char detail[200];
    snprintf(detail, sizeof detail,
             "%s ping-pong   : %zu bytes each way, full round trip per iteration, %s receives%s",
             o->tcp ? "TCP" : "UDP", o->size, o->busy ? "busy (MSG_DONTWAIT spin)" : "blocking",
             o->tcp ? ", TCP_NODELAY" : "");
    print_banner(o, o->tcp ? "TCP loopback latency (" PROG ")" : "UDP loopback latency (" PROG ")",
                 detail);

    pthread_t t;
    if (pthread_create(&t, NULL, ponger, &pg) != 0) die_errno("pthread_create");
    char *buf = calloc(1, o->size);
    if (!buf) die_errno("calloc");
    struct bench_samples s = {0};
    const unsigned warmup = 100;
    int rc = 0;
    int64_t deadline = 0;
    for (uint64_t i = 0;; i++) {
        if (i == warmup && !o->iters) deadline = bench_now_ns() + (int64_t)(o->seconds * 1e9);
        if (o->iters && i >= warmup + o->iters) break;
        if (deadline && bench_now_ns() >= deadline) break;
        int64_t t0 = bench_now_ns();
        if (!send_msg(fd, buf, o->size)) {
            fprintf(stderr, PROG ": send: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        ssize_t r = recv_msg(fd, buf, o->size, o->tcp, o->busy,
                             t0 + (int64_t)REPLY_TIMEOUT_S * 1000000000LL);
        int64_t t1 = bench_now_ns();
        if (r <= 0) {
            fprintf(stderr, PROG ": no reply to round trip %" PRIu64 " within %d s: %s\n", i,
                    REPLY_TIMEOUT_S, r == 0 ? "peer closed" : strerror(errno));
            rc = 1;
            break;
        }
        if (i >= warmup && !bench_samples_add(&s, (double)(t1 - t0) / 1e3)) {
            fprintf(stderr, PROG ": out of memory\n");
            rc = 1;
            break;
        }
    }
    // Ends the ponger: a zero-length datagram, or end of stream.
    if (o->tcp)
        shutdown(fd, SHUT_WR);
    else
        send(fd, buf, 0, 0);
    pthread_join(t, NULL);
    if (!rc && pg.err) {
        fprintf(stderr, PROG ": %s: %s\n", pg.err, strerror(pg.err_no));
        rc = 1;
    }
    if (!rc) {
        struct bench_lat r = bench_lat_stats(&s);
        bench_lat_header();
        bench_lat_row(o->size, &r);
        if (o->json &&
            !bench_json_lat(PROG, o->json, PROG, o->tcp ? "tcp" : "udp", mode_name(o), o->size, &r))
            rc = 1;
    }
    free(s.v);
    free(buf);
    close(fd);
    close(pg.fd);
    if (pg.conn_fd >= 0) close(pg.conn_fd);
    return rc;
}

// ------------------------------------------------------------------ TCP bw

struct tcp_bw {
    const struct opts *o;
    int listener;
    uint64_t expect; // bytes; 0 = until end of stream
    uint64_t rx_bytes;
    int64_t t_last;
    struct bench_peak peak;
    const char *err;
    int err_no;
};

static void *tcp_bw_receiver(void *p) {
    struct tcp_bw *b = p;
    int fd = accept(b->listener, NULL, NULL);
    if (fd < 0) {
        b->err = "accept";
        b->err_no = errno;
        return NULL;
    }
    size_t len = b->o->size > (1u << 20) ? b->o->size : (1u << 20);
    char *buf = malloc(len);
    if (!buf) {
        b->err = "out of memory";
        close(fd);
        return NULL;
    }
    for (;;) {
        ssize_t r = recv(fd, buf, len, b->o->busy ? MSG_DONTWAIT : 0);
        if (r < 0) {
            if (errno == EINTR || (b->o->busy && (errno == EAGAIN || errno == EWOULDBLOCK)))
                continue;
            b->err = "recv";
            b->err_no = errno;
            break;
        }
        if (r == 0) break;
        int64_t now = bench_now_ns();
        b->rx_bytes += (uint64_t)r;
        b->t_last = now;
        bench_peak_add(&b->peak, now, (uint64_t)r);
        if (b->expect && b->rx_bytes >= b->expect) break;
    }
    free(buf);
    close(fd);
    return NULL;
}

static int run_tcp_bw(const struct opts *o) {
    struct sockaddr_in sa;
    struct tcp_bw b = {.o = o, .expect = o->iters * o->size};
    b.listener = tcp_listener(o, &sa);
    char detail[200];
    snprintf(detail, sizeof detail,
             "TCP goodput     : one stream, %zu-byte writes, Nagle on (no TCP_NODELAY), default "
             "buffers, %s receives",
             o->size, mode_name(o));
    print_banner(o, "TCP loopback bandwidth (" PROG ")", detail);
    pthread_t t;
    if (pthread_create(&t, NULL, tcp_bw_receiver, &b) != 0) die_errno("pthread_create");
    int fd = tcp_connect(&sa);
    char *buf = calloc(1, o->size);
    if (!buf) die_errno("calloc");
    uint64_t sent = 0;
    int rc = 0;
    int64_t t0 = bench_now_ns();
    int64_t deadline = o->iters ? 0 : t0 + (int64_t)(o->seconds * 1e9);
    while (o->iters ? sent < o->iters : bench_now_ns() < deadline) {
        if (!send_msg(fd, buf, o->size)) {
            fprintf(stderr, PROG ": send: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        sent++;
    }
    close(fd);
    pthread_join(t, NULL);
    free(buf);
    close(b.listener);
    if (!rc && b.err) {
        fprintf(stderr, PROG ": %s: %s\n", b.err, strerror(b.err_no));
        rc = 1;
    }
    if (!rc && b.rx_bytes != sent * o->size) {
        fprintf(stderr, PROG ": received %" PRIu64 " bytes of %" PRIu64 "\n", b.rx_bytes,
                sent * o->size);
        rc = 1;
    }
    if (rc) return rc;
    struct bench_bw r =
        bench_bw_result(o->size, sent, b.rx_bytes, b.rx_bytes / o->size, b.t_last - t0, &b.peak);
    bench_bw_header(false);
    bench_bw_row(&r);
    if (o->json && !bench_json_bw(PROG, o->json, PROG, "tcp", mode_name(o), &r)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    struct opts o;
    if (!parse_args(argc, argv, &o)) return 1;
    if (!o.bw) return run_lat(&o);
    return o.tcp ? run_tcp_bw(&o) : run_udp_bw(&o);
}
