/* SPDX-License-Identifier: MIT */
/*
 * pmof_fabtest: fabtests-style conformance tests of a libfabric provider,
 * both ends of every connection in one process.  Shared declarations.
 */
#ifndef PMOF_FABTEST_H
#define PMOF_FABTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext_pmof.h>
#include <rdma/fi_rma.h>

#define FT_API_VERSION FI_VERSION(1, 17)
/* Every wait loop gives up after this long, so a broken provider fails a test
 * instead of hanging the run. */
#define FT_TIMEOUT_MS 10000
#define FT_MAX_SIZE (1024 * 1024)

enum ft_result { FT_OK = 0, FT_FAIL, FT_SKIP };

struct ft_opts {
    const char *prov;
    enum fi_ep_type ep_type;
    const char *addr;
};

/* One test's state: its outcome text, filled by ft_fail/ft_skip/ft_note. */
struct ft_run {
    const struct ft_opts *opts;
    char reason[512];
    char note[512];
};

typedef int (*ft_test_fn)(struct ft_run *r);

struct ft_test {
    const char *name;
    ft_test_fn fn;
};

extern const struct ft_test ft_info_tests[];
extern const struct ft_test ft_object_tests[];
extern const struct ft_test ft_msg_tests[];
extern const struct ft_test ft_rma_tests[];
extern const struct ft_test ft_atomic_tests[];
extern const struct ft_test ft_pmof_tests[];
extern const struct ft_test ft_tagged_tests[];

int ft_failf(struct ft_run *r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ft_skip(struct ft_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ft_note(struct ft_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ft_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define ft_fail(r, ...) ft_failf((r), __FILE__, __LINE__, __VA_ARGS__)

/*
 * The checking macros need `r` (struct ft_run *), `ret` (int, FT_OK so far)
 * and a label `out` where the test releases what it holds: a failed check
 * records the first reason and jumps there.
 */
#define FT_CHK(expr)                                                                               \
    do {                                                                                           \
        ssize_t rc_ = (ssize_t)(expr);                                                             \
        if (rc_) {                                                                                 \
            ret = ft_fail(r, "%s = %zd (%s)", #expr, rc_, fi_strerror((int)-rc_));                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define FT_EXPECT(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ret = ft_fail(r, __VA_ARGS__);                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* For helpers that already recorded why they failed. */
#define FT_TRY(expr)                                                                               \
    do {                                                                                           \
        int rt_ = (expr);                                                                          \
        if (rt_ != FT_OK) {                                                                        \
            ret = rt_;                                                                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------ time */
uint64_t ft_now_us(void);
void ft_sleep_ms(unsigned ms);

/* ------------------------------------------------------------ infos */
struct fi_info *ft_hints(const struct ft_opts *o, enum fi_ep_type type);
/* fi_getinfo that also fails (recording why) on an info of another
 * provider; returns the fi_getinfo code through *rc. */
int ft_getinfo(struct ft_run *r, const char *node, const char *service, uint64_t flags,
               const struct fi_info *hints, struct fi_info **info, int *rc);
/* Same, and fi_getinfo must succeed. */
int ft_getinfo_ok(struct ft_run *r, const char *node, const char *service, uint64_t flags,
                  const struct fi_info *hints, struct fi_info **info);
const char *ft_ep_name(enum fi_ep_type type);
bool ft_is_pmof_prov(const struct ft_opts *o);
/* pmof is held to the letter of the libfabric man pages; where another
 * provider (the tcp reference) deviates, the deviation is only noted. */
bool ft_strict(const struct ft_run *r);
/* If `bad`: FT_FAIL for a strict run, else a note and FT_OK. */
int ft_deviation(struct ft_run *r, bool bad, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A fabric and domain without endpoints, for the object tests. */
struct ft_dom {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
};
int ft_dom_open(struct ft_run *r, struct ft_dom *d);
/* The close functions return `ret`, or FT_FAIL if a close failed. */
int ft_dom_close(struct ft_run *r, struct ft_dom *d, int ret);
/* FT_OK if the domain is a pmof one, FT_SKIP (recorded) if fi_pmof_query
 * says -FI_ENOSYS on another provider, FT_FAIL otherwise. */
int ft_require_pmof(struct ft_run *r, struct fid_domain *domain, struct fi_pmof_attr *attr);

/* ------------------------------------------------------------ completions */
struct ft_comp {
    bool is_err;
    struct fi_cq_data_entry e; /* op_context, flags, len, buf, data */
    uint64_t tag;
    int err;
    int prov_errno;
    size_t olen;
};

#define FT_CQ_BACKLOG 256

/* A CQ whose entries are read into a backlog by whoever drives progress, so
 * polling one side never loses the other side's completions. */
struct ft_cq {
    struct fid_cq *cq;
    const char *name;
    struct ft_comp q[FT_CQ_BACKLOG];
    size_t n;
};

/* The fixed part of struct fi_eq_cm_entry: that one ends in a flexible
 * array, which ISO C does not allow inside another structure. */
struct ft_cm_head {
    fid_t fid;
    struct fi_info *info;
};
_Static_assert(offsetof(struct fi_eq_cm_entry, info) == offsetof(struct ft_cm_head, info),
               "struct fi_eq_cm_entry layout");

struct ft_eqev {
    bool is_err;
    uint32_t event;
    ssize_t len;
    union {
        struct ft_cm_head cm;
        struct fi_eq_entry plain;
        struct fi_eq_commit_entry commit;
        uint8_t raw[256];
    } u;
    struct fi_eq_err_entry err;
    uint8_t err_data[64];
};

#define FT_EQ_BACKLOG 16

struct ft_eq {
    struct fid_eq *eq;
    const char *name;
    struct ft_eqev q[FT_EQ_BACKLOG];
    size_t n;
};

/* ------------------------------------------------------------ endpoint pair */
enum { FT_SRV = 0, FT_CLI = 1 };

struct ft_pair_cfg {
    uint64_t mode;          /* added to hints->mode (FI_COMMIT_MANUAL) */
    uint64_t caps;          /* added to hints->caps (FI_ATOMIC) */
    uint64_t tx_op_flags;   /* hints->tx_attr->op_flags */
    uint64_t tx_bind_flags; /* e.g. FI_SELECTIVE_COMPLETION */
    bool write_cntr;        /* bind a counter for FI_WRITE on the client */
    bool rdm_eq;            /* bind an EQ to RDM endpoints too */
    /* set on both domains before anything is opened in them */
    struct fi_hmem_override_ops *hmem;
    /* per side (FT_SRV, FT_CLI): an info without `mode` instead, so that
     * the two ends of a connection differ in it */
    bool plain[2];
    /* RDM: caps the client's info goes without (the ends then differ) */
    uint64_t cli_caps_off;
    /* the CQs' wait object (FI_WAIT_NONE by default) */
    enum fi_wait_obj cq_wait;
};

struct ft_side {
    const char *name;
    struct fi_info *info; /* what the endpoint was made from */
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_av *av;
    struct ft_eq eq; /* MSG: CM events; RDM: only with cfg.rdm_eq */
    struct ft_cq tx, rx;
    struct fid_cntr *wcntr;
    fi_addr_t peer;
    uint64_t next_key;
};

struct ft_pair {
    struct ft_run *r;
    struct ft_pair_cfg cfg;
    struct fi_info *hints;
    struct fi_info *info;         /* the server's (MSG) or both sides' (RDM) */
    struct fi_info *rdm_cli_info; /* RDM: the client's, when cfg.plain differs */
    struct fid_fabric *fabric;
    struct fid_pep *pep;
    bool connected;
    struct ft_side s[2];
};

/* Everything up to connected, enabled endpoints on both sides. */
int ft_pair_open(struct ft_run *r, struct ft_pair *p, const struct ft_pair_cfg *cfg);
int ft_pair_close(struct ft_pair *p, int ret);
/* Closes both endpoints, the client's first.  A test calls it before it
 * frees its buffers: one that failed may have left operations posted, which
 * a provider would otherwise complete into freed memory (an eager message
 * copied into a receive buffer, the data of a rendezvous READ) or through a
 * closed memory region. */
int ft_pair_stop(struct ft_pair *p, int ret);
/* MSG building blocks, for the connection tests. */
int ft_pair_prepare(struct ft_run *r, struct ft_pair *p, const struct ft_pair_cfg *cfg);
int ft_msg_listen(struct ft_pair *p);
int ft_msg_client(struct ft_pair *p, const char *service, const void *param, size_t len);
int ft_msg_accept(struct ft_pair *p, struct fi_info *connreq);
int ft_side_open_ep(struct ft_pair *p, struct ft_side *s, struct fi_info *info);

/* Reads every CQ and EQ of the pair once into their backlogs. */
int ft_progress(struct ft_pair *p);
/* Waits (progressing both sides) until `cq` has an entry with `ctx`
 * (NULL: any), takes it out into *out. */
int ft_wait_comp(struct ft_pair *p, struct ft_cq *cq, void *ctx, struct ft_comp *out);
/* Same, and it must be a successful one with at least `flags` and, unless
 * len is SIZE_MAX, that length. */
int ft_expect_comp(struct ft_pair *p, struct ft_cq *cq, void *ctx, uint64_t flags, size_t len,
                   struct ft_comp *out);
int ft_expect_err(struct ft_pair *p, struct ft_cq *cq, void *ctx, struct ft_comp *out);
/* Progresses for `ms` and fails if `cq` got anything. */
int ft_expect_quiet(struct ft_pair *p, struct ft_cq *cq, unsigned ms, const char *what);
int ft_wait_event(struct ft_pair *p, struct ft_eq *eq, uint32_t event, struct ft_eqev *out);
int ft_wait_eq_any(struct ft_pair *p, struct ft_eq *eq, struct ft_eqev *out);
const char *ft_event_name(uint32_t event);
/* Waits until `cond(arg)` holds, progressing. */
int ft_wait_until(struct ft_pair *p, bool (*cond)(void *), void *arg, const char *what);
/* Posts with retry on -FI_EAGAIN (progressing meanwhile). */
#define FT_POST(p, expr)                                                                           \
    do {                                                                                           \
        ssize_t rc_;                                                                               \
        uint64_t t0_ = ft_now_us();                                                                \
        while ((rc_ = (expr)) == -FI_EAGAIN && ft_now_us() - t0_ < FT_TIMEOUT_MS * 1000ULL &&      \
               ft_progress(p) == FT_OK)                                                            \
            ;                                                                                      \
        if (rc_) {                                                                                 \
            ret = ft_fail(r, "%s = %zd (%s)", #expr, rc_, fi_strerror((int)-rc_));                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------ buffers */
struct ft_buf {
    uint8_t *buf;
    size_t len;
    struct fid_mr *mr;
    void *desc;
    uint64_t key;
    uint64_t raddr; /* what a peer passes as addr for buf[0] */
    size_t map_len; /* non-zero: buf is a file mapping (FI_PMEM regions) */
};

/* Memory that can be made durable: a shared mapping of a file on a disk
 * ($FT_PMEM_DIR, default /var/tmp), removed at exit.  NULL on failure. */
void *ft_map_durable(size_t len);

#define FT_ACC_LOCAL (FI_SEND | FI_RECV | FI_READ | FI_WRITE)
#define FT_ACC_REMOTE (FI_REMOTE_READ | FI_REMOTE_WRITE)

/* Allocates and registers `len` bytes in side `s`'s domain. */
int ft_buf_alloc(struct ft_pair *p, struct ft_side *s, size_t len, uint64_t access, uint64_t flags,
                 struct ft_buf *b);
int ft_buf_free(struct ft_run *r, struct ft_buf *b);
uint64_t ft_request_key(struct ft_side *s);

void ft_fill(void *buf, size_t len, unsigned seed);
/* Index of the first byte differing from the pattern, or len. */
size_t ft_check(const void *buf, size_t len, unsigned seed);
int ft_expect_pattern(struct ft_run *r, const void *buf, size_t len, unsigned seed,
                      const char *what);

/* Sizes of the size sweeps, ending at min(1 MiB, max_msg_size). */
size_t ft_sizes(const struct fi_info *info, size_t *sizes, size_t max);

#endif /* PMOF_FABTEST_H */
