#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A device that follows its net device, as an rxe link does (`sroce link add
# NAME netdev IF`, no address): network namespaces A and B joined by a veth
# pair with IPv4 (10.32.0.1, 10.32.0.2) and global IPv6 (fd00:32::1,
# fd00:32::2) addresses.  Checks:
#   - the GID table as ibv_query_gid_table() and the /sys view give it, in
#     rxe's order: 0 the link-local GID of the veth's MAC, 1 the IPv4-mapped
#     address, 2 the global IPv6 one, all RoCE v2 on the veth;
#   - rdma link show lists the link with its net device and no address;
#   - ibv_rc_pingpong and ibv_ud_pingpong with -g 0 (link-local), -g 1
#     (IPv4) and -g 2 (IPv6), each side sending from the GID its index names;
#   - perftest with -x 0 and with its own choice of GID;
#   - rping (rdma_cm, IPv4) between the two following devices;
#   - an address added under a running program: IBV_EVENT_GID_CHANGE and
#     the new GID in the first empty entry; removed: the entry empty again
#     (ENODATA), the others where they were.
#
# Usage: test_gid_table.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces or veth.
# Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=600 LABELS=netns PROCESSORS=2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_gid_table.sh BUILD-DIR}"
port_check=$BUILD_DIR/tests/progs/port_check
[[ -x $port_check ]] || die "$port_check is not built"
((EUID == 0)) || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"

tmp=$WORK
ns_a=sroce-gid-a-$$
ns_b=sroce-gid-b-$$
netns_pair "$ns_a" "$ns_b"
{ in_a ip addr add 10.32.0.1/24 dev veth-a && in_b ip addr add 10.32.0.2/24 dev veth-b &&
	in_a ip addr add fd00:32::1/64 dev veth-a nodad && in_b ip addr add fd00:32::2/64 dev veth-b nodad; } ||
	die "cannot address the namespaces"
# The link-local addresses come with the interfaces; wait for them to leave
# duplicate address detection.
for ns in "$ns_a" "$ns_b"; do
	for _ in $(seq 100); do
		ip -n "$ns" -6 addr show scope link | grep -q tentative || break
		sleep 0.1
	done
done

netns_sroce gid
{ link_a fa netdev veth-a && link_b fb netdev veth-b; } || die "sroce link add"

# check WHAT GOT WANT
check() {
	if [[ $2 == "$3" ]]; then
		pass "$1"
	else
		fail "$1"
		printf '  got:\n%s\n  wanted:\n%s\n' "$2" "$3" >&2
	fi
}

# The GID the kernel derives from a MAC (EUI-64, universal bit flipped).
eui_gid() {
	local m
	IFS=: read -ra m <"/dev/stdin"
	printf 'fe80::%x:%x:%x:%x\n' $(((0x${m[0]} ^ 2) << 8 | 0x${m[1]})) $((0x${m[2]} << 8 | 0xff)) \
		$((0xfe << 8 | 0x${m[3]})) $((0x${m[4]} << 8 | 0x${m[5]}))
}
ll_a=$(in_a cat /sys/class/net/veth-a/address | eui_gid)
ifindex_a=$(in_a cat /sys/class/net/veth-a/ifindex)

# --- The table, as the verbs give it and as /sys shows it.
got=$(run_a "$port_check" fa gids 2>&1)
want="gid 0 $ll_a RoCEv2 $ifindex_a
gid 1 ::ffff:10.32.0.1 RoCEv2 $ifindex_a
gid 2 fd00:32::1 RoCEv2 $ifindex_a
empty 3 ENODATA"
check "ibv_query_gid_table of a device following veth-a" "$got" "$want"
sys=/sys/class/infiniband/fa/ports/1
got=$(run_a cat "$sys/gids/1" "$sys/gids/2" "$sys/gid_attrs/types/0" "$sys/gid_attrs/ndevs/2" 2>&1 |
	tr '\n' ' ')
check "the /sys GID table" "$got" \
	"0000:0000:0000:0000:0000:ffff:0a20:0001 fd00:0032:0000:0000:0000:0000:0000:0001 RoCE v2 veth-a "
got=$(run_a rdma link show 2>&1)
check "rdma link show" "$got" "link fa/1 state ACTIVE physical_state LINK_UP netdev veth-a mtu 1024"

# --- Each GID index reaches the peer's entry of the same index: the
# link-local one too, which is what a program that takes GID 0 meets.
declare -A peer_gid=([0]="fe80::" [1]="::ffff:10.32.0.1" [2]="fd00:32::1")
for prog in ibv_rc_pingpong ibv_ud_pingpong; do
	for g in 0 1 2; do
		if netns_run_pair "$prog$g" 60 "$prog" -d fa -g "$g" -n 500 -- "$prog" -d fb -g "$g" -n 500 10.32.0.1 &&
			grep -q "remote address:.*GID ${peer_gid[$g]}" "$tmp/$prog$g.b" &&
			grep -q "500 iters" "$tmp/$prog$g.b"; then
			pass "$prog -g $g: $(grep -o 'remote address:.*' "$tmp/$prog$g.b")"
		else
			fail "$prog -g $g"
		fi
	done
done

# --- perftest: -x 0, and perftest's own choice (no -x).
if command -v ib_send_lat >/dev/null; then
	for x in "-x 0" ""; do
		# shellcheck disable=SC2086 # $x is zero or two words
		if netns_run_pair "perf$x" 60 ib_send_lat -d fa $x -n 500 -- ib_send_lat -d fb $x -n 500 10.32.0.1 &&
			grep -q "^ *2 *500 " "$tmp/perf$x.b"; then
			pass "ib_send_lat ${x:-with its own GID choice}: $(grep -m1 -o 'GID: [0-9a-f:]*' "$tmp/perf$x.b")"
		else
			fail "ib_send_lat ${x:-with its own GID choice}"
		fi
	done
else
	fail "perftest is not installed"
fi

# --- rdma_cm over a following device: the CM finds the device by the
# interface the address is on, and QP1's MADs leave from that address.
if command -v rping >/dev/null; then
	if netns_cm_pair rping '"port":7532[,}]' 60 rping -s -a 10.32.0.1 -p 7532 -v -C 10 -- \
		rping -c -a 10.32.0.1 -p 7532 -v -C 10 &&
		(($(grep -c 'ping data: rdma-ping-' "$tmp/rping.b") == 10)); then
		pass "rping -v over IPv4 between following devices: 10 pings verified"
	else
		fail "rping over following devices"
	fi
else
	fail "rping is not installed"
fi

# --- Addresses that come and go under a running program.
run_a "$port_check" fa wait GID_CHANGE 10 gids wait GID_CHANGE 10 gids >"$tmp/watch" 2>&1 &
watch=$!
for _ in $(seq 100); do
	grep -q "waiting GID_CHANGE" "$tmp/watch" && break
	sleep 0.05
done
in_a ip addr add fd00:32::99/64 dev veth-a nodad
for _ in $(seq 100); do
	(($(grep -c "waiting GID_CHANGE" "$tmp/watch") == 2)) && break
	sleep 0.05
done
in_a ip addr del 10.32.0.1/24 dev veth-a
wait "$watch"
rc=$?
want="waiting GID_CHANGE
event GID_CHANGE
gid 0 $ll_a RoCEv2 $ifindex_a
gid 1 ::ffff:10.32.0.1 RoCEv2 $ifindex_a
gid 2 fd00:32::1 RoCEv2 $ifindex_a
gid 3 fd00:32::99 RoCEv2 $ifindex_a
empty 4 ENODATA
waiting GID_CHANGE
event GID_CHANGE
gid 0 $ll_a RoCEv2 $ifindex_a
gid 2 fd00:32::1 RoCEv2 $ifindex_a
gid 3 fd00:32::99 RoCEv2 $ifindex_a
empty 1 ENODATA"
check "GID_CHANGE and the table as addresses come and go (exit $rc)" "$(cat "$tmp/watch")" "$want"

finish
