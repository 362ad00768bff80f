// SPDX-License-Identifier: MIT
//
// Common declarations of the libibverbs interposition shim: every exported
// verb checks whether its object belongs to sroce and either calls the sroce
// engine (provider.h) or forwards to the real libibverbs (forward.hpp).
//
// libsroce.so interposes a second library too: the C library's open, open64,
// write, close, fstat, fstat64 and __fxstat (rdma_cm.cpp), because rdma-core's
// librdmacm drives the kernel's /dev/infiniband/rdma_cm through them and
// there is no kernel device here; the agent serves the file instead.  They
// are not optional as rdma-core's librspreload is: every librdmacm program
// needs them.  On any other descriptor they cost one relaxed load before the
// C library's call (test_preload_cost.sh prints write()'s cost both ways).
#pragma once

#include "compat_decls.h"
#include "forward.hpp"
#include "provider.h"

#include <cerrno>

// verbs.h wraps some entry points in macros (to pick static inline helpers);
// the shim defines the underlying exported functions.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

namespace sroce::shim {

inline bool owns_device(const ibv_device *dev) noexcept {
    return dev && sroce_owns_device(dev);
}

inline bool owns_ctx(const ibv_context *ctx) noexcept {
    return sroce_owns_context(ctx);
}

// Any verbs object with a `context` member (pd, mr, cq, qp, srq, ah, dm,
// comp_channel, ...).
template <class Obj>
inline bool owns(const Obj *obj) noexcept {
    return obj && sroce_owns_context(obj->context);
}

// Sets errno and returns `value`; for the verbs that report errors as
// NULL/-1 plus errno.
template <class T>
inline T fail_errno(int err, T value) noexcept {
    errno = err;
    return value;
}

// Sets errno and returns it; for the verbs that return an errno value.
inline int fail_ret(int err) noexcept {
    errno = err;
    return err;
}

} // namespace sroce::shim
