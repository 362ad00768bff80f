#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz_cm_state: one file per input.

An input is a sequence of steps (Step and Command in fuzz_cm_state.cpp),
played on the scene the harness sets first.  The seeds are the exchanges a
fuzzer is slow to assemble by itself: a connection of the CM with itself
(its REQ looped back to its own listener) up to DREQ, DREP and timewait; the
same for SIDR; the CM's REQ to a remote peer answered with REP, MRA or REJ;
a peer's REQ and SIDR_REQ to the listeners, accepted, refused and left to
time out; retransmission until UNREACHABLE; ids destroyed and channels
closed mid-exchange; migration and multicast joins; a REQ whose retry is
2^31 ms away.

Usage: make_cm_state_seeds.py OUTDIR
"""
import os
import struct
import sys

# Steps (the control byte's low three bits) and commands.
MAD, ANSWER, LOOP, TIME, CMD, CMD2, RAW_CMD, RAW_MAD = range(8)
(GET_EVENT, ACCEPT, ACCEPT_RTU, REJECT, DISCONNECT, DESTROY, CREATE, BIND_IP, BIND, RESOLVE_IP,
 RESOLVE_ADDR, RESOLVE_ROUTE, CONNECT, LISTEN, SET_OPTION, NOTIFY, INIT_QP_ATTR, QUERY, QUERY_ROUTE,
 MIGRATE, JOIN, JOIN_IP, LEAVE, CLOSE, OPEN, COMMANDS) = range(26)
# kMad/kAnswer attribute indices.
REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP = range(9)
# Time steps: indices into kSteps, and the one that moves to the next timer.
T_6200, T_1M, T_BIG, T_NEXT = 6, 9, 13, 14
AIM = 1 << 4

# The scene: channels (by position) and handles (by position, in the order
# the harness learns them).
P1, P2 = 0, 1
L_TCP, L_UDP, A_SELF, A_SIDR, A_PEER, L_V6, A_V6, NEW = range(8)
# MADs the CM sent after the scene, newest first.
SENT_V6_REQ, SENT_PEER_REQ, SENT_SIDR_REQ, SENT_SELF_REQ = range(4)
FIRST_NEW_EVENT = 6  # the scene's ADDR_RESOLVED and ROUTE_RESOLVED on P1


def op(step, arg=0):
    return bytes([step | arg << 3])


def cmd(ch, which, variant=0, *args):
    return op(CMD, ch) + bytes([which + COMMANDS * variant, *args])


def get_events(ch, n):
    return cmd(ch, GET_EVENT) * n


def u16(v):
    return struct.pack(">H", v)


def u32(v):
    return struct.pack(">I", v)


def param(qpn, pd_len=0, flags=0xFF, rr=1, depth=1):
    return u32(qpn) + bytes([pd_len, flags, rr, depth])


def accept(ch, h, qpn, uid=4, pd_len=0):
    return cmd(ch, ACCEPT, 0, h, uid) + param(qpn, pd_len) + b"\0"


def accept_rtu(ch, h):
    return cmd(ch, ACCEPT_RTU, 0, h, 0, 0)


def mad(attr, how, body=b"", tid=0x77):
    return op(MAD, attr) + bytes([how]) + u16(tid) + bytes([len(body)]) + body


def answer(attr, sent, body=b"", how=0):
    return op(ANSWER, attr) + bytes([how, sent]) + u16(0) + bytes([len(body)]) + body


def loop(sent=0):
    return op(LOOP) + bytes([sent])


def time(k, n=1):
    return op(TIME, k) * n


def body(size, **fields):
    """A message body: fields are (offset, bytes)."""
    b = bytearray(size)
    for off, v in fields.values():
        b[off:off + len(v)] = v
    return bytes(b)


PEER_COMM = u32(0x00C0FFEE)
PEER_GUID = struct.pack(">Q", 0x0002C9FFFE0000AA)


def rep_body(qpn=0x999, psn=0x123):
    return body(36, comm=(0, PEER_COMM), qpn=(12, u32(qpn << 8)), psn=(20, u32(psn << 8)),
                res=(24, b"\1\1"), delay=(26, bytes([15 << 3])), rnr=(27, b"\xE0"),
                guid=(28, PEER_GUID))


def req_body(qpn=0x444, tst=0):
    # Response timeouts 20, transport RC/UC, PSN, retries, P_Key, MTU 1024,
    # 15 CM retries, ACK timeout 19.
    return body(96, comm=(0, PEER_COMM), guid=(16, PEER_GUID), qpn=(32, u32(qpn << 8 | 1)),
                depth=(39, b"\1"), t=(43, bytes([20 << 3 | tst << 1])),
                psn=(44, u32(0x555 << 8 | 20 << 3 | 7)), pkey=(48, b"\xFF\xFF\x37\xF0"),
                ack=(95, bytes([19 << 3])))


def seeds():
    # The CM connected with itself: REQ to its TCP listener, REP, RTU, then
    # DREQ, DREP and timewait, each through the loop back.
    self_rc = (loop(SENT_SELF_REQ) + get_events(P1, FIRST_NEW_EVENT + 1) +
               accept(P1, NEW, 0x666) + loop() + accept_rtu(P1, A_SELF) + loop() +
               get_events(P1, 2))
    yield "self_rc", self_rc
    yield "self_rc_disconnect", (self_rc + cmd(P1, DISCONNECT, 0, A_SELF) + loop() +
                                 cmd(P1, DISCONNECT, 0, NEW) + loop() + time(T_1M) +
                                 get_events(P1, 4) + cmd(P1, DESTROY, 0, A_SELF) +
                                 cmd(P1, DESTROY, 0, NEW))
    yield "self_rc_destroy", self_rc + cmd(P1, DESTROY, 0, NEW) + loop() + loop(1) + time(T_NEXT, 4)
    yield "self_rc_close", self_rc + cmd(P1, CLOSE) + loop() + loop(1) + loop(2)
    yield "self_rc_rep_lost", (loop(SENT_SELF_REQ) + get_events(P1, FIRST_NEW_EVENT + 1) +
                               accept(P1, NEW, 0x666) + time(T_NEXT, 3) + loop() + loop() +
                               time(T_NEXT, 20))
    yield "self_rc_reject", (loop(SENT_SELF_REQ) + get_events(P1, FIRST_NEW_EVENT + 1) +
                             cmd(P1, REJECT, 1, NEW, 20) + loop() + get_events(P1, 1))
    yield "self_rc_duplicate_req", loop(SENT_SELF_REQ) + loop(SENT_SELF_REQ) + loop(SENT_SELF_REQ)
    # The same over IPv6, device C's REQ to the wildcard listener of both
    # families, then an IPv4 REQ to that listener.
    yield "self_rc_v6", (loop(SENT_V6_REQ) + get_events(P1, FIRST_NEW_EVENT + 1) +
                         accept(P1, NEW, 0x999) + loop() + accept_rtu(P1, A_V6) + loop() +
                         get_events(P1, 2) + cmd(P1, DISCONNECT, 0, A_V6) + loop() + loop())
    yield "req_v4_to_dual_listener", mad(REQ, AIM | 2 << 5, req_body()) + get_events(P1, 8)

    # SIDR with itself: SIDR_REQ to the UDP listener, accepted or refused.
    self_sidr = loop(SENT_SIDR_REQ) + get_events(P1, FIRST_NEW_EVENT + 1)
    yield "self_sidr", self_sidr + accept(P1, NEW, 0x777) + loop() + get_events(P1, 2)
    yield "self_sidr_reject", self_sidr + cmd(P1, REJECT, 0, NEW, 8) + loop() + get_events(P1, 2)
    yield "self_sidr_destroy", self_sidr + cmd(P1, DESTROY, 0, NEW) + loop()
    # A UD id that joined a group has its Q_Key; a SIDR_REP with another
    # one is an address error.
    yield "sidr_qkey_mismatch", (cmd(P1, CREATE, 0, 4, 1) +
                                 cmd(P1, RESOLVE_IP, 0, NEW, 1, 2 << 3 | 1) +
                                 cmd(P1, JOIN, 0, 0, 5, NEW) + cmd(P1, RESOLVE_ROUTE, 0, NEW) +
                                 cmd(P1, CONNECT, 0, NEW) + param(0x55) + b"\0" +
                                 answer(SIDR_REP, 0, body(24, q=(20, u32(0x11111111)))) +
                                 get_events(P1, 8))
    yield "sidr_timeout", time(T_NEXT, 18) + get_events(P1, 6)

    # The CM's REQ to a remote peer, answered by the peer.
    peer_rc = answer(REP, SENT_PEER_REQ, rep_body()) + accept_rtu(P2, A_PEER)
    yield "peer_rc", peer_rc + get_events(P2, 4)
    yield "peer_rc_dreq", (peer_rc + answer(DREQ, 0, body(12)) + get_events(P2, 4) +
                           cmd(P2, DISCONNECT, 0, A_PEER) + time(T_1M) + get_events(P2, 1))
    yield "peer_rc_disconnect", (peer_rc + cmd(P2, DISCONNECT, 0, A_PEER) +
                                 answer(DREP, 0, body(8)) + time(T_1M) + get_events(P2, 6))
    yield "peer_rc_dreq_timeout", (peer_rc + cmd(P2, DISCONNECT, 0, A_PEER) + time(T_6200, 17) +
                                   get_events(P2, 5))
    yield "peer_rc_rep_again", peer_rc + answer(REP, 1, rep_body())
    yield "peer_mra", (answer(MRA, SENT_PEER_REQ, body(10, m=(8, b"\x00\xA0"))) +
                       answer(REP, SENT_PEER_REQ, rep_body()) + accept_rtu(P2, A_PEER) +
                       time(T_NEXT, 3))
    yield "peer_mra_timeout", (answer(MRA, SENT_PEER_REQ, body(10, m=(8, b"\x00\x08"))) +
                               time(T_NEXT, 20) + get_events(P2, 3))
    yield "peer_rej", answer(REJ, SENT_PEER_REQ, body(12, r=(10, u16(28)))) + get_events(P2, 3)
    yield "peer_rej_stale", (answer(REJ, SENT_PEER_REQ, body(12, r=(10, u16(10)))) +
                             time(T_1M) + get_events(P2, 3))
    yield "peer_unreachable", time(T_6200, 17) + get_events(P2, 3)
    yield "peer_rc_destroy", answer(REP, SENT_PEER_REQ, rep_body()) + cmd(P2, DESTROY, 0, A_PEER)

    # A peer's REQ to the TCP listener, accepted: RTU, DREQ, and the CM's
    # DREP when the id goes.
    peer_req = mad(REQ, AIM, req_body()) + get_events(P1, FIRST_NEW_EVENT + 1)
    yield "req_accept", (peer_req + accept(P1, NEW, 0x888, pd_len=20) + answer(RTU, 0, body(8)) +
                         answer(DREQ, 0, body(12)) + get_events(P1, 2) + cmd(P1, DESTROY, 0, NEW) +
                         time(T_1M))
    yield "req_accept_mra_rep", (peer_req + accept(P1, NEW, 0x888) +
                                 answer(MRA, 0, body(10, m=(8, b"\x40\xA0"))) + time(T_NEXT, 3) +
                                 cmd(P1, NOTIFY, 0, NEW) + cmd(P1, INIT_QP_ATTR, 0, NEW, 3))
    yield "req_reject", peer_req + cmd(P1, REJECT, 1, NEW, 0) + answer(REQ, 0, req_body())
    yield "req_uc", mad(REQ, AIM, req_body(tst=1)) + mad(REQ, AIM | 2 << 5, req_body())
    yield "req_stale_qpn", (peer_req + accept(P1, NEW, 0x888) + answer(RTU, 0, body(8)) +
                            mad(REQ, AIM, u32(5) + req_body()[4:]))
    yield "req_backlog", mad(REQ, AIM, req_body()) * 6
    yield "sidr_req", (mad(SIDR_REQ, AIM | 1 << 5) + get_events(P1, FIRST_NEW_EVENT + 1) +
                       accept(P1, NEW, 0x123) + mad(SIDR_REQ, AIM | 1 << 5))
    yield "sidr_req_refused", mad(SIDR_REQ, AIM | 0 << 5) + mad(SIDR_REQ, 2 << 2 | AIM | 1 << 5)

    # Ids and channels: migration (to the other channel and to its own),
    # multicast, options and queries on the scene's ids.
    yield "migrate", (cmd(P2, MIGRATE, 0, A_SELF, P1) + cmd(P1, MIGRATE, 0, L_TCP, P1) +
                      loop(SENT_SELF_REQ) + get_events(P2, 3))
    yield "multicast", (cmd(P1, CREATE, 0, 4, 1) + cmd(P1, BIND_IP, 0, NEW, 1) +
                        cmd(P1, JOIN, 0, 0, 5, NEW) + cmd(P1, JOIN_IP, 0, 1, 5, NEW) +
                        get_events(P1, 5) + cmd(P1, LEAVE, 0, NEW + 1) + cmd(P1, DESTROY, 0, NEW))
    yield "new_connect", (cmd(P2, CREATE, 0, 4, 0) + cmd(P2, SET_OPTION, 0, 3, NEW, 30) +
                          cmd(P2, RESOLVE_IP, 0, NEW, 1, 1 << 3 | 1) +
                          cmd(P2, RESOLVE_ROUTE, 0, NEW) + cmd(P2, CONNECT, 0, NEW) +
                          param(0x1234) + b"\1" + cmd(P2, QUERY_ROUTE, 0, NEW) +
                          cmd(P2, QUERY, 0, NEW, 1) + time(T_NEXT, 3))
    # An ACK timeout option of 39 puts the REQ's retry 2^31 ms away: alone
    # (the scene's exchanges ended), timers() must still answer a positive int.
    yield "long_ack_timeout", (cmd(P2, CREATE, 0, 4, 0) + cmd(P2, SET_OPTION, 0, 3, NEW, 39) +
                               cmd(P2, RESOLVE_IP, 0, NEW, 1, 1 << 3 | 1) +
                               cmd(P2, RESOLVE_ROUTE, 0, NEW) + cmd(P2, CONNECT, 0, NEW) +
                               param(0x1234) + b"\0" + cmd(P1, CLOSE) +
                               cmd(P1, DESTROY, 0, A_PEER) + time(0))
    yield "close_all", cmd(P1, CLOSE) + cmd(P1, CLOSE) + cmd(P1, OPEN) + loop(2) + loop(1)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
