#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Every transport besides RC, through Debian's unmodified programs, server
# and client as two processes over two sroce devices on lo (sroce0 =
# 127.0.15.1 serves, sroce1 = 127.0.15.2 connects): ibverbs-utils'
# ibv_ud_pingpong, ibv_uc_pingpong, ibv_srq_pingpong and ibv_xsrq_pingpong
# (with their content checks where they have one), and perftest over UD, UC,
# XRC and shared receive queues.  Each must exit 0 on both sides and report a
# plausible figure.
#
# Usage: test_transports.sh BUILD-DIR
# ctest: TIMEOUT=400 RESOURCE_LOCK=lo-127.0.15.1,lo-127.0.15.2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout ibv_ud_pingpong ibv_uc_pingpong ibv_srq_pingpong ibv_xsrq_pingpong \
	ib_send_bw ib_send_lat ib_write_bw ib_write_lat ib_read_lat ib_atomic_bw
require_loopback
sroce_config sroce0 127.0.15.1 sroce1 127.0.15.2

# pingpong NAME OPTIONS: a pair of ibverbs-utils pingpong programs.
pingpong() {
	local prog=$1 opts=$2 name mbit usec
	name="$prog $opts"
	# shellcheck disable=SC2086 # opts is a list of options
	if ! run_pair "$prog" -d sroce0 -p @PORT@ $opts -- "$prog" -d sroce1 -p @PORT@ $opts 127.0.15.1; then
		fail "$name" "exit status (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
		return
	fi
	read -r mbit usec <<<"$(pingpong_result "$RP_CLIENT_LOG")" || true
	if [[ -n ${usec:-} ]] && num_between "$usec" 0 100000; then
		pass "$name ($mbit Mbit/s, $usec usec/iter)"
	elif [[ $prog == ibv_xsrq_pingpong ]] && grep -q '^success' "$RP_CLIENT_LOG" &&
		grep -q '^success' "$RP_SERVER_LOG"; then
		# It reports only success or failure.
		pass "$name (success on both sides)"
	else
		fail "$name" "no result in:"$'\n'"$(cat "$RP_CLIENT_LOG")"
	fi
}

pingpong ibv_ud_pingpong "-g 1"
pingpong ibv_ud_pingpong "-g 1 -c -s 1024"
pingpong ibv_ud_pingpong "-g 1 -e"
pingpong ibv_uc_pingpong "-g 1 -c"
pingpong ibv_uc_pingpong "-g 1 -c -s 100000 -m 1024 -n 200"
pingpong ibv_uc_pingpong "-g 1 -e"
pingpong ibv_srq_pingpong "-g 1 -c"
pingpong ibv_srq_pingpong "-g 1 -q 4 -e -c"
pingpong ibv_xsrq_pingpong "-g 1"
pingpong ibv_xsrq_pingpong "-g 1 -e -s 10000"

# perftest TOOL OPTIONS: one perftest pair; checks the main figure.
perftest() {
	local tool=$1 opts=$2 name fig
	name="$tool $opts"
	# shellcheck disable=SC2086 # opts is a list of options
	if ! run_pair "$tool" -d sroce0 -x 1 -p @PORT@ $opts -- "$tool" -d sroce1 -x 1 -p @PORT@ $opts 127.0.15.1; then
		fail "$name" "exit status (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
		return
	fi
	fig=$(perftest_result "$RP_CLIENT_LOG")
	if num_between "$fig" 0 1e12; then
		pass "$name: $fig"
	else
		fail "$name" "no result in:"$'\n'"$(cat "$RP_CLIENT_LOG")"
	fi
}

perftest ib_send_bw "-c UD -n 2000"
perftest ib_send_bw "-c UD -q 2 -n 2000 -s 1024"
perftest ib_send_lat "-c UD -n 1000"
# UC has no retransmission, and perftest's server waits for every message: a
# receiver descheduled while the sender runs ahead loses what overflows its
# socket's 16 MiB.  200 x 64 KiB fit in it whatever the scheduler does.
perftest ib_send_bw "-c UC -s 65536 -n 200"
perftest ib_send_lat "-c UC -n 1000"
perftest ib_write_bw "-c UC -s 65536 -n 1000"
perftest ib_write_lat "-c UC -n 1000"
perftest ib_send_bw "--use-srq -s 65536 -n 1000"
perftest ib_send_bw "--use-srq -q 4 -s 4096 -n 2000"
perftest ib_send_lat "--use-srq -n 1000"
perftest ib_send_bw "-c XRC -s 65536 -n 1000"
perftest ib_send_bw "-c XRC -q 4 -s 4096 -n 2000"
perftest ib_write_bw "-c XRC -s 65536 -n 1000"
perftest ib_read_lat "-c XRC -n 1000"
perftest ib_atomic_bw "-c XRC -n 1000"
finish
