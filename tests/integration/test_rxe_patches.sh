#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The kernel patches of rxe-patches/ at work: each series is applied to the
# kernel source Debian ships, checked with checkpatch.pl --strict, built
# into modules for Debian's kernel (rxe-patches/build.sh, which also checks
# that every export keeps the kernel's symbol version), and the qemu guest
# boots that kernel with them (tests/vm/build_guest.sh, SROCE_VM_MODULES).
#
#   6.1 (Debian 12's kernel): FLUSH, ATOMIC WRITE, the FLUSH ICRC fix, the
#       kernel API for them, and the write-commit responder.
#       Every patch must build on its own (build.sh --each).  Then, in the
#       guest with the patched modules:
#       - test_rxe_interop.sh, the stock interoperability suite: no
#         regression;
#       - test_rxe_a19.sh: FLUSH (global, persistent; range, MR) and ATOMIC
#         WRITE both ways, with the error cases, sroce never sending the
#         non-IBTA FLUSH form; rxe's FLUSHes from kernel space too
#         (rxe-patches/test-module, a kernel consumer of the new work
#         requests); sroce's native write-commits into rxe, executed by
#         its write-commit responder;
#       - test_pmof_rxe.sh: the pmof provider, and sroce committing records
#         into rxe's device DAX with IBTA FLUSHes only;
#       - test_rxe_durable.sh: rxe as the durable target through a power
#         cut of the guest.
#   6.12: the stand-alone FLUSH ICRC fix; test_rxe_a19.sh against it, IBTA
#       FLUSHes only, both ways, every ICRC recomputed.  (test_pmof_rxe.sh
#       would send the same FLUSHes through pmof, which the 6.1 series,
#       carrying the same fix, already runs; it cost 4 min here.)
#
# Usage: test_rxe_patches.sh BUILD-DIR
# Each series runs against the Debian kernel whose source, headers and image
# of one version are installed (scripts/setup.sh kernel installs them,
# scripts/kernel-pick.sh tells which); the versions used are printed.  Skips
# (77) only when neither series has one, installed or on the mirror; a
# sub-test that skips (root, qemu, a tap) is reported as such.
#
# ctest: TIMEOUT=2400 LABELS=vm,netns,kernel PROCESSORS=2 RESOURCE_LOCK=vm-10.201,vm-10.203,vm-10.204,vm-10.205
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_patches.sh BUILD-DIR}"
patches=$(cd "$here/../../rxe-patches" && pwd)

# build SERIES [BUILD-ARGS...]: applies, checks and builds a series into
# BUILD_DIR/rxe-patches/SERIES; prints nothing and fails on error.
build() {
	local series=$1 out=$BUILD_DIR/rxe-patches/$1
	shift
	if bash "$patches/build.sh" --series "$series" --checkpatch --out "$out" "$@" \
		>"$WORK/build-$series.log" 2>&1; then
		pass "$series series: $(wc -l <"$out/series.txt") patches apply to linux-source-$series $(dpkg-query -W -f='${Version}' "linux-source-$series"), modules for $(modinfo -F vermagic "$out/modules/rdma_rxe.ko" | cut -d' ' -f1), checkpatch.pl --strict clean, build$([[ " $* " == *" --each "* ]] && echo " one by one"); $(grep -o 'all [0-9]* exports keep[^;]*' "$WORK/build-$series.log")"
		return 0
	fi
	fail "$series series: rxe-patches/build.sh failed" "$(tail -n 30 "$WORK/build-$series.log")"
	return 1
}

# sub SERIES SCRIPT [VAR=VALUE...]: runs a guest test with the series' modules.
sub() {
	local series=$1 script=$2 rc=0 mods=$BUILD_DIR/rxe-patches/$1/modules
	shift 2
	local kver
	kver=$(modinfo -F vermagic "$mods/rdma_rxe.ko" | cut -d' ' -f1)
	env SROCE_VM_KERNEL="$kver" SROCE_VM_MODULES="$mods" "$@" \
		bash "$here/$script" "$BUILD_DIR" >"$WORK/$series-$script.log" 2>&1 || rc=$?
	sed "s/^/  $series $script| /" "$WORK/$series-$script.log"
	case $rc in
	0) pass "$series: $script with the patched modules" ;;
	77) log "$series: $script skipped: $(grep -m1 SKIP "$WORK/$series-$script.log")" ;;
	*) fail "$series: $script with the patched modules failed ($rc)" ;;
	esac
}

# have_kernel SERIES: whether source, headers and image of one version of
# SERIES are installed (scripts/kernel-pick.sh, what setup.sh installs), and
# says which; when not, whether the mirror has such a version (then
# scripts/setup.sh kernel was not run, or failed: a failure) or not (the
# series' tests skip).
declare -A why_not=()
have_kernel() {
	local got
	if got=$(bash "$pick" --installed "$1" 2>&1); then
		log "kernel $1: linux-source-$1, linux-headers and ${got##* } at ${got%% *} (${got#* })"
		return 0
	fi
	why_not[$1]=${got#kernel-pick.sh: }
	if got=$(bash "$pick" "$1" 2>&1); then
		fail "kernel $1: ${why_not[$1]}, but the mirror offers ${got%% *} of all three: run scripts/setup.sh kernel"
	else
		why_not[$1]+="; the mirror: ${got#kernel-pick.sh: }"
	fi
	return 1
}
pick=$here/../../scripts/kernel-pick.sh
have61=0 have612=0
have_kernel 6.1 && have61=1
have_kernel 6.12 && have612=1
((have61 || have612 || CHECKS_FAILED)) ||
	skip "no Debian kernel with source, headers and image of one version (6.1: ${why_not[6.1]}; 6.12: ${why_not[6.12]})"

# --- 6.1: Debian 12's kernel -------------------------------------------------
if ((have61)); then
	if build 6.1 --each --test-module; then
		sub 6.1 test_rxe_interop.sh
		sub 6.1 test_rxe_a19.sh SROCE_TEST_RXE_FLUSH_FORM=ibta SROCE_TEST_RXE_NATIVE=1 \
			SROCE_TEST_RXE_KMOD="$BUILD_DIR/rxe-patches/6.1/test-module/a19_kmod.ko"
		sub 6.1 test_pmof_rxe.sh SROCE_TEST_RXE_FLUSH_FORM=ibta
		sub 6.1 test_rxe_durable.sh SROCE_TEST_RXE_NATIVE=1
	fi
else
	log "the 6.1 series is not tested: ${why_not[6.1]}"
fi

# --- 6.12: the FLUSH ICRC fix --------------------------------------------------
if ((have612)); then
	if build 6.12; then
		sub 6.12 test_rxe_a19.sh SROCE_TEST_RXE_FLUSH_FORM=ibta
	fi
else
	log "the 6.12 fix is not tested: ${why_not[6.12]}"
fi
finish
