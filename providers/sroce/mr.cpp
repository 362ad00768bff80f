// Protection domains and memory regions: registration, key allocation and
// the range/access checks every local and remote access goes through.
#include "nic.hpp"
#include "provider.h"
#include "transport.hpp"

#include <cerrno>
#include <sys/random.h>

namespace sroce {
namespace {

uint32_t random32() {
    uint32_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = uint32_t(now_ns() * 0x9E3779B1u);
    return v;
}

} // namespace

bool MrTable::insert(Mr *mr) {
    std::lock_guard<std::mutex> g(mu_);
    // Random slot and random high bits: a peer cannot guess a valid key from
    // the ones it has been given.
    for (int tries = 0; tries < 64; tries++) {
        uint32_t key = random32();
        uint32_t slot = key & (kSlots - 1);
        if (slots_[slot].load(std::memory_order_relaxed)) continue;
        mr->ibmr.lkey = mr->ibmr.rkey = key;
        slots_[slot].store(mr, std::memory_order_release);
        return true;
    }
    for (uint32_t slot = 0; slot < kSlots; slot++) {
        if (slots_[slot].load(std::memory_order_relaxed)) continue;
        uint32_t key = (random32() & ~(kSlots - 1)) | slot;
        mr->ibmr.lkey = mr->ibmr.rkey = key;
        slots_[slot].store(mr, std::memory_order_release);
        return true;
    }
    return false;
}

void MrTable::erase(Mr *mr) {
    std::lock_guard<std::mutex> g(mu_);
    slots_[mr->ibmr.rkey & (kSlots - 1)].store(nullptr, std::memory_order_release);
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
    return (mr && mr->pd == pd) ? mr : nullptr;
}

uint8_t *check_lkey(Nic *nic, Pd *pd, const ibv_sge &s, unsigned access) {
    Mr *mr = lookup_mr(nic, pd, s.lkey);
    return mr ? mr_range(mr, s.addr, s.length, access) : nullptr;
}

// sroce registers no memory windows yet: no rkey can be invalidated remotely.
int invalidate_rkey(Qp *, uint32_t) {
    return EINVAL;
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_pd *sroce_alloc_pd(struct ibv_context *ctx) {
    auto *pd = new Pd;
    pd->ibpd.context = ctx;
    static std::atomic<uint32_t> handles{1};
    pd->ibpd.handle = handles++;
    return &pd->ibpd;
}

int sroce_dealloc_pd(struct ibv_pd *pd) {
    delete reinterpret_cast<Pd *>(pd);
    return 0;
}

struct ibv_mr *sroce_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                            unsigned int access) {
    constexpr unsigned kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                IBV_ACCESS_MW_BIND | IBV_ACCESS_FLUSH_GLOBAL |
                                IBV_ACCESS_FLUSH_PERSISTENT;
    // Optional access bits are hints a provider may ignore (rdma-core's rule).
    unsigned mandatory = access & (IBV_ACCESS_OPTIONAL_FIRST - 1);
    if (mandatory & ~kKnown) {
        errno = (mandatory & IBV_ACCESS_ON_DEMAND) ? EOPNOTSUPP : EINVAL;
        return nullptr;
    }
    // IBTA: remote write or atomic access requires local write.
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE)) {
        errno = EINVAL;
        return nullptr;
    }
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
    mr->access = mandatory;
    mr->pd = reinterpret_cast<Pd *>(pd);
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
}

int sroce_rereg_mr(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int) {
    return EOPNOTSUPP;
}

int sroce_dereg_mr(struct ibv_mr *ibmr) {
    Mr *mr = reinterpret_cast<Mr *>(ibmr);
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
