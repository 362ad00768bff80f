// SPDX-License-Identifier: MIT
//
// The RC opcode table: which headers each opcode carries and at what offsets.
#include "wire.hpp"

#include <array>

namespace sroce::wire {
namespace {

constexpr OpInfo make(const char *name, uint16_t hdrs, uint16_t flags) {
    OpInfo o{name, hdrs, flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    // IBTA fixes the order of extended headers: XRCETH or DETH right after
    // the BTH, then RETH/AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.  FLUSH
    // carries FETH before RETH.
    uint8_t off = kBthLen;
    if (hdrs & kHasXrcEth) {
        o.xrceth = off;
        off += kXrcEthLen;
    }
    if (hdrs & kHasDeth) {
        o.deth = off;
        off += kDethLen;
    }
    if (hdrs & kHasFeth) {
        o.feth = off;
        off += kFethLen;
    }
    if (hdrs & kHasReth) {
        o.reth = off;
        off += kRethLen;
    }
    if (hdrs & kHasCeth) {
        o.ceth = off;
        off += kCethLen;
    }
    if (hdrs & kHasAtomicEth) {
        o.atomic_eth = off;
        off += kAtomicEthLen;
    }
    if (hdrs & kHasAeth) {
        o.aeth = off;
        off += kAethLen;
    }
    if (hdrs & kHasAtomicAckEth) {
        o.atomic_ack_eth = off;
        off += kAtomicAckEthLen;
    }
    if (hdrs & kHasImmDt) {
        o.immdt = off;
        off += kImmDtLen;
    }
    if (hdrs & kHasIeth) {
        o.ieth = off;
        off += kIethLen;
    }
    if (hdrs & kHasCnpPad) off += kCnpPadLen;
    o.hdr_len = off;
    return o;
}

// The RC operation `rc` on another transport, which adds the headers `extra`.
constexpr OpInfo on_transport(const OpInfo &rc, const char *name, uint16_t extra) {
    return make(name, uint16_t(rc.hdrs | extra), rc.flags);
}

constexpr uint16_t P = kHasPayload;
constexpr uint16_t RQ = kOpReq, RS = kOpResp, F = kOpFirst, M = kOpMiddle, L = kOpLast,
                   C = kOpComplete;

constexpr std::array<OpInfo, 256> build_table() {
    std::array<OpInfo, 256> t{};
    t[kSendFirst] = make("SEND_FIRST", P, RQ | kOpSend | F);
    t[kSendMiddle] = make("SEND_MIDDLE", P, RQ | kOpSend | M);
    t[kSendLast] = make("SEND_LAST", P, RQ | kOpSend | L | C);
    t[kSendLastImm] = make("SEND_LAST_WITH_IMMEDIATE", P | kHasImmDt, RQ | kOpSend | L | C);
    t[kSendOnly] = make("SEND_ONLY", P, RQ | kOpSend | F | L | C);
    t[kSendOnlyImm] = make("SEND_ONLY_WITH_IMMEDIATE", P | kHasImmDt, RQ | kOpSend | F | L | C);
    t[kWriteFirst] = make("RDMA_WRITE_FIRST", P | kHasReth, RQ | kOpWrite | F);
    t[kWriteMiddle] = make("RDMA_WRITE_MIDDLE", P, RQ | kOpWrite | M);
    t[kWriteLast] = make("RDMA_WRITE_LAST", P, RQ | kOpWrite | L | C);
    t[kWriteLastImm] = make("RDMA_WRITE_LAST_WITH_IMMEDIATE", P | kHasImmDt, RQ | kOpWrite | L | C);
    t[kWriteOnly] = make("RDMA_WRITE_ONLY", P | kHasReth, RQ | kOpWrite | F | L | C);
    t[kWriteOnlyImm] =
        make("RDMA_WRITE_ONLY_WITH_IMMEDIATE", P | kHasReth | kHasImmDt, RQ | kOpWrite | F | L | C);
    t[kReadRequest] = make("RDMA_READ_REQUEST", kHasReth, RQ | kOpRead | F | L | C);
    t[kReadRespFirst] = make("RDMA_READ_RESPONSE_FIRST", P | kHasAeth, RS | kOpRead | F);
    t[kReadRespMiddle] = make("RDMA_READ_RESPONSE_MIDDLE", P, RS | kOpRead | M);
    t[kReadRespLast] = make("RDMA_READ_RESPONSE_LAST", P | kHasAeth, RS | kOpRead | L);
    t[kReadRespOnly] = make("RDMA_READ_RESPONSE_ONLY", P | kHasAeth, RS | kOpRead | F | L);
    t[kAcknowledge] = make("ACKNOWLEDGE", kHasAeth, RS | kOpAck | F | L);
    t[kAtomicAcknowledge] =
        make("ATOMIC_ACKNOWLEDGE", kHasAeth | kHasAtomicAckEth, RS | kOpAtomic | F | L);
    t[kCompareSwap] = make("COMPARE_SWAP", kHasAtomicEth, RQ | kOpAtomic | F | L | C);
    t[kFetchAdd] = make("FETCH_ADD", kHasAtomicEth, RQ | kOpAtomic | F | L | C);
    t[kSendLastInv] =
        make("SEND_LAST_WITH_INVALIDATE", P | kHasIeth, RQ | kOpSend | kOpInv | L | C);
    t[kSendOnlyInv] =
        make("SEND_ONLY_WITH_INVALIDATE", P | kHasIeth, RQ | kOpSend | kOpInv | F | L | C);
    t[kFlush] = make("FLUSH", kHasFeth | kHasReth, RQ | kOpFlush | F | L | C);
    t[kAtomicWrite] = make("ATOMIC_WRITE", P | kHasReth, RQ | kOpAtomicWrite | F | L | C);
    constexpr uint16_t CW = RQ | kOpWrite | kOpCommit;
    t[kCommitWriteFirst] = make("COMMIT_WRITE_FIRST", P | kHasReth | kHasCeth, CW | F);
    t[kCommitWriteMiddle] = make("COMMIT_WRITE_MIDDLE", P, CW | M);
    t[kCommitWriteLast] = make("COMMIT_WRITE_LAST", P, CW | L | C);
    t[kCommitWriteLastImm] = make("COMMIT_WRITE_LAST_WITH_IMMEDIATE", P | kHasImmDt, CW | L | C);
    t[kCommitWriteOnly] = make("COMMIT_WRITE_ONLY", P | kHasReth | kHasCeth, CW | F | L | C);
    t[kCommitWriteOnlyImm] = make("COMMIT_WRITE_ONLY_WITH_IMMEDIATE",
                                  P | kHasReth | kHasCeth | kHasImmDt, CW | F | L | C);
    t[kSelectiveAck] = make("SELECTIVE_ACKNOWLEDGE", P | kHasAeth, RS | kOpAck | F | L);
    // UC carries SEND and RDMA WRITE only (IBTA 9.2.2, table 38).
    constexpr const char *kUcNames[12] = {
        "UC_SEND_FIRST",       "UC_SEND_MIDDLE",
        "UC_SEND_LAST",        "UC_SEND_LAST_WITH_IMMEDIATE",
        "UC_SEND_ONLY",        "UC_SEND_ONLY_WITH_IMMEDIATE",
        "UC_RDMA_WRITE_FIRST", "UC_RDMA_WRITE_MIDDLE",
        "UC_RDMA_WRITE_LAST",  "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        "UC_RDMA_WRITE_ONLY",  "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"};
    for (uint8_t op = kSendFirst; op <= kWriteOnlyImm; op++)
        t[kUcBase | op] = on_transport(t[op], kUcNames[op], 0);
    t[kUdSendOnly] = make("UD_SEND_ONLY", P | kHasDeth, RQ | kOpSend | F | L | C);
    t[kUdSendOnlyImm] =
        make("UD_SEND_ONLY_WITH_IMMEDIATE", P | kHasDeth | kHasImmDt, RQ | kOpSend | F | L | C);
    // Congestion notification (RoCEv2 annex A17): BTH, 16 reserved bytes, ICRC.
    t[kCnp] = make("CNP", kHasCnpPad, kOpCnp);
    // XRC: every RC opcode but FLUSH/ATOMIC WRITE; requests carry an XRCETH.
    constexpr const char *kXrcNames[0x18] = {"XRC_SEND_FIRST",
                                             "XRC_SEND_MIDDLE",
                                             "XRC_SEND_LAST",
                                             "XRC_SEND_LAST_WITH_IMMEDIATE",
                                             "XRC_SEND_ONLY",
                                             "XRC_SEND_ONLY_WITH_IMMEDIATE",
                                             "XRC_RDMA_WRITE_FIRST",
                                             "XRC_RDMA_WRITE_MIDDLE",
                                             "XRC_RDMA_WRITE_LAST",
                                             "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
                                             "XRC_RDMA_WRITE_ONLY",
                                             "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
                                             "XRC_RDMA_READ_REQUEST",
                                             "XRC_RDMA_READ_RESPONSE_FIRST",
                                             "XRC_RDMA_READ_RESPONSE_MIDDLE",
                                             "XRC_RDMA_READ_RESPONSE_LAST",
                                             "XRC_RDMA_READ_RESPONSE_ONLY",
                                             "XRC_ACKNOWLEDGE",
                                             "XRC_ATOMIC_ACKNOWLEDGE",
                                             "XRC_COMPARE_SWAP",
                                             "XRC_FETCH_ADD",
                                             nullptr,
                                             "XRC_SEND_LAST_WITH_INVALIDATE",
                                             "XRC_SEND_ONLY_WITH_INVALIDATE"};
    for (uint8_t op = 0; op < 0x18; op++) {
        if (!kXrcNames[op]) continue;
        bool req = t[op].flags & kOpReq;
        t[kXrcBase | op] = on_transport(t[op], kXrcNames[op], req ? kHasXrcEth : 0);
    }
    return t;
}

constexpr std::array<OpInfo, 256> kTable = build_table();

static_assert(kTable[kWriteOnlyImm].hdr_len == kBthLen + kRethLen + kImmDtLen);
static_assert(kTable[kAtomicAcknowledge].hdr_len == kBthLen + kAethLen + kAtomicAckEthLen);
static_assert(kTable[kCompareSwap].hdr_len == kBthLen + kAtomicEthLen);
static_assert(kTable[kCnp].hdr_len == kBthLen + kCnpPadLen);
static_assert(kTable[kFlush].reth == kBthLen + kFethLen);
static_assert(kTable[kCommitWriteOnlyImm].ceth == kBthLen + kRethLen);
static_assert(kTable[kCommitWriteOnlyImm].immdt == kBthLen + kRethLen + kCethLen);
static_assert(kTable[kUdSendOnlyImm].hdr_len == kBthLen + kDethLen + kImmDtLen);
static_assert(kTable[kXrcBase | kCompareSwap].hdr_len == kMaxHdrLen);
static_assert(kTable[kXrcBase | kWriteOnlyImm].reth == kBthLen + kXrcEthLen);
static_assert(kTable[kUcBase | kWriteOnly].hdr_len == kBthLen + kRethLen);

} // namespace

const OpInfo &op_info(uint8_t opcode) {
    return kTable[opcode];
}

const char *parse_error_str(ParseError e) {
    switch (e) {
    case ParseError::kOk:
        return "ok";
    case ParseError::kTooShort:
        return "datagram shorter than its headers";
    case ParseError::kBadOpcode:
        return "unsupported opcode";
    case ParseError::kBadVersion:
        return "unsupported transport header version";
    case ParseError::kBadLength:
        return "payload length inconsistent with opcode";
    }
    return "?";
}

ParseError parse(const uint8_t *data, size_t len, Packet &pkt) {
    if (len < kBthLen + kIcrcLen) return ParseError::kTooShort;
    const OpInfo &info = kTable[data[0]];
    if (!info.name) return ParseError::kBadOpcode;
    if (bth::tver(data) != 0) return ParseError::kBadVersion;
    if (len < size_t(info.hdr_len) + kIcrcLen) return ParseError::kTooShort;
    size_t body = len - info.hdr_len - kIcrcLen;
    uint8_t pad = bth::pad(data);
    if (!(info.hdrs & kHasPayload)) {
        if (body != 0 || pad != 0) return ParseError::kBadLength;
    } else {
        if (pad > body || (body & 3) != 0) return ParseError::kBadLength;
        // Only a message's last packet may be padded.
        if (pad && !(info.flags & kOpLast)) return ParseError::kBadLength;
    }
    pkt.hdr = data;
    pkt.len = len;
    pkt.info = &info;
    pkt.opcode = data[0];
    pkt.qpn = bth::qpn(data);
    pkt.psn = bth::psn(data);
    pkt.ackreq = bth::ackreq(data);
    pkt.se = bth::se(data);
    pkt.payload = data + info.hdr_len;
    pkt.payload_len = uint32_t(body - pad);
    return ParseError::kOk;
}

} // namespace sroce::wire
