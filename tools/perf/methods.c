// SPDX-License-Identifier: MIT
/*
 * How one durable write is posted, per method.  Operations are posted in
 * ibv_wr_start()/ibv_wr_complete() batches (one each, or --post_list at a
 * time).  Within an operation the last work request alone is signaled: RC
 * completes in order, so that completion covers the whole operation and
 * frees all of its send-queue entries.  Every work request of an
 * operation carries the operation's number as wr_id.
 *
 *   write        WRITE                          (delivered, not durable)
 *   native       WRITE_COMMIT                   (ibv_wr_rdma_write_commit)
 *   write-flush  [FLUSH] WRITE FLUSH [WRITE_IMM]
 *   write-read   [READ] WRITE READ [WRITE_IMM]
 *   write-send   WRITE SEND                     (done when the answer arrives)
 *   flush        [WRITE] FLUSH                  (ib_flush_*)
 *   atomic-write ATOMIC_WRITE [FLUSH]           (ib_atomic_write_lat)
 *
 * Bracketed parts come with --ordered (before) or --imm (after).  The
 * ordered sequences are those the write-commit verb falls back to for a peer
 * without native opcodes: the responder executes requests in PSN order, so
 * the first FLUSH (or READ) is done before the WRITE's data are placed;
 * --fence also holds the WRITE back at the initiator until then.
 */
#include "perf_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

uint32_t perf_commit_flags(const struct perf_conn *c) {
    uint32_t flags = c->o->ordered ? IBV_WRITE_COMMIT_ORDERED : 0;

    /* Volatile memory can only be made globally visible (its MR has
     * FLUSH_GLOBAL alone); a persistent commit to it would be refused. */
    if (c->target.kind == TARGET_DRAM) flags |= IBV_WRITE_COMMIT_GLOBAL;
    return flags;
}

enum ibv_wc_opcode perf_final_opcode(const struct perf_opts *o) {
    if (o->imm && (o->method == M_WRITE_FLUSH || o->method == M_WRITE_READ))
        return IBV_WC_RDMA_WRITE;
    switch (o->method) {
    case M_WRITE:
        return IBV_WC_RDMA_WRITE;
    case M_NATIVE:
        return IBV_WC_RDMA_WRITE_COMMIT;
    case M_WRITE_FLUSH:
    case M_FLUSH:
        return IBV_WC_FLUSH;
    case M_WRITE_READ:
        return IBV_WC_RDMA_READ;
    case M_WRITE_SEND:
        return IBV_WC_SEND;
    case M_ATOMIC_WRITE:
        return o->flush ? IBV_WC_FLUSH : IBV_WC_ATOMIC_WRITE;
    }
    return IBV_WC_RDMA_WRITE;
}

static void set_data(struct perf_conn *c, uint8_t *local, uint64_t size) {
    if (size <= c->o->inline_size)
        ibv_wr_set_inline_data(c->qpx, local, size);
    else
        ibv_wr_set_sge(c->qpx, c->buf_mr->lkey, (uintptr_t)local, (uint32_t)size);
}

/* A FLUSH of [addr, addr + len) or, with --flush-level mr, of the region. */
static void post_flush(struct perf_conn *c, uint64_t addr, uint64_t len, unsigned flags) {
    const int level = c->o->method == M_ATOMIC_WRITE ? IBV_FLUSH_RANGE : c->o->flush_level;

    c->qpx->wr_flags = flags;
    if (level == IBV_FLUSH_MR)
        ibv_wr_flush(c->qpx, c->target.rkey, c->target.addr, 0,
                     (uint8_t)perf_placement(c->o, c->target.kind), IBV_FLUSH_MR);
    else
        ibv_wr_flush(c->qpx, c->target.rkey, addr, len,
                     (uint8_t)perf_placement(c->o, c->target.kind), IBV_FLUSH_RANGE);
}

static void post_read(struct perf_conn *c, uint64_t addr, unsigned flags) {
    c->qpx->wr_flags = flags;
    ibv_wr_rdma_read(c->qpx, c->target.rkey, addr);
    ibv_wr_set_sge(c->qpx, c->aux_mr->lkey, (uintptr_t)(c->aux + c->scratch_off), PERF_READ_LEN);
}

/* The zero-length WRITE WITH IMMEDIATE that tells the target's software a
 * write is durable: executed after the FLUSH or READ before it. */
static void post_write_imm0(struct perf_conn *c, uint64_t addr, __be32 imm) {
    c->qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write_imm(c->qpx, c->target.rkey, addr, imm);
    ibv_wr_set_sge_list(c->qpx, 0, NULL);
}

static unsigned add_op(struct perf_conn *c, const struct perf_op *op) {
    const struct perf_opts *o = c->o;
    struct ibv_qp_ex *q = c->qpx;
    const uint64_t stride = perf_stride(op->size), off = op->slot * stride;
    const uint64_t raddr = c->target.addr + off;
    /* The operation before this one went to the previous slot: that is
     * what an ordered sequence makes durable first. */
    const uint64_t prev = c->target.addr + (op->slot + op->nslots - 1) % op->nslots * stride;
    uint8_t *local = c->buf + off;
    const __be32 imm = htonl((uint32_t)op->index);
    unsigned n = 0;

    q->wr_id = op->index;
    switch (o->method) {
    case M_WRITE:
        q->wr_flags = IBV_SEND_SIGNALED;
        if (o->imm)
            ibv_wr_rdma_write_imm(q, c->target.rkey, raddr, imm);
        else
            ibv_wr_rdma_write(q, c->target.rkey, raddr);
        set_data(c, local, op->size);
        n = 1;
        break;
    case M_NATIVE:
        q->wr_flags = IBV_SEND_SIGNALED;
        if (o->imm)
            c->commit_ops->wr_rdma_write_commit_imm(q, c->target.rkey, raddr, perf_commit_flags(c),
                                                    imm);
        else
            c->commit_ops->wr_rdma_write_commit(q, c->target.rkey, raddr, perf_commit_flags(c));
        set_data(c, local, op->size);
        n = 1;
        break;
    case M_WRITE_FLUSH:
    case M_WRITE_READ: {
        const bool flush = o->method == M_WRITE_FLUSH;
        const unsigned last = o->imm ? 0 : IBV_SEND_SIGNALED;

        if (o->ordered) {
            if (flush)
                post_flush(c, prev, op->size, 0);
            else
                post_read(c, prev, 0);
            n++;
        }
        q->wr_flags = o->ordered && o->fence ? IBV_SEND_FENCE : 0;
        ibv_wr_rdma_write(q, c->target.rkey, raddr);
        set_data(c, local, op->size);
        n++;
        if (flush)
            post_flush(c, raddr, op->size, last);
        else
            post_read(c, raddr, last);
        n++;
        if (o->imm) {
            post_write_imm0(c, raddr, imm);
            n++;
        }
        break;
    }
    case M_WRITE_SEND: {
        const unsigned r = (unsigned)(op->index % c->n_req);
        uint8_t *req = c->aux + c->req_off + (size_t)r * PERF_MSG_SLOT;
        uint64_t msg[3] = {off, op->size, op->index};

        q->wr_flags = 0;
        ibv_wr_rdma_write(q, c->target.rkey, raddr);
        set_data(c, local, op->size);
        memcpy(req, msg, sizeof(msg));
        /* Signaled only to free the send queue; the operation is done when
         * the target's answer arrives. */
        q->wr_flags = IBV_SEND_SIGNALED;
        if (o->imm)
            ibv_wr_send_imm(q, imm);
        else
            ibv_wr_send(q);
        ibv_wr_set_sge(q, c->aux_mr->lkey, (uintptr_t)req, sizeof(msg));
        n = 2;
        break;
    }
    case M_FLUSH:
        if (o->write) {
            q->wr_flags = 0;
            ibv_wr_rdma_write(q, c->target.rkey, raddr);
            set_data(c, local, op->size);
            n++;
        }
        post_flush(c, raddr, op->size, IBV_SEND_SIGNALED);
        n++;
        break;
    case M_ATOMIC_WRITE: {
        uint64_t value = perf_atomic_value(op->slot, op->index);

        q->wr_flags = o->flush ? 0 : IBV_SEND_SIGNALED;
        ibv_wr_atomic_write(q, c->target.rkey, raddr, &value);
        n = 1;
        if (o->flush) {
            post_flush(c, raddr, 8, IBV_SEND_SIGNALED);
            n++;
        }
        break;
    }
    }
    return n;
}

unsigned perf_post_ops(struct perf_conn *c, const struct perf_op *ops, unsigned n) {
    unsigned wrs = 0;
    int err;

    ibv_wr_start(c->qpx);
    for (unsigned i = 0; i < n; i++)
        wrs += add_op(c, &ops[i]);
    err = ibv_wr_complete(c->qpx);
    if (err)
        perf_die("posting operations %llu..%llu (%s): %s", (unsigned long long)ops[0].index,
                 (unsigned long long)ops[n - 1].index, perf_method_name(c->o), strerror(err));
    return wrs;
}
