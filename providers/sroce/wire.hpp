// SPDX-License-Identifier: MIT
//
// RoCEv2 wire codec: IBTA base and extended transport headers.
//
// Header-only so the per-packet path inlines it.  Every accessor works on raw
// bytes in network order: a received packet is untrusted input, so nothing
// here casts a buffer to a struct and parse() checks every length first.
#pragma once

#include "inet.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sroce::wire {

constexpr uint16_t kRoceV2Port = 4791;
constexpr uint32_t kPsnMask = 0xFFFFFF;
constexpr uint32_t kQpnMask = 0xFFFFFF;
constexpr uint16_t kDefaultPkey = 0xFFFF;
// Packets one segmentation-offload send may carry (Linux's UDP_MAX_SEGMENTS);
// a sroce datagram's IP ID is its position in such a send, below this.
constexpr uint16_t kMaxSegments = 64;
// The largest UDP payload of one IPv4 datagram (and so of one such send).
constexpr size_t kMaxUdpPayload = 65535 - 20 - 8;

constexpr size_t kBthLen = 12;
constexpr size_t kRethLen = 16;
constexpr size_t kAethLen = 4;
constexpr size_t kAtomicEthLen = 28;
constexpr size_t kAtomicAckEthLen = 8;
constexpr size_t kImmDtLen = 4;
constexpr size_t kIethLen = 4;
constexpr size_t kFethLen = 4;
constexpr size_t kCethLen = 4;    // sroce's Commit Extended Transport Header
constexpr size_t kDethLen = 8;    // Datagram ETH: Q_Key, reserved, source QP
constexpr size_t kXrcEthLen = 4;  // XRC ETH: reserved, XRC SRQ number
constexpr size_t kCnpPadLen = 16; // the 16 reserved bytes after a CNP's BTH
constexpr size_t kIcrcLen = 4;
constexpr size_t kIpv4HdrLen = 20;
constexpr size_t kIpv6HdrLen = 40;
constexpr size_t kUdpHdrLen = 8;
// Largest transport header stack any opcode carries (BTH + XRCETH + AtomicETH).
constexpr size_t kMaxHdrLen = kBthLen + kXrcEthLen + kAtomicEthLen;
// The 40-byte GRH area in front of a UD receive buffer's payload.
constexpr size_t kGrhLen = 40;
// What a UD receive completion's SL reports of that area on RoCE: the L3
// header type as mlx5 RNICs report it there (1 IPv6, 2 IPv4), which UCX's UD
// transport reads to find the destination address in the area.
constexpr uint8_t kNetworkHdrIpv6 = 1;
constexpr uint8_t kNetworkHdrIpv4 = 2;
// Q_Keys with the high bit set are controlled (privileged); a work request
// naming one means "use the QP's own Q_Key" (IBTA 10.2.5).
constexpr uint32_t kQkeyControlled = 0x80000000u;
constexpr uint32_t kGsiQkey = 0x80010000u;
// Destination QPN of a multicast datagram (IBTA 10.5.2.2).
constexpr uint32_t kMulticastQpn = 0xFFFFFF;

inline uint16_t get16(const uint8_t *p) {
    return uint16_t(p[0] << 8 | p[1]);
}
inline uint32_t get24(const uint8_t *p) {
    return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
}
inline uint32_t get32(const uint8_t *p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
inline uint64_t get64(const uint8_t *p) {
    return uint64_t(get32(p)) << 32 | get32(p + 4);
}
inline void put16(uint8_t *p, uint16_t v) {
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
inline void put24(uint8_t *p, uint32_t v) {
    p[0] = uint8_t(v >> 16);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v);
}
inline void put32(uint8_t *p, uint32_t v) {
    put16(p, uint16_t(v >> 16));
    put16(p + 2, uint16_t(v));
}
inline void put64(uint8_t *p, uint64_t v) {
    put32(p, uint32_t(v >> 32));
    put32(p + 4, uint32_t(v));
}

// 24-bit PSN arithmetic: a - b as a signed distance.
inline int32_t psn_diff(uint32_t a, uint32_t b) {
    return int32_t((a - b) << 8) >> 8;
}
inline uint32_t psn_add(uint32_t a, uint32_t n) {
    return (a + n) & kPsnMask;
}

// Base Transport Header, 12 bytes.
//  0 opcode | 1 SE M Pad(2) TVer(4) | 2-3 P_Key | 4 FECN BECN resv6 | 5-7 DestQP
//  8 A resv7 | 9-11 PSN
namespace bth {
inline uint8_t opcode(const uint8_t *h) {
    return h[0];
}
inline bool se(const uint8_t *h) {
    return h[1] & 0x80;
}
inline bool mig(const uint8_t *h) {
    return h[1] & 0x40;
}
inline uint8_t pad(const uint8_t *h) {
    return (h[1] >> 4) & 3;
}
inline uint8_t tver(const uint8_t *h) {
    return h[1] & 0xF;
}
inline uint16_t pkey(const uint8_t *h) {
    return get16(h + 2);
}
inline uint32_t qpn(const uint8_t *h) {
    return get24(h + 5);
}
inline bool ackreq(const uint8_t *h) {
    return h[8] & 0x80;
}
inline uint32_t psn(const uint8_t *h) {
    return get24(h + 9);
}
// What an sroce end announces of itself in resv7 (wire-protocol.md §3.3.1):
// the tag, then capability bits.  Other senders leave resv7 zero.
constexpr uint8_t kAnnounceTag = 0x40;
constexpr uint8_t kAnnounceTagMask = 0x70;
constexpr uint8_t kAnnounceSelectiveRepeat = 0x01;
constexpr uint8_t kAnnounceNative = 0x02;
constexpr uint8_t kAnnounceCaps = kAnnounceSelectiveRepeat | kAnnounceNative;
// The capabilities a packet announces; 0 for an untagged resv7.
inline uint8_t announced(const uint8_t *h) {
    return (h[8] & kAnnounceTagMask) == kAnnounceTag ? uint8_t(h[8] & kAnnounceCaps) : 0;
}
inline void announce(uint8_t *h, uint8_t caps) {
    if (caps) h[8] = uint8_t((h[8] & 0x80) | kAnnounceTag | (caps & kAnnounceCaps));
}
// FECN and BECN (byte 4).  A CNP sets BECN, as RNICs send it; nothing else
// of the BTH's reserved bits carries meaning.
constexpr uint8_t kBecn = 0x40;
inline void build(uint8_t *h, uint8_t opcode, bool se, uint8_t pad, uint16_t pkey, uint32_t qpn,
                  bool ackreq, uint32_t psn) {
    h[0] = opcode;
    h[1] = uint8_t((se ? 0x80 : 0) | (pad & 3) << 4); // M=0, TVer=0, as Linux rxe
    put16(h + 2, pkey);
    h[4] = 0;
    put24(h + 5, qpn);
    h[8] = ackreq ? 0x80 : 0;
    put24(h + 9, psn);
}
} // namespace bth

// AETH syndrome: 3 bits of kind, 5 bits of value.
namespace aeth {
constexpr uint8_t kAck = 0x00;
constexpr uint8_t kRnrNak = 0x20;
constexpr uint8_t kNak = 0x60;
constexpr uint8_t kKindMask = 0xE0;
constexpr uint8_t kNakPsnSeqError = 0;
constexpr uint8_t kNakInvalidRequest = 1;
constexpr uint8_t kNakRemoteAccessError = 2;
constexpr uint8_t kNakRemoteOpError = 3;
constexpr uint8_t kNakInvalidRdRequest = 4;
// Credit count 0x1F: "invalid credit", i.e. end-to-end flow control is not used.
constexpr uint8_t kNoCredits = 0x1F;
inline void build(uint8_t *p, uint8_t syndrome, uint32_t msn) {
    p[0] = syndrome;
    put24(p + 1, msn);
}
} // namespace aeth

// Header presence bits of the opcode table.
enum HdrMask : uint16_t {
    kHasReth = 1 << 0,
    kHasAeth = 1 << 1,
    kHasAtomicEth = 1 << 2,
    kHasAtomicAckEth = 1 << 3,
    kHasImmDt = 1 << 4,
    kHasIeth = 1 << 5,
    kHasFeth = 1 << 6,
    kHasPayload = 1 << 7,
    kHasCeth = 1 << 8,
    kHasDeth = 1 << 9,
    kHasXrcEth = 1 << 10,
    kHasCnpPad = 1 << 11, // a CNP's 16 reserved bytes
};

// Role bits of the opcode table.
enum OpFlags : uint16_t {
    kOpReq = 1 << 0,  // sent by a requester
    kOpResp = 1 << 1, // sent by a responder
    kOpFirst = 1 << 2,
    kOpMiddle = 1 << 3,
    kOpLast = 1 << 4, // last packet of a message (also set for ONLY)
    kOpSend = 1 << 5,
    kOpWrite = 1 << 6,
    kOpRead = 1 << 7,
    kOpAtomic = 1 << 8,
    kOpAck = 1 << 9,
    kOpFlush = 1 << 10,
    kOpAtomicWrite = 1 << 11,
    kOpComplete = 1 << 12, // completes a message at the responder (consumes MSN)
    kOpCommit = 1 << 13,   // native write-commit (also kOpWrite)
    kOpInv = 1 << 14,      // SEND WITH INVALIDATE
    kOpCnp = 1 << 15,      // a congestion notification: neither request nor response
};

// Transport of an opcode: its top three bits (IBTA 9.2.2).
enum Transport : uint8_t {
    kTransportRc = 0,
    kTransportUc = 1,
    kTransportUd = 3,
    kTransportXrc = 5,
    kTransportVendor = 6, // manufacturer-specific space 0xC0-0xDF: RC commits, SACK
};
inline uint8_t transport_of(uint8_t opcode) {
    return opcode >> 5;
}

// RC opcodes (transport bits 000).
enum Opcode : uint8_t {
    kSendFirst = 0x00,
    kSendMiddle = 0x01,
    kSendLast = 0x02,
    kSendLastImm = 0x03,
    kSendOnly = 0x04,
    kSendOnlyImm = 0x05,
    kWriteFirst = 0x06,
    kWriteMiddle = 0x07,
    kWriteLast = 0x08,
    kWriteLastImm = 0x09,
    kWriteOnly = 0x0A,
    kWriteOnlyImm = 0x0B,
    kReadRequest = 0x0C,
    kReadRespFirst = 0x0D,
    kReadRespMiddle = 0x0E,
    kReadRespLast = 0x0F,
    kReadRespOnly = 0x10,
    kAcknowledge = 0x11,
    kAtomicAcknowledge = 0x12,
    kCompareSwap = 0x13,
    kFetchAdd = 0x14,
    kSendLastInv = 0x16,
    kSendOnlyInv = 0x17,
    kFlush = 0x1C,
    kAtomicWrite = 0x1D,
    // UC: the RC SEND/WRITE opcodes with transport bits 001.
    kUcBase = 0x20,
    // UD
    kUdSendOnly = 0x64,
    kUdSendOnlyImm = 0x65,
    // CNP: transport bits 100 (RoCEv2 annex A17).
    kCnp = 0x81,
    // XRC: the RC request and response opcodes with transport bits 101.
    kXrcBase = 0xA0,
    // Manufacturer-specific space (0xC0-0xFF): sent only to peers that
    // declared support; see docs/wire-protocol.md.
    kCommitWriteFirst = 0xC0,
    kCommitWriteMiddle = 0xC1,
    kCommitWriteLast = 0xC2,
    kCommitWriteLastImm = 0xC3,
    kCommitWriteOnly = 0xC4,
    kCommitWriteOnlyImm = 0xC5,
    // Selective repeat (wire-protocol.md §5.6.1): a cumulative ACK whose
    // payload is a bitmap of the requests held past the gap.
    kSelectiveAck = 0xC6,
};

// SELECTIVE ACKNOWLEDGE payload: the highest PSN held (24 bits after a
// reserved byte), then up to this many gaps, each a 16-bit offset of its first
// missing PSN past the acknowledged one and a 16-bit count.
constexpr uint32_t kSackMaxRanges = 4;

// CETH byte 0.
namespace ceth {
constexpr uint8_t kOrdered = 1 << 0; // persist earlier writes to the rkey before placing
constexpr uint8_t kImmed = 1 << 1;   // the message ends with immediate data
constexpr uint8_t kGlobal = 1 << 2;  // global visibility instead of persistence
} // namespace ceth

struct OpInfo {
    const char *name; // nullptr: opcode not supported
    uint16_t hdrs;    // HdrMask
    uint16_t flags;   // OpFlags
    uint8_t hdr_len;  // BTH + extended headers
    // Offsets from the start of the BTH; 0 when absent.
    uint8_t reth, aeth, atomic_eth, atomic_ack_eth, immdt, ieth, feth, ceth, deth, xrceth;
};

const OpInfo &op_info(uint8_t opcode);

// A parsed, bounds-checked view of one received RoCEv2 datagram (UDP payload).
struct Packet {
    const uint8_t *hdr = nullptr; // BTH
    size_t len = 0;               // whole UDP payload including ICRC
    const OpInfo *info = nullptr;
    uint8_t opcode = 0;
    uint32_t qpn = 0;
    uint32_t psn = 0;
    bool ackreq = false;
    bool se = false;
    const uint8_t *payload = nullptr;
    uint32_t payload_len = 0; // without pad and ICRC
    IpAddr src_addr;          // sender's address, set by the receiver
    IpAddr dst_addr;          // the address it was sent to: the device's or a multicast group's
    uint16_t src_port = 0;    // sender's UDP port (host order)
    bool legacy_icrc = false; // a FLUSH whose ICRC has Linux rxe's form (icrc.hpp)
    // Of its IP header, for a UD receive's GRH: what the port reports, and
    // over IPv4 the ID its ICRC was verified with.
    IpFields ip;
    uint16_t ip_id = 0;

    // The RC opcode of the same operation for UC and XRC packets (whose
    // opcodes differ only in the transport bits), so the transport roles
    // handle one set of opcodes.
    uint8_t rc_opcode() const {
        uint8_t t = transport_of(opcode);
        return (t == kTransportUc || t == kTransportXrc) ? uint8_t(opcode & 0x1F) : opcode;
    }

    uint64_t va() const { return get64(hdr + info->reth); }
    uint32_t rkey() const { return get32(hdr + info->reth + 8); }
    uint32_t dma_len() const { return get32(hdr + info->reth + 12); }
    uint8_t syndrome() const { return hdr[info->aeth]; }
    uint32_t msn() const { return get24(hdr + info->aeth + 1); }
    uint64_t atomic_va() const { return get64(hdr + info->atomic_eth); }
    uint32_t atomic_rkey() const { return get32(hdr + info->atomic_eth + 8); }
    uint64_t swap_add() const { return get64(hdr + info->atomic_eth + 12); }
    uint64_t compare() const { return get64(hdr + info->atomic_eth + 20); }
    uint64_t orig() const { return get64(hdr + info->atomic_ack_eth); }
    uint32_t imm() const { return get32(hdr + info->immdt); } // kept in network order by caller
    uint32_t ieth() const { return get32(hdr + info->ieth); }
    uint32_t feth() const { return get32(hdr + info->feth); }
    uint8_t ceth() const { return hdr[info->ceth]; }
    uint32_t qkey() const { return get32(hdr + info->deth); }
    uint32_t src_qpn() const { return get24(hdr + info->deth + 5); }
    uint32_t xrc_srqn() const { return get24(hdr + info->xrceth + 1); }
};

enum class ParseError {
    kOk = 0,
    kTooShort,
    kBadOpcode,
    kBadVersion,
    kBadLength,
};

const char *parse_error_str(ParseError e);

// Bounds-checks and decodes a datagram; the ICRC is verified separately.
ParseError parse(const uint8_t *data, size_t len, Packet &pkt);

} // namespace sroce::wire
