#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# RoCEv2 over IPv6 between two hosts: network namespaces A and B joined by a
# veth pair with IPv6 (fd00:31::1, fd00:31::2) and IPv4 (10.31.0.1,
# 10.31.0.2) addresses, an sroce device on each address.  Checks:
#   - the GID table as the /sys view shows it: link-local first, then the
#     IPv6 address, RoCE v2;
#   - ibv_rc/uc/ud/srq/xsrq_pingpong -g 1 over IPv6;
#   - a seeded mix of SEND, WRITE, READ and atomics (sroce_xfer) with every
#     byte checked, captured on the veth: scapy recomputes the ICRC of every
#     IPv6 packet, and each side's QP flow label, traffic class and hop
#     limit are in every IPv6 header it sent (the label also picked its
#     UDP source port); the same over IPv4, whose TOS and TTL carry the
#     traffic class and hop limit;
#   - perftest ib_send_lat (64 B) and ib_write_bw (64 KiB) over the IPv6
#     devices and then the IPv4 ones on the same veth, printed side by side.
# The TCP side channels of the programs use the IPv4 addresses; the RoCE
# traffic goes where the GIDs say.
#
# Usage: test_ipv6.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces or veth.
# Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=600 LABELS=netns PROCESSORS=2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_ipv6.sh BUILD-DIR}"
here=$(cd "$(dirname "$0")" && pwd)
xfer=$BUILD_DIR/tests/progs/sroce_xfer
[[ -x $xfer ]] || die "$xfer is not built"
((EUID == 0)) || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"

tmp=$WORK
ns_a=sroce-v6-a-$$
ns_b=sroce-v6-b-$$
netns_pair "$ns_a" "$ns_b"
# nodad: the addresses are usable at once, not after duplicate detection.
{ in_a ip addr add fd00:31::1/64 dev veth-a nodad && in_b ip addr add fd00:31::2/64 dev veth-b nodad &&
	in_a ip addr add 10.31.0.1/24 dev veth-a && in_b ip addr add 10.31.0.2/24 dev veth-b; } ||
	die "cannot address the namespaces"

netns_sroce ipv6
{ link_a v6a netdev veth-a addr fd00:31::1 && link_a v4a netdev veth-a addr 10.31.0.1 &&
	link_b v6b netdev veth-b addr fd00:31::2 && link_b v4b netdev veth-b addr 10.31.0.2; } ||
	die "sroce link add"

# --- The GID table, as programs that read /sys see it.
gids=/sys/class/infiniband/v6a/ports/1
got=$(run_a cat "$gids/gids/0" "$gids/gids/1" "$gids/gid_attrs/types/1" 2>&1 | tr '\n' ' ')
if [[ $got == "fe80:0000:0000:0000:"*" fd00:0031:0000:0000:0000:0000:0000:0001 RoCE v2 " ]]; then
	pass "GID 0 link-local, GID 1 fd00:31::1, RoCE v2 ($got)"
else
	fail "the /sys GID table of v6a: '$got'"
fi

# --- Every transport through rdma-core's own example programs.
for prog in ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong; do
	command -v "$prog" >/dev/null || {
		fail "$prog is not installed"
		continue
	}
	if netns_run_pair "$prog" 60 "$prog" -d v6a -g 1 -n 2000 -- "$prog" -d v6b -g 1 -n 2000 10.31.0.1 &&
		grep -q "remote address:.*GID fd00:31::1" "$tmp/$prog.b" &&
		grep -q "2000 iters" "$tmp/$prog.b"; then
		pass "$prog -g 1 over IPv6: $(grep iters "$tmp/$prog.b")"
	else
		fail "$prog -g 1 over IPv6"
	fi
done
if command -v ibv_xsrq_pingpong >/dev/null &&
	netns_run_pair xsrq 60 ibv_xsrq_pingpong -d v6a -g 1 -- ibv_xsrq_pingpong -d v6b -g 1 10.31.0.1 &&
	grep -q success "$tmp/xsrq.b"; then
	pass "ibv_xsrq_pingpong -g 1 over IPv6 (XRC)"
else
	fail "ibv_xsrq_pingpong -g 1 over IPv6"
fi

# --- Every RC operation, each byte checked, and the ICRC of every packet
# recomputed by scapy from a capture on B's end of the veth.  Sent without
# segmentation offload, so that the capture holds packets, not sends.
# The flow labels of the two sides' QPs (one with the top bit, which Linux
# keeps for its own labels when net.ipv6.flowlabel_state_ranges is 1), and
# the UDP source port rdma-core derives from a label; the traffic class
# (DSCP 10 with ECT(0), DSCP 46) and hop limit of each side's AV.
label_a=0x3a001
label_b=0xc5a5a
label_sport() { echo $(((($1 & 0x3fff) ^ (($1 & 0xfc000) >> 14)) | 0xc000)); }
av_a=(--tclass 0x2a --hop-limit 9)
av_b=(--tclass 0xb8 --hop-limit 200)
# capture FILE FILTER, then capture_end: what reaches veth-b meanwhile.
capture() {
	in_b tshark -i veth-b -B 64 -f "$2" -w "$1" >/dev/null 2>"$1.log" &
	cap=$!
	for _ in $(seq 100); do
		grep -q "Capturing on" "$1.log" && break
		sleep 0.1
	done
	sleep 0.5
}
capture_end() {
	sleep 0.5
	kill -TERM "$cap"
	wait "$cap"
}
# check_icrc FILE FAMILY-TEXT: scapy recomputes every ICRC in the capture.
check_icrc() {
	if "$scapy" "$here/icrc_check.py" "$1" >"$1.out" 2>&1 && grep -q "$2" "$1.out"; then
		pass "scapy recomputed the ICRC of every ${3:-IPv6} packet: $(head -1 "$1.out")"
	else
		fail "${3:-IPv6} ICRCs in the capture:"
		sed 's/^/  /' "$1.out" >&2
	fi
}
scapy=$(scapy_python)
if [[ -z $scapy ]] || ! command -v tshark >/dev/null; then
	fail "scapy or tshark is missing: the IPv6 ICRCs cannot be checked"
else
	capture "$tmp/v6.pcap" "ip6 and udp port 4791"
	if netns_run_pair xfer 120 env SROCE_GSO=0 SROCE_STATS=1 "$xfer" -d v6a -g 1 -p 18600 \
		--flow-label "$label_a" "${av_a[@]}" -- \
		env SROCE_GSO=0 SROCE_STATS=1 "$xfer" -d v6b -g 1 -p 18600 -n 3000 --seed 31 \
		--flow-label "$label_b" "${av_b[@]}" 10.31.0.1; then
		pass "sroce_xfer -g 1: 3000 operations over IPv6, every byte checked"
	else
		fail "sroce_xfer over IPv6"
	fi
	capture_end
	check_icrc "$tmp/v6.pcap" "over IPv6,"
	# Each side's flow label, traffic class and hop limit in every IPv6
	# header it sent, and its label in its UDP source port
	# (ibv_flow_label_to_udp_sport); no lease refused.
	want="(ipv6.src == fd00:31::1 && ipv6.flow == $label_a && udp.srcport == $(label_sport "$label_a")"
	want+=" && ipv6.tclass == 0x2a && ipv6.hlim == 9)"
	want+=" || (ipv6.src == fd00:31::2 && ipv6.flow == $label_b && udp.srcport == $(label_sport "$label_b")"
	want+=" && ipv6.tclass == 0xb8 && ipv6.hlim == 200)"
	total=$(tshark -r "$tmp/v6.pcap" 2>/dev/null | wc -l)
	bad=$(tshark -r "$tmp/v6.pcap" -Y "!($want)" 2>/dev/null | wc -l)
	refused=$(stat_sum tx_flow_label_refused "$tmp"/xfer.[ab])
	if ((bad == 0 && total > 0 && refused == 0)); then
		pass "flow labels $label_a and $label_b, traffic classes 0x2a and 0xb8, hop limits 9 and 200 in all $total IPv6 headers; labels in the UDP source ports"
	else
		fail "IPv6 headers: $bad of $total packets without their QP's flow label, traffic class or hop limit; leases refused: $refused"
	fi

	# The same over IPv4: the traffic class is the TOS byte, the hop limit
	# the TTL, neither covered by the ICRC.
	capture "$tmp/v4.pcap" "ip and udp port 4791"
	if netns_run_pair xfer4 120 env SROCE_GSO=0 "$xfer" -d v4a -g 1 -p 18601 "${av_a[@]}" -- \
		env SROCE_GSO=0 "$xfer" -d v4b -g 1 -p 18601 -n 500 --seed 32 "${av_b[@]}" 10.31.0.1; then
		pass "sroce_xfer -g 1: 500 operations over IPv4, every byte checked"
	else
		fail "sroce_xfer over IPv4"
	fi
	capture_end
	check_icrc "$tmp/v4.pcap" "matches scapy" IPv4
	want="(ip.src == 10.31.0.1 && ip.dsfield == 0x2a && ip.ttl == 9)"
	want+=" || (ip.src == 10.31.0.2 && ip.dsfield == 0xb8 && ip.ttl == 200)"
	total=$(tshark -r "$tmp/v4.pcap" 2>/dev/null | wc -l)
	bad=$(tshark -r "$tmp/v4.pcap" -Y "!($want)" 2>/dev/null | wc -l)
	if ((bad == 0 && total > 0)); then
		pass "TOS 0x2a and 0xb8, TTL 9 and 200 in all $total IPv4 headers"
	else
		fail "IPv4 headers: $bad of $total packets without their QP's TOS or TTL"
	fi
fi

# --- What perftest sees, over IPv6 and then IPv4 on the same veth.
perf() {
	local fam=$1 tool=$2 size=$3 port=$4
	shift 4
	netns_run_pair "$tool-$fam" 120 "$tool" -d "v${fam}a" -x 1 -s "$size" -p "$port" "$@" -- \
		"$tool" -d "v${fam}b" -x 1 -s "$size" -p "$port" "$@" 10.31.0.1 || return 1
	awk -v s="$size" '$1 == s { print $0; found = 1 } END { exit !found }' "$tmp/$tool-$fam.b"
}
for fam in 6 4; do
	if line=$(perf "$fam" ib_send_lat 64 18610 -n 5000); then
		pass "ib_send_lat 64 B over IPv$fam: $line"
		echo "$fam lat $line" >>"$tmp/perf"
	else
		fail "ib_send_lat over IPv$fam"
	fi
	if line=$(perf "$fam" ib_write_bw 65536 18611 -n 2000); then
		pass "ib_write_bw 64 KiB over IPv$fam: $line"
		echo "$fam bw $line" >>"$tmp/perf"
	else
		fail "ib_write_bw over IPv$fam"
	fi
done
if [[ -s $tmp/perf ]]; then
	echo "IPv6 next to IPv4 (64 B t_typical usec; 64 KiB BW average MB/s):"
	awk '$2 == "lat" { printf "  IPv%s ib_send_lat %s us\n", $1, $7 }
	     $2 == "bw"  { printf "  IPv%s ib_write_bw %s MB/s\n", $1, $6 }' "$tmp/perf"
fi

finish
