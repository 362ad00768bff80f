#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# rdma_cm over sroce (docs/connection-manager.md): Debian's unmodified
# rdmacm-utils and perftest, linked against rdma-core's own librdmacm,
# connect through the sroce agent's connection manager.  Server and client
# are separate processes on two devices on lo; each must exit 0 with its
# data checked (rping -v verifies every ping, ucmatose and rdma_server/
# rdma_client check their transfers, rstream and riostream (rsockets) their
# streams); UD ids through SIDR (udaddy, ib_send_bw -c UD -R) and multicast
# (mckey).  Faults:
# a client whose server is gone or dies with its request pending gets
# REJECTED, a peer killed after the connection is established ends its
# partner with an error, never a hang; garbage datagrams to QP1 are counted
# and dropped.
#
# Usage: test_rdma_cm.sh BUILD-DIR
# ctest: TIMEOUT=400 RESOURCE_LOCK=lo-127.0.19.1,lo-127.0.19.2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout rping ucmatose udaddy mckey rdma_server rdma_client rstream riostream cmtime ib_write_bw ib_send_bw
require_loopback
sroce_config sroce0 127.0.19.1 sroce1 127.0.19.2
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"}
S=127.0.19.1

# --- the programs ---------------------------------------------------------------
if cm_pair rping 7471 rping -s -a $S -p 7471 -v -C 20 -- rping -c -a $S -p 7471 -v -C 20 &&
	[[ $(grep -c 'ping data: rdma-ping-' "$WORK/rping.client") == 20 ]]; then
	pass "rping -v: 20 pings, every one verified"
else
	fail "rping -v"
fi
if cm_pair rpingq 7472 rping -s -q -a $S -p 7472 -C 20 -- rping -c -q -a $S -p 7472 -C 20; then
	pass "rping -q (QPs created by the program, rdma_init_qp_attr, rdma_establish)"
else
	fail "rping -q"
fi
if cm_pair ucmatose 7471 ucmatose -b $S -c 4 -C 50 -- ucmatose -s $S -c 4 -C 50 &&
	grep -q 'return status 0' "$WORK/ucmatose.client"; then
	pass "ucmatose: 4 connections, 50 messages each"
else
	fail "ucmatose"
fi
if cm_pair ucmatose-m 7471 ucmatose -m -b $S -- ucmatose -m -s $S; then
	pass "ucmatose -m (rdma_migrate_id)"
else
	fail "ucmatose -m"
fi
if cm_pair rdma_server 7473 rdma_server -s $S -p 7473 -- rdma_client -s $S -p 7473 &&
	grep -q 'rdma_client: end 0' "$WORK/rdma_server.client"; then
	pass "rdma_server/rdma_client (rdma_getaddrinfo, rdma_create_ep, synchronous ids)"
else
	fail "rdma_server/rdma_client"
fi
# rsockets: rstream's stream and riostream's riomap/riowrite (RDMA WRITEs
# into the peer's mapped buffer), each buffer verified (-T v).
port=7474
for prog in rstream riostream; do
	if cm_pair $prog $port $prog -b $S -p $port -S 65536 -C 100 -T v -- \
		$prog -s $S -p $port -S 65536 -C 100 -T v; then
		pass "$prog (rsockets), data verified: $(awk '/^custom/ { print $7 " Gb/s" }' "$WORK/$prog.client")"
	else
		fail "$prog"
	fi
	port=7481
done
# UD ids: SIDR resolves the peer's QP (udaddy checks every reply it gets).
if cm_pair udaddy 7174 udaddy -b $S -c 2 -C 20 -- udaddy -s $S -c 2 -C 20 &&
	grep -q 'return status 0' "$WORK/udaddy.client"; then
	pass "udaddy: 2 UD connections through SIDR, 20 messages each way"
else
	fail "udaddy"
fi
# Multicast: two receivers on one device and one on the other join before
# the sender (a send-only member) sends; each must get every message.
wait_joins() {
	local i
	for ((i = 0; i < 150; i++)); do
		(($("$SROCE_BIN" -j agent status 2>/dev/null | grep -o '"group":"230.9.9.9"' | wc -l) >= $1)) &&
			return 0
		sleep 0.1
	done
	return 1
}
mck=()
for b in $S $S 127.0.19.2; do
	sroce_bg "$WORK/mckey${#mck[@]}.recv" mckey -m 230.9.9.9 -b "$b" -C 10 -S 200
	mck+=("$BG_PID")
done
if wait_joins 3 &&
	timeout -k 5 30 "$SROCE_BIN" exec -- mckey -m 230.9.9.9 -b 127.0.19.2 -s -o -C 10 -S 200 \
		>"$WORK/mckey.send" 2>&1; then
	mrc=0
	for pid in "${mck[@]}"; do
		bg_wait "$pid"
		((BG_RC == 0)) || mrc=$BG_RC
	done
	if ((mrc == 0)) && (($(grep -l 'return status 0' "$WORK"/mckey*.recv | wc -l) == 3)); then
		pass "mckey: a send-only sender, three receivers on two devices, 10 datagrams each"
	else
		fail "mckey" "$(tail -n 3 "$WORK"/mckey*.recv)"
	fi
else
	kill "${mck[@]}" 2>/dev/null || true
	for pid in "${mck[@]}"; do bg_wait "$pid"; done
	fail "mckey" "$(cat "$WORK/mckey.send" 2>/dev/null; tail -n 3 "$WORK"/mckey*.recv)"
fi
# cmtime's server serves until it is stopped.
sroce_bg "$WORK/cmtime.server" cmtime -b $S -p 7475 -c 50
cmtime_srv=$BG_PID
wait_cm_listen 7475 "$cmtime_srv" || die "cmtime's server did not listen"
if timeout -k 5 60 "$SROCE_BIN" exec -- cmtime -s $S -p 7475 -c 50 >"$WORK/cmtime.client" 2>&1; then
	pass "cmtime, 50 connections: $(awk '/^connect *:/ { print $(NF) " us/conn" }' "$WORK/cmtime.client")"
else
	fail "cmtime" "$(cat "$WORK/cmtime.client")"
fi
kill "$cmtime_srv" 2>/dev/null || true
bg_wait "$cmtime_srv"
perftest_cm write_bw 7479 'RDMA_CM_EVENT_REJECTED; error: 8' "ib_write_bw -R" \
	ib_write_bw -d sroce0 -x 1 -R -n 2000 -p 7479 -- ib_write_bw -d sroce1 -x 1 -R -n 2000 -p 7479 $S
perftest_cm send_bw_ud 7480 'RDMA_CM_EVENT_UNREACHABLE; error: 1.' "ib_send_bw -c UD -R" \
	ib_send_bw -d sroce0 -x 1 -c UD -R -n 2000 -p 7480 -- \
	ib_send_bw -d sroce1 -x 1 -c UD -R -n 2000 -p 7480 $S

# --- the rdma_cm file itself ---------------------------------------------------
# What librdmacm and rsockets rely on: a character device to fstat(2), an
# O_NONBLOCK GET_EVENT that says EAGAIN, poll(2) not readable with nothing
# queued, a descriptor number that, once dup2()ed over, is the new file's
# again, and a GET_EVENT blocked while another thread closes the file that
# goes on waiting (rping's event thread, never joined, must not see an error
# while its main thread returns).
if out=$(S=$S timeout -k 5 30 "$SROCE_BIN" exec -- /usr/bin/python3 - 2>&1 <<'PY'
import ctypes, errno, os, select, socket, stat, struct, threading, time
fd = os.open("/dev/infiniband/rdma_cm", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
assert stat.S_ISCHR(os.fstat(fd).st_mode), "not a character device"
assert select.select([fd], [], [], 0.2)[0] == [], "readable with no event"
resp = ctypes.create_string_buffer(336)
cmd = struct.pack("=IHHQ", 12, 8, 336, ctypes.addressof(resp))  # GET_EVENT
try:
    os.write(fd, cmd)
    raise SystemExit("GET_EVENT on an empty O_NONBLOCK channel succeeded")
except BlockingIOError:
    pass
# CREATE_ID (TCP port space): a 4-byte id comes back through the pointer.
cid = ctypes.create_string_buffer(4)
assert os.write(fd, struct.pack("=IHHQQH6x", 0, 24, 4, 1, ctypes.addressof(cid), 0x0106)) == 32
r, w = os.pipe()
os.dup2(w, fd)
assert os.write(fd, b"plain") == 5, "write after dup2"
assert os.read(r, 5) == b"plain"
# rping's event thread is never joined: its main thread destroys the id and
# closes the file while the thread waits in GET_EVENT.  An event that comes
# after the close (here a REJ for a connect nobody listens for) must leave
# it waiting, as the kernel's file lives on under a blocked call.
def ucma(f, cmd, body, out=0):
    return os.write(f, struct.pack("=IHH", cmd, len(body), out) + body)
f2 = os.open("/dev/infiniband/rdma_cm", os.O_RDWR)
ucma(f2, 0, struct.pack("=QQHB5x", 2, ctypes.addressof(cid), 0x0106, 2), 4)
sin = lambda port: struct.pack("=HH4s20x", socket.AF_INET, socket.htons(port), socket.inet_aton(os.environ["S"]))
ev = ctypes.create_string_buffer(336)
get_event = struct.pack("=Q", ctypes.addressof(ev))
ucma(f2, 3, bytes(28) + sin(7498) + struct.pack("=II", struct.unpack("=I", cid.raw)[0], 2000))
ucma(f2, 12, get_event, 336)
ucma(f2, 4, struct.pack("=II", struct.unpack("=I", cid.raw)[0], 2000))
ucma(f2, 12, get_event, 336)
got = []
def waiter():
    try:
        ucma(f2, 12, get_event, 336)
        got.append(("event %d" % struct.unpack_from("=I", ev.raw, 12)[0], time.monotonic()))
    except OSError as e:
        got.append((errno.errorcode[e.errno], time.monotonic()))
threading.Thread(target=waiter, daemon=True).start()
time.sleep(0.3)
conn = struct.pack("=II256xBBBBBBBB", 0, 0, 0, 0, 1, 1, 0, 7, 7, 1)
ucma(f2, 6, conn + struct.pack("=IIII", struct.unpack("=I", cid.raw)[0], 0, 0, 0))
os.close(f2)
closed = time.monotonic()
time.sleep(0.5)
# A REJ on loopback can beat the close; only what returns after it counts.
late = [what for what, when in got if when > closed]
assert not late, f"GET_EVENT on a file closed under it returned {late}"
print("ok")
PY
) && [[ $out == ok ]]; then
	pass "the rdma_cm file: fstat, O_NONBLOCK GET_EVENT, poll, a reply through the pointer, dup2 over it, close under a blocked GET_EVENT"
else
	fail "the rdma_cm file" "$out"
fi

# --- faults -----------------------------------------------------------------------
# Nobody listens: the peer's CM rejects the REQ (invalid service ID, 8).
out=$(timeout -k 5 30 "$SROCE_BIN" exec -- rping -c -a $S -p 7499 -C 1 2>&1 || true)
if grep -q 'RDMA_CM_EVENT_REJECTED, error 8' <<<"$out"; then
	pass "a connect to a port nobody listens on is rejected"
else
	fail "connect without a listener" "$out"
fi
# A UD id's connect nobody listens for: the SIDR_REP says unsupported (1).
out=$(timeout -k 5 30 "$SROCE_BIN" exec -- udaddy -s $S -C 1 2>&1 || true)
if grep -q 'RDMA_CM_EVENT_UNREACHABLE, error: 1$' <<<"$out"; then
	pass "a UD connect nobody listens for is unreachable (SIDR status 1)"
else
	fail "UD connect without a listener" "$out"
fi
# A server that dies while a connection request waits for it: the agent
# refuses the request for it (REJ), as the kernel does for a closed file.
sroce_bg "$WORK/stop.server" ucmatose -b $S -p 7478
spid=$BG_PID
wait_cm_listen 7478 "$spid" || die "ucmatose's server did not listen"
victim=$(pgrep -f "^ucmatose -b $S -p 7478" || true)
[[ -n $victim ]] && kill -STOP "$victim"
sroce_bg "$WORK/stop.client" ucmatose -s $S -p 7478
cpid=$BG_PID
sleep 1
[[ -n $victim ]] && kill -9 "$victim"
start=$(now)
bg_wait "$cpid"
crc=$BG_RC
secs=$(elapsed "$start")
bg_wait "$spid"
if [[ -n $victim ]] && ((crc != 0 && crc != 124)) && num_between "$secs" -1 10 &&
	grep -q 'event: RDMA_CM_EVENT_REJECTED, error: 28' "$WORK/stop.client"; then
	pass "a server killed with a connection request pending: the client is rejected (28) in ${secs}s"
else
	fail "server killed during connect" "client exit $crc after ${secs}s: $(tail -n 3 "$WORK/stop.client")"
fi
# A peer killed after the connection is up: its partner sees the QP fail or
# DISCONNECTED, and exits; it never hangs.
sroce_bg "$WORK/kill.server" rping -s -a $S -p 7476 -C 1000000000
kpid=$BG_PID
wait_cm_listen 7476 "$kpid" || die "rping's server did not listen"
sroce_bg "$WORK/kill.client" rping -c -a $S -p 7476 -C 1000000000
cpid=$BG_PID
sleep 2
victim=$(pgrep -f "^rping -s -a $S -p 7476" || true)
[[ -n $victim ]] && kill -9 "$victim"
start=$(now)
bg_wait "$cpid"
crc=$BG_RC
bg_wait "$kpid"
secs=$(elapsed "$start")
# The dead process's connection is torn down for it (a DREQ from the
# agent, as the kernel sends one when a process dies).
if [[ -n $victim ]] && ((crc != 124)) && num_between "$secs" -1 60 &&
	grep -q 'DISCONNECT EVENT' "$WORK/kill.client"; then
	pass "a client whose server was killed is disconnected (exit $crc) in ${secs}s"
else
	fail "peer killed after ESTABLISHED" "client exit $crc after ${secs}s: $(tail -n 3 "$WORK/kill.client")"
fi
# Garbage to QP1: counted, dropped, and the CM still works.  The agent's
# counters for the device (QP1 datagrams failing their checks, and ones too
# mangled to name a QP) must account for every datagram sent.
dropped() {
	"$SROCE_BIN" -j agent status | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin)["devices"] if x["addr"] == sys.argv[1]][0]
print(d["rx_gsi_dropped"] + d["rx_unroutable"])' "$S"
}
before=$(dropped)
python3 - "$S" <<'PY'
import socket, sys, os
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.19.2", 0))
for i in range(200):
    # A BTH for QP1 followed by junk of every length.
    pkt = bytes([0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0, 0, i]) + os.urandom(i * 3)
    s.sendto(pkt, (sys.argv[1], 4791))
PY
sleep 0.5
after=$(dropped)
if ((after - before >= 200)) &&
	cm_pair rping-after 7477 rping -s -a $S -p 7477 -v -C 5 -- rping -c -a $S -p 7477 -v -C 5; then
	pass "200 garbage datagrams to QP1 are counted and dropped ($before -> $after) and the CM still connects"
else
	fail "garbage to QP1" "dropped counter $before -> $after"
fi

finish
