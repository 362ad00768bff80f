#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# FI_COMMIT_MANUAL hands a commit's ranges to the target application only
# when each lies inside a region the target registered, live, with
# FI_REMOTE_WRITE, under that region's own key, and sets FI_PMEM only for
# a region registered with it (fi_pmof(7)); anything else is refused with an
# error the initiator sees, and the connection goes on serving:
#
#   1. pmof_fabtest pmof.manual_ranges, msg and rdm: pmof initiators whose
#      fi_commit names ranges partly outside the target's region, beyond
#      the address space, keys of no region, of a closed one, of one
#      without remote write, with a forged or dropped FI_PMEM class, one bad
#      range among good ones; each completes with FI_EACCES (FI_EINVAL for
#      a range that wraps), the handler is never called, no FI_COMMIT_EVENT
#      is queued, and valid commits between and after them succeed with
#      their data in place.
#   2. pmof_manual_wire: a crafted peer speaking the control protocol
#      itself sends requests pmof's initiator never would (counts that do
#      not match the message, more than 32 ranges, none) and gets ACKs with
#      -FI_EINVAL, and -FI_EACCES for ranges outside the regions.
#
# Usage: test_pmof_manual_ranges.sh BUILD-DIR
#
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.33.1
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
[[ -f $FI_PROVIDER_PATH/libpmof-fi.so ]] || die "libpmof-fi.so is not built in $FI_PROVIDER_PATH"
fabric_init pmof
A=127.0.33.1
sroce_config pmof0 $A
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"}

fabtest=$BUILD_DIR/tests/fabric/pmof_fabtest
wire=$BUILD_DIR/tests/fabric/pmof_manual_wire
[[ -x $fabtest ]] || die "pmof_fabtest is not built in $BUILD_DIR/tests/fabric"
[[ -x $wire ]] || die "pmof_manual_wire is not built in $BUILD_DIR/tests/fabric"

for ep in msg rdm; do
	out=$WORK/fabtest.$ep
	if timeout -k 5 120 "$SROCE_BIN" exec -- "$fabtest" -p pmof -e $ep -a $A \
		pmof.manual_ranges >"$out" 2>&1 && grep -a -q -E '^ok [0-9]+ - pmof\.manual_ranges( # note: .*)?$' "$out"; then
		pass "pmof_fabtest -e $ep pmof.manual_ranges"
	else
		fail "pmof_fabtest -e $ep pmof.manual_ranges" "$(cat "$out")"
	fi
done

out=$WORK/wire
if timeout -k 5 200 "$SROCE_BIN" exec -- "$wire" -a $A >"$out" 2>&1; then
	pass "pmof_manual_wire: $(grep -a -c '^ok' "$out") checks of crafted requests"
else
	fail "pmof_manual_wire" "$(cat "$out")"
fi
finish
