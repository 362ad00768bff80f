#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A peer that dies mid-transfer: the server of an RDMA WRITE stream is killed
# with SIGKILL, so nothing ever ACKs the client's outstanding writes again.
# The client's QP (timeout 14, about 67 ms; retry_cnt 3) must give up with
# IBV_WC_RETRY_EXC_ERR within a few seconds, and the program must report it
# and exit 3 rather than hang.  Not a shorter timeout: at timeout 10
# (4 ms) a live server that the CPUs left alone for 17 ms, beside other
# tests on two loaded cores, was given up too (2 runs in 20 under load).
#
# Usage: test_peer_kill.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) when the loopback interface is unusable.
#
# ctest: TIMEOUT=120 RESOURCE_LOCK=lo-127.0.4.1,lo-127.0.4.2
set -uo pipefail

build=${1:?usage: test_peer_kill.sh BUILD-DIR}
sroce=$build/tools/sroce/sroce
xfer=$build/tests/progs/sroce_xfer
for f in "$sroce" "$xfer"; do
	[[ -x $f ]] || {
		echo "FAIL: $f is not built" >&2
		exit 1
	}
done

tmp=$(mktemp -d)
server_pid=
client_pid=
cleanup() {
	[[ -n $client_pid ]] && kill -9 "$client_pid" 2>/dev/null
	[[ -n $server_pid ]] && kill -9 "$server_pid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

export SROCE_CONFIG=$tmp/links.conf
unset LD_PRELOAD SROCE_FAULT

if ! "$sroce" link add sroce0 netdev lo addr 127.0.4.1 2>"$tmp/err" ||
	! "$sroce" link add sroce1 netdev lo addr 127.0.4.2 2>>"$tmp/err"; then
	echo "SKIP: loopback interface not usable: $(cat "$tmp/err")" >&2
	exit 77
fi

fail() {
	echo "FAIL: $*" >&2
	for f in server client; do
		[[ -s $tmp/$f.out ]] && sed "s/^/  $f: /" "$tmp/$f.out" >&2
	done
	exit 1
}

# Waits up to $2 seconds for file $1 to contain $3.
wait_for() {
	local deadline=$((SECONDS + $2))
	until grep -q -- "$3" "$1" 2>/dev/null; do
		((SECONDS < deadline)) || return 1
		sleep 0.05
	done
}

# Without `timeout` in between, $! is the program itself: exec replaces
# `sroce exec` by it, so the SIGKILL below reaches the verbs process.
"$sroce" exec -- "$xfer" -d sroce0 -g 1 -p 0 --timeout 14 --retry 3 >"$tmp/server.out" 2>&1 &
server_pid=$!
wait_for "$tmp/server.out" 10 "listening on port" || fail "server did not start"
port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$tmp/server.out")

timeout -s KILL 30 "$sroce" exec -- "$xfer" -d sroce1 -g 1 -p "$port" --stream --depth 8 \
	--max-size 65536 --timeout 14 --retry 3 127.0.0.1 >"$tmp/client.out" 2>&1 &
client_pid=$!
wait_for "$tmp/client.out" 10 "connected" || fail "client did not connect"

sleep 1
kill -0 "$client_pid" 2>/dev/null || fail "the stream ended before the server was killed"
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null
server_pid=
killed_at=$(date +%s%N)

wait "$client_pid"
rc=$?
client_pid=
elapsed_ms=$((($(date +%s%N) - killed_at) / 1000000))

((rc != 137)) || fail "client still running 30 s after the server was killed (hang)"
((rc == 3)) || fail "client exited $rc, expected 3 (completion error)"
grep -Eq 'wc error: .*(transport retry counter exceeded|status 12[^0-9])' "$tmp/client.out" ||
	fail "client did not report IBV_WC_RETRY_EXC_ERR"
((elapsed_ms < 5000)) || fail "client took $elapsed_ms ms to notice the dead peer"
done_ops=$(sed -n 's/.* \([0-9]*\) operations completed before the error.*/\1/p' "$tmp/client.out")
((${done_ops:-0} > 0)) || fail "no RDMA WRITE completed before the server was killed"

echo "client: $done_ops writes, then $(grep 'wc error' "$tmp/client.out")"
echo "client gave up $elapsed_ms ms after the server was killed"
echo "peer kill test passed"
