// SPDX-License-Identifier: MIT
//
// The write-commit verbs of <infiniband/verbs_ext.h>.  They are new, so no
// system libibverbs has them: objects of other providers get EOPNOTSUPP.
#include "shim.hpp"

using namespace sroce::shim;

SROCE_SHIM_EXPORT int ibv_query_commit_caps(ibv_context *context, ibv_commit_caps *caps) {
    if (!context || !caps) return EINVAL;
    if (owns_ctx(context)) return sroce_query_commit_caps(context, caps);
    return EOPNOTSUPP;
}

SROCE_SHIM_EXPORT int ibv_qp_set_commit_peer(ibv_qp *qp, uint32_t peer_commit_caps) {
    if (!qp) return EINVAL;
    if (owns(qp)) return sroce_qp_set_commit_peer(qp, peer_commit_caps);
    return EOPNOTSUPP;
}

SROCE_SHIM_EXPORT const ibv_qp_commit_ops *ibv_qp_to_commit_ops(ibv_qp_ex *qpx) {
    if (qpx && owns(&qpx->qp_base)) return sroce_qp_to_commit_ops(qpx);
    errno = EOPNOTSUPP;
    return nullptr;
}
