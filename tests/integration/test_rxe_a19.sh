#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# RDMA FLUSH and ATOMIC WRITE (IBTA 1.5 Annex A19) between sroce and Linux
# rxe, both directions, with tests/progs/a19_check: every completion status
# and opcode checked, written data read back byte for byte.  The guest
# (qemu, behind a tap in a network namespace created here: host sroce0
# 10.204.0.1, guest rxe0 10.204.0.2) switches its emulated NVDIMM to device
# DAX, so rxe's region A takes persistent FLUSHes.
#
#   1. sroce initiator, rxe target: FLUSH global and persistent, of a range
#      and of the whole region; ATOMIC WRITE; and the errors: a region
#      without FLUSH access and a persistent FLUSH of a region registered for
#      global visibility only (remote access error), a misaligned ATOMIC
#      WRITE (remote invalid request).
#   2. rxe initiator, sroce target (a file it maps: persistent): the same
#      cases, as far as the guest's libibverbs can post them - Debian 12's
#      rdma-core 44 posts ATOMIC WRITE but no FLUSH, and a19_check then says
#      so (exit 77), which is checked too.  With SROCE_VM_USERSPACE=ROOT (a
#      Debian 13 root with this project built in ROOT/src/build:
#      test_trixie.sh) the guest's programs are that root's, rdma-core 56
#      included, run with chroot: then every case must run, and sroce must
#      have taken rxe's FLUSHes in the form the kernel sends (IBTA's with a
#      patched rxe, rxe's own otherwise, counted in rx_flush_legacy_icrc).
#   1b. Write-commits from sroce into rxe's device DAX - plain, ORDERED,
#      with immediate data, one packet and several, each read back, the
#      immediate data checked at rxe - and the errors (a region without
#      FLUSH access, a persistent commit to a region registered for global
#      visibility only: remote access error).  The guest's programs run with
#      libsroce.so preloaded, which takes part in ECE for a kernel device
#      that reports write-commits in sysfs.  With SROCE_TEST_RXE_NATIVE=1 (a
#      guest rxe with rxe-patches/) the connections must agree on native
#      write-commits and the capture must show sroce's opcodes 0xC0-0xC5;
#      otherwise (an rxe without them) they must not, and sroce must send
#      none: its write-commits travel as WRITE + FLUSH.
#   2b. With SROCE_TEST_RXE_NATIVE=1: the same write-commits from rxe to a
#      sroce target, posted through <infiniband/verbs_ext.h> on the kernel
#      QP, natively (the capture must show rxe's 0xC0-0xC5).
#   3. With SROCE_TEST_RXE_KMOD=FILE (rxe-patches/test-module's a19_kmod.ko,
#      built for the patched kernel): the same cases from kernel space, the
#      module posting struct ib_flush_wr, struct ib_atomic_write_wr and
#      struct ib_write_commit_wr over kernel rdma_cm (with ECE) to a sroce
#      target.
#
# The RoCE traffic on the tap is captured and checked by
# tests/vm/roce_peer_check.py --flush-forms: scapy recomputes every FLUSH's
# ICRC from both sides, in IBTA's form or Linux rxe's legacy one, and every
# other sampled packet's.
#
# The guest boots the newest kernel installed (Debian's 6.12: an rxe with
# FLUSH in its own ICRC form, which sroce learns) unless SROCE_VM_KERNEL
# says otherwise; with SROCE_VM_MODULES=DIR it runs rxe-patches/' modules
# (test_rxe_patches.sh), and SROCE_TEST_RXE_FLUSH_FORM=ibta then requires
# that sroce never sent a FLUSH in the non-IBTA form.
#
# Usage: test_rxe_a19.sh BUILD-DIR
# Skips (77) without root, /dev/net/tun, qemu, or a guest kernel whose rxe
# executes FLUSH (>= 6.2, or patched); the wire check needs tshark and scapy.
#
# ctest: TIMEOUT=600 LABELS=vm,netns PROCESSORS=2 RESOURCE_LOCK=vm-10.204
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_a19.sh BUILD-DIR}"
: "${VM_TIMEOUT:=420}"
: "${VM_MEM:=1G}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip timeout
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
a19=$BUILD_DIR/tests/progs/a19_check
[[ -x $a19 ]] || die "$a19 is not built"
vm_init "$BUILD_DIR"
kver=$(cat "$VM_GUEST/kernel-version")
vm_require_rxe_flush
flush_form=${SROCE_TEST_RXE_FLUSH_FORM:-any}

ns=sroce-a19-$$
host_ip=10.204.0.1
guest_ip=10.204.0.2
vm_cleanup_on_exit
vm_sroce_ns "$ns" "$host_ip"
vm_capture_or_not "${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}"
pcap=$VM_PCAP

cases=(ops no-flush-access no-persistent-access misaligned-atomic-write)
commit_cases=(commit commit-no-access commit-global-only commit-refused)
native=${SROCE_TEST_RXE_NATIVE:-}
host_cases=("${cases[@]}" "${commit_cases[@]}")
guest_cases=("${cases[@]}")
[[ -z $native ]] || guest_cases+=("${commit_cases[@]}")
kmod_cases=("${cases[@]}" commit commit-no-access commit-global-only)
dax_size=$((4 << 20))
guest_port=18800
host_port=18801
secs=120

overlay=$WORK/overlay
mkdir -p "$overlay/test"
userspace=${SROCE_VM_USERSPACE:-}
if [[ -n $userspace ]]; then
	libdir=/usr/lib/x86_64-linux-gnu
	shim=/src/build/libibverbs-ext/shim/libsroce.so.0
	[[ -x $userspace/src/build/tests/progs/a19_check && -e $userspace$shim ]] ||
		die "no a19_check or libsroce.so.0 built in $userspace/src/build"
	vm_add_root_userspace "$overlay" "$userspace" userspace /src/build/tests/progs/a19_check "$shim" \
		"$libdir/libibverbs/librxe-rdmav34.so"
	mkdir -p "$overlay/userspace/etc/libibverbs.d"
	cp "$userspace/etc/libibverbs.d/rxe.driver" "$overlay/userspace/etc/libibverbs.d/"
	ga19="chroot /userspace /src/build/tests/progs/a19_check"
	log "guest user space: $(cat "$userspace/etc/debian_version" 2>/dev/null) from $userspace, $(chroot "$userspace" dpkg-query -W libibverbs1 2>/dev/null)"
else
	vm_add_program "$overlay" "$a19"
	shim=/usr/lib/sroce/libsroce.so.0
	vm_add_program "$overlay" "$BUILD_DIR/libibverbs-ext/shim/libsroce.so.0" "$shim"
	ga19=a19_check
fi
kmod=${SROCE_TEST_RXE_KMOD:-}
kmod_port=18802
[[ -z $kmod ]] || cp "$kmod" "$overlay/test/a19_kmod.ko"
{
	echo ". /etc/guest-lib.sh"
	echo "failed=0"
	echo "rdma link add rxe0 type rxe netdev eth0 || exit 100"
	echo "GID=\$(roce_gid_index rxe0) || exit 101"
	echo "mark \"GID \$GID\""
	echo "step rxe_taint 10 cat /sys/module/rdma_rxe/taint"
	echo "step commit_caps 10 cat /sys/class/infiniband/rxe0/commit_caps"
	echo "step dax 60 ndctl create-namespace -f -e namespace0.0 -m devdax || exit 102"
	[[ -z $userspace ]] || vm_chroot_setup userspace
	echo "export LD_PRELOAD=$shim"
	echo "attempt guest server $guest_port 300 $ga19 --server -a $guest_ip -p $guest_port" \
		"--pmem /dev/dax0.0 --size $dax_size --connections ${#host_cases[@]} || failed=\$((failed + 1))"
	for c in "${guest_cases[@]}"; do
		echo "attempt host guest_$c $host_port $secs $ga19 -p $host_port --case $c $host_ip"
	done
	if [[ -n $kmod ]]; then
		echo "attempt host kmod $kmod_port $secs insmod /test/a19_kmod.ko server=$host_ip port=$kmod_port"
		echo "step kmod_log 10 sh -c 'dmesg | grep a19_kmod'"
	fi
	echo "exit \$failed"
} >"$overlay/test/run.sh"
vm_initrd "$overlay"

start_all=$SECONDS
vm_start_nvdimm "$ns" "$guest_ip"
vm_wait 'GID ' 120 || {
	vm_dump >&2
	die "the guest did not bring up rxe0"
}
vm_wait 'DONE commit_caps rc=' 30 || true
echo "guest ($kver) up with rxe0 in $((SECONDS - start_all)) s; rdma_rxe taint: $(vm_step_output rxe_taint); commit_caps: $(vm_step_output commit_caps)"
if [[ -n $native ]]; then
	if [[ $(vm_step_output commit_caps) == 0xf ]]; then
		pass "rxe0 reports write-commits in sysfs: commit_caps 0xf"
	else
		fail "rxe0's commit_caps: '$(vm_step_output commit_caps)', expected 0xf"
	fi
fi
if [[ -n ${SROCE_VM_MODULES:-} ]]; then
	if [[ $(vm_step_output rxe_taint) == *O* ]]; then
		pass "the guest runs the patched rdma_rxe"
	else
		fail "the guest's rdma_rxe is not the patched module"
	fi
fi

host_run() { vm_in_ns timeout -k 5 "$secs" "$SROCE_BIN" exec -- "$@"; }
# What each case prints when it passes.
declare -A expect=(
	[ops]='ops: 4 FLUSH kinds and ATOMIC WRITE checked'
	[no-flush-access]='no-flush-access: remote access error as expected'
	[no-persistent-access]='no-persistent-access: remote access error as expected'
	[misaligned-atomic-write]='misaligned-atomic-write: remote invalid request error as expected'
	[commit]='commit: 5 write-commits (persistent) checked'
	[commit-no-access]='commit-no-access: remote access error as expected'
	[commit-global-only]='commit-global-only: remote access error as expected'
	# sroce (commits reach any peer) sends the IBTA sequence; a kernel rxe
	# with native write-commits only refuses to post (refused_rxe).
	[commit-refused]='commit-refused: IBTA sequences'
)
refused_rxe='commit-refused: ibv_wr_complete EOPNOTSUPP, nothing posted, the QP goes on'
# What ECE must have agreed on between sroce and this guest's rxe.
if [[ -n $native ]]; then
	want_ece='ECE: native write-commits'
else
	want_ece='ECE: IBTA sequences'
fi

# --- 1. sroce initiator, rxe target ----------------------------------------------
if vm_wait "(NOT)?READY server" 200 && [[ $(vm_marker "(NOT)?READY server") == "READY server" ]]; then
	for c in "${host_cases[@]}"; do
		rc=0
		SROCE_STATS=1 host_run "$a19" -p "$guest_port" --case "$c" "$guest_ip" >"$WORK/h-$c.log" 2>&1 || rc=$?
		if [[ $c == commit* ]] && ! grep -qF "$want_ece" "$WORK/h-$c.log"; then
			fail "sroce -> rxe $c: the connection did not agree on '$want_ece'" "$(cat "$WORK/h-$c.log")"
		elif [[ $rc == 0 ]] && grep -qF "${expect[$c]}" "$WORK/h-$c.log"; then
			how=''
			[[ $c != commit* ]] || how=" ($want_ece)"
			pass "sroce -> rxe $c: $(grep -F "${expect[$c]}" "$WORK/h-$c.log" | sed 's/^a19_check client: //')$how"
		else
			fail "sroce -> rxe $c: exit $rc" "$(cat "$WORK/h-$c.log")"
		fi
		if [[ $flush_form == ibta ]] && grep -q 'tx_flush_legacy_icrc [1-9]' "$WORK/h-$c.log"; then
			fail "sroce -> rxe $c: sroce sent FLUSHes in the non-IBTA form to a patched rxe"
		fi
	done
	vm_wait 'DONE server rc=' 60 || true
	vrc=$(vm_marker 'DONE server rc=' | sed -n 's/.*rc=//p')
	imms=$(vm_step_output server | sed -n 's/.*: \([0-9]*\) immediate completions$/\1/p')
	if [[ $imms == 2 ]] && ! vm_step_output server | grep -q 'receive completion'; then
		pass "rxe target: the 2 immediate data of the write-commits completed as IBV_WC_RECV_RDMA_WITH_IMM, byte_len 0"
	else
		fail "rxe target: ${imms:-no} immediate completions of write-commits, expected 2" "$(vm_step_output server)"
	fi
	if [[ $vrc == 0 ]]; then
		pass "rxe target served ${#host_cases[@]} connections, region A on device DAX"
	else
		fail "rxe target (a19_check --server) exited ${vrc:-none}" "$(vm_step_output server)"
	fi
else
	fail "the guest's a19_check server did not listen" "$(vm_step_output server)"
fi

# --- 2. rxe initiator, sroce target ---------------------------------------------
truncate -s $((1 << 20)) "$WORK/target.pm"
for c in "${guest_cases[@]}"; do
	if ! vm_wait "WAIT guest_$c" 120; then
		fail "rxe -> sroce $c: the guest did not reach it"
		continue
	fi
	SROCE_STATS=1 vm_host_server "$WORK/s-$c.log" "$secs" "$a19" --server -a "$host_ip" \
		-p "$host_port" --pmem "$WORK/target.pm" --size $((1 << 20))
	spid=$VM_SERVER_PID
	vm_send "go-guest_$c" || true
	vm_wait "DONE guest_$c rc=" "$secs" || true
	grc=$(vm_marker "DONE guest_$c rc=" | sed -n 's/.*rc=//p')
	out=$(vm_step_output "guest_$c")
	# What the guest's libibverbs can post must have been done: ops always
	# has ATOMIC WRITE (rdma-core >= 44), the error cases their own line.
	done_line=${expect[$c]%% *}
	[[ $c == ops && -z $userspace ]] && done_line='ATOMIC WRITE: IBV_WC_ATOMIC_WRITE, 8 bytes read back intact'
	[[ $c == ops && -n $userspace ]] && done_line=${expect[ops]}
	if [[ $c == commit* ]] && ! grep -qF "$want_ece" <<<"$out"; then
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		fail "rxe -> sroce $c: the connection did not agree on '$want_ece'" "$out"
	elif [[ $c == commit-refused ]] && ! grep -qF "$refused_rxe" <<<"$out"; then
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		fail "rxe -> sroce $c: the kernel device did not refuse a write-commit to a peer without native ones" "$out"
	elif [[ $c == commit ]] && ! grep -q 'connection 1: 2 immediate completions' "$WORK/s-$c.log"; then
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		fail "rxe -> sroce commit: the sroce target did not get the 2 immediate data" "$out
$(cat "$WORK/s-$c.log")"
	elif [[ $grc == 0 ]] && grep -qF "$done_line" <<<"$out"; then
		srv=0
		wait "$spid" || srv=$?
		last=$(grep -E 'ops:|as expected|write-commits .* checked|commit-refused:' <<<"$out" | tail -n 1 | sed 's/^a19_check client: //')
		[[ $c != commit* ]] || last="$last ($want_ece)"
		[[ $c != commit ]] || last="$last; the sroce target got the 2 immediate data after them"
		if [[ $c == ops ]] && grep -q 'cannot post FLUSH' <<<"$out"; then
			last="$last (this libibverbs posts no FLUSH)"
		fi
		# Which form of rxe's FLUSHes sroce took: the kernel's own
		# (before the fix) or IBTA's.
		legacy_rx=$(sed -n 's/.*rx_flush_legacy_icrc \([0-9]*\).*/\1/p' "$WORK/s-$c.log" | head -n 1)
		if [[ -n $userspace && $c == ops ]]; then
			if [[ -n ${SROCE_VM_MODULES:-} ]] && [[ ${legacy_rx:-x} != 0 ]]; then
				fail "rxe -> sroce ops: sroce took ${legacy_rx:-no count of} FLUSHes in rxe's legacy form from a fixed rxe" "$(cat "$WORK/s-$c.log")"
			elif [[ -z ${SROCE_VM_MODULES:-} ]] && ! ((${legacy_rx:-0} > 0)); then
				fail "rxe -> sroce ops: sroce took no FLUSH in rxe's legacy form (rx_flush_legacy_icrc ${legacy_rx:-missing})" "$(cat "$WORK/s-$c.log")"
			else
				last="$last; sroce took $legacy_rx FLUSHes in rxe's legacy ICRC form"
			fi
		fi
		if ((srv == 0)); then
			pass "rxe -> sroce $c: $last"
		else
			fail "rxe -> sroce $c: the sroce target exited $srv" "$(cat "$WORK/s-$c.log")"
		fi
	elif [[ $grc == 77 && -z $userspace ]] && grep -q 'cannot post FLUSH' <<<"$out"; then
		# Nothing connected: the server still waits.
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		pass "rxe -> sroce $c: not run - the guest's libibverbs cannot post FLUSH (rdma-core 44), as a19_check reports"
	else
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		fail "rxe -> sroce $c: guest exit ${grc:-none}" "$out
$(cat "$WORK/s-$c.log")"
	fi
done

# --- 3. a kernel consumer on rxe, sroce target ----------------------------------
if [[ -n $kmod ]]; then
	if vm_wait "WAIT kmod" 120; then
		vm_host_server "$WORK/s-kmod.log" "$secs" "$a19" --server -a "$host_ip" -p "$kmod_port" \
			--pmem "$WORK/target.pm" --size $((1 << 20)) --connections ${#kmod_cases[@]}
		spid=$VM_SERVER_PID
		vm_send "go-kmod" || true
		vm_wait "DONE kmod_log rc=" "$secs" || true
		krc=$(vm_marker "DONE kmod rc=" | sed -n 's/.*rc=//p')
		klog=$(vm_step_output kmod_log)
		srv=0
		wait "$spid" || srv=$?
		if [[ $krc == 0 && $srv == 0 ]] && grep -q "a19_kmod: ${#kmod_cases[@]} cases, 0 failed" <<<"$klog"; then
			pass "kernel consumer on rxe -> sroce: $(grep -c 'as expected\|read back intact' <<<"$klog") checks: $(grep -o 'ops: [0-9]* FLUSH kinds and ATOMIC WRITE checked' <<<"$klog"), $(grep -o 'commit: [0-9]* write-commits ([a-z ]*) checked' <<<"$klog"), and the errors"
			grep -o 'a19_kmod: .*' <<<"$klog" | while read -r line; do echo "  $line"; done
		else
			fail "kernel consumer on rxe -> sroce: insmod exited ${krc:-none}, sroce target $srv" \
				"$(vm_step_output kmod; echo "$klog"; cat "$WORK/s-kmod.log")"
		fi
	else
		fail "kernel consumer: the guest did not reach it"
	fi
fi

vm_finish 60
# --- the wire: every FLUSH's ICRC, and which form each side used ------------------
if [[ -n $pcap ]]; then
	rc=0
	vm_wire_check --flush-forms "$pcap" "$host_ip" "$guest_ip" || rc=$?
	if ((rc == 0)); then
		forms=$(vm_flush_forms)
		legacy=$(sed -n 's/^flush .*legacy=\([0-9]*\)$/\1/p' "$WORK/check.log" | paste -sd+ | bc)
		# Native write-commit packets (opcodes 0xc0-0xc5) each side sent.
		sroce_commits=$(vm_wire_ops sroce '^0xc[0-5]$')
		rxe_commits=$(vm_wire_ops rxe '^0xc[0-5]$')
		if [[ $flush_form == ibta ]] && ((legacy > 0)); then
			fail "wire: FLUSHes in the non-IBTA form with a patched rxe ($forms)"
		elif [[ -n $native ]] && ((sroce_commits == 0 || rxe_commits == 0)); then
			fail "wire: native write-commits: $sroce_commits packets from sroce, $rxe_commits from rxe; expected both" "$(cat "$WORK/check.log")"
		elif [[ -z $native ]] && ((sroce_commits + rxe_commits > 0)); then
			fail "wire: native write-commit opcodes with an rxe that has none ($sroce_commits from sroce, $rxe_commits from rxe)" "$(cat "$WORK/check.log")"
		else
			forms="$forms; native write-commit packets (0xC0-0xC5): $sroce_commits from sroce, $rxe_commits from rxe"
			pass "wire: every ICRC recomputed by scapy; FLUSH forms: $forms"
		fi
	elif ((rc == 1)); then
		fail "wire check (roce_peer_check.py --flush-forms)" "$(cat "$WORK/check.log")"
	fi
fi
echo "guest exited $VM_RC after ${VM_SECONDS}s; whole test $((SECONDS - start_all)) s"
if ((CHECKS_FAILED)); then
	vm_console | grep -E '^\[ *[0-9]+\.[0-9]+\]' | tail -n 30 | sed 's/^/  guest kernel: /'
fi
finish
