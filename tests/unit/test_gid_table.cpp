// SPDX-License-Identifier: MIT
//
// The GID table of a device that follows its net device, as the kernel's
// GID cache keeps rxe's: entry 0 the MAC's link-local GID, an address that
// goes leaves its entry empty, one that comes takes the first empty entry.
#include "sroce.hpp"

#include <gtest/gtest.h>

namespace sroce {
namespace {

IpAddr ip(const char *s) {
    IpAddr a;
    EXPECT_TRUE(IpAddr::parse(s, &a)) << s;
    return a;
}

ibv_gid gid_of(const IpAddr &a) {
    ibv_gid g;
    std::memcpy(g.raw, a.raw, 16);
    return g;
}

// The table as "index=address" for the entries that are not empty.
std::string listing(const GidTable &t) {
    std::string out;
    for (uint32_t i = 0; i < uint32_t(kMaxGids); i++) {
        ibv_gid g;
        if (t.get(i, &g)) out += std::to_string(i) + "=" + IpAddr::of_gid(g.raw).text() + " ";
    }
    return out;
}

TEST(GidTable, KeepsIndicesAsAddressesComeAndGo) {
    GidTable t;
    ibv_gid deflt = gid_of(ip("fe80::1"));
    EXPECT_TRUE(t.update(deflt, {ip("10.0.0.1"), ip("fd00::1")}));
    EXPECT_EQ(listing(t), "0=fe80::1 1=10.0.0.1 2=fd00::1 ");
    EXPECT_EQ(t.size(), 3u);
    uint64_t gen = t.generation();
    EXPECT_FALSE(t.update(deflt, {ip("10.0.0.1"), ip("fd00::1")})) << "nothing changed";
    EXPECT_EQ(t.generation(), gen);
    // The IPv4 address goes: its entry is empty, the others stay put.
    EXPECT_TRUE(t.update(deflt, {ip("fd00::1")}));
    EXPECT_EQ(listing(t), "0=fe80::1 2=fd00::1 ");
    EXPECT_EQ(t.size(), 3u);
    ibv_gid g;
    EXPECT_FALSE(t.get(1, &g));
    EXPECT_NE(t.generation(), gen);
    // Two come: the first takes the hole, the second the end.
    EXPECT_TRUE(t.update(deflt, {ip("10.0.0.2"), ip("fd00::1"), ip("fd00::2")}));
    EXPECT_EQ(listing(t), "0=fe80::1 1=10.0.0.2 2=fd00::1 3=fd00::2 ");
    // The link-local address the MAC makes is listed once, at 0.
    EXPECT_FALSE(t.update(deflt, {ip("10.0.0.2"), ip("fd00::1"), ip("fd00::2"), ip("fe80::1")}));
    EXPECT_FALSE(t.get(uint32_t(kMaxGids), &g)) << "past the table";
}

TEST(GidTable, AFullTableLeavesAnAddressOut) {
    GidTable t;
    std::vector<IpAddr> addrs;
    for (int i = 1; i <= kMaxGids; i++)
        addrs.push_back(IpAddr::v4(htonl(0x0A000000u + uint32_t(i))));
    t.update(gid_of(ip("fe80::1")), addrs);
    EXPECT_EQ(t.size(), uint32_t(kMaxGids));
    ibv_gid g;
    ASSERT_TRUE(t.get(uint32_t(kMaxGids - 1), &g));
    EXPECT_EQ(IpAddr::of_gid(g.raw).text(), "10.0.0.15");
}

TEST(GidTable, ADeviceWithOneAddressListsItAfterTheMacs) {
    GidTable t;
    t.set_fixed(gid_of(ip("fe80::1")), ip("127.0.0.7"));
    EXPECT_EQ(listing(t), "0=fe80::1 1=127.0.0.7 ");
    GidTable ll;
    ll.set_fixed(gid_of(ip("fe80::1")), ip("fe80::1"));
    EXPECT_EQ(listing(ll), "0=fe80::1 ") << "an address that is the MAC's link-local GID";
}

} // namespace
} // namespace sroce
