#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Usage: remote_log_run.sh REMOTE_LOG TARGET-ADDR INITIATOR-ADDR RECORDS
#
# Runs docs/examples/remote_log as its user would: the target and the
# initiator as two processes on two sroce devices on lo, once with the native
# write-commit opcodes and once with --no-native (IBTA FLUSH sequences), each
# followed by an offline `--verify` of the log file; a third run maps the
# target's log through libpmem (--pmem), which on a file system without DAX
# must still work, persisting by msync.  Then two damaged copies
# of a log show that --verify does find a bad record and a head pointing past
# the last complete record.
#
# remote_log is linked with libsroce.so, so it needs no LD_PRELOAD and runs in
# the sanitizer trees as well.  Exits 77 (skipped) when /var/tmp is not a file
# system whose mappings can be registered for persistence.
set -uo pipefail

prog=${1:?usage: $0 REMOTE_LOG TARGET-ADDR INITIATOR-ADDR RECORDS}
taddr=${2:?} iaddr=${3:?} records=${4:?}
[[ -x $prog ]] || {
	echo "FAIL: $prog is not built"
	exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/remote_log_run.XXXXXX")
logs=()
server_pid=
server_args=()
runs=0
out=$work/run0
cleanup() {
	# Only the process this script started, by its id.
	[[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
	((${#logs[@]})) && rm -f "${logs[@]}"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export SROCE_CONFIG=$work/links.conf
printf 'rl0 netdev lo addr %s\nrl1 netdev lo addr %s\n' "$taddr" "$iaddr" >"$SROCE_CONFIG"
unset LD_PRELOAD SROCE_FAULT

fail() {
	echo "FAIL: $*"
	for f in server client verify; do
		[[ -s $out.$f ]] && sed "s/^/  $f: /" "$out.$f" | tail -n 30
	done
	exit 1
}

# Waits up to $2 seconds for file $1 to contain $3; fails early once process
# $4 has exited.
wait_for() {
	local deadline=$((SECONDS + $2))
	until grep -q -- "$3" "$1" 2>/dev/null; do
		kill -0 "$4" 2>/dev/null || return 1
		((SECONDS < deadline)) || return 1
		sleep 0.05
	done
}

# run MODE RECORD-SIZE [CLIENT-ARGS...]: one target/initiator pair, the target
# with ${server_args[@]} in addition; leaves the log file's name in $log.
run() {
	local mode=$1 rsize=$2 start=$SECONDS port crc src
	shift 2
	# Output files of their own per run: a later run must never read an
	# earlier run's lines before its own process has truncated the file.
	runs=$((runs + 1))
	out=$work/run$runs
	log=$(mktemp /var/tmp/remote_log_run.XXXXXX)
	logs+=("$log")
	timeout -k 5 50 "$prog" --server -d rl0 -g 1 -p 0 --file "$log" "${server_args[@]}" \
		>"$out.server" 2>&1 &
	server_pid=$!
	if ! wait_for "$out.server" 30 "listening on port" "$server_pid"; then
		if grep -q 'FLUSH_PERSISTENT): Invalid argument' "$out.server"; then
			echo "SKIP: /var/tmp cannot be registered for persistence"
			exit 77
		fi
		fail "$mode: the target did not start"
	fi
	grep -q '^target memory: .*(pmem_is_pmem=[01])$' "$out.server" ||
		fail "$mode: the target did not say what memory the log is in"
	port=$(sed -n 's/^remote_log: listening on port \([0-9]*\)$/\1/p' "$out.server")

	[[ -n $port ]] || fail "$mode: the target printed no port"

	crc=0
	timeout -k 5 50 "$prog" -d rl1 -g 1 -p "$port" -n "$records" --record-size "$rsize" \
		"$taddr" "$@" >"$out.client" 2>&1 || crc=$?
	# A target whose initiator failed may wait for it forever.
	((crc == 0)) || kill "$server_pid" 2>/dev/null
	src=0
	wait "$server_pid" || src=$?
	server_pid=
	((crc == 0)) || fail "$mode: initiator exited $crc"
	((src == 0)) || fail "$mode: target exited $src"

	grep -qx "remote_log: $mode" "$out.client" || fail "$mode was not the path taken"
	# Every record committed once, in order, and reported as it happened.
	awk -v n="$records" '/^committed / { if ($2 != ++k) exit 1 } END { exit k != n }' \
		"$out.client" || fail "$mode: the 'committed N' lines are not 1..$records"
	grep -qx "remote_log: $records records committed" "$out.client" ||
		fail "$mode: no final report from the initiator"
	grep -qx "remote_log: $records records durable in $log" "$out.server" ||
		fail "$mode: the target did not see $records commits"
	"$prog" --verify "$log" >"$out.verify" 2>&1 || fail "$mode: --verify failed"
	grep -qx "log ok: $records records" "$out.verify" || fail "$mode: --verify output"
	echo "ok   $mode${server_args[*]:+ (target ${server_args[*]})}: $records records of $rsize bytes in $((SECONDS - start)) s"
}

run "native write-commit" 100
native_log=$log
run "IBTA fallback (WRITE + FLUSH)" 3000 --no-native
server_args=(--pmem)
run "native write-commit" 100
server_args=()

# --verify must not pass vacuously.  Records of 100 bytes take 120 in the log
# (16-byte header, padded to 8) from offset 64.
bad=$work/bad.log
cp "$native_log" "$bad"
printf 'X' | dd of="$bad" bs=1 seek=$((64 + 249 * 120 + 16 + 5)) conv=notrunc status=none
"$prog" --verify "$bad" >"$out.verify" 2>&1 && fail "--verify accepted a damaged record"
grep -q "record 250 at offset $((64 + 249 * 120)): bad checksum" "$out.verify" ||
	fail "--verify did not name the damaged record"

cp "$native_log" "$bad"
head_le=
for ((i = 0; i < 64; i += 8)); do
	head_le+=$(printf '\\x%02x' $(((records + 1) >> i & 255)))
done
# shellcheck disable=SC2059 # the format is the little-endian head, as escapes
printf "$head_le" | dd of="$bad" bs=1 seek=0 conv=notrunc status=none
"$prog" --verify "$bad" >"$out.verify" 2>&1 && fail "--verify accepted a head past the log"
grep -q "record $((records + 1)) at offset" "$out.verify" ||
	fail "--verify did not name the record past the head"
echo "ok   --verify finds a damaged record and a head past the last record"
