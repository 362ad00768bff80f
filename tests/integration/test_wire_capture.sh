#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Captures real sroce traffic on lo and checks it with two implementations
# independent of sroce: scapy recomputes the ICRC of every RoCEv2 packet
# (icrc_check.py), and Wireshark's InfiniBand dissector must parse every
# packet without a malformed-packet or error-level expert item.
#
# The traffic is perftest between two sroce links, 127.0.3.1 and 127.0.3.2,
# covering SEND, RDMA WRITE, RDMA READ requests and responses, ATOMIC and
# ATOMIC ACKNOWLEDGE, and ACKs.
#
# Usage: test_wire_capture.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) when tshark, scapy, perftest or a
# capture on lo is unavailable.
set -euo pipefail

build=${1:?usage: test_wire_capture.sh BUILD-DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sroce=$build/tools/sroce/sroce

skip() {
	echo "SKIP: $*" >&2
	exit 77
}

[[ -x $sroce ]] || {
	echo "FAIL: $sroce not built" >&2
	exit 1
}
command -v tshark >/dev/null || skip "tshark is not installed"
for t in ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat; do
	command -v "$t" >/dev/null || skip "perftest ($t) is not installed"
done
python=
for p in python3 /usr/bin/python3; do
	if command -v "$p" >/dev/null && "$p" -c 'import scapy.contrib.roce' 2>/dev/null; then
		python=$p
		break
	fi
done
[[ -n $python ]] || skip "no python3 with scapy (python3-scapy)"

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

export SROCE_CONFIG=$tmp/links.conf
unset SROCE_FAULT LD_PRELOAD
cat >"$SROCE_CONFIG" <<EOF
sroce_cap0 netdev lo addr 127.0.3.1
sroce_cap1 netdev lo addr 127.0.3.2
EOF

pcap=$tmp/roce.pcapng
# tshark writes the file as root-owned or as a dropped user depending on the
# setup; a world-writable directory keeps both working.
chmod 1777 "$tmp"
tshark -i lo -f 'udp port 4791' -w "$pcap" >"$tmp/tshark.out" 2>"$tmp/tshark.err" &
tshark_pid=$!
pids+=("$tshark_pid")
for _ in $(seq 100); do
	grep -q "Capturing on" "$tmp/tshark.err" 2>/dev/null && break
	kill -0 "$tshark_pid" 2>/dev/null || skip "tshark cannot capture on lo: $(cat "$tmp/tshark.err")"
	sleep 0.1
done
grep -q "Capturing on" "$tmp/tshark.err" || skip "tshark did not start capturing on lo"
# The filter is compiled and attached by now, but give libpcap a moment.
sleep 0.5

# Distinct perftest ports per pair, away from the default 18515 other tests use.
port=$((20000 + ($$ % 2000) * 8))

wait_listen() {
	for _ in $(seq 100); do
		ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
		sleep 0.05
	done
	return 1
}

failures=0
# pair NAME ARGS...: perftest server on sroce_cap0, client on sroce_cap1.
pair() {
	local tool=$1
	shift
	port=$((port + 1))
	timeout 60 "$sroce" exec -- "$tool" -d sroce_cap0 -x 1 -p "$port" "$@" \
		>"$tmp/$tool.server" 2>&1 &
	local server=$!
	pids+=("$server")
	if ! wait_listen "$port"; then
		echo "FAIL: $tool server did not listen on port $port" >&2
		cat "$tmp/$tool.server" >&2
		failures=$((failures + 1))
		return
	fi
	if ! timeout 60 "$sroce" exec -- "$tool" -d sroce_cap1 -x 1 -p "$port" "$@" 127.0.0.1 \
		>"$tmp/$tool.client" 2>&1; then
		echo "FAIL: $tool client failed:" >&2
		cat "$tmp/$tool.client" >&2
		failures=$((failures + 1))
	fi
	if ! wait "$server"; then
		echo "FAIL: $tool server failed:" >&2
		cat "$tmp/$tool.server" >&2
		failures=$((failures + 1))
	fi
}

pair ib_write_bw -s 65536 -n 200
pair ib_read_bw -n 200
pair ib_send_bw -n 200
pair ib_atomic_bw -n 200
pair ib_write_lat -n 100

# Let the last packets reach the capture before stopping it.
sleep 0.5
kill -INT "$tshark_pid"
wait "$tshark_pid" || true
[[ -s $pcap ]] || {
	echo "FAIL: empty capture; tshark said: $(cat "$tmp/tshark.err")" >&2
	exit 1
}

# (a) ICRC of every packet, recomputed by scapy; opcode coverage.
if ! "$python" "$here/icrc_check.py" "$pcap"; then
	failures=$((failures + 1))
fi

# (b) Wireshark's dissection: every frame is InfiniBand, none malformed,
# no error-level expert items.
total=$(tshark -r "$pcap" -T fields -e frame.number 2>/dev/null | wc -l)
ib=$(tshark -r "$pcap" -d udp.port==4791,infiniband -Y infiniband -T fields \
	-e frame.number 2>/dev/null | wc -l)
bad=$(tshark -r "$pcap" -d udp.port==4791,infiniband \
	-Y '_ws.malformed || _ws.expert.severity >= "Error"' \
	-T fields -e frame.number -e infiniband.bth.opcode -e _ws.expert.message 2>&1 || true)
echo "tshark: $total frames, $ib dissected as InfiniBand"
if [[ $total -eq 0 || $ib -ne $total ]]; then
	echo "FAIL: $((total - ib)) of $total frames not dissected as InfiniBand" >&2
	failures=$((failures + 1))
fi
if [[ -n $bad ]]; then
	echo "FAIL: tshark reports malformed packets or errors:" >&2
	echo "$bad" | head -20 >&2
	failures=$((failures + 1))
fi

if ((failures)); then
	echo "$failures failure(s)" >&2
	exit 1
fi
echo "PASS"
