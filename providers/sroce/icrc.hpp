// SPDX-License-Identifier: MIT
//
// Invariant CRC of RoCEv2 packets (IBTA Annex A17).
//
// The ICRC is a CRC-32 over 8 bytes of 0xFF, the IP and UDP headers and the
// transport packet, with the fields routers may change replaced by ones: in
// IPv4 the TOS, TTL and header checksum, in IPv6 the traffic class, flow
// label and hop limit; the UDP checksum and the BTH resv8a byte in both.
// It is stored little-endian.
#pragma once

#include "inet.hpp"

#include <cstddef>
#include <cstdint>

namespace sroce {

// What a UDP socket tells us, or decides for us, about the IP header: an
// IPv6 one when the addresses are IPv6, else IPv4.
struct IpHeader {
    IpAddr src;
    IpAddr dst;
    uint16_t sport; // host order
    uint16_t dport;
    // IPv4 only.  Linux writes 0 for a DF datagram sent from an unconnected
    // socket, and 0, 1, 2, ... for the datagrams it cuts one UDP_SEGMENT
    // send into.  IPv6 has neither field.
    uint16_t ip_id = 0;
    bool df = true;
};

// CRC state after the masked pseudo headers and the (masked) BTH; continue it
// over the rest of the transport packet with icrc_update() and finish with
// icrc_final().  udp_payload_len includes the ICRC itself.
uint32_t icrc_begin(const IpHeader &ip, size_t udp_payload_len, const uint8_t *bth);
uint32_t icrc_update(uint32_t state, const void *data, size_t len);
// Copies len bytes to dst and continues the CRC over them, in one pass over
// the source (the CRC reads the copy while it is still in cache).
uint32_t icrc_copy(uint32_t state, void *dst, const void *src, size_t len);
inline uint32_t icrc_final(uint32_t state) {
    return state;
}

// How the ICRC of a datagram changes when its IP ID changes by `id_xor` (the
// old ID XOR the new one): CRC-32 is linear, so the change depends only on
// that and on `tail`, the covered bytes after the ID (icrc_id_tail).  A
// table lookup and one carry-less product, no pass over the packet.
uint32_t icrc_id_delta(size_t tail, uint16_t id_xor);
// `tail` for a datagram of udp_payload_len bytes (ICRC included): the
// pseudo header's 34 bytes after the ID, the rest of the payload but the ICRC.
constexpr size_t icrc_id_tail(size_t udp_payload_len) {
    return udp_payload_len + 18;
}

// ICRC of a whole datagram whose last 4 bytes are the ICRC field.
uint32_t icrc_compute(const IpHeader &ip, const uint8_t *pkt, size_t len);

inline uint32_t icrc_load(const uint8_t *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline void icrc_store(uint8_t *p, uint32_t v) {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}

// Verifies a received datagram.  Over IPv6 every covered field is known to
// the receiver.  Over IPv4, a receiver behind a UDP socket cannot see
// the sender's IP ID or DF bit, so `ip.ip_id` is the ID expected: a
// datagram's position in a coalesced receive (UDP_GRO), which is its position
// in the sender's segmentation-offload send, else 0.  A mismatch is solved
// for in constant time (CRC-32 is linear in the unknown bits): sroce's device
// sockets (UDP source port 4791) send DF and an ID below wire::kMaxSegments,
// so they get 6 free bits and about 2^-26 of undetected corruption on that
// path; other ports (sroce's connected sockets, Linux rxe) any ID with DF set
// or clear (2^-15).  The expected ID alone
// keeps the full 2^-32.  Returns true when the ICRC is valid; *ip_id gets
// the ID used.  `likely_id`, when not negative, the likely_count - 1 IDs
// after it and the likely_behind IDs before it are IDs the caller expects
// too (the next of a connected socket's counter, or one a little older that
// the receive path reordered: design.md §7.4), checked in that order,
// each in constant time and at full strength, before solving.
bool icrc_verify(IpHeader ip, const uint8_t *pkt, size_t len, uint16_t *ip_id = nullptr,
                 int32_t likely_id = -1, int likely_count = 1, int likely_behind = 0);

// Linux rxe from 6.2 on gives FLUSH no payload offset in its opcode table, so
// the ICRC it sends and expects for a FLUSH continues, after the standard
// coverage, over the packet's bytes before the ICRC a second time (BTH
// unmasked).  Verifies a FLUSH datagram in that form, with the same IP ID
// rules as icrc_verify (wire-protocol.md §4.4).
bool icrc_verify_flush_legacy(IpHeader ip, const uint8_t *pkt, size_t len,
                              uint16_t *ip_id = nullptr);

} // namespace sroce
