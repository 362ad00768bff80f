#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The remote log through libfabric (docs/examples/fi_remote_log.c) over the
# pmof provider, and its target killed mid-stream:
#
#   1. a whole run of 500 records, then `--verify` of the log file: every
#      record complete, the head at 500;
#   2. the same stream of small records, the target killed with SIGKILL after
#      about a second.  The initiator must end with a completion error
#      (exit 3), not hang; the log file passes `--verify` with its head H at
#      least the last `committed N` the initiator printed (a completed
#      FI_COMMIT is never lost), every record 1..H complete (FI_FENCE placed
#      no head before its record), and H past N by at most the 16 appends the
#      initiator keeps in flight.
#
# Each run twice: with FI_COMMIT carried by the transport (sroce's native
# write-commit) and with FI_COMMIT_MANUAL (the target's handler msyncs the
# ranges it is given).  SIGKILL leaves the page cache alone, so this checks
# the protocol - placement order, no completion ahead of the target's
# persistence - not power loss.
#
# Usage: test_pmof_commit_kill.sh BUILD-DIR
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.22.1,lo-127.0.22.2
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
prog=$BUILD_DIR/tests/compile/fi_remote_log
[[ -x $prog ]] || die "$prog is not built"
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
[[ -f $FI_PROVIDER_PATH/libpmof-fi.so ]] || die "libpmof-fi.so is not built in $FI_PROVIDER_PATH"
fabric_init pmof
A=127.0.22.1
B=127.0.22.2
depth=16
logs=()
cleanup() {
	((${#logs[@]})) && rm -f "${logs[@]}"
	_sroce_cleanup
}
trap cleanup EXIT

sroce_config fk0 $A fk1 $B
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"} || die "agent start failed"

# start_target NAME [ARGS...]: sets spid, port, log.
start_target() {
	local name=$1
	shift
	out=$WORK/$name
	log=$(mktemp /var/tmp/pmof-commit-kill.XXXXXX)
	logs+=("$log")
	# No `timeout` in between: `sroce exec` execs the program, so $! is the
	# target itself and a SIGKILL reaches it.
	"$SROCE_BIN" exec -- "$prog" --server -a $A --file "$log" --size 67108864 "$@" \
		>"$out.server" 2>&1 &
	spid=$!
	SROCE_BG_PIDS+=("$spid")
	if ! wait_for "$out.server" 30 "listening on port" "$spid"; then
		fail "$name: the target did not start"
		show_logs "$out"
		return 1
	fi
	port=$(sed -n 's/^fi_remote_log: listening on port \([0-9]*\)$/\1/p' "$out.server")
	[[ -n $port ]] || die "$name: the target printed no port"
}

whole() {
	local name=$1 head
	shift
	start_target "$name" "$@" || return
	RP_TIMEOUT=120 sroce_bg "$out.client" "$prog" -a $A -p "$port" -n 500 "$@"
	bg_wait "$BG_PID"
	if ((BG_RC != 0)); then
		fail "$name: the initiator exited $BG_RC"
		show_logs "$out"
		kill "$spid" 2>/dev/null
		bg_wait "$spid"
		return
	fi
	bg_wait "$spid"
	((BG_RC == 0)) || fail "$name: the target exited $BG_RC"
	head=$("$prog" --verify "$log" 2>&1)
	if [[ $head == "log ok: 500 records" ]]; then
		pass "$name: 500 records committed and verified"
	else
		fail "$name: --verify: $head"
		show_logs "$out"
	fi
}

crash() {
	local name=$1 cpid last ms
	shift
	start_target "$name" "$@" || return
	RP_TIMEOUT=120 sroce_bg "$out.client" "$prog" -a $A -p "$port" -n 1000000 \
		--record-size 32 "$@"
	cpid=$BG_PID
	kill_mid_stream "$name" "$out" "$spid" "$cpid" || return
	ms=$(awk -v s="$(elapsed "$KILLED_AT")" 'BEGIN { printf "%d", s * 1000 }')
	last=$(awk '/^committed / { n = $2 } END { print n + 0 }' "$out.client")
	echo "$name: target killed after $last completed commits; initiator exited $BG_RC after $ms ms"
	case $BG_RC in
	3) pass "$name: the initiator stopped with a completion error" ;;
	124 | 137) fail "$name: the initiator hung after the target was killed" ;;
	*)
		fail "$name: the initiator exited $BG_RC, expected 3"
		show_logs "$out"
		;;
	esac
	((last > 0)) || fail "$name: nothing was committed before the kill"
	if ! "$prog" --verify "$log" --record-size 32 >"$out.verify" 2>&1; then
		fail "$name: --verify: $(cat "$out.verify")"
		return
	fi
	check_log_head "$name" "$out.verify" "$last" "$depth"
}

whole transport
whole manual --manual
crash transport-kill
crash manual-kill --manual
finish
