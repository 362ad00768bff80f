// SPDX-License-Identifier: MIT
//
// Sharing objects between contexts (ibv_import_device, ibv_import_pd,
// ibv_import_mr): a context imported from another's command FD sees that
// context's PDs and MRs by handle, as with the kernel's uverbs.  Both
// contexts live in this process and use the same device, so an import is a
// second handle on the same object.  Processes cannot share sroce objects.
#include "nic.hpp"
#include "no_destructor.hpp"
#include "provider.h"

#include <cerrno>
#include <map>
#include <new>
#include <sys/stat.h>

namespace sroce {
namespace {

// PDs by handle (roots only).  Never destroyed (no_destructor.hpp): other
// threads may allocate and free PDs while exit() runs.
std::mutex g_pds_mu;
std::map<uint32_t, Pd *> &pds() noexcept {
    static NoDestructor<std::map<uint32_t, Pd *>> m;
    return *m;
}

bool same_file(const Context *a, const Context *b) {
    return a->file_dev == b->file_dev && a->file_ino == b->file_ino;
}

} // namespace

bool register_pd(Pd *pd) try {
    std::lock_guard<std::mutex> g(g_pds_mu);
    pds()[pd->ibpd.handle] = pd;
    return true;
} catch (const std::bad_alloc &) {
    return false;
}

void unregister_pd(Pd *pd) {
    std::lock_guard<std::mutex> g(g_pds_mu);
    pds().erase(pd->ibpd.handle);
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_pd *sroce_import_pd(struct ibv_context *ctx, uint32_t handle) {
    Pd *root;
    {
        std::lock_guard<std::mutex> g(g_pds_mu);
        auto &m = pds();
        auto it = m.find(handle);
        root = it == m.end() ? nullptr : it->second;
    }
    if (!root || !same_file(to_ctx(root->ibpd.context), to_ctx(ctx))) {
        errno = EINVAL;
        return nullptr;
    }
    Pd *pd = new (std::nothrow) Pd;
    if (!pd) return out_of_memory<ibv_pd *>(nullptr);
    pd->ibpd.context = ctx;
    pd->ibpd.handle = handle;
    pd->root = root;
    root->imports++;
    return &pd->ibpd;
}

void sroce_unimport_pd(struct ibv_pd *ibpd) {
    Pd *pd = reinterpret_cast<Pd *>(ibpd);
    if (pd->root == pd) return;
    pd->root->imports--;
    delete pd;
}

struct ibv_mr *sroce_import_mr(struct ibv_pd *pd, uint32_t handle) {
    Nic *nic = to_ctx(pd->context)->nic;
    std::lock_guard<std::mutex> g(nic->objects_mu);
    Mr *root = lookup_mr(nic, pd_root(pd), handle);
    if (!root) {
        errno = EINVAL;
        return nullptr;
    }
    Mr *mr = new (std::nothrow) Mr;
    if (!mr) return out_of_memory<ibv_mr *>(nullptr);
    mr->imported_from = root;
    mr->pd = root->pd;
    mr->access = root->access;
    mr->ibmr = root->ibmr;
    mr->ibmr.context = pd->context;
    mr->ibmr.pd = pd;
    // The kernel knows no user address for an imported MR.
    mr->ibmr.addr = nullptr;
    return &mr->ibmr;
}

void sroce_unimport_mr(struct ibv_mr *ibmr) {
    Mr *mr = reinterpret_cast<Mr *>(ibmr);
    if (mr->imported_from) delete mr;
}

} // extern "C"
