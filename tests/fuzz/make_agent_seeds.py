#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz_agent: one file per input.

An input is a byte choosing the steering (even: the slot map), then steps
(Harness::step in fuzz_agent.cpp), each a control byte and its fields.
The seeds are the conversations a fuzzer is slow to assemble by itself:
a device opened by root (a slot) and by another user (a relay); an
rdma_cm channel opened with a device record, its commands connection, and
a CREATE_ID on it, from its owner and from another user; a stop from
another user and from root; a slot claimed as a resumption with the
device's socket attached; listings.

Usage: make_agent_seeds.py OUTDIR
"""
import os
import struct
import sys

CONNECT, REQUEST, RAW, CM_COMMAND, CLOSE = 0, 1, 2, 3, 4
ROOT, ROOT2, NOBODY, USER = range(4)
OPEN_DEVICE, RESOURCES, STOP, STATUS, CM_CHANNEL, CM_COMMANDS = 1, 2, 3, 4, 5, 6
# request()'s fd byte: a good QP table, a second descriptor, that one a
# UDP socket of the device.
TABLE, SECOND, UDP = 1, 4, 8


def connect(who):
    return bytes([CONNECT, who])


def request(conn, op, dev=1, arg=None, devices=(), fds=0):
    # version byte != 0 mod 16: the right version; arg selector 1: 0 (or
    # the first channel for CM_COMMANDS), 0: the next byte.
    b = bytes([REQUEST, conn, op, 1, dev])
    b += bytes([1]) if arg is None else bytes([0, arg])
    b += bytes([len(devices)]) + bytes(devices) if devices else bytes([0])
    return b + bytes([fds])


def cm_command(conn, cmd, body, out_cap=256):
    return bytes([CM_COMMAND, conn, cmd, len(body), 1]) + struct.pack("<H", out_cap) + body


# ucma_abi_create_id: uid, response, ps (RDMA_PS_TCP), qp_type (RC).
CREATE_ID = struct.pack("<QQHB5x", 1, 0, 0x0106, 2)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        "open-root": connect(ROOT) + request(0, OPEN_DEVICE, fds=TABLE),
        "open-relayed": connect(NOBODY) + request(0, OPEN_DEVICE, dev=2, fds=TABLE),
        "open-classic": connect(ROOT) + request(0, OPEN_DEVICE, fds=TABLE),
        "channel": connect(ROOT) + request(0, CM_CHANNEL, devices=[1, 2]) + connect(ROOT) +
        request(1, CM_COMMANDS) + cm_command(1, 0, CREATE_ID),
        "channel-other": connect(ROOT) + request(0, CM_CHANNEL, devices=[1]) + connect(NOBODY) +
        request(1, CM_COMMANDS) + connect(ROOT2) + request(2, CM_COMMANDS),
        "stop-nobody": connect(NOBODY) + request(0, STOP),
        "stop-root": connect(ROOT) + request(0, STOP),
        "resume": connect(ROOT) + request(0, OPEN_DEVICE, fds=TABLE) + connect(ROOT2) +
        request(1, OPEN_DEVICE, arg=1, fds=TABLE | SECOND | UDP),
        "resume-relayed": connect(USER) + request(0, OPEN_DEVICE, dev=3, arg=2, fds=TABLE),
        "listings": connect(ROOT) + request(0, OPEN_DEVICE, fds=TABLE) + connect(USER) +
        request(1, STATUS) + connect(NOBODY) + request(2, RESOURCES) + bytes([CLOSE, 0]),
    }
    for name, body in seeds.items():
        steering = b"\x01" if name == "open-classic" else b"\x00"
        with open(os.path.join(out, name), "wb") as f:
            f.write(steering + body)


if __name__ == "__main__":
    main()
