#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A kernel rxe node as the durable target of a sroce initiator, through a
# power loss.  The qemu guest (behind a tap in a network namespace created
# here: host sroce0 10.205.0.1, guest rxe0 10.205.0.2) switches its
# emulated NVDIMM to device DAX and serves the remote log of
# docs/examples/fi_remote_log.c there: its log is /dev/dax0.0, registered
# FI_PMEM.  The target runs with libsroce.so preloaded, which takes part in
# the connection's ECE exchange for an rxe that reports write-commits in
# sysfs: with rxe-patches/ (SROCE_TEST_RXE_NATIVE=1) every FI_COMMIT of the
# sroce initiator on the host travels as a native write-commit (opcodes
# 0xC0-0xC5, which the capture must show), otherwise as WRITE + persistent
# FLUSH (and the capture must show no native opcode); either way rxe writes
# the NVDIMM's cache lines back before it answers.  While records stream in, qemu is killed
# (SIGKILL: the guest's power is cut); the guest boots again on the same
# NVDIMM backing file and `fi_remote_log --verify` reads the log there: its
# head must cover every commit the initiator saw complete, and every record
# must be intact.
#
# A region on a DAX-mounted file system (fsdax) is no target for rxe: its
# pages cannot be pinned for as long as an MR lives (the kernel refuses
# FOLL_LONGTERM pins of fsdax mappings), so device DAX it is.
#
# The guest boots the newest kernel installed (Debian's 6.12) unless
# SROCE_VM_KERNEL says otherwise; SROCE_VM_MODULES=DIR runs rxe-patches/'
# modules (test_rxe_patches.sh).
#
# Usage: test_rxe_durable.sh BUILD-DIR
# Skips (77) without root, /dev/net/tun, qemu, libfabric-bin, or a guest
# kernel whose rxe executes FLUSH (>= 6.2, or patched).
#
# ctest: TIMEOUT=600 LABELS=vm,netns PROCESSORS=2 RESOURCE_LOCK=vm-10.205
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_durable.sh BUILD-DIR}"
: "${VM_TIMEOUT:=300}"
: "${VM_MEM:=1G}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip timeout pkill
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
rlog=$BUILD_DIR/tests/compile/fi_remote_log
prov=$BUILD_DIR/libfabric-glue/libpmof-fi.so
for f in "$rlog" "$prov"; do [[ -e $f ]] || die "$f is not built"; done
vm_init "$BUILD_DIR"
kver=$(cat "$VM_GUEST/kernel-version")
vm_require_rxe_flush

ns=sroce-durable-$$
host_ip=10.205.0.1
guest_ip=10.205.0.2
port=18900
dax_size=$((4 << 20))
record=32
# Commits the initiator may have in flight past the last completed one.
depth=16
native=${SROCE_TEST_RXE_NATIVE:-}
shim=/usr/lib/sroce/libsroce.so.0
vm_cleanup_on_exit
export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
vm_sroce_ns "$ns" "$host_ip"
vm_capture_or_not "${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}"
pcap=$VM_PCAP

# boot NAME SCRIPT: boots the guest on the NVDIMM backing file with SCRIPT
# as its test, programs and provider included.
boot() {
	local overlay=$WORK/overlay-$1
	mkdir -p "$overlay/test" "$overlay/usr/lib/pmof"
	vm_add_program "$overlay" "$prov" /usr/lib/pmof/libpmof-fi.so
	vm_add_program "$overlay" "$rlog"
	vm_add_program "$overlay" "$BUILD_DIR/libibverbs-ext/shim/libsroce.so.0" "$shim"
	printf '%s\n' ". /etc/guest-lib.sh" "export FI_PROVIDER_PATH=/usr/lib/pmof FI_PROVIDER=pmof" \
		"$2" >"$overlay/test/run.sh"
	vm_initrd "$overlay"
	vm_start_nvdimm "$ns" "$guest_ip"
}

# --- boot 1: the target, and the power cut ---------------------------------------
boot first "rdma link add rxe0 type rxe netdev eth0 || exit 100
GID=\$(roce_gid_index rxe0) || exit 101
mark \"GID \$GID\"
step dax 60 ndctl create-namespace -f -e namespace0.0 -m devdax || exit 102
export LD_PRELOAD=$shim
serve target $port 240 fi_remote_log --server -a $guest_ip -p $port --file /dev/dax0.0 --size $dax_size --record-size $record"
if ! vm_wait "(NOT)?READY target" 200 || [[ $(vm_marker "(NOT)?READY target") != "READY target" ]]; then
	vm_dump >&2
	die "the guest's target did not start: $(vm_step_output target)"
fi
echo "guest ($kver) serving the log on device DAX after $((SECONDS - VM_START)) s"
out=$WORK/initiator
vm_in_ns timeout -k 5 120 "$SROCE_BIN" exec -- "$rlog" -a "$guest_ip" -p "$port" -n 1000000 \
	--record-size $record >"$out" 2>&1 &
cpid=$!
SROCE_BG_PIDS+=("$cpid")
if ! wait_for "$out" 90 "^committed " "$cpid"; then
	fail "no record was committed before the power cut" "$(cat "$out"; vm_step_output target)"
	finish
fi
sleep 2
kill -0 "$cpid" 2>/dev/null || fail "the stream ended before the power cut" "$(cat "$out")"
# qemu is the child of timeout(1) (vm_start): SIGKILL it, nothing else.
pkill -KILL -P "$VM_PID" qemu-system || die "no qemu to kill"
killed=$(now)
vm_cleanup
bg_wait "$cpid"
vm_capture_stop
last=$(awk '/^committed / { n = $2 } END { print n + 0 }' "$out")
echo "power cut after $last completed commits; the initiator exited $BG_RC after $(elapsed "$killed") s"
if [[ $BG_RC == 3 ]] && grep -q 'commit failed' "$out"; then
	pass "the initiator stopped with a completion error ($(grep -m1 'commit failed' "$out" | sed 's/^fi_remote_log: //'))"
else
	fail "the initiator exited $BG_RC after the power cut, expected 3" "$(tail -n 5 "$out")"
fi

# --- the wire: how the commits travelled ------------------------------------------
if [[ -n $pcap ]]; then
	# Only the opcodes count here: a capture cut by the power cut may end
	# in packets whose checks fail.
	rc=0
	vm_wire_check "$pcap" "$host_ip" "$guest_ip" || rc=$?
	if ((rc != 2)); then
		commits=$(vm_wire_ops sroce '^0xc[0-5]$')
		flushes=$(vm_wire_ops sroce '^0x1c$')
		if [[ -n $native ]] && ((commits > 0)); then
			pass "wire: sroce's commits travelled natively: $commits write-commit packets (0xC0-0xC5), $flushes FLUSHes"
		elif [[ -z $native ]] && ((commits == 0 && flushes > 0)); then
			pass "wire: sroce's commits travelled as WRITE + FLUSH ($flushes FLUSHes), no native opcode"
		else
			fail "wire: $commits native write-commit packets and $flushes FLUSHes from sroce (native: ${native:-no})" "$(cat "$WORK/check.log")"
		fi
	fi
fi

# --- boot 2: the log after the power cut ---------------------------------------
boot second "step dax 60 ndctl list -N
step verify 60 fi_remote_log --verify /dev/dax0.0 --size $dax_size --record-size $record"
vm_wait 'DONE verify rc=' 200 || true
vm_finish 60
vm_step_output verify >"$WORK/verify.out"
echo "after the reboot: $(cat "$WORK/verify.out")"
if ((last > 0)); then
	check_log_head "power cut" "$WORK/verify.out" "$last" "$depth"
else
	fail "nothing was committed before the power cut"
fi
finish
