#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The project on Debian 13 (trixie, rdma-core 56, clang 19, GCC 14): makes a
# trixie root with debootstrap from the mirror the host uses, installs the
# build dependencies there with the project's own scripts/setup.sh, builds a
# copy of this source tree inside with the default preset (warnings are
# errors) and runs inside (tests/integration/in_root.sh):
#   - the unit tests (ctest -L unit) and check_shim_symbols against
#     rdma-core 56's libibverbs and Debian 13's perftest and ibverbs-utils;
#   - Debian 13's ib_write_bw, ib_send_bw -c UD and ibv_rc_pingpong over two
#     sroce devices on 127.0.17.1 and 127.0.17.2;
#   - the libfabric provider pmof under libfabric 2.1, built against
#     rdma-core 56 (ibv_wr_flush compiled in): fi_info, fi_pingpong -c msg
#     and rdm, pmof_fabtest msg and rdm, over the same two devices;
#   - perftest's rdma_cm mode over IPv6 (Debian 12's -R client is IPv4
#     only): ib_write_bw -R to a global and ib_send_lat -R to a scoped
#     link-local address, between network namespaces made inside the root;
#   - rdma-core 56's own pyverbs suite over a sroce device on 127.0.17.3
#     (test_rdma_core_suite.sh, with the root's python3 and python3-pyverbs).
# Then, outside the root, the kernel's rxe in the qemu guest with the root's
# user space (rdma-core 56 posts FLUSH, Debian 12's rdma-core 44 cannot):
# test_rxe_a19.sh with SROCE_VM_USERSPACE, against Debian's 6.12 (rxe's own
# FLUSH ICRC form) and against rxe-patches/' 6.1 series (IBTA's form, native
# write-commits from user space on both sides); and test_rxe_ipv6.sh with
# the root's user space on both sides (rxe posts FLUSH, perftest's -R runs
# over IPv6).  Skipped parts say why.
#
# The root shares the host's network stack, so the devices are on the host's
# lo; /proc, /sys and /dev are mounted only in a private mount namespace.
# Everything is cached in SROCE_TRIXIE_CACHE (default /var/tmp/sroce-trixie):
# the debootstrap tarball, apt's downloads, and the root itself with its
# packages and its build tree, so a later run installs nothing new and
# rebuilds only what changed.  SROCE_TRIXIE_MIRROR=URL overrides the mirror.
# Skipped (77) only when a root cannot be made here: not root, no
# debootstrap, no mount namespace or no Debian mirror in the apt sources.
#
# Usage: test_trixie.sh BUILD-DIR   (BUILD-DIR only holds this run's logs)
# ctest: TIMEOUT=3600 LABELS=slow,vm RESOURCE_LOCK=lo-127.0.17.1,lo-127.0.17.2,lo-127.0.17.3,vm-10.204,vm-10.206 PROCESSORS=2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SUITE=trixie
CACHE=${SROCE_TRIXIE_CACHE:-/var/tmp/sroce-trixie}

debroot_require
require_cmds tar md5sum
require_loopback
MIRROR=${SROCE_TRIXIE_MIRROR:-$(debroot_find_mirror "$SUITE")}
[[ -n $MIRROR ]] || skip "no Debian mirror in /etc/apt/sources.list*"
log "mirror: $MIRROR"

debroot_lock "$CACHE"
base=$(debroot_base "$SUITE" "$MIRROR" "$CACHE")

# The root is kept between runs (with the packages setup.sh installed and
# the build tree); it is made afresh when the base changed or a run broke
# off while making it.
ROOT=$CACHE/$SUITE-root
if [[ ! -d $ROOT || "$(cat "$ROOT.base" 2>/dev/null)" != "$base" ]]; then
	start=$(now)
	rm -f "$ROOT.base"
	rm -rf --one-file-system "$ROOT"
	mkdir -p "$ROOT"
	tar -C "$ROOT" -xf "$base"
	debroot_apt_sources "$ROOT" "$MIRROR" "$SUITE"
	echo "$base" >"$ROOT.base"
	log "root unpacked in $(elapsed "$start") s"
fi
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"

# This source tree, with its timestamps; /src/build (the preset's build
# tree) stays.
start=$(now)
debroot_copy_source "$SRC_DIR" "$ROOT/src" build
log "source copied in $(elapsed "$start") s"

start=$(now)
rc=0
DEBROOT_TIMEOUT=3300 debroot_run "$ROOT" "$CACHE/apt-archives" -- \
	bash /src/tests/integration/in_root.sh /src 127.0.17.1 127.0.17.2 127.0.17.3 ||
	rc=$?
cp "$ROOT/src/build/rdma-core-suite.md" "$BUILD_DIR/rdma-core-suite-$SUITE.md" 2>/dev/null || true
log "build and tests in the $SUITE root: $(elapsed "$start") s"
((rc == 0)) || die "the project fails on $SUITE (exit $rc)"
echo "the project builds and works on Debian $SUITE"

# --- the kernel's rxe with this root's user space ---------------------------------
# guest_test TEST NAME [VAR=VALUE...]: tests/integration/TEST.sh with the
# guest's programs taken from the root.
guest_test() {
	local test=$1 name=$2 rc=0 log=$BUILD_DIR/$SUITE-$1-$2.log
	shift 2
	env SROCE_VM_USERSPACE="$ROOT" "$@" bash "$SRC_DIR/tests/integration/$test.sh" \
		"$BUILD_DIR" >"$log" 2>&1 || rc=$?
	sed "s/^/  $test $name| /" "$log"
	case $rc in
	0) echo "Linux rxe ($name) with Debian $SUITE's user space: $test passed" ;;
	77) log "Linux rxe ($name) with Debian $SUITE's user space: $test skipped ($(grep -m1 SKIP "$log"))" ;;
	*) die "Linux rxe ($name) with Debian $SUITE's user space: $test failed ($rc)" ;;
	esac
}
guest_test test_rxe_a19 6.12
# FLUSH from rxe and perftest 25.01's ib_write_bw -R, over IPv6.
guest_test test_rxe_ipv6 6.12
series=$BUILD_DIR/$SUITE-rxe-patches-6.1
if ! kernel=$(bash "$SRC_DIR/scripts/kernel-pick.sh" --installed 6.1 2>&1); then
	log "the 6.1 series is not run with Debian $SUITE's user space: ${kernel#kernel-pick.sh: } (scripts/setup.sh kernel)"
elif ! bash "$SRC_DIR/rxe-patches/build.sh" --series 6.1 --out "$series" >"$series.log" 2>&1; then
	tail -n 20 "$series.log" >&2
	die "rxe-patches/build.sh --series 6.1 failed"
else
	log "the 6.1 series on linux-source-6.1 ${kernel%% *}, for ${kernel#* }"
	guest_test test_rxe_a19 6.1-patched SROCE_VM_KERNEL="$(modinfo -F vermagic "$series/modules/rdma_rxe.ko" | cut -d' ' -f1)" \
		SROCE_VM_MODULES="$series/modules" SROCE_TEST_RXE_FLUSH_FORM=ibta SROCE_TEST_RXE_NATIVE=1
fi
