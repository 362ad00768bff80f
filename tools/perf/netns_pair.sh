#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# One server and one client over two sroce devices on the ends of a veth
# pair, for programs that ignore devices on loopback interfaces (libfabric's
# verbs provider).  Runs inside a network namespace of its own, so that the
# traffic stays in it:
#
#   unshare --net -- netns_pair.sh SROCE WORK PORT SERVER... -- CLIENT...
#
# In SERVER and CLIENT, @S@ stands for the server device's address (10.15.0.1)
# and @C@ for the client's (10.15.0.2).  The server must listen on TCP PORT.
# Prints the client's output, then "cpu SERVER CLIENT": each one's CPU time
# in per cent of its run.  Exit status: the client's, or 1 if the namespace
# or the server failed.
set -euo pipefail

sroce=${1:?usage: $0 SROCE WORK PORT SERVER... -- CLIENT...}
work=$2 port=$3
shift 3
server=()
while (($#)) && [[ $1 != -- ]]; do
	server+=("${1//@S@/10.15.0.1}")
	shift
done
(($#)) || {
	echo "$0: no client after --" >&2
	exit 1
}
shift
client=()
for a in "$@"; do
	a=${a//@S@/10.15.0.1}
	client+=("${a//@C@/10.15.0.2}")
done

ip link set lo up
ip link add pmx0 type veth peer name pmx1
ip addr add 10.15.0.1/24 dev pmx0
ip addr add 10.15.0.2/24 dev pmx1
ip link set pmx0 up
ip link set pmx1 up
export SROCE_CONFIG=$work/netns-links.conf
rm -f "$SROCE_CONFIG"
"$sroce" link add pn0 netdev pmx0 addr 10.15.0.1 >/dev/null
"$sroce" link add pn1 netdev pmx1 addr 10.15.0.2 >/dev/null
"$sroce" agent start >/dev/null
trap '"$sroce" agent stop >/dev/null 2>&1 || true' EXIT

# "real user sys" of a command and the children it waited for.
TIMEFORMAT='%R %U %S'
{ time "$sroce" exec -- "${server[@]}" >"$work/netns-server.log" 2>&1; } 2>"$work/netns-server.time" &
spid=$!
for ((i = 0; i < 500; i++)); do
	ss -Hltn "sport = :$port" | grep -q . && break
	kill -0 "$spid" 2>/dev/null || break
	sleep 0.01
done
if ! ss -Hltn "sport = :$port" | grep -q .; then
	echo "$0: the server did not listen on port $port:" >&2
	cat "$work/netns-server.log" >&2
	kill "$spid" 2>/dev/null || true
	exit 1
fi
rc=0
{ time "$sroce" exec -- "${client[@]}" >"$work/netns-client.log" 2>&1; } 2>"$work/netns-client.time" || rc=$?
if ! timeout 10 tail --pid="$spid" -f /dev/null; then
	kill "$spid" 2>/dev/null || true
fi
wait "$spid" || ((rc)) || rc=1
cat "$work/netns-client.log"
pct() { awk '{ if ($1 > 0) printf "%.1f", 100 * ($2 + $3) / $1; else print 0 }' "$1"; }
echo "cpu $(pct "$work/netns-server.time") $(pct "$work/netns-client.time")"
exit "$rc"
