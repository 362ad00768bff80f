// SPDX-License-Identifier: MIT
#include "icrc.hpp"

#include "wire.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <isa-l/crc.h>

namespace sroce {
namespace {

// Pseudo header: 8 x 0xFF, IPv4 (20) or IPv6 (40), UDP (8), BTH (12).
constexpr size_t kPseudoLen = 8 + wire::kIpv4HdrLen + wire::kUdpHdrLen + wire::kBthLen;
constexpr size_t kPseudoLen6 = 8 + wire::kIpv6HdrLen + wire::kUdpHdrLen + wire::kBthLen;
constexpr size_t kIpIdOffset = 8 + 4;

// Builds the masked pseudo header into p (kPseudoLen6 bytes of room);
// returns its length.
size_t build_pseudo(uint8_t *p, const IpHeader &ip, size_t udp_payload_len, const uint8_t *bth) {
    std::memset(p, 0xFF, 8);
    uint8_t *h = p + 8;
    uint8_t *u;
    if (ip.src.is_v4()) {
        h[0] = 0x45;
        h[1] = 0xFF; // TOS
        wire::put16(h + 2, uint16_t(wire::kIpv4HdrLen + wire::kUdpHdrLen + udp_payload_len));
        wire::put16(h + 4, ip.ip_id);
        wire::put16(h + 6, ip.df ? 0x4000 : 0);
        h[8] = 0xFF; // TTL
        h[9] = IPPROTO_UDP;
        h[10] = h[11] = 0xFF; // header checksum
        std::memcpy(h + 12, ip.src.raw + 12, 4);
        std::memcpy(h + 16, ip.dst.raw + 12, 4);
        u = h + wire::kIpv4HdrLen;
    } else {
        // Version 6; traffic class and flow label all ones.
        h[0] = 0x6F;
        h[1] = h[2] = h[3] = 0xFF;
        wire::put16(h + 4, uint16_t(wire::kUdpHdrLen + udp_payload_len));
        h[6] = IPPROTO_UDP;
        h[7] = 0xFF; // hop limit
        std::memcpy(h + 8, ip.src.raw, 16);
        std::memcpy(h + 24, ip.dst.raw, 16);
        u = h + wire::kIpv6HdrLen;
    }
    wire::put16(u, ip.sport);
    wire::put16(u + 2, ip.dport);
    wire::put16(u + 4, uint16_t(wire::kUdpHdrLen + udp_payload_len));
    u[6] = u[7] = 0xFF; // UDP checksum
    uint8_t *b = u + wire::kUdpHdrLen;
    std::memcpy(b, bth, wire::kBthLen);
    b[4] = 0xFF; // resv8a (FECN/BECN)
    return size_t(b + wire::kBthLen - p);
}

// CRC-32 is linear: two datagrams of the same length whose covered bytes
// differ by a pattern e have ICRCs that differ by the CRC of e alone (zero
// initial register, no final XOR).  A pattern confined to the IPv4 ID and DF
// bit is a linear function of those 17 bits, so the receiver solves for the
// ID it could not see with one CRC pass plus a constant: no second pass.
constexpr uint32_t kPoly = 0xEDB88320u; // reflected: bit 31 is x^0
constexpr uint32_t kX0 = 1u << 31, kX1 = 1u << 30, kX8 = 1u << 23;

// a(x) * b(x) mod P(x), both reflected as a CRC register is.
constexpr uint32_t mul_mod(uint32_t a, uint32_t b) {
    uint32_t p = 0;
    for (uint32_t m = kX0; m; m >>= 1) {
        if (a & m) p ^= b;
        b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
    }
    return p;
}

struct Tables {
    std::array<uint32_t, 256> fwd{};   // byte-wise register step
    std::array<uint32_t, 40> x2k{};    // x^(2^k) mod P
    std::array<uint32_t, 16> id_bit{}; // register after the ID bytes with one bit set
    uint32_t df_bit = 0;               // register after the flags byte 0x40 (DF)
    constexpr Tables() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
            fwd[i] = c;
        }
        x2k[0] = kX1;
        for (size_t k = 1; k < x2k.size(); k++)
            x2k[k] = mul_mod(x2k[k - 1], x2k[k - 1]);
        for (int j = 0; j < 16; j++) {
            uint8_t hi = uint8_t((1u << j) >> 8), lo = uint8_t(1u << j);
            uint32_t s = fwd[hi];
            id_bit[size_t(j)] = (s >> 8) ^ fwd[(s ^ lo) & 0xFF];
        }
        df_bit = fwd[0x40];
    }
};
constexpr Tables kT;

// x^(8n) mod P: what n zero bytes do to a register.
uint32_t zero_bytes(size_t n) {
    uint32_t r = kX0;
    uint64_t e = uint64_t(n) << 3;
    for (size_t k = 0; e; k++, e >>= 1)
        if (e & 1) r = mul_mod(r, kT.x2k[k]);
    return r;
}

// x^(8n) mod P for the lengths a packet has: a table, since the sender
// corrects and the receiver checks an ID on every packet of a connected
// socket (icrc_id_delta).
constexpr size_t kZeroTable = 4096 + 512;
const std::array<uint32_t, kZeroTable> &zero_table() {
    static const auto t = [] {
        std::array<uint32_t, kZeroTable> z{};
        z[0] = kX0;
        for (size_t i = 1; i < kZeroTable; i++)
            z[i] = mul_mod(z[i - 1], kX8);
        return z;
    }();
    return t;
}

// a(x) * x mod P.
constexpr uint32_t times_x(uint32_t a) {
    return (a & 1) ? (a >> 1) ^ kPoly : a >> 1;
}

// The ICRC change each unknown bit causes, ID bits 0-15 then DF, given
// after_df, what the covered bytes after the flags byte do to a register.
// One multiplication, for the DF bit,
// the last of them on the wire; each bit before it changes the ICRC by x
// times what the bit after it does (CRC-32 is linear): ID bit 7 is seven
// bits before DF (bit 6 of the flags byte), bits 6..0 of the ID's low byte
// come before it one by one, and before them bits 15..8 (the high byte).
constexpr void bit_changes_after(uint32_t after_df, uint32_t *change) {
    uint32_t v = mul_mod(kT.df_bit, after_df);
    change[16] = v;
    for (int k = 0; k < 7; k++)
        v = times_x(v);
    for (int j = 7; j >= 0; j--) {
        change[j] = v;
        v = times_x(v);
    }
    for (int j = 15; j >= 8; j--) {
        change[j] = v;
        v = times_x(v);
    }
}

// The same with one multiplication per bit, as the bits are defined: checks
// the order above.
constexpr bool bit_changes_agree(uint32_t after_df) {
    uint32_t change[17] = {};
    bit_changes_after(after_df, change);
    uint32_t after_id = mul_mod(after_df, kX8);
    for (size_t j = 0; j < 16; j++)
        if (change[j] != mul_mod(kT.id_bit[j], after_id)) return false;
    return change[16] == mul_mod(kT.df_bit, after_df);
}
static_assert(bit_changes_agree(kX0) && bit_changes_agree(kX8) && bit_changes_agree(0x12345678u));

void bit_changes(size_t covered_len, uint32_t *change) {
    size_t tail = covered_len - kIpIdOffset - 3;
    bit_changes_after(tail < kZeroTable ? zero_table()[tail] : zero_bytes(tail), change);
}

// The ICRC change each unknown bit causes (ID bits 0-15, then DF), reduced
// to an echelon form so that any change decomposes in at most 17 steps.
// It depends only on how many covered bytes follow the ID: kept per thread
// for the last length seen, as consecutive packets mostly share it.
struct IdSolver {
    size_t covered = 0;
    int nbits = 0;
    uint32_t vec[32] = {};  // pivot vectors by their highest bit (0: none)
    uint32_t mask[32] = {}; // the unknown bits each one combines

    void build(size_t covered_len, int bits) {
        covered = covered_len;
        nbits = bits;
        std::fill(std::begin(vec), std::end(vec), 0u);
        uint32_t change[17];
        bit_changes(covered_len, change);
        for (int j = 0; j < bits; j++) {
            uint32_t v = change[j];
            uint32_t m = 1u << j;
            while (v) {
                int hb = 31 - __builtin_clz(v);
                if (!vec[hb]) {
                    vec[hb] = v;
                    mask[hb] = m;
                    break;
                }
                v ^= vec[hb];
                m ^= mask[hb];
            }
        }
    }
    // The unknown bits that turn the ICRC by `delta`, if any do.
    bool solve(uint32_t delta, uint32_t *bits) const {
        uint32_t m = 0;
        while (delta) {
            int hb = 31 - __builtin_clz(delta);
            if (!vec[hb]) return false;
            delta ^= vec[hb];
            m ^= mask[hb];
        }
        *bits = m;
        return true;
    }
};

// The ICRC over `covered` (whose last 4 bytes are the ICRC field) for a
// datagram whose UDP payload is udp_len bytes: the two differ only for the
// legacy FLUSH form, which covers more than it carries.
uint32_t compute(const IpHeader &ip, size_t udp_len, const uint8_t *covered, size_t len) {
    uint8_t pseudo[kPseudoLen6];
    size_t n = build_pseudo(pseudo, ip, udp_len, covered);
    uint32_t s = crc32_gzip_refl(0, pseudo, n);
    return crc32_gzip_refl(s, covered + wire::kBthLen, len - wire::kBthLen - wire::kIcrcLen);
}

bool verify(IpHeader ip, size_t udp_len, const uint8_t *covered, size_t len, uint16_t *ip_id,
            int32_t likely_id, int likely_count, int likely_behind) {
    uint32_t want = icrc_load(covered + len - wire::kIcrcLen);
    if (!ip.src.is_v4()) {
        // Nothing covered is hidden from the receiver: no ID to solve for,
        // and the one expected is as good as any.
        if (ip_id) *ip_id = ip.ip_id;
        return compute(ip, udp_len, covered, len) == want;
    }
    bool sroce = ip.sport == wire::kRoceV2Port;
    // A position past what one send holds cannot be a sroce packet's ID.
    if (sroce && ip.ip_id >= wire::kMaxSegments) ip.ip_id = 0;
    const uint16_t expected = ip.ip_id;
    ip.df = true;
    uint32_t got = compute(ip, udp_len, covered, len);
    if (got == want) {
        if (ip_id) *ip_id = expected;
        return true;
    }
    size_t n = kPseudoLen + len - wire::kBthLen - wire::kIcrcLen;
    // The IDs ahead first: one the receive path reordered is the exception.
    for (int i = 0; likely_id >= 0 && i < likely_count + likely_behind; i++) {
        uint16_t id = uint16_t(likely_id + (i < likely_count ? i : likely_count - 1 - i));
        if ((got ^ want) == icrc_id_delta(n - kIpIdOffset - 2, uint16_t(expected ^ id))) {
            if (ip_id) *ip_id = id;
            return true;
        }
    }
    // sroce's device sockets (source port 4791) send DF, and an ID that is
    // the datagram's position in its segmentation-offload send, below
    // kMaxSegments (wire-protocol.md §4.3): 6 free bits, not 17, so corrupted
    // packets do not pass.  Other ports (sroce's connected sockets, whose
    // likely IDs did not match; Linux rxe, which hashes the QPN into its
    // source port) may send any ID, with DF set or clear.
    constexpr int kSegmentBits = std::countr_zero(unsigned(wire::kMaxSegments));
    int bits = sroce ? kSegmentBits : 17;
    thread_local IdSolver solver;
    if (solver.covered != n || solver.nbits != bits) solver.build(n, bits);
    uint32_t m;
    if (!solver.solve(got ^ want, &m)) return false;
    if (ip_id) *ip_id = uint16_t(expected ^ m);
    return true;
}

// A FLUSH carries no payload; anything longer is not one rxe sent.
constexpr size_t kMaxLegacyLen = 64;

} // namespace

uint32_t icrc_id_delta(size_t tail, uint16_t id_xor) {
    if (!id_xor) return 0;
    // The register the two ID bytes leave from a zero one, carried through
    // the bytes after them.
    uint32_t r = kT.fwd[id_xor >> 8];
    r = (r >> 8) ^ kT.fwd[(r ^ id_xor) & 0xFF];
    return mul_mod(r, tail < kZeroTable ? zero_table()[tail] : zero_bytes(tail));
}

uint32_t icrc_begin(const IpHeader &ip, size_t udp_payload_len, const uint8_t *bth) {
    uint8_t pseudo[kPseudoLen6];
    size_t n = build_pseudo(pseudo, ip, udp_payload_len, bth);
    return crc32_gzip_refl(0, pseudo, n);
}

uint32_t icrc_update(uint32_t state, const void *data, size_t len) {
    return crc32_gzip_refl(state, static_cast<const unsigned char *>(data), len);
}

uint32_t icrc_copy(uint32_t state, void *dst, const void *src, size_t len) {
    // Chunks well inside L1, so the CRC never goes back to memory.
    constexpr size_t kChunk = 4096;
    auto *d = static_cast<unsigned char *>(dst);
    auto *s = static_cast<const unsigned char *>(src);
    for (size_t off = 0; off < len; off += kChunk) {
        size_t n = std::min(kChunk, len - off);
        std::memcpy(d + off, s + off, n);
        state = crc32_gzip_refl(state, d + off, n);
    }
    return state;
}

uint32_t icrc_compute(const IpHeader &ip, const uint8_t *pkt, size_t len) {
    return compute(ip, len, pkt, len);
}

bool icrc_verify(IpHeader ip, const uint8_t *pkt, size_t len, uint16_t *ip_id, int32_t likely_id,
                 int likely_count, int likely_behind) {
    if (len < wire::kBthLen + wire::kIcrcLen) return false;
    return verify(ip, len, pkt, len, ip_id, likely_id, likely_count, likely_behind);
}

bool icrc_verify_flush_legacy(IpHeader ip, const uint8_t *pkt, size_t len, uint16_t *ip_id) {
    if (len < wire::kBthLen + wire::kIcrcLen || len > kMaxLegacyLen) return false;
    size_t body = len - wire::kIcrcLen;
    uint8_t covered[2 * kMaxLegacyLen];
    std::memcpy(covered, pkt, body);
    std::memcpy(covered + body, pkt, len);
    return verify(ip, len, covered, body + len, ip_id, -1, 0, 0);
}

} // namespace sroce
