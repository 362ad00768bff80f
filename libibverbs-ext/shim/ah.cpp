// SPDX-License-Identifier: MIT
//
// Address handles built from a received work completion, for replying to a
// UD sender.  For sroce contexts the shim derives the address itself from the
// 40-byte GRH area the engine places in front of UD payloads, following the
// RoCEv2 convention: the area holds the IPv6 header of an IPv6 packet, or for
// an IPv4 packet 20 zero bytes followed by the IPv4 header.
#include "shim.hpp"

#include <cstdint>
#include <cstring>
#include <endian.h>

using namespace sroce::shim;

namespace {

constexpr std::size_t kIpv4HeaderOffset = 20;
constexpr std::size_t kIpv4HeaderLen = 20;

struct GrhAddress {
    ibv_gid source;      // remote (sender) address
    ibv_gid destination; // local address the packet was sent to
    uint8_t traffic_class;
    uint32_t flow_label;
    bool ipv4;
};

bool ipv4_header_ok(const uint8_t *hdr) noexcept {
    if (hdr[0] != 0x45) // version 4, no options
        return false;
    uint32_t sum = 0;
    for (std::size_t i = 0; i < kIpv4HeaderLen; i += 2)
        sum += static_cast<uint32_t>(hdr[i] << 8 | hdr[i + 1]);
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return sum == 0xffff;
}

void ipv4_mapped_gid(ibv_gid &gid, const uint8_t *addr) noexcept {
    std::memset(gid.raw, 0, sizeof(gid.raw));
    gid.raw[10] = 0xff;
    gid.raw[11] = 0xff;
    std::memcpy(gid.raw + 12, addr, 4);
}

bool parse_grh(const ibv_grh *grh, GrhAddress &out) noexcept {
    const uint32_t vtf = be32toh(grh->version_tclass_flow);
    if (vtf >> 28 == 6) {
        out.source = grh->sgid;
        out.destination = grh->dgid;
        out.traffic_class = static_cast<uint8_t>(vtf >> 20);
        out.flow_label = vtf & 0xfffff;
        out.ipv4 = false;
        return true;
    }
    const auto *ip = reinterpret_cast<const uint8_t *>(grh) + kIpv4HeaderOffset;
    if (!ipv4_header_ok(ip)) return false;
    ipv4_mapped_gid(out.source, ip + 12);
    ipv4_mapped_gid(out.destination, ip + 16);
    out.traffic_class = ip[1];
    out.flow_label = 0;
    out.ipv4 = true;
    return true;
}

// Index of the local GID `gid` on `port_num`, preferring a RoCE v2 entry
// (required for IPv4 packets); -1 with errno set when there is none.
int find_local_gid(ibv_context *context, uint8_t port_num, const ibv_gid &gid,
                   bool need_v2) noexcept {
    ibv_port_attr port_attr{};
    if (const int ret = sroce_query_port(context, port_num, &port_attr)) return fail_errno(ret, -1);
    int fallback = -1;
    for (int i = 0; i < port_attr.gid_tbl_len; ++i) {
        ibv_gid_entry entry{};
        if (sroce_query_gid_ex(context, port_num, static_cast<uint32_t>(i), &entry, 0))
            continue; // empty or unreadable entry
        if (std::memcmp(entry.gid.raw, gid.raw, sizeof(gid.raw)) != 0) continue;
        if (entry.gid_type == IBV_GID_TYPE_ROCE_V2) return i;
        if (!need_v2 && fallback < 0) fallback = i;
    }
    return fallback >= 0 ? fallback : fail_errno(ENOENT, -1);
}

int sroce_init_ah_from_wc(ibv_context *context, uint8_t port_num, const ibv_wc *wc,
                          const ibv_grh *grh, ibv_ah_attr *ah_attr) noexcept {
    if (!wc || !ah_attr) return fail_errno(EINVAL, -1);
    // RoCE addresses are always global: without a GRH there is nothing to
    // reply to.
    if (!(wc->wc_flags & IBV_WC_GRH) || !grh) return fail_errno(EINVAL, -1);
    GrhAddress addr{};
    if (!parse_grh(grh, addr)) return fail_errno(EINVAL, -1);
    const int sgid_index = find_local_gid(context, port_num, addr.destination, addr.ipv4);
    if (sgid_index < 0 || sgid_index > UINT8_MAX) return -1;

    std::memset(ah_attr, 0, sizeof(*ah_attr));
    ah_attr->dlid = wc->slid;
    ah_attr->sl = wc->sl;
    ah_attr->src_path_bits = wc->dlid_path_bits;
    ah_attr->port_num = port_num;
    ah_attr->is_global = 1;
    ah_attr->grh.dgid = addr.source;
    ah_attr->grh.sgid_index = static_cast<uint8_t>(sgid_index);
    ah_attr->grh.flow_label = addr.flow_label;
    ah_attr->grh.traffic_class = addr.traffic_class;
    ah_attr->grh.hop_limit = 0xff;
    return 0;
}

} // namespace

SROCE_SHIM_EXPORT int ibv_init_ah_from_wc(ibv_context *context, uint8_t port_num, ibv_wc *wc,
                                          ibv_grh *grh, ibv_ah_attr *ah_attr) {
    if (owns_ctx(context)) return sroce_init_ah_from_wc(context, port_num, wc, grh, ah_attr);
    SROCE_FORWARD(ibv_init_ah_from_wc, kV1_1, -1, context, port_num, wc, grh, ah_attr);
}

SROCE_SHIM_EXPORT ibv_ah *ibv_create_ah_from_wc(ibv_pd *pd, ibv_wc *wc, ibv_grh *grh,
                                                uint8_t port_num) {
    if (owns(pd)) {
        ibv_ah_attr ah_attr{};
        if (sroce_init_ah_from_wc(pd->context, port_num, wc, grh, &ah_attr)) return nullptr;
        return sroce_create_ah(pd, &ah_attr);
    }
    SROCE_FORWARD(ibv_create_ah_from_wc, kV1_1, nullptr, pd, wc, grh, port_num);
}
