#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Selective repeat between sroce peers (wire-protocol.md §5.6.1), every byte
# checked: sroce_xfer's seeded mix of RC operations (WRITE read back with
# READ, SEND, WRITE WITH IMMEDIATE, atomics; up to 256 KiB) between two links
# on lo, both sides dropping what they receive (SROCE_FAULT), with each
# side's counters (SROCE_STATS) held to what the recovery must show:
#
#   agreed      sroce_xfer exchanges ECE over its side channel: the server
#               holds requests past each gap (rx_held), the client resends
#               only what is missing (tx_resent_selective).
#   one side    the server does not offer it (SROCE_SELECTIVE_REPEAT=0):
#               nothing is agreed, so IBTA go-back-N recovers — nothing held,
#               nothing resent selectively, the client rewinds (retransmits).
#   30 % loss   agreed, with 30 % of every side's datagrams dropped: the run
#               finishes, slowly, with every byte right.
#   announced   Debian's ib_write_bw without rdma_cm (QP numbers over its
#               own TCP exchange, no ECE) at 1 % loss: each end announces
#               itself in its packets (wire-protocol.md §3.3.1), so the
#               server holds and the client resends selectively all the same.
#               With SROCE_ANNOUNCE=0 on the server, nothing is agreed: the
#               client rewinds as go-back-N does.
#   rdma_cm     Debian's ib_write_bw -R at 1 % loss finishes: librdmacm
#               carries the ECE offer in REQ and REP (that the options include
#               selective repeat is ece_check.py's, in test_commit_negotiation),
#               so perftest gets it unmodified.  perftest's own race for its
#               second connection is retried, as in test_rdma_cm.sh.
#
# Usage: test_selective_repeat.sh BUILD-DIR
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.26.1,lo-127.0.26.2
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout ib_write_bw
require_loopback
xfer=$BUILD_DIR/tests/progs/sroce_xfer
[[ -x $xfer ]] || die "$xfer not built"
sroce_config sroce_sr0 127.0.26.1 sroce_sr1 127.0.26.2
private_agent
export RP_TIMEOUT=120

# xfer NAME SERVER-ENV CLIENT-ENV XFER-ARGS EXPR...: one verified run, then
# its checks.
xfer() {
	local name=$1 senv=$2 cenv=$3 args=$4
	shift 4
	# shellcheck disable=SC2086 # the environments and arguments are lists
	if run_pair env SROCE_STATS=1 $senv "$xfer" -d sroce_sr0 -p @PORT@ -- \
		env SROCE_STATS=1 $cenv "$xfer" -d sroce_sr1 -p @PORT@ $args 127.0.26.1; then
		check_counters "$name" "sroce_sr[01]" "$RP_SERVER_LOG" "$RP_CLIENT_LOG" "$@" \
			"server rx_bad_icrc == 0" "client rx_bad_icrc == 0"
	else
		fail "$name: sroce_xfer (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
	fi
}

mix="-n 600 --seed 17 --max-size 262144"
xfer "agreed, 1 % loss" "SROCE_FAULT=drop=0.01,seed=3" "SROCE_FAULT=drop=0.01,seed=4" "$mix" \
	"server rx_dropped_fault > 0" "server rx_held > 0" "client tx_resent_selective > 0"
xfer "one side without it, 1 % loss" "SROCE_SELECTIVE_REPEAT=0 SROCE_FAULT=drop=0.01,seed=3" \
	"SROCE_FAULT=drop=0.01,seed=4" "$mix" \
	"server rx_held == 0" "client rx_held == 0" "client tx_resent_selective == 0" \
	"server tx_resent_selective == 0" "client retransmits > 0"
# READs too: their lost responses are asked for again alone.
xfer "agreed, 30 % loss" "SROCE_FAULT=drop=0.3,seed=5" "SROCE_FAULT=drop=0.3,seed=6" \
	"-n 200 --seed 23 --max-size 65536" \
	"server rx_held > 0" "client tx_resent_selective > 0"

# perftest NAME SERVER-ENV EXPR...: ib_write_bw without rdma_cm, 1 % loss.
perftest() {
	local name=$1 senv=$2
	shift 2
	# shellcheck disable=SC2086 # the environment is a list
	if run_pair env SROCE_STATS=1 SROCE_FAULT=drop=0.01,seed=9 $senv \
		ib_write_bw -d sroce_sr0 -x 1 -s 65536 -n 1000 -p @PORT@ -- \
		env SROCE_STATS=1 SROCE_FAULT=drop=0.01,seed=10 \
		ib_write_bw -d sroce_sr1 -x 1 -s 65536 -n 1000 -p @PORT@ 127.0.0.1; then
		check_counters "$name" "sroce_sr[01]" "$RP_SERVER_LOG" "$RP_CLIENT_LOG" "$@" \
			"server rx_bad_icrc == 0" "client rx_bad_icrc == 0" "server rx_dropped_fault > 0"
	else
		fail "$name: ib_write_bw (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
	fi
}
perftest "ib_write_bw, announced, 1 % loss" "" \
	"server rx_held > 0" "client tx_resent_selective > 0"
perftest "ib_write_bw, server announcing nothing, 1 % loss" "SROCE_ANNOUNCE=0" \
	"server rx_held == 0" "client tx_resent_selective == 0" "client retransmits > 0"

LOSSY_CLOSE=1 perftest_cm perftest_r 7491 'RDMA_CM_EVENT_REJECTED; error: 8' "ib_write_bw -R, 1 % loss" \
	env SROCE_FAULT=drop=0.01,seed=7 ib_write_bw -d sroce_sr0 -x 1 -R -s 65536 -n 2000 -p 7491 -- \
	env SROCE_FAULT=drop=0.01,seed=8 ib_write_bw -d sroce_sr1 -x 1 -R -s 65536 -n 2000 -p 7491 \
	127.0.26.1
finish
