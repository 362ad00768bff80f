#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Captures real sroce traffic on lo and checks it with two implementations
# independent of sroce: scapy recomputes the ICRC of every RoCEv2 packet
# (icrc_check.py, which also requires DF, IP IDs that number the packets of
# each segmentation-offload send, some such sends, and a minimum opcode
# coverage), and Wireshark's InfiniBand dissector must parse every packet
# without a malformed-packet or error-level expert item in its headers.
#
# It runs in a network namespace of its own whose lo segments in software,
# as a device without UDP segmentation offload does: the capture then holds
# the datagrams a wire would carry (an offloading lo shows each send whole),
# and sroce's receivers get them one by one, so they verify by solving for
# the IP ID (design.md §7.4).
#
# The traffic is perftest between two sroce links, 127.0.3.1 and 127.0.3.2:
# SEND, RDMA WRITE, RDMA READ requests and responses, ATOMIC and ATOMIC
# ACKNOWLEDGE, and ACKs; then rdma_cm programs, whose connection manager
# MADs on QP1 (REQ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, REJ) must all
# be in the capture and decode as such.
#
# Usage: test_wire_capture.sh BUILD-DIR
# Skips (77) when tshark, scapy, perftest or a capture on lo is unavailable.
# SROCE_KEEP_CAPTURE=FILE keeps a copy of the capture.
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.3.1,lo-127.0.3.2
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
in_segmenting_netns "$0" "$@"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds tshark ss ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat rping udaddy
require_loopback
python=$(scapy_python)
[[ -n $python ]] || skip "no python3 with scapy (python3-scapy)"

sroce_config sroce_cap0 127.0.3.1 sroce_cap1 127.0.3.2
private_agent

pcap=$WORK/roce.pcapng
# dumpcap may write as a dropped user.
chmod 1777 "$WORK"
# Only the two links of this test: other tests may be sending deliberately
# malformed RoCEv2 packets on lo at the same time.
filter='udp port 4791 and ((src host 127.0.3.1 and dst host 127.0.3.2) or'
filter+=' (src host 127.0.3.2 and dst host 127.0.3.1))'
# A 64 MiB capture buffer (capture_lo), so bursts of READ responses are not
# dropped.
capture_lo "$pcap" "$filter"

# perf NAME ARGS...: server on sroce_cap0, client on sroce_cap1.
perf() {
	local tool=$1
	shift
	if run_pair "$tool" -d sroce_cap0 -x 1 -p @PORT@ "$@" -- \
		"$tool" -d sroce_cap1 -x 1 -p @PORT@ "$@" 127.0.0.1; then
		pass "$tool $*"
	else
		fail "$tool $*"
	fi
}
perf ib_write_bw -s 65536 -n 200
perf ib_read_bw -n 200
perf ib_send_bw -n 200
perf ib_atomic_bw -n 200
perf ib_write_lat -n 100
# rdma_cm: a connection and its teardown, a UD id's SIDR, a REJ.
S=127.0.3.1
if cm_pair rping 7471 rping -s -a $S -p 7471 -C 3 -v -- rping -c -a $S -I 127.0.3.2 -p 7471 -C 3 -v; then
	pass "rping (REQ, REP, RTU, DREQ, DREP)"
else
	fail "rping"
fi
if cm_pair udaddy 7174 udaddy -b $S -C 3 -- udaddy -s $S -b 127.0.3.2 -C 3; then
	pass "udaddy (SIDR_REQ, SIDR_REP)"
else
	fail "udaddy"
fi
out=$(timeout -k 5 30 "$SROCE_BIN" exec -- rping -c -a $S -I 127.0.3.2 -p 7499 -C 1 2>&1 || true)
if grep -q 'RDMA_CM_EVENT_REJECTED, error 8' <<<"$out"; then
	pass "a connect nobody listens for (REJ)"
else
	fail "a connect nobody listens for" "$out"
fi

capture_stop
[[ -z ${SROCE_KEEP_CAPTURE:-} ]] || cp "$pcap" "$SROCE_KEEP_CAPTURE"
[[ -s $pcap ]] || die "empty capture; tshark said: $(cat "$pcap.log")"

# (a) ICRC of every packet, recomputed by scapy; IP ID and DF; opcode coverage.
if "$python" "$here/icrc_check.py" --require-segmented "$pcap"; then
	pass "ICRC, IP ID and opcode coverage (scapy)"
else
	fail "ICRC, IP ID and opcode coverage (scapy)"
fi

# (b) Wireshark: every CM message sroce sends is there, as what it is.
cm_seen=$(tshark -r "$pcap" -d udp.port==4791,infiniband -Y 'infiniband.mad' \
	-T fields -e _ws.col.Info 2>/dev/null | sed -n 's/.*CM: //p' | sort -u)
missing=
for m in ConnectRequest ConnectReply ReadyToUse DisconnectRequest DisconnectReply \
	ServiceIDResReq ServiceIDResReqResp ConnectReject; do
	grep -qx "$m" <<<"$cm_seen" || missing+=" $m"
done
if [[ -z $missing ]]; then
	pass "CM messages decoded: $(tr "\n" " " <<<"$cm_seen")"
else
	fail "CM messages missing from the capture:$missing (seen: $(tr "\n" " " <<<"$cm_seen"))"
fi

# (c) Wireshark: every frame is InfiniBand, none malformed and none with an
# error-level expert item in its headers.  The IB dissector guesses at
# payloads (an EtherType in the first payload bytes), so a failure inside
# such a guessed sub-protocol says nothing about the packet and only counts
# as a note.
total=$(tshark -r "$pcap" -T fields -e frame.number 2>/dev/null | wc -l)
ib=$(tshark -r "$pcap" -d udp.port==4791,infiniband -Y infiniband -T fields \
	-e frame.number 2>/dev/null | wc -l)
echo "tshark: $total frames, $ib dissected as InfiniBand"
if ((total > 0 && ib == total)); then
	pass "every frame dissected as InfiniBand"
else
	fail "$((total - ib)) of $total frames not dissected as InfiniBand"
fi
if tshark -r "$pcap" -d udp.port==4791,infiniband \
	-Y '_ws.malformed || _ws.expert.severity >= "Error"' \
	-T fields -e frame.number -e frame.protocols -e infiniband.bth.opcode \
	-e _ws.expert.message >"$WORK/bad" 2>"$WORK/bad.err"; then
	in_headers=$(awk -F'\t' '$2 !~ /:infiniband:/' "$WORK/bad")
	in_payload=$(awk -F'\t' '$2 ~ /:infiniband:/' "$WORK/bad" | wc -l)
	((in_payload == 0)) ||
		echo "note: $in_payload frame(s) whose payload a guessed sub-dissector rejected"
	if [[ -z $in_headers ]]; then
		pass "no malformed headers or expert errors (Wireshark)"
	else
		echo "$in_headers" | head -20
		fail "malformed headers or expert errors (Wireshark)"
	fi
else
	cat "$WORK/bad.err"
	fail "tshark -r"
fi
finish
