// SPDX-License-Identifier: MIT
#include "icrc.hpp"

#include "wire.hpp"

#include <array>
#include <cstring>
#include <isa-l/crc.h>

namespace sroce {
namespace {

// Pseudo header: 8 x 0xFF, IPv4 (20), UDP (8), BTH (12).
constexpr size_t kPseudoLen = 8 + wire::kIpv4HdrLen + wire::kUdpHdrLen + wire::kBthLen;
constexpr size_t kIpIdOffset = 8 + 4;

void build_pseudo(uint8_t *p, const Ipv4Header &ip, size_t udp_payload_len, const uint8_t *bth) {
    std::memset(p, 0xFF, 8);
    uint8_t *h = p + 8;
    h[0] = 0x45;
    h[1] = 0xFF; // TOS
    wire::put16(h + 2, uint16_t(wire::kIpv4HdrLen + wire::kUdpHdrLen + udp_payload_len));
    wire::put16(h + 4, ip.ip_id);
    wire::put16(h + 6, ip.df ? 0x4000 : 0);
    h[8] = 0xFF; // TTL
    h[9] = IPPROTO_UDP;
    h[10] = h[11] = 0xFF; // header checksum
    std::memcpy(h + 12, &ip.src, 4);
    std::memcpy(h + 16, &ip.dst, 4);
    uint8_t *u = h + wire::kIpv4HdrLen;
    wire::put16(u, ip.sport);
    wire::put16(u + 2, ip.dport);
    wire::put16(u + 4, uint16_t(wire::kUdpHdrLen + udp_payload_len));
    u[6] = u[7] = 0xFF; // UDP checksum
    uint8_t *b = u + wire::kUdpHdrLen;
    std::memcpy(b, bth, wire::kBthLen);
    b[4] = 0xFF; // resv8a (FECN/BECN)
}

// Byte-wise reflected CRC-32 tables for the slow path that solves for an
// unknown IP ID.  The top bytes of the 256 table entries are all distinct,
// which is what makes one step of the CRC invertible.
struct Tables {
    std::array<uint32_t, 256> fwd{};
    std::array<uint8_t, 256> by_top{};
    constexpr Tables() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            fwd[i] = c;
        }
        for (uint32_t i = 0; i < 256; i++)
            by_top[fwd[i] >> 24] = uint8_t(i);
    }
};
constexpr Tables kT;

inline uint32_t step_fwd(uint32_t s, uint8_t b) {
    return (s >> 8) ^ kT.fwd[(s ^ b) & 0xFF];
}
inline uint32_t step_back(uint32_t s, uint8_t b) {
    uint8_t idx = kT.by_top[s >> 24];
    return ((s ^ kT.fwd[idx]) << 8) | uint8_t(idx ^ b);
}

// Finds the IP ID that makes the CRC over the pseudo header + rest equal
// `icrc`, with `pseudo` holding the masked headers (ID bytes ignored).
bool solve_ip_id(const uint8_t *pseudo, const uint8_t *rest, size_t rest_len, uint32_t icrc,
                 uint16_t *id) {
    // Forward to just before the ID (raw register, init all ones).
    uint32_t s12 = 0xFFFFFFFFu;
    for (size_t i = 0; i < kIpIdOffset; i++)
        s12 = step_fwd(s12, pseudo[i]);
    // Backward from the final register over every byte after the ID.
    uint32_t s = ~icrc;
    for (size_t i = rest_len; i-- > 0;)
        s = step_back(s, rest[i]);
    for (size_t i = kPseudoLen; i-- > kIpIdOffset + 2;)
        s = step_back(s, pseudo[i]);
    // s is the register after both ID bytes; undo them symbolically.
    uint32_t s14 = s;
    uint8_t idx13 = kT.by_top[s14 >> 24];
    uint32_t s13_hi = (s14 ^ kT.fwd[idx13]) << 8; // low byte unknown
    uint8_t idx12 = kT.by_top[s13_hi >> 24];
    uint32_t t = s13_hi ^ kT.fwd[idx12];
    if (((t ^ (s12 >> 8)) & 0x00FFFF00u) != 0) return false;
    uint8_t s13_lo = uint8_t((s12 >> 8) ^ kT.fwd[idx12]);
    uint8_t b12 = uint8_t(idx12 ^ (s12 & 0xFF));
    uint8_t b13 = uint8_t(idx13 ^ s13_lo);
    // Confirm by running forward.
    if (step_fwd(step_fwd(s12, b12), b13) != s14) return false;
    *id = uint16_t(b12 << 8 | b13);
    return true;
}

// The ICRC over `covered` (whose last 4 bytes are the ICRC field) for a
// datagram whose UDP payload is udp_len bytes: the two differ only for the
// legacy FLUSH form, which covers more than it carries.
uint32_t compute(const Ipv4Header &ip, size_t udp_len, const uint8_t *covered, size_t len) {
    uint8_t pseudo[kPseudoLen];
    build_pseudo(pseudo, ip, udp_len, covered);
    uint32_t s = crc32_gzip_refl(0, pseudo, kPseudoLen);
    return crc32_gzip_refl(s, covered + wire::kBthLen, len - wire::kBthLen - wire::kIcrcLen);
}

bool verify(Ipv4Header ip, size_t udp_len, const uint8_t *covered, size_t len, uint16_t *ip_id) {
    uint32_t want = icrc_load(covered + len - wire::kIcrcLen);
    ip.ip_id = 0;
    ip.df = true;
    if (compute(ip, udp_len, covered, len) == want) {
        if (ip_id) *ip_id = 0;
        return true;
    }
    // sroce sends from port 4791 with ID 0 and DF; giving its packets 17 free
    // bits to solve for would let corrupted ones through, so only peers that
    // pick other source ports (Linux rxe hashes the QPN into it) get solved.
    if (ip.sport == wire::kRoceV2Port) return false;
    for (bool df : {true, false}) {
        ip.df = df;
        uint8_t pseudo[kPseudoLen];
        build_pseudo(pseudo, ip, udp_len, covered);
        uint16_t id;
        if (solve_ip_id(pseudo, covered + wire::kBthLen, len - wire::kBthLen - wire::kIcrcLen, want,
                        &id)) {
            if (ip_id) *ip_id = id;
            return true;
        }
    }
    return false;
}

// A FLUSH carries no payload; anything longer is not one rxe sent.
constexpr size_t kMaxLegacyLen = 64;

} // namespace

uint32_t icrc_begin(const Ipv4Header &ip, size_t udp_payload_len, const uint8_t *bth) {
    uint8_t pseudo[kPseudoLen];
    build_pseudo(pseudo, ip, udp_payload_len, bth);
    return crc32_gzip_refl(0, pseudo, kPseudoLen);
}

uint32_t icrc_update(uint32_t state, const void *data, size_t len) {
    return crc32_gzip_refl(state, static_cast<const unsigned char *>(data), len);
}

uint32_t icrc_compute(const Ipv4Header &ip, const uint8_t *pkt, size_t len) {
    return compute(ip, len, pkt, len);
}

bool icrc_verify(Ipv4Header ip, const uint8_t *pkt, size_t len, uint16_t *ip_id) {
    if (len < wire::kBthLen + wire::kIcrcLen) return false;
    return verify(ip, len, pkt, len, ip_id);
}

bool icrc_verify_flush_legacy(Ipv4Header ip, const uint8_t *pkt, size_t len) {
    if (len < wire::kBthLen + wire::kIcrcLen || len > kMaxLegacyLen) return false;
    size_t body = len - wire::kIcrcLen;
    uint8_t covered[2 * kMaxLegacyLen];
    std::memcpy(covered, pkt, body);
    std::memcpy(covered + body, pkt, len);
    return verify(ip, len, covered, body + len, nullptr);
}

} // namespace sroce
