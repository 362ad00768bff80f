#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz_rx: one file per input.

An input is a control byte and a target byte (see Control and Target in
fuzz_rx.cpp) followed by a RoCEv2 transport packet (BTH onwards, ICRC last).
The seeds are one well-formed packet of every opcode of every transport,
aimed at a QP of that transport with the PSN it expects (RC, UC, UD, RC on
an SRQ, XRC target), through memory regions and memory windows, responses
preceded by the request they answer, the NAK and RNR syndromes, and a few
malformed shapes; the ICRC is left zero because the harness fills in the
right one unless the control byte says otherwise.

Usage: make_seeds.py OUTDIR
"""
import os
import struct
import sys

KEEP_ICRC = 1 << 0
OWN_QP = 1 << 1
EXPECTED_PSN = 1 << 2
RESET_QP = 1 << 3
POST_SEND = 1 << 4
POST_RECV = 1 << 7
POST_WRITE, POST_READ, POST_ATOMIC, POST_SEND_OP = (POST_SEND | k << 5 for k in range(4))
AIMED = OWN_QP | EXPECTED_PSN
RC, UC, UD, RC_SRQ, XRC, RC_SELECTIVE = range(6)
WINDOW = 1 << 3
# A run of 2 + k copies (PSN + i, IP ID i) in one segmentation-offload send.
RUN = 1 << 4
RUN_SHORT_LAST = 1 << 7


def run(copies):
    return RUN | (copies - 2) << 5


def bth(op, psn=0, pad=0, ackreq=True, qpn=0x11, pkey=0xFFFF, tver=0):
    return struct.pack(">BBHB3sB3s", op, (pad & 3) << 4 | tver, pkey, 0,
                       qpn.to_bytes(3, "big"), 0x80 if ackreq else 0,
                       psn.to_bytes(3, "big"))


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


def atomic_eth(va, rkey, swap_add, compare):
    return struct.pack(">QIQQ", va, rkey, swap_add, compare)


def aeth(syndrome, msn=1):
    return struct.pack(">B3s", syndrome, msn.to_bytes(3, "big"))


def packet(op, ext=b"", payload=b"", **kw):
    pad = -len(payload) % 4
    return bth(op, pad=pad, **kw) + ext + payload + b"\0" * pad + b"\0" * 4


def data(n, seed=1):
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


def seeds():
    mtu = 1024
    yield "send_only", POST_RECV | AIMED, packet(0x04, payload=data(100))
    yield "send_only_imm", POST_RECV | AIMED, packet(0x05, b"\x12\x34\x56\x78", data(7))
    yield "send_only_inv", POST_RECV | AIMED, packet(0x17, b"\0\0\0\1", data(8))
    yield "send_first", POST_RECV | AIMED, packet(0x00, payload=data(mtu))
    yield "send_middle", AIMED, packet(0x01, payload=data(mtu))
    yield "send_last", AIMED, packet(0x02, payload=data(5))
    yield "send_last_imm", AIMED, packet(0x03, b"\0\0\0\7", data(12))
    yield "send_last_inv", AIMED, packet(0x16, b"\0\0\0\7", data(12))
    yield "send_no_recv", RESET_QP | AIMED, packet(0x04, payload=data(16))
    yield "write_only", AIMED, packet(0x0A, reth(0x100, 0, 64), data(64))
    yield "write_only_imm", POST_RECV | AIMED, packet(0x0B, reth(0x200, 0, 3) + b"\0\0\0\1",
                                                      data(3))
    yield "write_first", AIMED, packet(0x06, reth(0x1000, 0, 3 * mtu), data(mtu))
    yield "write_middle", AIMED, packet(0x07, payload=data(mtu))
    yield "write_last", AIMED, packet(0x08, payload=data(mtu))
    yield "write_last_imm", AIMED, packet(0x09, b"\0\0\0\2", data(100))
    yield "write_zero", AIMED, packet(0x0A, reth(0, 0, 0))
    yield "write_out_of_mr", AIMED, packet(0x0A, reth(0xFFFC, 0, 8), data(8))
    yield "write_unaimed_rkey", EXPECTED_PSN, packet(0x0A, reth(0x100, 0, 8), data(8))
    yield "read", AIMED, packet(0x0C, reth(0x2000, 0, 2500))
    yield "read_only", AIMED, packet(0x0C, reth(0x2000, 0, 64))
    yield "read_zero", AIMED, packet(0x0C, reth(0, 0, 0))
    yield "compare_swap", AIMED, packet(0x13, atomic_eth(0x3000, 0, 7, 0x5A5A5A5A5A5A5A5A))
    yield "fetch_add", AIMED, packet(0x14, atomic_eth(0x3008, 0, 1, 0))
    yield "fetch_add_misaligned", AIMED, packet(0x14, atomic_eth(0x3004, 0, 1, 0))
    yield "flush", AIMED, packet(0x1C, b"\0\0\0\1" + reth(0x100, 0, 64))
    yield "atomic_write", AIMED, packet(0x1D, reth(0x100, 0, 8), data(8))
    yield "psn_ahead", OWN_QP, packet(0x0A, reth(0x100, 0, 4), data(4), psn=0x123456)
    # Responses, each after posting the request it answers.
    yield "ack", POST_WRITE | AIMED, packet(0x11, aeth(0x1F), ackreq=False)
    for name, syn in (("nak_psn", 0x60), ("nak_inv", 0x61), ("nak_acc", 0x62),
                      ("nak_op", 0x63), ("nak_rd", 0x64), ("nak_reserved", 0x7F),
                      ("rnr", 0x21), ("rnr_long", 0x3F), ("aeth_reserved", 0x40)):
        yield name, POST_WRITE | AIMED, packet(0x11, aeth(syn), ackreq=False)
    yield "read_resp_only", POST_READ | AIMED, packet(0x10, aeth(0x1F), data(2500 - 2 * mtu),
                                                      ackreq=False)
    yield "read_resp_first", POST_READ | AIMED, packet(0x0D, aeth(0x1F), data(mtu), ackreq=False)
    yield "read_resp_middle", POST_READ | AIMED, packet(0x0E, payload=data(mtu), ackreq=False)
    yield "read_resp_last", POST_READ | AIMED, packet(0x0F, aeth(0x1F), data(452), ackreq=False)
    yield "read_resp_nak", POST_READ | AIMED, packet(0x10, aeth(0x62), ackreq=False)
    yield "atomic_ack", POST_ATOMIC | AIMED, packet(0x12, aeth(0x1F) + struct.pack(">Q", 42),
                                                    ackreq=False)
    yield "send_ack", POST_SEND_OP | AIMED, packet(0x11, aeth(0x1F), ackreq=False)
    # Malformed shapes.
    yield "truncated", AIMED, packet(0x0A, reth(0x100, 0, 64), data(64))[:20]
    yield "tver", AIMED, packet(0x0A, reth(0x100, 0, 4), data(4), tver=1)
    yield "unknown_opcode", AIMED, packet(0x15, payload=data(8))
    yield "ud_send", AIMED, packet(0x64, b"\0" * 8, data(8))
    yield "pkey", AIMED, packet(0x0A, reth(0x100, 0, 4), data(4), pkey=0x1234)
    yield "bad_icrc", KEEP_ICRC | AIMED, packet(0x0A, reth(0x100, 0, 4), data(4))
    yield "empty", 0, b""


def xrceth():
    return b"\0\0\0\0"  # the harness names its XRC SRQ


def deth():
    return b"\0" * 8  # the harness fills in its Q_Key


def transport_seeds():
    mtu = 1024
    yield "uc_send_only", UC, POST_RECV | AIMED, packet(0x24, payload=data(100))
    yield "uc_send_first", UC, POST_RECV | AIMED, packet(0x20, payload=data(mtu))
    yield "uc_send_last_imm", UC, AIMED, packet(0x23, b"\0\0\0\7", data(12))
    yield "uc_write_only", UC, AIMED, packet(0x2A, reth(0x100, 0, 64), data(64))
    yield "uc_write_first", UC, AIMED, packet(0x26, reth(0x1000, 0, 2 * mtu), data(mtu))
    yield "uc_write_last_imm", UC, POST_RECV | AIMED, packet(0x29, b"\0\0\0\2", data(mtu))
    yield "uc_psn_gap", UC, OWN_QP, packet(0x25, b"\0\0\0\1", data(8), psn=0x42)
    yield "ud_send_only", UD, POST_RECV | AIMED, packet(0x64, deth(), data(100))
    yield "ud_send_only_imm", UD, POST_RECV | AIMED, packet(0x65, deth() + b"\0\0\0\1", data(8))
    yield "ud_too_long", UD, POST_RECV | AIMED, packet(0x64, deth(), data(3000))
    yield "ud_wrong_qkey", UD, POST_RECV | OWN_QP, packet(0x64, b"\1" * 8, data(8))
    yield "srq_send_only", RC_SRQ, POST_RECV | AIMED, packet(0x04, payload=data(100))
    yield "srq_send_first", RC_SRQ, POST_RECV | AIMED, packet(0x00, payload=data(mtu))
    yield "srq_write_imm", RC_SRQ, POST_RECV | AIMED, packet(0x0B, reth(0x200, 0, 3) +
                                                             b"\0\0\0\1", data(3))
    yield "xrc_send_only", XRC, POST_RECV | AIMED, packet(0xA4, xrceth(), data(100))
    yield "xrc_write_only", XRC, AIMED, packet(0xAA, xrceth() + reth(0x100, 0, 64), data(64))
    yield "xrc_read", XRC, AIMED, packet(0xAC, xrceth() + reth(0x2000, 0, 2500))
    yield "xrc_fetch_add", XRC, AIMED, packet(0xB4, xrceth() + atomic_eth(0x3008, 0, 1, 0))
    yield "xrc_bad_srqn", XRC, OWN_QP | EXPECTED_PSN, packet(0xA4, b"\0\0\1\0", data(4))
    yield "mw_write", RC | WINDOW, AIMED, packet(0x0A, reth(0x100, 0, 64), data(64))
    yield "mw_read", RC | WINDOW, AIMED, packet(0x0C, reth(0x2000, 0, 100))
    yield "mw_atomic", RC | WINDOW, AIMED, packet(0x14, atomic_eth(0x3008, 0, 1, 0))
    yield "mw_send_inv", RC | WINDOW, POST_RECV | AIMED, packet(0x17, b"\0\0\0\0", data(8))
    yield "mw1_write_uc", UC | WINDOW, AIMED, packet(0x2A, reth(0x100, 0, 64), data(64))
    yield "mw_beyond_window", RC | WINDOW, AIMED, packet(0x0A, reth(0x8000, 0, 0x10000), data(8))
    # Coalesced receives: runs of middles (the PSNs follow on), of SENDs
    # with the last shorter, of UD datagrams, and of ACKs.
    yield "run_write_middles", RC | run(5), AIMED, packet(0x07, payload=data(mtu))
    yield "run_sends_short_last", RC | run(3) | RUN_SHORT_LAST, POST_RECV | AIMED, \
        packet(0x04, payload=data(64))
    yield "run_ud_sends", UD | run(4), POST_RECV | AIMED, packet(0x64, deth(), data(100))
    yield "run_acks", RC | run(2), POST_WRITE | AIMED, packet(0x11, aeth(0x1F))
    # Selective repeat: requests past a gap are held (the QP expects
    # 0xFFFFF0 after a reset), then filled; SACKs naming gaps, well formed
    # and not.
    yield "sr_held_write", RC_SELECTIVE, RESET_QP | OWN_QP, \
        packet(0x0A, reth(0x100, 0, 64), data(64), psn=0xFFFFF2)
    yield "sr_held_run", RC_SELECTIVE | run(4), OWN_QP, \
        packet(0x0A, reth(0x100, 0, 64), data(64), psn=0xFFFFF3)
    yield "sr_fill", RC_SELECTIVE, AIMED, packet(0x0A, reth(0x100, 0, 64), data(64))
    sack = b"\0\0\0\5" + struct.pack(">HH", 0, 2) + struct.pack(">HH", 3, 1)
    yield "sr_sack", RC_SELECTIVE, POST_WRITE | AIMED, packet(0xC6, aeth(0x1F), sack, ackreq=False)
    yield "sr_sack_short", RC_SELECTIVE, POST_WRITE | AIMED, \
        packet(0xC6, aeth(0x1F), b"\0\0\0\5", ackreq=False)
    yield "sr_sack_nak", RC_SELECTIVE, POST_WRITE | AIMED, packet(0xC6, aeth(0x60), sack, ackreq=False)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, ctl, pkt in seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([ctl, RC]) + pkt)
    for name, target, ctl, pkt in transport_seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([ctl, target]) + pkt)


if __name__ == "__main__":
    main()
