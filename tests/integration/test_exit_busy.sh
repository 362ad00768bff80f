#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A program that ends while its device is busy, destroying nothing
# (tests/progs/exit_busy): two RC QPs on one device (127.0.34.1) connected
# to each other, a thread each posting RDMA WRITEs and SENDs, a third
# thread allocating and freeing PDs, contexts, XRC domains and rdma_cm
# files, an SRQ and a UD QP left open; then, at a different moment each
# time, main() calls exit(0), main() returns, or a posting thread calls
# exit(0).  Twenty runs of each must all exit 0 with no sanitizer report:
# what the library keeps for the life of the process stays usable by its
# own threads, the application's and the interposed close() and write()
# until the process is gone, none of it destroyed by exit().
#
# Label `all_builds`: scripts/test.sh runs it in the default build and
# again in build-asan and build-tsan, where the program, libsroce.so and the
# agent (run here in the foreground, so that its exit status and reports
# count too) are all sanitized like the tree.
#
# Usage: test_exit_busy.sh BUILD-DIR
#
# ctest: TIMEOUT=600 LABELS=all_builds RESOURCE_LOCK=lo-127.0.34.1
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds timeout
require_loopback
prog=$BUILD_DIR/tests/progs/exit_busy
[[ -x $prog ]] || die "$prog not built"
build_sanitizer
sanitizer=$SANITIZER
case $sanitizer in
address | thread | "") ;;
*) die "SROCE_SANITIZE=$sanitizer in $BUILD_DIR: expected address, thread or nothing" ;;
esac
build=${sanitizer:-plain}
A=127.0.34.1
sroce_config sroce_exit0 $A
private_agent

foreground_agent

# A report fails a run whatever the exit status says: a report printed by
# one thread while another is already in exit() can end with status 0.
report='Sanitizer|runtime error|LeakSanitizer'
runs=20
for mode in exit return worker-exit; do
	bad=0 first='' start=$(now)
	for ((i = 0; i < runs; i++)); do
		# From right after the first completions to 38 ms later, so that
		# the end meets the threads at different points of their loops.
		out=$WORK/$mode.$i
		rc=0
		timeout -k 5 60 "$SROCE_BIN" exec -- "$prog" -d sroce_exit0 --mode "$mode" --ms $((2 * i)) \
			>"$out" 2>&1 || rc=$?
		if ((rc != 0)) || grep -a -q -E "$report" "$out" || ! grep -a -q "^exit_busy: $mode after " "$out"; then
			bad=$((bad + 1))
			[[ -n $first ]] || first="run $i (--ms $((2 * i))): exit $rc"$'\n'"$(tail -n 60 "$out")"
		fi
	done
	if ((bad == 0)); then
		pass "$mode ($build): $runs runs exited 0 with no report in $(elapsed "$start")s"
	else
		fail "$mode ($build): $bad of $runs runs failed" "(the first: $first)"
	fi
done

"$SROCE_BIN" agent stop || true
bg_wait "$AGENT_PID"
if ((BG_RC == 0)) && ! grep -a -q -E "$report" "$AGENT_LOG"; then
	pass "agent ($build): exited cleanly"
else
	fail "agent ($build): exit $BG_RC" "$(cat "$AGENT_LOG")"
fi
finish
