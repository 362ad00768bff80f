#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Communication libraries nobody here wrote, on hosts whose RoCE link has
# IPv6 only: network namespaces A and B joined by a veth pair with fixed MACs
# (link-local fe80::ff:fe00:a and fe80::ff:fe00:b) and fd00:34::1,
# fd00:34::2, and on each end a device named f6 that follows its veth, as an
# rxe link does: its GID table is the link-local and the global IPv6
# address, nothing IPv4.  A second veth pair (10.34.0.1, 10.34.0.2, no sroce
# device) carries the side channels of programs that speak IPv4 only there.
# Checks, data compared by the programs themselves:
#   - libfabric's verbs provider: fi_pingpong -6 -c over FI_EP_MSG (rdma_cm)
#     and FI_EP_RDM (ofi_rxm);
#   - pmof, this project's provider: fi_pingpong -6 -c over FI_EP_MSG and
#     FI_EP_RDM, and pmof_fabtest's msg, rma and pmof groups over IPv6;
#   - UCX: ucx_perftest over rc_verbs (put, zero copy) and ud_verbs (active
#     message latency) with UCX_IB_GID_INDEX=0 (the link-local GID) and with
#     UCX's own choice; UCP through UCX's rdmacm connection manager to
#     [fd00:34::1] (tests/progs/ucp_sockaddr_check);
#   - a capture of the whole run on veth-a: RoCEv2 packets from both the
#     link-local and the global address, and none over IPv4.
#
# Usage: test_ipv6_clients.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces or veth.
# Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=900 LABELS=netns PROCESSORS=2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_ipv6_clients.sh BUILD-DIR}"
progs=$BUILD_DIR/tests/progs
fabtest=$BUILD_DIR/tests/fabric/pmof_fabtest
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
[[ -f $FI_PROVIDER_PATH/libpmof-fi.so ]] || die "libpmof-fi.so is not built in $FI_PROVIDER_PATH"
[[ -x $fabtest ]] || die "$fabtest is not built"
((EUID == 0)) || skip "needs root for network namespaces"
require_cmds ip fi_pingpong ucx_perftest dumpcap tshark

tmp=$WORK
ns_a=sroce-v6c-a-$$
ns_b=sroce-v6c-b-$$
netns_pair "$ns_a" "$ns_b"
netns_fixed_macs 02:00:00:00:34:0a 02:00:00:00:34:0b
{ in_a ip addr add fd00:34::1/64 dev veth-a nodad && in_b ip addr add fd00:34::2/64 dev veth-b nodad &&
	ip link add oob-a netns "$ns_a" type veth peer name oob-b netns "$ns_b" &&
	in_a ip addr add 10.34.0.1/24 dev oob-a && in_b ip addr add 10.34.0.2/24 dev oob-b &&
	in_a ip link set oob-a up && in_b ip link set oob-b up; } ||
	die "cannot set up the namespaces' links"
in_a ip -6 addr show dev veth-a | grep -q "inet6 fe80::ff:fe00:340a/64" || die "veth-a has no link-local address"

netns_sroce v6c
# One name on both ends: ucx_perftest's server opens the device its client names.
{ link_a f6 netdev veth-a && link_b f6 netdev veth-b; } || die "sroce link add"
cd "$tmp" || die "cd $tmp"

got=$(run_a cat /sys/class/infiniband/f6/ports/1/gids/0 /sys/class/infiniband/f6/ports/1/gids/1 \
	/sys/class/infiniband/f6/ports/1/gids/2 2>&1 | tr '\n' ' ')
if [[ $got == "fe80:0000:0000:0000:0000:00ff:fe00:340a fd00:0034:0000:0000:0000:0000:0000:0001 0000:"* ]]; then
	pass "the GID table holds IPv6 only: $got"
else
	fail "the GID table of f6: '$got'"
fi

in_a dumpcap -q -i veth-a -f "udp port 4791" -w "$tmp/roce.pcapng" >/dev/null 2>&1 &
cap=$!
for _ in $(seq 50); do
	[[ -s $tmp/roce.pcapng ]] && break
	sleep 0.1
done

# --- libfabric: verbs, ofi_rxm over it, and pmof.
# fi_pingpong_pair NAME PROVIDER EP SIZE: 10 round trips, data checked.
fi_pingpong_pair() {
	local name=$1 prov=$2 ep=$3 size=$4
	netns_run_pair "$name" 60 env FI_PROVIDER="$prov" fi_pingpong -6 -p "$prov" -e "$ep" -c -I 10 -S "$size" -- \
		env FI_PROVIDER="$prov" fi_pingpong -6 -p "$prov" -e "$ep" -c -I 10 -S "$size" fd00:34::1 &&
		grep -q '=10 ' "$tmp/$name.b"
}
for prov in verbs pmof; do
	for size in 1 4096 1048576; do
		if fi_pingpong_pair "fi-$prov-msg-$size" "$prov" msg "$size"; then
			pass "fi_pingpong -6 -p $prov -e msg -c, $size bytes: $(awk '$3 ~ /^=/ { print $7 " us" }' "$tmp/fi-$prov-msg-$size.b")"
		else
			fail "fi_pingpong -6 -p $prov -e msg, $size bytes"
		fi
	done
done
for prov in 'verbs;ofi_rxm' pmof; do
	name=fi-${prov%%;*}-rdm
	# ofi_rxm's client may end on the race test_fabric_clients.sh describes
	# (exit 125 after every round trip was checked): for it, both tables
	# complete count.
	ok=0
	fi_pingpong_pair "$name" "$prov" rdm 65536 2>"$tmp/$name.why" && ok=1
	[[ $prov == *ofi_rxm* ]] && grep -q '=10 ' "$tmp/$name.a" 2>/dev/null &&
		grep -q '=10 ' "$tmp/$name.b" 2>/dev/null && ok=1
	if ((ok)); then
		pass "fi_pingpong -6 -p '$prov' -e rdm -c, 65536 bytes"
	else
		cat "$tmp/$name.why" >&2
		fail "fi_pingpong -6 -p '$prov' -e rdm"
	fi
done
for ep in msg rdm; do
	if run_b env FI_PROVIDER=pmof "$fabtest" -p pmof -e "$ep" -a fd00:34::2 msg rma pmof >"$tmp/fabtest.$ep" 2>&1 &&
		grep -q "^# [0-9]* passed, 0 failed" "$tmp/fabtest.$ep"; then
		pass "pmof_fabtest -e $ep msg rma pmof over [fd00:34::2]: $(tail -n 1 "$tmp/fabtest.$ep")"
	else
		grep "^not ok" "$tmp/fabtest.$ep" >&2
		fail "pmof_fabtest -e $ep over IPv6: $(tail -n 1 "$tmp/fabtest.$ep")"
	fi
done

# --- UCX: GID 0, and UCX's own choice; the side channel over oob-*.
for gid in 0 auto; do
	for t in "rc_verbs -t put_bw -D zcopy -s 65536 -n 300" "ud_verbs -t am_lat -s 8 -n 1000"; do
		name="ucx-$gid-${t%% *}"
		# shellcheck disable=SC2086 # $t is the test's arguments
		if netns_run_pair "$name" 60 env UCX_IB_GID_INDEX=$gid ucx_perftest -- \
			env UCX_IB_GID_INDEX=$gid ucx_perftest 10.34.0.1 -d f6:1 -x $t -w 20 -f &&
			r=$(awk 'NF >= 8 && $1 ~ /^[0-9]+$/ { r = $2 " us median, " $6 " MB/s" } END { print r }' "$tmp/$name.b") &&
			[[ -n $r ]]; then
			pass "ucx_perftest -x ${t%% -n *} with UCX_IB_GID_INDEX=$gid: $r"
		else
			fail "ucx_perftest -x ${t%% -n *} with UCX_IB_GID_INDEX=$gid"
		fi
	done
done
if [[ -x $progs/ucp_sockaddr_check ]]; then
	cm_env=(env UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_TLS=rc_verbs)
	if netns_cm_pair ucp_sockaddr '"port":7512[,}]' 60 \
		"${cm_env[@]}" "$progs/ucp_sockaddr_check" server fd00:34::1 7512 -- \
		"${cm_env[@]}" "$progs/ucp_sockaddr_check" client fd00:34::1 7512 &&
		grep -q 'lane.*cm rdmacm' "$tmp/ucp_sockaddr.b" && grep -q 'lane.*rc_verbs/f6:1' "$tmp/ucp_sockaddr.b"; then
		pass "UCP through UCX's rdmacm to [fd00:34::1]: tags and RMA checked"
	else
		fail "UCP through UCX's rdmacm over IPv6"
	fi
else
	fail "$progs/ucp_sockaddr_check is not built (libucx-dev; run scripts/setup.sh)"
fi

# --- What crossed the wire.
kill "$cap" 2>/dev/null
wait "$cap" 2>/dev/null
declare -A from=()
while read -r src n; do from[$src]=$n; done < <(tshark -r "$tmp/roce.pcapng" -T fields -e ip.src -e ipv6.src 2>/dev/null |
	awk '{ c[$1]++ } END { for (s in c) print s, c[s] }')
v4=0
for s in "${!from[@]}"; do [[ $s == *.* ]] && v4=$((v4 + from[$s])); done
if ((${from[fe80::ff:fe00:340a]:-0} > 0 && ${from[fd00:34::1]:-0} > 0 && v4 == 0)); then
	pass "RoCEv2 on veth-a: ${from[fe80::ff:fe00:340a]} packets from the link-local GID, ${from[fd00:34::1]} from fd00:34::1, none over IPv4"
else
	fail "the capture: $(for s in "${!from[@]}"; do printf '%s=%s ' "$s" "${from[$s]}"; done)"
fi

finish
