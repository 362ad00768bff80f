#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Two hosts joined by a lossy link: network namespaces A (server) and B
# (client) connected by a veth pair, where nftables in B drops about 5% of
# the RoCEv2 packets (UDP port 4791) in each direction.  A seeded random mix
# of verbs operations must still complete with every byte verified, and
# perftest bandwidth runs must finish.  The nft counters prove the loss
# really happened.
#
# Usage: test_netns_loss.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces, veth
# or nftables.  Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=600 LABELS=netns PROCESSORS=2
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build=${1:?usage: test_netns_loss.sh BUILD-DIR}
sroce=$build/tools/sroce/sroce
xfer=$build/tests/progs/sroce_xfer
for f in "$sroce" "$xfer"; do
	[[ -x $f ]] || {
		echo "FAIL: $f is not built" >&2
		exit 1
	}
done

# The RoCEv2 loss rate, in percent, applied on output and on input in B.
loss=${SROCE_TEST_LOSS_PERCENT:-5}
iters=${SROCE_TEST_XFER_ITERS:-3000}
ops=${SROCE_TEST_XFER_OPS:-write,send,imm,fadd,cswp}
# A new operation mix each run; the seed is printed so a failure can be rerun.
seed=${SROCE_TEST_XFER_SEED:-$$}

skip() {
	echo "SKIP: $*" >&2
	exit 77
}
((EUID == 0)) || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"
command -v nft >/dev/null || skip "no nft(8)"

ns_a=sroce-loss-a-$$
ns_b=sroce-loss-b-$$
tmp=$(mktemp -d)
pids=()
# Whatever runs inside the namespaces was started by this script.
kill_in() {
	local p
	for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
}
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	netns_cleanup
	wait 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

netns_pair "$ns_a" "$ns_b"

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

in_a() { ip netns exec "$ns_a" "$@"; }
in_b() { ip netns exec "$ns_b" "$@"; }

if ! { in_a ip addr add 10.200.0.1/24 dev veth-a && in_b ip addr add 10.200.0.2/24 dev veth-b; }; then
	fail "cannot configure the namespaces"
fi

# Both hooks in B: B's requests are dropped on their way out and A's
# responses and ACKs (also sent to port 4791) on their way in.
in_b nft -f - <<EOF 2>"$tmp/err" || skip "nftables unusable: $(cat "$tmp/err")"
table inet loss {
	chain out {
		type filter hook output priority 0;
		udp dport 4791 numgen random mod 100 < $loss counter drop
	}
	chain in {
		type filter hook input priority 0;
		udp dport 4791 numgen random mod 100 < $loss counter drop
	}
}
EOF

conf_a=$tmp/a.conf
conf_b=$tmp/b.conf
in_a "$sroce" --config "$conf_a" link add sroce0 netdev veth-a addr 10.200.0.1 ||
	fail "sroce link add in $ns_a"
in_b "$sroce" --config "$conf_b" link add sroce1 netdev veth-b addr 10.200.0.2 ||
	fail "sroce link add in $ns_b"
in_a "$sroce" --config "$conf_a" link show
in_b "$sroce" --config "$conf_b" link show

# Waits up to 20 s for a TCP listener on port $1 in A (perftest's own
# messages are buffered, so its output cannot tell when it is ready).
wait_listen() {
	local deadline=$((SECONDS + 20))
	until [[ -n $(in_a ss -Hltn "sport = :$1") ]]; do
		((SECONDS < deadline)) || return 1
		sleep 0.05
	done
}

show() {
	local f
	for f in "$@"; do
		[[ -s $tmp/$f ]] && sed "s/^/  $f: /" "$tmp/$f" >&2
	done
}

# Prints the packets counted by the rule of chain $1 in B.
dropped() {
	in_b nft list chain inet loss "$1" | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}

failures=0
check_failed() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

# run_pair NAME SERVER-COMMAND... -- CLIENT-COMMAND...: the server runs in A,
# the client in B once the server listens on $port; each runs under
# `sroce exec`, bounded by `timeout 120`.
run_pair() {
	local name=$1
	shift
	local server=() client=()
	while [[ $1 != -- ]]; do
		server+=("$1")
		shift
	done
	shift
	client=("$@")
	local start=$SECONDS out_s=$name.server out_c=$name.client
	local drops_before=$(($(dropped out) + $(dropped in)))
	SROCE_CONFIG=$conf_a in_a timeout -s KILL 120 "$sroce" exec -- "${server[@]}" >"$tmp/$out_s" 2>&1 &
	local spid=$!
	pids+=("$spid")
	if ! wait_listen "$port"; then
		check_failed "$name: server did not get ready"
		kill_in "$ns_a"
		wait "$spid"
		show "$out_s"
		return 1
	fi
	SROCE_CONFIG=$conf_b in_b timeout -s KILL 120 "$sroce" exec -- "${client[@]}" >"$tmp/$out_c" 2>&1
	local crc=$?
	wait "$spid"
	local src=$?
	local drops=$(($(dropped out) + $(dropped in) - drops_before))
	echo "$name: client exit $crc, server exit $src, $((SECONDS - start)) s, $drops packets dropped"
	if ((crc != 0 || src != 0)); then
		check_failed "$name: client exited $crc, server exited $src"
		show "$out_s" "$out_c"
		return 1
	fi
	return 0
}

port=18600
echo "sroce_xfer: $iters operations ($ops), seed $seed"
run_pair xfer "$xfer" -d sroce0 -g 1 -p "$port" -- \
	"$xfer" -d sroce1 -g 1 -p "$port" -n "$iters" --ops "$ops" --seed "$seed" --depth 8 --timeout 13 -v 10.200.0.1 &&
	{
		grep -q '^xfer: .* OK$' "$tmp/xfer.client" || check_failed "xfer client did not print OK"
		grep -q '^xfer: .* OK$' "$tmp/xfer.server" || check_failed "xfer server did not print OK"
		sed 's/^/  /' "$tmp/xfer.client"
	}

if command -v ib_write_bw >/dev/null && command -v ib_read_bw >/dev/null; then
	for bw in ib_write_bw ib_read_bw; do
		run_pair "$bw" "$bw" -d sroce0 -x 1 -s 65536 -n 500 -p "$port" -- \
			"$bw" -d sroce1 -x 1 -s 65536 -n 500 -p "$port" 10.200.0.1 &&
			grep -E '^ +65536 ' "$tmp/$bw.client" | sed "s/^/  $bw:/"
	done
else
	echo "perftest not installed: ib_write_bw / ib_read_bw runs skipped"
fi

out=$(dropped out)
in=$(dropped in)
echo "nftables dropped $out outgoing and $in incoming RoCEv2 packets in $ns_b"
((out > 0)) || check_failed "no outgoing RoCEv2 packet was dropped: the loss rule did not work"
((in > 0)) || check_failed "no incoming RoCEv2 packet was dropped: the loss rule did not work"

if ((failures)); then
	echo "$failures check(s) failed" >&2
	exit 1
fi
echo "lossy link test passed"
