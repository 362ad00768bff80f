// SPDX-License-Identifier: MIT
/*
 * fi_remote_log - an append-only log kept in a file on another host, made
 * durable through libfabric with the pmof provider's persistence extensions
 * (<rdma/fi_ext_pmof.h>, fi_pmof(7)).
 *
 * The file has remote_log's layout (docs/examples/remote_log.c):
 *
 *   offset 0    the commit record: head index H (8 bytes), meaning
 *               "records 1..H are complete and durable"
 *   offset 8    a magic number naming the file as a log
 *   offset 64   record 1, record 2, ...: a header (sequence number, payload
 *               length, checksum), then the payload, padded to 8 bytes
 *
 * The target (--server) maps the file - or a device DAX, /dev/daxN.M, which
 * an RNIC such as Linux rxe can make persistent by itself - MAP_SHARED and
 * registers it with fi_mr_reg(..., FI_PMEM).  The initiator appends each record with
 *
 *   1. fi_write() of the record into the next free slot, and
 *   2. fi_writemsg() of the new head index with FI_COMMIT | FI_FENCE:
 *      FI_FENCE makes every earlier write durable before the head is placed,
 *      FI_COMMIT completes only once the head is durable too.
 *
 * So a crash at any moment leaves a head that points only at complete
 * records, and a completed head write means its record survives.
 *
 * With --manual both sides take FI_COMMIT_MANUAL: the transport no longer
 * makes the writes durable; the target's handler (fi_eq_register_handler)
 * is given the ranges of each commit, persists them with msync() and its
 * return value completes the initiator's commit.  That is how a target
 * whose memory the NIC cannot make durable still offers FI_COMMIT.
 *
 * Build:  cc -o fi_remote_log fi_remote_log.c $(pkg-config --cflags --libs libfabric)
 *         (with fi_ext_pmof.h on the include path)
 * Run (FI_PROVIDER_PATH pointing at libpmof-fi.so if it is not installed):
 *         ./fi_remote_log --server -a 127.0.0.1 --file /var/tmp/log &
 *         ./fi_remote_log -a 127.0.0.1 -p PORT -n 1000
 *         ./fi_remote_log --verify /var/tmp/log
 */
#define _GNU_SOURCE /* getopt_long, htole64 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext_pmof.h>
#include <rdma/fi_rma.h>

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_MAGIC 0x676f6c5f666f6d70ULL /* "pmof_log" */
#define LOG_DATA 64
#define DEPTH 16 /* appends in flight */
#define MAX_RECORD 4096

struct rec_hdr {
    uint64_t seq;
    uint32_t len;
    uint32_t csum;
};

/* What the target tells the initiator in its accept: where the log is. */
struct log_desc {
    uint64_t addr, key, size;
};

static struct {
    const char *addr, *port, *file, *verify;
    size_t size, records, record_size;
    bool server, manual;
} opt = {.port = "0", .size = 64 << 20, .records = 1000, .record_size = 64};

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (int)(call);                                                                     \
        if (rc_) {                                                                                 \
            fprintf(stderr, "fi_remote_log: %s: %s\n", #call, fi_strerror(-rc_));                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint32_t checksum(const uint8_t *p, size_t len, uint64_t seq) {
    uint32_t h = 2166136261u ^ (uint32_t)seq;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static size_t slot_size(size_t record_size) {
    return sizeof(struct rec_hdr) + ((record_size + 7) & ~(size_t)7);
}

/* Maps the log: a file (created, or of its own size when read), or a
 * device DAX character device (/dev/daxN.M, persistent memory the NIC can
 * reach directly), of which *len bytes are used - a multiple of its
 * alignment, usually 2 MiB. */
static uint8_t *map_log(const char *path, bool create, size_t *len) {
    int fd = open(path, create ? O_RDWR | O_CREAT : O_RDONLY, 0644);
    struct stat st;
    void *p;

    if (fd < 0 || fstat(fd, &st)) {
        perror(path);
        return NULL;
    }
    if (S_ISREG(st.st_mode)) {
        if (create && (ftruncate(fd, 0) || ftruncate(fd, (off_t)*len))) {
            perror(path);
            close(fd);
            return NULL;
        }
        if (!create) *len = (size_t)st.st_size;
    }
    p = *len ? mmap(NULL, *len, create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0)
             : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "%s: cannot map %zu bytes\n", path, *len);
        return NULL;
    }
    return p;
}

static struct fi_info *get_info(const char *node, const char *service, uint64_t flags) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;

    hints->ep_attr->type = FI_EP_MSG;
    /* Each side names its direction: a device that executes its peers'
     * FLUSHes but cannot send one still serves as a target. */
    hints->caps = FI_RMA | (opt.server ? FI_REMOTE_WRITE : FI_WRITE) | FI_RMA_PMEM;
    /* The application can persist by itself when asked to. */
    hints->mode = opt.manual ? FI_COMMIT_MANUAL : 0;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("pmof");
    CHECK(fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, &info));
    fi_freeinfo(hints);
    /* pmof lists the manual form after the transport's own: take it. */
    for (struct fi_info *fi = info; opt.manual && fi; fi = fi->next) {
        if (!(fi->mode & FI_COMMIT_MANUAL)) continue;
        struct fi_info *dup = fi_dupinfo(fi);
        fi_freeinfo(info);
        return dup;
    }
    if (opt.manual) {
        fprintf(stderr, "fi_remote_log: the provider does not offer FI_COMMIT_MANUAL\n");
        exit(1);
    }
    return info;
}

/* Waits for `want` on the EQ; anything else ends the program. */
static void wait_event(struct fid_eq *eq, uint32_t want, struct fi_eq_cm_entry *entry, size_t len) {
    uint32_t event;
    ssize_t n = fi_eq_sread(eq, &event, entry, len, -1, 0);

    if (n == -FI_EAVAIL) {
        struct fi_eq_err_entry err = {0};
        fi_eq_readerr(eq, &err, 0);
        fprintf(stderr, "fi_remote_log: connection failed: %s\n", fi_strerror(err.err));
        exit(1);
    }
    if (n < 0 || event != want) {
        fprintf(stderr, "fi_remote_log: unexpected EQ event %u (%zd)\n", event, n);
        exit(1);
    }
}

/* --------------------------------------------------------------- target */

static uint8_t *log_base;
static size_t log_len;

/* FI_COMMIT_MANUAL: the provider hands over the ranges of each commit;
 * returning 0 completes the initiator's operation, an error fails it. */
static ssize_t persist(struct fid_eq *eq, uint64_t type, void *data, uint64_t len, void *ctx) {
    const struct fi_eq_commit_entry *c = data;

    (void)eq, (void)ctx;
    if (type != FI_COMMIT_EVENT || len != sizeof(*c)) return -FI_EINVAL;
    for (size_t i = 0; i < c->count; i++) {
        uintptr_t a = (uintptr_t)c->iov[i].addr;
        uintptr_t lo = a & ~(uintptr_t)4095;
        if (a < (uintptr_t)log_base || a + c->iov[i].len > (uintptr_t)log_base + log_len)
            return -FI_EINVAL;
        if (msync((void *)lo, a + c->iov[i].len - lo, MS_SYNC)) return -FI_EIO;
    }
    return 0;
}

static int run_server(void) {
    struct fi_info *info = get_info(opt.addr, opt.port, FI_SOURCE);
    struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC};
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC};
    /* An event and its private data. */
    _Alignas(struct fi_eq_cm_entry) uint8_t evbuf[sizeof(struct fi_eq_cm_entry) + 64];
    struct fi_eq_cm_entry *ev = (void *)evbuf;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_eq *eq;
    struct fid_pep *pep;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_mr *mr;
    struct sockaddr_in sin;
    size_t alen = sizeof(sin);

    log_len = opt.size;
    log_base = map_log(opt.file, true, &log_len);
    if (!log_base) return 1;
    /* A device keeps what an earlier log left: start from an empty one. */
    *(uint64_t *)log_base = 0;
    *(uint64_t *)(log_base + 8) = htole64(LOG_MAGIC);
    msync(log_base, 4096, MS_SYNC);

    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK(fi_eq_open(fabric, &eq_attr, &eq, NULL));
    if (opt.manual) CHECK(fi_eq_register_handler(eq, FI_COMMIT_EVENT, persist, NULL));
    CHECK(fi_passive_ep(fabric, info, &pep, NULL));
    CHECK(fi_pep_bind(pep, &eq->fid, 0));
    CHECK(fi_listen(pep));
    CHECK(fi_getname(&pep->fid, &sin, &alen));
    printf("fi_remote_log: listening on port %u\n", ntohs(sin.sin_port));
    fflush(stdout);

    wait_event(eq, FI_CONNREQ, ev, sizeof(evbuf));
    struct fi_info *req = ev->info; /* the request's, ours to free */
    CHECK(fi_domain(fabric, req, &domain, NULL));
    /* FI_PMEM: remote writes to this region can be made persistent. */
    CHECK(fi_mr_reg(domain, log_base, log_len, FI_REMOTE_WRITE, 0, 0, FI_PMEM, &mr, NULL));
    CHECK(fi_endpoint(domain, req, &ep, NULL));
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
    CHECK(fi_ep_bind(ep, &eq->fid, 0));
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_enable(ep));
    struct log_desc d = {htole64((uintptr_t)log_base), htole64(fi_mr_key(mr)), htole64(log_len)};
    CHECK(fi_accept(ep, &d, sizeof(d)));
    wait_event(eq, FI_CONNECTED, ev, sizeof(evbuf));
    fi_freeinfo(req);
    printf("fi_remote_log: connected%s\n", opt.manual ? " (FI_COMMIT_MANUAL)" : "");
    fflush(stdout);
    /* The handler runs in the provider's thread; here we only wait for
     * the initiator to go. */
    wait_event(eq, FI_SHUTDOWN, ev, sizeof(evbuf));
    printf("fi_remote_log: head %" PRIu64 "\n", le64toh(*(uint64_t *)log_base));
    CHECK(fi_close(&ep->fid));
    CHECK(fi_close(&mr->fid));
    CHECK(fi_close(&cq->fid));
    CHECK(fi_close(&pep->fid));
    CHECK(fi_close(&eq->fid));
    CHECK(fi_close(&domain->fid));
    CHECK(fi_close(&fabric->fid));
    fi_freeinfo(info);
    munmap(log_base, log_len);
    return 0;
}

/* ------------------------------------------------------------ initiator */

static int run_client(void) {
    struct fi_info *info = get_info(opt.addr, opt.port, 0);
    struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC};
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC};
    _Alignas(struct fi_eq_cm_entry) uint8_t evbuf[sizeof(struct fi_eq_cm_entry) + 64];
    struct fi_eq_cm_entry *ev = (void *)evbuf;
    struct log_desc d;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_eq *eq;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_mr *mr;
    size_t slot = slot_size(opt.record_size);
    /* DEPTH record slots and DEPTH head words, registered once. */
    uint8_t *buf = aligned_alloc(4096, ((DEPTH * (slot + 8)) + 4095) & ~(size_t)4095);
    uint64_t *heads = (uint64_t *)(buf + DEPTH * slot);
    uint64_t posted = 0, done = 0;

    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK(fi_eq_open(fabric, &eq_attr, &eq, NULL));
    CHECK(fi_domain(fabric, info, &domain, NULL));
    CHECK(fi_mr_reg(domain, buf, DEPTH * (slot + 8), FI_WRITE, 0, 0, 0, &mr, NULL));
    CHECK(fi_endpoint(domain, info, &ep, NULL));
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
    CHECK(fi_ep_bind(ep, &eq->fid, 0));
    /* Selective: only the head commits produce completions. */
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION));
    CHECK(fi_enable(ep));
    CHECK(fi_connect(ep, info->dest_addr, NULL, 0));
    wait_event(eq, FI_CONNECTED, ev, sizeof(evbuf));
    memcpy(&d, ev->data, sizeof(d));
    uint64_t raddr = le64toh(d.addr), key = le64toh(d.key), size = le64toh(d.size);
    size_t capacity = (size - LOG_DATA) / slot;
    if (opt.records > capacity) opt.records = capacity;
    printf("fi_remote_log: %s\n", opt.manual ? "FI_COMMIT_MANUAL" : "FI_COMMIT by the transport");
    fflush(stdout);

    while (done < opt.records) {
        while (posted < opt.records && posted - done < DEPTH) {
            uint64_t seq = posted + 1;
            uint8_t *r = buf + (seq % DEPTH) * slot;
            struct rec_hdr *h = (struct rec_hdr *)r;
            for (size_t i = 0; i < opt.record_size; i++)
                r[sizeof(*h) + i] = (uint8_t)(seq * 31 + i);
            h->seq = htole64(seq);
            h->len = htole32((uint32_t)opt.record_size);
            h->csum = htole32(checksum(r + sizeof(*h), opt.record_size, seq));
            heads[seq % DEPTH] = htole64(seq);

            ssize_t rc = fi_write(ep, r, slot, fi_mr_desc(mr), 0,
                                  raddr + LOG_DATA + (seq - 1) * slot, key, NULL);
            if (rc == -FI_EAGAIN) break;
            CHECK(rc);
            struct iovec iov = {&heads[seq % DEPTH], 8};
            void *desc = fi_mr_desc(mr);
            struct fi_rma_iov rma = {raddr, 8, key};
            struct fi_msg_rma msg = {.msg_iov = &iov,
                                     .desc = &desc,
                                     .iov_count = 1,
                                     .rma_iov = &rma,
                                     .rma_iov_count = 1,
                                     .context = (void *)(uintptr_t)seq};
            /* The record (every earlier write) durable before the head is
             * placed; the completion once the head is durable too. */
            while ((rc = fi_writemsg(ep, &msg, FI_COMMIT | FI_FENCE | FI_COMPLETION)) == -FI_EAGAIN)
                sched_yield(); /* the provider reaps its queue as it posts */
            CHECK(rc);
            posted++;
        }
        struct fi_cq_entry c;
        ssize_t n = fi_cq_sread(cq, &c, 1, NULL, -1);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            char msg[128];
            fi_cq_readerr(cq, &err, 0);
            printf("fi_remote_log: commit failed: %s (%s)\n", fi_strerror(err.err),
                   fi_cq_strerror(cq, err.prov_errno, err.err_data, msg, sizeof(msg)));
            return 3;
        }
        if (n < 0 && n != -FI_EAGAIN) CHECK(n);
        if (n == 1) {
            done = (uint64_t)(uintptr_t)c.op_context;
            printf("committed %" PRIu64 "\n", done);
            fflush(stdout);
        }
    }
    printf("%" PRIu64 " records committed\n", done);
    CHECK(fi_shutdown(ep, 0));
    CHECK(fi_close(&ep->fid));
    CHECK(fi_close(&mr->fid));
    CHECK(fi_close(&cq->fid));
    CHECK(fi_close(&eq->fid));
    CHECK(fi_close(&domain->fid));
    CHECK(fi_close(&fabric->fid));
    fi_freeinfo(info);
    free(buf);
    return 0;
}

/* --------------------------------------------------------------- verify */

static int verify(const char *path) {
    size_t len = opt.size;
    const uint8_t *p = map_log(path, false, &len);

    if (!p) return 1;
    if (len < LOG_DATA) {
        fprintf(stderr, "%s: not a log\n", path);
        return 1;
    }
    if (le64toh(*(uint64_t *)(p + 8)) != LOG_MAGIC) {
        fprintf(stderr, "%s: bad magic\n", path);
        return 1;
    }
    uint64_t head = le64toh(*(uint64_t *)p);
    size_t slot = slot_size(opt.record_size);
    for (uint64_t seq = 1; seq <= head; seq++) {
        size_t off = LOG_DATA + (seq - 1) * slot;
        const struct rec_hdr *h = (const void *)(p + off);
        if (off + slot > len || le64toh(h->seq) != seq || le32toh(h->len) != opt.record_size ||
            le32toh(h->csum) != checksum(p + off + sizeof(*h), opt.record_size, seq)) {
            printf("record %" PRIu64 " of %" PRIu64 " is damaged\n", seq, head);
            return 2;
        }
    }
    printf("log ok: %" PRIu64 " records\n", head);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "Usage: fi_remote_log --server [-a ADDR] [-p PORT] --file PATH [--size BYTES] "
               "[--manual]\n"
               "       fi_remote_log -a ADDR -p PORT [-n RECORDS] [--record-size BYTES] "
               "[--manual]\n"
               "       fi_remote_log --verify PATH [--size BYTES] [--record-size BYTES]\n"
               "PATH may be a device DAX (/dev/daxN.M); --size then says how much of it.\n");
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"server", no_argument, NULL, 's'},       {"file", required_argument, NULL, 'f'},
        {"size", required_argument, NULL, 'S'},   {"manual", no_argument, NULL, 'm'},
        {"verify", required_argument, NULL, 'V'}, {"record-size", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "a:p:n:h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            opt.server = true;
            break;
        case 'f':
            opt.file = optarg;
            break;
        case 'S':
            opt.size = strtoull(optarg, NULL, 0);
            break;
        case 'm':
            opt.manual = true;
            break;
        case 'V':
            opt.verify = optarg;
            break;
        case 'r':
            opt.record_size = strtoull(optarg, NULL, 0);
            break;
        case 'a':
            opt.addr = optarg;
            break;
        case 'p':
            opt.port = optarg;
            break;
        case 'n':
            opt.records = strtoull(optarg, NULL, 0);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 1;
        }
    }
    if (!opt.record_size || opt.record_size > MAX_RECORD) {
        fprintf(stderr, "fi_remote_log: --record-size must be 1..%d\n", MAX_RECORD);
        return 1;
    }
    if (opt.verify) return verify(opt.verify);
    if (opt.server) {
        if (!opt.file || opt.size < LOG_DATA + slot_size(opt.record_size)) {
            usage(stderr);
            return 1;
        }
        return run_server();
    }
    if (!opt.addr) {
        usage(stderr);
        return 1;
    }
    return run_client();
}
