#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks a capture of RoCEv2 traffic between sroce and a Linux rxe peer.

Every RoCEv2 packet is classified by sender; the ICRC of up to --sample
packets per (sender, opcode) is recomputed with scapy.contrib.roce, which
builds the masked pseudo header from the headers as captured (on a tap
device the capture holds the IPv4 header exactly as sent, IP ID included).
Parsing all packets with scapy is slow, hence the sample; the header fields
below are read from every packet.

Checks:
  * the sampled ICRCs all match scapy's;
  * both senders sent RoCEv2 packets;
  * sroce sent every packet with DF and the IP ID its socket gives
    (wire-protocol.md 1.1; a peer that sees the IP header, as rxe does, needs
    nothing more): from the device socket (source port 4791) its place in its
    segmentation-offload send, 0 or one more than the ID of the packet before
    it to the same destination QP, below 64; from a connected socket (any
    other port) the socket's counter, one more per send and the segments of a
    send that, +1, ..., so never above the highest ID before it + 1 (a few
    more when datagrams not captured took IDs: sroce's own reads of the
    counter), nor 64 below it;
  * the rxe peer sent packets with a non-zero IP ID from a UDP source port
    other than 4791 -- the packets sroce can only verify by solving for the
    unseen IP ID -- so the capture proves that path was exercised.

A connected socket's IDs must follow its counter; a jump on a port is taken
for a new socket that another process bound to it when the packet's ICRC is
right for the ID it carries, and counted as a failure otherwise.

With --require-segmented, sroce must also have sent packets whose IP ID shows a
multi-packet send (a segment after the first from the device socket; from a connected
socket, a send after one of several segments, whose ID is at or below the highest
before it) and whose ICRCs scapy recomputed: the segmentation-offload convention itself
reached the peer, not only single datagrams.  (From a connected socket, the later
segments of a send, IDs +1 each, cannot be told from single datagrams in the capture
alone; test_wire_capture's icrc_check.py recomputes every packet's ICRC instead.)

Over IPv6 (no IP ID, no DF) the ICRC is the one check of a packet; it is
recomputed as icrc_check.py does, since scapy before 2.6 has no IPv6 form.
SROCE-IP and PEER-IP may be comma-separated lists (a link-local and a global
address).  With --ipv6-only every RoCEv2 packet between them must be IPv6.

With --flush-forms every FLUSH (RC opcode 0x1C) is checked, and one whose
ICRC is Linux rxe's form (the standard CRC continued over the transport
packet's bytes before the ICRC once more: wire-protocol.md 4.4) is counted
as such instead of as a mismatch; the counts per sender and form are printed
as "flush SENDER ibta=N legacy=M".

Usage: roce_peer_check.py CAPTURE.pcap SROCE-IP[,IP...] PEER-IP[,IP...] [--sample N]
                          [--flush-forms] [--require-segmented] [--ipv6-only]
Exit status: 0 all good, 1 a check failed, 77 scapy is missing.
"""
import argparse
import collections
import os
import socket
import struct
import sys
import zlib

try:
    from scapy.all import Ether, RawPcapReader
    from scapy.contrib.roce import BTH, _bth_opcodes
except ImportError as e:
    print(f"SKIP: scapy is not available: {e}", file=sys.stderr)
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from icrc_check import icrc_ipv6  # noqa: E402  (after the path it is found on)

ROCE_PORT = 4791
RC_FLUSH = 0x1C


MAX_SEGMENTS = 64
# How far a connected socket's ID may jump past the highest before it (IDs
# taken by datagrams not in the capture).
MAX_ID_GAP = 16


def parse(frame):
    """(src, dst, ip_id, df, sport, opcode, dqpn) of a RoCEv2 frame, else None;
    ip_id is None over IPv6."""
    ip = frame[14:]
    if frame[12:14] == b"\x08\x00" and len(ip) >= 20 and ip[0] >> 4 == 4:
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != socket.IPPROTO_UDP or len(ip) < ihl + 8 + 12:
            return None
        ip_id, frag = struct.unpack("!HH", ip[4:8])
        src, dst, df = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20]), bool(frag & 0x4000)
    elif frame[12:14] == b"\x86\xdd" and len(ip) >= 40 + 8 + 12 and ip[0] >> 4 == 6:
        if ip[6] != socket.IPPROTO_UDP:
            return None
        ihl, ip_id, df = 40, None, True
        src = socket.inet_ntop(socket.AF_INET6, ip[8:24])
        dst = socket.inet_ntop(socket.AF_INET6, ip[24:40])
    else:
        return None
    sport, dport = struct.unpack("!HH", ip[ihl:ihl + 4])
    if dport != ROCE_PORT:
        return None
    bth = ip[ihl + 8:]
    return (src, dst, ip_id, df, sport, bth[0], int.from_bytes(bth[5:8], "big"))


def icrc_of(frame):
    """(the ICRC scapy computes for the frame's headers, the BTH's offset)."""
    if frame[12:14] == b"\x86\xdd":
        return icrc_ipv6(Ether(frame)), 14 + 40 + 8
    return Ether(frame)[BTH].compute_icrc(b""), 14 + (frame[14] & 0x0F) * 4 + 8


def legacy_flush_icrc(frame, want, bth):
    """Linux rxe's own ICRC of a FLUSH: the CRC continued over its body once more."""
    return zlib.crc32(frame[bth:-4], int.from_bytes(want, "little")).to_bytes(4, "little")


def icrc_ok(frame):
    """Whether the frame's ICRC is right for its headers (in either FLUSH form)."""
    want, bth = icrc_of(frame)
    if want == frame[-4:]:
        return True
    return frame[bth] == RC_FLUSH and legacy_flush_icrc(frame, want, bth) == frame[-4:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pcap")
    ap.add_argument("sroce_ip")
    ap.add_argument("peer_ip")
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--flush-forms", action="store_true")
    ap.add_argument("--require-segmented", action="store_true")
    ap.add_argument("--ipv6-only", action="store_true")
    a = ap.parse_args()

    names = {ip: "sroce" for ip in a.sroce_ip.split(",")}
    names.update({ip: "rxe" for ip in a.peer_ip.split(",")})
    ipv4 = collections.Counter()
    total = collections.Counter()
    ops = collections.defaultdict(collections.Counter)
    checked = collections.Counter()
    nonzero_id = collections.Counter()
    no_df = collections.Counter()
    other_sport = collections.Counter()
    sports = collections.defaultdict(set)
    bad_id = []  # sroce packets whose ID is not their place in a send
    new_socket = 0  # jumps of a port's IDs that were a new socket on it
    last_id = {}  # sroce flow (dst, dqpn) -> IP ID of its latest packet
    highest = {}  # sroce connected socket (its port) -> highest IP ID
    sampled = collections.Counter()
    flush_forms = collections.defaultdict(collections.Counter)
    mismatches = []
    for n, (frame, _meta) in enumerate(RawPcapReader(a.pcap), 1):
        h = parse(frame)
        if h is None:
            continue
        src, dst, ip_id, df, sport, opcode, dqpn = h
        who = names.get(src)
        if who is None or names.get(dst) is None:
            continue
        total[who] += 1
        ops[who][opcode] += 1
        ipv4[who] += ip_id is not None
        nonzero_id[who] += bool(ip_id)
        # Whether the ID shows a multi-packet send (sampled apart below).
        segment = bool(ip_id)
        if ip_id is None:
            pass  # IPv6: nothing but the ICRC to check
        elif who == "sroce" and sport == ROCE_PORT:
            in_run = ip_id == last_id.get((dst, dqpn), -2) + 1
            if ip_id >= MAX_SEGMENTS or (ip_id and not in_run):
                bad_id.append(f"frame {n}: IP ID {ip_id:#06x}, the flow's previous "
                              f"{last_id.get((dst, dqpn))}")
            last_id[(dst, dqpn)] = ip_id
        elif who == "sroce":
            before = highest.get(sport)
            d = 0 if before is None else (ip_id - before + 0x8000) % 0x10000 - 0x8000
            if not 1 - MAX_SEGMENTS <= d <= MAX_ID_GAP:
                # A port freed by one process and bound again by another is a
                # new socket with a counter of its own: that is what a jump
                # is when the packet's ICRC is right for the ID it carries.
                if icrc_ok(frame):
                    new_socket += 1
                    before = None
                else:
                    bad_id.append(f"frame {n}: IP ID {ip_id:#06x} from port {sport}, the "
                                  f"socket's highest before {before:#06x}, and an ICRC "
                                  f"wrong for it")
            segment = before is not None and d <= 0
            if before is None or d > 0:
                highest[sport] = ip_id
        no_df[who] += not df
        other_sport[who] += sport != ROCE_PORT
        sports[who].add(sport)
        flush = a.flush_forms and opcode == RC_FLUSH
        # Sampled per opcode, and apart for packets whose ID shows a
        # multi-packet send: those prove the ICRC covers the ID a packet
        # really carries.
        key = (who, opcode, segment)
        sampled[key] += 1
        if sampled[key] <= a.sample or flush:
            want, bth = icrc_of(frame)
            got = frame[-4:]
            checked[who] += 1
            if flush:
                legacy = legacy_flush_icrc(frame, want, bth)
                form = "ibta" if got == want else "legacy" if got == legacy else None
                if form:
                    flush_forms[who][form] += 1
                    continue
            if want != got:
                where = "IPv6" if ip_id is None else f"IP ID {ip_id:#06x}"
                mismatches.append(f"frame {n} from {who} "
                                  f"{_bth_opcodes.get(opcode, hex(opcode))}, {where}: "
                                  f"ICRC {got.hex()} expected {want.hex()}")

    ok = True

    def bad(msg):
        nonlocal ok
        ok = False
        print(f"FAIL: {msg}", file=sys.stderr)

    for who in ("sroce", "rxe"):
        print(f"{who}: {total[who]} RoCEv2 packets ({total[who] - ipv4[who]} over IPv6), "
              f"{checked[who]} ICRCs recomputed, "
              f"{nonzero_id[who]} with a non-zero IP ID, {no_df[who]} without DF, "
              f"{other_sport[who]} from a source port other than {ROCE_PORT} "
              f"({len(sports[who])} distinct)")
        for op in sorted(ops[who]):
            print(f"  {op:#04x} {_bth_opcodes.get(op, '?'):<36} {ops[who][op]}")
        if total[who] == 0:
            bad(f"no RoCEv2 packet from {who}")
        if a.ipv6_only and ipv4[who]:
            bad(f"{who} sent {ipv4[who]} RoCEv2 packet(s) over IPv4")
    if a.flush_forms:
        for who in ("sroce", "rxe"):
            print(f"flush {who} ibta={flush_forms[who]['ibta']} "
                  f"legacy={flush_forms[who]['legacy']}")
    for m in mismatches[:30]:
        print(f"  {m}", file=sys.stderr)
    if mismatches:
        bad(f"{len(mismatches)} packet(s) with an ICRC scapy does not compute")
    if new_socket:
        print(f"sroce: {new_socket} connected socket(s) on a port an earlier one had")
    for m in bad_id[:10]:
        print(f"  {m}", file=sys.stderr)
    if bad_id or no_df["sroce"]:
        bad(f"sroce sent {len(bad_id)} packet(s) with an IP ID its socket does not give "
            f"and {no_df['sroce']} without DF")
    # Every key's first packets had their ICRC recomputed above.
    if a.require_segmented and not any(
            n for (who, _op, segment), n in sampled.items() if who == "sroce" and segment):
        bad("sroce sent no packet whose IP ID shows a multi-packet send: no "
            "segmentation-offload send reached the peer")
    if ipv4["rxe"] and not (nonzero_id["rxe"] and other_sport["rxe"]):
        bad("the rxe peer sent no packet with a non-zero IP ID from a port other than "
            f"{ROCE_PORT}: the IP ID solving path was not exercised")
    if ok:
        print("every recomputed ICRC matches scapy's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
