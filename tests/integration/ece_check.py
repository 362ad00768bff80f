#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks in a capture of one rdma_cm connection which commit opcodes two
peers agreed on, and that the wire carries exactly those.

Usage: ece_check.py PCAP native|ibta|announced

The REQ must offer sroce's ECE (vendor ID 0xFFFFFF in its VendorID bytes,
options 0x5C00002F in the MAD's attribute modifier, as the kernel's CM puts
them).  For "native", the REP must answer with the same and the commits must
travel as sroce's write-commit opcodes 0xC0-0xC5, with no IBTA FLUSH; for
"ibta", the REP answers options 0 and the commits are WRITE + FLUSH (0x1C)
with no native opcode; for "announced", the REP answers options 0 but both
ends announce themselves in their packets' BTH, so the commits are native
all the same.  Layouts: docs/wire-protocol.md, docs/connection-manager.md.
"""
import collections
import sys

from scapy.all import UDP, PcapReader, raw

ROCE_PORT = 4791
BTH_LEN, DETH_LEN, MAD_HDR = 12, 8, 24
CM_CLASS = 0x07
REQ, REP = 0x0010, 0x0013
VENDOR = 0xFFFFFF
OFFER = 0x5C00002F
NATIVE = range(0xC0, 0xC6)
FLUSH = 0x1C


def cm_messages(pcap):
    """Yields (attribute ID, attribute modifier, vendor ID) of the CM MADs,
    and counts the BTH opcodes of everything else."""
    opcodes = collections.Counter()
    mads = []
    for pkt in PcapReader(pcap):
        if UDP not in pkt or pkt[UDP].dport != ROCE_PORT:
            continue
        p = raw(pkt[UDP].payload)
        if len(p) < BTH_LEN:
            continue
        dqpn = int.from_bytes(p[5:8], "big")
        if dqpn != 1:
            opcodes[p[0]] += 1
            continue
        mad = p[BTH_LEN + DETH_LEN :]
        if len(mad) < 256 or mad[1] != CM_CLASS:
            continue
        attr = int.from_bytes(mad[16:18], "big")
        mod = int.from_bytes(mad[20:24], "big")
        data = mad[MAD_HDR:]
        if attr == REQ:
            vendor = int.from_bytes(data[5:8], "big")
        elif attr == REP:
            vendor = data[15] << 16 | data[19] << 8 | data[23]
        else:
            continue
        mads.append((attr, mod, vendor))
    return mads, opcodes


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("native", "ibta", "announced"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    want = sys.argv[2]
    mads, opcodes = cm_messages(sys.argv[1])
    reqs = {(m, v) for a, m, v in mads if a == REQ}
    reps = {(m, v) for a, m, v in mads if a == REP}
    native = sum(opcodes[o] for o in NATIVE)
    flush = opcodes[FLUSH]
    def show(msgs):
        return ", ".join(f"options {m:#x} vendor {v:#x}" for m, v in sorted(msgs)) or "none"

    print(
        f"REQ: {show(reqs)}; REP: {show(reps)}; "
        f"native commit packets {native}, FLUSH packets {flush}"
    )
    problems = []
    if reqs != {(OFFER, VENDOR)}:
        problems.append(f"the REQ does not offer {OFFER:#x} under vendor {VENDOR:#x}")
    answer = OFFER if want == "native" else 0
    if reps != {(answer, VENDOR)}:
        problems.append(f"the REP does not answer {answer:#x} under vendor {VENDOR:#x}")
    if want in ("native", "announced") and (native == 0 or flush):
        problems.append("the commits are not native write-commit opcodes alone")
    if want == "ibta" and (native or flush == 0):
        problems.append("the commits are not IBTA FLUSH sequences alone")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
