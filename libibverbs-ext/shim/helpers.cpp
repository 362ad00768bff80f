// SPDX-License-Identifier: MIT
//
// libibverbs exports that touch no verbs object: string and rate
// conversions, fork support, kernel ABI marshalling.  Always forwarded.
#include "shim.hpp"

using namespace sroce::shim;

namespace {
constexpr const char *kUnknown = "unknown";
}

// ---------------------------------------------------------------------------
// Strings

SROCE_SHIM_EXPORT const char *ibv_wc_status_str(ibv_wc_status status) {
    SROCE_FORWARD(ibv_wc_status_str, kV1_1, kUnknown, status);
}

SROCE_SHIM_EXPORT const char *ibv_node_type_str(ibv_node_type node_type) {
    SROCE_FORWARD(ibv_node_type_str, kV1_1, kUnknown, node_type);
}

SROCE_SHIM_EXPORT const char *ibv_port_state_str(ibv_port_state port_state) {
    SROCE_FORWARD(ibv_port_state_str, kV1_1, kUnknown, port_state);
}

SROCE_SHIM_EXPORT const char *ibv_event_type_str(ibv_event_type event) {
    SROCE_FORWARD(ibv_event_type_str, kV1_1, kUnknown, event);
}

// ---------------------------------------------------------------------------
// Rates

SROCE_SHIM_EXPORT int ibv_rate_to_mult(ibv_rate rate) {
    SROCE_FORWARD(ibv_rate_to_mult, kV1_0, -1, rate);
}

SROCE_SHIM_EXPORT ibv_rate mult_to_ibv_rate(int mult) {
    SROCE_FORWARD(mult_to_ibv_rate, kV1_0, IBV_RATE_MAX, mult);
}

SROCE_SHIM_EXPORT int ibv_rate_to_mbps(ibv_rate rate) {
    SROCE_FORWARD(ibv_rate_to_mbps, kV1_1, -1, rate);
}

SROCE_SHIM_EXPORT ibv_rate mbps_to_ibv_rate(int mbps) {
    SROCE_FORWARD(mbps_to_ibv_rate, kV1_1, IBV_RATE_MAX, mbps);
}

// ---------------------------------------------------------------------------
// fork() support

SROCE_SHIM_EXPORT int ibv_fork_init(void) {
    SROCE_FORWARD(ibv_fork_init, kV1_1, ENOSYS);
}

SROCE_SHIM_EXPORT ibv_fork_status ibv_is_fork_initialized(void) {
    SROCE_FORWARD(ibv_is_fork_initialized, kV1_13, IBV_FORK_DISABLED);
}

SROCE_SHIM_EXPORT int ibv_dontfork_range(void *base, size_t size) {
    SROCE_FORWARD(ibv_dontfork_range, kV1_1, ENOSYS, base, size);
}

SROCE_SHIM_EXPORT int ibv_dofork_range(void *base, size_t size) {
    SROCE_FORWARD(ibv_dofork_range, kV1_1, ENOSYS, base, size);
}

// ---------------------------------------------------------------------------
// Kernel ABI marshalling (used by other rdma-core libraries)

SROCE_SHIM_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr *dst, ib_uverbs_qp_attr *src) {
    SROCE_FORWARD_VOID(ibv_copy_qp_attr_from_kern, kV1_0, dst, src);
}

SROCE_SHIM_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr *dst, ib_uverbs_ah_attr *src) {
    SROCE_FORWARD_VOID(ibv_copy_ah_attr_from_kern, kV1_1, dst, src);
}

SROCE_SHIM_EXPORT void ibv_copy_path_rec_from_kern(ibv_sa_path_rec *dst, ib_user_path_rec *src) {
    SROCE_FORWARD_VOID(ibv_copy_path_rec_from_kern, kV1_0, dst, src);
}

SROCE_SHIM_EXPORT void ibv_copy_path_rec_to_kern(ib_user_path_rec *dst, ibv_sa_path_rec *src) {
    SROCE_FORWARD_VOID(ibv_copy_path_rec_to_kern, kV1_0, dst, src);
}

// ---------------------------------------------------------------------------
// ibv_register_driver: libibverbs keeps it only as the non-default version
// ibv_register_driver@IBVERBS_1.1 (a no-op for old binaries), so the shim
// exports it the same way (a .symver directive, understood by GCC and clang
// alike, binds the implementation to that version).

__asm__(".symver sroce_shim_register_driver_1_1, ibv_register_driver@IBVERBS_1.1");

SROCE_SHIM_EXPORT void sroce_shim_register_driver_1_1(const char *name,
                                                      sroce_shim_driver_init_fn init_func) {
    static const auto real =
        resolve_real<decltype(&sroce_shim_register_driver_1_1)>("ibv_register_driver", kV1_1);
    if (!real) {
        errno = ENOSYS;
        return;
    }
    real(name, init_func);
}
