#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# What the shim costs a program that never uses RDMA but runs under
# `sroce exec` (a JVM, a thread-pool server): libsroce.so's static TLS, which
# every thread of the process carries, is at most 4 KiB; 1,000 threads that
# each make the libc calls the shim interposes (open, write, fstat, close)
# add at most 4 KiB of resident memory and heap each over the same program
# run plain; and the cost of an interposed write() on an ordinary descriptor
# is printed next to the plain one.
#
# Usage: test_preload_cost.sh BUILD-DIR
#
# ctest: TIMEOUT=120
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds readelf
prog=$BUILD_DIR/tests/progs/thread_cost
[[ -x $prog ]] || die "$prog not built"
threads=1000

tls=$(readelf -lW "$SROCE_SHIM" | awk '$1 == "TLS" { print $6 }')
tls=$((${tls:-0}))
if ((tls <= 4096)); then
	pass "libsroce.so's TLS segment: $tls bytes"
else
	fail "libsroce.so's TLS segment: $tls bytes (want <= 4096)"
fi

probe=$("$SROCE_BIN" exec -- true 2>&1)
[[ -z $probe ]] || skip "sroce exec cannot run a program here: $probe"

# run WHERE...: the smallest of three runs' per-thread cost (resident memory
# plus heap, bytes), and the write() cost of that run; the smallest, as the
# noise of a shared host only adds.
run() {
	local best='' best_ns='' i out rss heap ns cost
	for i in 1 2 3; do
		out=$("$@" "$prog" "$threads") || die "$*: thread_cost failed"
		read -r rss heap ns < <(awk '{ print $4, $6, $8 }' <<<"$out")
		cost=$(((rss * 1024 + heap) / threads))
		if [[ -z $best ]] || ((cost < best)); then
			best=$cost best_ns=$ns
		fi
	done
	echo "$best $best_ns"
}

read -r plain plain_ns < <(run env)
read -r preloaded preloaded_ns < <(run "$SROCE_BIN" exec --)
extra=$((preloaded - plain))
if ((extra <= 4096)); then
	pass "$threads threads under sroce exec: $extra bytes each over plain ($preloaded vs $plain)"
else
	fail "$threads threads under sroce exec: $extra bytes each over plain ($preloaded vs $plain; want <= 4096)"
fi
echo "write() on /dev/null: ${plain_ns} ns plain, ${preloaded_ns} ns under sroce exec"
finish
