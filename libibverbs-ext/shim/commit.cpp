// SPDX-License-Identifier: MIT
//
// The write-commit verbs of <infiniband/verbs_ext.h>.  They are new, so no
// system libibverbs has them: sroce's objects go to sroce, those of kernel
// devices that execute write-commits to kernel_commit.cpp, the others get
// EOPNOTSUPP.
#include "kernel_commit.hpp"
#include "shim.hpp"

using namespace sroce::shim;

SROCE_SHIM_EXPORT int ibv_query_commit_caps(ibv_context *context, ibv_commit_caps *caps) {
    if (!context || !caps) return EINVAL;
    if (owns_ctx(context)) return sroce_query_commit_caps(context, caps);
    const uint32_t flags = kernel::commit_caps(context);
    if (!flags) return EOPNOTSUPP;
    if (caps->comp_mask) return EINVAL;
    // rxe-patches/: cache-line write-back of pmem pages, a fence for the rest.
    *caps = {};
    caps->flags = flags;
    caps->atomicity_unit = 8;
    caps->persistence_methods = IBV_COMMIT_METHOD_CACHE_FLUSH | IBV_COMMIT_METHOD_FENCE;
    return 0;
}

SROCE_SHIM_EXPORT int ibv_qp_set_commit_peer(ibv_qp *qp, uint32_t peer_commit_caps) {
    if (!qp) return EINVAL;
    if (owns(qp)) return sroce_qp_set_commit_peer(qp, peer_commit_caps);
    return kernel::qp_set_commit_peer(qp, peer_commit_caps);
}

SROCE_SHIM_EXPORT const ibv_qp_commit_ops *ibv_qp_to_commit_ops(ibv_qp_ex *qpx) {
    if (qpx && owns(&qpx->qp_base)) return sroce_qp_to_commit_ops(qpx);
    if (qpx) return kernel::qp_to_commit_ops(qpx);
    errno = EOPNOTSUPP;
    return nullptr;
}
