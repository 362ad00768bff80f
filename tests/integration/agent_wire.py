#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Speaks the sroce agent's control protocol (providers/sroce/agent_proto.hpp)
as a hostile or careless client would, for test_agent_trust.sh.

  agent_wire.py table-bytes
      prints the size of the QP table the agent takes;
  agent_wire.py table SIZE sealed|unsealed [truncate]
      kOpenDevice for 127.0.29.1 with a QP table memfd of SIZE bytes;
      prints "err N MSG" or "slot N"; with `truncate`, an accepted table is
      then cut to 0 bytes while the slot is held, and the slot is held until
      stdin closes.
  agent_wire.py channel
      opens an rdma_cm channel and its commands connection; prints
      "channel N commands-err E" and holds both until stdin closes.
  agent_wire.py commands N
      asks for the commands of channel N; prints "err E".
  agent_wire.py bind PORT
      opens an rdma_cm channel, creates an RDMA_PS_TCP id and binds it to
      127.0.29.1:PORT (rdma_bind_addr); prints "err E" of the bind.
  agent_wire.py slots N
      leases up to N process slots of 127.0.29.2, holding each, until an
      error; prints "opened K err E MSG".
  agent_wire.py addrs N
      leases a slot on each of 127.0.30.1, 127.0.30.2, ... (N addresses),
      holding each, until an error; prints "served K err E MSG".
  agent_wire.py channels N
      opens up to N rdma_cm channels (their event connections), holding
      each, until an error; prints "opened K err E MSG".
  agent_wire.py ids N
      opens an rdma_cm channel and creates ids until N or an error; prints
      "created K err E".
  agent_wire.py joins N
      opens an rdma_cm channel naming 127.0.29.1, binds an RDMA_PS_UDP id
      there and joins groups 239.29.x.y with it until N or an error, never
      reading an event; prints "joined K err E".
  agent_wire.py resolve N
      opens an rdma_cm channel naming 127.0.29.1 and resolves one id's
      address to 127.0.29.1 (RESOLVE_IP) until N or an error, never reading
      an event; then reads one and resolves once more; prints
      "resolved K err E, after reading one err E2".
  agent_wire.py listen PORT BACKLOG
      listens on 127.0.29.1:PORT with BACKLOG on a channel naming
      127.0.29.1, prints "listening", reads no event until stdin closes,
      then reads them all; prints "requests K": the connection requests
      that were queued.
  agent_wire.py connect PORT N
      N ids, each resolved (its events read) and connected to
      127.0.29.1:PORT (RDMA_PS_TCP); prints "connecting K err E".
  agent_wire.py steal SECONDS
      leases a slot of 127.0.29.1 and turns what it got against the
      address's other users: steers the whole reuseport group to its slot
      (SO_ATTACH_REUSEPORT_CBPF), detaches the group's program
      (SO_DETACH_REUSEPORT_BPF) and connects to 127.0.29.2:4791; prints
      "ready" and then, after SECONDS, "attacks K received N": how many of
      the three the kernel took, and how many datagrams came in meanwhile
      (the slot has no QP, so every one is another's).
  agent_wire.py malformed
      sends, each on a connection of its own, requests that are short,
      oversized, of another version, of an unknown kind, with a
      descriptor where none belongs, an open without its descriptor, an
      rdma_cm channel whose device list is cut, a new open with a second
      descriptor, and a claim to resume slot 1 of 127.0.29.1, which no
      dead agent left to it; prints one line per request: its name and
      the answer ("err E", or "no reply").
  agent_wire.py full PORT
      a channel naming 127.0.29.1 listens on PORT and fills with
      undelivered events; an id of another channel with one event
      migrates onto it (MIGRATE_ID), and an id of a third connects to
      the listener; then it reads every event, migrates again and waits
      for the connection request the connecting CM sends again; prints
      "queued N migrate err E requests K, after reading them migrate err
      E2 requests K2".
  agent_wire.py resume ADDRESS SLOT
      claims SLOT of ADDRESS as held under an agent that died; prints
      "err E MESSAGE" (0 when granted).
  agent_wire.py squat FILE UID...
      binds the names the agents of UIDs would listen on (@sroce-agent-UID)
      and listens, as a squatter would, and tries to bind the system
      agent's socket file; writes "ready system E" to FILE (E: the errno
      of that try, or "bound"), then how many bytes clients sent it, after
      each one.
The socket is @$SROCE_AGENT_SOCKET, else the system agent's
(/run/sroce/agent-NETNS.sock)."""
import ctypes
import errno
import fcntl
import os
import resource
import select
import socket
import struct
import sys
import time

def _proto_constants():
    # The agent's protocol version and QP table size, as this source tree's
    # engine has them.
    hdr = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "providers",
                       "sroce", "agent_proto.hpp")
    found = {}
    with open(hdr, encoding="utf-8") as f:
        for line in f:
            if line.startswith("constexpr uint32_t kProtoVersion = "):
                found["version"] = int(line.split("=")[1].strip(" ;\n"))
            elif line.startswith("constexpr uint32_t kTableEntries = "):
                found["entries"] = int(line.split("=")[1].split(";")[0].strip())
            elif line.startswith("static_assert(sizeof(QpEntry) == "):
                found["entry"] = int(line.split("==")[1].strip(" );\n"))
    if len(found) != 3:
        raise SystemExit(f"no kProtoVersion, kTableEntries or sizeof(QpEntry) in {hdr}")
    return found["version"], found["entries"] * found["entry"]


PROTO, TABLE_BYTES = _proto_constants()
OPEN_DEVICE, STOP, STATUS, CM_CHANNEL, CM_COMMANDS = 1, 3, 4, 5, 6
REQUEST = struct.Struct("<II64s16s16sI")
OPEN_REPLY = struct.Struct("<IiII256s")


def system_socket():
    return f"/run/sroce/agent-{os.stat('/proc/self/ns/net').st_ino}.sock"


def connect():
    """To the agent a process would use: $SROCE_AGENT_SOCKET, else the
    system agent's socket file."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    name = os.environ.get("SROCE_AGENT_SOCKET")
    s.connect("\0" + name if name else system_socket())
    return s


def mapped(address):
    """The 16-byte form of an IPv4 address the agent protocol carries."""
    return bytes(10) + b"\xff\xff" + socket.inet_aton(address)


def request(op, name=b"", netdev=b"", addr=bytes(16), reserved=0):
    return REQUEST.pack(op, PROTO, name, netdev, addr, reserved)


def reply(s):
    data, fds, _, _ = socket.recv_fds(s, OPEN_REPLY.size, 4)
    for fd in fds:
        os.close(fd)
    if len(data) != OPEN_REPLY.size:
        return None
    _, err, slot, _, msg = OPEN_REPLY.unpack(data)
    return err, slot, msg.split(b"\0")[0].decode()


def lease(size, sealed, address="127.0.29.1"):
    """Asks for a slot with a QP table of `size` bytes: (socket, memfd, reply)."""
    fd = os.memfd_create("hostile-qps", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    s = connect()
    socket.send_fds(s, [request(OPEN_DEVICE, b"trust", b"lo", mapped(address))], [fd])
    return s, fd, reply(s)


def hold_leases(n, address_of):
    """Leases slots, the k-th on address_of(k), holding each, until n or an
    error: (how many, errno, message)."""
    held = []
    err, msg = 0, ""
    while len(held) < n:
        s, fd, r = lease(TABLE_BYTES, True, address_of(len(held)))
        os.close(fd)
        if r is None or r[0]:
            err, msg = (r[0], r[2]) if r else (-1, "no reply")
            break
        held.append(s)
    return len(held), err, msg


def slots(n):
    k, err, msg = hold_leases(n, lambda _: "127.0.29.2")
    print(f"opened {k} err {err} {msg}".rstrip(), flush=True)


def addrs(n):
    k, err, msg = hold_leases(n, lambda i: f"127.0.30.{i + 1}")
    print(f"served {k} err {err} {msg}".rstrip(), flush=True)


def table(size, sealed, truncate):
    s, fd, r = lease(size, sealed)
    if r is None:
        print("no reply", flush=True)
        return
    err, slot, msg = r
    print(f"err {err} {msg}" if err else f"slot {slot}", flush=True)
    if not err and truncate:
        os.ftruncate(fd, 0)
        sys.stdin.read()


def channel():
    ch = cm_channel()
    if ch:
        print(f"channel {ch[2]} commands-err 0", flush=True)
        sys.stdin.read()


def commands(number):
    s = connect()
    s.send(request(CM_COMMANDS, reserved=number))
    r = reply(s)
    print("no reply" if r is None else f"err {r[0]}", flush=True)


CM_COMMAND = struct.Struct("<IIII")
CM_REPLY = struct.Struct("<iI")
CMD_CREATE_ID, CMD_BIND_IP, CMD_RESOLVE_IP, CMD_RESOLVE_ROUTE = 0, 2, 3, 4
CMD_CONNECT, CMD_LISTEN, CMD_GET_EVENT, CMD_JOIN_MCAST = 6, 7, 12, 22
RDMA_PS_TCP, RDMA_PS_UDP, IBV_QPT_RC, IBV_QPT_UD = 0x0106, 0x0111, 2, 4
EVENT_CONNECT_REQUEST = 4
EAGAIN = 11
# CmDeviceInfo: address, index, GUID, MTU, name, interface, GID table.
DEVICE_INFO = struct.Struct("<16sI4xQB7x64s16s256s")


def cm_command(s, cmd, body, out_cap):
    s.send(CM_COMMAND.pack(cmd, len(body), out_cap, 0) + body)
    data = s.recv(CM_REPLY.size + 4096)
    err, out_len = CM_REPLY.unpack_from(data)
    return err, data[CM_REPLY.size:CM_REPLY.size + out_len]


def cm_channel(device=False):
    """An rdma_cm channel's two connections and its number, or None (the
    reason printed).  With `device`, the process says it has trust0
    (127.0.29.1), which ids can then bind, join and connect through."""
    ev = connect()
    devices = b""
    if device:
        devices = DEVICE_INFO.pack(mapped("127.0.29.1"), 0, 0x0200_0000_0000_0001, 3, b"trust0", b"lo",
                                   bytes(16) + mapped("127.0.29.1"))
    ev.send(request(CM_CHANNEL) + devices)
    r = reply(ev)
    if r is None or r[0]:
        print("channel-err " + ("no reply" if r is None else f"{r[0]} {r[2]}"), flush=True)
        return None
    number = r[1]
    cmd = connect()
    cmd.send(request(CM_COMMANDS, reserved=number))
    r = reply(cmd)
    if r is None or r[0]:
        print("commands-err " + ("no reply" if r is None else str(r[0])), flush=True)
        return None
    return ev, cmd, number


def create_id(cmd, ps=RDMA_PS_TCP, qp_type=IBV_QPT_RC):
    return cm_command(cmd, CMD_CREATE_ID, struct.pack("<QQHB5x", 1, 0, ps, qp_type), 4)


def new_id(cmd, ps=RDMA_PS_TCP, qp_type=IBV_QPT_RC):
    """A new id's handle, or None (the reason printed)."""
    err, out = create_id(cmd, ps, qp_type)
    if err:
        print(f"create-err {err}", flush=True)
        return None
    return struct.unpack_from("<I", out)[0]


def sin6(address, port):
    """A sockaddr_in (family AF_INET) in a sockaddr_in6-sized field."""
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + \
        socket.inet_aton(address) + bytes(20)


def get_event(cmd):
    """(errno, event number)."""
    err, out = cm_command(cmd, CMD_GET_EVENT, struct.pack("<Q", 0), 4096)
    return err, (struct.unpack_from("<I", out, 12)[0] if not err else None)


def resolve_ip(cmd, handle, port=0):
    return cm_command(cmd, CMD_RESOLVE_IP, sin6("0.0.0.0", 0) + sin6("127.0.29.1", port) +
                      struct.pack("<II", handle, 2000), 0)[0]


def channels(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 64)), hard))
    held = []
    err, msg = 0, ""
    while len(held) < n:
        ev = connect()
        ev.send(request(CM_CHANNEL))
        r = reply(ev)
        if r is None or r[0]:
            err, msg = (r[0], r[2]) if r else (-1, "no reply")
            break
        held.append(ev)
    print(f"opened {len(held)} err {err} {msg}".rstrip(), flush=True)


def ids(n):
    ch = cm_channel()
    if not ch:
        return
    created, err = 0, 0
    while created < n:
        err, _ = create_id(ch[1])
        if err:
            break
        created += 1
    print(f"created {created} err {err}", flush=True)


def bind(port):
    ch = cm_channel()
    if not ch:
        return
    cmd = ch[1]
    err, out = create_id(cmd)
    if err:
        print(f"create-err {err}", flush=True)
        return
    (handle,) = struct.unpack_from("<I", out)
    err, _ = cm_command(cmd, CMD_BIND_IP, struct.pack("<Q", 0) + sin6("127.0.29.1", port) +
                        struct.pack("<I", handle), 0)
    print(f"err {err}", flush=True)


def bound_id(cmd, port, ps=RDMA_PS_TCP, qp_type=IBV_QPT_RC):
    """A new id bound to 127.0.29.1:PORT, or None (the reason printed)."""
    handle = new_id(cmd, ps, qp_type)
    if handle is None:
        return None
    err, _ = cm_command(cmd, CMD_BIND_IP, struct.pack("<Q", 0) + sin6("127.0.29.1", port) +
                        struct.pack("<I", handle), 0)
    if err:
        print(f"bind-err {err}", flush=True)
        return None
    return handle


def joins(n):
    ch = cm_channel(device=True)
    if not ch:
        return
    cmd = ch[1]
    handle = bound_id(cmd, 0, RDMA_PS_UDP, IBV_QPT_UD)
    if handle is None:
        return
    joined, err = 0, 0
    while joined < n:
        group = socket.inet_aton(f"239.29.{joined >> 8 & 255}.{joined & 255}")
        addr = struct.pack("<HH", socket.AF_INET, 0) + group + bytes(120)
        # uid, id, addr_size (sockaddr_in), join_flags (full member), addr.
        err, _ = cm_command(cmd, CMD_JOIN_MCAST,
                            struct.pack("<QQIHH", 0, 1, handle, 16, 0) + addr, 4)
        if err:
            break
        joined += 1
    print(f"joined {joined} err {err}", flush=True)


def resolve(n):
    ch = cm_channel(device=True)
    if not ch:
        return
    cmd = ch[1]
    handle = new_id(cmd)
    if handle is None:
        return
    resolved, err = 0, 0
    while resolved < n:
        err = resolve_ip(cmd, handle)
        if err:
            break
        resolved += 1
    read, _ = get_event(cmd)
    again = resolve_ip(cmd, handle) if not read else f"read-err {read}"
    print(f"resolved {resolved} err {err}, after reading one err {again}", flush=True)


def listen(port, backlog):
    ch = cm_channel(device=True)
    if not ch:
        return
    cmd = ch[1]
    handle = bound_id(cmd, port)
    if handle is None:
        return
    err, _ = cm_command(cmd, CMD_LISTEN, struct.pack("<II", handle, backlog), 0)
    if err:
        print(f"listen-err {err}", flush=True)
        return
    print("listening", flush=True)
    sys.stdin.read()
    requests = 0
    while True:
        err, event = get_event(cmd)
        if err:
            break
        requests += event == EVENT_CONNECT_REQUEST
    print(f"requests {requests}" + (f" err {err}" if err != EAGAIN else ""), flush=True)


def connect_ids(port, n, quiet=False):
    ch = cm_channel(device=True)
    if not ch:
        return
    cmd = ch[1]
    connecting, err = 0, 0
    while connecting < n and not err:
        handle = new_id(cmd)
        if handle is None:
            return
        # What rdma_resolve_addr and rdma_resolve_route do, their events read.
        err = resolve_ip(cmd, handle, port) or get_event(cmd)[0] or \
            cm_command(cmd, CMD_RESOLVE_ROUTE, struct.pack("<II", handle, 2000), 0)[0] or \
            get_event(cmd)[0]
        if err:
            break
        # conn_param: a QP number of its own each (the same one from one
        # GUID twice would be a stale connection), responder resources,
        # initiator depth, retry counts, valid; then the id, ECE.
        param = struct.pack("<II256sBBBBBBBB", 0x100 + connecting, 0, b"", 0, 0, 1, 1, 0, 7, 7, 1)
        err, _ = cm_command(cmd, CMD_CONNECT, param + struct.pack("<IIII", handle, 0, 0, 0), 0)
        if not err:
            connecting += 1
    if not quiet:
        print(f"connecting {connecting} err {err}", flush=True)
    return ch


CMD_MIGRATE_ID = 18


def full(port):
    """A channel filled with undelivered events: an id migrating onto it,
    and a connection request to its listener, are refused until it reads."""
    ch = cm_channel(device=True)
    if not ch:
        return
    ev, cmd, _ = ch
    listener = bound_id(cmd, port)
    if listener is None:
        return
    err, _ = cm_command(cmd, CMD_LISTEN, struct.pack("<II", listener, 8), 0)
    handle = new_id(cmd)
    if err or handle is None:
        print(f"listen-err {err}", flush=True)
        return
    queued = 0
    while not resolve_ip(cmd, handle):
        queued += 1
    other = cm_channel(device=True)
    moving = new_id(other[1]) if other else None
    if moving is None or resolve_ip(other[1], moving):
        print("other-channel-err", flush=True)
        return

    def migrate():
        return cm_command(cmd, CMD_MIGRATE_ID, struct.pack("<QII", 0, moving, other[2]), 4)[0]

    refused = migrate()
    connecting = connect_ids(port, 1, quiet=True)  # held: its id retries
    time.sleep(1)

    def drain():
        requests = 0
        while True:
            err, event = get_event(cmd)
            if err:
                return requests
            requests += event == EVENT_CONNECT_REQUEST

    dropped = drain()
    again = migrate()
    # The connecting side's CM sends its REQ again after its timeout.
    later = 0
    for _ in range(150):
        later += drain()
        if later:
            break
        time.sleep(0.1)
    print(f"queued {queued} migrate err {refused} requests {dropped}, after reading them "
          f"migrate err {again} requests {later}", flush=True)
    del connecting


SO_ATTACH_REUSEPORT_CBPF, SO_DETACH_REUSEPORT_BPF = 51, 68
BPF_RET_K = 0x06


def steal(seconds):
    fd = os.memfd_create("hostile-qps", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, TABLE_BYTES)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    s = connect()
    socket.send_fds(s, [request(OPEN_DEVICE, b"thief", b"lo", mapped("127.0.29.1"))], [fd])
    data, fds, _, _ = socket.recv_fds(s, OPEN_REPLY.size, 4)
    if len(data) != OPEN_REPLY.size or not fds:
        print("lease-err no reply", flush=True)
        return
    _, err, slot, _, _ = OPEN_REPLY.unpack(data)
    if err:
        print(f"lease-err {err}", flush=True)
        return
    got = socket.socket(fileno=fds[0])
    attacks = 0
    # "return SLOT": every packet of the address to this slot.
    code = ctypes.create_string_buffer(struct.pack("<HBBI", BPF_RET_K, 0, 0, slot))
    prog = struct.pack("<H6xQ", 1, ctypes.addressof(code))
    for attack in (lambda: got.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, prog),
                   lambda: got.setsockopt(socket.SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, 0),
                   lambda: got.connect(("127.0.29.2", 4791))):
        try:
            attack()
            attacks += 1
        except (OSError, TypeError):  # TypeError: no inet address for a Unix socket
            pass
    print("ready", flush=True)
    got.settimeout(0.2)
    received = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if got.recv(65536):
                received += 1
        except OSError:
            pass
    print(f"attacks {attacks} received {received}", flush=True)


def malformed():
    def answer(name, data, fds=()):
        s = connect()
        socket.send_fds(s, [data], list(fds)) if fds else s.send(data)
        r = reply(s)
        print(f"{name} " + ("no reply" if r is None else f"err {r[0]}"), flush=True)

    memfd = os.memfd_create("stray")
    answer("short", request(STATUS)[:12])
    answer("oversized", request(CM_CHANNEL) + bytes(40000))
    answer("version", REQUEST.pack(STATUS, PROTO + 1, b"", b"", bytes(16), 0))
    answer("unknown", request(99))
    answer("stray-descriptor", request(STATUS), [memfd])
    answer("open-without-table", request(OPEN_DEVICE, b"x", b"lo", mapped("127.0.29.1")))
    answer("cut-device-list", request(CM_CHANNEL) + bytes(40))
    table = sealed_table()
    answer("two-descriptors", request(OPEN_DEVICE, b"x", b"lo", mapped("127.0.29.1")), [table, memfd])
    answer("resume-unheld", request(OPEN_DEVICE, b"x", b"lo", mapped("127.0.29.1"), 1), [table])
    # No wildcard (IPv6 or IPv4), group or broadcast address is a device's;
    # an empty one is every address of an interface, which must exist.
    answer("any6", request(OPEN_DEVICE, b"x", b"nosuchif0", bytes(16)), [table])
    answer("any4", request(OPEN_DEVICE, b"x", b"lo", mapped("0.0.0.0")), [table])
    answer("group6", request(OPEN_DEVICE, b"x", b"lo", socket.inet_pton(socket.AF_INET6, "ff02::1")),
           [table])
    answer("broadcast", request(OPEN_DEVICE, b"x", b"lo", mapped("255.255.255.255")), [table])
    os.close(table)
    os.close(memfd)


def sealed_table():
    fd = os.memfd_create("qps", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, TABLE_BYTES)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def resume(address, slot):
    """Claims `slot` of `address` as one's own to resume after an agent's
    death; prints the answer."""
    s = connect()
    fd = sealed_table()
    socket.send_fds(s, [request(OPEN_DEVICE, b"trust", b"lo", mapped(address), slot)], [fd])
    r = reply(s)
    print("no reply" if r is None else f"err {r[0]} {r[2]}", flush=True)


def squat(path, uids):
    """Binds the names agents of `uids` would listen on, and tries the
    system agent's socket file; writes "ready system E" (E: the errno name
    of that try, or "bound") to `path`, then how many bytes clients sent."""
    socks = []
    for uid in uids:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(f"\0sroce-agent-{uid}")
        s.listen(16)
        socks.append(s)
    system = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        system.bind(system_socket())
        tried = "bound"
    except OSError as e:
        tried = errno.errorcode.get(e.errno, str(e.errno))
    with open(path, "w") as f:
        f.write(f"ready system {tried}\n")
    got = 0
    while True:
        ready, _, _ = select.select(socks, [], [])
        c, _ = ready[0].accept()
        c.settimeout(2)
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                got += len(b)
        except OSError:
            pass
        c.close()
        with open(path, "w") as f:
            f.write(f"{got}\n")


def main():
    cmd = sys.argv[1]
    if cmd == "table-bytes":
        print(TABLE_BYTES)
    elif cmd == "table":
        table(int(sys.argv[2]), sys.argv[3] == "sealed", len(sys.argv) > 4)
    elif cmd == "channel":
        channel()
    elif cmd == "commands":
        commands(int(sys.argv[2]))
    elif cmd == "bind":
        bind(int(sys.argv[2]))
    elif cmd == "slots":
        slots(int(sys.argv[2]))
    elif cmd == "addrs":
        addrs(int(sys.argv[2]))
    elif cmd == "channels":
        channels(int(sys.argv[2]))
    elif cmd == "ids":
        ids(int(sys.argv[2]))
    elif cmd == "joins":
        joins(int(sys.argv[2]))
    elif cmd == "resolve":
        resolve(int(sys.argv[2]))
    elif cmd == "listen":
        listen(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == "connect":
        connect_ids(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == "steal":
        steal(float(sys.argv[2]))
    elif cmd == "malformed":
        malformed()
    elif cmd == "full":
        full(int(sys.argv[2]))
    elif cmd == "resume":
        resume(sys.argv[2], int(sys.argv[3]))
    elif cmd == "squat":
        squat(sys.argv[2], [int(u) for u in sys.argv[3:]])
    else:
        sys.exit(f"agent_wire.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
