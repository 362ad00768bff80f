// SPDX-License-Identifier: MIT
//
// fi_commit_bench: RMA writes through libfabric with commit (or delivery)
// completion, the path a libfabric application takes today to make remote
// writes durable, measured so that sroce's commit verbs can be compared
// against it on the same host.
//
//   server: fi_commit_bench [-p PROV] [-e msg|rdm] [-a ADDR] [-P PORT]
//   client: fi_commit_bench [-p PROV] [-e msg|rdm] [-P PORT] [-m lat|bw] [-s SIZE]
//                           [-n ITERS | -D SECONDS] [-t DEPTH] [--completion commit|delivery|none]
//                           [--blocking] [--out_json_file FILE] HOST
//
// The server registers a SIZE-byte target buffer and only drives progress;
// the client writes into it.  Keys, the target address and the end-of-run
// check go over a small TCP side channel on PORT; the provider's own
// listener is on PORT+1.  With libfabric 1.17's tcp provider on loopback
// both endpoint types work: FI_EP_MSG (the default) is the tcp provider
// itself, FI_EP_RDM is tcp under the ofi_rxm utility provider.  Only the
// first advertises FI_RMA_PMEM.
//
// Data check: after the run the client reads the target back with fi_read
// and the server compares its buffer byte for byte with the pattern the
// client wrote; a mismatch on either side exits 1.
#define _GNU_SOURCE
#include "bench_common.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "fi_commit_bench"
#define SIDE_MAGIC 0x53524346u // "SRCF"
#define DEFAULT_PORT 18615
#define MAX_SIZE (1u << 30)
// A write, read or connection step with no progress for this long fails the
// run instead of hanging it.
#define STALL_MS 10000
#define CM_TIMEOUT_MS 10000
#define WARMUP 16

enum completion { COMP_COMMIT, COMP_DELIVERY, COMP_NONE };
static const char *const completion_name[] = {"commit", "delivery", "none"};

struct opts {
    const char *prov;
    bool rdm, bw, blocking;
    enum completion comp;
    size_t size;
    uint64_t iters; // 0: run for `seconds`
    double seconds;
    unsigned depth;
    uint16_t port;
    const char *addr; // server bind address
    const char *host; // client: the server; NULL for the server
    const char *json;
};

// ------------------------------------------------------------ side channel
// Both peers are on one host, so the structures travel in host byte order.

struct side_req {
    uint32_t magic;
    uint32_t blocking;
    uint64_t size;
};

struct side_reply {
    uint32_t magic;
    int32_t status; // 0, or a negative libfabric error of the server's setup
    uint64_t addr, key, len;
};

struct side_done {
    uint32_t magic;
    uint32_t seed;
    uint64_t writes;
};

struct side_verdict {
    uint32_t magic;
    uint32_t ok;
    uint64_t first_bad;
    uint8_t expected, found;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void fi_check(int ret, const char *what) {
    if (ret) die("%s: %s (%d)", what, fi_strerror(-ret), ret);
}

static void side_send(int fd, const void *p, size_t len) {
    const char *b = p;
    while (len) {
        ssize_t r = send(fd, b, len, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("side channel send: %s", strerror(errno));
        b += r;
        len -= (size_t)r;
    }
}

// Returns false on a clean end of stream before the first byte.
static bool side_recv(int fd, void *p, size_t len) {
    char *b = p;
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, b + got, len - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("side channel receive: %s", strerror(errno));
        if (r == 0) {
            if (!got) return false;
            die("side channel closed mid-message");
        }
        got += (size_t)r;
    }
    return true;
}

// True in a network namespace that `ip netns` named (/run/netns/NAME): one
// a test bed made, as sroce-fabric's hosts are.  The initial namespace is
// never one, and /proc/1/ns/net, which would name it, is not readable in
// every container.
static bool in_named_netns(void) {
    struct stat self, ns;
    if (stat("/proc/self/ns/net", &self)) return false;
    DIR *d = opendir("/run/netns");
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        char path[300];
        snprintf(path, sizeof path, "/run/netns/%s", e->d_name);
        found = e->d_name[0] != '.' && stat(path, &ns) == 0 && ns.st_ino == self.st_ino &&
                ns.st_dev == self.st_dev;
    }
    closedir(d);
    return found;
}

// The benchmark only talks to its own host: loopback, or any address from
// inside a named network namespace (a fabric of namespaces).
static struct sockaddr_in local_sockaddr(const char *what, const char *a, uint16_t port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (!strcmp(a, "localhost")) a = "127.0.0.1";
    if (inet_pton(AF_INET, a, &sa.sin_addr) != 1) die("%s %s: not an IPv4 address", what, a);
    if ((ntohl(sa.sin_addr.s_addr) >> 24) != 127 && !in_named_netns())
        die("%s %s: only loopback addresses (127.0.0.0/8) are allowed outside a named "
            "network namespace (ip netns)",
            what, a);
    return sa;
}

static int side_listen(const struct opts *o) {
    struct sockaddr_in sa = local_sockaddr("-a", o->addr, o->port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (fd < 0) die("socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 1) < 0)
        die("side channel on %s:%u: %s", o->addr, o->port, strerror(errno));
    return fd;
}

static int side_connect(const struct opts *o) {
    struct sockaddr_in sa = local_sockaddr("HOST", o->host, o->port);
    int64_t give_up = bench_now_ns() + (int64_t)CM_TIMEOUT_MS * 1000000;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        int e = errno;
        close(fd);
        // The server may still be setting up its fabric.
        if (e != ECONNREFUSED || bench_now_ns() > give_up)
            die("side channel to %s:%u: %s", o->host, o->port, strerror(e));
        usleep(50000);
    }
}

// ----------------------------------------------------------------- fabric

struct fab {
    struct fi_info *info;
    uint64_t prov_caps; // what the provider advertises for this endpoint type
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_eq *eq;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_pep *pep;
    struct fid_ep *ep;
    fi_addr_t peer;
};

static struct fi_info *make_hints(const struct opts *o, uint64_t caps) {
    struct fi_info *h = fi_allocinfo();
    if (!h) die("fi_allocinfo failed");
    h->caps = caps;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->addr_format = FI_SOCKADDR_IN;
    h->ep_attr->type = o->rdm ? FI_EP_RDM : FI_EP_MSG;
    // Everything this program can cope with; FI_MR_ENDPOINT is left out
    // because the server registers its target before a MSG endpoint exists.
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->fabric_attr->prov_name = strdup(o->prov);
    return h;
}

static void get_info(const struct opts *o, struct fab *f) {
    char service[8];
    snprintf(service, sizeof service, "%u", (unsigned)o->port + 1);
    const char *node = o->host ? o->host : o->addr;
    uint64_t flags = o->host ? 0 : FI_SOURCE;
    uint32_t version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

    // First without asking for capabilities, to learn (and print) what the
    // provider offers, FI_RMA_PMEM included.
    struct fi_info *hints = make_hints(o, 0), *all = NULL;
    int ret = fi_getinfo(version, node, service, flags, hints, &all);
    fi_freeinfo(hints);
    if (ret)
        die("provider '%s' offers no %s endpoint on %s: %s", o->prov,
            o->rdm ? "FI_EP_RDM" : "FI_EP_MSG", node, fi_strerror(-ret));
    f->prov_caps = all->caps;
    fi_freeinfo(all);
    if (!(f->prov_caps & FI_RMA)) die("provider '%s' does not support FI_RMA", o->prov);

    uint64_t caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    if (f->prov_caps & FI_RMA_PMEM) caps |= FI_RMA_PMEM;
    hints = make_hints(o, caps);
    ret = fi_getinfo(version, node, service, flags, hints, &f->info);
    fi_freeinfo(hints);
    if (ret) die("fi_getinfo(%s, caps FI_RMA): %s", o->prov, fi_strerror(-ret));
}

static void open_common(const struct opts *o, struct fab *f, bool waitable_cq) {
    fi_check(fi_fabric(f->info->fabric_attr, &f->fabric, NULL), "fi_fabric");
    fi_check(fi_domain(f->fabric, f->info, &f->domain, NULL), "fi_domain");
    struct fi_cq_attr cq_attr = {
        .size = 2 * (size_t)o->depth + 16,
        .format = FI_CQ_FORMAT_CONTEXT,
        .wait_obj = waitable_cq ? FI_WAIT_UNSPEC : FI_WAIT_NONE,
    };
    fi_check(fi_cq_open(f->domain, &cq_attr, &f->cq, NULL), "fi_cq_open");
    if (o->rdm) {
        struct fi_av_attr av_attr = {.type = FI_AV_UNSPEC, .count = 4};
        fi_check(fi_av_open(f->domain, &av_attr, &f->av, NULL), "fi_av_open");
    } else {
        struct fi_eq_attr eq_attr = {.size = 16, .wait_obj = FI_WAIT_UNSPEC};
        fi_check(fi_eq_open(f->fabric, &eq_attr, &f->eq, NULL), "fi_eq_open");
    }
}

static void open_ep(struct fab *f, struct fi_info *info) {
    fi_check(fi_endpoint(f->domain, info, &f->ep, NULL), "fi_endpoint");
    if (f->av) fi_check(fi_ep_bind(f->ep, &f->av->fid, 0), "fi_ep_bind(av)");
    if (f->eq) fi_check(fi_ep_bind(f->ep, &f->eq->fid, 0), "fi_ep_bind(eq)");
    fi_check(fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    fi_check(fi_enable(f->ep), "fi_enable");
}

// Waits for one connection-manager event of the expected kind.
static void wait_cm(struct fab *f, uint32_t want, struct fi_eq_cm_entry *entry) {
    uint32_t event;
    ssize_t r = fi_eq_sread(f->eq, &event, entry, sizeof *entry, CM_TIMEOUT_MS, 0);
    if (r == -FI_EAVAIL) {
        struct fi_eq_err_entry err = {0};
        fi_eq_readerr(f->eq, &err, 0);
        die("connection failed: %s (%s)", fi_strerror(err.err),
            fi_eq_strerror(f->eq, err.prov_errno, err.err_data, NULL, 0));
    }
    if (r == -FI_EAGAIN) die("no connection event within %d s", CM_TIMEOUT_MS / 1000);
    if (r < 0) die("fi_eq_sread: %s", fi_strerror((int)-r));
    if (event != want) die("unexpected connection event %s", fi_tostr(&event, FI_TYPE_EQ_EVENT));
}

static void close_fab(struct fab *f) {
    if (f->ep) fi_close(&f->ep->fid);
    if (f->pep) fi_close(&f->pep->fid);
    if (f->av) fi_close(&f->av->fid);
    if (f->cq) fi_close(&f->cq->fid);
    if (f->eq) fi_close(&f->eq->fid);
    if (f->domain) fi_close(&f->domain->fid);
    if (f->fabric) fi_close(&f->fabric->fid);
    fi_freeinfo(f->info);
}

static void print_fabric(const struct fab *f) {
    char buf[1024];
    const struct fi_info *i = f->info;
    printf(" Provider        : %s, %s, fabric %s, domain %s, provider version %u.%u\n",
           i->fabric_attr->prov_name,
           fi_tostr_r(buf, sizeof buf, &i->ep_attr->type, FI_TYPE_EP_TYPE), i->fabric_attr->name,
           i->domain_attr->name, FI_MAJOR(i->fabric_attr->prov_version),
           FI_MINOR(i->fabric_attr->prov_version));
    printf(" Provider caps   : %s\n", fi_tostr_r(buf, sizeof buf, &f->prov_caps, FI_TYPE_CAPS));
    printf(" FI_RMA_PMEM     : %s\n",
           f->prov_caps & FI_RMA_PMEM ? "advertised (requested)" : "not advertised");
    fi_tostr_r(buf, sizeof buf, &i->domain_attr->mr_mode, FI_TYPE_MR_MODE);
    printf(" MR mode         : %s (target addressed by %s)\n", *buf ? buf : "[] (scalable)",
           i->domain_attr->mr_mode & FI_MR_VIRT_ADDR ? "virtual address" : "offset");
}

static uint8_t pattern(size_t i, uint32_t seed) {
    // Never 0, which is what the target holds before the run.
    return (uint8_t)(1 + (i * 131 + seed) % 251);
}

// ----------------------------------------------------------------- server

static int run_server(const struct opts *o) {
    struct fab f = {0};
    get_info(o, &f);
    open_common(o, &f, true);
    if (o->rdm) {
        open_ep(&f, f.info);
    } else {
        fi_check(fi_passive_ep(f.fabric, f.info, &f.pep, NULL), "fi_passive_ep");
        fi_check(fi_pep_bind(f.pep, &f.eq->fid, 0), "fi_pep_bind");
        fi_check(fi_listen(f.pep), "fi_listen");
    }
    // Listen on the side channel only now: a client that can connect there
    // finds the provider's listener ready.
    int lfd = side_listen(o);
    printf("%s\n", BENCH_LINE);
    printf("                    RMA write target (" PROG " server)\n");
    print_fabric(&f);
    printf(" Side channel    : %s:%u, provider listener on port %u\n", o->addr, o->port,
           (unsigned)o->port + 1);
    printf("%s\n", BENCH_LINE);
    fflush(stdout);

    int sfd = accept(lfd, NULL, NULL);
    if (sfd < 0) die("accept: %s", strerror(errno));
    close(lfd);
    struct side_req req;
    if (!side_recv(sfd, &req, sizeof req) || req.magic != SIDE_MAGIC)
        die("bad request on the side channel");
    if (req.size < 1 || req.size > MAX_SIZE) die("client asked for %" PRIu64 " bytes", req.size);
    size_t size = (size_t)req.size;

    void *buf = NULL;
    if (posix_memalign(&buf, 4096, size)) die("out of memory for %zu bytes", size);
    memset(buf, 0, size);
    uint64_t access = FI_REMOTE_WRITE | FI_REMOTE_READ;
#ifdef FI_PMEM
    if (f.prov_caps & FI_RMA_PMEM) access |= FI_PMEM;
#endif
    bool prov_key = f.info->domain_attr->mr_mode & FI_MR_PROV_KEY;
    struct fid_mr *mr = NULL;
    struct side_reply reply = {.magic = SIDE_MAGIC, .len = size};
    reply.status = fi_mr_reg(f.domain, buf, size, access, 0, prov_key ? 0 : 0x5eed, 0, &mr, NULL);
    if (!reply.status) {
        reply.key = fi_mr_key(mr);
        reply.addr = f.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR ? (uintptr_t)buf : 0;
    }
    side_send(sfd, &reply, sizeof reply);
    fi_check(reply.status, "fi_mr_reg(target)");

    if (!o->rdm) {
        struct fi_eq_cm_entry cm;
        wait_cm(&f, FI_CONNREQ, &cm);
        open_ep(&f, cm.info);
        fi_freeinfo(cm.info);
        fi_check(fi_accept(f.ep, NULL, 0), "fi_accept");
        wait_cm(&f, FI_CONNECTED, &cm);
    }

    // libfabric 1.17's tcp provider advertises FI_PROGRESS_AUTO but has no
    // thread of its own: incoming writes are placed, committed and
    // acknowledged only while the target calls into its CQ.  So the target
    // keeps doing that, spinning or sleeping in fi_cq_sread as the client
    // asked, until the client says it is done.
    struct pollfd pfd = {.fd = sfd, .events = POLLIN};
    for (unsigned spins = 0;;) {
        struct fi_cq_entry e[8];
        ssize_t r = req.blocking ? fi_cq_sread(f.cq, e, 8, NULL, 10) : fi_cq_read(f.cq, e, 8);
        if (r == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(f.cq, &err, 0);
            die("target completion error: %s", fi_strerror(err.err));
        }
        if ((req.blocking || (++spins & 255) == 0) && poll(&pfd, 1, 0) > 0) break;
    }
    struct side_done done;
    if (!side_recv(sfd, &done, sizeof done) || done.magic != SIDE_MAGIC)
        die("client left without finishing");
    struct side_verdict v = {.magic = SIDE_MAGIC, .ok = 1};
    const uint8_t *b = buf;
    for (size_t i = 0; i < size; i++) {
        if (b[i] != pattern(i, done.seed)) {
            v = (struct side_verdict){SIDE_MAGIC, 0, i, pattern(i, done.seed), b[i]};
            break;
        }
    }
    side_send(sfd, &v, sizeof v);
    if (v.ok)
        printf(" target check    : %zu bytes as written by the last of %" PRIu64 " writes: OK\n",
               size, done.writes);
    else
        printf(" target check    : MISMATCH at byte %" PRIu64 ": expected 0x%02x, found 0x%02x\n",
               v.first_bad, v.expected, v.found);
    // Tear down only after the client has, so it never sees a shutdown
    // mid-run.
    char c;
    while (recv(sfd, &c, 1, 0) > 0)
        ;
    close(sfd);
    fi_close(&mr->fid);
    close_fab(&f);
    free(buf);
    return v.ok ? 0 : 1;
}

// ----------------------------------------------------------------- client

struct client {
    const struct opts *o;
    struct fab f;
    uint64_t flags;
    void *src, *chk;
    struct fid_mr *src_mr, *chk_mr;
    uint64_t raddr, rkey;
    // Free operation contexts: one per write in flight.
    struct fi_context2 *ctx;
    struct fi_context2 **free_ctx;
    unsigned n_free;
};

static void *mr_desc_of(struct fid_mr *mr) {
    return mr ? fi_mr_desc(mr) : NULL;
}

static ssize_t post_rma(struct client *c, bool write, struct fi_context2 *ctx) {
    struct iovec iov = {write ? c->src : c->chk, c->o->size};
    void *desc = mr_desc_of(write ? c->src_mr : c->chk_mr);
    struct fi_rma_iov rma = {c->raddr, c->o->size, c->rkey};
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = c->f.peer,
                             .rma_iov = &rma,
                             .rma_iov_count = 1,
                             .context = ctx};
    // The per-operation flags are what selects commit completion: in
    // libfabric 1.17 the tcp provider derives the acknowledgement it waits
    // for from the flags passed here only, and ignores FI_COMMIT_COMPLETE or
    // FI_DELIVERY_COMPLETE in the endpoint's default op_flags (fi_write()
    // would therefore complete as soon as the data is in the socket).
    return write ? fi_writemsg(c->f.ep, &msg, c->flags) : fi_readmsg(c->f.ep, &msg, FI_COMPLETION);
}

// Reaps up to max completions, returning their contexts to the free list;
// waits (spinning or in fi_cq_sread) at most STALL_MS for the first.
static unsigned reap(struct client *c, unsigned max) {
    struct fi_cq_entry e[16];
    if (max > 16) max = 16;
    int64_t give_up = 0;
    for (unsigned spins = 0;; spins++) {
        ssize_t r =
            c->o->blocking ? fi_cq_sread(c->f.cq, e, max, NULL, 100) : fi_cq_read(c->f.cq, e, max);
        if (r > 0) {
            for (ssize_t i = 0; i < r; i++)
                c->free_ctx[c->n_free++] = e[i].op_context;
            return (unsigned)r;
        }
        if (r == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(c->f.cq, &err, 0);
            die("completion error: %s (%s)", fi_strerror(err.err),
                fi_cq_strerror(c->f.cq, err.prov_errno, err.err_data, NULL, 0));
        }
        if (r != -FI_EAGAIN && r != 0) die("fi_cq_read: %s", fi_strerror((int)-r));
        if (c->o->blocking || (spins & 1023) == 0) {
            int64_t now = bench_now_ns();
            if (!give_up)
                give_up = now + (int64_t)STALL_MS * 1000000;
            else if (now > give_up)
                die("no completion within %d s", STALL_MS / 1000);
        }
    }
}

// Posts one operation, driving progress while the provider's queue is full.
static void post(struct client *c, bool write) {
    if (!c->n_free) die("internal: no free operation context");
    struct fi_context2 *ctx = c->free_ctx[--c->n_free];
    int64_t give_up = bench_now_ns() + (int64_t)STALL_MS * 1000000;
    for (;;) {
        ssize_t r = post_rma(c, write, ctx);
        if (!r) return;
        if (r != -FI_EAGAIN)
            die("%s: %s", write ? "fi_writemsg" : "fi_readmsg", fi_strerror((int)-r));
        // The provider's queue is full: it drains as earlier operations
        // complete, or, with none outstanding, as the CQ drives progress.
        if (c->n_free + 1 < c->o->depth) {
            reap(c, 16);
        } else {
            struct fi_cq_entry e;
            ssize_t q = fi_cq_read(c->f.cq, &e, 1);
            if (q > 0) die("internal: completion with no operation outstanding");
            if (bench_now_ns() > give_up)
                die("provider queue stayed full for %d s", STALL_MS / 1000);
        }
    }
}

static int64_t deadline_after(const struct opts *o, int64_t t0) {
    return o->iters ? 0 : t0 + (int64_t)(o->seconds * 1e9);
}

// One write at a time, untimed: the connection (which ofi_rxm makes only at
// the first operation) and the caches are warm before the clock starts.
static void warm_up(struct client *c) {
    for (unsigned i = 0; i < WARMUP; i++) {
        post(c, true);
        while (!reap(c, 1))
            ;
    }
}

static void run_lat(struct client *c, struct bench_samples *s) {
    const struct opts *o = c->o;
    int64_t deadline = deadline_after(o, bench_now_ns());
    for (uint64_t i = 0; o->iters ? i < o->iters : bench_now_ns() < deadline; i++) {
        int64_t t0 = bench_now_ns();
        post(c, true);
        while (!reap(c, 1))
            ;
        int64_t t1 = bench_now_ns();
        if (!bench_samples_add(s, (double)(t1 - t0) / 1e3)) die("out of memory");
    }
}

static struct bench_bw run_bw(struct client *c) {
    const struct opts *o = c->o;
    uint64_t posted = 0, completed = 0;
    struct bench_peak peak = {0};
    int64_t t0 = bench_now_ns(), deadline = deadline_after(o, t0);
    bool stop = false;
    while (!stop || completed < posted) {
        while (!stop && posted - completed < o->depth) {
            if (o->iters ? posted >= o->iters : bench_now_ns() >= deadline) {
                stop = true;
                break;
            }
            post(c, true);
            posted++;
        }
        if (completed < posted) {
            unsigned n = reap(c, 16);
            completed += n;
            bench_peak_add(&peak, bench_now_ns(), (uint64_t)n * o->size);
        }
    }
    int64_t t1 = bench_now_ns();
    return bench_bw_result(o->size, completed, completed * o->size, completed, t1 - t0, &peak);
}

static int run_client(const struct opts *o) {
    struct client c = {.o = o};
    struct fab *f = &c.f;
    get_info(o, f);
    open_common(o, f, o->blocking);
    if (o->depth > f->info->tx_attr->size)
        die("-t %u: the provider queues at most %zu operations", o->depth, f->info->tx_attr->size);
    c.flags = FI_COMPLETION;
    if (o->comp == COMP_COMMIT) c.flags |= FI_COMMIT_COMPLETE;
    if (o->comp == COMP_DELIVERY) c.flags |= FI_DELIVERY_COMPLETE;

    uint32_t seed = (uint32_t)getpid() ^ (uint32_t)bench_now_ns();
    if (posix_memalign(&c.src, 4096, o->size) || posix_memalign(&c.chk, 4096, o->size))
        die("out of memory for %zu bytes", o->size);
    for (size_t i = 0; i < o->size; i++)
        ((uint8_t *)c.src)[i] = pattern(i, seed);
    memset(c.chk, 0, o->size);
    fi_check(fi_mr_reg(f->domain, c.src, o->size, FI_WRITE, 0, 1, 0, &c.src_mr, NULL),
             "fi_mr_reg(source)");
    fi_check(fi_mr_reg(f->domain, c.chk, o->size, FI_READ, 0, 2, 0, &c.chk_mr, NULL),
             "fi_mr_reg(read-back)");
    c.ctx = calloc(o->depth, sizeof *c.ctx);
    c.free_ctx = calloc(o->depth, sizeof *c.free_ctx);
    if (!c.ctx || !c.free_ctx) die("out of memory");
    for (unsigned i = 0; i < o->depth; i++)
        c.free_ctx[c.n_free++] = &c.ctx[i];

    int sfd = side_connect(o);
    struct side_req req = {SIDE_MAGIC, o->blocking, o->size};
    side_send(sfd, &req, sizeof req);
    struct side_reply reply;
    if (!side_recv(sfd, &reply, sizeof reply) || reply.magic != SIDE_MAGIC)
        die("no reply from the server");
    if (reply.status) die("server could not register its target: %s", fi_strerror(-reply.status));
    c.raddr = reply.addr;
    c.rkey = reply.key;

    if (o->rdm) {
        open_ep(f, f->info);
        if (fi_av_insert(f->av, f->info->dest_addr, 1, &f->peer, 0, NULL) != 1)
            die("fi_av_insert of the server's address failed");
    } else {
        struct fi_eq_cm_entry cm;
        open_ep(f, f->info);
        fi_check(fi_connect(f->ep, f->info->dest_addr, NULL, 0), "fi_connect");
        wait_cm(f, FI_CONNECTED, &cm);
    }

    printf("%s\n", BENCH_LINE);
    printf("                    RMA write %s (" PROG ")\n", o->bw ? "bandwidth" : "latency");
    print_fabric(f);
    printf(" Target MR       : FI_REMOTE_WRITE | FI_REMOTE_READ%s\n",
#ifdef FI_PMEM
           f->prov_caps & FI_RMA_PMEM ? " | FI_PMEM" : ""
#else
           " (this libfabric defines no FI_PMEM registration flag)"
#endif
    );
    printf(" Operation       : fi_writemsg(%s), %zu bytes, %u in flight\n",
           o->comp == COMP_COMMIT     ? "FI_COMPLETION | FI_COMMIT_COMPLETE"
           : o->comp == COMP_DELIVERY ? "FI_COMPLETION | FI_DELIVERY_COMPLETE"
                                      : "FI_COMPLETION",
           o->size, o->bw ? o->depth : 1);
    printf(" Completion wait : %s\n", o->blocking ? "fi_cq_sread (blocking), target likewise"
                                                  : "polling fi_cq_read (busy), target likewise");
    if (!o->bw) printf(" Latency         : full round trip, post to completion\n");

    struct bench_samples s = {0};
    struct bench_lat lat = {0};
    struct bench_bw bw = {0};
    warm_up(&c);
    uint64_t writes = WARMUP;
    if (o->bw) {
        bw = run_bw(&c);
        writes += bw.iterations;
    } else {
        run_lat(&c, &s);
        lat = bench_lat_stats(&s);
        writes += lat.n;
    }

    // Read-after-write is ordered by every provider this targets (tcp
    // advertises FI_ORDER_RAW), so the read also returns after the writes
    // have landed even with --completion none, and the server's check
    // below sees the final contents.
    post(&c, false);
    while (!reap(&c, 1))
        ;
    bool read_ok = !memcmp(c.src, c.chk, o->size);
    struct side_done done = {SIDE_MAGIC, seed, writes};
    side_send(sfd, &done, sizeof done);
    struct side_verdict v;
    if (!side_recv(sfd, &v, sizeof v) || v.magic != SIDE_MAGIC) die("no verdict from the server");

    if (o->bw) {
        bench_bw_header(false);
        bench_bw_row(&bw);
    } else {
        bench_lat_header();
        bench_lat_row(o->size, &lat);
    }
    printf(" data check      : read-back %s, target %s\n", read_ok ? "OK" : "MISMATCH",
           v.ok ? "OK" : "MISMATCH");
    if (!v.ok)
        fprintf(stderr, PROG ": target byte %" PRIu64 " is 0x%02x, the client wrote 0x%02x\n",
                v.first_bad, v.found, v.expected);
    int rc = read_ok && v.ok ? 0 : 1;
    if (!rc && o->json) {
        char method[128];
        snprintf(method, sizeof method, "%s-%s", f->info->fabric_attr->prov_name,
                 completion_name[o->comp]);
        bool ok = o->bw ? bench_json_bw(PROG, o->json, PROG, method,
                                        o->blocking ? "blocking" : "busy", &bw)
                        : bench_json_lat(PROG, o->json, PROG, method,
                                         o->blocking ? "blocking" : "busy", o->size, &lat);
        if (!ok) rc = 1;
    }
    close(sfd);
    fi_close(&f->ep->fid);
    f->ep = NULL;
    fi_close(&c.src_mr->fid);
    fi_close(&c.chk_mr->fid);
    close_fab(f);
    free(c.src);
    free(c.chk);
    free(c.ctx);
    free(c.free_ctx);
    free(s.v);
    return rc;
}

// ------------------------------------------------------------------- main

static void usage(FILE *out) {
    fprintf(out,
            "usage: server: " PROG " [-p PROVIDER] [-e msg|rdm] [-a ADDR] [-P PORT]\n"
            "       client: " PROG " [-p PROVIDER] [-e msg|rdm] [-P PORT] [-m lat|bw] [-s SIZE]\n"
            "                              [-n ITERS | -D SECONDS] [-t DEPTH]\n"
            "                              [--completion commit|delivery|none] [--blocking]\n"
            "                              [--out_json_file FILE] HOST\n"
            "  -p PROVIDER   libfabric provider (default tcp)\n"
            "  -e msg|rdm    endpoint type (default msg; rdm runs tcp under ofi_rxm)\n"
            "  -a ADDR       server: address to listen on (default 127.0.0.1); outside\n"
            "                a named network namespace (ip netns) only 127.0.0.0/8\n"
            "  -P PORT       side channel port; the provider listens on PORT+1 (default %d)\n"
            "  -m lat|bw     one write in flight, timed to its completion; or DEPTH in flight\n"
            "  -s SIZE       bytes per write (default 64 for lat, 65536 for bw)\n"
            "  -n ITERS      writes to time (default 1000 for lat, 5000 for bw)\n"
            "  -D SECONDS    run for this long instead\n"
            "  -t DEPTH      bw: writes in flight (default 16)\n"
            "  --completion  commit: FI_COMMIT_COMPLETE (default); delivery:\n"
            "                FI_DELIVERY_COMPLETE; none: the provider's default completion\n"
            "  --blocking    wait in fi_cq_sread instead of polling (client and server)\n"
            "  --out_json_file FILE  client: also write the result as JSON\n",
            DEFAULT_PORT);
}

static bool parse_args(int argc, char **argv, struct opts *o) {
    enum { OPT_COMPLETION = 256, OPT_BLOCKING, OPT_JSON };
    static const struct option longopts[] = {
        {"completion", required_argument, NULL, OPT_COMPLETION},
        {"blocking", no_argument, NULL, OPT_BLOCKING},
        {"out_json_file", required_argument, NULL, OPT_JSON},
        {"port", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (struct opts){.prov = "tcp", .addr = "127.0.0.1", .port = DEFAULT_PORT, .depth = 16};
    struct bench_run_opts run = {.bw = &o->bw,
                                 .size = &o->size,
                                 .iters = &o->iters,
                                 .seconds = &o->seconds,
                                 .max_size = MAX_SIZE};
    bool have_t = false;
    uint64_t v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":p:e:a:P:m:s:n:D:t:h", longopts, NULL)) != -1) {
        int k = bench_parse_run_opt(PROG, c, optarg, &run);
        if (k < 0) return false;
        if (k) continue;
        switch (c) {
        case 'p':
            o->prov = optarg;
            break;
        case 'e':
            if (strcmp(optarg, "msg") && strcmp(optarg, "rdm")) {
                fprintf(stderr, PROG ": -e %s: expected msg or rdm\n", optarg);
                return false;
            }
            o->rdm = !strcmp(optarg, "rdm");
            break;
        case 'a':
            o->addr = optarg;
            break;
        case 'P':
            if (!bench_parse_u64(PROG, "-P", optarg, 1, 65534, &v)) return false;
            o->port = (uint16_t)v;
            break;
        case 't':
            if (!bench_parse_u64(PROG, "-t", optarg, 1, 4096, &v)) return false;
            o->depth = (unsigned)v;
            have_t = true;
            break;
        case OPT_COMPLETION:
            if (!strcmp(optarg, "commit"))
                o->comp = COMP_COMMIT;
            else if (!strcmp(optarg, "delivery"))
                o->comp = COMP_DELIVERY;
            else if (!strcmp(optarg, "none"))
                o->comp = COMP_NONE;
            else {
                fprintf(stderr, PROG ": --completion %s: expected commit, delivery or none\n",
                        optarg);
                return false;
            }
            break;
        case OPT_BLOCKING:
            o->blocking = true;
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
    if (optind < argc) o->host = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return false;
    }
    if (run.have_n && run.have_d) {
        fprintf(stderr, PROG ": -n and -D exclude each other\n");
        return false;
    }
    if (have_t && !o->bw) {
        fprintf(stderr, PROG ": -t applies to -m bw only\n");
        return false;
    }
    if (!o->bw) o->depth = 1;
    if (!run.have_size) o->size = o->bw ? 65536 : 64;
    if (!run.have_n && !run.have_d) o->iters = o->bw ? 5000 : 1000;
    // Checked here as well as where used, so a typo fails before any setup.
    struct sockaddr_in unused =
        local_sockaddr(o->host ? "HOST" : "-a", o->host ? o->host : o->addr, 0);
    (void)unused;
    return true;
}

int main(int argc, char **argv) {
    struct opts o;
    if (!parse_args(argc, argv, &o)) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    return o.host ? run_client(&o) : run_server(&o);
}
