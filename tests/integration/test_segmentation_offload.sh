#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Segmentation offload (design.md §7.2) on both of its receive paths,
# every byte checked: sroce_xfer's seeded mix of RC operations (WRITE read
# back, SEND, WRITE WITH IMMEDIATE, atomics; messages up to 256 KiB at a
# 4096-byte MTU, so runs of up to 15 packets) between two links on lo, with
# each side's counters (SROCE_STATS) held to what the path must show:
#
#   coalesced  defaults: both sides send runs (tx_segmented) from a connected
#              socket (tx_connected) and receive them whole (rx_coalesced),
#              every packet verified with the ID its socket's counter gives
#              it (design.md §7.4), not solved for but at the first
#              datagram from each socket and where a loaded host reorders
#              more than the receiver's window: rx_ip_id_solved at most 20 %
#              of what a side receives (all of it when prediction fails;
#              2 alone on an idle host, 4.5 % seen under load).
#   device     the same from the device socket (SROCE_CONNECTED=0): each
#              packet verified with its place in the buffer as its IP ID
#              (rx_ip_id_solved 0).
#   cut up     the server without UDP_GRO (SROCE_GRO=0): the kernel cuts the
#              client's runs into datagrams with IDs n, n+1, ..., a new send
#              starting one above the last one's first, which the server
#              verifies by solving for the ID (rx_ip_id_solved > 2).
#   single     neither side sends runs (SROCE_GSO=0): tx_segmented 0, and
#              every datagram's ID the next of its socket's counter, or a
#              few behind it (the same 20 %).
#   lossy      both sides drop 1 % of what they receive (SROCE_FAULT), inside
#              runs too: the lost packets are resent (selectively: sroce_xfer
#              agrees on it in ECE), bytes still checked.
#
# No corrupted packet anywhere (rx_bad_icrc 0).  The capture of runs cut up
# on a wire is test_wire_capture.sh's.
#
# Usage: test_segmentation_offload.sh BUILD-DIR
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.25.1,lo-127.0.25.2
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout
require_loopback
xfer=$BUILD_DIR/tests/progs/sroce_xfer
[[ -x $xfer ]] || die "$xfer not built"
sroce_config sroce_gso0 127.0.25.1 sroce_gso1 127.0.25.2
private_agent
export RP_TIMEOUT=120

# xfer NAME SERVER-ENV CLIENT-ENV EXPR...: one verified run, then its checks.
xfer() {
	local name=$1 senv=$2 cenv=$3
	shift 3
	# shellcheck disable=SC2086 # the environments are lists of assignments
	if run_pair env SROCE_STATS=1 $senv "$xfer" -d sroce_gso0 -p @PORT@ -- \
		env SROCE_STATS=1 $cenv "$xfer" -d sroce_gso1 -p @PORT@ -n 600 --seed 11 \
		--max-size 262144 127.0.25.1; then
		check_counters "$name" "sroce_gso[01]" "$RP_SERVER_LOG" "$RP_CLIENT_LOG" "$@" \
			"server rx_bad_icrc == 0" "client rx_bad_icrc == 0"
	else
		fail "$name: sroce_xfer (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
	fi
}

xfer "coalesced" "" "" \
	"client tx_segmented > 0" "server tx_segmented > 0" \
	"client tx_connected > 0" "server tx_connected > 0" \
	"server rx_coalesced > 0" "client rx_coalesced > 0" \
	"server rx_ip_id_solved <=% 20" "client rx_ip_id_solved <=% 20"
xfer "device socket (SROCE_CONNECTED=0)" "SROCE_CONNECTED=0" "SROCE_CONNECTED=0" \
	"client tx_segmented > 0" "client tx_connected == 0" "server tx_connected == 0" \
	"server rx_coalesced > 0" "client rx_coalesced > 0" \
	"server rx_ip_id_solved == 0" "client rx_ip_id_solved == 0"
xfer "cut up (server SROCE_GRO=0)" "SROCE_GRO=0" "" \
	"client tx_segmented > 0" "server rx_coalesced == 0" "server rx_ip_id_solved > 2"
xfer "single datagrams (SROCE_GSO=0)" "SROCE_GSO=0" "SROCE_GSO=0" \
	"client tx_segmented == 0" "server tx_segmented == 0" \
	"server rx_coalesced == 0" "server rx_ip_id_solved <=% 20"
xfer "1 % loss inside runs" "SROCE_FAULT=drop=0.01,seed=3" "SROCE_FAULT=drop=0.01,seed=4" \
	"client tx_segmented > 0" "server rx_coalesced > 0" "server rx_dropped_fault > 0" \
	"client tx_resent_selective > 0"
finish
