#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The remote-persistence benchmarks of tools/perf (ib_write_commit_lat,
# ib_write_commit_bw, ib_flush_lat, ib_flush_bw, ib_atomic_write_lat) over
# two sroce links on lo, run as a user runs them: each tool under
# `sroce exec`, server and client as two processes.
#
#   - every tool with every method and variant (--ordered, --imm, flush
#     level, placement, --write, --flush), for 8 and 65536 bytes, into dram
#     and into a file: the client and the server each print exactly one
#     well-formed row per size, with positive figures in a sane order
#     (t_min <= t_typical, t_avg <= t_max; BW peak >= BW average).  Each run
#     also checks the bytes it wrote, at the client (READ back) and at the
#     server, and fails otherwise;
#   - -a, -D, -e, -I and --fence on a few cases;
#   - --out_json writes JSON in the schema the benchmark matrix reads;
#   - bad arguments, a bad device, a parameter mismatch and a missing server
#     end with a message and exit status 1.
#
# Addresses 127.0.9.1 and 127.0.9.2 (tests/README.md); TCP ports from
# next_port.  File targets live in /var/tmp, since registration for
# persistence refuses tmpfs.
#
# Usage: test_perf_tools.sh BUILD-DIR
#
# ctest: TIMEOUT=600 LABELS=perf RESOURCE_LOCK=lo-127.0.9.1,lo-127.0.9.2
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
require_cmds ss

PERF=$BUILD_DIR/tools/perf
PY=/usr/bin/python3
for t in ib_write_commit_lat ib_write_commit_bw ib_flush_lat ib_flush_bw ib_atomic_write_lat; do
	[[ -x $PERF/$t ]] || die "$PERF/$t not built"
done
[[ -x $PY ]] || skip "$PY (Debian's python3) not installed"

SADDR=127.0.9.1
sroce_config pt0 $SADDR pt1 127.0.9.2

# File targets: a directory on a file system that can make a mapping durable.
FILE_TMP=$(mktemp -d /var/tmp/sroce-perf.XXXXXX) || die "cannot create a directory in /var/tmp"
cleanup() {
	rm -rf "$FILE_TMP"
	_sroce_cleanup
}
trap cleanup EXIT
FILE_DIR=$FILE_TMP
case $(stat -f -c %T "$FILE_DIR") in
tmpfs | ramfs) FILE_DIR= ;;
esac
# --out_json without --out_json_file writes perftest_out.json here.
cd "$WORK" || die "cd $WORK"

ITERS_LAT=200
ITERS_BW=300

# check_rows LOG KIND SIZES ITERS: LOG's table has exactly one row per size
# of SIZES (comma-separated, in order), each with ITERS iterations (0: any)
# and sane figures; prints why not.
check_rows() {
	awk -v kind="$2" -v sizes="$3" -v iters="$4" '
		function bad(why) { print why ": " $0; failed = 1; exit 1 }
		function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ }
		BEGIN { want = split(sizes, size, ",") }
		/#bytes/ { if (seen++) bad("second table"); intable = 1; next }
		intable && /^-+$/ { intable = 0; next }
		intable {
			rows++
			if (rows > want) bad("more rows than sizes")
			if ($1 != size[rows]) bad("size " $1 " where " size[rows] " was expected")
			if (iters && $2 != iters) bad("iterations " $2 " where " iters " were expected")
			if (kind == "lat") {
				if (NF != 9) bad("not 9 columns")
				for (i = 1; i <= 9; i++) if (!num($i)) bad("column " i " is not a number")
				for (i = 3; i <= 9; i++) if (i != 7 && $i + 0 <= 0) bad("column " i " is not positive")
				if (!($3 <= $5 && $5 <= $4)) bad("t_typical outside [t_min, t_max]")
				if (!($3 <= $6 && $6 <= $4)) bad("t_avg outside [t_min, t_max]")
				if (!($8 <= $9 && $9 <= $4)) bad("percentiles out of order")
			} else {
				if (NF != 5) bad("not 5 columns")
				for (i = 1; i <= 5; i++) if (!num($i)) bad("column " i " is not a number")
				# MB/s with two decimals: a few bytes per operation may round to 0.00.
				for (i = 1; i <= 5; i++) if ($i + 0 <= 0 && !(i >= 3 && i <= 4 && $1 < 4096)) bad("column " i " is not positive")
				if ($3 < $4 * 0.999) bad("BW peak below BW average")
			}
		}
		END {
			if (failed) exit 1
			if (rows != want) { print rows + 0 " rows for " want " sizes"; exit 1 }
		}
	' "$1"
}

# bench NAME TOOL SIZES ITERS SERVER-ONLY-ARGS ARGS...: runs TOOL with ARGS on
# both sides (SERVER-ONLY-ARGS, a space-separated string, at the server only)
# and checks both tables.
bench() {
	local name=$1 tool=$2 sizes=$3 iters=$4 kind=lat why side log unit
	local -a sx
	read -r -a sx <<<"$5"
	shift 5
	[[ $tool == *_bw ]] && kind=bw
	if ! run_pair "$PERF/$tool" -d pt0 -x 1 -p @PORT@ "${sx[@]}" "$@" -- \
		"$PERF/$tool" -d pt1 -x 1 -p @PORT@ "$@" $SADDR; then
		fail "$name"
		return 1
	fi
	for side in client server; do
		log=$RP_CLIENT_LOG
		[[ $side == server ]] && log=$RP_SERVER_LOG
		if ! why=$(check_rows "$log" $kind "$sizes" "$iters"); then
			fail "$name: $side table: $why"
			cat "$log"
			return 1
		fi
	done
	unit="usec t_avg"
	[[ $kind == bw ]] && unit="MB/s"
	pass "$name ($(perftest_result "$RP_CLIENT_LOG") $unit, ${RP_SECONDS}s)"
}

# expect_fail NAME PATTERN CMD...: CMD exits 1 with PATTERN in its output.
expect_fail() {
	local name=$1 pattern=$2 out=$WORK/expect_fail.out rc=0
	shift 2
	timeout -k 5 30 "$@" >"$out" 2>&1 || rc=$?
	if [[ $rc != 1 ]]; then
		fail "$name: exit status $rc, not 1"
		cat "$out"
	elif ! grep -q -- "$pattern" "$out"; then
		fail "$name: no '$pattern' in the output"
		cat "$out"
	else
		pass "$name: $(grep -m1 -- "$pattern" "$out")"
	fi
}

# pair_fail NAME PATTERN TOOL SERVER-ARGS... -- CLIENT-ARGS...: both sides of
# a TOOL pair exit 1, and the client says PATTERN.
pair_fail() {
	local name=$1 pattern=$2 tool=$PERF/$3 arg seen=0 spid crc=0
	local -a s=() c=()
	shift 3
	for arg in "$@"; do
		if ((!seen)) && [[ $arg == -- ]]; then
			seen=1
		elif ((seen)); then
			c+=("$arg")
		else
			s+=("$arg")
		fi
	done
	next_port
	sroce_bg "$WORK/pf.server" "$tool" -d pt0 -x 1 -p "$PORT" "${s[@]}"
	spid=$BG_PID
	if ! wait_listen "$PORT" "$spid"; then
		fail "$name: the server did not listen"
		cat "$WORK/pf.server"
		kill "$spid" 2>/dev/null
		bg_wait "$spid"
		return 1
	fi
	timeout -k 5 30 "$SROCE_BIN" exec -- "$tool" -d pt1 -x 1 -p "$PORT" "${c[@]}" $SADDR \
		>"$WORK/pf.client" 2>&1 || crc=$?
	bg_wait "$spid"
	if [[ $crc != 1 || $BG_RC != 1 ]]; then
		fail "$name: client exited $crc, server $BG_RC (both should exit 1)"
		cat "$WORK/pf.client" "$WORK/pf.server"
	elif ! grep -q -- "$pattern" "$WORK/pf.client"; then
		fail "$name: no '$pattern' from the client"
		cat "$WORK/pf.client"
	else
		pass "$name: $(grep -m1 -- "$pattern" "$WORK/pf.client")"
	fi
}

# check_json FILE TOOL METHOD TARGET ORDERED IMM KIND SIZES
check_json() {
	local mode=${SROCE_BUSY_POLL:-${SROCE_POLL_MODE:-default}}
	if "$PY" - "$@" "$mode" <<'EOF'; then
import json, sys
path, tool, method, target, ordered, imm, kind, sizes, mode = sys.argv[1:]
with open(path) as f:
    d = json.load(f)
top = {"tool", "method", "target_mem", "ordered", "imm", "mode", "results"}
assert set(d) == top, f"top-level keys {sorted(d)}"
want = {"tool": tool, "method": method, "target_mem": target,
        "ordered": ordered == "true", "imm": imm == "true", "mode": mode}
for k, v in want.items():
    assert d[k] == v and type(d[k]) is type(v), f"{k} is {d[k]!r}, not {v!r}"
keys = ({"bytes", "iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99",
         "p99_9"} if kind == "lat" else
        {"bytes", "iterations", "bw_peak_MBps", "bw_avg_MBps", "msg_rate_Mpps"})
sizes = [int(s) for s in sizes.split(",")]
assert [r.get("bytes") for r in d["results"]] == sizes, f"sizes {d['results']}"
for r in d["results"]:
    assert set(r) == keys, f"result keys {sorted(r)}"
    assert type(r["bytes"]) is int and type(r["iterations"]) is int and r["iterations"] > 0
    for k in keys - {"bytes", "iterations", "t_stdev"}:
        assert isinstance(r[k], float) and r[k] > 0, f"{k} = {r[k]!r}"
    if kind == "lat":
        assert r["t_min"] <= r["t_avg"] <= r["t_max"], "t_avg outside [t_min, t_max]"
EOF
		pass "JSON $1"
	else
		fail "JSON $1"
		cat "$1"
	fi
}

echo "== ib_write_commit_lat / ib_write_commit_bw: every method into dram"
variants=(
	"write" "write --imm"
	"native" "native --ordered" "native --imm" "native --ordered --imm"
	"write-flush" "write-flush --ordered" "write-flush --imm" "write-flush --flush-level mr"
	"write-read" "write-read --ordered" "write-read --imm"
	"write-send" "write-send --imm"
)
for v in "${variants[@]}"; do
	read -r -a a <<<"$v"
	for size in 8 65536; do
		bench "lat $v $size" ib_write_commit_lat $size $ITERS_LAT "" \
			--method "${a[@]}" -s $size -n $ITERS_LAT
		bench "bw $v $size" ib_write_commit_bw $size $ITERS_BW "" \
			--method "${a[@]}" -s $size -n $ITERS_BW
	done
done

if [[ -n $FILE_DIR ]]; then
	echo "== every method into a file (persistent placement)"
	for v in "write" "native" "native --ordered --imm" "write-flush" "write-flush --ordered" \
		"write-read --ordered" "write-send" "write-send --imm"; do
		read -r -a a <<<"$v"
		bench "lat file $v" ib_write_commit_lat 4096 $ITERS_LAT "--target-mem file:$FILE_DIR/t" \
			--method "${a[@]}" -s 4096 -n $ITERS_LAT
		bench "bw file $v" ib_write_commit_bw 65536 $ITERS_BW "--target-mem file:$FILE_DIR/t" \
			--method "${a[@]}" -s 65536 -n $ITERS_BW
	done
	bench "lat pmem native" ib_write_commit_lat 64 $ITERS_LAT "--target-mem pmem:$FILE_DIR/p" \
		--method native -s 64 -n $ITERS_LAT
	bench "lat pmem write-send" ib_write_commit_lat 64 $ITERS_LAT \
		"--target-mem pmem:$FILE_DIR/p" --method write-send -s 64 -n $ITERS_LAT
	if grep -q "Target memory   : pmem $FILE_DIR/p (pmem_is_pmem=" "$RP_SERVER_LOG" &&
		grep -q "Target memory   : pmem (pmem_is_pmem=" "$RP_CLIENT_LOG"; then
		pass "pmem target named in both headers"
	else
		fail "pmem target named in both headers"
	fi
else
	log "file targets skipped: /var/tmp is a memory file system"
fi

echo "== ib_flush_lat / ib_flush_bw"
for v in "" "--write" "--flush-level mr" "--write --flush-level mr"; do
	read -r -a a <<<"$v"
	for size in 8 65536; do
		bench "flush lat [$v] $size" ib_flush_lat $size $ITERS_LAT "" "${a[@]}" -s $size \
			-n $ITERS_LAT
		bench "flush bw [$v] $size" ib_flush_bw $size $ITERS_BW "" "${a[@]}" -s $size -n $ITERS_BW
	done
done
if [[ -n $FILE_DIR ]]; then
	for v in "" "--write" "--write --placement global"; do
		read -r -a a <<<"$v"
		bench "flush lat file [$v]" ib_flush_lat 4096 $ITERS_LAT "--target-mem file:$FILE_DIR/f" \
			"${a[@]}" -s 4096 -n $ITERS_LAT
		bench "flush bw file [$v]" ib_flush_bw 65536 $ITERS_BW "--target-mem file:$FILE_DIR/f" \
			"${a[@]}" -s 65536 -n $ITERS_BW
	done
fi

echo "== ib_atomic_write_lat"
bench "atomic write" ib_atomic_write_lat 8 $ITERS_LAT "" -n $ITERS_LAT
bench "atomic write --flush" ib_atomic_write_lat 8 $ITERS_LAT "" --flush -n $ITERS_LAT
if [[ -n $FILE_DIR ]]; then
	bench "atomic write --flush file" ib_atomic_write_lat 8 $ITERS_LAT \
		"--target-mem file:$FILE_DIR/a" --flush -n $ITERS_LAT
fi

echo "== -a, -D, -e, -I, --fence"
all_sizes=2
for ((i = 2; i <= 23; i++)); do all_sizes+=",$((1 << i))"; done
bench "lat -a" ib_write_commit_lat "$all_sizes" 20 "" --method native -a -n 20
bench "bw -a" ib_flush_bw "$all_sizes" 20 "" --write -a -n 20 -t 8
bench "lat -D 1" ib_write_commit_lat 64 0 "" --method write-flush -s 64 -D 1
bench "bw -D 1" ib_write_commit_bw 4096 0 "" --method native --imm -s 4096 -D 1
bench "lat -e" ib_write_commit_lat 64 $ITERS_LAT "" --method write-send --imm -s 64 -n $ITERS_LAT -e
bench "bw -e" ib_write_commit_bw 64 $ITERS_BW "" --method native --imm -s 64 -n $ITERS_BW -e
bench "lat -I 64" ib_write_commit_lat 64 $ITERS_LAT "" --method native -s 64 -n $ITERS_LAT -I 64
bench "bw -t 4" ib_write_commit_bw 4096 $ITERS_BW "" --method write-read -s 4096 -n $ITERS_BW -t 4
# Lists that do not divide -n, and a list longer than the window.
bench "bw -l 16" ib_write_commit_bw 64 $ITERS_BW "" --method native --imm -s 64 -n $ITERS_BW -l 16
bench "bw -l 7" ib_write_commit_bw 64 $ITERS_BW "" --method write-flush --ordered -s 64 \
	-n $ITERS_BW -l 7
bench "bw -l 64 -t 8" ib_write_commit_bw 4096 $ITERS_BW "" --method write-send -s 4096 \
	-n $ITERS_BW -l 64 -t 8
bench "lat --fence" ib_write_commit_lat 64 $ITERS_LAT "" --method write-flush --ordered --fence \
	-s 64 -n $ITERS_LAT
bench "bw --fence" ib_write_commit_bw 64 $ITERS_BW "" --method write-read --ordered --fence \
	-s 64 -n $ITERS_BW

echo "== SROCE_STATS: counters at close agree with the traffic"
# 200 native commits of 64 bytes: one request packet each at the client.
if SROCE_STATS=1 bench "stats" ib_write_commit_lat 64 200 "" --method native -s 64 -n 200; then
	stats=$(grep -h "^sroce: pt1: " "$RP_CLIENT_LOG" || true)
	tx=$(sed -nE 's/.* tx_pkts ([0-9]+) .*/\1/p' <<<"$stats")
	if [[ -z $tx ]]; then
		fail "SROCE_STATS=1 printed no counters for pt1"
	elif ((tx < 200)); then
		fail "SROCE_STATS: tx_pkts $tx < 200 commits"
	else
		pass "SROCE_STATS: $stats"
	fi
fi

echo "== a server that dies mid-run"
# kill -9 of the server while commits are in flight: the client must stop
# with the transport's error and exit 1, not hang or report a result.
next_port
sroce_bg "$WORK/dead_server.log" "$PERF/ib_write_commit_bw" -d pt0 -x 1 -p "$PORT" --method native -D 30
server=$BG_PID
if ! wait_listen "$PORT" "$server"; then
	fail "dead server: the server did not listen"
else
	sroce_bg "$WORK/dead_client.log" "$PERF/ib_write_commit_bw" -d pt1 -x 1 -p "$PORT" \
		--method native -D 30 $SADDR
	client=$BG_PID
	sleep 2
	pkill -9 -f "ib_write_commit_bw -d pt0 -x 1 -p $PORT " || true
	bg_wait "$client"
	if [[ $BG_RC != 1 ]]; then
		fail "dead server: the client exited with $BG_RC, not 1"
		cat "$WORK/dead_client.log"
	elif ! grep -q "a durable write failed: completion status transport retry counter exceeded" \
		"$WORK/dead_client.log"; then
		fail "dead server: no retry-exceeded error from the client"
		cat "$WORK/dead_client.log"
	else
		pass "dead server: $(grep -m1 'a durable write failed' "$WORK/dead_client.log")"
	fi
	bg_wait "$server"
fi

echo "== --out_json"
bench "lat json" ib_write_commit_lat 64 $ITERS_LAT "" --method native --ordered --imm -s 64 \
	-n $ITERS_LAT --out_json --out_json_file="$WORK/lat.json" &&
	check_json "$WORK/lat.json" ib_write_commit_lat native dram true true lat 64
bench "bw json (default file, --report_gbits)" ib_write_commit_bw 65536 $ITERS_BW "" \
	--method write-send -s 65536 -n $ITERS_BW --out_json --report_gbits &&
	check_json "$WORK/perftest_out.json" ib_write_commit_bw write-send dram false false bw 65536
if [[ -n $FILE_DIR ]]; then
	bench "flush json" ib_flush_lat 8 $ITERS_LAT "--target-mem file:$FILE_DIR/j" --write -s 8 \
		-n $ITERS_LAT --out_json --out_json_file="$WORK/flush.json" &&
		check_json "$WORK/flush.json" ib_flush_lat write-flush file false false lat 8
fi
bench "atomic json" ib_atomic_write_lat 8 $ITERS_LAT "" -n $ITERS_LAT --out_json \
	--out_json_file="$WORK/atomic.json" &&
	check_json "$WORK/atomic.json" ib_atomic_write_lat atomic-write dram false false lat 8

echo "== errors"
lat=$PERF/ib_write_commit_lat
expect_fail "unknown method" "unknown method 'bogus'" "$lat" --method bogus
expect_fail "--ordered with write-send" "cannot be used with --method write-send" \
	"$lat" --method write-send --ordered
expect_fail "--ordered with write" "no meaning for --method write" "$lat" --method write --ordered
expect_fail "unknown option" "unknown option '--bogus'" "$lat" --bogus
expect_fail "missing argument" "needs an argument" "$lat" -s
expect_fail "bad size" "invalid --size '0'" "$lat" -s 0
expect_fail "bad mtu" "invalid --mtu '1000'" "$lat" -m 1000
expect_fail "-n with -D" "cannot be used together" "$lat" -n 10 -D 1
expect_fail "-t in a latency test" "bandwidth tests only" "$lat" -t 4
expect_fail "-l in a latency test" "bandwidth tests only" "$lat" -l 4
expect_fail "bad --post_list" "invalid --post_list '0'" "$PERF/ib_write_commit_bw" -l 0
expect_fail "--imm in ib_flush_lat" "not available in ib_flush_lat" "$PERF/ib_flush_lat" --imm
expect_fail "atomic write size" "exactly 8 bytes" "$PERF/ib_atomic_write_lat" -s 16
expect_fail "atomic write -a" "not available in ib_atomic_write_lat" "$PERF/ib_atomic_write_lat" -a
expect_fail "--target-mem at the client" "server option" "$lat" --target-mem dram $SADDR
expect_fail "bad --target-mem" "invalid --target-mem" "$lat" --target-mem disk
expect_fail "--fence without --ordered" "--fence applies" "$lat" --method write-flush --fence
expect_fail "--flush-level with native" "--flush-level applies" "$lat" --flush-level mr
expect_fail "bad device" "IB device 'nosuch' not found" \
	"$SROCE_BIN" exec -- "$lat" -d nosuch -x 1 $SADDR
next_port
expect_fail "no server" "cannot connect to server $SADDR port $PORT" \
	"$SROCE_BIN" exec -- "$lat" -d pt1 -x 1 -p "$PORT" $SADDR
pair_fail "parameter mismatch" "parameter mismatch: --size is 8 at the server and 64" \
	ib_write_commit_lat -s 8 -n 10 -- -s 64 -n 10
pair_fail "method mismatch" "--method is native at the server and write-flush" \
	ib_write_commit_lat --method native -n 10 -- --method write-flush -n 10
pair_fail "persistent FLUSH of dram" "can only be made globally visible" \
	ib_flush_lat --placement persistent -n 10 -- --placement persistent -n 10

finish
