// SPDX-License-Identifier: MIT
//
// The in-memory wire (port_mem.hpp) as the devices of this library see it,
// for a test that plays a peer of them: a program reaches libsroce.so's
// devices through ibv_*, and these reach the same wire.  Exported under
// SROCE_PRIVATE_1 like the persistence hook, and only from here, so that a
// test linking the engine's archive as well cannot bind to its own copy.
#include "port_mem.hpp"
#include "sroce.hpp"

#include <cerrno>
#include <cstring>

extern "C" {

struct sroce_memwire_header {
    uint32_t src, dst; // network order
    uint16_t sport, dport, ip_id;
    uint8_t tclass; // the TOS byte: DSCP and ECN
};

__attribute__((visibility("default"))) void sroce_memwire_listen(uint32_t addr) {
    sroce::memwire::listen(addr);
}

// The oldest packet kept for `addr`: its length, copied up to `cap` bytes;
// -1 when none is kept.
__attribute__((visibility("default"))) long sroce_memwire_take(uint32_t addr, void *buf, size_t cap,
                                                               sroce_memwire_header *hdr) {
    sroce::memwire::Packet p;
    if (!sroce::memwire::take(addr, p)) return -1;
    std::memcpy(buf, p.bytes.data(), std::min(cap, p.bytes.size()));
    if (hdr)
        *hdr = {p.ip.src.v4_addr(), p.ip.dst.v4_addr(), p.ip.sport,
                p.ip.dport,         p.ip.ip_id,         p.fields.tclass};
    return long(p.bytes.size());
}

// 0, or EHOSTUNREACH when no device has `to`, EMSGSIZE past what UDP carries.
// `tclass`: the TOS byte it arrives with (CE, for congestion control).
__attribute__((visibility("default"))) int sroce_memwire_send(uint32_t from, uint16_t from_port,
                                                              uint32_t to, const void *data,
                                                              size_t len, size_t seg,
                                                              uint8_t tclass) {
    if (len > sroce::Port::kMaxDatagram) return EMSGSIZE;
    sroce::IpFields f;
    f.tclass = tclass;
    return sroce::memwire::send(sroce::IpAddr::v4(from), from_port, sroce::IpAddr::v4(to),
                                static_cast<const uint8_t *>(data), len, seg, f)
               ? 0
               : EHOSTUNREACH;
}

// The engine's clock stands at `ns` from now on (0: the real clock again),
// so that a test moves time for the timers and the rate limiter itself.
__attribute__((visibility("default"))) void sroce_memwire_clock(uint64_t ns) {
    sroce::set_fake_clock(ns);
}
} // extern "C"
