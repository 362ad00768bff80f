// SPDX-License-Identifier: MIT
//
// IP addresses as RoCEv2 names them: by GID.  A RoCEv2 GID is an IPv6
// address, or an IPv4 one mapped into IPv6 (::ffff:a.b.c.d), so one 16-byte
// type carries both families and a peer's GID is its address.
#pragma once

#include <algorithm>
#include <arpa/inet.h>
#include <cstdint>
#include <cstring>
#include <netinet/in.h>
// After netinet/in.h, which it then defers to: IPV6_FLOWINFO.
#include <linux/in6.h>
#include <string>
#include <sys/socket.h>

namespace sroce {

struct IpAddr {
    uint8_t raw[16] = {};

    static IpAddr v4(in_addr_t a) { // network order
        IpAddr r;
        r.raw[10] = r.raw[11] = 0xFF;
        std::memcpy(r.raw + 12, &a, 4);
        return r;
    }
    static IpAddr v6(const in6_addr &a) {
        IpAddr r;
        std::memcpy(r.raw, &a, 16);
        return r;
    }
    static IpAddr of_gid(const void *gid) { // 16 bytes
        IpAddr r;
        std::memcpy(r.raw, gid, 16);
        return r;
    }
    // An IPv4 or IPv6 literal (an IPv6 one without a scope); false if `s` is
    // neither.
    static bool parse(const char *s, IpAddr *out) {
        in_addr a4;
        in6_addr a6;
        if (inet_pton(AF_INET, s, &a4) == 1) {
            *out = v4(a4.s_addr);
            return true;
        }
        if (inet_pton(AF_INET6, s, &a6) == 1) {
            *out = v6(a6);
            return true;
        }
        return false;
    }

    bool is_v4() const {
        static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
        return std::memcmp(raw, kMapped, 12) == 0;
    }
    int family() const { return is_v4() ? AF_INET : AF_INET6; }
    in_addr_t v4_addr() const { // network order; only for is_v4()
        in_addr_t a;
        std::memcpy(&a, raw + 12, 4);
        return a;
    }
    in6_addr v6_addr() const {
        in6_addr a;
        std::memcpy(&a, raw, 16);
        return a;
    }
    bool empty() const {
        static constexpr uint8_t kZero[16] = {};
        return std::memcmp(raw, kZero, 16) == 0;
    }
    // The wildcard of either family: :: or 0.0.0.0.
    bool unspecified() const { return empty() || *this == v4(INADDR_ANY); }
    bool multicast() const { return is_v4() ? (raw[12] & 0xF0) == 0xE0 : raw[0] == 0xFF; }
    bool link_local() const { return raw[0] == 0xFE && (raw[1] & 0xC0) == 0x80; }
    bool loopback() const {
        static constexpr uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        return is_v4() ? raw[12] == 127 : std::memcmp(raw, kLoop6, 16) == 0;
    }
    // An address one host can have: not unspecified (a wildcard to bind),
    // not multicast, not IPv4's broadcast.
    bool unicast() const {
        if (multicast()) return false;
        if (!is_v4()) return !empty();
        in_addr_t a = ntohl(v4_addr());
        return a != INADDR_ANY && a != INADDR_BROADCAST;
    }
    bool operator==(const IpAddr &) const = default;
    // For tables indexed by peer: mixes every byte that differs between
    // hosts of one network (the low ones of either family).
    uint32_t hash() const {
        uint32_t h[4];
        std::memcpy(h, raw, 16);
        return (h[0] ^ h[1] ^ h[2]) * 0x9E3779B1u ^ ntohl(h[3]);
    }
    std::string text() const {
        char s[INET6_ADDRSTRLEN];
        if (is_v4()) {
            in_addr_t a = v4_addr();
            return inet_ntop(AF_INET, &a, s, sizeof s);
        }
        in6_addr a = v6_addr();
        return inet_ntop(AF_INET6, &a, s, sizeof s);
    }
};

// What of an address vector's GRH goes into the IP header, as RoCEv2 maps
// it: the flow label (over IPv6; it also names the UDP source port), the
// traffic class (IPv4's TOS byte: DSCP and ECN) and the hop limit (IPv4's
// TTL).  A hop limit of 0 leaves the kernel's default.
struct IpFields {
    uint32_t flow = 0;
    uint8_t tclass = 0;
    uint8_t hop_limit = 0;
    bool operator==(const IpFields &) const = default;
};

// A socket address of either family, as sendmmsg() and recvmmsg() take it.
struct SockAddr {
    union {
        sockaddr sa;
        sockaddr_in in;
        sockaddr_in6 in6;
    };
    socklen_t len = 0;

    SockAddr() { std::memset(&in6, 0, sizeof in6); }
    // `scope`: the interface index a link-local IPv6 address is on.
    SockAddr(const IpAddr &a, uint16_t port, uint32_t scope = 0) : SockAddr() {
        if (a.is_v4()) {
            in.sin_family = AF_INET;
            in.sin_port = htons(port);
            in.sin_addr.s_addr = a.v4_addr();
            len = sizeof in;
        } else {
            in6.sin6_family = AF_INET6;
            in6.sin6_port = htons(port);
            in6.sin6_addr = a.v6_addr();
            in6.sin6_scope_id = a.link_local() || a.multicast() ? scope : 0;
            len = sizeof in6;
        }
    }
    IpAddr addr() const {
        if (sa.sa_family == AF_INET) return IpAddr::v4(in.sin_addr.s_addr);
        if (sa.sa_family == AF_INET6) return IpAddr::v6(in6.sin6_addr);
        return {};
    }
    uint16_t port() const { return ntohs(sa.sa_family == AF_INET6 ? in6.sin6_port : in.sin_port); }
    void set_port(uint16_t p) {
        (sa.sa_family == AF_INET6 ? in6.sin6_port : in.sin_port) = htons(p);
    }
    // The interface a link-local IPv6 address is on; 0 for any other.
    uint32_t scope() const { return sa.sa_family == AF_INET6 ? in6.sin6_scope_id : 0; }
    int family() const { return sa.sa_family; }
    // An IPv4 or IPv6 socket address from the start of `p`, which has room
    // for a sockaddr_in6 (an ABI's address field); false for other families.
    // An IPv6 one keeps its scope and flow information.
    static bool load(const void *p, SockAddr *out) {
        sa_family_t f;
        std::memcpy(&f, p, sizeof f);
        if (f != AF_INET && f != AF_INET6) return false;
        *out = SockAddr();
        out->len = f == AF_INET ? sizeof out->in : sizeof out->in6;
        std::memcpy(&out->in6, p, out->len);
        return true;
    }
    // The wildcard address of family `f` (AF_INET or AF_INET6).
    static SockAddr any(int f) {
        SockAddr r;
        r.sa.sa_family = sa_family_t(f);
        r.len = f == AF_INET ? sizeof r.in : sizeof r.in6;
        return r;
    }
};

// IPV6_PKTINFO, through which a socket for every address of an interface
// (IPv6, both families, IPv4 ones mapped) says which address a datagram
// was sent to, and is told which one to send from.
constexpr size_t kPktinfoSpace = CMSG_SPACE(sizeof(in6_pktinfo));
// The address `c` names, if it is an IPV6_PKTINFO message.
inline bool read_pktinfo(const cmsghdr *c, IpAddr *addr) {
    if (c->cmsg_level != IPPROTO_IPV6 || c->cmsg_type != IPV6_PKTINFO) return false;
    in6_pktinfo pi;
    std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
    *addr = IpAddr::v6(pi.ipi6_addr);
    return true;
}
// Writes an IPV6_PKTINFO message at `c`: send from `src` on interface
// `ifindex`.  Returns the room it takes (kPktinfoSpace).
inline size_t write_pktinfo(cmsghdr *c, const IpAddr &src, int ifindex) {
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
    in6_pktinfo pi{src.v6_addr(), unsigned(ifindex)};
    std::memcpy(CMSG_DATA(c), &pi, sizeof pi);
    return kPktinfoSpace;
}

// What a socket reports of each datagram's IP header (receive_ip_fields in
// agent_client.hpp): over IPv4 the TOS byte and TTL, over IPv6 the flow
// information (traffic class and flow label) and hop limit; a datagram
// has the messages of its own family only.
constexpr size_t kIpFieldsSpace = 2 * CMSG_SPACE(sizeof(int));
// Notes in `f` what `c` says, if it is one of those messages.
inline bool read_ip_fields(const cmsghdr *c, IpFields *f) {
    int v = 0;
    size_t n = std::min(c->cmsg_len - CMSG_LEN(0), sizeof v);
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS && n >= 1) {
        f->tclass = *CMSG_DATA(c); // a byte, not an int
        return true;
    }
    std::memcpy(&v, CMSG_DATA(c), n);
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
        f->hop_limit = uint8_t(v);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
        f->hop_limit = uint8_t(v);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_FLOWINFO) {
        uint32_t info = ntohl(uint32_t(v));
        f->flow = info & 0xFFFFF;
        f->tclass = uint8_t(info >> 20);
    } else {
        return false;
    }
    return true;
}

} // namespace sroce
