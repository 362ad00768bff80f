#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Run inside a Debian root by test_trixie.sh: installs the build
# dependencies with scripts/setup.sh, builds SRC with the default preset and
# runs the unit tests, check_shim_symbols, perftest and ibverbs-utils over two
# sroce devices (ADDR1, ADDR2) and rdma-core's pyverbs suite over a third
# (ADDR3).  Logs go to SRC/build/in-root-*.log; on failure their tails are
# printed.  Exit status: 0 when every step passed.
#
# Usage: in_root.sh SRC ADDR1 ADDR2 ADDR3 [STEP...]
#   steps: setup build unit symbols clients fabric ipv6 suite (default: all,
#   in order)
set -uo pipefail

src=${1:?usage: $0 SRC ADDR1 ADDR2 ADDR3 [STEP...]}
a1=${2:?} a2=${3:?} a3=${4:?}
shift 4
steps=("$@")
((${#steps[@]} > 0)) || steps=(setup build unit symbols clients fabric ipv6 suite)
cd "$src" || exit 1
export DEBIAN_FRONTEND=noninteractive
# The root's own agent: it shares the host's network namespace, where the
# host's build tree may run one too.
export SROCE_AGENT_SOCKET=sroce-root-test-$$
build=$src/build
mkdir -p "$build"

passed=0 failed=0
t0=$SECONDS
say() { echo "[in root +$((SECONDS - t0))s] $*"; }
# step NAME CMD...: runs CMD with its output in build/in-root-NAME.log.
step() {
	local name=$1 log=$build/in-root-$1.log start=$SECONDS
	shift
	if "$@" >"$log" 2>&1; then
		passed=$((passed + 1))
		say "ok   $name ($((SECONDS - start)) s)"
	else
		failed=$((failed + 1))
		say "FAIL $name ($((SECONDS - start)) s), last lines of $log:"
		tail -n 40 "$log" | sed 's/^/    /'
		return 1
	fi
}
want() { [[ " ${steps[*]} " == *" $1 "* ]]; }

say "$(. /etc/os-release && echo "$PRETTY_NAME")"

if want setup; then
	step setup bash scripts/setup.sh build clients || exit 1
	say "$(dpkg-query -W -f='${Package} ${Version}\n' libibverbs1 perftest python3-pyverbs clang g++ cmake | tr '\n' ';')"
fi

if want build; then
	build_all() {
		cmake --preset default && cmake --build build -j2
	}
	step build build_all || exit 1
fi

if want unit; then
	# One line per test in the log; the summary line is what is shown.
	unit() {
		ctest --test-dir build -L unit -j2 --timeout 300 --output-on-failure
	}
	step unit unit
	grep -E 'tests passed|tests failed' "$build/in-root-unit.log" | sed 's/^/    /'
fi

if want symbols; then
	step symbols bash tests/integration/check_shim_symbols.sh build/libibverbs-ext/shim/libsroce.so
	sed 's/^/    /' "$build/in-root-symbols.log"
fi

if want clients; then
	# Debian's own programs over two devices, through lib.sh's run_pair.
	clients() (
		set -e
		. tests/integration/lib.sh
		sroce_init build
		require_cmds ib_write_bw ib_send_bw ibv_rc_pingpong ss
		sroce_config tx0 "$a1" tx1 "$a2"
		run_pair ib_write_bw -d tx0 -x 1 -s 65536 -n 2000 -p @PORT@ -- \
			ib_write_bw -d tx1 -x 1 -s 65536 -n 2000 -p @PORT@ "$a1"
		echo "ib_write_bw: $(perftest_result "$RP_CLIENT_LOG") MB/s"
		run_pair ib_send_bw -d tx0 -x 1 -c UD -s 1024 -n 2000 -p @PORT@ -- \
			ib_send_bw -d tx1 -x 1 -c UD -s 1024 -n 2000 -p @PORT@ "$a1"
		echo "ib_send_bw -c UD: $(perftest_result "$RP_CLIENT_LOG") MB/s"
		run_pair ibv_rc_pingpong -d tx0 -g 1 -n 1000 -p @PORT@ -- \
			ibv_rc_pingpong -d tx1 -g 1 -n 1000 -p @PORT@ "$a1"
		grep 'iters in' "$RP_CLIENT_LOG"
	)
	step clients clients && sed 's/^/    /' "$build/in-root-clients.log" | grep -E 'MB/s|iters in'
fi

if want fabric; then
	# The libfabric provider under this release's libfabric (Debian 13: 2.1)
	# and libibverbs (whose ibv_wr_flush it compiles in): fi_info, Debian's
	# fi_pingpong as two processes, and pmof_fabtest, on the devices (and
	# the agent) of the clients step.  Inside `step` errexit is off: every
	# command is checked.
	fabric() (
		. tests/integration/lib.sh
		sroce_init build
		require_cmds fi_info fi_pingpong ss
		export FI_PROVIDER_PATH=$build/libfabric-glue
		fabric_init pmof
		sroce_config tx0 "$a1" tx1 "$a2"
		"$SROCE_BIN" exec -- fi_info --version | grep libfabric || exit 1
		"$SROCE_BIN" exec -- fi_info -p pmof -t FI_EP_MSG | grep -q 'provider: pmof' || exit 1
		for ep in msg rdm; do
			run_pair fi_pingpong -p pmof -e "$ep" -c -I 10 -d tx0 -B @PORT@ -- \
				fi_pingpong -p pmof -e "$ep" -c -I 10 -P @PORT@ "$a1" || exit 1
			echo "fi_pingpong -e $ep: $(grep -c '^[0-9]' "$RP_CLIENT_LOG") sizes"
			"$SROCE_BIN" exec -- "$build/tests/fabric/pmof_fabtest" -p pmof -e "$ep" -a "$a1" \
				>"$WORK/fabtest.$ep" 2>&1
			rc=$?
			echo "pmof_fabtest -e $ep: $(tail -n 1 "$WORK/fabtest.$ep")"
			((rc == 0)) || { grep '^not ok' "$WORK/fabtest.$ep"; exit 1; }
		done
	)
	step fabric fabric && sed 's/^/    /' "$build/in-root-fabric.log" | grep -E 'fi_pingpong -e|pmof_fabtest|libfabric'
fi

if want ipv6; then
	# perftest's rdma_cm mode over IPv6 (perftest 25.01's --ipv6-addr; the
	# -R client of Debian 12's perftest 4.5 speaks IPv4 only): network
	# namespaces A and B made here (so they end with this run's mount
	# namespace), joined by a veth pair that has IPv6 only, a device f6 on
	# each end that follows its veth.  ib_write_bw -R to the global
	# address, ib_send_lat -R to the link-local one with its scope.
	ipv6() (
		. tests/integration/lib.sh
		sroce_init build
		require_cmds ib_write_bw ib_send_lat ip ss
		netns_pair sroce-root-a-$$ sroce-root-b-$$
		netns_fixed_macs 02:00:00:00:35:0a 02:00:00:00:35:0b
		{ in_a ip addr add fd00:35::1/64 dev veth-a nodad &&
			in_b ip addr add fd00:35::2/64 dev veth-b nodad; } || exit 1
		netns_sroce root-v6
		{ link_a f6 netdev veth-a && link_b f6 netdev veth-b; } || exit 1
		netns_perftest_cm wbw '"port":18515[,}]' 60 ib_write_bw -d f6 -R --ipv6-addr -s 65536 -n 2000 -- \
			ib_write_bw -d f6 -R --ipv6-addr -s 65536 -n 2000 fd00:35::1 || exit 1
		echo "ib_write_bw -R to fd00:35::1: $(perftest_result "$WORK/wbw.b") MB/s"
		# A port of its own: the agent may still list the first server's
		# listener when the second server starts.
		netns_perftest_cm lat '"port":18516[,}]' 60 ib_send_lat -d f6 -R --ipv6-addr -s 64 -n 2000 -p 18516 -- \
			ib_send_lat -d f6 -R --ipv6-addr -s 64 -n 2000 -p 18516 fe80::ff:fe00:350a%veth-b || exit 1
		echo "ib_send_lat -R to fe80::ff:fe00:350a%veth-b: $(perftest_result "$WORK/lat.b") us"
	)
	step ipv6 ipv6 && sed 's/^/    /' "$build/in-root-ipv6.log" | grep -E 'ib_write_bw -R|ib_send_lat -R'
fi

if want suite; then
	step suite env SROCE_SUITE_ADDR="$a3" bash tests/integration/test_rdma_core_suite.sh build
	grep -E '^[0-9]+ tests in ' "$build/in-root-suite.log" | tail -n 1 | sed 's/^/    /'
fi

[[ -x build/tools/sroce/sroce ]] && build/tools/sroce/sroce agent stop 2>/dev/null || true
say "$passed steps passed, $failed failed"
((failed == 0))
