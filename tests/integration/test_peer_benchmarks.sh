#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The peer benchmarks of tools/bench, which the benchmark matrix runs beside
# sroce: short runs must each print one well-formed perftest-style row with
# positive figures and write JSON in the shared schema, bad arguments must be
# refused with a message and exit status 1, and fi_commit_bench must verify
# the data it wrote through libfabric's tcp provider.
#
# No sroce device is involved.  Traffic stays on 127.0.0.1, on TCP/UDP ports
# 19100-19199 only.
#
# Usage: test_peer_benchmarks.sh BUILD-DIR
#
# ctest: TIMEOUT=300 LABELS=perf
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
require_cmds ss

SOCK=$BUILD_DIR/tools/bench/socket_loopback
FIB=$BUILD_DIR/tools/bench/fi_commit_bench
PY=/usr/bin/python3
[[ -x $SOCK ]] || die "$SOCK not built"
[[ -x $PY ]] || skip "$PY (Debian's python3) not installed"

# bench_port: sets PORT to a port of 19100-19198 with it and the next one
# unused by TCP and UDP, so tools needing two ports get PORT and PORT+1.
BENCH_PORT_NEXT=$((19100 + RANDOM % 50 * 2))
bench_port() {
	local tries p
	for ((tries = 0; tries < 50; tries++)); do
		p=$BENCH_PORT_NEXT
		BENCH_PORT_NEXT=$((p + 2 > 19198 ? 19100 : p + 2))
		[[ -z $(ss -Htuan "( sport = :$p or sport = :$((p + 1)) or dport = :$p or dport = :$((p + 1)) )" 2>/dev/null) ]] &&
			{
				PORT=$p
				return 0
			}
	done
	die "no free port pair in 19100-19199"
}

# check_json FILE lat|bw TOOL METHOD MODE BYTES LOSS(0|1): the shared schema,
# exactly these keys, positive and consistent figures.
check_json() {
	"$PY" - "$@" <<'EOF'
import json, sys

path, kind, tool, method, mode, nbytes, loss = sys.argv[1:8]
with open(path) as f:
    d = json.load(f)
def need(cond, what):
    if not cond:
        sys.exit(f"{path}: {what}: {json.dumps(d)}")
need(set(d) == {"tool", "method", "mode", "results"}, "top-level keys")
need((d["tool"], d["method"], d["mode"]) == (tool, method, mode),
     f"expected tool {tool}, method {method}, mode {mode}")
need(isinstance(d["results"], list) and len(d["results"]) == 1, "one result")
r = d["results"][0]
if kind == "lat":
    keys = {"bytes", "iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p99_9"}
else:
    keys = {"bytes", "iterations", "bw_peak_MBps", "bw_avg_MBps", "msg_rate_Mpps"}
    if loss == "1":
        keys.add("loss_pct")
need(set(r) == keys, "result keys")
need(all(isinstance(r[k], (int, float)) for k in keys), "numbers")
need(r["bytes"] == int(nbytes), f"bytes {nbytes}")
need(isinstance(r["iterations"], int) and r["iterations"] > 0, "iterations")
if kind == "lat":
    need(all(r[k] > 0 for k in keys - {"t_stdev"}) and r["t_stdev"] >= 0, "positive times")
    need(r["t_min"] <= r["t_typical"] <= r["t_max"], "t_min <= t_typical <= t_max")
    need(r["t_min"] <= r["t_avg"] <= r["t_max"], "t_min <= t_avg <= t_max")
    need(r["t_typical"] <= r["p99"] <= r["p99_9"] <= r["t_max"], "percentiles ordered")
else:
    need(r["bw_avg_MBps"] > 0 and r["msg_rate_Mpps"] > 0, "positive bandwidth")
    need(r["bw_peak_MBps"] >= r["bw_avg_MBps"], "peak >= average")
    if loss == "1":
        need(0 <= r["loss_pct"] < 100, "loss percentage")
EOF
}

# check_row LOG BYTES MIN-FIELDS: the line under the '#bytes' header starts
# with BYTES and has at least MIN-FIELDS fields, all numbers, all but a
# trailing loss column positive.
check_row() {
	awk -v bytes="$2" -v nf="$3" '
		/#bytes/ { hdr = 1; next }
		hdr && !done {
			done = 1
			if ($1 != bytes || NF < nf) exit 1
			for (i = 2; i <= NF; i++) {
				if ($i !~ /^[0-9]+(\.[0-9]+)?$/) exit 1
				if (i <= nf && $i + 0 <= 0 && !(nf == 9 && i == 7)) exit 1
			}
			ok = 1
		}
		END { exit !ok }
	' "$1"
}

# sock NAME lat|bw METHOD MODE BYTES LOSS ARGS...: one socket_loopback run.
sock() {
	local name=$1 kind=$2 method=$3 mode=$4 bytes=$5 loss=$6
	shift 6
	bench_port
	local log=$WORK/$name.log json=$WORK/$name.json fields
	[[ $kind == lat ]] && fields=9 || fields=5
	if ! timeout -k 5 60 "$SOCK" -p "$PORT" "$@" --out_json_file "$json" >"$log" 2>&1; then
		fail "$name: socket_loopback $* exited non-zero"
		cat "$log"
		return
	fi
	if ! check_row "$log" "$bytes" "$fields"; then
		fail "$name: no well-formed result row"
		cat "$log"
		return
	fi
	local why
	if ! why=$(check_json "$json" "$kind" socket_loopback "$method" "$mode" "$bytes" "$loss" 2>&1); then
		fail "$name: $why"
		return
	fi
	pass "$name: $(awk '/#bytes/ { getline; print; exit }' "$log" | tr -s ' ')"
}

# refuse NAME PROGRAM ARGS...: must exit 1 with a message naming the program
# and print no result.
refuse() {
	local name=$1 prog=$2 rc=0
	shift 2
	timeout -k 5 20 "$prog" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
	local base
	base=$(basename "$prog")
	if [[ $rc != 1 ]]; then
		fail "$name: '$base $*' exited $rc, expected 1"
	elif ! grep -q "^$base: ." "$WORK/err"; then
		fail "$name: '$base $*' gave no clear error: $(cat "$WORK/err")"
	elif grep -q '#bytes' "$WORK/out"; then
		fail "$name: '$base $*' printed a result"
	else
		pass "$name: $(head -1 "$WORK/err")"
	fi
}

# ------------------------------------------------------------ socket_loopback
sock udp_bw bw udp blocking 4096 1 -P udp -m bw -s 4096 -n 50000
sock udp_lat lat udp blocking 36 0 -P udp -m lat -s 36 -n 2000
sock tcp_bw bw tcp blocking 65536 0 -P tcp -m bw -s 65536 -n 5000
sock tcp_lat lat tcp blocking 64 0 -P tcp -m lat -s 64 -n 2000
sock udp_lat_busy lat udp busy 36 0 -P udp -m lat -s 36 -n 500 --busy
sock tcp_bw_duration bw tcp blocking 65536 0 -P tcp -m bw -s 65536 -D 0.3
sock udp_bw_gso bw udp-gso blocking 4096 1 -P udp -m bw -s 4096 -n 40000 --gso 8

refuse bad_proto "$SOCK" -P sctp
refuse bad_mode "$SOCK" -m fast
refuse zero_size "$SOCK" -s 0
refuse udp_too_big "$SOCK" -P udp -s 70000
refuse size_not_number "$SOCK" -s 4k
refuse n_and_d "$SOCK" -n 10 -D 1
refuse not_loopback "$SOCK" -a 10.1.2.3
refuse gso_lat "$SOCK" -m lat --gso 4
refuse unknown_option "$SOCK" --frobnicate
refuse missing_value "$SOCK" -s

# ------------------------------------------------------------ fi_commit_bench
# fi SERVER-LOG CLIENT-LOG ARGS...: a server and a client on one port pair.
fi_pair() {
	local slog=$1 clog=$2 spid
	shift 2
	bench_port
	timeout -k 5 60 "$FIB" -P "$PORT" >"$slog" 2>&1 &
	spid=$!
	SROCE_BG_PIDS+=("$spid")
	if ! wait_listen "$PORT" "$spid"; then
		bg_wait "$spid"
		FI_CLIENT_RC=-1
		FI_SERVER_RC=$BG_RC
		return
	fi
	FI_CLIENT_RC=0
	timeout -k 5 60 "$FIB" -P "$PORT" "$@" 127.0.0.1 >"$clog" 2>&1 || FI_CLIENT_RC=$?
	bg_wait "$spid"
	FI_SERVER_RC=$BG_RC
}

fib() {
	local name=$1 kind=$2 bytes=$3
	shift 3
	local slog=$WORK/$name.server.log clog=$WORK/$name.client.log json=$WORK/$name.json fields why
	[[ $kind == lat ]] && fields=9 || fields=5
	fi_pair "$slog" "$clog" "$@" --out_json_file "$json"
	if [[ $FI_CLIENT_RC != 0 || $FI_SERVER_RC != 0 ]]; then
		fail "$name: client exited $FI_CLIENT_RC, server $FI_SERVER_RC"
		echo "--- server"
		cat "$slog"
		echo "--- client"
		cat "$clog"
		return
	fi
	if ! grep -q 'FI_COMMIT_COMPLETE' "$clog"; then
		fail "$name: the client did not write with FI_COMMIT_COMPLETE"
	elif ! grep -q 'data check *: read-back OK, target OK' "$clog" ||
		! grep -q 'target check *: .*OK' "$slog"; then
		fail "$name: data not verified"
		cat "$slog" "$clog"
	elif ! check_row "$clog" "$bytes" "$fields"; then
		fail "$name: no well-formed result row"
		cat "$clog"
	elif ! why=$(check_json "$json" "$kind" fi_commit_bench tcp-commit busy "$bytes" 0 2>&1); then
		fail "$name: $why"
	else
		pass "$name: $(awk '/#bytes/ { getline; print; exit }' "$clog" | tr -s ' ')"
	fi
}

if [[ ! -x $FIB ]]; then
	echo "skip fi_commit_bench: not built (libfabric-dev missing)"
elif ! fi_info -p tcp >/dev/null 2>&1; then
	echo "skip fi_commit_bench: libfabric has no tcp provider here"
else
	fib fi_tcp_lat_commit lat 64 -m lat -s 64 -n 300 --completion commit
	fib fi_tcp_bw_commit bw 65536 -m bw -s 65536 -n 300 --completion commit
	refuse fi_bad_completion "$FIB" --completion maybe 127.0.0.1
	refuse fi_bad_ep "$FIB" -e dgram 127.0.0.1
	refuse fi_not_loopback "$FIB" 192.0.2.1
	refuse fi_depth_in_lat "$FIB" -m lat -t 4 127.0.0.1
fi

finish
