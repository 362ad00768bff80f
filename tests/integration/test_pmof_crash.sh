#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The crash-consistency domain of the verbs tests, through the libfabric
# provider pmof (tests/fabric/pmof_crash.cpp): log-append-then-commit plans
# posted with fi_writemsg (plain, FI_COMMIT, FI_COMMIT | FI_FENCE) and
# fi_commit, the target powered off at random moments while they run, every
# image checked against what the polled completions had promised; and one
# negative control, showing the checks fail when a completion is
# fabricated; with the commits pmof takes on sroce and with the IBTA
# sequences it posts on an RNIC.  Both endpoints in one process on one sroce device
# (127.0.24.1), with an agent of its own for rdma_cm.
#
# Usage: test_pmof_crash.sh BUILD-DIR   (SROCE_TEST_SEED replays a seed)
#
# ctest: TIMEOUT=600 RESOURCE_LOCK=lo-127.0.24.1
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
prog=$BUILD_DIR/tests/fabric/pmof_crash_tests
[[ -x $prog ]] || die "pmof_crash_tests is not built in $BUILD_DIR/tests/fabric"
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
[[ -f $FI_PROVIDER_PATH/libpmof-fi.so ]] || die "libpmof-fi.so is not built in $FI_PROVIDER_PATH"
fabric_init pmof
export PMOF_CRASH_ADDR=127.0.24.1
sroce_config pcrash0 $PMOF_CRASH_ADDR
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"}

# Twice: the commits pmof takes on sroce, and the IBTA WRITE + FLUSH
# sequences it posts on an RNIC (FI_PMOF_COMMIT_PATH=flush).
for path in native flush; do
	rc=0
	FI_PMOF_COMMIT_PATH=$path timeout -k 5 270 "$SROCE_BIN" exec -- "$prog" >"$WORK/out.$path" 2>&1 ||
		rc=$?
	grep -E '^\[ (crash|caught) +\]' "$WORK/out.$path" || true
	if ((rc == 0)) && grep -q '^\[  PASSED  \] 3 tests' "$WORK/out.$path"; then
		pass "pmof_crash_tests ($path commits): every power-off image keeps what the completions promised"
	else
		fail "pmof_crash_tests ($path commits) exited $rc" "$(tail -n 60 "$WORK/out.$path")"
	fi
done
finish
