/* SPDX-License-Identifier: MIT */
/*
 * Shared internals of the remote-persistence benchmarks (ib_write_commit_lat,
 * ib_write_commit_bw, ib_flush_lat, ib_flush_bw, ib_atomic_write_lat).
 *
 * perf_common.c  options, TCP exchange, statistics, report and JSON output
 * perf_verbs.c   devices, QPs, target memory, the verbs-extension symbols
 * methods.c      how one durable write is posted and recognised per method
 * perf_run.c     the client's measurement loops and the server's service loop
 */
#ifndef PERF_COMMON_H
#define PERF_COMMON_H

#include <infiniband/verbs_ext.h>
#include <rdma/rdma_cma.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum perf_tool {
    TOOL_WRITE_COMMIT,
    TOOL_FLUSH,
    TOOL_ATOMIC_WRITE,
};

/* How one durable write is carried out. */
enum perf_method {
    M_WRITE,        /* plain RDMA WRITE: delivered, not durable (the reference) */
    M_NATIVE,       /* ibv_wr_rdma_write_commit */
    M_WRITE_FLUSH,  /* WRITE + IBTA FLUSH */
    M_WRITE_READ,   /* WRITE + 8-byte READ (placement by read-after-write) */
    M_WRITE_SEND,   /* WRITE + SEND; the target CPU persists and answers */
    M_FLUSH,        /* ib_flush_*: FLUSH alone, or WRITE + FLUSH with --write */
    M_ATOMIC_WRITE, /* ib_atomic_write_lat: ATOMIC WRITE [+ FLUSH] */
};

enum perf_target {
    TARGET_DRAM,
    TARGET_FILE,
    TARGET_PMEM,
};

enum {
    PERF_DEFAULT_PORT = 18515,
    PERF_MAX_SIZE_LOG2 = 23,      /* -a: 2 .. 2^23 bytes, as perftest */
    PERF_MAX_SIZE = 1u << 30,     /* -s limit (a FLUSH length is 32 bits) */
    PERF_SLOT_ALIGN = 64,         /* slots start on cache lines (ATOMIC WRITE needs 8) */
    PERF_RING_CAP = 64u << 20,    /* target region size above which slots are fewer */
    PERF_MSG_SLOT = 32,           /* bytes of one write-send request or answer */
    PERF_READ_LEN = 8,            /* bytes read back by write-read */
    PERF_PEAK_SCAN_MAX = 20000,   /* above this many operations BW peak is not scanned */
    PERF_DRAIN_TIMEOUT_MS = 20000 /* how long the server waits for the last receives */
};

struct perf_opts {
    enum perf_tool tool;
    bool bw;
    const char *prog; /* the tool's name, for messages */

    /* local, not exchanged */
    const char *dev;
    int ib_port;
    int gid_index; /* -1: the first IPv4-mapped GID, else 0 */
    int port;
    int mtu; /* bytes; 0: the port's active MTU */
    unsigned inline_size;
    bool report_gbits;
    bool out_json;
    const char *json_file;
    bool use_event;
    bool rdma_cm;       /* -R: the QP is connected through rdma_cm */
    unsigned post_list; /* operations per ibv_wr_complete() (bandwidth) */
    const char *host;   /* NULL at the server */
    enum perf_target target;
    const char *target_path;
    bool target_given;

    /* exchanged and compared with the peer's */
    enum perf_method method;
    uint64_t size;
    bool all;
    uint64_t iters;
    unsigned duration; /* seconds; 0: -n iterations */
    unsigned tx_depth;
    bool imm, ordered, fence;
    int flush_level; /* IBV_FLUSH_RANGE or IBV_FLUSH_MR */
    int placement;   /* 0: from the target kind; else IBV_FLUSH_GLOBAL/PERSISTENT */
    bool write;      /* ib_flush_*: WRITE before each FLUSH */
    bool flush;      /* ib_atomic_write_lat: FLUSH after each ATOMIC WRITE */
};

/* What one side tells the other about its QP. */
struct perf_qp_info {
    uint32_t qpn, psn;
    uint16_t lid;
    uint32_t mtu;       /* enum ibv_mtu */
    uint32_t rd_atomic; /* READ/atomic/FLUSH requests it can answer at once */
    union ibv_gid gid;
    uint32_t commit_caps; /* ibv_query_commit_caps() flags, 0 without */
    uint32_t rkey;        /* the side's buffer, shown in the header */
    uint64_t vaddr;
};

/* What the server tells the client about the target memory. */
struct perf_target_info {
    uint32_t rkey;
    uint64_t addr, len;
    enum perf_target kind;
    bool is_pmem;
    uint32_t mr_flush_access; /* IBV_ACCESS_FLUSH_* the target MR was given */
};

/* One row of the report. */
struct perf_result {
    uint64_t bytes, iters;
    /* latency: t_min, t_max, t_typical, t_avg, t_stdev, p99, p99_9 (usec);
     * bandwidth: bw_peak, bw_avg (MB/s, 2^20 bytes), msg_rate (Mpps) */
    double v[7];
};

/* Everything one side holds for the connection. */
struct perf_conn {
    const struct perf_opts *o;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq;
    struct ibv_cq *send_cq; /* the QP's send CQ: cq unless set apart */
    struct ibv_qp *qp;
    struct ibv_qp_ex *qpx;
    const struct ibv_qp_commit_ops *commit_ops;
    int cq_armed;

    /* -R: the connection manager's side of the QP */
    struct rdma_event_channel *cm_channel;
    struct rdma_cm_id *cm_listen, *cm_id;
    bool cm_native; /* native commits agreed in the connection set-up */

    enum ibv_mtu active_mtu, path_mtu;
    uint32_t max_rd_atomic;
    uint64_t max_msg;
    bool is_roce;
    int gid_index;
    struct perf_qp_info me, peer;
    struct perf_target_info target;

    /* client: the source slots; server: the target region */
    uint8_t *buf;
    size_t buf_len;
    struct ibv_mr *buf_mr;
    int target_fd;
    size_t map_len; /* pmem: what pmem_map_file mapped */

    /* client: read-back area, READ scratch, requests, answers;
     * server: requests, answers */
    uint8_t *aux;
    size_t aux_len;
    struct ibv_mr *aux_mr;
    size_t verify_off, scratch_off, req_off, ans_off;
    unsigned n_recv; /* receives kept posted */
    unsigned n_req;  /* request / answer slots */

    int sock;
    uint32_t sq_len;
};

/* ------------------------------------------------------- perf_common.c */

void perf_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
extern const char *perf_prog;
/* Once connected, perf_die() also tells the peer why, over this socket. */
extern int perf_die_sock;
/* "server" at the client and "client" at the server, for messages. */
extern const char *perf_peer_name;

void perf_parse_args(struct perf_opts *o, enum perf_tool tool, bool bw, int argc, char **argv);

const char *perf_method_name(const struct perf_opts *o);
const char *perf_target_name(enum perf_target t);
const char *perf_mode_string(void);
uint64_t perf_now_ns(void);

/* Sizes the test runs: -s, or 2..2^23 with -a. */
unsigned perf_sizes(const struct perf_opts *o, uint64_t *sizes);
/* Slot layout for one message size, identical on both sides. */
uint64_t perf_stride(uint64_t size);
uint64_t perf_nslots(const struct perf_opts *o, uint64_t size);
uint64_t perf_region_len(const struct perf_opts *o);
/* Operations in flight at once for one size. */
unsigned perf_window(const struct perf_opts *o, uint64_t size);
/* Work requests one operation posts. */
unsigned perf_wrs_per_op(const struct perf_opts *o);
/* Whether the target CPU takes part (receives to consume). */
bool perf_server_active(const struct perf_opts *o);
/* Placement type of the FLUSHes for a target. */
int perf_placement(const struct perf_opts *o, enum perf_target kind);
/* Whether the method asks the target for FLUSH (explicitly or natively). */
bool perf_needs_flush(const struct perf_opts *o);

/* The bytes operation op leaves in a slot, and its 8-byte ATOMIC WRITE
 * value: a pattern particular to size and slot, stamped with op. */
void perf_fill_slot(uint8_t *dst, uint64_t size, uint64_t slot);
void perf_stamp_slot(uint8_t *dst, uint64_t size, uint64_t slot, uint64_t op);
uint64_t perf_atomic_value(uint64_t slot, uint64_t op);
/* Checks slots of a region after ops operations; returns the first bad
 * slot or -1, and writes the first differing byte to *bad_byte. */
int64_t perf_check_region(const uint8_t *region, const struct perf_opts *o, uint64_t size,
                          uint64_t ops, uint64_t *bad_byte);

/* Statistics. samples in ns; tposted/tcompleted in ns. */
void perf_lat_result(struct perf_result *r, uint64_t bytes, uint64_t *samples, uint64_t n);
void perf_bw_result(struct perf_result *r, const struct perf_opts *o, uint64_t bytes,
                    const uint64_t *tposted, const uint64_t *tcompleted, uint64_t n,
                    uint64_t t_first, uint64_t t_last, bool scan_peak);

void perf_print_header(const struct perf_conn *c);
void perf_print_columns(const struct perf_opts *o);
void perf_print_row(const struct perf_opts *o, const struct perf_result *r);
void perf_print_rule(void);
void perf_write_json(const struct perf_opts *o, enum perf_target kind, const struct perf_result *r,
                     unsigned n);

/* TCP: fixed-size messages of 64-bit big-endian words plus a text. */
enum perf_msg_type {
    MSG_HELLO = 1,
    MSG_REPLY,
    MSG_BEGIN,
    MSG_READY,
    MSG_END,
    MSG_DONE,
    MSG_BYE,
    MSG_ERROR, /* text: why the sender gave up */
};
enum { PERF_MSG_WORDS = 48, PERF_MSG_TEXT = 256 };
struct perf_msg {
    uint64_t type;
    uint64_t w[PERF_MSG_WORDS];
    char text[PERF_MSG_TEXT];
};
int perf_tcp_listen(int port);
int perf_tcp_accept(int lfd);
int perf_tcp_connect(const char *host, int port);
void perf_send_msg(int fd, const struct perf_msg *m);
/* false: the peer closed the connection */
bool perf_recv_msg(int fd, struct perf_msg *m);
/* Receives a message of the given type; dies on anything else. */
void perf_expect_msg(int fd, struct perf_msg *m, enum perf_msg_type type);

/* Parameters in a HELLO, and the check against the local ones. */
void perf_pack_params(const struct perf_opts *o, uint64_t *w);
/* NULL when they agree, else a description of the first difference. */
const char *perf_compare_params(const struct perf_opts *o, const uint64_t *w, char *buf,
                                size_t len);
void perf_pack_qp(const struct perf_qp_info *q, uint64_t *w);
void perf_unpack_qp(struct perf_qp_info *q, const uint64_t *w);
uint64_t perf_double_bits(double d);
double perf_bits_double(uint64_t u);

/* -------------------------------------------------------- perf_verbs.c */

/* The PMoF extension functions, resolved at run time: NULL when the
 * verbs library in this process does not export them. */
int perf_ext_query_commit_caps(struct ibv_context *ctx, struct ibv_commit_caps *caps);
int perf_ext_set_commit_peer(struct ibv_qp *qp, uint32_t caps);
const struct ibv_qp_commit_ops *perf_ext_commit_ops(struct ibv_qp_ex *qpx);
bool perf_ext_present(void);
/* Declares what the peer's device can do (exchanged over the side channel):
 * its native write-commit opcodes only when `native` (the other methods
 * measure the IBTA operations they name), its selective repeat always.
 * 0 or an errno, which only a native declaration reports. */
int perf_declare_peer(struct perf_conn *c, bool native);

void perf_open_device(struct perf_conn *c);
void perf_create_cq(struct perf_conn *c, unsigned cqe);
void perf_create_qp(struct perf_conn *c, uint64_t send_ops, uint32_t send_wr, uint32_t recv_wr,
                    uint32_t inline_size);
void perf_connect_qp(struct perf_conn *c, unsigned access);
/* -R.  The client resolves the server's address (which picks the device)
 * before perf_open_device(), creates its QP, connects and later waits for
 * the answer; the server listens first and takes the device from the
 * client's request. */
void perf_cm_resolve(struct perf_conn *c);
void perf_cm_listen(struct perf_conn *c);
void perf_cm_get_request(struct perf_conn *c);
void perf_cm_connect(struct perf_conn *c);
void perf_cm_accept(struct perf_conn *c, unsigned access);
void perf_cm_wait_established(struct perf_conn *c);
void perf_setup_target(struct perf_conn *c, uint64_t len);
void perf_close(struct perf_conn *c);
/* Polls up to max completions; with -e sleeps on the channel when none.
 * Never returns 0 unless nonblock. */
int perf_poll(struct perf_conn *c, struct ibv_wc *wc, int max, bool nonblock);
const char *perf_wc_opcode_name(enum ibv_wc_opcode op);
void perf_check_wc(const struct ibv_wc *wc, const char *what);
/* A receive for slot of the message ring at aux offset base (no buffer: for
 * immediate data only). */
void perf_post_recv(struct perf_conn *c, size_t base, unsigned slot, bool with_buffer);
/* Reads len bytes of the remote region at off into the local read-back area. */
void perf_read_back(struct perf_conn *c, uint64_t off, uint64_t len);
void perf_persist(struct perf_conn *c, uint64_t off, uint64_t len);

/* ---------------------------------------------------------- methods.c */

#define PERF_MAX_POST_LIST 1024

struct perf_op {
    uint64_t index; /* operation number within the size, from 0 */
    uint64_t slot;
    uint64_t size;
    uint64_t nslots;
};
/* Posts n durable writes in one ibv_wr_start()/ibv_wr_complete() batch;
 * returns the work requests they took. */
unsigned perf_post_ops(struct perf_conn *c, const struct perf_op *ops, unsigned n);
/* The completion opcode that ends an operation at the initiator (for
 * write-send: the one that frees its send-queue entries). */
enum ibv_wc_opcode perf_final_opcode(const struct perf_opts *o);
/* Flags of the native write-commit for this target. */
uint32_t perf_commit_flags(const struct perf_conn *c);

/* --------------------------------------------------------- perf_run.c */

int perf_main(enum perf_tool tool, bool bw, int argc, char **argv);

#endif /* PERF_COMMON_H */
