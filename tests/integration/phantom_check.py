#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Drives sroce-fabric's phantom queue (phantom_queue.bpf.c) packet by
packet with BPF_PROG_TEST_RUN and checks which packets it marks CE.

Usage: phantom_check.py SROCE-FABRIC NETNS

NETNS is a namespace made for the check, with a device p0 (one end of a
veth pair) and nothing else; the program is attached to p0's egress as
sroce-fabric attaches it to the switch's, and its parameters are written
by sroce-fabric's own code.  The queue's drain is set to 0 (a rate of 0), so that the backlog
each packet finds is exactly the bytes of the packets before it, and the
check needs no clock:
  - a single threshold: the packets that find it exceeded are marked, and
    only those;
  - RED's ramp: none below the threshold, every one past the maximum, and
    between the two as many as the ramp's probability adds up to, within
    six standard deviations of the binomial distribution;
  - a packet that is not ECN-capable is never marked, an IPv6 one is, and
    the IPv4 header's checksum stays right.
Prints one line per check; exits 1 if one failed.
"""
import ctypes
import importlib.machinery
import importlib.util
import json
import math
import struct
import sys
import types

BPF_PROG_TEST_RUN = 10
TC_ACT_OK = 0
ECN_CE = 3


def load_fabric(path):
    loader = importlib.machinery.SourceFileLoader("sroce_fabric", path)
    spec = importlib.util.spec_from_loader("sroce_fabric", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def csum(data):
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4_packet(tos, payload=64):
    eth = b"\x02\0\0\0\0\1" + b"\x02\0\0\0\0\2" + b"\x08\x00"
    total = 20 + 8 + payload
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, 1, 0, 64, 17, 0,
                               bytes([10, 79, 0, 2]), bytes([10, 79, 0, 1])))
    struct.pack_into("!H", ip, 10, csum(bytes(ip)))
    udp = struct.pack("!HHHH", 49152, 4791, 8 + payload, 0)
    return eth + bytes(ip) + udp + bytes(payload)


def ipv6_packet(tclass, payload=64):
    eth = b"\x02\0\0\0\0\1" + b"\x02\0\0\0\0\2" + b"\x86\xdd"
    first = (6 << 28) | (tclass << 20)
    ip = struct.pack("!IHBB16s16s", first, 8 + payload, 17, 64, b"\xfd" + bytes(14) + b"\2",
                     b"\xfd" + bytes(14) + b"\1")
    udp = struct.pack("!HHHH", 49152, 4791, 8 + payload, 0)
    return eth + ip + udp + bytes(payload)


class Phantom:
    """The program on p0 of `netns`, its parameters and its counters."""

    def __init__(self, fab, netns):
        self.fab, self.netns = fab, netns
        self.bpf = fab.Bpf()
        out = fab.run("tc", "-n", netns, "-j", "filter", "show", "dev", "p0", "egress").stdout
        prog = next(f["options"]["prog"]["id"] for f in json.loads(out)
                    if "prog" in f.get("options", {}))
        self.fd = self.bpf.call(fab.Bpf.PROG_GET_FD_BY_ID, struct.pack("=I", prog))
        self.data, self.bss = fab.phantom_maps(netns)

    def set(self, threshold, maximum, prob):
        """RED from `threshold` to `maximum` bytes, up to `prob`, written
        as sroce-fabric writes it, for a rate of 0 (no drain); an empty
        queue and zero counters."""
        self.fab.set_phantom_params(self.netns, types.SimpleNamespace(
            rate=0, mark_rate=1.0, mark_threshold=threshold, mark_max=maximum,
            mark_probability=prob))
        self.bpf.element(self.bss, bytes(40))

    def state(self):
        backlog, _, packets, marked, _ = struct.unpack("=5Q", self.bpf.element(self.bss, size=40))
        return backlog, packets, marked

    def send(self, pkt):
        """The packet as the program leaves it, and its verdict."""
        data_in = ctypes.create_string_buffer(pkt, len(pkt))
        data_out = ctypes.create_string_buffer(len(pkt) + 256)
        attr = bytearray(struct.pack("=IIIIQQII", self.fd, 0, len(pkt), len(data_out),
                                     ctypes.addressof(data_in), ctypes.addressof(data_out),
                                     1, 0))
        buf = ctypes.create_string_buffer(bytes(attr), self.bpf.ATTR_SIZE)
        r = self.bpf.libc.syscall(ctypes.c_long(self.bpf.SYSCALL), ctypes.c_int(BPF_PROG_TEST_RUN),
                                  buf, ctypes.c_uint(self.bpf.ATTR_SIZE))
        if r < 0:
            raise OSError(ctypes.get_errno(), "BPF_PROG_TEST_RUN")
        # struct bpf_attr's test: retval at 4, data_size_out at 12.
        retval, _, size_out = struct.unpack_from("=III", buf.raw, 4)
        return data_out.raw[:size_out], retval


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fab = load_fabric(sys.argv[1])
    netns = sys.argv[2]
    fab.add_phantom_queue(types.SimpleNamespace(rate=50_000_000, mark_rate=0.95,
                                                mark_threshold=30000, mark_max=30000,
                                                mark_probability=1.0), netns)
    q = Phantom(fab, netns)
    failed = 0

    def check(ok, what):
        nonlocal failed
        print(f"{'ok' if ok else 'FAIL'}: {what}")
        failed += not ok

    ect4 = ipv4_packet(0x02)
    length = len(ect4)

    # A single threshold: the packet whose bytes take the backlog past it,
    # and every one after it.
    q.set(10 * length, 10 * length, 1.0)
    marks = []
    for _ in range(20):
        out, verdict = q.send(ect4)
        marks.append(out[15] & 3 == ECN_CE and verdict == TC_ACT_OK)
    backlog, packets, marked = q.state()
    check(marks == [False] * 10 + [True] * 10 and marked == 10 and packets == 20 and
          backlog == 20 * length,
          f"one threshold at 10 packets: marked {[int(m) for m in marks]}, counted {marked} "
          f"of {packets}, backlog {backlog}")
    out, _ = q.send(ect4)
    check(csum(out[14:34]) == 0 and out[15] == 0x03,
          f"a marked IPv4 header: TOS {out[15]:#04x}, its checksum verifies")
    out, _ = q.send(ipv4_packet(0x00))
    check(out[15] == 0x00, f"not ECN-capable past the threshold: TOS {out[15]:#04x}, unmarked")
    out, _ = q.send(ipv6_packet(0x02))
    tclass = (struct.unpack_from("!I", out, 14)[0] >> 20) & 0xFF
    check(tclass & 3 == ECN_CE, f"IPv6 past the threshold: traffic class {tclass:#04x}, CE")

    # RED's ramp: from 100 to 1100 packets' worth, up to 0.5.
    lo, hi, pmax = 100 * length, 1100 * length, 0.5
    q.set(lo, hi, pmax)
    marks = [q.send(ect4)[0][15] & 3 == ECN_CE for _ in range(1200)]
    below, past = sum(marks[:100]), sum(marks[1100:])
    check(below == 0, f"ramp: none of the 100 packets up to the threshold marked ({below})")
    check(past == 100, f"ramp: all of the 100 packets past its maximum marked ({past})")
    # Packet i finds (i + 1) packets' worth, and is marked with this
    # probability; each half of the ramp, against what its packets'
    # probabilities add up to.
    for half, first in (("lower", 100), ("upper", 600)):
        probs = [pmax * ((i + 1) * length - lo) / (hi - lo) for i in range(first, first + 500)]
        mean = sum(probs)
        sd = math.sqrt(sum(p * (1 - p) for p in probs))
        got = sum(marks[first:first + 500])
        check(abs(got - mean) <= 6 * sd,
              f"ramp, {half} half: {got} of 500 packets marked, expected {mean:.1f} "
              f"± {6 * sd:.1f}")
    _, _, marked = q.state()
    check(marked == sum(marks), f"ramp: the counter says {marked}, the packets {sum(marks)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
