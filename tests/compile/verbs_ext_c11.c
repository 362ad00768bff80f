// SPDX-License-Identifier: MIT
/*
 * <infiniband/verbs_ext.h> as a strict ISO C11 program sees it (built with
 * -std=c11 -pedantic -Wall -Wextra -Werror): every name it supplies is used,
 * and the values rdma-core >= 45 gives them are checked at compile time, so a
 * program written for rdma-core >= 45 means the same thing when built here.
 * At run time, ibv_wr_flush() and ibv_wr_atomic_write() are called on a QP
 * laid out the way a provider built against rdma-core 44 lays it out (the
 * flush entry point right after wr_atomic_write), to show the call lands there.
 */
#include <infiniband/verbs_ext.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

_Static_assert(IBV_ACCESS_FLUSH_GLOBAL == (1 << 8), "IBV_ACCESS_FLUSH_GLOBAL");
_Static_assert(IBV_ACCESS_FLUSH_PERSISTENT == (1 << 9), "IBV_ACCESS_FLUSH_PERSISTENT");
_Static_assert(IBV_QP_EX_WITH_FLUSH == (1 << 11), "IBV_QP_EX_WITH_FLUSH");
_Static_assert(IBV_QP_EX_WITH_ATOMIC_WRITE == (1 << 12), "IBV_QP_EX_WITH_ATOMIC_WRITE");
_Static_assert(IBV_WR_FLUSH == 14, "IBV_WR_FLUSH");
_Static_assert(IBV_WR_ATOMIC_WRITE == 15, "IBV_WR_ATOMIC_WRITE");
_Static_assert(IBV_WC_FLUSH == 8, "IBV_WC_FLUSH");
_Static_assert(IBV_WC_ATOMIC_WRITE == 9, "IBV_WC_ATOMIC_WRITE");
_Static_assert(IBV_FLUSH_GLOBAL == 1, "IBV_FLUSH_GLOBAL");
_Static_assert(IBV_FLUSH_PERSISTENT == 2, "IBV_FLUSH_PERSISTENT");
_Static_assert(IBV_FLUSH_RANGE == 0, "IBV_FLUSH_RANGE");
_Static_assert(IBV_FLUSH_MR == 1, "IBV_FLUSH_MR");
_Static_assert(IB_UVERBS_DEVICE_FLUSH_GLOBAL == (1ULL << 38), "IB_UVERBS_DEVICE_FLUSH_GLOBAL");
_Static_assert(IB_UVERBS_DEVICE_FLUSH_PERSISTENT == (1ULL << 39),
               "IB_UVERBS_DEVICE_FLUSH_PERSISTENT");
_Static_assert(IB_UVERBS_DEVICE_ATOMIC_WRITE == (1ULL << 40), "IB_UVERBS_DEVICE_ATOMIC_WRITE");

/* The new bits must not collide with the ones rdma-core 44 already has. */
_Static_assert(((IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT) &
                (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                 IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB)) == 0,
               "access bits overlap");
_Static_assert((IBV_ACCESS_FLUSH_PERSISTENT | IBV_ACCESS_FLUSH_GLOBAL) < IBV_ACCESS_OPTIONAL_FIRST,
               "FLUSH access is mandatory, not an optional hint");
_Static_assert((IBV_QP_EX_WITH_FLUSH & (IBV_QP_EX_WITH_TSO | IBV_QP_EX_WITH_ATOMIC_WRITE)) == 0,
               "send_ops_flags overlap");

/*
 * Where the flush entry point lives: right after wr_atomic_write, which in
 * rdma-core 44 ends struct ibv_qp_ex and before it follows the struct.
 */
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
#define ATOMIC_WRITE_END (offsetof(struct ibv_qp_ex, wr_atomic_write) + sizeof(void *))
#else
#define ATOMIC_WRITE_END (sizeof(struct ibv_qp_ex) + sizeof(void *))
_Static_assert(offsetof(struct ibv_qp_ex_flush, wr_atomic_write) == sizeof(struct ibv_qp_ex),
               "wr_atomic_write follows the system's struct ibv_qp_ex");
#endif
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
_Static_assert(offsetof(struct ibv_qp_ex, wr_flush) == ATOMIC_WRITE_END, "wr_flush offset");
#else
_Static_assert(ATOMIC_WRITE_END ==
                   sizeof(struct ibv_qp_ex) + sizeof(void *) * !PMOF_VERBS_HAVE_ATOMIC_WRITE,
               "wr_atomic_write is the last member of struct ibv_qp_ex");
_Static_assert(offsetof(struct ibv_qp_ex_flush, qpx) == 0, "ibv_qp_ex_flush starts with the QP");
_Static_assert(offsetof(struct ibv_qp_ex_flush, wr_flush) == ATOMIC_WRITE_END, "wr_flush offset");
#endif

/*
 * Part 2, write-commit: project names, so no values to pin, but they must
 * stay clear of every upstream value.
 */
_Static_assert((IBV_QP_EX_WITH_RDMA_WRITE_COMMIT & ((1ULL << 13) - 1)) == 0,
               "IBV_QP_EX_WITH_RDMA_WRITE_COMMIT overlaps upstream send_ops_flags");
_Static_assert(IBV_WC_RDMA_WRITE_COMMIT != IBV_WC_FLUSH &&
                   IBV_WC_RDMA_WRITE_COMMIT != IBV_WC_ATOMIC_WRITE &&
                   IBV_WC_RDMA_WRITE_COMMIT > IBV_WC_ATOMIC_WRITE &&
                   (IBV_WC_RDMA_WRITE_COMMIT & IBV_WC_RECV) == 0,
               "IBV_WC_RDMA_WRITE_COMMIT is a send completion of its own");
_Static_assert((IBV_WRITE_COMMIT_ORDERED & IBV_WRITE_COMMIT_GLOBAL) == 0, "commit flags");

/*
 * Never called: compiling and linking it shows the write-commit declarations
 * are strict C11 and resolve against the libraries pkg-config names.
 */
int use_write_commit(struct ibv_context *ctx, struct ibv_qp_ex *qp);
int use_write_commit(struct ibv_context *ctx, struct ibv_qp_ex *qp) {
    struct ibv_commit_caps caps;
    const struct ibv_qp_commit_ops *ops;
    int ret;

    memset(&caps, 0, sizeof(caps));
    ret = ibv_query_commit_caps(ctx, &caps);
    if (ret) return ret;
    if (caps.atomicity_unit != 8 ||
        !(caps.persistence_methods &
          (IBV_COMMIT_METHOD_CACHE_FLUSH | IBV_COMMIT_METHOD_MSYNC | IBV_COMMIT_METHOD_FENCE)))
        return -1;
    ret = ibv_qp_set_commit_peer(&qp->qp_base,
                                 caps.flags & (IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED |
                                               IBV_COMMIT_CAP_IMMED | IBV_COMMIT_CAP_FLUSH));
    if (ret) return ret;
    ops = ibv_qp_to_commit_ops(qp);
    if (!ops) return -1;
    ibv_wr_start(qp);
    ret = ibv_wr_rdma_write_commit(qp, 1, 0x1000, IBV_WRITE_COMMIT_ORDERED);
    if (!ret) ret = ibv_wr_rdma_write_commit_imm(qp, 1, 0x2000, IBV_WRITE_COMMIT_GLOBAL, (__be32)0);
    if (ret) {
        ibv_wr_abort(qp);
        return ret;
    }
    return ibv_wr_complete(qp);
}

typedef void (*flush_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);

/* A provider's QP object: the rdma-core 44 struct, then one more pointer. */
typedef void (*atomic_write_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, const void *);
union fake_qp {
    struct ibv_qp_ex qpx;
    unsigned char bytes[ATOMIC_WRITE_END + sizeof(flush_fn)];
    void *align;
};

static struct {
    struct ibv_qp_ex *qp;
    uint32_t rkey;
    uint64_t addr;
    size_t len;
    unsigned type, level;
    uint64_t value;
    int calls;
} seen;

static void fake_flush(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                       uint8_t type, uint8_t level) {
    seen.qp = qp;
    seen.rkey = rkey;
    seen.addr = remote_addr;
    seen.len = len;
    seen.type = type;
    seen.level = level;
    seen.calls++;
}

static void fake_atomic_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                              const void *atomic_wr) {
    seen.qp = qp;
    seen.rkey = rkey;
    seen.addr = remote_addr;
    memcpy(&seen.value, atomic_wr, sizeof(seen.value));
    seen.calls++;
}

/* What a completion loop written for rdma-core >= 45 does with the opcodes.
 * A switch on the enum type cannot name IBV_WC_FLUSH with rdma-core 44
 * (-Wswitch: the value is not an enumerator), so this one switches on int. */
static const char *wc_opcode_name(const struct ibv_wc *wc) {
    switch ((int)wc->opcode) {
    case IBV_WC_RDMA_WRITE:
        return "RDMA_WRITE";
    case IBV_WC_FLUSH:
        return "FLUSH";
    case IBV_WC_ATOMIC_WRITE:
        return "ATOMIC_WRITE";
    default:
        return "other";
    }
}

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

int main(void) {
    union fake_qp q;
    flush_fn f = fake_flush;
    uint64_t word = 0x0123456789abcdefULL;
    struct ibv_wc wc;
    struct ibv_qp_init_attr_ex ia;
    struct ibv_device_attr_ex dev;
    struct ibv_qp_attr qa;
    unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_GLOBAL |
                      IBV_ACCESS_FLUSH_PERSISTENT;

    memset(&q, 0, sizeof(q));
    memcpy(q.bytes + ATOMIC_WRITE_END, &f, sizeof(f));
#if PMOF_VERBS_HAVE_ATOMIC_WRITE
    q.qpx.wr_atomic_write = fake_atomic_write;
#else
    {
        atomic_write_fn a = fake_atomic_write;
        memcpy(q.bytes + ATOMIC_WRITE_END - sizeof(a), &a, sizeof(a));
    }
#endif

    ibv_wr_flush(&q.qpx, 0x1234, 0xfeed0000, 4096, IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT,
                 IBV_FLUSH_RANGE);
    CHECK(seen.calls == 1);
    CHECK(seen.qp == &q.qpx);
    CHECK(seen.rkey == 0x1234);
    CHECK(seen.addr == 0xfeed0000);
    CHECK(seen.len == 4096);
    CHECK(seen.type == 3);
    CHECK(seen.level == IBV_FLUSH_RANGE);
    ibv_wr_flush(&q.qpx, 7, 0, 0, IBV_FLUSH_PERSISTENT, IBV_FLUSH_MR);
    CHECK(seen.calls == 2 && seen.type == 2 && seen.level == IBV_FLUSH_MR && seen.len == 0);

    ibv_wr_atomic_write(&q.qpx, 0x55, 0x1000, &word);
    CHECK(seen.calls == 3 && seen.rkey == 0x55 && seen.addr == 0x1000 && seen.value == word);

    memset(&wc, 0, sizeof(wc));
    wc.opcode = IBV_WC_FLUSH;
    CHECK(strcmp(wc_opcode_name(&wc), "FLUSH") == 0);
    CHECK(wc.opcode == IBV_WC_FLUSH);
    wc.opcode = IBV_WC_ATOMIC_WRITE;
    CHECK(strcmp(wc_opcode_name(&wc), "ATOMIC_WRITE") == 0);

    /* Where the names go in the structures an application fills in. */
    memset(&ia, 0, sizeof(ia));
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.send_ops_flags =
        IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE;
    CHECK(ia.send_ops_flags == (1 | (1 << 11) | (1 << 12)));
    memset(&qa, 0, sizeof(qa));
    qa.qp_access_flags = access;
    CHECK(qa.qp_access_flags == (1 | 2 | (1 << 8) | (1 << 9)));
    memset(&dev, 0, sizeof(dev));
    dev.device_cap_flags_ex = IB_UVERBS_DEVICE_FLUSH_GLOBAL | IB_UVERBS_DEVICE_FLUSH_PERSISTENT |
                              IB_UVERBS_DEVICE_ATOMIC_WRITE;
    CHECK(dev.device_cap_flags_ex == (7ULL << 38));
    {
        enum ibv_wr_opcode op = IBV_WR_FLUSH;
        enum ibv_placement_type pt = IBV_FLUSH_PERSISTENT;
        enum ibv_selectivity_level sl = IBV_FLUSH_MR;
        CHECK(op == 14 && pt == 2 && sl == 1);
    }

    if (failures) return 1;
    printf("verbs_ext.h (C11, %s FLUSH definitions): ok\n",
           PMOF_VERBS_HAVE_UPSTREAM_FLUSH ? "system" : "supplied");
    return 0;
}
