#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A short, visible demonstration: builds sroce, creates two soft-RoCE devices
# on the loopback interface (sroce0 = 127.0.0.1, sroce1 = 127.0.0.2) in a
# private configuration file, and runs Debian's unmodified RDMA programs over
# them: ibv_devices, ibv_rc_pingpong, ib_write_bw and ib_write_lat.
# Needs no configuration; leaves nothing behind but the build tree.
#
# Usage: scripts/demo.sh [--no-setup]
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} != --no-setup ]]; then
	echo "==== installing missing Debian packages (scripts/setup.sh)"
	bash scripts/setup.sh
fi

echo "==== building (cmake --preset default && cmake --build build)"
cmake --preset default >/dev/null
cmake --build build | tail -n 1

. tests/integration/lib.sh
sroce_init build
require_loopback
sroce_config sroce0 127.0.0.1 sroce1 127.0.0.2

# step TITLE: prints a heading.
step() { printf '\n==== %s\n' "$*"; }

# show_pair SERVER-CMD... -- CLIENT-CMD...: runs the pair and prints both
# sides' output, as a user with two terminals would see it.
show_pair() {
	local ok=0
	run_pair "$@" || ok=$?
	echo "---- server (sroce0)"
	cat "$RP_SERVER_LOG"
	echo "---- client (sroce1)"
	cat "$RP_CLIENT_LOG"
	if ((ok)); then
		echo "demo step failed" >&2
		exit 1
	fi
}

step "the devices: sroce link show (config $SROCE_CONFIG)"
"$SROCE_BIN" link show

step "ibv_devices"
"$SROCE_BIN" exec -- ibv_devices

step "ibv_devinfo -d sroce0"
"$SROCE_BIN" exec -- ibv_devinfo -d sroce0

step "ibv_rc_pingpong -g 1: server on sroce0, client on sroce1"
show_pair ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@ -- \
	ibv_rc_pingpong -d sroce1 -g 1 -p @PORT@ 127.0.0.1

step "ib_write_bw -s 65536 -n 5000 -x 1 (RDMA WRITE bandwidth, 64 KiB messages)"
show_pair ib_write_bw -d sroce0 -s 65536 -n 5000 -x 1 -p @PORT@ -- \
	ib_write_bw -d sroce1 -s 65536 -n 5000 -x 1 -p @PORT@ 127.0.0.1

step "ib_write_lat -s 2 -x 1 (RDMA WRITE latency, 2-byte messages)"
show_pair ib_write_lat -d sroce0 -s 2 -x 1 -p @PORT@ -- \
	ib_write_lat -d sroce1 -s 2 -x 1 -p @PORT@ 127.0.0.1

step "ib_write_commit_lat -R -n 1000 (a write made durable at the target by one verb; rdma_cm connects the QPs, which agree on the native commit opcodes)"
lat=$BUILD_DIR/tools/perf/ib_write_commit_lat
show_pair "$lat" -R -d sroce0 -n 1000 -p @PORT@ -- \
	"$lat" -R -d sroce1 -n 1000 -p @PORT@ 127.0.0.1

step "done"
echo "Run any RDMA program over sroce the same way:"
echo "  build/tools/sroce/sroce link add sroce0 netdev lo addr 127.0.0.1"
echo "  build/tools/sroce/sroce exec -- ib_write_bw -d sroce0 -x 1"
