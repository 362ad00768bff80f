#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The kernel patches of rxe-patches/ at work: each series is applied to the
# kernel source Debian ships, checked with checkpatch.pl --strict, built
# into modules for Debian's kernel (rxe-patches/build.sh), and the qemu
# guest boots that kernel with them (tests/vm/build_guest.sh,
# SROCE_VM_MODULES).
#
#   6.12: the stand-alone FLUSH ICRC fix.  test_pmof_rxe.sh runs against
#         the patched rxe and expects sroce's commits to travel as IBTA
#         FLUSHes only: rxe answers the first form sroce sends, so sroce
#         never learns the non-IBTA one, and scapy finds only IBTA FLUSHes
#         on the wire.
#
# Usage: test_rxe_patches.sh BUILD-DIR
# Skips (77) without the kernel sources and headers (scripts/setup.sh
# kernel), or when test_pmof_rxe.sh skips (root, qemu, a tap).
#
# ctest: TIMEOUT=1500 LABELS=vm,netns,kernel PROCESSORS=2 RESOURCE_LOCK=vm-10.203
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_patches.sh BUILD-DIR}"
patches=$(cd "$here/../../rxe-patches" && pwd)

[[ -r /usr/src/linux-source-6.12.tar.xz ]] ||
	skip "linux-source-6.12 is not installed (scripts/setup.sh kernel)"
compgen -G '/lib/modules/6.12*/build/Makefile' >/dev/null ||
	skip "no linux-headers-6.12 installed (scripts/setup.sh kernel)"

# --- 6.12: the FLUSH ICRC fix ----------------------------------------------
out=$BUILD_DIR/rxe-patches/6.12
if bash "$patches/build.sh" --series 6.12 --checkpatch --out "$out" >"$WORK/build-6.12.log" 2>&1; then
	pass "6.12 series: applies to linux-source-6.12, checkpatch.pl --strict clean, builds ($(paste -sd' ' "$out/series.txt"))"
else
	fail "6.12 series: rxe-patches/build.sh failed" "$(tail -n 30 "$WORK/build-6.12.log")"
	finish
fi
kver=$(modinfo -F vermagic "$out/modules/rdma_rxe.ko" | cut -d' ' -f1)
rc=0
SROCE_VM_KERNEL=$kver SROCE_VM_MODULES=$out/modules SROCE_TEST_RXE_FLUSH_FORM=ibta \
	bash "$here/test_pmof_rxe.sh" "$BUILD_DIR" >"$WORK/pmof-6.12.log" 2>&1 || rc=$?
sed 's/^/  6.12| /' "$WORK/pmof-6.12.log"
case $rc in
0) pass "6.12 with the fix: sroce commits into rxe's device DAX with IBTA FLUSHes only" ;;
77) skip "test_pmof_rxe.sh skipped: $(grep -m1 SKIP "$WORK/pmof-6.12.log")" ;;
*) fail "6.12 with the fix: test_pmof_rxe.sh failed ($rc)" ;;
esac
finish
