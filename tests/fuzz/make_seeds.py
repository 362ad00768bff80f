#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz_rx: one file per input.

An input is a sequence of records (see Record in fuzz_rx.cpp): packets,
each led by a record byte, three steering bytes (Control, Target, Aim) and
a 16-bit length, packets for QP1, and actions on the memory a peer reaches
(ibv_dereg_mr, ibv_rereg_mr, windows) or on a QP's state, which a packet
may also carry out before it is sent.
The seeds are one well-formed packet of every opcode of every transport,
aimed at a QP of that transport with the PSN it expects (RC, UC, UD, RC on
an SRQ, XRC target), through memory regions and memory windows, responses
preceded by the request they answer, the NAK and RNR syndromes, and a few
malformed shapes; then FLUSH and the native write-commit opcodes on memory
in the persistence domain and elsewhere, the verbs that post them, multi-
packet messages interrupted by a deregistration, a re-registration or an
invalidation, and CM MADs for QP1.  The ICRC is left zero because the
harness fills in the right one unless the control byte says otherwise.

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
# Aim: which memory, and the flavour of the verbs sroce adds.
PERSISTENT = 1 << 0
NEW_VERB = 1 << 1  # POST_WRITE/READ/ATOMIC/SEND_OP: write-commit/FLUSH/ATOMIC WRITE/commit imm
NATIVE = 1 << 2
ORDERED = 1 << 3
GLOBAL = 1 << 4
# Aim bits 5-7: an action before the packet (kPreActions in fuzz_rx.cpp).
PRE_DEREG_VOLATILE, PRE_DEREG_FILE, PRE_NO_ACCESS, PRE_READ_ONLY, PRE_MOVE_VOLATILE, \
    PRE_MOVE_FILE, PRE_INVALIDATE = (k << 5 for k in range(1, 8))
# Records.
REC_PACKET, REC_QP1, REC_DEREG, REC_REREG_ACCESS, REC_REREG_MOVE, REC_WINDOWS, \
    REC_QP_STATE = range(7)
SLOT_VOLATILE, SLOT_FILE, SLOT_WINDOWS = range(3)
# kAccessVariants in fuzz_rx.cpp.
ACCESS_NONE, ACCESS_READ_ONLY, ACCESS_NO_FLUSH, ACCESS_UNCACHED, ACCESS_HOME = range(5)
WINDOWS_INVALIDATE, WINDOWS_BIND, WINDOWS_REALLOC, WINDOWS_INVALIDATE_IN_ORDER = range(4)
# FETH: placement type (IBV_FLUSH_GLOBAL 1, IBV_FLUSH_PERSISTENT 2), level << 4.
FLUSH_GLOBAL, FLUSH_PERSISTENT, FLUSH_MR = 1, 2, 1 << 4
# CETH byte 0.
CETH_ORDERED, CETH_IMMED, CETH_GLOBAL = 1, 2, 4
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


def feth(bits):
    return struct.pack(">I", bits)


def ceth(bits):
    return bytes([bits, 0, 0, 0])


def rec(kind, arg=0):
    return bytes([kind | arg << 4])


def pkt_rec(ctl, target, pkt, aim=0, fill=False):
    """A packet record; `fill`: the harness grows the payload to the path MTU."""
    return rec(REC_PACKET, int(fill)) + bytes([ctl, target, aim]) + \
        struct.pack(">H", len(pkt)) + pkt


def qp1_rec(pkt, as_given=False, keep_icrc=False):
    return rec(REC_QP1, int(as_given) | int(keep_icrc) << 1) + struct.pack(">H", len(pkt)) + pkt


def dereg(slot):
    return rec(REC_DEREG, slot)


def rereg_access(slot, variant):
    return rec(REC_REREG_ACCESS, slot | variant << 1)


def rereg_move(slot, cross=False, access=False):
    which = 8 if slot == SLOT_WINDOWS else slot
    return rec(REC_REREG_MOVE, which | int(cross) << 1 | int(access) << 2)


def windows(action):
    return rec(REC_WINDOWS, action)


def qp_state(kind, sqd=False):
    return rec(REC_QP_STATE, kind | int(sqd) << 3)


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


def persistence_seeds():
    """FLUSH and native write-commits, on memory in the persistence domain
    (P) and elsewhere (V), at the responder and posted by the RC QP."""
    mtu = 1024
    write_p = pkt_rec(AIMED, RC, packet(0x0A, reth(0x100, 0, 64), data(64)), PERSISTENT)
    yield "p_write_only", write_p
    yield "p_flush_persistent", write_p + pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT) + reth(0x100, 0, 64)), PERSISTENT)
    yield "p_flush_persistent_mr", write_p + pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT | FLUSH_MR) + reth(0, 0, 0)), PERSISTENT)
    yield "p_flush_both_types", pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT | FLUSH_GLOBAL) + reth(0x40, 0, 8)),
        PERSISTENT)
    yield "v_flush_global", pkt_rec(AIMED, RC, packet(0x1C, feth(FLUSH_GLOBAL) + reth(0, 0, 64)))
    yield "v_flush_persistent_refused", pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT) + reth(0, 0, 64)))
    yield "p_flush_qp_without_access", pkt_rec(
        AIMED, RC_SRQ, packet(0x1C, feth(FLUSH_PERSISTENT) + reth(0, 0, 64)), PERSISTENT)
    yield "p_atomic_write_flush", pkt_rec(
        AIMED, RC, packet(0x1D, reth(0x200, 0, 8), data(8)), PERSISTENT) + pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT) + reth(0x200, 0, 8)), PERSISTENT)
    yield "p_commit_only", pkt_rec(
        AIMED, RC, packet(0xC4, reth(0x300, 0, 100) + ceth(0), data(100)), PERSISTENT)
    yield "p_commit_only_imm", pkt_rec(
        POST_RECV | AIMED, RC,
        packet(0xC5, reth(0x300, 0, 12) + ceth(CETH_IMMED) + b"\0\0\0\5", data(12)),
        PERSISTENT)
    yield "p_commit_ordered", write_p + pkt_rec(
        AIMED, RC, packet(0xC4, reth(0x400, 0, 8) + ceth(CETH_ORDERED), data(8)), PERSISTENT)
    yield "v_commit_global", pkt_rec(
        AIMED, RC, packet(0xC4, reth(0x300, 0, 16) + ceth(CETH_GLOBAL), data(16)))
    yield "v_commit_persistent_refused", pkt_rec(
        AIMED, RC, packet(0xC4, reth(0x300, 0, 16) + ceth(0), data(16)))
    yield "p_commit_bad_ceth", pkt_rec(
        AIMED, RC, packet(0xC4, reth(0x300, 0, 16) + b"\x80\0\0\1", data(16)), PERSISTENT)
    yield "p_commit_multi", pkt_rec(
        AIMED, RC, packet(0xC0, reth(0x1000, 0, 2 * mtu + 40) + ceth(CETH_ORDERED), data(mtu)),
        PERSISTENT) + pkt_rec(AIMED, RC, packet(0xC1, payload=data(mtu, 2))) + pkt_rec(
        AIMED, RC, packet(0xC2, payload=data(40, 3)))
    yield "p_commit_uc_dropped", pkt_rec(
        AIMED, UC, packet(0xC4, reth(0x300, 0, 16) + ceth(0), data(16)), PERSISTENT)
    # The RC QP as requester: the verbs, then the answer each one waits for.
    ack = packet(0x11, aeth(0x1F), ackreq=False)
    empty_read_resp = packet(0x10, aeth(0x1F), ackreq=False)
    yield "post_write_commit_native", pkt_rec(POST_WRITE | AIMED, RC, ack, NEW_VERB | NATIVE)
    yield "post_write_commit_ibta", pkt_rec(POST_WRITE | AIMED, RC, ack, NEW_VERB)
    yield "post_write_commit_ordered_ibta", pkt_rec(
        POST_WRITE | AIMED, RC, empty_read_resp, NEW_VERB | ORDERED)
    yield "post_flush", pkt_rec(POST_READ | AIMED, RC, empty_read_resp, NEW_VERB)
    yield "post_flush_mr_global", pkt_rec(
        POST_READ | AIMED, RC, empty_read_resp, NEW_VERB | ORDERED | GLOBAL)
    yield "post_atomic_write", pkt_rec(POST_ATOMIC | AIMED, RC, empty_read_resp, NEW_VERB)
    yield "post_commit_imm_native", pkt_rec(
        POST_SEND_OP | AIMED, RC, ack, NEW_VERB | NATIVE | GLOBAL)
    yield "post_commit_nak", pkt_rec(
        POST_WRITE | AIMED, RC, packet(0x11, aeth(0x63), ackreq=False), NEW_VERB | NATIVE)


def interrupted_seeds():
    """Messages that span packets, with the memory they write taken away
    between two of them: no byte may land after the action returns."""
    mtu = 1024

    def write3(aim=0, target=RC, first=0x06, middle=0x07, last=0x08, ext=b""):
        # Each packet one MTU, filled in by the harness.
        return (pkt_rec(AIMED, target, packet(first, reth(0x1000, 0, 3 * mtu) + ext, data(16)),
                        aim, fill=True),
                pkt_rec(AIMED, target & ~WINDOW, packet(middle, payload=data(16, 2)), fill=True),
                pkt_rec(AIMED, target & ~WINDOW, packet(last, payload=data(16, 3)), fill=True))

    first, middle, last = write3()
    yield "dereg_mid_write", first + dereg(SLOT_VOLATILE) + middle + last
    yield "rereg_no_access_mid_write", first + rereg_access(SLOT_VOLATILE, ACCESS_NONE) + \
        middle + last
    yield "rereg_read_only_mid_write", first + rereg_access(SLOT_VOLATILE, ACCESS_READ_ONLY) + \
        middle + last
    yield "rereg_move_mid_write", first + rereg_move(SLOT_VOLATILE) + middle + last
    yield "rereg_move_cross_mid_write", first + rereg_move(SLOT_VOLATILE, cross=True) + \
        middle + last
    yield "qp_error_mid_write", first + qp_state(RC) + middle + last
    # The same with the action carried by the packet after it.
    yield "pre_dereg_mid_write", first + pkt_rec(
        AIMED, RC, packet(0x07, payload=data(16, 2)), PRE_DEREG_VOLATILE, fill=True) + last
    yield "pre_move_mid_write", first + pkt_rec(
        AIMED, RC, packet(0x07, payload=data(16, 2)), PRE_MOVE_VOLATILE, fill=True) + last
    first, middle, last = write3(PERSISTENT)
    yield "p_dereg_mid_write", first + dereg(SLOT_FILE) + middle + last
    yield "p_pre_read_only_mid_write", first + pkt_rec(
        AIMED, RC, packet(0x07, payload=data(16, 2)), PRE_READ_ONLY, fill=True) + last
    yield "p_rereg_move_mid_write", first + rereg_move(SLOT_FILE) + middle + last
    yield "p_rereg_uncached_mid_write", first + rereg_access(SLOT_FILE, ACCESS_UNCACHED) + \
        middle + last
    first, middle, last = write3(PERSISTENT, first=0xC0, middle=0xC1, last=0xC2, ext=ceth(0))
    yield "p_rereg_move_mid_commit", first + rereg_move(SLOT_FILE) + middle + last
    yield "p_rereg_no_flush_mid_commit", first + rereg_access(SLOT_FILE, ACCESS_NO_FLUSH) + \
        middle + last
    # Bytes written, the MR moved or gone, then a commit: what it makes
    # durable is what the MR maps now.
    write_p = pkt_rec(AIMED, RC, packet(0x0A, reth(0x100, 0, 64), data(64)), PERSISTENT)
    commit_p = pkt_rec(AIMED, RC, packet(0xC4, reth(0x800, 0, 8) + ceth(0), data(8)), PERSISTENT)
    yield "p_rereg_move_then_commit", write_p + rereg_move(SLOT_FILE) + commit_p
    yield "p_rereg_cross_then_commit", write_p + \
        rereg_move(SLOT_FILE, cross=True, access=True) + commit_p
    yield "p_dereg_then_commit", write_p + dereg(SLOT_FILE) + commit_p
    yield "p_rereg_move_then_flush", write_p + rereg_move(SLOT_FILE) + pkt_rec(
        AIMED, RC, packet(0x1C, feth(FLUSH_PERSISTENT | FLUSH_MR) + reth(0, 0, 0)), PERSISTENT)
    # Through a window: invalidated, or deallocated, mid-message.
    first, middle, last = write3(target=RC | WINDOW)
    yield "invalidate_mid_write", windows(WINDOWS_BIND) + first + \
        windows(WINDOWS_INVALIDATE) + middle + last
    yield "realloc_mid_write", first + windows(WINDOWS_REALLOC) + middle + last
    yield "invalidate_in_order_mid_write", first + windows(WINDOWS_INVALIDATE_IN_ORDER) + \
        middle + last
    yield "send_inv_elsewhere_mid_write", first + pkt_rec(
        POST_RECV | AIMED, RC_SRQ, packet(0x17, b"\0\0\0\0", data(8))) + middle + last
    first, middle, last = write3(target=UC | WINDOW, first=0x26, middle=0x27, last=0x28)
    yield "uc_invalidate_mid_write", first + windows(WINDOWS_INVALIDATE) + middle + last
    first, middle, last = write3(target=RC | WINDOW)
    yield "rereg_move_windows_memory_mid_write", windows(WINDOWS_BIND) + first + \
        rereg_move(SLOT_WINDOWS) + middle + last
    yield "dereg_windows_memory", windows(WINDOWS_INVALIDATE) + dereg(SLOT_WINDOWS) + \
        windows(WINDOWS_BIND) + pkt_rec(
            AIMED, RC | WINDOW, packet(0x0A, reth(0x100, 0, 64), data(64)))
    # A SEND into a posted receive, a READ's responses into local memory.
    yield "dereg_mid_send", pkt_rec(
        POST_RECV | AIMED, RC, packet(0x00, payload=data(mtu))) + dereg(SLOT_VOLATILE) + \
        pkt_rec(AIMED, RC, packet(0x01, payload=data(mtu))) + \
        pkt_rec(AIMED, RC, packet(0x02, payload=data(8)))
    yield "dereg_mid_srq_send", pkt_rec(
        POST_RECV | AIMED, RC_SRQ, packet(0x00, payload=data(mtu))) + dereg(SLOT_VOLATILE) + \
        pkt_rec(AIMED, RC_SRQ, packet(0x02, payload=data(8)))
    yield "dereg_mid_read_response", pkt_rec(
        POST_READ | AIMED, RC, packet(0x0D, aeth(0x1F), data(mtu), ackreq=False)) + \
        dereg(SLOT_VOLATILE) + pkt_rec(
            AIMED, RC, packet(0x0E, payload=data(mtu), ackreq=False)) + pkt_rec(
            AIMED, RC, packet(0x0F, aeth(0x1F), data(452), ackreq=False))
    yield "rereg_read_only_atomic_response", pkt_rec(
        POST_ATOMIC | RESET_QP, RC, b"") + rereg_access(SLOT_VOLATILE, ACCESS_READ_ONLY) + \
        pkt_rec(AIMED, RC, packet(0x12, aeth(0x1F) + struct.pack(">Q", 42), ackreq=False))
    yield "sqd_then_write", qp_state(RC, sqd=True) + pkt_rec(
        AIMED, RC, packet(0x0A, reth(0x100, 0, 64), data(64)))


def cm_req_mad():
    """A CM REQ as the kernel's rdma_cm sends one (the fields the CM reads
    first; the rest zero)."""
    hdr = struct.pack(">BBBBHHQHHI", 1, 0x07, 2, 0x03, 0, 0, 0x1234, 0x0010, 0, 0)
    body = bytearray(232)
    struct.pack_into(">I", body, 0, 0x11223344)               # local communication ID
    struct.pack_into(">Q", body, 8, 0x0000000001060000 | 7471)  # service ID: RDMA_PS_TCP, port
    struct.pack_into(">I", body, 32, 0x000123 << 8)           # local QPN
    return hdr + bytes(body)


def qp1_seeds():
    """Packets for QP1, where CM MADs go."""
    deth = struct.pack(">II", 0x80010000, 1)
    yield "qp1_cm_req", qp1_rec(packet(0x64, deth, cm_req_mad(), qpn=1))
    yield "qp1_rc_write", qp1_rec(packet(0x0A, reth(0x100, 0, 8), data(8)))
    yield "qp1_wrong_qkey", qp1_rec(packet(0x64, struct.pack(">II", 0x1234, 1), cm_req_mad(),
                                           qpn=1), as_given=True)
    yield "qp1_then_write", qp1_rec(packet(0x64, deth, cm_req_mad(), qpn=1)) + pkt_rec(
        AIMED, RC, packet(0x0A, reth(0x100, 0, 64), data(64)))


# Multi-packet messages as one input each: an input starts with no message
# in progress (fuzz_rx.cpp settles the QPs first).
CHAINS = {
    "chain_send": ("send_first", "send_middle", "send_last"),
    "chain_send_imm": ("send_first", "send_middle", "send_last_imm"),
    "chain_send_inv": ("send_first", "send_last_inv"),
    "chain_write": ("write_first", "write_middle", "write_last"),
    "chain_write_imm": ("write_first", "write_middle", "write_last_imm"),
    "chain_read_resp": ("read_resp_first", "read_resp_middle", "read_resp_last"),
    "chain_uc_send": ("uc_send_first", "uc_send_last_imm"),
    "chain_uc_write": ("uc_write_first", "uc_write_last_imm"),
    "chain_selective": ("sr_held_write", "sr_held_run", "sr_fill"),
}


def compact_chain_seeds():
    """Multi-packet messages whose packets the harness fills to the MTU: a
    few bytes each, so that mutations reach the bytes between them."""
    mtu = 1024
    for name, target, ops, ext in (
            ("compact_write", RC, (0x06, 0x07, 0x08), reth(0x1000, 0, 3 * mtu)),
            ("compact_commit", RC, (0xC0, 0xC1, 0xC2), reth(0x1000, 0, 3 * mtu) + ceth(0)),
            ("compact_uc_write", UC, (0x26, 0x27, 0x28), reth(0x1000, 0, 3 * mtu)),
            ("compact_send", RC, (0x00, 0x02), b""),
            ("compact_srq_send", RC_SRQ, (0x00, 0x02), b"")):
        ctl = AIMED | (POST_RECV if not ext else 0)
        out = b""
        for i, op in enumerate(ops):
            aim = PERSISTENT if op >= 0xC0 else 0
            out += pkt_rec(ctl if i == 0 else AIMED, target,
                           packet(op, ext if i == 0 else b"", data(8, i)), aim, fill=True)
        yield name, out


def chain_seeds(single):
    """Each chain's packets; only the first posts a request or resets the QP."""
    for name, parts in CHAINS.items():
        out = b""
        for i, part in enumerate(parts):
            target, ctl, pkt = single[part]
            if i:
                ctl &= ~(POST_SEND | 3 << 5 | RESET_QP)
            out += pkt_rec(ctl, target, pkt)
        yield name, out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    single = {name: (RC, ctl, pkt) for name, ctl, pkt in seeds()}
    single.update({name: (target, ctl, pkt) for name, target, ctl, pkt in transport_seeds()})
    inputs = [(name, pkt_rec(ctl, target, pkt)) for name, (target, ctl, pkt) in single.items()]
    inputs += list(chain_seeds(single)) + list(compact_chain_seeds())
    inputs += list(persistence_seeds()) + list(interrupted_seeds()) + list(qp1_seeds())
    for name, content in inputs:
        with open(os.path.join(out, name), "wb") as f:
            f.write(content)


if __name__ == "__main__":
    main()
