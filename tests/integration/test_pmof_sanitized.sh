#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# pmof_fabtest (tests/fabric), msg and rdm, and pmof_crash_tests (the
# crash-consistency domain through pmof) in a sanitizer build: the
# provider, libsroce.so with the engine, the fabtest itself and the agent all
# built with the sanitizer BUILD-DIR was configured with (SROCE_SANITIZE:
# ASan+UBSan or TSan).  Both ends of every connection are in one process, so
# no uninstrumented program loads a sanitized library; only the system's
# libraries (libfabric above all) are uninstrumented.
#
# Label `sanitize`: scripts/test.sh runs it in build-asan and build-tsan next
# to the unit tests.  In a build without sanitizers it skips, as
# test_pmof_provider.sh runs the same fabtests there.
#
# The agent runs in the foreground of this script rather than detached, so
# that its exit status, and its reports (leaks are only checked when it
# exits), count as well.
#
# Usage: test_pmof_sanitized.sh BUILD-DIR
#
# ctest: LABELS=sanitize RESOURCE_LOCK=lo-127.0.23.1
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
[[ -f $BUILD_DIR/CMakeCache.txt ]] || die "$BUILD_DIR has no CMakeCache.txt"
build_sanitizer
sanitizer=$SANITIZER
case $sanitizer in
address | thread) ;;
"") skip "$BUILD_DIR is not a sanitizer build (test_pmof_provider.sh runs pmof_fabtest there)" ;;
*) die "SROCE_SANITIZE=$sanitizer in $BUILD_DIR: expected address or thread" ;;
esac
fabtest=$BUILD_DIR/tests/fabric/pmof_fabtest
[[ -x $fabtest ]] || die "pmof_fabtest is not built in $BUILD_DIR/tests/fabric"
[[ -x $BUILD_DIR/tests/fabric/pmof_crash_tests ]] ||
	die "pmof_crash_tests is not built in $BUILD_DIR/tests/fabric"
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
[[ -f $FI_PROVIDER_PATH/libpmof-fi.so ]] || die "libpmof-fi.so is not built in $FI_PROVIDER_PATH"
fabric_init pmof
A=127.0.23.1
sroce_config psan0 $A
private_agent

foreground_agent

for ep in msg rdm; do
	out=$WORK/fabtest.$ep
	start=$(now)
	rc=0
	timeout -k 5 120 "$SROCE_BIN" exec -- "$fabtest" -p pmof -e $ep -a $A >"$out" 2>&1 || rc=$?
	secs=$(elapsed "$start")
	# A report fails the run whatever the runtime's options say about exit
	# statuses.
	if ((rc == 0)) && ! grep -a -q 'Sanitizer' "$out"; then
		pass "pmof_fabtest -e $ep ($sanitizer): $(grep -a -c '^ok' "$out") ok" \
			"($(grep -a -c '# skip' "$out") skipped) in ${secs}s"
	else
		fail "pmof_fabtest -e $ep ($sanitizer): exit $rc after ${secs}s" "$(grep -a -v '^ok' "$out")"
	fi
done

# The crash-consistency run: the engine's persist hook, a power-off thread
# copying the target while the engine writes it, and the provider's own
# threads, all under the sanitizer.
crash=$BUILD_DIR/tests/fabric/pmof_crash_tests
out=$WORK/crash
start=$(now)
rc=0
PMOF_CRASH_ADDR=$A timeout -k 5 300 "$SROCE_BIN" exec -- "$crash" >"$out" 2>&1 || rc=$?
secs=$(elapsed "$start")
if ((rc == 0)) && ! grep -a -q 'Sanitizer' "$out" && grep -a -q '^\[  PASSED  \] 3 tests' "$out"; then
	pass "pmof_crash_tests ($sanitizer): 3 tests in ${secs}s"
else
	fail "pmof_crash_tests ($sanitizer): exit $rc after ${secs}s" "$(tail -n 80 "$out")"
fi

"$SROCE_BIN" agent stop || true
bg_wait "$AGENT_PID"
if ((BG_RC == 0)) && ! grep -a -q 'Sanitizer' "$AGENT_LOG"; then
	pass "agent ($sanitizer): exited cleanly"
else
	fail "agent ($sanitizer): exit $BG_RC" "$(cat "$AGENT_LOG")"
fi
finish
