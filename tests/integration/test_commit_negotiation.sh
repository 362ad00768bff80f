#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Native commits agreed by rdma_cm, shown on the wire.  Two sroce links on
# lo (127.0.20.1, 127.0.20.2); each connection is captured on its own and
# checked by ece_check.py:
#
#   1. docs/examples/cm_commit: the client's REQ offers sroce's ECE, the
#      server's REP agrees, and the write-commits travel as native opcodes
#      (0xC0-0xC5) though neither program calls ibv_qp_set_commit_peer.
#   2. cm_commit --no-ece: a server whose QP librdmacm does not manage
#      answers options 0 and, with SROCE_ANNOUNCE=0, announces nothing in
#      its packets either, as a kernel rxe or an RNIC does: the same commits
#      travel as IBTA WRITE + FLUSH.  Without SROCE_ANNOUNCE=0 its packets
#      say it is sroce (wire-protocol.md §3.3.1), and the commits are
#      native although ECE agreed on nothing.
#   3. ib_write_commit_lat -R (native method): the same agreement for the
#      benchmark's rdma_cm mode.
# Every program checks its data (cm_commit reads back and compares on both
# sides) and must exit 0.
#
# It runs in a network namespace of its own whose lo segments in software:
# a capture on an offloading lo shows each segmentation-offload send whole
# (a FLUSH travels behind its WRITE in one), not the packets a wire carries.
#
# Usage: test_commit_negotiation.sh BUILD-DIR
# Skips (77) without tshark or python3-scapy, or without capture on lo.
#
# ctest: TIMEOUT=240 RESOURCE_LOCK=lo-127.0.20.1,lo-127.0.20.2
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
in_segmenting_netns "$0" "$@"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds tshark ss
require_loopback
python=$(scapy_python)
[[ -n $python ]] || skip "no python3 with scapy (python3-scapy)"
cm_commit=$BUILD_DIR/tests/compile/cm_commit
lat=$BUILD_DIR/tools/perf/ib_write_commit_lat
[[ -x $cm_commit && -x $lat ]] || die "cm_commit or ib_write_commit_lat is not built in $BUILD_DIR"

A=127.0.20.1
B=127.0.20.2
sroce_config sroce_neg0 $A sroce_neg1 $B
private_agent
chmod 1777 "$WORK"

# connection NAME EXPECT CM-PORT SERVER... -- CLIENT...: one captured
# connection whose programs must succeed and whose wire must show EXPECT.
connection() {
	local name=$1 expect=$2 port=$3
	shift 3
	pcap=$WORK/$name.pcapng
	# This test's two links alone: other tests may send malformed packets
	# on lo meanwhile.
	capture_lo "$pcap" "udp port 4791 and host $A and host $B"
	if ! cm_pair "$name" "$port" "$@"; then
		capture_stop
		fail "$name: the programs failed"
		return
	fi
	capture_stop
	if "$python" "$here/ece_check.py" "$pcap" "$expect"; then
		pass "$name: $expect commits on the wire, REQ/REP as expected"
	else
		fail "$name: the wire does not show $expect commits, or REQ/REP not as expected"
	fi
}

connection cm_commit native 7720 \
	"$cm_commit" -s -b $A -p 7720 -- \
	"$cm_commit" -c $A -b $B -p 7720 -n 64 --expect native
connection cm_commit_no_ece ibta 7721 \
	env SROCE_ANNOUNCE=0 "$cm_commit" -s -b $A -p 7721 --no-ece -- \
	"$cm_commit" -c $A -b $B -p 7721 -n 64 --expect ibta
connection cm_commit_no_ece_announced announced 7722 \
	"$cm_commit" -s -b $A -p 7722 --no-ece -- \
	"$cm_commit" -c $A -b $B -p 7722 -n 64
connection write_commit_lat_R native 18731 \
	"$lat" -R -d sroce_neg0 -p 18731 -n 200 -- \
	"$lat" -R -d sroce_neg1 -p 18731 -n 200 $A
if grep -q "Commit opcodes  : native (agreed in the connection set-up)" \
	"$WORK/write_commit_lat_R.client"; then
	pass "ib_write_commit_lat -R reports native commits agreed in the connection set-up"
else
	fail "ib_write_commit_lat -R does not report the agreement" "$(cat "$WORK/write_commit_lat_R.client")"
fi
finish
