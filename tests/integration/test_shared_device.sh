#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# One sroce device, many processes (docs/shared-device.md): servers and
# clients of Debian's unmodified programs on the same device address, four
# perftest pairs at once, `sroce resource show`, a process killed mid-run
# that disturbs nobody, and the agent killed under running programs (they
# fail with a clear message, never hang; the next program restarts it).
#
# Usage: test_shared_device.sh BUILD-DIR
# ctest: TIMEOUT=400 RESOURCE_LOCK=lo-127.0.18.1,lo-127.0.18.2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout ibv_rc_pingpong ibv_ud_pingpong ib_write_bw ib_send_bw
require_loopback
sroce_config sroce0 127.0.18.1 sroce1 127.0.18.2
private_agent

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
	local pids=() logs=() clock=0 i k p spid t out rcqps dupes bad
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
	# once the clients have connected.
	for ((t = 0; t < 100; t++)); do
		out=$("$SROCE_BIN" resource show qp 2>&1 || true)
		rcqps=$(grep -c ' type RC .*comm ib_write_bw' <<<"$out" || true)
		((rcqps >= 8)) && break
		sleep 0.1
	done
	# QPNs are unique per device (each has its own QP1).
	dupes=$(awk '{ for (i = 1; i < NF; i++) if ($i == "lqpn") print $2, $(i + 1) }' <<<"$out" | sort | uniq -d)
	if [[ -z $dupes ]] && ((rcqps >= 8)); then
		pass "sroce resource show qp: $rcqps RC QPs listed, every QPN unique"
	else
		fail "sroce resource show qp" "duplicate QPNs '$dupes' or no RC QP in:"$'\n'"$out"
	fi
	if grep -q 'comm ib_write_bw' <<<"$out"; then
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
	sleep 3
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
long_pair b 30
b_srv=$LP_SRV b_cli=$LP_CLI
agent_pid=$("$SROCE_BIN" -j agent status | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
[[ -n $agent_pid ]] || die "agent pid not found"
start=$(now)
kill -9 "$agent_pid"
bg_wait "$b_cli"
cli_rc=$BG_RC
bg_wait "$b_srv"
srv_rc=$BG_RC
secs=$(elapsed "$start")
if ((cli_rc != 0 && cli_rc != 124 && srv_rc != 0 && srv_rc != 124)) &&
	grep -q 'the sroce agent exited' "$WORK/b.client" && num_between "$secs" 0 20; then
	pass "killing the agent ends both programs with an error in ${secs}s"
else
	fail "killing the agent" "client $cli_rc, server $srv_rc after ${secs}s:"$'\n'"$(cat "$WORK/b.client" "$WORK/b.server")"
fi
if run_pair ib_write_bw -d sroce0 -x 1 -n 2000 -p @PORT@ -- \
	ib_write_bw -d sroce1 -x 1 -n 2000 -p @PORT@ 127.0.0.1; then
	pass "the next programs restart the agent: $(perftest_result "$RP_CLIENT_LOG") MB/s"
else
	fail "restart after the agent died"
fi

finish
