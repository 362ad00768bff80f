// SPDX-License-Identifier: MIT
//
// The port's GID table and the addresses a packet leaves from and goes to.
#include "sroce.hpp"

namespace sroce {

void GidTable::set_fixed(const ibv_gid &deflt, const IpAddr &addr) {
    std::lock_guard<std::mutex> g(mu_);
    gid_[0] = deflt;
    used_[0] = true;
    if (std::memcmp(deflt.raw, addr.raw, 16) != 0) {
        std::memcpy(gid_[1].raw, addr.raw, 16);
        used_[1] = true;
    }
    gen_.fetch_add(1, std::memory_order_release);
}

bool GidTable::update(const ibv_gid &deflt, const std::vector<IpAddr> &addrs) {
    std::lock_guard<std::mutex> g(mu_);
    bool changed = !used_[0] || std::memcmp(gid_[0].raw, deflt.raw, 16) != 0;
    gid_[0] = deflt;
    used_[0] = true;
    auto listed = [&](const uint8_t *raw) {
        for (const IpAddr &a : addrs)
            if (std::memcmp(a.raw, raw, 16) == 0) return true;
        return false;
    };
    for (int i = 1; i < kMaxGids; i++)
        if (used_[i] && !listed(gid_[i].raw)) {
            used_[i] = false;
            gid_[i] = {};
            changed = true;
        }
    for (const IpAddr &a : addrs) {
        bool have = false;
        for (int i = 0; i < kMaxGids && !have; i++)
            have = used_[i] && std::memcmp(gid_[i].raw, a.raw, 16) == 0;
        if (have) continue;
        // A full table leaves the address out, as the kernel's does.
        for (int i = 1; i < kMaxGids; i++)
            if (!used_[i]) {
                std::memcpy(gid_[i].raw, a.raw, 16);
                used_[i] = true;
                changed = true;
                break;
            }
    }
    if (changed) gen_.fetch_add(1, std::memory_order_release);
    return changed;
}

bool GidTable::get(uint32_t index, ibv_gid *gid) const {
    std::lock_guard<std::mutex> g(mu_);
    if (index >= uint32_t(kMaxGids) || !used_[index]) return false;
    *gid = gid_[index];
    return true;
}

uint32_t GidTable::size() const {
    std::lock_guard<std::mutex> g(mu_);
    uint32_t n = kMaxGids;
    while (n && !used_[n - 1])
        n--;
    return n;
}

int path_addrs(const Device &d, const ibv_global_route &grh, IpAddr *src, IpAddr *dst) {
    ibv_gid sgid;
    if (!d.gids.get(grh.sgid_index, &sgid)) return EINVAL;
    *src = d.follow ? IpAddr::of_gid(sgid.raw) : d.addr;
    *dst = IpAddr::of_gid(grh.dgid.raw);
    return !dst->empty() && dst->is_v4() == src->is_v4() ? 0 : EINVAL;
}

} // namespace sroce
