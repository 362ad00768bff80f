#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# sroce-fabric(8): three hosts on a bridge, the port towards h0 a 50 Mbit/s
# bottleneck with 0.1% random loss each way and ECN marking from a phantom
# queue.  Checks:
#   - up makes the namespaces, list and show name them, addr gives the
#     hosts' addresses; bad requests (a second fabric of one name, --ecn
#     without a rate, an unknown host) fail with their reason;
#   - exec runs programs on a host's sroce0, whose GID table follows eth0
#     as rxe's does (link-local, IPv4-mapped, global IPv6);
#   - with congestion control off on every host (the default, set with
#     `sroce link set sroce0 cc off`), perftest's ib_write_bw h1 -> h0 over IPv4 and
#     ibv_rc_pingpong h2 -> h0 over IPv6 through the bottleneck; loss was
#     applied and traffic sent without ECN (TOS 0) is never marked, though
#     it fills the phantom queue (a tc BPF program) past its threshold;
#   - with congestion control on (`cc dcqcn`), ib_write_bw from h1 (IPv4)
#     and h2 (IPv6) at once: their packets leave ECT(0), the bottleneck marks some
#     CE and h0 receives them marked (a capture on its eth0), h0 answers
#     with CNPs (opcode 0x81, DSCP 48, not ECN-capable) to the senders,
#     whose devices count them and cut their QPs' rates, as `sroce resource
#     show qp` shows on both sides while they run; sroce_xfer's mix
#     of operations with ECT(0), every byte checked across the loss;
#   - down removes every namespace and the state, also for a fabric whose
#     state file is gone, as after a crash.
#
# Usage: test_fabric.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces, veth
# or a bridge.  Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=600 LABELS=netns PROCESSORS=2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_fabric.sh BUILD-DIR}"
fabric=$BUILD_DIR/tools/fabric/sroce-fabric
xfer=$BUILD_DIR/tests/progs/sroce_xfer
[[ -x $fabric ]] || die "$fabric is not built"
[[ -x $xfer ]] || die "$xfer is not built"
((EUID == 0)) || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"
ip netns add "sfab-probe-$$" 2>/dev/null || skip "ip netns unusable"
ip netns del "sfab-probe-$$"

export SROCE_FABRIC_STATE=$WORK/state
name=t$((RANDOM % 100000))
F=("$fabric" --name "$name")
cleanup_fabric() { "${F[@]}" down &>/dev/null; }
trap 'cleanup_fabric; _sroce_cleanup' EXIT

# --- Up, and what it says of itself.
if "${F[@]}" up -n 3 --rate 50mbit --loss 0.1% --ecn --net4 10.78.0 --net6 fd00:78 \
	>"$WORK/up.out" 2>&1; then
	pass "up: $(head -2 "$WORK/up.out" | tr '\n' ' ')"
else
	cat "$WORK/up.out" >&2
	die "sroce-fabric up"
fi
nss=$(ip netns list | grep -c "^sfab-$name-")
if ((nss == 4)) && "$fabric" list | grep -qx "$name"; then
	pass "4 namespaces (switch and h0-h2); list names the fabric"
else
	fail "namespaces: $nss; list: $("$fabric" list | tr '\n' ' ')"
fi
if command -v ethtool >/dev/null; then
	offloads=$(ip netns exec "sfab-$name-h1" ethtool -k eth0 |
		grep -E '^(tcp-segmentation-offload|generic-segmentation-offload|tx-udp-segmentation):')
	if [[ $(grep -c ': off' <<<"$offloads") == 3 ]]; then
		pass "hosts segment in software: TSO, GSO and UDP segmentation off"
	else
		fail "h1's eth0 offloads: $offloads"
	fi
fi
if [[ $("${F[@]}" addr h0) == 10.78.0.1 && $("${F[@]}" addr h2 -6) == fd00:78::3 ]]; then
	pass "addr: h0 10.78.0.1, h2 fd00:78::3"
else
	fail "addr: $("${F[@]}" addr h0) $("${F[@]}" addr h2 -6)"
fi
# expect_refusal WHAT WANT CMD...: fails (exit 1 or 2) and says WANT.
expect_refusal() {
	local what=$1 want=$2 out rc
	shift 2
	out=$("$@" 2>&1)
	rc=$?
	if ((rc == 1 || rc == 2)) && grep -q "$want" <<<"$out"; then
		pass "$what refused: $out"
	else
		fail "$what: rc $rc, '$out' (want '$want')"
	fi
}
expect_refusal "a second fabric of the same name" "exists" "${F[@]}" up -n 2
expect_refusal "--ecn without --rate" "give it a --rate" "$fabric" --name x"$name" up --ecn
expect_refusal "exec on an unknown host" "no host h7" "${F[@]}" exec h7 -- true
expect_refusal "a phantom queue drained faster than the link" "at most 1" \
	"$fabric" --name x"$name" up --rate 50mbit --ecn --mark-rate 1.5

# set_cc MODE: congestion control of every host's sroce0.
set_cc() {
	local h
	for h in h0 h1 h2; do
		"${F[@]}" exec "$h" -- "$SROCE_BIN" link set sroce0 cc "$1" || fail "link set $h cc $1"
	done
}
set_cc off

# --- Programs on the hosts' devices.
gids=$("${F[@]}" exec h1 -- ibv_devinfo -v -d sroce0 2>&1 | grep -o "GID\[ *[0-9]\]:.*" | tr -s ' \t' ' ')
if grep -q "GID\[ 0\]: fe80::.*RoCE v2" <<<"$gids" && grep -q "GID\[ 1\]: ::ffff:10.78.0.2, RoCE v2" <<<"$gids" &&
	grep -q "GID\[ 2\]: fd00:78::2, RoCE v2" <<<"$gids"; then
	pass "exec h1: ibv_devinfo shows sroce0 following eth0 ($(tr '\n' ';' <<<"$gids"))"
else
	fail "h1's GIDs: $gids"
fi

# fabric_pair NAME SERVER-HOST CLIENT-HOST TIMEOUT SERVER-CMD... -- CLIENT-CMD...:
# lib.sh's netns_run_pair with two hosts of the fabric as its sides.
fabric_pair() {
	FAB_A=$2 FAB_B=$3
	netns_run_pair "$1" "${@:4}"
}
in_a() { ip netns exec "sfab-$name-$FAB_A" "$@"; }
run_a() { "${F[@]}" exec "$FAB_A" -- "$@"; }
run_b() { "${F[@]}" exec "$FAB_B" -- "$@"; }
if fabric_pair bw h0 h1 60 ib_write_bw -d sroce0 -x 1 -s 65536 -n 300 -p 18800 -- \
	ib_write_bw -d sroce0 -x 1 -s 65536 -n 300 -p 18800 10.78.0.1; then
	pass "ib_write_bw h1 -> h0 through the bottleneck: $(awk '$1 == 65536' "$WORK/bw.b")"
else
	fail "ib_write_bw h1 -> h0"
fi
if fabric_pair pp h0 h2 60 ibv_rc_pingpong -d sroce0 -g 2 -n 500 -p 18801 -- \
	ibv_rc_pingpong -d sroce0 -g 2 -n 500 -p 18801 10.78.0.1 &&
	grep -q "GID fd00:78::1" "$WORK/pp.b"; then
	pass "ibv_rc_pingpong -g 2 h2 -> h0 over IPv6: $(grep iters "$WORK/pp.b")"
else
	fail "ibv_rc_pingpong h2 -> h0 over IPv6"
fi
stats() { "${F[@]}" show -j | python3 -c "import json, sys; print(json.load(sys.stdin)['bottleneck']['$1'])"; }
sent=$(stats sent_packets) lost=$(stats lost) marked=$(stats marked)
peak=$(stats phantom_peak_bytes)
if ((sent > 1000 && lost > 0 && marked == 0 && peak > 30000)); then
	pass "towards h0: $sent packets, $lost lost at random; the phantom queue reached $peak bytes, past its threshold, and marked none of the not-ECN-capable"
else
	fail "bottleneck counters: sent $sent lost $lost marked $marked phantom peak $peak (want > 1000, > 0, 0, > 30000)"
fi

# --- Congestion control: ECN-capable traffic from two hosts at once,
# marked, delivered so, and answered with CNPs.
set_cc dcqcn
ip netns exec "sfab-$name-h0" tshark -i eth0 -B 32 -f "udp port 4791" -w "$WORK/h0.pcap" \
	>/dev/null 2>"$WORK/tshark.log" &
cap=$!
for _ in $(seq 100); do
	grep -q "Capturing on" "$WORK/tshark.log" && break
	sleep 0.1
done
SROCE_STATS=1 "${F[@]}" exec h0 -- ib_write_bw -d sroce0 -x 1 -s 65536 -n 150 -p 18810 \
	>"$WORK/w1.s" 2>&1 &
s1=$!
# h2's stream over IPv6 (GID 2): the phantom queue marks IPv6's traffic
# class as it marks IPv4's TOS, and the CNPs go back over IPv6.
SROCE_STATS=1 "${F[@]}" exec h0 -- ib_write_bw -d sroce0 -x 2 -s 65536 -n 150 -p 18811 \
	>"$WORK/w2.s" 2>&1 &
s2=$!
for _ in $(seq 200); do
	[[ $(ip netns exec "sfab-$name-h0" ss -Hltn | wc -l) -ge 2 ]] && break
	sleep 0.05
done
# watch_qps HOST PATTERN: `sroce resource show qp` on HOST until a QP's
# line matches PATTERN (into $WORK/qp.HOST) or the streams are over.
watch_qps() {
	local out=$WORK/qp.$1
	while [[ ! -e $WORK/streams.done ]]; do
		"${F[@]}" exec "$1" -- "$SROCE_BIN" resource show qp 2>&1 | grep -E -m1 "$2" >"$out" && return
		sleep 0.1
	done
	"${F[@]}" exec "$1" -- "$SROCE_BIN" resource show qp >"$out.last" 2>&1
}
watch_qps h1 " comm ib_write_bw cc_rate [0-9]+kbit cnps_sent 0 cnps_received [1-9][0-9]* rate_cuts [1-9]" &
w1=$!
watch_qps h0 " comm ib_write_bw cc_rate - cnps_sent [1-9][0-9]* cnps_received 0 rate_cuts 0$" &
w0=$!
SROCE_STATS=1 "${F[@]}" exec h1 -- ib_write_bw -d sroce0 -x 1 -s 65536 -n 150 -p 18810 10.78.0.1 \
	>"$WORK/w1.c" 2>&1 &
c1=$!
SROCE_STATS=1 "${F[@]}" exec h2 -- ib_write_bw -d sroce0 -x 2 -s 65536 -n 150 -p 18811 10.78.0.1 \
	>"$WORK/w2.c" 2>&1 &
c2=$!
rcs=()
for p in $c1 $c2 $s1 $s2; do
	wait "$p"
	rcs+=($?)
done
touch "$WORK/streams.done"
wait "$w1" "$w0"
sleep 0.5
kill -TERM "$cap"
wait "$cap"
# While the streams ran, each side's QP showed its part: the sender's held
# to a rate after the CNPs it took, the receiver's the CNPs it sent.
if [[ -s $WORK/qp.h1 && -s $WORK/qp.h0 ]]; then
	pass "resource show qp: h1 '$(sed 's/.* comm //' "$WORK/qp.h1")', h0 '$(sed 's/.* comm //' "$WORK/qp.h0")'"
else
	fail "resource show qp never showed the cc figures; last: h1 '$(cat "$WORK/qp.h1.last" 2>/dev/null)' h0 '$(cat "$WORK/qp.h0.last" 2>/dev/null)'"
fi
if [[ ${rcs[*]} == "0 0 0 0" ]]; then
	pass "ib_write_bw h1 -> h0 and h2 -> h0 at once: $(awk '$1 == 65536 { print $4 " MB/s" }' "$WORK"/w[12].c | tr '\n' ' ')"
else
	fail "ib_write_bw from two hosts: exits ${rcs[*]}"
	tail -n 4 "$WORK"/w[12].[cs] >&2
fi
marked=$(stats marked)
# ecn_count FAMILY CODEPOINT: h0's captured RoCE packets from the senders
# with that ECN code point, over IPv4 (ip) or IPv6 (ipv6).
ecn_count() {
	local f="ip.dst == 10.78.0.1 && ip.dsfield.ecn == $2"
	[[ $1 == ipv6 ]] && f="ipv6.dst == fd00:78::1 && ipv6.tclass.ecn == $2"
	tshark -r "$WORK/h0.pcap" -Y "udp.dstport == 4791 && $f" 2>/dev/null | wc -l
}
for fam in ip ipv6; do
	ce=$(ecn_count $fam 3) ect=$(ecn_count $fam 2) not_ect=$(ecn_count $fam 0)
	if ((marked > 0 && ce > 0 && ect > 0 && not_ect == 0)); then
		pass "$fam: h0 received $ce packets marked CE and $ect ECT(0), none not ECN-capable (the phantom queue marked $marked)"
	else
		fail "$fam ECN marking: $marked marked; $ce CE, $ect ECT(0) and $not_ect not ECN-capable packets arrived at h0"
	fi
done
# CNPs: from h0 to the two senders, in RoCEv2's format, and taken by them.
# Each as: its destination, TOS, UDP length, and whether its BTH is the
# CNP's (opcode 0x81, P_Key 0xFFFF, BECN) with A, PSN and the 16 reserved
# bytes 0.
cnps=$(tshark -r "$WORK/h0.pcap" -Y "(ip.src == 10.78.0.1 || ipv6.src == fd00:78::1) && infiniband.bth.opcode == 129" \
	-T fields -E occurrence=f -e ip.dst -e ipv6.dst -e ip.dsfield -e ipv6.tclass -e udp.length -e udp.payload 2>/dev/null |
	awk -F'\t' '{ ok = substr($6, 1, 10) == "8100ffff40" && substr($6, 17, 40) ~ /^0+$/
	       tos = $3 != "" ? $3 : "0x" substr($4, length($4) - 1)
	       print $1 $2, tos, $5, ok ? "cnp" : "bad:" $6 }' | sort | uniq -c)
sent_cnp=$(stat_sum tx_cnp "$WORK"/w[12].s) handled=$(stat_sum rx_cnp_handled "$WORK"/w[12].c)
cuts=$(stat_sum cc_rate_cuts "$WORK"/w[12].c) rx_ce=$(stat_sum rx_ce "$WORK"/w[12].s)
if grep -q " 10.78.0.2 0xc0 40 cnp$" <<<"$cnps" && grep -q " fd00:78::3 0xc0 40 cnp$" <<<"$cnps" &&
	! grep -q bad <<<"$cnps" && ((sent_cnp > 0 && handled > 0 && cuts > 0 && rx_ce > 0)); then
	pass "h0's devices saw $rx_ce CE and sent $sent_cnp CNPs (DSCP 48, not ECN-capable, BECN, 32 bytes) to h1 over IPv4 and h2 over IPv6; their devices took $handled and cut rates $cuts times"
else
	fail "CNPs: rx_ce $rx_ce, tx_cnp $sent_cnp, rx_cnp_handled $handled, cc_rate_cuts $cuts; captured (count dst tos udp-length form): $(tr '\n' ';' <<<"$cnps")"
fi

if fabric_pair xfer h0 h1 120 "$xfer" -d sroce0 -g 1 -p 18812 --tclass 2 -- \
	"$xfer" -d sroce0 -g 1 -p 18812 -n 1000 --seed 3 --tclass 2 10.78.0.1; then
	pass "sroce_xfer h1 -> h0 with ECT(0) across the loss and marks: 1000 operations, every byte checked"
else
	fail "sroce_xfer h1 -> h0 with ECT(0)"
fi

# --- Down, also after a crash.
if "${F[@]}" down >"$WORK/down.out" 2>&1 && ! ip netns list | grep -q "^sfab-$name-" &&
	[[ ! -e $SROCE_FABRIC_STATE/$name.json ]]; then
	pass "down: $(cat "$WORK/down.out"), nothing left"
else
	fail "down: $(cat "$WORK/down.out"); left: $(ip netns list | grep "^sfab-$name-" | tr '\n' ' ')"
fi
"${F[@]}" up -n 2 --net4 10.78.1 --net6 fd00:78:1 >/dev/null 2>&1 || fail "up again"
"${F[@]}" exec h1 -- ibv_devinfo >/dev/null 2>&1 # starts h1's agent
rm -f "$SROCE_FABRIC_STATE/$name.json"
if "$fabric" list | grep -q "^$name (no state" && "${F[@]}" down >/dev/null 2>&1 &&
	! ip netns list | grep -q "^sfab-$name-"; then
	pass "a fabric without its state file is listed as such and removed by down"
else
	fail "a fabric without its state file: $(ip netns list | grep "^sfab-$name-" | tr '\n' ' ')"
fi

finish
