// SPDX-License-Identifier: MIT
//
// Wire codec of the InfiniBand Communication Manager (IBTA vol. 1 ch. 12)
// as RoCE carries it: 256-byte MADs on QP1, the CM messages' fields at
// their bit positions, and the rdma_cm header Linux puts in front of a
// REQ's private data.  Header-only and bounds-checked like wire.hpp: a MAD
// is untrusted input, so fields are read from bytes, never by casting.
#pragma once

#include "inet.hpp"
#include "wire.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sroce::cm {

using wire::get16;
using wire::get32;
using wire::get64;
using wire::put16;
using wire::put32;
using wire::put64;

constexpr size_t kMadLen = 256;
constexpr size_t kMadHdrLen = 24;
constexpr size_t kCmDataLen = kMadLen - kMadHdrLen; // 232
constexpr uint8_t kBaseVersion = 1;
constexpr uint8_t kCmClass = 0x07;
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;

// CM attribute IDs (IBTA table 100).
enum Attr : uint16_t {
    kClassPortInfo = 0x0001,
    kReq = 0x0010,
    kMra = 0x0011,
    kRej = 0x0012,
    kRep = 0x0013,
    kRtu = 0x0014,
    kDreq = 0x0015,
    kDrep = 0x0016,
    kSidrReq = 0x0017,
    kSidrRep = 0x0018,
    kLap = 0x0019,
    kApr = 0x001A,
};

// The MAD header (IBTA 13.4.3).
struct MadHdr {
    uint8_t base_version = kBaseVersion, mgmt_class = kCmClass, class_version = kCmClassVersion;
    uint8_t method = kMethodSend;
    uint16_t status = 0, class_specific = 0;
    uint64_t tid = 0;
    uint16_t attr_id = 0;
    uint32_t attr_mod = 0;

    void store(uint8_t *p) const {
        p[0] = base_version;
        p[1] = mgmt_class;
        p[2] = class_version;
        p[3] = method;
        put16(p + 4, status);
        put16(p + 6, class_specific);
        put64(p + 8, tid);
        put16(p + 16, attr_id);
        put16(p + 18, 0);
        put32(p + 20, attr_mod);
    }
    void load(const uint8_t *p) {
        base_version = p[0];
        mgmt_class = p[1];
        class_version = p[2];
        method = p[3];
        status = get16(p + 4);
        class_specific = get16(p + 6);
        tid = get64(p + 8);
        attr_id = get16(p + 16);
        attr_mod = get32(p + 20);
    }
};

// A field of a CM message body: `width` bits starting `bit` bits below the
// most significant bit of byte `byte` (IBTA numbers bits from the MSB),
// big-endian, at most 64 bits.  Byte offsets count from the end of the MAD
// header.
struct Field {
    uint16_t byte;
    uint8_t bit, width;
};

constexpr bool fits(Field f) {
    return f.width >= 1 && f.width <= 64 && f.bit < 8 &&
           size_t(f.byte) * 8 + f.bit + f.width <= kCmDataLen * 8;
}

inline uint64_t get(const uint8_t *body, Field f) {
    uint64_t v = 0;
    for (unsigned i = 0; i < f.width; i++) {
        unsigned pos = unsigned(f.byte) * 8 + f.bit + i;
        v = v << 1 | ((body[pos / 8] >> (7 - pos % 8)) & 1);
    }
    return v;
}

inline void set(uint8_t *body, Field f, uint64_t v) {
    for (unsigned i = 0; i < f.width; i++) {
        unsigned pos = unsigned(f.byte) * 8 + f.bit + i;
        uint8_t mask = uint8_t(1u << (7 - pos % 8));
        bool b = (v >> (f.width - 1 - i)) & 1;
        body[pos / 8] = uint8_t(b ? body[pos / 8] | mask : body[pos / 8] & ~mask);
    }
}

// Every connected-mode message but REQ starts with the sender's and the
// receiver's communication IDs.
constexpr Field kLocalCommId{0, 0, 32}, kRemoteCommId{4, 0, 32};

// REQ (IBTA table 106).
namespace req {
constexpr Field kLocalCommId{0, 0, 32}, kVendorId{5, 0, 24}, kServiceId{8, 0, 64},
    kLocalCaGuid{16, 0, 64}, kLocalQkey{28, 0, 32}, kLocalQpn{32, 0, 24},
    kResponderResources{35, 0, 8}, kLocalEecn{36, 0, 24}, kInitiatorDepth{39, 0, 8},
    kRemoteEecn{40, 0, 24}, kRemoteCmResponseTimeout{43, 0, 5}, kTransportServiceType{43, 5, 2},
    kEndToEndFlowControl{43, 7, 1}, kStartingPsn{44, 0, 24}, kLocalCmResponseTimeout{47, 0, 5},
    kRetryCount{47, 5, 3}, kPartitionKey{48, 0, 16}, kPathMtu{50, 0, 4}, kRdcExists{50, 4, 1},
    kRnrRetryCount{50, 5, 3}, kMaxCmRetries{51, 0, 4}, kSrq{51, 4, 1},
    kExtendedTransportType{51, 5, 3}, kPrimaryLocalLid{52, 0, 16}, kPrimaryRemoteLid{54, 0, 16},
    kPrimaryFlowLabel{88, 0, 20}, kPrimaryPacketRate{91, 2, 6}, kPrimaryTrafficClass{92, 0, 8},
    kPrimaryHopLimit{93, 0, 8}, kPrimarySl{94, 0, 4}, kPrimarySubnetLocal{94, 4, 1},
    kPrimaryLocalAckTimeout{95, 0, 5}, kAlternateLocalLid{96, 0, 16};
constexpr size_t kPrimaryLocalGid = 56, kPrimaryRemoteGid = 72; // 16 bytes each
constexpr size_t kPrivateData = 140, kPrivateDataLen = 92;
} // namespace req

// MRA (table 107).
namespace mra {
constexpr Field kMessageMraed{8, 0, 2}, kServiceTimeout{9, 0, 5};
constexpr size_t kPrivateData = 10, kPrivateDataLen = 222;
} // namespace mra

// REJ (table 108).
namespace rej {
constexpr Field kMessageRejected{8, 0, 2}, kRejectedInfoLength{9, 0, 7}, kReason{10, 0, 16};
constexpr size_t kAri = 12, kAriLen = 72, kPrivateData = 84, kPrivateDataLen = 148;
} // namespace rej

// REP (table 110).
namespace rep {
constexpr Field kLocalQkey{8, 0, 32}, kLocalQpn{12, 0, 24}, kLocalEecn{16, 0, 24},
    kStartingPsn{20, 0, 24}, kResponderResources{24, 0, 8}, kInitiatorDepth{25, 0, 8},
    kTargetAckDelay{26, 0, 5}, kFailoverAccepted{26, 5, 2}, kEndToEndFlowControl{26, 7, 1},
    kRnrRetryCount{27, 0, 3}, kSrq{27, 3, 1}, kLocalCaGuid{28, 0, 64};
// ECE's vendor ID, a byte each in the low bytes of the QPN, EECN and PSN words.
constexpr Field kVendorIdH{15, 0, 8}, kVendorIdM{19, 0, 8}, kVendorIdL{23, 0, 8};
constexpr size_t kPrivateData = 36, kPrivateDataLen = 196;
} // namespace rep

// RTU, DREQ, DREP (tables 111-113).
namespace rtu {
constexpr size_t kPrivateData = 8, kPrivateDataLen = 224;
} // namespace rtu
namespace dreq {
constexpr Field kRemoteQpn{8, 0, 24};
constexpr size_t kPrivateData = 12, kPrivateDataLen = 220;
} // namespace dreq
namespace drep {
constexpr size_t kPrivateData = 8, kPrivateDataLen = 224;
} // namespace drep

// SIDR_REQ and SIDR_REP (tables 119-120).
namespace sidr_req {
constexpr Field kRequestId{0, 0, 32}, kPartitionKey{4, 0, 16}, kServiceId{8, 0, 64};
constexpr size_t kPrivateData = 16, kPrivateDataLen = 216;
} // namespace sidr_req
namespace sidr_rep {
constexpr Field kRequestId{0, 0, 32}, kStatus{4, 0, 8}, kAddInfoLength{5, 0, 8}, kQpn{8, 0, 24},
    kServiceId{12, 0, 64}, kQkey{20, 0, 32}, kVendorIdH{6, 0, 16}, kVendorIdL{11, 0, 8};
constexpr size_t kAddInfo = 24, kAddInfoLen = 72, kPrivateData = 96, kPrivateDataLen = 136;
} // namespace sidr_rep

static_assert(fits(req::kPrimaryLocalAckTimeout) && fits(rep::kLocalCaGuid) &&
              fits(sidr_rep::kQkey));
static_assert(req::kPrivateData + req::kPrivateDataLen == kCmDataLen);
static_assert(mra::kPrivateData + mra::kPrivateDataLen == kCmDataLen);
static_assert(rej::kPrivateData + rej::kPrivateDataLen == kCmDataLen);
static_assert(rep::kPrivateData + rep::kPrivateDataLen == kCmDataLen);
static_assert(dreq::kPrivateData + dreq::kPrivateDataLen == kCmDataLen);
static_assert(sidr_req::kPrivateData + sidr_req::kPrivateDataLen == kCmDataLen);
static_assert(sidr_rep::kPrivateData + sidr_rep::kPrivateDataLen == kCmDataLen);

// The REJ reasons rdma_cm and the kernel's CM use (table 109).
enum RejReason : uint16_t {
    kRejNoQp = 1,
    kRejNoResources = 3,
    kRejTimeout = 4,
    kRejInvalidServiceId = 8,
    kRejStaleConn = 10,
    kRejInvalidGid = 12,
    kRejConsumerDefined = 28,
    kRejVendorOptionNotSupported = 35,
};

// SIDR_REP status (table 120).
enum SidrStatus : uint8_t {
    kSidrSuccess = 0,
    kSidrUnsupported = 1,
    kSidrReject = 2,
    kSidrNoQp = 3,
};

enum class ParseError {
    kOk = 0,
    kBadLength,
    kBadVersion,
    kNotCm,
    kBadMethod,
    kUnknownAttr,
};

inline const char *parse_error_str(ParseError e) {
    switch (e) {
    case ParseError::kOk:
        return "ok";
    case ParseError::kBadLength:
        return "a MAD is 256 bytes";
    case ParseError::kBadVersion:
        return "unsupported MAD base or class version";
    case ParseError::kNotCm:
        return "not a communication management MAD";
    case ParseError::kBadMethod:
        return "CM messages use method Send";
    case ParseError::kUnknownAttr:
        return "not a CM message sroce serves";
    }
    return "?";
}

// A received CM MAD: its header and a view of its 232-byte body.
struct Mad {
    MadHdr hdr;
    const uint8_t *body = nullptr;
    uint64_t field(Field f) const { return get(body, f); }
};

// Checks a MAD received on QP1 (the UD payload after the DETH): exactly
// 256 bytes, MAD base version 1, the CM class (version 2), method Send, a
// CM attribute.  Other classes are no error of the MAD itself, but not ours.
inline ParseError parse(const uint8_t *data, size_t len, Mad &mad) {
    if (len != kMadLen) return ParseError::kBadLength;
    mad.hdr.load(data);
    if (mad.hdr.base_version != kBaseVersion) return ParseError::kBadVersion;
    if (mad.hdr.mgmt_class != kCmClass) return ParseError::kNotCm;
    if (mad.hdr.class_version != kCmClassVersion) return ParseError::kBadVersion;
    if (mad.hdr.method != kMethodSend) return ParseError::kBadMethod;
    switch (mad.hdr.attr_id) {
    case kReq:
    case kMra:
    case kRej:
    case kRep:
    case kRtu:
    case kDreq:
    case kDrep:
    case kSidrReq:
    case kSidrRep:
        break;
    default:
        return ParseError::kUnknownAttr;
    }
    mad.body = data + kMadHdrLen;
    return ParseError::kOk;
}

// The rdma_cm header at the start of a REQ's (and SIDR_REQ's) private data
// for the IP port spaces, as Linux's rdma_cm writes and checks it: version
// 0, IP version in the high nibble, the source port, then the source and
// destination addresses as 16-byte fields (IPv4 in the last four bytes).
struct CmaHdr {
    static constexpr size_t kLen = 36;
    uint8_t ip_version = 4;
    uint16_t port = 0; // the source (active side's) port
    uint8_t src[16] = {}, dst[16] = {};

    void store(uint8_t *p) const {
        p[0] = 0;
        p[1] = uint8_t(ip_version << 4);
        put16(p + 2, port);
        std::memcpy(p + 4, src, 16);
        std::memcpy(p + 20, dst, 16);
    }
    // False when the header is not one rdma_cm would accept.
    bool load(const uint8_t *p, size_t len) {
        if (len < kLen || p[0] != 0) return false;
        ip_version = p[1] >> 4;
        if (ip_version != 4 && ip_version != 6) return false;
        port = get16(p + 2);
        std::memcpy(src, p + 4, 16);
        std::memcpy(dst, p + 20, 16);
        return true;
    }
    // IP version 4 when both are IPv4 (unmapped: zeros, then the address),
    // else 6.
    void set(const IpAddr &s, const IpAddr &d) {
        ip_version = s.is_v4() && d.is_v4() ? 4 : 6;
        for (auto [to, a] : {std::pair{src, &s}, std::pair{dst, &d}}) {
            std::memcpy(to, a->raw, 16);
            if (ip_version == 4) std::memset(to, 0, 12);
        }
    }
    IpAddr src_addr() const { return field(src); }
    IpAddr dst_addr() const { return field(dst); }

  private:
    IpAddr field(const uint8_t *f) const {
        if (ip_version != 4) return IpAddr::of_gid(f);
        in_addr_t a;
        std::memcpy(&a, f + 12, 4);
        return IpAddr::v4(a);
    }
};

// rdma_cm port spaces and their service IDs: (port space << 16) + port.
enum PortSpace : uint16_t {
    kPsIpoib = 0x0002,
    kPsIb = 0x013F,
    kPsTcp = 0x0106,
    kPsUdp = 0x0111,
};
constexpr uint64_t service_id(PortSpace ps, uint16_t port) {
    return uint64_t(ps) << 16 | port;
}

} // namespace sroce::cm
