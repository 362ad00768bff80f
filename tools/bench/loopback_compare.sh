#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Runs perftest over two sroce devices on lo and raw UDP over loopback in the
# same session, ROUNDS times alternately, and prints the medians side by side:
#   ib_write_bw -s 65536   vs  socket_loopback -P udp -m bw -s 4096 (one sroce packet per datagram)
#   ib_write_lat -s 2      vs  socket_loopback -P udp -m lat -s 36  (the size of a 2-byte WRITE ONLY)
# ib_write_lat reports half the round trip; socket_loopback the whole one,
# which is halved here.
#
# Usage: tools/bench/loopback_compare.sh BUILD-DIR [ROUNDS]
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD-DIR [ROUNDS]}" && pwd)
rounds=${2:-5}
sroce=$build/tools/sroce/sroce
sock=$build/tools/bench/socket_loopback
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SROCE_CONFIG=$work/links.conf
"$sroce" link add sroce0 netdev lo addr 127.0.0.1 >/dev/null
"$sroce" link add sroce1 netdev lo addr 127.0.0.2 >/dev/null

port=18600
# pair TOOL ARGS...: server on sroce0, client on sroce1; prints the client's result row.
pair() {
	local tool=$1
	shift
	port=$((port + 1))
	"$sroce" exec -- "$tool" -d sroce0 -x 1 -p "$port" "$@" >"$work/server.log" 2>&1 &
	local spid=$!
	for _ in $(seq 100); do
		ss -ltn "sport = :$port" | grep -q LISTEN && break
		sleep 0.1
	done
	timeout 120 "$sroce" exec -- "$tool" -d sroce1 -x 1 -p "$port" "$@" 127.0.0.1 >"$work/client.log" 2>&1
	wait "$spid"
	awk '/^ *#bytes/ { getline; print; exit }' "$work/client.log"
}

# col NAME: prints column NAME (a header word such as t_avg or BW average) of
# the row under the '#bytes' header of a perftest-style report on stdin.
col() {
	awk -v want="$1" '
		/#bytes/ {
			line = $0
			gsub(/BW peak/, "BW_peak", line)
			gsub(/BW average/, "BW_average", line)
			gsub(/ /, "_", want)
			n = split(line, h, " ")
			for (i = 1; i <= n; i++)
				if (index(h[i], want) == 1) c = i
			next
		}
		c && $1 ~ /^[0-9]+$/ { print $c; exit }
	'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for f in bw lat ubw ulat; do : >"$work/$f"; done
for ((r = 1; r <= rounds; r++)); do
	# BW average (MB/s) is the 4th column of ib_write_bw; t_avg the 6th of ib_write_lat.
	pair ib_write_bw -s 65536 -n 5000 | awk '{ print $4 }' >>"$work/bw"
	"$sock" -P udp -m bw -s 4096 -n 300000 | col "BW average" >>"$work/ubw"
	pair ib_write_lat -s 2 -n 5000 | awk '{ print $6 }' >>"$work/lat"
	"$sock" -P udp -m lat -s 36 -n 20000 | col t_avg | awk '{ print $1 / 2 }' >>"$work/ulat"
done

bw=$(median <"$work/bw") ubw=$(median <"$work/ubw") lat=$(median <"$work/lat") ulat=$(median <"$work/ulat")
printf '%-44s %12s %12s %8s\n' "measurement (median of $rounds)" sroce "raw UDP" ratio
printf '%-44s %12.1f %12.1f %8.2f\n' "64 KiB ib_write_bw vs 4 KiB datagrams, MB/s" "$bw" "$ubw" \
	"$(awk -v a="$bw" -v b="$ubw" 'BEGIN { print a / b }')"
printf '%-44s %12.2f %12.2f %8.2f\n' "2 B ib_write_lat vs 36 B ping-pong/2, t_avg us" "$lat" "$ulat" \
	"$(awk -v a="$lat" -v b="$ulat" 'BEGIN { print a / b }')"
