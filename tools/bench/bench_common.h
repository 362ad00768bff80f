// SPDX-License-Identifier: MIT
//
// Pieces shared by the peer benchmarks (socket_loopback, fi_commit_bench):
// strict option parsing, latency statistics, sampled bandwidth, and the
// perftest-like report and JSON file every benchmark tool of the project
// writes, so that one script can put sroce's numbers and the peers' side by
// side.
#ifndef SROCE_BENCH_COMMON_H
#define SROCE_BENCH_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_LINE                                                                                 \
    "---------------------------------------------------------------------------------------"

// perftest's MB is 2^20 bytes.
#define BENCH_MB 1048576.0

// Width of the windows the bandwidth peak is sampled over.  Long enough that
// a window holds many messages even at 64 KiB, short enough that a run of a
// second has several.
#define BENCH_PEAK_WINDOW_NS 100000000LL

static inline int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Parses an unsigned decimal (or 0x hex) in [min, max]; on failure prints
// "PROG: OPTION VALUE: why" and returns false.
static inline bool bench_parse_u64(const char *prog, const char *opt, const char *s, uint64_t min,
                                   uint64_t max, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+') goto bad;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) goto bad;
    if (v < min || v > max) {
        fprintf(stderr, "%s: %s %s: must be between %" PRIu64 " and %" PRIu64 "\n", prog, opt, s,
                min, max);
        return false;
    }
    *out = v;
    return true;
bad:
    fprintf(stderr, "%s: %s '%s': not a non-negative integer\n", prog, opt, s ? s : "");
    return false;
}

static inline bool bench_parse_seconds(const char *prog, const char *opt, const char *s,
                                       double *out) {
    char *end = NULL;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : NAN;
    if (errno || !end || *end || !(v > 0) || v > 3600) {
        fprintf(stderr, "%s: %s '%s': expected seconds in (0, 3600]\n", prog, opt, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

// The measurement options every peer benchmark takes (-m bw|lat, -s SIZE,
// -n ITERS, -D SECONDS), stored in the program's own fields.
struct bench_run_opts {
    bool *bw;
    size_t *size;
    uint64_t *iters;
    double *seconds;
    uint64_t max_size;
    bool have_size, have_n, have_d;
};

// 1: `c` was one of them and is stored; 0: another option; -1: bad value
// (the error is printed).
static inline int bench_parse_run_opt(const char *prog, int c, const char *arg,
                                      struct bench_run_opts *r) {
    uint64_t v;

    switch (c) {
    case 'm':
        if (strcmp(arg, "bw") && strcmp(arg, "lat")) {
            fprintf(stderr, "%s: -m %s: expected bw or lat\n", prog, arg);
            return -1;
        }
        *r->bw = !strcmp(arg, "bw");
        return 1;
    case 's':
        if (!bench_parse_u64(prog, "-s", arg, 1, r->max_size, &v)) return -1;
        *r->size = (size_t)v;
        r->have_size = true;
        return 1;
    case 'n':
        if (!bench_parse_u64(prog, "-n", arg, 1, UINT64_MAX / 2, r->iters)) return -1;
        r->have_n = true;
        return 1;
    case 'D':
        if (!bench_parse_seconds(prog, "-D", arg, r->seconds)) return -1;
        r->have_d = true;
        return 1;
    }
    return 0;
}

// ----------------------------------------------------------------- latency

// Round-trip samples in microseconds, grown as needed for -D runs.
struct bench_samples {
    double *v;
    size_t n, cap;
};

static inline bool bench_samples_add(struct bench_samples *s, double usec) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = usec;
    return true;
}

struct bench_lat {
    size_t n;
    double min, max, typical, avg, stdev, p99, p99_9;
};

static inline int bench_cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// Nearest-rank percentile of sorted samples.
static inline double bench_rank(const double *v, size_t n, double p) {
    size_t i = (size_t)ceil(p * (double)n);
    return v[i ? i - 1 : 0];
}

// Sorts the samples in place.
static inline struct bench_lat bench_lat_stats(struct bench_samples *s) {
    struct bench_lat r = {0};
    r.n = s->n;
    if (!s->n) return r;
    qsort(s->v, s->n, sizeof(double), bench_cmp_double);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    r.avg = sum / (double)s->n;
    for (size_t i = 0; i < s->n; i++)
        sq += (s->v[i] - r.avg) * (s->v[i] - r.avg);
    r.stdev = sqrt(sq / (double)s->n);
    r.min = s->v[0];
    r.max = s->v[s->n - 1];
    r.typical = s->v[s->n / 2];
    r.p99 = bench_rank(s->v, s->n, 0.99);
    r.p99_9 = bench_rank(s->v, s->n, 0.999);
    return r;
}

static inline void bench_lat_header(void) {
    printf("%s\n", BENCH_LINE);
    printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
           "t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

static inline void bench_lat_row(size_t bytes, const struct bench_lat *r) {
    printf(" %-7zu %-10zu %-7.2f        %-7.2f      %-7.2f             %-7.2f          %-7.2f    "
           "     %-7.2f                 %-7.2f\n",
           bytes, r->n, r->min, r->max, r->typical, r->avg, r->stdev, r->p99, r->p99_9);
    printf("%s\n", BENCH_LINE);
}

// ---------------------------------------------------------------- bandwidth

// Bytes counted per fixed window; the peak is the best complete window.
struct bench_peak {
    int64_t w_start;
    uint64_t w_bytes;
    double peak_Bps;
};

static inline void bench_peak_add(struct bench_peak *p, int64_t now, uint64_t bytes) {
    if (!p->w_start) p->w_start = now;
    p->w_bytes += bytes;
    int64_t dt = now - p->w_start;
    if (dt >= BENCH_PEAK_WINDOW_NS) {
        double r = (double)p->w_bytes * 1e9 / (double)dt;
        if (r > p->peak_Bps) p->peak_Bps = r;
        p->w_start = now;
        p->w_bytes = 0;
    }
}

struct bench_bw {
    uint64_t bytes_per_msg, iterations;
    double peak_MBps, avg_MBps, msg_rate_Mpps;
    bool has_loss;
    double loss_pct;
};

// bytes and messages actually delivered over elapsed_ns; a run shorter than
// one sampling window reports its average as the peak.
static inline struct bench_bw bench_bw_result(uint64_t bytes_per_msg, uint64_t iterations,
                                              uint64_t delivered_bytes, uint64_t delivered_msgs,
                                              int64_t elapsed_ns, const struct bench_peak *p) {
    struct bench_bw r = {0};
    r.bytes_per_msg = bytes_per_msg;
    r.iterations = iterations;
    double secs = elapsed_ns > 0 ? (double)elapsed_ns / 1e9 : 0;
    if (secs > 0) {
        r.avg_MBps = (double)delivered_bytes / secs / BENCH_MB;
        r.msg_rate_Mpps = (double)delivered_msgs / secs / 1e6;
    }
    r.peak_MBps = p ? p->peak_Bps / BENCH_MB : 0;
    if (r.peak_MBps < r.avg_MBps) r.peak_MBps = r.avg_MBps;
    return r;
}

static inline void bench_bw_header(bool with_loss) {
    printf("%s\n", BENCH_LINE);
    printf(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]%s\n",
           with_loss ? "   loss[%]" : "");
}

static inline void bench_bw_row(const struct bench_bw *r) {
    printf(" %-10" PRIu64 " %-10" PRIu64 "       %-10.2f         %-10.2f           %-10.6f",
           r->bytes_per_msg, r->iterations, r->peak_MBps, r->avg_MBps, r->msg_rate_Mpps);
    if (r->has_loss) printf(" %-8.3f", r->loss_pct);
    printf("\n%s\n", BENCH_LINE);
}

// -------------------------------------------------------------------- JSON
// The schema is shared with the project's other benchmark tools: keep the
// key names as they are.

static inline FILE *bench_json_open(const char *prog, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "%s: --out_json_file %s: %s\n", prog, path, strerror(errno));
    return f;
}

static inline bool bench_json_close(const char *prog, const char *path, FILE *f) {
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "%s: writing %s failed\n", prog, path);
    return ok;
}

static inline bool bench_json_lat(const char *prog, const char *path, const char *tool,
                                  const char *method, const char *mode, size_t bytes,
                                  const struct bench_lat *r) {
    FILE *f = bench_json_open(prog, path);
    if (!f) return false;
    fprintf(f,
            "{\"tool\": \"%s\", \"method\": \"%s\", \"mode\": \"%s\", \"results\": [{\"bytes\": "
            "%zu, \"iterations\": %zu, \"t_min\": %.3f, \"t_max\": %.3f, \"t_typical\": %.3f, "
            "\"t_avg\": %.3f, \"t_stdev\": %.3f, \"p99\": %.3f, \"p99_9\": %.3f}]}\n",
            tool, method, mode, bytes, r->n, r->min, r->max, r->typical, r->avg, r->stdev, r->p99,
            r->p99_9);
    return bench_json_close(prog, path, f);
}

static inline bool bench_json_bw(const char *prog, const char *path, const char *tool,
                                 const char *method, const char *mode, const struct bench_bw *r) {
    FILE *f = bench_json_open(prog, path);
    if (!f) return false;
    fprintf(f,
            "{\"tool\": \"%s\", \"method\": \"%s\", \"mode\": \"%s\", \"results\": [{\"bytes\": "
            "%" PRIu64 ", \"iterations\": %" PRIu64
            ", \"bw_peak_MBps\": %.3f, \"bw_avg_MBps\": %.3f, \"msg_rate_Mpps\": %.6f",
            tool, method, mode, r->bytes_per_msg, r->iterations, r->peak_MBps, r->avg_MBps,
            r->msg_rate_Mpps);
    if (r->has_loss) fprintf(f, ", \"loss_pct\": %.3f", r->loss_pct);
    fprintf(f, "}]}\n");
    return bench_json_close(prog, path, f);
}

#endif
