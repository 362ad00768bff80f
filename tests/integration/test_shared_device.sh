#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# One sroce device, many processes (docs/shared-device.md): servers and
# clients of Debian's unmodified programs on the same device address, four
# perftest pairs at once, `sroce resource show`, a process killed mid-run
# that disturbs nobody, and the agent killed under running programs: with
# root's agent (a slot map) ib_write_bw, ibv_rc_pingpong -c and a
# write-commit stream run on and a new agent takes over; with the classic
# program they fail with a clear message, never hang.
#
# Usage: test_shared_device.sh BUILD-DIR
# ctest: TIMEOUT=600 RESOURCE_LOCK=lo-127.0.18.1,lo-127.0.18.2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout ibv_rc_pingpong ibv_ud_pingpong ib_write_bw ib_send_bw
require_loopback
sroce_config sroce0 127.0.18.1 sroce1 127.0.18.2
private_agent
# Every agent's messages, those that programs start included.
export SROCE_AGENT_LOG=$WORK/agent.log

# --- server and client on one device ------------------------------------------
if run_pair ibv_rc_pingpong -d sroce0 -g 1 -n 200 -c -p @PORT@ -- \
	ibv_rc_pingpong -d sroce0 -g 1 -n 200 -c -p @PORT@ 127.0.0.1; then
	pass "ibv_rc_pingpong: server and client on sroce0, buffers checked"
else
	fail "ibv_rc_pingpong on one device"
fi
if run_pair ibv_ud_pingpong -d sroce0 -g 1 -n 200 -p @PORT@ -- \
	ibv_ud_pingpong -d sroce0 -g 1 -n 200 -p @PORT@ 127.0.0.1; then
	pass "ibv_ud_pingpong: server and client on sroce0"
else
	fail "ibv_ud_pingpong on one device"
fi
if run_pair ib_send_bw -d sroce0 -x 1 -c UD -n 2000 -p @PORT@ -- \
	ib_send_bw -d sroce0 -x 1 -c UD -n 2000 -p @PORT@ 127.0.0.1; then
	pass "ib_send_bw -c UD on one device: $(perftest_result "$RP_CLIENT_LOG") MB/s"
else
	fail "ib_send_bw -c UD on one device"
fi

# --- four perftest pairs at once on one pair of devices ----------------------
# Timed runs: counted ones finish (at ~3 GB/s) before the last pair starts,
# and the listing below would find nothing left to list.
# four_pairs: the four pairs and their checks; fails (1) only when perftest
# itself could not calibrate its clock, the runs being otherwise fine (it
# samples the cycle counter and gives up with "Can't produce a report" when
# a loaded machine makes the samples scatter: r^2 < 0.9).
four_pairs() {
	local pids=() logs=() clock=0 i k p spid t out rcqps=0 dupes='' bad
	for i in 1 2 3 4; do
		next_port
		p=$PORT
		sroce_bg "$WORK/bw$i.server" ib_write_bw -d sroce0 -x 1 -s 65536 -D 4 -p "$p"
		spid=$BG_PID
		wait_listen "$p" "$spid" || die "ib_write_bw server $i did not listen"
		sroce_bg "$WORK/bw$i.client" ib_write_bw -d sroce1 -x 1 -s 65536 -D 4 -p "$p" 127.0.0.1
		pids+=("$spid" "$BG_PID")
		logs+=("$WORK/bw$i.server" "$WORK/bw$i.client")
	done
	# All eight processes hold slots while the pairs run; their QPs show up
	# once the clients have connected.  On a loaded machine the first pair
	# may be done before the last has connected: the listings are taken
	# together (a QP is its device, QPN and process), each checked for
	# duplicate QPNs.
	local -A seen=()
	local all="" key
	for ((t = 0; t < 100; t++)); do
		out=$("$SROCE_BIN" resource show qp 2>&1 || true)
		all+="$out"$'\n'
		# QPNs are unique per device (each has its own QP1).
		dupes+=$(awk '{ for (i = 1; i < NF; i++) if ($i == "lqpn") print $2, $(i + 1) }' <<<"$out" | sort | uniq -d)
		while read -r key; do
			[[ -n $key ]] && seen[$key]=1
		done < <(awk '/ type RC .*comm ib_write_bw/ {
			for (i = 1; i < NF; i++) if ($i == "lqpn") q = $(i + 1); else if ($i == "pid") p = $(i + 1)
			print $2 "/" q "/" p }' <<<"$out")
		rcqps=${#seen[@]}
		((rcqps >= 8)) && break
		sleep 0.1
	done
	if [[ -z $dupes ]] && ((rcqps >= 8)); then
		pass "sroce resource show qp: $rcqps RC QPs listed, every QPN unique"
	else
		fail "sroce resource show qp" "duplicate QPNs '$dupes' or fewer than 8 RC QPs ($rcqps) in:"$'\n'"$out"
	fi
	if grep -q 'comm ib_write_bw' <<<"$all"; then
		pass "resource show names the processes"
	else
		fail "resource show names the processes" "in:"$'\n'"$out"
	fi
	bad=0
	for k in "${!pids[@]}"; do
		bg_wait "${pids[$k]}"
		if ((BG_RC != 0)); then
			bad=1
			log "--- ${logs[$k]} (exit $BG_RC)"
			cat "${logs[$k]}" >&2
			grep -q "Can't produce a report" "${logs[$k]}" && clock=1
		fi
	done
	if ((bad && clock && !${1:-0})); then
		log "perftest could not calibrate its clock on this loaded machine: the four pairs again"
		return 1
	fi
	if ((!bad)); then
		local figs
		figs=$(for i in 1 2 3 4; do perftest_result "$WORK/bw$i.client"; done | tr '\n' ' ')
		pass "four ib_write_bw pairs at once: $figs MB/s"
	else
		fail "four ib_write_bw pairs at once"
	fi
	return 0
}
four_pairs || four_pairs 1

# long_pair NAME SECONDS: an ib_write_bw pair (sroce0 serving sroce1) that
# runs for SECONDS in the background, under way when this returns; leaves
# LP_PORT, LP_SRV and LP_CLI (the two background pids).
long_pair() {
	next_port
	LP_PORT=$PORT
	sroce_bg "$WORK/$1.server" ib_write_bw -d sroce0 -x 1 -D "$2" -p "$LP_PORT"
	LP_SRV=$BG_PID
	wait_listen "$LP_PORT" "$LP_SRV" || die "$1: ib_write_bw's server did not listen"
	sroce_bg "$WORK/$1.client" ib_write_bw -d sroce1 -x 1 -D "$2" -p "$LP_PORT" 127.0.0.1
	LP_CLI=$BG_PID
	# Until the client's QP is listed: a client that has not leased its
	# slot yet is no test of what happens to one that has (on a loaded
	# machine a fixed pause was not always enough).
	local pid="" deadline=$((SECONDS + 60))
	until [[ -n $pid ]] && "$SROCE_BIN" resource show qp 2>/dev/null | grep -q "pid $pid "; do
		kill -0 "$LP_CLI" 2>/dev/null || die "$1: ib_write_bw's client exited early" "$(cat "$WORK/$1.client")"
		((SECONDS < deadline)) || die "$1: the client's QP is not listed after 60 s"
		pid=$(pgrep -f -n "ib_write_bw -d sroce1 -x 1 -D $2 -p $LP_PORT" || true)
		sleep 0.1
	done
	sleep 2
}

# --- a process killed mid-run disturbs nobody ---------------------------------
long_pair a 20
pa=$LP_PORT a_srv=$LP_SRV a_cli=$LP_CLI
# The client's own process, not the timeout wrapper around it.
victim=$(pgrep -f -n "ib_write_bw -d sroce1 -x 1 -D 20 -p $pa" || true)
[[ -n $victim ]] || die "victim client not found"
kill -9 "$victim"
if run_pair ib_write_bw -d sroce0 -x 1 -n 2000 -p @PORT@ -- \
	ib_write_bw -d sroce1 -x 1 -n 2000 -p @PORT@ 127.0.0.1; then
	pass "a pair runs while another's client was killed: $(perftest_result "$RP_CLIENT_LOG") MB/s"
else
	fail "a pair after a killed process"
fi
out=$("$SROCE_BIN" resource show qp 2>&1 || true)
if grep -q "pid $victim " <<<"$out"; then
	fail "a killed process's QPs are freed" "pid $victim still listed:"$'\n'"$out"
else
	pass "a killed process's QPs are freed"
fi
kill "$a_srv" 2>/dev/null || true
bg_wait "$a_cli"
bg_wait "$a_srv"

# --- the agent dies under running programs ------------------------------------
# agent_pid: the running agent's pid, or nothing.
agent_pid() {
	"$SROCE_BIN" -j agent status 2>/dev/null | sed -n 's/.*"pid":\([0-9]*\).*/\1/p'
}
# kill_agent: SIGKILL to the running agent; sets KILLED (its pid).
kill_agent() {
	KILLED=$(agent_pid)
	[[ -n $KILLED ]] || die "agent pid not found"
	kill -9 "$KILLED"
}

# Root's agent steers by a slot map, which outlives it: the programs keep
# their traffic, and each takes its slot back under the agent the first of
# them starts.
"$SROCE_BIN" -j agent status | grep -q '"steering":"slot map"' ||
	die "root's agent does not steer by a slot map: $("$SROCE_BIN" -j agent status)"
long_pair b 10
b_srv=$LP_SRV b_cli=$LP_CLI
# ibv_rc_pingpong -c compares every buffer it receives.  60000 exchanges
# outlast the kill on an idle machine; on a loaded 2-core one
# an exchange has taken 1 ms, hence the timeout.
next_port
pp_port=$PORT
RP_TIMEOUT=240 sroce_bg "$WORK/pp.server" ibv_rc_pingpong -d sroce0 -g 1 -n 60000 -c -p "$pp_port"
pp_srv=$BG_PID
wait_listen "$pp_port" "$pp_srv" || die "ibv_rc_pingpong's server did not listen"
RP_TIMEOUT=240 sroce_bg "$WORK/pp.client" ibv_rc_pingpong -d sroce1 -g 1 -n 60000 -c -p "$pp_port" \
	127.0.0.1
pp_cli=$BG_PID
# A write-commit stream whose log is checked record by record afterwards.
log_file=$(mktemp /var/tmp/sroce-agent-kill.XXXXXX)
trap 'rm -f "$log_file"; _sroce_cleanup' EXIT
RP_TIMEOUT=240 sroce_bg "$WORK/rl.server" "$BUILD_DIR/tests/compile/remote_log" --server -d sroce0 -g 1 -p 0 \
	--file "$log_file" --size 64M
rl_srv=$BG_PID
wait_for "$WORK/rl.server" 30 "listening on port" "$rl_srv" || die "remote_log did not start"
rl_port=$(sed -n 's/^remote_log: listening on port \([0-9]*\)$/\1/p' "$WORK/rl.server")
rl_n=30000
RP_TIMEOUT=240 sroce_bg "$WORK/rl.client" "$BUILD_DIR/tests/compile/remote_log" -d sroce1 -g 1 -p "$rl_port" \
	-n "$rl_n" --record-size 32 127.0.0.1
rl_cli=$BG_PID
sleep 1
kill_agent
old_agent=$KILLED
# survived NAME LOG...: the program exited 0 (BG_RC) and each LOG tells of
# the agent's death and of its slot taken back.
survived() {
	local name=$1 f
	shift
	if ((BG_RC != 0)); then
		fail "$name after the agent's SIGKILL" "exit $BG_RC:"$'\n'"$(cat "$@")"$'\n'"agents' log:"$'\n'"$(cat "$SROCE_AGENT_LOG")"
		return
	fi
	for f in "$@"; do
		if ! grep -q 'the sroce agent exited; the device.s QPs go on' "$f" ||
			! grep -q 'resumed under the new sroce agent' "$f"; then
			fail "$name: $f tells of no resumed slot" "$(cat "$f")"
			return
		fi
	done
	pass "$name survives SIGKILL of the agent"
}
bg_wait "$b_cli"
survived "ib_write_bw -D 10 ($(perftest_result "$WORK/b.client") MB/s)" "$WORK/b.client" "$WORK/b.server"
bg_wait "$b_srv"
((BG_RC == 0)) || fail "ib_write_bw's server after the agent's SIGKILL" "$(cat "$WORK/b.server")"
bg_wait "$pp_cli"
survived "ibv_rc_pingpong -c (60000 exchanges, buffers checked)" "$WORK/pp.client" "$WORK/pp.server"
bg_wait "$pp_srv"
((BG_RC == 0)) || fail "ibv_rc_pingpong's server after the agent's SIGKILL" "$(cat "$WORK/pp.server")"
bg_wait "$rl_cli"
survived "a write-commit stream (remote_log)" "$WORK/rl.client" "$WORK/rl.server"
bg_wait "$rl_srv"
if grep -q "^remote_log: $rl_n records committed" "$WORK/rl.client" &&
	"$BUILD_DIR/tests/compile/remote_log" --verify "$log_file" >"$WORK/rl.verify" 2>&1 &&
	grep -qx "log ok: $rl_n records" "$WORK/rl.verify"; then
	pass "the stream's $rl_n records are all durable and valid in the target's log"
else
	fail "the write-commit stream's log" "$(cat "$WORK/rl.client" "$WORK/rl.verify")"
fi
new_agent=$(agent_pid)
if [[ -n $new_agent && $new_agent != "$old_agent" ]]; then
	pass "a program started a new agent (pid $old_agent, then $new_agent)"
else
	fail "no new agent after pid $old_agent was killed: ${new_agent:-none}"
fi
# The new agent steers by the dead one's map, which still holds the
# programs' sockets: nothing sent to them while they took their slots back
# reached the agent as a packet of no one's.
unroutable=$("$SROCE_BIN" -j agent status | python3 -c '
import json, sys
print(sum(d["rx_unroutable"] for d in json.load(sys.stdin)["devices"]))')
kept=$(grep -c "taken over with its map from a dead agent" "$SROCE_AGENT_LOG" || true)
if ((kept == 2 && unroutable == 0)); then
	pass "the new agent kept the dead one's slot maps: no packet lost in the takeover"
else
	fail "the takeover: $kept of 2 maps kept, $unroutable packets unroutable" "$(cat "$SROCE_AGENT_LOG")"
fi
# new_pair WHAT: a new ib_write_bw pair runs, under the agent one of its
# processes starts if none runs.
new_pair() {
	if run_pair ib_write_bw -d sroce0 -x 1 -n 2000 -p @PORT@ -- \
		ib_write_bw -d sroce1 -x 1 -n 2000 -p @PORT@ 127.0.0.1; then
		pass "$1: $(perftest_result "$RP_CLIENT_LOG") MB/s"
	else
		fail "$1"
	fi
}
new_pair "new programs after the agent's restart"
next_port
perftest_cm write_bw_cm "$PORT" 'RDMA_CM_EVENT_REJECTED; error: 8' \
	"new rdma_cm connections after the agent's restart (ib_write_bw -R)" \
	ib_write_bw -R -d sroce0 -x 1 -n 2000 -p "$PORT" -- \
	ib_write_bw -R -d sroce1 -x 1 -n 2000 -p "$PORT" 127.0.18.1

# Under the classic program (an agent that cannot load a slot map: not
# root's) the group cannot outlive the agent: the programs lose the device
# with a message and end; the next programs start a new agent.
"$SROCE_BIN" agent stop
for _ in $(seq 100); do
	[[ -z $(agent_pid) ]] && break
	sleep 0.1
done
SROCE_AGENT_STEERING=classic "$SROCE_BIN" agent start
long_pair c 30
c_srv=$LP_SRV c_cli=$LP_CLI
"$SROCE_BIN" -j agent status | grep -q '"steering":"classic"' ||
	die "SROCE_AGENT_STEERING=classic: $("$SROCE_BIN" -j agent status)"
start=$(now)
kill_agent
bg_wait "$c_cli"
cli_rc=$BG_RC
bg_wait "$c_srv"
srv_rc=$BG_RC
secs=$(elapsed "$start")
if ((cli_rc != 0 && cli_rc != 124 && srv_rc != 0 && srv_rc != 124)) &&
	grep -q 'the sroce agent exited; the device is lost' "$WORK/c.client" && num_between "$secs" 0 20; then
	pass "classic steering: killing the agent ends both programs with an error in ${secs}s"
else
	fail "killing the agent (classic steering)" "client $cli_rc, server $srv_rc after ${secs}s:"$'\n'"$(cat "$WORK/c.client" "$WORK/c.server")"
fi
new_pair "the next programs restart the agent"

finish
