// SPDX-License-Identifier: MIT
//
// Lazy, thread-safe resolution of the real libibverbs entry points that the
// shim forwards to when an object does not belong to sroce.
//
// Each forwarding site owns a function-local static holding the pointer found
// by dlvsym() with the exact symbol version the shim exports, so the real
// function is looked up at most once and the lookup is race free.
#pragma once

#include <cerrno>

namespace sroce::shim {

// libibverbs version nodes.
inline constexpr char kV1_0[] = "IBVERBS_1.0";
inline constexpr char kV1_1[] = "IBVERBS_1.1";
inline constexpr char kV1_5[] = "IBVERBS_1.5";
inline constexpr char kV1_6[] = "IBVERBS_1.6";
inline constexpr char kV1_7[] = "IBVERBS_1.7";
inline constexpr char kV1_8[] = "IBVERBS_1.8";
inline constexpr char kV1_9[] = "IBVERBS_1.9";
inline constexpr char kV1_10[] = "IBVERBS_1.10";
inline constexpr char kV1_11[] = "IBVERBS_1.11";
inline constexpr char kV1_12[] = "IBVERBS_1.12";
inline constexpr char kV1_13[] = "IBVERBS_1.13";
inline constexpr char kV1_14[] = "IBVERBS_1.14";
// The system's private node (IBVERBS_PRIVATE_34 up to rdma-core 56, then
// one per release), found when the project was configured.
inline constexpr char kPrivate[] = SROCE_IBVERBS_PRIVATE;

// Address of `name`@`version` in the real libibverbs: first the objects
// loaded after the shim (RTLD_NEXT), then an explicitly opened
// libibverbs.so.1.  Never returns a symbol of the shim itself.  Returns
// nullptr when not found; errno is left unchanged either way.
void *lookup_real(const char *name, const char *version) noexcept;

template <class Fn>
Fn resolve_real(const char *name, const char *version) noexcept {
    return reinterpret_cast<Fn>(lookup_real(name, version));
}

} // namespace sroce::shim

// Exported entry point: C linkage, default visibility (the linker version
// script assigns the symbol version).
#define SROCE_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

// The real implementation of `fn` (a libibverbs function declared with its
// exact prototype) at symbol version `ver`, resolved once per call site.
#define SROCE_REAL(fn, ver)                                                                        \
    ([]() noexcept {                                                                               \
        static const auto real_fn_ = ::sroce::shim::resolve_real<decltype(&fn)>(#fn, ver);         \
        return real_fn_;                                                                           \
    }())

// `return real_fn(args...)`, or set errno to ENOSYS and return `fail` when the
// real libibverbs does not provide the function.
#define SROCE_FORWARD(fn, ver, fail, ...)                                                          \
    do {                                                                                           \
        auto real_ = SROCE_REAL(fn, ver);                                                          \
        if (!real_) {                                                                              \
            errno = ENOSYS;                                                                        \
            return fail;                                                                           \
        }                                                                                          \
        return real_(__VA_ARGS__);                                                                 \
    } while (0)

// Same for functions returning void.
#define SROCE_FORWARD_VOID(fn, ver, ...)                                                           \
    do {                                                                                           \
        auto real_ = SROCE_REAL(fn, ver);                                                          \
        if (!real_) {                                                                              \
            errno = ENOSYS;                                                                        \
            return;                                                                                \
        }                                                                                          \
        real_(__VA_ARGS__);                                                                        \
    } while (0)
