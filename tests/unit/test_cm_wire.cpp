// SPDX-License-Identifier: MIT
//
// The CM MAD codec (cm_wire.hpp): every field of every CM message at its
// IBTA bit position, independent of its neighbours; MAD header layout;
// what parse() refuses; the rdma_cm private-data header as Linux lays it
// out; port-space service IDs.
#include "cm_wire.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <random>
#include <vector>

using namespace sroce::cm;
using sroce::IpAddr;

namespace {

std::vector<Field> all_fields() {
    return {req::kLocalCommId,
            req::kVendorId,
            req::kServiceId,
            req::kLocalCaGuid,
            req::kLocalQkey,
            req::kLocalQpn,
            req::kResponderResources,
            req::kLocalEecn,
            req::kInitiatorDepth,
            req::kRemoteEecn,
            req::kRemoteCmResponseTimeout,
            req::kTransportServiceType,
            req::kEndToEndFlowControl,
            req::kStartingPsn,
            req::kLocalCmResponseTimeout,
            req::kRetryCount,
            req::kPartitionKey,
            req::kPathMtu,
            req::kRdcExists,
            req::kRnrRetryCount,
            req::kMaxCmRetries,
            req::kSrq,
            req::kExtendedTransportType,
            req::kPrimaryLocalLid,
            req::kPrimaryRemoteLid,
            req::kPrimaryFlowLabel,
            req::kPrimaryPacketRate,
            req::kPrimaryTrafficClass,
            req::kPrimaryHopLimit,
            req::kPrimarySl,
            req::kPrimarySubnetLocal,
            req::kPrimaryLocalAckTimeout,
            kLocalCommId,
            kRemoteCommId,
            rep::kLocalQkey,
            rep::kLocalQpn,
            rep::kLocalEecn,
            rep::kStartingPsn,
            rep::kResponderResources,
            rep::kInitiatorDepth,
            rep::kTargetAckDelay,
            rep::kFailoverAccepted,
            rep::kEndToEndFlowControl,
            rep::kRnrRetryCount,
            rep::kSrq,
            rep::kLocalCaGuid,
            rej::kMessageRejected,
            rej::kRejectedInfoLength,
            rej::kReason,
            mra::kMessageMraed,
            mra::kServiceTimeout,
            dreq::kRemoteQpn,
            sidr_req::kRequestId,
            sidr_req::kPartitionKey,
            sidr_req::kServiceId,
            sidr_rep::kStatus,
            sidr_rep::kAddInfoLength,
            sidr_rep::kQpn,
            sidr_rep::kServiceId,
            sidr_rep::kQkey};
}

TEST(CmWire, EveryFieldKeepsItsBitsAndLeavesTheOthers) {
    std::mt19937_64 rng(5);
    for (const Field &f : all_fields()) {
        SCOPED_TRACE(testing::Message()
                     << "byte " << f.byte << " bit " << int(f.bit) << " width " << int(f.width));
        ASSERT_TRUE(fits(f));
        uint8_t body[kCmDataLen], before[kCmDataLen];
        for (uint8_t &b : body)
            b = uint8_t(rng());
        std::memcpy(before, body, sizeof body);
        uint64_t mask = f.width == 64 ? ~0ull : (1ull << f.width) - 1;
        uint64_t v = rng() & mask;
        set(body, f, v);
        EXPECT_EQ(get(body, f), v);
        // Only the field's own bits changed.
        for (unsigned bit = 0; bit < kCmDataLen * 8; bit++) {
            bool inside =
                bit >= unsigned(f.byte) * 8 + f.bit && bit < unsigned(f.byte) * 8 + f.bit + f.width;
            if (inside) continue;
            ASSERT_EQ((body[bit / 8] >> (7 - bit % 8)) & 1, (before[bit / 8] >> (7 - bit % 8)) & 1)
                << "bit " << bit;
        }
    }
}

TEST(CmWire, ReqFieldsAtTheirIbtaBytes) {
    uint8_t body[kCmDataLen] = {};
    set(body, req::kLocalQpn, 0x123456);
    set(body, req::kResponderResources, 0x7F);
    EXPECT_EQ(body[32], 0x12);
    EXPECT_EQ(body[33], 0x34);
    EXPECT_EQ(body[34], 0x56);
    EXPECT_EQ(body[35], 0x7F);
    // Byte 43: remote CM response timeout (5), transport service type (2),
    // end-to-end flow control (1), most significant bit first.
    set(body, req::kRemoteCmResponseTimeout, 0x14);
    set(body, req::kTransportServiceType, 1);
    set(body, req::kEndToEndFlowControl, 1);
    EXPECT_EQ(body[43], 0xA3);
    // Byte 50: path MTU (4), RDC exists (1), RNR retry count (3).
    set(body, req::kPathMtu, 3);
    set(body, req::kRnrRetryCount, 7);
    EXPECT_EQ(body[50], 0x37);
    set(body, req::kServiceId, 0x0000000001061D2Full);
    EXPECT_EQ(body[8 + 5], 0x06);
    EXPECT_EQ(body[8 + 6], 0x1D);
    EXPECT_EQ(body[8 + 7], 0x2F);
}

TEST(CmWire, MadHeaderLayout) {
    uint8_t mad[kMadLen] = {};
    MadHdr h;
    h.tid = 0x0102030405060708ull;
    h.attr_id = kRep;
    h.attr_mod = 0xAABBCCDD;
    h.store(mad);
    EXPECT_EQ(mad[0], 1);
    EXPECT_EQ(mad[1], 0x07);
    EXPECT_EQ(mad[2], 2);
    EXPECT_EQ(mad[3], 0x03);
    EXPECT_EQ(mad[8], 0x01);
    EXPECT_EQ(mad[15], 0x08);
    EXPECT_EQ(mad[16], 0x00);
    EXPECT_EQ(mad[17], 0x13);
    EXPECT_EQ(mad[20], 0xAA);
    Mad m;
    ASSERT_EQ(parse(mad, kMadLen, m), ParseError::kOk);
    EXPECT_EQ(m.hdr.tid, h.tid);
    EXPECT_EQ(m.hdr.attr_id, kRep);
    EXPECT_EQ(m.body, mad + kMadHdrLen);
}

TEST(CmWire, ParseRefusesWhatIsNoCmMessage) {
    uint8_t mad[kMadLen] = {};
    MadHdr h;
    h.attr_id = kReq;
    h.store(mad);
    Mad m;
    EXPECT_EQ(parse(mad, kMadLen - 1, m), ParseError::kBadLength);
    EXPECT_EQ(parse(mad, kMadLen + 4, m), ParseError::kBadLength);
    struct Case {
        size_t at;
        uint8_t value;
        ParseError want;
    } cases[] = {{0, 2, ParseError::kBadVersion},      {1, 0x81, ParseError::kNotCm},
                 {2, 1, ParseError::kBadVersion},      {3, 0x01, ParseError::kBadMethod},
                 {17, 0x19, ParseError::kUnknownAttr}, {17, 0x01, ParseError::kUnknownAttr}};
    for (const Case &c : cases) {
        uint8_t bad[kMadLen];
        std::memcpy(bad, mad, kMadLen);
        bad[c.at] = c.value;
        EXPECT_EQ(parse(bad, kMadLen, m), c.want) << "byte " << c.at;
        EXPECT_NE(parse_error_str(c.want), nullptr);
    }
}

TEST(CmWire, CmaHeaderAsLinuxWritesIt) {
    CmaHdr h;
    h.port = 7471;
    h.set(IpAddr::v4(inet_addr("10.201.0.1")), IpAddr::v4(inet_addr("10.201.0.2")));
    uint8_t p[CmaHdr::kLen];
    h.store(p);
    EXPECT_EQ(p[0], 0);
    EXPECT_EQ(p[1], 0x40);
    EXPECT_EQ(p[2], 0x1D);
    EXPECT_EQ(p[3], 0x2F);
    EXPECT_EQ(p[4 + 12], 10);
    EXPECT_EQ(p[20 + 15], 2);
    CmaHdr back;
    ASSERT_TRUE(back.load(p, sizeof p));
    EXPECT_EQ(back.port, 7471);
    EXPECT_EQ(std::memcmp(back.dst, h.dst, 16), 0);
    EXPECT_EQ(back.dst_addr(), IpAddr::v4(inet_addr("10.201.0.2")));
    EXPECT_TRUE(std::all_of(p + 4, p + 16, [](uint8_t b) { return b == 0; }))
        << "IPv4 is not mapped: the kernel zeroes the first 12 bytes";
    EXPECT_FALSE(back.load(p, sizeof p - 1));
    p[1] = 0x50;
    EXPECT_FALSE(back.load(p, sizeof p)) << "IP version 5";
    p[1] = 0x60;
    EXPECT_TRUE(back.load(p, sizeof p));
    p[0] = 1;
    EXPECT_FALSE(back.load(p, sizeof p)) << "cma version";
    EXPECT_EQ(service_id(kPsTcp, 7471), 0x0000000001061D2Full);
}

TEST(CmWire, CmaHeaderForIpv6) {
    IpAddr src, dst;
    ASSERT_TRUE(IpAddr::parse("fd00:31::1", &src));
    ASSERT_TRUE(IpAddr::parse("fe80::2", &dst));
    CmaHdr h;
    h.port = 40000;
    h.set(src, dst);
    uint8_t p[CmaHdr::kLen];
    h.store(p);
    EXPECT_EQ(p[1], 0x60);
    EXPECT_EQ(std::memcmp(p + 4, src.raw, 16), 0);
    EXPECT_EQ(std::memcmp(p + 20, dst.raw, 16), 0);
    CmaHdr back;
    ASSERT_TRUE(back.load(p, sizeof p));
    EXPECT_EQ(back.src_addr(), src);
    EXPECT_EQ(back.dst_addr(), dst);
    EXPECT_EQ(back.port, 40000);
    EXPECT_EQ(service_id(kPsUdp, 1), 0x0000000001110001ull);
}

} // namespace
