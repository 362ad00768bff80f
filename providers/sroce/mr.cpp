// SPDX-License-Identifier: MIT
//
// Protection domains and memory regions: registration, key allocation and
// the range/access checks every local and remote access goes through.
#include "nic.hpp"
#include "provider.h"
#include "transport.hpp"

#include <cerrno>
#include <cstdint>
#include <sys/random.h>
#include <unistd.h>

namespace sroce {
namespace {

uint32_t random32() {
    uint32_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = uint32_t(now_ns() * 0x9E3779B1u);
    return v;
}

constexpr unsigned kKnownAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_FLUSH_GLOBAL |
    IBV_ACCESS_FLUSH_PERSISTENT | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

// The access bits an MR keeps, or -1 with errno set.  Optional bits are
// hints a provider may ignore (rdma-core's rule).
int check_access(unsigned access) {
    unsigned mandatory = access & (IBV_ACCESS_OPTIONAL_FIRST - 1);
    if (mandatory & ~kKnownAccess) {
        errno = EINVAL;
        return -1;
    }
    // IBTA: remote write or atomic access requires local write.
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE)) {
        errno = EINVAL;
        return -1;
    }
    return int(mandatory);
}

} // namespace

bool MrTable::insert(Mr *mr) {
    std::lock_guard<std::mutex> g(mu_);
    // Random slot and random other bits: a peer cannot guess a valid key
    // from the ones it has been given.
    auto take = [&](uint32_t slot) {
        uint32_t key = (random32() & ~((kSlots - 1) << 8)) | slot << 8;
        mr->key.store(key, std::memory_order_relaxed);
        if (!mr->window) mr->ibmr.lkey = mr->ibmr.rkey = key;
        slots_[slot].store(mr, std::memory_order_release);
    };
    for (int tries = 0; tries < 64; tries++) {
        uint32_t slot = random32() & (kSlots - 1);
        if (slots_[slot].load(std::memory_order_relaxed)) continue;
        take(slot);
        return true;
    }
    for (uint32_t slot = 0; slot < kSlots; slot++) {
        if (slots_[slot].load(std::memory_order_relaxed)) continue;
        take(slot);
        return true;
    }
    return false;
}

void MrTable::erase(Mr *mr) {
    std::lock_guard<std::mutex> g(mu_);
    slots_[slot_of(mr->key.load(std::memory_order_relaxed))].store(nullptr,
                                                                   std::memory_order_release);
    changed();
}

uint8_t *mr_range(const Mr *mr, uint64_t va, uint64_t len, unsigned access) {
    if ((mr->access & access) != access) return nullptr;
    if (va < mr->iova) return nullptr;
    uint64_t off = va - mr->iova;
    if (off > mr->length || len > mr->length - off) return nullptr;
    return mr->addr + off;
}

Mr *lookup_mr(Nic *nic, Pd *pd, uint32_t key) {
    Mr *mr = nic->mrs.lookup(key);
    return (mr && mr->pd == pd && !mr->window) ? mr : nullptr;
}

uint8_t *check_lkey(Nic *nic, Pd *pd, const ibv_sge &s, unsigned access) {
    Mr *mr = lookup_mr(nic, pd, s.lkey);
    return mr ? mr_range(mr, s.addr, s.length, access) : nullptr;
}

bool sges_still_registered(Nic *nic, Pd *pd, const ibv_sge *host_sge, uint32_t n, unsigned access) {
    for (uint32_t i = 0; i < n; i++) {
        const ibv_sge &s = host_sge[i];
        if (!s.length) continue;
        Mr *mr = lookup_mr(nic, pd, s.lkey);
        if (!mr || (mr->access & access) != access) return false;
        uintptr_t lo = uintptr_t(mr->addr), p = uintptr_t(s.addr);
        if (p < lo || p - lo > mr->length || s.length > mr->length - (p - lo)) return false;
    }
    return true;
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_pd *sroce_alloc_pd(struct ibv_context *ctx) try {
    auto *pd = new Pd;
    pd->ibpd.context = ctx;
    static std::atomic<uint32_t> handles{1};
    pd->ibpd.handle = handles++;
    if (!register_pd(pd)) {
        delete pd;
        return out_of_memory<struct ibv_pd *>(nullptr);
    }
    return &pd->ibpd;
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_pd *>(nullptr);
}

int sroce_dealloc_pd(struct ibv_pd *ibpd) {
    Pd *pd = reinterpret_cast<Pd *>(ibpd);
    if (pd->root != pd) {
        // An imported handle goes away; the PD stays its owner's.
        pd->root->imports--;
        delete pd;
        return 0;
    }
    // Imported handles still name it.
    if (pd->imports.load()) return EBUSY;
    unregister_pd(pd);
    delete pd;
    return 0;
}

struct ibv_mr *sroce_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                            unsigned int access) try {
    int mandatory = check_access(access);
    if (mandatory < 0) return nullptr;
    // No address with a length is no memory, also in the form implicit
    // on-demand paging takes (NULL, SIZE_MAX), which sroce does not offer.
    if ((!addr && length) || iova + length < iova) {
        errno = EINVAL;
        return nullptr;
    }
    // FLUSH_PERSISTENT promises durability, so memory that cannot be made
    // durable (anonymous, tmpfs) is refused, as Linux rxe does.
    MemClass cls = length ? classify_memory(addr, length) : MemClass::kVolatile;
    if ((access & IBV_ACCESS_FLUSH_PERSISTENT) && cls == MemClass::kVolatile) {
        errno = EINVAL;
        return nullptr;
    }
    Context *ctx = to_ctx(pd->context);
    auto *mr = new Mr;
    mr->cls = cls;
    mr->uncached = access & IBV_ACCESS_UNCACHED;
    mr->addr = static_cast<uint8_t *>(addr);
    mr->iova = iova;
    mr->length = length;
    mr->access = unsigned(mandatory);
    mr->pd = pd_root(pd);
    mr->ibmr.context = pd->context;
    mr->ibmr.pd = pd;
    mr->ibmr.addr = addr;
    mr->ibmr.length = length;
    if (!ctx->nic->mrs.insert(mr)) {
        delete mr;
        errno = ENOMEM;
        return nullptr;
    }
    mr->ibmr.handle = mr->ibmr.lkey;
    return &mr->ibmr;
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_mr *>(nullptr);
}

// Serves ibv_rereg_mr() whole: the argument checks of libibverbs (an error
// there is IBV_REREG_MR_ERR_INPUT), then the change itself (an error there
// is IBV_REREG_MR_ERR_CMD), with errno saying why.  The keys stay the same.
int sroce_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                   int access) try {
    if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED ||
        ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
        (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    Mr *mr = reinterpret_cast<Mr *>(ibmr);
    auto cmd_error = [](int err) {
        errno = err;
        return IBV_REREG_MR_ERR_CMD;
    };
    // The kernel refuses a request that changes nothing.
    if (!(flags &
          (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS)))
        return cmd_error(EINVAL);
    if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != ibmr->context))
        return cmd_error(EINVAL);
    unsigned new_access = mr->access;
    bool uncached = mr->uncached;
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
        int a = check_access(unsigned(access));
        if (a < 0) return cmd_error(errno);
        new_access = unsigned(a);
        uncached = access & IBV_ACCESS_UNCACHED;
    }
    // The MR's extent after the change.
    uint8_t *new_addr = mr->addr;
    uint64_t new_iova = mr->iova;
    size_t new_length = mr->length;
    MemClass cls = mr->cls;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (uintptr_t(addr) + length < uintptr_t(addr)) return cmd_error(EINVAL);
        new_addr = static_cast<uint8_t *>(addr);
        new_iova = uintptr_t(addr);
        new_length = length;
        cls = classify_memory(addr, length);
    }
    if ((new_access & IBV_ACCESS_FLUSH_PERSISTENT) && cls == MemClass::kVolatile)
        return cmd_error(EINVAL);

    // The progress thread looks MRs up and uses them under objects_mu.
    Nic *nic = to_ctx(ibmr->context)->nic;
    std::lock_guard<std::mutex> g(nic->objects_mu);
    mr->access = new_access;
    mr->uncached = uncached;
    mr->addr = new_addr;
    mr->iova = new_iova;
    mr->length = new_length;
    mr->cls = cls;
    if (flags & IBV_REREG_MR_CHANGE_PD) {
        mr->pd = pd_root(pd);
        ibmr->pd = pd;
    }
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        ibmr->addr = addr;
        ibmr->length = length;
    }
    // Messages in progress check their ranges again before the next byte.
    nic->mrs.changed();
    return 0;
} catch (const std::bad_alloc &) {
    errno = ENOMEM;
    return IBV_REREG_MR_ERR_CMD;
}

int sroce_dereg_mr(struct ibv_mr *ibmr) {
    Mr *mr = reinterpret_cast<Mr *>(ibmr);
    // An imported MR's handle goes away; the MR stays its owner's.
    if (mr->imported_from) {
        delete mr;
        return 0;
    }
    // Windows bound to the MR would be left pointing at nothing.
    if (mr->windows.load()) return EBUSY;
    Nic *nic = to_ctx(ibmr->context)->nic;
    {
        // Wait until the progress thread is not between lookup and use.
        std::lock_guard<std::mutex> g(nic->objects_mu);
        nic->mrs.erase(mr);
    }
    delete mr;
    return 0;
}

} // extern "C"

namespace sroce {

// ibv_advise_mr(): nothing is ever paged out, so prefetching has nothing
// to do once the ranges are found valid.
int advise_mr(ibv_pd *pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg_list,
              uint32_t num_sge) {
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return EOPNOTSUPP;
    if (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) return EOPNOTSUPP;
    if (!num_sge || !sg_list) return EINVAL;
    Nic *nic = to_ctx(pd->context)->nic;
    std::lock_guard<std::mutex> g(nic->objects_mu);
    for (uint32_t i = 0; i < num_sge; i++) {
        const Mr *mr = nic->mrs.lookup(sg_list[i].lkey);
        unsigned need =
            advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? unsigned(IBV_ACCESS_LOCAL_WRITE) : 0;
        if (!mr || mr->window || mr->pd != pd_root(pd) ||
            !mr_range(mr, sg_list[i].addr, sg_list[i].length, need))
            return EINVAL;
    }
    return 0;
}

} // namespace sroce
