// SPDX-License-Identifier: MIT
//
// Write-commits on kernel RDMA devices that execute them (Linux rxe with
// rxe-patches/): <infiniband/verbs_ext.h> for their QPs, through the system
// libibverbs and the device's own provider.
#pragma once

#include "compat_decls.h"

#include <infiniband/verbs_ext.h>

#include <cstdint>

namespace sroce::shim::kernel {

// The device's commit capabilities (sysfs `commit_caps`), 0 for a device
// without write-commits.
uint32_t commit_caps(ibv_context *context);

// After the system libibverbs opened or before it closes a context.
void context_opened(ibv_context *context);
void context_closing(ibv_context *context);
// After the system libibverbs destroyed a QP.
void qp_destroyed(ibv_qp *qp);

int qp_set_commit_peer(ibv_qp *qp, uint32_t peer_commit_caps);
const ibv_qp_commit_ops *qp_to_commit_ops(ibv_qp_ex *qpx);
// kNotMine: not a reliable QP of a write-commit device; the caller
// forwards to the system libibverbs.
constexpr int kNotMine = -1;
int query_ece(ibv_qp *qp, ibv_ece *ece);
int set_ece(ibv_qp *qp, ibv_ece *ece);

} // namespace sroce::shim::kernel
