#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The real persistent-memory path: Debian's kernel under qemu (software
# emulation) with an emulated NVDIMM backed by a file.  Inside the guest the
# NVDIMM's namespace is switched to fsdax with ndctl, /dev/pmem0 gets an
# ext4 mounted with -o dax, and tests/vm/pmem_check (linked with libpmem)
# maps a file there, requires that libpmem sees persistent memory
# (pmem_is_pmem), writes, persists and verifies a pattern.
#
# When run as root with /dev/net/tun, the guest also runs sroce itself: a
# sroce_xfer server on a sroce device bound to the guest's eth0, driven over
# a tap device (inside a network namespace created here) by a sroce_xfer
# client on the host.  Then the remote log of docs/examples/remote_log.c
# keeps its file on the DAX mount: the guest's target maps it with
# pmem_map_file (--pmem), so libpmem must call it persistent memory and every
# commit persists by cache-line write-back; the host's initiator appends
# records with the native write-commit opcodes, then with the IBTA FLUSH
# fallback, and the guest checks each log with --verify.
#
# Usage: test_vm_pmem.sh BUILD-DIR
# Exits 77 without qemu or the Debian kernel packages (scripts/setup.sh).
#
# ctest: TIMEOUT=300 LABELS=vm PROCESSORS=2
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_vm_pmem.sh BUILD-DIR}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"
require_cmds timeout
vm_init "$BUILD_DIR"

host_ip=10.202.0.1
guest_ip=10.202.0.2
xfer_port=18600
xfer_iters=${SROCE_TEST_XFER_ITERS:-300}
seed=${SROCE_TEST_XFER_SEED:-$$}
xfer=$BUILD_DIR/tests/progs/sroce_xfer
rlog=$BUILD_DIR/tests/compile/remote_log
rlog_port=18601
rlog_records=2000

ns=
net=0
why_no_net=
if ((EUID != 0)); then
	why_no_net="not root"
elif [[ ! -c /dev/net/tun ]]; then
	why_no_net="no /dev/net/tun"
elif [[ ! -x $xfer ]]; then
	why_no_net="$xfer not built"
elif [[ ! -x $rlog ]]; then
	why_no_net="$rlog not built"
else
	net=1
fi

vm_cleanup_on_exit

in_ns() { vm_in_ns "$@"; }

# rlog_case NAME MODE [CLIENT-ARGS...]: the host's remote_log initiator
# against the guest's target NAME; MODE is the path the initiator must report.
rlog_case() {
	local name=$1 mode=$2 hrc=0 grc vrc t=$SECONDS
	shift 2
	local hlog=$WORK/$name.host.log
	if ! vm_wait "READY $name|NOTREADY $name|GUEST-EXIT" 150 ||
		[[ $(vm_marker "READY $name|NOTREADY $name|GUEST-EXIT") != "READY $name" ]]; then
		fail "remote_log on pmem ($mode): the guest's target did not start"
		vm_step_output "$name" | sed 's/^/  guest: /'
		return
	fi
	in_ns timeout -k 5 120 "$SROCE_BIN" exec -- "$rlog" -d sroce0 -g 1 -p "$rlog_port" \
		-n "$rlog_records" "$@" "$guest_ip" >"$hlog" 2>&1 || hrc=$?
	# A target whose initiator failed would wait for it until its timeout.
	((hrc == 0)) || vm_send "abort-$name"
	vm_wait "DONE ${name}_verify rc=" 150 || true
	grc=$(vm_marker "DONE $name rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	vrc=$(vm_marker "DONE ${name}_verify rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	if [[ $hrc == 0 && $grc == 0 && $vrc == 0 ]] &&
		# grep without -q: under pipefail, a grep that quits early could
		# fail the pipeline through its writer's SIGPIPE.
		vm_step_output "$name" | grep -x 'target memory: persistent memory (pmem_is_pmem=1)' >/dev/null &&
		grep -qx "remote_log: $mode" "$hlog" &&
		grep -qx "remote_log: $rlog_records records committed" "$hlog" &&
		vm_step_output "${name}_verify" | grep -x "log ok: $rlog_records records" >/dev/null; then
		pass "remote_log on pmem ($mode): $rlog_records records committed into a pmem_map_file'd log on DAX, verified in the guest ($((SECONDS - t)) s)"
	else
		fail "remote_log on pmem ($mode): host initiator exited $hrc, guest target ${grc:-none}, --verify ${vrc:-none}"
		grep -v '^committed ' "$hlog" | sed 's/^/  host: /'
		vm_step_output "$name" | grep -v '^durable up to' | sed 's/^/  guest: /'
		vm_step_output "${name}_verify" | sed 's/^/  guest verify: /'
	fi
}

append=
if ((net)); then
	if vm_tap_ns "sroce-pmem-$$" "$host_ip" "$WORK/links.conf"; then
		ns=$VM_NS
		export SROCE_CONFIG=$WORK/links.conf
		append="guest.ip=$guest_ip/24"
	else
		why_no_net=$VM_ERR
		net=0
	fi
fi
((net)) || echo "sroce in the guest: not run ($why_no_net)"

overlay=$WORK/overlay
mkdir -p "$overlay/test"
if ((net)); then
	vm_add_program "$overlay" "$SROCE_BIN"
	vm_add_program "$overlay" "$SROCE_SHIM" /usr/lib/sroce/libsroce.so
	vm_add_program "$overlay" "$xfer"
	vm_add_program "$overlay" "$rlog"
fi
cat >"$overlay/test/run.sh" <<EOF
. /etc/guest-lib.sh
failed=0
[ -b /dev/pmem0 ] || { echo "no /dev/pmem0"; ls /sys/bus/nd/devices; exit 10; }
step ndctl_before 30 ndctl list -N
# The label-less NVDIMM comes up as a raw namespace, which has no DAX.  (Full
# paths where busybox has an applet of the same name: its sh prefers those.)
step fsdax 60 ndctl create-namespace -f -e namespace0.0 -m fsdax || exit 11
step mkfs 60 /usr/bin/mke2fs -t ext4 -b 4096 -F -q /dev/pmem0 || exit 12
mount -t ext4 -o dax /dev/pmem0 /mnt || exit 13
mark "MOUNT \$(grep ' /mnt ' /proc/mounts) dax=\$(cat /sys/block/pmem0/queue/dax)"
step pmem_check 60 pmem_check /mnt/pmem_check.pool 16 || failed=\$((failed + 1))
# And the same program must refuse memory that is not persistent (tmpfs).
step pmem_check_tmpfs 60 pmem_check /tmp/pmem_check.pool 1
if [ -x /usr/bin/sroce ]; then
	# rdma_rxe holds UDP port 4791 from the moment it is loaded.
	rmmod rdma_rxe
	export SROCE_CONFIG=/tmp/links.conf SROCE_SHIM=/usr/lib/sroce/libsroce.so
	sroce link add sroce_g netdev eth0 addr $guest_ip || exit 14
	serve xfer $xfer_port 120 sroce exec -- sroce_xfer -d sroce_g -g 1 -p $xfer_port || failed=\$((failed + 1))
	# remote_log is linked with libsroce.so: no sroce exec.
	mkdir -p /mnt/pmem
	serve rlog_native $rlog_port 120 remote_log --server --pmem -d sroce_g -g 1 -p $rlog_port --file /mnt/pmem/log || failed=\$((failed + 1))
	step rlog_native_verify 60 remote_log --verify /mnt/pmem/log || failed=\$((failed + 1))
	serve rlog_fallback $rlog_port 120 remote_log --server --pmem -d sroce_g -g 1 -p $rlog_port --file /mnt/pmem/log || failed=\$((failed + 1))
	step rlog_fallback_verify 60 remote_log --verify /mnt/pmem/log || failed=\$((failed + 1))
fi
umount /mnt
exit \$failed
EOF
vm_initrd "$overlay"

backing=$WORK/nvdimm.img
t0=$SECONDS
vm_start ${ns:+--ns "$ns"} --append "$append" -- \
	-machine pc,nvdimm=on -m 2G,slots=2,maxmem=4G \
	-object "memory-backend-file,id=mem1,share=on,mem-path=$backing,size=256M" \
	-device nvdimm,memdev=mem1 "${VM_NET[@]}"

if ((net)); then
	if vm_wait 'READY xfer|NOTREADY xfer|GUEST-EXIT' 150 && [[ $(vm_marker 'READY xfer|NOTREADY xfer|GUEST-EXIT') == "READY xfer" ]]; then
		hrc=0
		in_ns timeout -k 5 120 "$SROCE_BIN" exec -- "$xfer" -d sroce0 -g 1 -p "$xfer_port" \
			-n "$xfer_iters" --seed "$seed" --depth 8 "$guest_ip" >"$WORK/xfer.host.log" 2>&1 || hrc=$?
		vm_wait 'DONE xfer rc=' 150 || true
		grc=$(vm_marker 'DONE xfer rc=' | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
		if [[ $hrc == 0 && $grc == 0 ]] && grep -q ' OK$' "$WORK/xfer.host.log"; then
			pass "sroce in the guest: sroce_xfer ($xfer_iters operations, seed $seed) against sroce on the host"
			grep -E 'xfer:' "$WORK/xfer.host.log" | sed 's/^/  host: /'
		else
			fail "sroce in the guest: host client exited $hrc, guest server exited ${grc:-none} (seed $seed)"
			sed 's/^/  host: /' "$WORK/xfer.host.log"
			vm_step_output xfer | sed 's/^/  guest: /'
		fi
	else
		fail "sroce in the guest: the guest's sroce_xfer server did not start"
	fi
	rlog_case rlog_native "native write-commit"
	rlog_case rlog_fallback "IBTA fallback (WRITE + FLUSH)" --no-native
fi

vm_finish 200
echo "guest exited $VM_RC after ${VM_SECONDS}s"
vm_step_output ndctl_before | sed 's/^/  ndctl list: /'
vm_step_output fsdax | sed 's/^/  fsdax: /'
vm_marker MOUNT | sed 's/^/  /'
out=$(vm_step_output pmem_check)
printf '%s\n' "$out" | sed 's/^/  /'
if grep -q 'is_pmem=1, pmem_is_pmem=1' <<<"$out" && grep -q ': OK$' <<<"$out"; then
	pass "pmem_check: libpmem maps a file on ext4 -o dax over /dev/pmem0 as persistent memory"
else
	fail "pmem_check on the emulated NVDIMM"
fi
tmpfs_rc=$(vm_marker 'DONE pmem_check_tmpfs rc=' | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
if [[ $tmpfs_rc == 2 ]]; then
	pass "pmem_check: a file on tmpfs is refused as not persistent memory"
else
	fail "pmem_check on tmpfs exited ${tmpfs_rc:-none}, expected 2"
	vm_step_output pmem_check_tmpfs | sed 's/^/  /'
fi
if [[ $VM_RC != 0 ]]; then
	fail "guest script exited $VM_RC"
	vm_dump 60 >&2
fi
echo "whole test $((SECONDS - t0)) s"
finish
