// SPDX-License-Identifier: MIT
/*
 * Options, out-of-band exchange, statistics and reports shared by the
 * remote-persistence benchmarks.  The command line, the report layout and
 * the arithmetic of the figures follow perftest, so that results can be put
 * next to ib_write_lat and ib_write_bw.
 */
#define _GNU_SOURCE /* getopt_long, htobe64 */
#include "perf_common.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

const char *perf_prog = "ib_perf";
int perf_die_sock = -1;
const char *perf_peer_name = "peer";

void perf_die(const char *fmt, ...) {
    struct perf_msg m = {.type = MSG_ERROR};
    va_list ap;

    fflush(stdout);
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof(m.text), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", perf_prog, m.text);
    if (perf_die_sock >= 0) {
        int fd = perf_die_sock;

        /* No second attempt should this send fail too. */
        perf_die_sock = -1;
        perf_send_msg(fd, &m);
    }
    exit(1);
}

uint64_t perf_now_ns(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------- options */

enum {
    O_REPORT_GBITS = 256,
    O_OUT_JSON,
    O_OUT_JSON_FILE,
    O_METHOD,
    O_IMM,
    O_ORDERED,
    O_FENCE,
    O_FLUSH_LEVEL,
    O_PLACEMENT,
    O_WRITE,
    O_FLUSH,
    O_TARGET_MEM,
    O_COUNT
};

/* Which tools know an option; unknown ones are refused by name. */
enum { F_COMMIT = 1, F_FLUSH = 2, F_ATOMIC = 4, F_ALL = 7, F_BW_ONLY = 8 };

struct opt_desc {
    int id;
    const char *name;
    unsigned tools;
};

static const struct opt_desc opt_table[] = {
    {'t', "tx-depth", F_ALL | F_BW_ONLY},
    {'l', "post_list", F_ALL | F_BW_ONLY},
    {'a', "all", F_COMMIT | F_FLUSH},
    {O_REPORT_GBITS, "report_gbits", F_ALL | F_BW_ONLY},
    {O_METHOD, "method", F_COMMIT},
    {O_IMM, "imm", F_COMMIT},
    {O_ORDERED, "ordered", F_COMMIT},
    {O_FENCE, "fence", F_COMMIT},
    {O_FLUSH_LEVEL, "flush-level", F_COMMIT | F_FLUSH},
    {O_PLACEMENT, "placement", F_FLUSH | F_ATOMIC},
    {O_WRITE, "write", F_FLUSH},
    {O_FLUSH, "flush", F_ATOMIC},
};

static void usage(FILE *out, const struct perf_opts *o) {
    const bool commit = o->tool == TOOL_WRITE_COMMIT, flush = o->tool == TOOL_FLUSH,
               atomic = o->tool == TOOL_ATOMIC_WRITE;

    fprintf(out,
            "Usage:\n"
            "  %s            start a server and wait for a connection\n"
            "  %s <host>     connect to the server at <host>\n\n",
            o->prog, o->prog);
    if (commit)
        fprintf(out, "Measures the %s of a remote write made durable at the target.\n\n",
                o->bw ? "bandwidth" : "latency");
    else if (flush)
        fprintf(out, "Measures the %s of the IBTA FLUSH verb.\n\n",
                o->bw ? "bandwidth" : "latency");
    else
        fprintf(out, "Measures the latency of the 8-byte IBTA ATOMIC WRITE verb.\n\n");
    fprintf(out,
            "Options:\n"
            "  -d, --ib-dev=<dev>         use IB device <dev> (default: the first one)\n"
            "  -i, --ib-port=<port>       use port <port> of the device (default 1)\n"
            "  -x, --gid-index=<index>    GID index (default: the first IPv4 GID, else 0)\n"
            "  -p, --port=<port>          TCP port of the exchange (default %d)\n"
            "  -m, --mtu=<mtu>            path MTU: 256..4096 (default: the port's active MTU)\n"
            "  -R, --rdma_cm              connect the QP through rdma_cm (port: -p); native\n"
            "                             commits are then agreed in the connection set-up\n",
            PERF_DEFAULT_PORT);
    if (atomic)
        fprintf(out, "  -s, --size=<bytes>         message size: 8 only (ATOMIC WRITE)\n");
    else
        fprintf(out,
                "  -s, --size=<bytes>         message size (default %s)\n"
                "  -a, --all                  run sizes from 2 to 2^23 bytes\n",
                o->bw ? "65536" : "2");
    fprintf(out,
            "  -n, --iters=<n>            iterations per size (default %s)\n"
            "  -D, --duration=<seconds>   run each size for a time instead of -n iterations\n",
            o->bw ? "5000" : "1000");
    if (o->bw)
        fprintf(
            out,
            "  -t, --tx-depth=<n>         operations kept in flight (default 128)\n"
            "  -l, --post_list=<n>        post operations n at a time, in one\n"
            "                             ibv_wr_start()/ibv_wr_complete() batch (default 1)\n");
    fprintf(out, "  -I, --inline_size=<bytes>  post writes up to this size inline (default 0)\n"
                 "  -e, --use_event            sleep on a completion channel instead of polling\n"
                 "  -F, --CPU-freq             accepted for perftest compatibility; no effect\n");
    if (o->bw)
        fprintf(out, "      --report_gbits         report bandwidth in Gb/sec instead of MB/sec\n");
    fprintf(out, "      --out_json             also write the results as JSON\n"
                 "      --out_json_file=<file> JSON file (default perftest_out.json)\n");
    if (commit)
        fprintf(
            out,
            "      --method=<m>           how a write is made durable (default native):\n"
            "                               write        plain RDMA WRITE (not durable)\n"
            "                               native       ibv_wr_rdma_write_commit\n"
            "                               write-flush  WRITE + IBTA FLUSH\n"
            "                               write-read   WRITE + 8-byte READ\n"
            "                               write-send   WRITE + SEND, answered by the target CPU\n"
            "      --ordered              make earlier writes durable before each new one\n"
            "      --fence                with --ordered write-flush/write-read: fence the WRITE\n"
            "      --imm                  deliver immediate data to the target per write\n"
            "      --flush-level=<l>      write-flush: range (default) or mr\n");
    if (flush)
        fprintf(out,
                "      --flush-level=<l>      FLUSH selectivity: range (default) or mr\n"
                "      --write                precede each FLUSH by a WRITE of the same bytes\n");
    if (atomic)
        fprintf(out, "      --flush                follow each ATOMIC WRITE by a FLUSH of it\n");
    if (!commit)
        fprintf(out, "      --placement=<p>        FLUSH placement: global or persistent\n"
                     "                             (default: from the target memory)\n");
    fprintf(out, "      --target-mem=<mem>     server: dram (default), file:<path> or pmem:<path>\n"
                 "  -h, --help                 print this help\n");
}

static void usage_error(const struct perf_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
static void usage_error(const struct perf_opts *o, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "%s: ", o->prog);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help' for more information.\n", o->prog);
    exit(1);
}

static uint64_t parse_u64(const struct perf_opts *o, const char *opt, const char *s, uint64_t min,
                          uint64_t max) {
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (end != s && (*end == 'K' || *end == 'M' || *end == 'G') && !end[1]) {
        int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : 30;

        if (v > (UINT64_MAX >> shift)) errno = ERANGE;
        v <<= shift;
        end++;
    }
    if (errno || end == s || *end || *s == '-' || v < min || v > max)
        usage_error(o, "invalid %s '%s': expected a number from %llu to %llu", opt, s,
                    (unsigned long long)min, (unsigned long long)max);
    return v;
}

static bool parse_method(const char *s, enum perf_method *m) {
    static const struct {
        const char *name;
        enum perf_method m;
    } names[] = {{"write", M_WRITE},
                 {"native", M_NATIVE},
                 {"write-flush", M_WRITE_FLUSH},
                 {"write-read", M_WRITE_READ},
                 {"write-send", M_WRITE_SEND}};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i].name)) {
            *m = names[i].m;
            return true;
        }
    return false;
}

static void parse_target(struct perf_opts *o, const char *s) {
    if (!strcmp(s, "dram")) {
        o->target = TARGET_DRAM;
        o->target_path = NULL;
    } else if (!strncmp(s, "file:", 5) && s[5]) {
        o->target = TARGET_FILE;
        o->target_path = s + 5;
    } else if (!strncmp(s, "pmem:", 5) && s[5]) {
        o->target = TARGET_PMEM;
        o->target_path = s + 5;
    } else {
        usage_error(o, "invalid --target-mem '%s': expected dram, file:<path> or pmem:<path>", s);
    }
    o->target_given = true;
}

void perf_parse_args(struct perf_opts *o, enum perf_tool tool, bool bw, int argc, char **argv) {
    static const struct option long_opts[] = {
        {"ib-dev", required_argument, NULL, 'd'},
        {"ib-port", required_argument, NULL, 'i'},
        {"gid-index", required_argument, NULL, 'x'},
        {"size", required_argument, NULL, 's'},
        {"all", no_argument, NULL, 'a'},
        {"iters", required_argument, NULL, 'n'},
        {"duration", required_argument, NULL, 'D'},
        {"tx-depth", required_argument, NULL, 't'},
        {"post_list", required_argument, NULL, 'l'},
        {"inline_size", required_argument, NULL, 'I'},
        {"port", required_argument, NULL, 'p'},
        {"mtu", required_argument, NULL, 'm'},
        {"CPU-freq", no_argument, NULL, 'F'},
        {"use_event", no_argument, NULL, 'e'},
        {"rdma_cm", no_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},
        {"report_gbits", no_argument, NULL, O_REPORT_GBITS},
        {"out_json", no_argument, NULL, O_OUT_JSON},
        {"out_json_file", required_argument, NULL, O_OUT_JSON_FILE},
        {"method", required_argument, NULL, O_METHOD},
        {"imm", no_argument, NULL, O_IMM},
        {"ordered", no_argument, NULL, O_ORDERED},
        {"fence", no_argument, NULL, O_FENCE},
        {"flush-level", required_argument, NULL, O_FLUSH_LEVEL},
        {"placement", required_argument, NULL, O_PLACEMENT},
        {"write", no_argument, NULL, O_WRITE},
        {"flush", no_argument, NULL, O_FLUSH},
        {"target-mem", required_argument, NULL, O_TARGET_MEM},
        {0, 0, 0, 0},
    };
    const unsigned tool_bit = tool == TOOL_WRITE_COMMIT ? F_COMMIT
                              : tool == TOOL_FLUSH      ? F_FLUSH
                                                        : F_ATOMIC;
    bool size_given = false, iters_given = false, level_given = false;
    int c;

    memset(o, 0, sizeof(*o));
    o->tool = tool;
    o->bw = bw;
    o->prog = tool == TOOL_WRITE_COMMIT ? (bw ? "ib_write_commit_bw" : "ib_write_commit_lat")
              : tool == TOOL_FLUSH      ? (bw ? "ib_flush_bw" : "ib_flush_lat")
                                        : "ib_atomic_write_lat";
    perf_prog = o->prog;
    o->ib_port = 1;
    o->gid_index = -1;
    o->port = PERF_DEFAULT_PORT;
    o->json_file = "perftest_out.json";
    o->target = TARGET_DRAM;
    o->method = tool == TOOL_WRITE_COMMIT ? M_NATIVE
                : tool == TOOL_FLUSH      ? M_FLUSH
                                          : M_ATOMIC_WRITE;
    o->size = tool == TOOL_ATOMIC_WRITE ? 8 : bw ? 65536 : 2;
    o->iters = bw ? 5000 : 1000;
    o->tx_depth = bw ? 128 : 1;
    o->post_list = 1;
    o->flush_level = IBV_FLUSH_RANGE;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":d:i:x:s:an:D:t:l:I:p:m:FeRh", long_opts, NULL)) != -1) {
        for (size_t i = 0; i < sizeof(opt_table) / sizeof(opt_table[0]); i++) {
            if (opt_table[i].id != c) continue;
            if (!(opt_table[i].tools & tool_bit))
                usage_error(o, "option --%s is not available in %s", opt_table[i].name, o->prog);
            if ((opt_table[i].tools & F_BW_ONLY) && !bw)
                usage_error(o, "option --%s applies to the bandwidth tests only",
                            opt_table[i].name);
        }
        switch (c) {
        case 'd':
            o->dev = optarg;
            break;
        case 'i':
            o->ib_port = (int)parse_u64(o, "--ib-port", optarg, 1, 255);
            break;
        case 'x':
            o->gid_index = (int)parse_u64(o, "--gid-index", optarg, 0, 255);
            break;
        case 's':
            o->size = parse_u64(o, "--size", optarg, 1, PERF_MAX_SIZE);
            size_given = true;
            break;
        case 'a':
            o->all = true;
            break;
        case 'n':
            o->iters = parse_u64(o, "--iters", optarg, 1, 100000000);
            iters_given = true;
            break;
        case 'D':
            o->duration = (unsigned)parse_u64(o, "--duration", optarg, 1, 86400);
            break;
        case 't':
            o->tx_depth = (unsigned)parse_u64(o, "--tx-depth", optarg, 1, 8192);
            break;
        case 'l':
            o->post_list = (unsigned)parse_u64(o, "--post_list", optarg, 1, 1024);
            break;
        case 'I':
            o->inline_size = (unsigned)parse_u64(o, "--inline_size", optarg, 0, 65536);
            break;
        case 'p':
            o->port = (int)parse_u64(o, "--port", optarg, 1, 65535);
            break;
        case 'm':
            o->mtu = (int)parse_u64(o, "--mtu", optarg, 256, 4096);
            if (o->mtu & (o->mtu - 1))
                usage_error(o, "invalid --mtu '%s': expected 256, 512, 1024, 2048 or 4096", optarg);
            break;
        case 'F':
            break;
        case 'e':
            o->use_event = true;
            break;
        case 'R':
            o->rdma_cm = true;
            break;
        case 'h':
            usage(stdout, o);
            exit(0);
        case O_REPORT_GBITS:
            o->report_gbits = true;
            break;
        case O_OUT_JSON:
            o->out_json = true;
            break;
        case O_OUT_JSON_FILE:
            if (!*optarg) usage_error(o, "--out_json_file needs a file name");
            o->json_file = optarg;
            break;
        case O_METHOD:
            if (!parse_method(optarg, &o->method))
                usage_error(o,
                            "unknown method '%s': expected write, native, write-flush, "
                            "write-read or write-send",
                            optarg);
            break;
        case O_IMM:
            o->imm = true;
            break;
        case O_ORDERED:
            o->ordered = true;
            break;
        case O_FENCE:
            o->fence = true;
            break;
        case O_FLUSH_LEVEL:
            if (!strcmp(optarg, "range"))
                o->flush_level = IBV_FLUSH_RANGE;
            else if (!strcmp(optarg, "mr"))
                o->flush_level = IBV_FLUSH_MR;
            else
                usage_error(o, "invalid --flush-level '%s': expected range or mr", optarg);
            level_given = true;
            break;
        case O_PLACEMENT:
            if (!strcmp(optarg, "global"))
                o->placement = IBV_FLUSH_GLOBAL;
            else if (!strcmp(optarg, "persistent"))
                o->placement = IBV_FLUSH_PERSISTENT;
            else
                usage_error(o, "invalid --placement '%s': expected global or persistent", optarg);
            break;
        case O_WRITE:
            o->write = true;
            break;
        case O_FLUSH:
            o->flush = true;
            break;
        case O_TARGET_MEM:
            parse_target(o, optarg);
            break;
        case ':':
            usage_error(o, "option '%s' needs an argument", argv[optind - 1]);
        case '?':
        default:
            if (optopt)
                usage_error(o, "unknown option '-%c'", optopt);
            else
                usage_error(o, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) o->host = argv[optind++];
    if (optind < argc) usage_error(o, "unexpected argument '%s'", argv[optind]);

    if (o->host && o->target_given)
        usage_error(o, "--target-mem is a server option: the server chooses the target memory");
    if (o->duration && iters_given) usage_error(o, "-n and -D cannot be used together");
    if (o->all && size_given) usage_error(o, "-a and -s cannot be used together");
    if (tool == TOOL_ATOMIC_WRITE && o->size != 8)
        usage_error(o, "ATOMIC WRITE moves exactly 8 bytes: -s must be 8");
    if (o->placement && tool == TOOL_ATOMIC_WRITE && !o->flush)
        usage_error(o, "--placement applies to the FLUSH of --flush");

    if (tool == TOOL_WRITE_COMMIT) {
        if (o->ordered && o->method == M_WRITE)
            usage_error(o, "--ordered has no meaning for --method write, which makes nothing "
                           "durable");
        if (o->ordered && o->method == M_WRITE_SEND)
            usage_error(o, "--ordered cannot be used with --method write-send: the target CPU "
                           "persists a range only after the adapter has placed the write, so it "
                           "cannot make earlier writes durable before a new one lands");
        if (o->fence && !(o->ordered && (o->method == M_WRITE_FLUSH || o->method == M_WRITE_READ)))
            usage_error(o, "--fence applies to --ordered with --method write-flush or "
                           "write-read");
        if (level_given && o->method != M_WRITE_FLUSH)
            usage_error(o, "--flush-level applies to --method write-flush");
    }
}

/* -------------------------------------------------------------- naming */

const char *perf_method_name(const struct perf_opts *o) {
    switch (o->method) {
    case M_WRITE:
        return "write";
    case M_NATIVE:
        return "native";
    case M_WRITE_FLUSH:
        return "write-flush";
    case M_WRITE_READ:
        return "write-read";
    case M_WRITE_SEND:
        return "write-send";
    case M_FLUSH:
        return o->write ? "write-flush" : "flush";
    case M_ATOMIC_WRITE:
        return o->flush ? "atomic-write-flush" : "atomic-write";
    }
    return "?";
}

const char *perf_target_name(enum perf_target t) {
    return t == TARGET_DRAM ? "dram" : t == TARGET_FILE ? "file" : "pmem";
}

const char *perf_mode_string(void) {
    const char *v = getenv("SROCE_BUSY_POLL");

    if (!v) v = getenv("SROCE_POLL_MODE");
    return v ? v : "default";
}

/* ----------------------------------------------------- sizes and slots */

unsigned perf_sizes(const struct perf_opts *o, uint64_t *sizes) {
    unsigned n = 0;

    if (!o->all) {
        sizes[0] = o->size;
        return 1;
    }
    for (unsigned lg = 1; lg <= PERF_MAX_SIZE_LOG2; lg++)
        sizes[n++] = 1ull << lg;
    return n;
}

uint64_t perf_stride(uint64_t size) {
    return (size + PERF_SLOT_ALIGN - 1) / PERF_SLOT_ALIGN * PERF_SLOT_ALIGN;
}

/* Latency tests alternate between two slots; bandwidth tests spread the
 * operations in flight over up to twice as many, so that successive
 * operations do not all land in one page, within PERF_RING_CAP bytes. */
uint64_t perf_nslots(const struct perf_opts *o, uint64_t size) {
    uint64_t want = o->bw ? 2ull * o->tx_depth : 2, fit = PERF_RING_CAP / perf_stride(size);

    if (fit < 2) fit = 2;
    return want < fit ? want : fit;
}

uint64_t perf_region_len(const struct perf_opts *o) {
    uint64_t sizes[PERF_MAX_SIZE_LOG2 + 1], len = 0;
    unsigned n = perf_sizes(o, sizes);

    for (unsigned i = 0; i < n; i++) {
        uint64_t l = perf_nslots(o, sizes[i]) * perf_stride(sizes[i]);
        if (l > len) len = l;
    }
    return (len + 4095) & ~(uint64_t)4095;
}

unsigned perf_window(const struct perf_opts *o, uint64_t size) {
    uint64_t n = perf_nslots(o, size);

    /* A slot's source bytes are restamped for every operation, so no two
     * operations in flight share one. */
    return o->tx_depth < n ? o->tx_depth : (unsigned)n;
}

unsigned perf_wrs_per_op(const struct perf_opts *o) {
    switch (o->method) {
    case M_WRITE:
    case M_NATIVE:
        return 1;
    case M_WRITE_FLUSH:
    case M_WRITE_READ:
        return 2 + o->ordered + o->imm;
    case M_WRITE_SEND:
        return 2;
    case M_FLUSH:
        return 1 + o->write;
    case M_ATOMIC_WRITE:
        return 1 + o->flush;
    }
    return 1;
}

bool perf_server_active(const struct perf_opts *o) {
    return o->imm || o->method == M_WRITE_SEND;
}

int perf_placement(const struct perf_opts *o, enum perf_target kind) {
    if (o->placement) return o->placement;
    return kind == TARGET_DRAM ? IBV_FLUSH_GLOBAL : IBV_FLUSH_PERSISTENT;
}

bool perf_needs_flush(const struct perf_opts *o) {
    return o->method == M_NATIVE || o->method == M_WRITE_FLUSH || o->method == M_FLUSH ||
           (o->method == M_ATOMIC_WRITE && o->flush);
}

/* ------------------------------------------------------------ contents */

static inline uint8_t pattern_byte(uint64_t size, uint64_t slot, uint64_t i) {
    return (uint8_t)((i * 131u) ^ (slot * 29u) ^ (size * 7u) ^ 0xa5u ^ (i >> 8));
}

void perf_fill_slot(uint8_t *dst, uint64_t size, uint64_t slot) {
    for (uint64_t i = 0; i < size; i++)
        dst[i] = pattern_byte(size, slot, i);
}

void perf_stamp_slot(uint8_t *dst, uint64_t size, uint64_t slot, uint64_t op) {
    uint64_t stamp = op + 1;

    for (uint64_t i = 0; i < size && i < 8; i++)
        dst[i] = pattern_byte(size, slot, i) ^ (uint8_t)(stamp >> (8 * i));
}

uint64_t perf_atomic_value(uint64_t slot, uint64_t op) {
    uint8_t b[8];
    uint64_t v;

    perf_stamp_slot(b, 8, slot, op);
    memcpy(&v, b, 8);
    return v;
}

int64_t perf_check_region(const uint8_t *region, const struct perf_opts *o, uint64_t size,
                          uint64_t ops, uint64_t *bad_byte) {
    const uint64_t nslots = perf_nslots(o, size), stride = perf_stride(size);
    uint8_t head[8];

    for (uint64_t slot = 0; slot < nslots && slot < ops; slot++) {
        /* the last operation that went to this slot */
        uint64_t last = slot + (ops - 1 - slot) / nslots * nslots;
        const uint8_t *p = region + slot * stride;

        perf_stamp_slot(head, size, slot, last);
        for (uint64_t i = 0; i < size; i++) {
            uint8_t want = i < 8 ? head[i] : pattern_byte(size, slot, i);
            if (p[i] != want) {
                *bad_byte = i;
                return (int64_t)slot;
            }
        }
    }
    return -1;
}

/* ---------------------------------------------------------- statistics */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted samples. */
static uint64_t percentile(const uint64_t *s, uint64_t n, double q) {
    uint64_t rank = (uint64_t)ceil(q * (double)n);

    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return s[rank - 1];
}

void perf_lat_result(struct perf_result *r, uint64_t bytes, uint64_t *samples, uint64_t n) {
    double sum = 0, sq = 0, avg;

    memset(r, 0, sizeof(*r));
    r->bytes = bytes;
    r->iters = n;
    if (!n) return;
    qsort(samples, n, sizeof(*samples), cmp_u64);
    for (uint64_t i = 0; i < n; i++)
        sum += (double)samples[i];
    avg = sum / (double)n;
    for (uint64_t i = 0; i < n; i++)
        sq += ((double)samples[i] - avg) * ((double)samples[i] - avg);
    r->v[0] = (double)samples[0] / 1000.0;
    r->v[1] = (double)samples[n - 1] / 1000.0;
    r->v[2] = (double)samples[n / 2] / 1000.0; /* typical: the median, as perftest */
    r->v[3] = avg / 1000.0;
    r->v[4] = sqrt(sq / (double)n) / 1000.0;
    r->v[5] = (double)percentile(samples, n, 0.99) / 1000.0;
    r->v[6] = (double)percentile(samples, n, 0.999) / 1000.0;
}

/*
 * perftest's figures: the average is all bytes over the time from the first
 * post to the last completion; the peak is the best rate of any run of
 * consecutive operations i..j, (tcompleted[j] - tposted[i]) / (j - i + 1).
 * The scan is quadratic, so above PERF_PEAK_SCAN_MAX operations (and with
 * -D, where no per-operation times are kept) the peak is the average.
 */
void perf_bw_result(struct perf_result *r, const struct perf_opts *o, uint64_t bytes,
                    const uint64_t *tposted, const uint64_t *tcompleted, uint64_t n,
                    uint64_t t_first, uint64_t t_last, bool scan_peak) {
    const double unit = o->report_gbits ? 125000000.0 : 1048576.0;
    double secs = (double)(t_last - t_first) / 1e9, best_ns;

    memset(r, 0, sizeof(*r));
    r->bytes = bytes;
    r->iters = n;
    if (!n || secs <= 0) return;
    r->v[1] = (double)bytes * (double)n / secs / unit;
    r->v[2] = (double)n / secs / 1e6;
    r->v[0] = r->v[1];
    if (!scan_peak || !tposted || n > PERF_PEAK_SCAN_MAX) return;
    best_ns = (double)(tcompleted[0] - tposted[0]);
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = i; j < n; j++) {
            double t = (double)(tcompleted[j] - tposted[i]) / (double)(j - i + 1);
            if (t < best_ns) best_ns = t;
        }
    if (best_ns > 0) r->v[0] = (double)bytes / (best_ns / 1e9) / unit;
}

/* -------------------------------------------------------------- report */

void perf_print_rule(void) {
    printf("-------------------------------------------------------------------------------"
           "--------\n");
}

static const char *test_title(const struct perf_opts *o) {
    switch (o->tool) {
    case TOOL_WRITE_COMMIT:
        return o->bw ? "Write-Commit BW Test" : "Write-Commit Latency Test";
    case TOOL_FLUSH:
        return o->bw ? "Flush BW Test" : "Flush Latency Test";
    case TOOL_ATOMIC_WRITE:
        break;
    }
    return "Atomic Write Latency Test";
}

static const char *on_off(bool b) {
    return b ? "ON" : "OFF";
}

static void print_gid(const union ibv_gid *g) {
    printf(" GID: ");
    for (int i = 0; i < 16; i++)
        printf("%02d%s", g->raw[i], i < 15 ? ":" : "\n");
}

static void print_address(const char *which, const struct perf_qp_info *q) {
    printf(" %s address: LID %04x QPN %#06x PSN %#08x RKey %#08x VAddr %#016llx\n", which, q->lid,
           q->qpn, q->psn, q->rkey, (unsigned long long)q->vaddr);
    print_gid(&q->gid);
}

static const char *placement_text(int p) {
    return p == IBV_FLUSH_GLOBAL       ? "global visibility"
           : p == IBV_FLUSH_PERSISTENT ? "persistence"
                                       : "-";
}

void perf_print_header(const struct perf_conn *c) {
    const struct perf_opts *o = c->o;
    const struct perf_target_info *t = &c->target;
    const int placement = perf_placement(o, t->kind);

    perf_print_rule();
    printf("                    %s\n", test_title(o));
    printf(" Device          : %-16s\tTransport type : IB\n", ibv_get_device_name(c->ctx->device));
    printf(" Connection type : RC%s\tUsing SRQ      : OFF\n", o->rdma_cm ? " (rdma_cm)\t" : "\t\t");
    printf(" Method          : %-16s\tRole           : %s\n", perf_method_name(o),
           o->host ? "client" : "server");
    if (o->tool == TOOL_WRITE_COMMIT)
        printf(" Ordered         : %-16s\tImmediate data : %s\n", on_off(o->ordered),
               on_off(o->imm));
    if (perf_needs_flush(o) && o->method != M_NATIVE)
        printf(" Flush level     : %-16s\tPlacement      : %s\n",
               o->flush_level == IBV_FLUSH_MR ? "mr" : "range", placement_text(placement));
    /* Only the server knows the path. */
    if (t->kind == TARGET_PMEM)
        printf(" Target memory   : pmem%s%s (pmem_is_pmem=%d)\n", o->host ? "" : " ",
               o->host ? "" : o->target_path, t->is_pmem);
    else
        printf(" Target memory   : %s%s%s\n", perf_target_name(t->kind),
               o->host || !o->target_path ? "" : " ",
               o->host || !o->target_path ? "" : o->target_path);
    if (o->method == M_NATIVE)
        printf(" Durability      : %s\n", t->kind == TARGET_DRAM
                                              ? "global visibility (IBV_WRITE_COMMIT_GLOBAL)"
                                              : "persistence");
    printf(" Commit caps     : local %#x, remote %#x\n", c->me.commit_caps, c->peer.commit_caps);
    if (o->method == M_NATIVE && o->host)
        printf(" Commit opcodes  : native (%s)\n",
               o->rdma_cm ? "agreed in the connection set-up" : "ibv_qp_set_commit_peer");
    printf(" TX depth        : %u\n", o->tx_depth);
    if (o->bw) printf(" Post list       : %u\n", o->post_list);
    printf(" Mtu             : %d[B]\n", 128 << c->path_mtu);
    printf(" Link type       : %s\n", c->is_roce ? "Ethernet" : "IB");
    if (c->is_roce) printf(" GID index       : %d\n", c->gid_index);
    printf(" Max inline data : %u[B]\n", o->inline_size);
    printf(" Completions     : %-16s\tPoll mode      : %s\n", o->use_event ? "events" : "polling",
           perf_mode_string());
    printf(" Data ex. method : %s\n", o->rdma_cm ? "rdma_cm" : "Ethernet");
    perf_print_rule();
    print_address("local", &c->me);
    print_address("remote", &c->peer);
    perf_print_rule();
}

void perf_print_columns(const struct perf_opts *o) {
    if (o->bw)
        printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n",
               o->report_gbits ? "Gb/sec" : "MB/sec", o->report_gbits ? "Gb/sec" : "MB/sec");
    else
        printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
               "t_avg[usec]    t_stdev[usec]   99%% percentile[usec]   99.9%% "
               "percentile[usec] \n");
}

void perf_print_row(const struct perf_opts *o, const struct perf_result *r) {
    if (o->bw)
        printf(" %-10llu %-10llu     %-18.2f %-18.2f   %-.6f\n", (unsigned long long)r->bytes,
               (unsigned long long)r->iters, r->v[0], r->v[1], r->v[2]);
    else
        printf(" %-7llu %-10llu    %-14.2f %-12.2f %-18.2f %-14.2f %-15.2f %-22.2f %.2f\n",
               (unsigned long long)r->bytes, (unsigned long long)r->iters, r->v[0], r->v[1],
               r->v[2], r->v[3], r->v[4], r->v[5], r->v[6]);
    fflush(stdout);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void perf_write_json(const struct perf_opts *o, enum perf_target kind, const struct perf_result *r,
                     unsigned n) {
    FILE *f = fopen(o->json_file, "w");

    if (!f) perf_die("cannot write %s: %s", o->json_file, strerror(errno));
    fprintf(f, "{\"tool\": ");
    json_string(f, o->prog);
    fprintf(f, ", \"method\": ");
    json_string(f, perf_method_name(o));
    fprintf(f, ", \"target_mem\": ");
    json_string(f, perf_target_name(kind));
    fprintf(f, ", \"ordered\": %s, \"imm\": %s, \"mode\": ", o->ordered ? "true" : "false",
            o->imm ? "true" : "false");
    json_string(f, perf_mode_string());
    fprintf(f, ", \"results\": [");
    for (unsigned i = 0; i < n; i++) {
        /* JSON bandwidth is MB/s (2^20 bytes) even with --report_gbits. */
        const double scale = o->report_gbits ? 125000000.0 / 1048576.0 : 1.0;

        fprintf(f, "%s\n  {\"bytes\": %llu, \"iterations\": %llu, ", i ? "," : "",
                (unsigned long long)r[i].bytes, (unsigned long long)r[i].iters);
        if (o->bw)
            fprintf(f, "\"bw_peak_MBps\": %.3f, \"bw_avg_MBps\": %.3f, \"msg_rate_Mpps\": %.6f}",
                    r[i].v[0] * scale, r[i].v[1] * scale, r[i].v[2]);
        else
            fprintf(f,
                    "\"t_min\": %.3f, \"t_max\": %.3f, \"t_typical\": %.3f, \"t_avg\": %.3f, "
                    "\"t_stdev\": %.3f, \"p99\": %.3f, \"p99_9\": %.3f}",
                    r[i].v[0], r[i].v[1], r[i].v[2], r[i].v[3], r[i].v[4], r[i].v[5], r[i].v[6]);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f)) perf_die("cannot write %s: %s", o->json_file, strerror(errno));
}

/* ----------------------------------------------------------------- TCP */

int perf_tcp_listen(int port) {
    struct sockaddr_in6 sa = {
        .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = IN6ADDR_ANY_INIT};
    int one = 1, zero = 0, fd = socket(AF_INET6, SOCK_STREAM, 0);

    /* Without IPv6, fall back to an IPv4 socket. */
    if (fd < 0) {
        struct sockaddr_in sa4 = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_ANY)};

        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) perf_die("socket: %s", strerror(errno));
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&sa4, sizeof(sa4)) || listen(fd, 1))
            perf_die("cannot listen on TCP port %d: %s", port, strerror(errno));
        return fd;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1))
        perf_die("cannot listen on TCP port %d: %s", port, strerror(errno));
    return fd;
}

int perf_tcp_accept(int lfd) {
    int one = 1, fd;

    do
        fd = accept(lfd, NULL, NULL);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) perf_die("accept: %s", strerror(errno));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int perf_tcp_connect(const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *p;
    char service[8];
    int one = 1, fd = -1, rc, err = 0;

    snprintf(service, sizeof(service), "%d", port);
    rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) perf_die("cannot resolve server '%s': %s", host, gai_strerror(rc));
    for (p = ai; p; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (!connect(fd, p->ai_addr, p->ai_addrlen)) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        perf_die("cannot connect to server %s port %d: %s (is the server running?)", host, port,
                 strerror(err));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

void perf_send_msg(int fd, const struct perf_msg *m) {
    struct perf_msg out; /* as sent: big-endian words */
    const uint8_t *p = (const uint8_t *)&out;
    size_t left = sizeof(out);

    out.type = htobe64(m->type);
    for (int i = 0; i < PERF_MSG_WORDS; i++)
        out.w[i] = htobe64(m->w[i]);
    memcpy(out.text, m->text, PERF_MSG_TEXT);
    out.text[PERF_MSG_TEXT - 1] = 0;
    while (left) {
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) perf_die("lost the connection to the %s: %s", perf_peer_name, strerror(errno));
        p += n;
        left -= (size_t)n;
    }
}

bool perf_recv_msg(int fd, struct perf_msg *m) {
    struct perf_msg in;
    uint8_t *p = (uint8_t *)&in;
    size_t left = sizeof(in);

    while (left) {
        ssize_t n = recv(fd, p, left, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) perf_die("lost the connection to the %s: %s", perf_peer_name, strerror(errno));
        if (n == 0) {
            if (left != sizeof(in))
                perf_die("the %s closed the connection mid-message", perf_peer_name);
            return false;
        }
        p += n;
        left -= (size_t)n;
    }
    m->type = be64toh(in.type);
    for (int i = 0; i < PERF_MSG_WORDS; i++)
        m->w[i] = be64toh(in.w[i]);
    memcpy(m->text, in.text, PERF_MSG_TEXT);
    m->text[PERF_MSG_TEXT - 1] = 0;
    return true;
}

void perf_expect_msg(int fd, struct perf_msg *m, enum perf_msg_type type) {
    if (!perf_recv_msg(fd, m)) perf_die("the %s closed the connection", perf_peer_name);
    if (m->type == type) return;
    if (m->type == MSG_ERROR) {
        /* The peer has given up: nothing to tell it back. */
        perf_die_sock = -1;
        perf_die("%s: %s", perf_peer_name, m->text);
    }
    perf_die("protocol error: message %llu where %d was expected", (unsigned long long)m->type,
             (int)type);
}

/* HELLO words 0..19: the test parameters, compared on the server. */
enum {
    P_MAGIC,
    P_TOOL,
    P_BW,
    P_METHOD,
    P_SIZE,
    P_ALL,
    P_ITERS,
    P_DURATION,
    P_TX_DEPTH,
    P_IMM,
    P_ORDERED,
    P_FENCE,
    P_FLUSH_LEVEL,
    P_PLACEMENT,
    P_WRITE,
    P_FLUSH,
    P_RDMA_CM,
    P_COUNT
};
_Static_assert(P_COUNT <= 20, "the QP information follows the parameters at word 20");

static const uint64_t perf_magic = 0x706d6f6670657202ull; /* "pmofper" v2 */

void perf_pack_params(const struct perf_opts *o, uint64_t *w) {
    w[P_MAGIC] = perf_magic;
    w[P_TOOL] = o->tool;
    w[P_BW] = o->bw;
    w[P_METHOD] = o->method;
    w[P_SIZE] = o->all ? 0 : o->size;
    w[P_ALL] = o->all;
    w[P_ITERS] = o->duration ? 0 : o->iters;
    w[P_DURATION] = o->duration;
    w[P_TX_DEPTH] = o->tx_depth;
    w[P_IMM] = o->imm;
    w[P_ORDERED] = o->ordered;
    w[P_FENCE] = o->fence;
    w[P_FLUSH_LEVEL] = (uint64_t)o->flush_level;
    w[P_PLACEMENT] = (uint64_t)o->placement;
    w[P_WRITE] = o->write;
    w[P_FLUSH] = o->flush;
    w[P_RDMA_CM] = o->rdma_cm;
}

const char *perf_compare_params(const struct perf_opts *o, const uint64_t *w, char *buf,
                                size_t len) {
    static const char *const names[P_COUNT] = {
        [P_TOOL] = "the tool",
        [P_BW] = "the test type",
        [P_METHOD] = "--method",
        [P_SIZE] = "--size",
        [P_ALL] = "--all",
        [P_ITERS] = "--iters",
        [P_DURATION] = "--duration",
        [P_TX_DEPTH] = "--tx-depth",
        [P_IMM] = "--imm",
        [P_ORDERED] = "--ordered",
        [P_FENCE] = "--fence",
        [P_FLUSH_LEVEL] = "--flush-level",
        [P_PLACEMENT] = "--placement",
        [P_WRITE] = "--write",
        [P_FLUSH] = "--flush",
        [P_RDMA_CM] = "--rdma_cm",
    };
    uint64_t mine[P_COUNT];

    if (w[P_MAGIC] != perf_magic) {
        snprintf(buf, len, "the client is not a compatible benchmark (bad magic)");
        return buf;
    }
    perf_pack_params(o, mine);
    for (int i = P_TOOL; i < P_COUNT; i++) {
        if (mine[i] == w[i]) continue;
        if (i == P_TOOL || i == P_BW)
            snprintf(buf, len, "the client runs a different test than %s", o->prog);
        else if (i == P_METHOD) {
            struct perf_opts peer = *o;

            peer.method = (enum perf_method)w[P_METHOD];
            snprintf(buf, len,
                     "parameter mismatch: --method is %s at the server and %s at the client "
                     "(give both sides the same test options)",
                     perf_method_name(o), perf_method_name(&peer));
        } else
            snprintf(buf, len,
                     "parameter mismatch: %s is %llu at the server and %llu at the client "
                     "(give both sides the same test options)",
                     names[i], (unsigned long long)mine[i], (unsigned long long)w[i]);
        return buf;
    }
    return NULL;
}

/* QP information: words 20..29 of HELLO, 0..9 of REPLY. */
void perf_pack_qp(const struct perf_qp_info *q, uint64_t *w) {
    uint64_t g[2];

    memcpy(g, q->gid.raw, 16);
    w[0] = q->qpn;
    w[1] = q->psn;
    w[2] = q->lid;
    w[3] = q->mtu;
    w[4] = q->rd_atomic;
    /* The GID's bytes travel as they are: swapped on both sides. */
    w[5] = be64toh(g[0]);
    w[6] = be64toh(g[1]);
    w[7] = q->commit_caps;
    w[8] = q->rkey;
    w[9] = q->vaddr;
}

void perf_unpack_qp(struct perf_qp_info *q, const uint64_t *w) {
    uint64_t g[2] = {htobe64(w[5]), htobe64(w[6])};

    q->qpn = (uint32_t)w[0];
    q->psn = (uint32_t)w[1];
    q->lid = (uint16_t)w[2];
    q->mtu = (uint32_t)w[3];
    q->rd_atomic = (uint32_t)w[4];
    memcpy(q->gid.raw, g, 16);
    q->commit_caps = (uint32_t)w[7];
    q->rkey = (uint32_t)w[8];
    q->vaddr = w[9];
}

uint64_t perf_double_bits(double d) {
    uint64_t u;

    memcpy(&u, &d, 8);
    return u;
}

double perf_bits_double(uint64_t u) {
    double d;

    memcpy(&d, &u, 8);
    return d;
}
