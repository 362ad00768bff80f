// SPDX-License-Identifier: MIT
//
// Write-commits on kernel devices that execute them: Linux rxe with
// rxe-patches/ (rxe-patches/README.md).  Such a device says so in sysfs
// (`commit_caps`, the flags of enum ibv_commit_cap_flags) and takes a
// write-commit as an RDMA WRITE (WITH IMMEDIATE) work request with
// driver-private send flags, which every rdma-core rxe provider copies into
// the send queue untouched; its completion opcode is IBV_WC_RDMA_WRITE_COMMIT.
// So nothing of rdma-core changes: this file gives those QPs what sroce's
// provider gives its own, through the provider's ibv_qp_ex.
//
// - Contexts of such devices create QPs with IBV_QP_EX_WITH_RDMA_WRITE_COMMIT:
//   the provider gets the writes instead (create_qp_ex is wrapped).
// - Reliable QPs agree on native commits in ECE exactly as sroce's do
//   (docs/connection-manager.md, "Native commits through ECE"): the kernel
//   providers have no ECE of their own.
// - The commit ops post natively to a peer that agreed (or was declared
//   with ibv_qp_set_commit_peer).  To any other peer a write-commit cannot
//   be posted (the IBTA sequence would need a FLUSH between the user's
//   ibv_wr_set_sge() and the next request): ibv_wr_complete() then returns
//   EOPNOTSUPP and posts nothing of the batch (also when the peer did not
//   agree on ORDERED or immediate data a write-commit asks for; EINVAL for
//   undefined flags, as sroce's).
#include "kernel_commit.hpp"
#include "no_destructor.hpp"
#include "provider.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

namespace sroce::shim::kernel {
namespace {

// rxe-patches/ <rdma/rdma_user_rxe.h>: the send flags' values (the range
// the kernel leaves to drivers, IB_SEND_RESERVED_START on).
constexpr unsigned kSendWriteCommit = 1u << 26;
constexpr unsigned kSendCommitOrdered = 1u << 27;
constexpr unsigned kSendCommitGlobal = 1u << 28;

struct QpState {
    const ibv_context *context = nullptr;
    uint32_t peer_caps = 0; // agreed in ECE or declared
    bool ece_set = false;
    uint32_t ece_options = 0;
    int batch_error = 0; // a write-commit that cannot be posted
    // The provider's, set when the QP was created with
    // IBV_QP_EX_WITH_RDMA_WRITE_COMMIT (then hooked).
    void (*wr_start)(ibv_qp_ex *) = nullptr;
    int (*wr_complete)(ibv_qp_ex *) = nullptr;
};

struct ContextState {
    uint32_t caps = 0;
    ibv_qp *(*create_qp_ex)(ibv_context *, ibv_qp_init_attr_ex *) = nullptr;
};

// Kernel QPs with write-commits are few and their verbs are not on a
// per-packet path: one lock for all.  The maps are never destroyed
// (no_destructor.hpp): the application's other threads may still use its
// QPs and contexts while exit() runs.
std::mutex mu;
std::unordered_map<const ibv_context *, ContextState> &contexts() noexcept {
    static NoDestructor<std::unordered_map<const ibv_context *, ContextState>> m;
    return *m;
}
std::unordered_map<const ibv_qp *, QpState> &qps() noexcept {
    static NoDestructor<std::unordered_map<const ibv_qp *, QpState>> m;
    return *m;
}

uint32_t read_caps(const ibv_device *dev) {
    std::string path = std::string(dev->ibdev_path) + "/commit_caps";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[32];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *end = nullptr;
    unsigned long v = strtoul(buf, &end, 0);
    if (end == buf) return 0;
    // Without the native opcodes, nothing here applies.
    return (v & IBV_COMMIT_CAP_NATIVE) ? static_cast<uint32_t>(v & IBV_COMMIT_ECE_CAPS_MASK) : 0;
}

QpState *find_qp(const ibv_qp *qp) {
    auto it = qps().find(qp);
    return it == qps().end() ? nullptr : &it->second;
}

// The state of `qp`, made on first use; nullptr when out of memory.
QpState *qp_state(ibv_qp *qp) noexcept {
    try {
        QpState &st = qps()[qp];
        st.context = qp->context;
        return &st;
    } catch (const std::bad_alloc &) {
        return nullptr;
    }
}

// A batch starts without the error of one that was aborted.
void commit_wr_start(ibv_qp_ex *qpx) {
    void (*start)(ibv_qp_ex *) = nullptr;
    {
        std::lock_guard<std::mutex> g(mu);
        if (QpState *st = find_qp(&qpx->qp_base)) {
            start = st->wr_start;
            st->batch_error = 0;
        }
    }
    if (start) start(qpx);
}

int commit_wr_complete(ibv_qp_ex *qpx) {
    int (*complete)(ibv_qp_ex *) = nullptr;
    int error = EINVAL; // no state: nothing is known of this QP
    {
        std::lock_guard<std::mutex> g(mu);
        if (QpState *st = find_qp(&qpx->qp_base)) {
            complete = st->wr_complete;
            error = st->batch_error;
            st->batch_error = 0;
        }
    }
    if (!error) return complete(qpx);
    qpx->wr_abort(qpx);
    errno = error;
    return error;
}

// Posts the write the device turns into a write-commit; the caller's
// ibv_wr_set_sge() or ibv_wr_set_inline_data() then fills it.
void post_commit(ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, uint32_t flags, bool imm,
                 __be32 imm_data) {
    bool native;
    {
        std::lock_guard<std::mutex> g(mu);
        QpState *st = find_qp(&qpx->qp_base);
        // What the peer must take: the native opcodes, and ORDERED or
        // immediate data when asked for.
        uint32_t need = IBV_COMMIT_CAP_NATIVE;
        if (flags & IBV_WRITE_COMMIT_ORDERED) need |= IBV_COMMIT_CAP_ORDERED;
        if (imm) need |= IBV_COMMIT_CAP_IMMED;
        int error = 0;
        if (flags & ~(IBV_WRITE_COMMIT_ORDERED | IBV_WRITE_COMMIT_GLOBAL))
            error = EINVAL;
        else if (!st || (st->peer_caps & need) != need)
            error = EOPNOTSUPP;
        if (st && error && !st->batch_error) st->batch_error = error;
        native = !error;
    }
    const unsigned saved = qpx->wr_flags;
    if (native) {
        qpx->wr_flags |= kSendWriteCommit;
        if (flags & IBV_WRITE_COMMIT_ORDERED) qpx->wr_flags |= kSendCommitOrdered;
        if (flags & IBV_WRITE_COMMIT_GLOBAL) qpx->wr_flags |= kSendCommitGlobal;
    }
    // Not native: a placeholder for the caller's data, never posted.
    if (imm)
        ibv_wr_rdma_write_imm(qpx, rkey, remote_addr, imm_data);
    else
        ibv_wr_rdma_write(qpx, rkey, remote_addr);
    qpx->wr_flags = saved;
}

void wr_rdma_write_commit(ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, uint32_t flags) {
    post_commit(qpx, rkey, remote_addr, flags, false, 0);
}

void wr_rdma_write_commit_imm(ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, uint32_t flags,
                              __be32 imm_data) {
    post_commit(qpx, rkey, remote_addr, flags, true, imm_data);
}

const ibv_qp_commit_ops kOps = {wr_rdma_write_commit, wr_rdma_write_commit_imm};

ibv_qp *create_qp_ex(ibv_context *context, ibv_qp_init_attr_ex *attr) {
    ibv_qp *(*create)(ibv_context *, ibv_qp_init_attr_ex *) = nullptr;
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = contexts().find(context);
        if (it != contexts().end()) create = it->second.create_qp_ex;
    }
    if (!create) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    const bool commit = attr && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
                        (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_COMMIT);
    if (!commit) return create(context, attr);
    if (attr->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    ibv_qp_init_attr_ex own = *attr;
    own.send_ops_flags &= ~IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    own.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    ibv_qp *qp = create(context, &own);
    if (!qp) return nullptr;
    attr->cap = own.cap;
    ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
    QpState *st = nullptr;
    if (qpx) {
        std::lock_guard<std::mutex> g(mu);
        st = qp_state(qp);
        if (st) {
            st->wr_start = qpx->wr_start;
            st->wr_complete = qpx->wr_complete;
            qpx->wr_start = commit_wr_start;
            qpx->wr_complete = commit_wr_complete;
        }
    }
    if (!st) {
        ibv_destroy_qp(qp);
        errno = qpx ? ENOMEM : EOPNOTSUPP;
        return nullptr;
    }
    return qp;
}

// What a reliable QP of a write-commit device offers in ECE, or 0.
uint32_t ece_offer(ibv_qp *qp) {
    if (qp->qp_type != IBV_QPT_RC) return 0;
    std::lock_guard<std::mutex> g(mu);
    auto it = contexts().find(qp->context);
    if (it == contexts().end() || !it->second.caps) return 0;
    return IBV_COMMIT_ECE_TAG | it->second.caps;
}

} // namespace

uint32_t commit_caps(ibv_context *context) {
    std::lock_guard<std::mutex> g(mu);
    auto it = contexts().find(context);
    return it == contexts().end() ? 0 : it->second.caps;
}

void context_opened(ibv_context *context) {
    if (!context) return;
    const uint32_t caps = read_caps(context->device);
    if (!caps) return;
    verbs_context *vctx = verbs_get_ctx(context);
    std::lock_guard<std::mutex> g(mu);
    ContextState &st = contexts()[context];
    st.caps = caps;
    if (vctx && vctx->create_qp_ex) {
        st.create_qp_ex = vctx->create_qp_ex;
        vctx->create_qp_ex = create_qp_ex;
    }
}

void context_closing(ibv_context *context) {
    std::lock_guard<std::mutex> g(mu);
    auto it = contexts().find(context);
    if (it == contexts().end()) return;
    if (verbs_context *vctx = verbs_get_ctx(context); vctx && it->second.create_qp_ex)
        vctx->create_qp_ex = it->second.create_qp_ex;
    contexts().erase(it);
    // QPs a program leaves behind go with their context.
    auto &states = qps();
    for (auto q = states.begin(); q != states.end();)
        q = q->second.context == context ? states.erase(q) : std::next(q);
}

void qp_destroyed(ibv_qp *qp) {
    std::lock_guard<std::mutex> g(mu);
    qps().erase(qp);
}

int qp_set_commit_peer(ibv_qp *qp, uint32_t peer_commit_caps) {
    std::lock_guard<std::mutex> g(mu);
    auto it = contexts().find(qp->context);
    if (it == contexts().end()) return EOPNOTSUPP;
    QpState *st = qp_state(qp);
    if (!st) return ENOMEM;
    st->peer_caps = peer_commit_caps & IBV_COMMIT_ECE_CAPS_MASK;
    return 0;
}

const ibv_qp_commit_ops *qp_to_commit_ops(ibv_qp_ex *qpx) {
    std::lock_guard<std::mutex> g(mu);
    QpState *st = find_qp(&qpx->qp_base);
    if (!st || !st->wr_complete || qpx->wr_complete != commit_wr_complete) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return &kOps;
}

int query_ece(ibv_qp *qp, ibv_ece *ece) {
    const uint32_t offer = ece_offer(qp);
    if (!offer) return kNotMine;
    std::lock_guard<std::mutex> g(mu);
    const QpState *st = find_qp(qp);
    *ece = {};
    ece->vendor_id = IBV_COMMIT_ECE_VENDOR_ID;
    ece->options = st && st->ece_set ? st->ece_options : offer;
    return 0;
}

int set_ece(ibv_qp *qp, ibv_ece *ece) {
    const uint32_t offer = ece_offer(qp);
    if (!offer) return kNotMine;
    if (!ece->vendor_id) return EOPNOTSUPP;
    if (ece->comp_mask || ece->vendor_id != IBV_COMMIT_ECE_VENDOR_ID) return EINVAL;
    const uint32_t agreed = sroce_ece_agree(offer, ece->options);
    std::lock_guard<std::mutex> g(mu);
    QpState *st = qp_state(qp);
    if (!st) return ENOMEM;
    st->ece_set = true;
    st->ece_options = agreed;
    st->peer_caps = agreed & IBV_COMMIT_ECE_CAPS_MASK;
    return 0;
}

} // namespace sroce::shim::kernel
