// SPDX-License-Identifier: MIT
#include "forward.hpp"

#include <dlfcn.h>

namespace sroce::shim {
namespace {

// Load base of the shared object containing the shim.
void *own_base() noexcept {
    static void *const base = [] {
        Dl_info info{};
        return dladdr(reinterpret_cast<void *>(&own_base), &info) ? info.dli_fbase : nullptr;
    }();
    return base;
}

bool is_own_symbol(void *sym) noexcept {
    Dl_info info{};
    return dladdr(sym, &info) && info.dli_fbase == own_base();
}

// The system libibverbs opened explicitly, for processes where it is not
// loaded after the shim (e.g. the shim linked into a program that does not
// depend on libibverbs).  Opened at most once; never closed.
void *fallback_handle() noexcept {
    static void *const handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
    return handle;
}

void *checked(void *sym) noexcept {
    return sym && !is_own_symbol(sym) ? sym : nullptr;
}

} // namespace

void *lookup_real(const char *name, const char *version) noexcept {
    const int saved_errno = errno;
    void *sym = checked(dlvsym(RTLD_NEXT, name, version));
    if (!sym) {
        if (void *handle = fallback_handle()) sym = checked(dlvsym(handle, name, version));
    }
    errno = saved_errno;
    return sym;
}

} // namespace sroce::shim
