#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Recomputes the ICRC of every RoCEv2 packet in a capture with scapy.

scapy.contrib.roce's BTH.compute_icrc() builds the masked pseudo header from
the IP and UDP headers as captured, independently of sroce's implementation.
On lo the capture holds the IPv4 header exactly as sent, so the check is
complete: no field the receiver cannot see is guessed.  scapy releases
before 2.6 compute no ICRC over IPv6; for an IPv6 packet the same recipe
scapy 2.6 follows is applied here to scapy's own parse of the packet (the
IPv6 header's traffic class, flow label and hop limit set to ones).

Also checks what sroce's receivers rely on (wire-protocol.md §1.1): DF on
every IPv4 packet, and IP IDs as the sending socket numbers them.  From the device
socket (source port 4791) an ID is the packet's place in its segmentation-
offload send - 0, or one more than the ID of the flow's packet before it
(same addresses and destination QP), below 64.  From a connected socket (any
other source port) it is the socket's counter: one more per send, and the
segments of a send that, +1, ... - so never more than one above the highest
ID the socket sent before (a few more when datagrams not captured took IDs),
nor 64 below it.  Prints a count per opcode and
requires that SEND, RDMA WRITE, RDMA READ requests and responses, ATOMIC,
ATOMIC ACKNOWLEDGE and ACKNOWLEDGE were all seen.

The capture must show datagrams as a wire carries them: on a lo whose UDP
segmentation offload is off (ethtool -K lo tx-udp-segmentation off), since
on an offloading lo a capture sees each send whole.

Usage: icrc_check.py [--require-segmented] CAPTURE.pcap[ng]
  --require-segmented  fail unless some packets came from multi-packet sends
Exit status: 0 all good, 1 a check failed, 77 scapy is missing.
"""
import collections
import sys

try:
    from scapy.all import IP, IPv6, UDP, PcapReader, Raw, raw
    from scapy.contrib.roce import BTH, _bth_opcodes
    import zlib
except ImportError as e:
    print(f"SKIP: scapy is not available: {e}", file=sys.stderr)
    sys.exit(77)

ROCE_PORT = 4791

# Packets one segmentation-offload send may carry (Linux's UDP_MAX_SEGMENTS).
MAX_SEGMENTS = 64
# How far a connected socket's ID may jump past the highest before it:
# datagrams that are not in the capture (sroce's own reads of the counter
# go to one of its own ports; a lost send) took the IDs between.
MAX_ID_GAP = 16

# Opcode groups the traffic must contain, and the RC opcodes of each.
REQUIRED = {
    "SEND": range(0x00, 0x06),
    "RDMA WRITE": range(0x06, 0x0C),
    "RDMA READ request": [0x0C],
    "RDMA READ response": range(0x0D, 0x11),
    "ACKNOWLEDGE": [0x11],
    "ATOMIC ACKNOWLEDGE": [0x12],
    "ATOMIC (CmpSwap/FetchAdd)": [0x13, 0x14],
}


def icrc_ipv6(pkt):
    """The ICRC of an IPv6 RoCEv2 packet, little-endian as on the wire."""
    ps = Raw(b"\xff" * 8) / pkt[IPv6].copy()
    ps.tc, ps.fl, ps.hlim = 0xFF, 0xFFFFF, 0xFF
    ps[UDP].chksum = 0xFFFF
    ps[BTH].fecn = ps[BTH].becn = 1
    ps[BTH].resv6 = 0xFF
    bth = ps[BTH].self_build()
    body = raw(ps[BTH].payload)
    ps[UDP].payload = Raw(bth + body + b"\xff" * 4)
    return (zlib.crc32(raw(ps)[:-4]) & 0xFFFFFFFF).to_bytes(4, "little")


def main():
    args = sys.argv[1:]
    require_segmented = "--require-segmented" in args
    args = [a for a in args if a != "--require-segmented"]
    if len(args) != 1:
        sys.exit(__doc__)
    counts = collections.Counter()
    last_id = {}  # device-socket flow -> IP ID of its latest packet
    highest = {}  # connected socket (address, port) -> highest IP ID
    segmented = 0
    mismatches = []
    bad_ip = []
    total = 0
    families = set()
    with PcapReader(args[0]) as reader:
        for n, pkt in enumerate(reader, 1):
            if (IP not in pkt and IPv6 not in pkt) or UDP not in pkt or \
                    pkt[UDP].dport != ROCE_PORT:
                continue
            udp = pkt[UDP]
            payload = raw(udp.payload)
            if BTH not in pkt or len(payload) < 16:
                mismatches.append((n, "not a RoCEv2 packet", payload[:16].hex()))
                continue
            total += 1
            opcode = payload[0]
            counts[opcode] += 1
            v6 = IP not in pkt
            if v6:
                families.add(6)
            else:
                families.add(4)
            want = icrc_ipv6(pkt) if v6 else pkt[BTH].compute_icrc(b"")
            got = payload[-4:]
            if want != got:
                mismatches.append((n, _bth_opcodes.get(opcode, hex(opcode)),
                                   f"ICRC {got.hex()} expected {want.hex()}"))
            if v6:
                continue  # no IP ID, no DF: nothing else the receiver relies on
            ip = pkt[IP]
            if udp.sport == ROCE_PORT:
                flow = (ip.src, ip.dst, int.from_bytes(payload[5:8], "big"))
                in_run = ip.id == last_id.get(flow, -2) + 1
                ok_id = ip.id < MAX_SEGMENTS and (ip.id == 0 or in_run)
                before = last_id.get(flow)
                if ip.id:
                    segmented += 1
                last_id[flow] = ip.id
            else:
                sock = (ip.src, udp.sport)
                before = highest.get(sock)
                d = 0 if before is None else (ip.id - before + 0x8000) % 0x10000 - 0x8000
                ok_id = 1 - MAX_SEGMENTS <= d <= MAX_ID_GAP
                # An ID at or below the highest: a send after one of
                # several packets, whose segments took the IDs above its own.
                if before is not None and d <= 0:
                    segmented += 1
                if before is None or d > 0:
                    highest[sock] = ip.id
            if not ok_id or not (ip.flags & 0x2):
                bad_ip.append((n, f"IP ID {ip.id:#06x} flags {ip.flags} from port {udp.sport} "
                                  f"(before it: {before})"))

    print(f"{total} RoCEv2 packets over IPv{'/IPv'.join(map(str, sorted(families))) or '?'}, "
          f"{segmented} of them showing segmentation-offload sends by their IP ID")
    for op in sorted(counts):
        print(f"  {op:#04x} {_bth_opcodes.get(op, '?'):<36} {counts[op]}")
    ok = True
    if total == 0:
        print("FAIL: no RoCEv2 packets in the capture", file=sys.stderr)
        ok = False
    if mismatches:
        ok = False
        print(f"FAIL: {len(mismatches)} packet(s) with a wrong ICRC:", file=sys.stderr)
        for m in mismatches[:50]:
            print("  frame %d %s: %s" % m, file=sys.stderr)
    if bad_ip:
        ok = False
        print(f"FAIL: {len(bad_ip)} packet(s) without DF or with an IP ID their socket "
              f"does not give:", file=sys.stderr)
        for m in bad_ip[:20]:
            print("  frame %d: %s" % m, file=sys.stderr)
    if require_segmented and not segmented:
        ok = False
        print("FAIL: no packet from a multi-packet segmentation-offload send", file=sys.stderr)
    for group, ops in REQUIRED.items():
        if not any(counts[o] for o in ops):
            ok = False
            print(f"FAIL: no {group} packet seen", file=sys.stderr)
    if ok:
        print("ICRC of every packet matches scapy's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
