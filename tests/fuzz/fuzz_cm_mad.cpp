// SPDX-License-Identifier: MIT
//
// libFuzzer target for the CM MAD codec (cm_wire.hpp).  The first input
// byte steers: with its high bit set the rest goes to parse() as it is;
// otherwise the harness builds a valid CM MAD header whose attribute the
// byte selects and uses the rest as the message body, so the fuzzer does
// not have to rediscover the header to reach the fields.  Every field of an
// accepted message is read and written back, and the rdma_cm header of its
// private data is parsed.  The oracle is the sanitizers, plus: an accepted
// MAD is exactly 256 bytes and set() of what get() read changes nothing.
#include "cm_wire.hpp"

#include <cstdlib>

using namespace sroce::cm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mad[kMadLen + 64] = {};
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    if (data[0] & 0x80) {
        if (n > sizeof mad) return 0;
        std::memcpy(mad, in, n);
    } else {
        static const uint16_t kAttrs[] = {kReq,  kMra,  kRej,     kRep,     kRtu,
                                          kDreq, kDrep, kSidrReq, kSidrRep, kLap};
        MadHdr h;
        h.attr_id = kAttrs[data[0] % (sizeof kAttrs / sizeof kAttrs[0])];
        h.store(mad);
        std::memcpy(mad + kMadHdrLen, in, n < kCmDataLen ? n : kCmDataLen);
        n = kMadLen;
    }
    Mad m;
    if (parse(mad, n, m) != ParseError::kOk) return 0;
    if (n != kMadLen) abort();
    const Field fields[] = {
        req::kLocalQpn,          req::kStartingPsn, req::kPathMtu,       req::kTransportServiceType,
        req::kPrimaryPacketRate, rep::kLocalQpn,    rep::kSrq,           rej::kReason,
        sidr_rep::kQpn,          dreq::kRemoteQpn,  mra::kServiceTimeout};
    uint8_t body[kCmDataLen];
    std::memcpy(body, m.body, sizeof body);
    for (const Field &f : fields) {
        uint64_t v = m.field(f);
        set(body, f, v);
        if (get(body, f) != v || std::memcmp(body, m.body, sizeof body) != 0) abort();
    }
    size_t pd = m.hdr.attr_id == kReq ? req::kPrivateData : sidr_req::kPrivateData;
    CmaHdr h;
    (void)h.load(m.body + pd, kCmDataLen - pd);
    return 0;
}
