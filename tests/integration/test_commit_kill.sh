#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A real target process killed while it is being written: docs/examples/
# remote_log streams small records into a file-backed log on /var/tmp, each
# followed by an ORDERED write-commit (with immediate) of the log's head
# index, and prints `committed N` as each commit completes.  After about a
# second the target is killed with SIGKILL.  Then:
#   - the initiator ends with a transport error (exit 3, retry counter
#     exceeded: its QP gives a silent target about 8 s), not a hang;
#   - the log file passes `remote_log --verify`: its head index H is at least
#     the last N the initiator printed (an acknowledged commit is never lost),
#     every record 1..H is complete (ORDERED placed no head before its
#     record), and H exceeds N by at most the 16 records the initiator keeps
#     in flight.
# Once with the native commit opcodes and once with --no-native (IBTA FLUSH).
#
# SIGKILL leaves the page cache alone, so this proves the protocol: the
# order of placement and that no acknowledgement runs ahead of the target's
# persistence call.  Loss of power, where only what was persisted survives,
# is the crash-consistency unit test (tests/unit/test_crash_consistency.cpp).
#
# Usage: test_commit_kill.sh BUILD-DIR
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.7.3,lo-127.0.7.4
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
prog=$BUILD_DIR/tests/compile/remote_log
[[ -x $prog ]] || die "$prog is not built"

# Slots in flight at the initiator (DEPTH in remote_log.c).
depth=16
# The log files live on /var/tmp: registration for persistence refuses tmpfs.
logs=()
cleanup() {
	((${#logs[@]})) && rm -f "${logs[@]}"
	_sroce_cleanup
}
trap cleanup EXIT

sroce_config ck0 127.0.7.3 ck1 127.0.7.4

# crash MODE PATH [CLIENT-ARGS...]: PATH is how the initiator says it commits.
crash() {
	local mode=$1 path=$2 log port spid cpid ms last
	shift 2
	# Output files of their own per run: a later run must never read an
	# earlier run's lines before its own process has truncated the file.
	out=$WORK/$mode
	log=$(mktemp /var/tmp/sroce-commit-kill.XXXXXX)
	logs+=("$log")

	# No `timeout` in between: `sroce exec` execs the program, so $! is the
	# verbs process itself and the SIGKILL below reaches it.
	"$SROCE_BIN" exec -- "$prog" --server -d ck0 -g 1 -p 0 --file "$log" --size 64M \
		>"$out.server" 2>&1 &
	spid=$!
	SROCE_BG_PIDS+=("$spid")
	if ! wait_for "$out.server" 30 "listening on port" "$spid"; then
		grep -q 'FLUSH_PERSISTENT): Invalid argument' "$out.server" &&
			skip "/var/tmp cannot be registered for persistence"
		fail "$mode: the target did not start"
		show_logs "$out"
		return
	fi
	port=$(sed -n 's/^remote_log: listening on port \([0-9]*\)$/\1/p' "$out.server")
	[[ -n $port ]] || die "$mode: the target printed no port"

	# A million records would take minutes: the stream is still going when
	# the target dies.
	RP_TIMEOUT=120 sroce_bg "$out.client" "$prog" -d ck1 -g 1 -p "$port" -n 1000000 \
		--record-size 32 127.0.7.3 "$@"
	cpid=$BG_PID
	kill_mid_stream "$mode" "$out" "$spid" "$cpid" || return
	ms=$(awk -v s="$(elapsed "$KILLED_AT")" 'BEGIN { printf "%d", s * 1000 }')

	if ! grep -qx "remote_log: $path" "$out.client"; then
		fail "$mode: the initiator did not use the $path"
	fi
	last=$(awk '/^committed / { n = $2 } END { print n + 0 }' "$out.client")
	echo "$mode: target killed after $last acknowledged commits;" \
		"initiator exited $BG_RC after $ms ms"
	case $BG_RC in
	3) pass "$mode: the initiator stopped with a completion error" ;;
	124 | 137) fail "$mode: the initiator hung after the target was killed" ;;
	*) fail "$mode: the initiator exited $BG_RC, expected 3" ;;
	esac
	if grep -q 'transport retry counter exceeded' "$out.client"; then
		pass "$mode: the error is IBV_WC_RETRY_EXC_ERR"
	else
		fail "$mode: no transport retry error reported"
		show_logs "$out"
	fi
	if grep -q 'records committed$' "$out.client"; then
		fail "$mode: the initiator reported a finished run"
	fi
	((last > 0)) || fail "$mode: nothing was committed before the kill"

	if ! "$prog" --verify "$log" >"$out.verify" 2>&1; then
		fail "$mode: --verify: $(cat "$out.verify")"
		return
	fi
	echo "$mode: $(cat "$out.verify")"
	check_log_head "$mode" "$out.verify" "$last" "$depth"
}

crash native "native write-commit"
crash no-native "IBTA fallback (WRITE + FLUSH)" --no-native
finish
