#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The libfabric provider pmof on a kernel RNIC, and between sroce and it:
# Linux rxe (rdma_rxe of a Debian kernel >= 6.2, whose rxe executes IBTA
# FLUSH) in the qemu guest, behind a tap in a network namespace created
# here (host sroce0 10.203.0.1, guest rxe0 10.203.0.2), with an emulated
# NVDIMM the guest switches to device DAX (/dev/dax0.0).
#
# The guest's libibverbs is Debian 12's (rdma-core 44), which cannot post a
# FLUSH: there pmof is a persistence *target* only.  Checked:
#
#   1. fi_info in the guest: no FI_RMA_PMEM for an application that writes
#      (never pretend), FI_RMA_PMEM for one that asks FI_REMOTE_WRITE only.
#   2. pmof_fabtest msg and rdm with both ends on rxe0: everything that is
#      not persistence passes on a kernel device; the persistence tests see
#      a target-only domain.
#   3. fi_pingpong -p pmof -c, msg, rdm and rdm with tagged messages, rxe
#      server and sroce client.
#   4. fi_remote_log (docs/examples): sroce initiator, rxe target whose log
#      is the device DAX registered FI_PMEM.  The commits travel as IBTA
#      WRITE + FLUSH (the kernel agrees no native commit).  This rxe takes
#      FLUSH only with its own, non-standard ICRC (see below): sroce learns
#      that, every record is committed, and the log verified in the guest
#      holds all of them.  The capture on the tap, checked by scapy, shows
#      sroce's FLUSHes in both forms and rxe answering.
#   5. fi_remote_log --manual with the initiator on rxe and the target on
#      sroce: FI_COMMIT_MANUAL works over any device, the kernel's included.
#
# With SROCE_VM_MODULES=DIR (tests/vm/build_guest.sh) the guest runs the
# RDMA modules of DIR, rxe-patches/ applied (test_rxe_patches.sh): its rxe
# then takes FLUSH with IBTA's ICRC, and sections 4 and the wire check
# expect that form and no other (SROCE_TEST_RXE_FLUSH_FORM=ibta; the
# default, legacy, is what an unpatched rxe needs).
#
# Usage: test_pmof_rxe.sh BUILD-DIR
# Skips (77) without root, /dev/net/tun, qemu, a Debian kernel >= 6.2
# (scripts/setup.sh installs linux-image-6.12-amd64), or libfabric-bin; the
# wire check needs tshark and scapy.
# SROCE_VM_CAPTURE=FILE keeps the capture of the tap in FILE.
#
# ctest: TIMEOUT=900 LABELS=vm,netns PROCESSORS=2 RESOURCE_LOCK=vm-10.203
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_pmof_rxe.sh BUILD-DIR}"
# pmof_fabtest on a kernel device under software emulation takes minutes.
: "${VM_TIMEOUT:=780}"
: "${VM_MEM:=1G}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip ss timeout fi_info fi_pingpong
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
fabtest=$BUILD_DIR/tests/fabric/pmof_fabtest
rlog=$BUILD_DIR/tests/compile/fi_remote_log
prov=$BUILD_DIR/libfabric-glue/libpmof-fi.so
for f in "$fabtest" "$rlog" "$prov"; do [[ -e $f ]] || die "$f is not built"; done
vm_init "$BUILD_DIR"
kver=$(cat "$VM_GUEST/kernel-version")
vm_require_rxe_flush

ns=sroce-pmofrxe-$$
host_ip=10.203.0.1
guest_ip=10.203.0.2
vm_cleanup_on_exit
in_ns() { vm_in_ns "$@"; }

export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue FI_PROVIDER=pmof
vm_sroce_ns "$ns" "$host_ip"
# The RoCE traffic on the tap, to see what the commits became on the wire.
vm_capture_or_not "${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}"
pcap=$VM_PCAP

# 4 MiB of the device DAX (two of its 2 MiB pages): rxe's FLUSH of a whole
# region writes back each of its cache lines.
dax_size=$((4 << 20))
records=${SROCE_TEST_PMOF_RXE_RECORDS:-200}
flush_form=${SROCE_TEST_RXE_FLUSH_FORM:-legacy}
[[ $flush_form == legacy || $flush_form == ibta ]] ||
	die "SROCE_TEST_RXE_FLUSH_FORM must be legacy or ibta, not '$flush_form'"
pp_port=18700
pp_rdm_port=18701
pp_tagged_port=18704
rlog_port=18702
manual_port=18703
step_secs=600

overlay=$WORK/overlay
mkdir -p "$overlay/test" "$overlay/usr/lib/pmof"
vm_add_program "$overlay" "$prov" /usr/lib/pmof/libpmof-fi.so
for p in "$fabtest" "$rlog" "$(command -v fi_info)" "$(command -v fi_pingpong)"; do
	vm_add_program "$overlay" "$p"
done
# The guest's script; the host answers on the control line (guest-lib.sh).
cat >"$overlay/test/run.sh" <<EOF
. /etc/guest-lib.sh
export FI_PROVIDER_PATH=/usr/lib/pmof FI_PROVIDER=pmof IPATH_NO_BACKTRACE=1
failed=0
rdma link add rxe0 type rxe netdev eth0 || exit 100
step rxe_taint 10 cat /sys/module/rdma_rxe/taint
GID=\$(roce_gid_index rxe0) || { echo "rxe0 has no RoCE v2 IPv4 GID"; exit 101; }
mark "GID \$GID"
step dax 60 ndctl create-namespace -f -e namespace0.0 -m devdax || exit 102
step info_writer 60 fi_info -p pmof -t FI_EP_MSG -c 'FI_RMA|FI_WRITE' -v
step info_target 60 fi_info -p pmof -t FI_EP_MSG -c 'FI_RMA|FI_REMOTE_WRITE' -v
step fabtest_msg $step_secs pmof_fabtest -p pmof -e msg -a $guest_ip || failed=\$((failed + 1))
step fabtest_rdm $step_secs pmof_fabtest -p pmof -e rdm -a $guest_ip || failed=\$((failed + 1))
attempt guest pingpong_msg $pp_port 120 fi_pingpong -p pmof -e msg -c -I 10 -B $pp_port || failed=\$((failed + 1))
attempt guest pingpong_rdm $pp_rdm_port 120 fi_pingpong -p pmof -e rdm -c -I 10 -B $pp_rdm_port || failed=\$((failed + 1))
attempt guest pingpong_tagged $pp_tagged_port 120 fi_pingpong -p pmof -e rdm -m tagged -c -I 10 -B $pp_tagged_port || failed=\$((failed + 1))
attempt guest rlog $rlog_port 300 fi_remote_log --server -a $guest_ip -p $rlog_port --file /dev/dax0.0 --size $dax_size || failed=\$((failed + 1))
step rlog_verify 60 fi_remote_log --verify /dev/dax0.0 --size $dax_size || failed=\$((failed + 1))
attempt host rlog_manual $manual_port 300 fi_remote_log --manual -a $host_ip -p $manual_port -n $records || failed=\$((failed + 1))
exit \$failed
EOF
vm_initrd "$overlay"

start_all=$SECONDS
vm_start_nvdimm "$ns" "$guest_ip"
if ! vm_wait 'GID ' 120; then
	vm_dump >&2
	die "the guest did not bring up rxe0"
fi
echo "guest ($kver) up with rxe0 in $((SECONDS - start_all)) s"

host_run() { in_ns timeout -k 5 "$step_secs" "$SROCE_BIN" exec -- "$@"; }
# guest_rc NAME: the exit status the guest reported for step NAME.
guest_rc() {
	vm_wait "DONE $1 rc=" "${2:-$step_secs}" || true
	local rc
	rc=$(vm_marker "DONE $1 rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	echo "${rc:-none}"
}
# guest_server NAME HOST-CMD...: the guest's server NAME is up; runs the
# host's client; sets hrc and grc.
guest_server() {
	local name=$1
	shift
	hrc=none grc=none
	if ! vm_wait "(NOT)?READY $name|DONE $name rc=" 200 ||
		[[ $(vm_marker "(NOT)?READY $name|DONE $name rc=") != "READY $name" ]]; then
		grc=$(guest_rc "$name" 10)
		return
	fi
	hrc=0
	host_run "$@" >"$WORK/$name.host.log" 2>&1 || hrc=$?
	((hrc == 0)) || vm_send "abort-$name" || true
	grc=$(guest_rc "$name")
}
# fabtest_check NAME: pmof_fabtest's TAP output from the guest.
fabtest_check() {
	local name=$1 rc out
	rc=$(guest_rc "$name")
	out=$(vm_step_output "$name")
	local ok notok skipped
	ok=$(grep -c '^ok ' <<<"$out")
	notok=$(grep -c '^not ok ' <<<"$out")
	skipped=$(grep -c '^ok .* # skip' <<<"$out")
	if [[ $rc == 0 ]] && ((notok == 0 && ok > 40)); then
		pass "$name on rxe0: $((ok - skipped)) passed, $skipped skipped"
		grep '# skip' <<<"$out" | sed 's/^/  /'
	else
		fail "$name on rxe0: exit $rc, $notok failed" "$(grep -v '^ok ' <<<"$out")"
	fi
}

# --- 1. fi_info: what rxe under Debian 12's libibverbs offers -----------------
# fi_info takes every mode, so FI_COMMIT_MANUAL's form (with FI_RMA_PMEM:
# its target persists) follows the transport's own, which must not have it.
rc=$(guest_rc info_writer)
out=$(vm_step_output info_writer)
first=$(awk '/^fi_info:/ { n++ } n == 1' <<<"$out")
if [[ $rc == 0 ]] && grep -q 'prov_name: pmof' <<<"$first" && ! grep -q 'FI_RMA_PMEM' <<<"$first"; then
	pass "fi_info on rxe0 for a writer: pmof without FI_RMA_PMEM (this libibverbs cannot post FLUSH)"
else
	fail "fi_info on rxe0 for a writer (exit $rc)" "$out"
fi
rc=$(guest_rc info_target)
out=$(vm_step_output info_target)
first=$(awk '/^fi_info:/ { n++ } n == 1' <<<"$out")
if [[ $rc == 0 ]] && grep -q '^    caps: .*FI_RMA_PMEM' <<<"$first" && ! grep -q '^    caps: .*FI_WRITE[ ,]' <<<"$first"; then
	pass "fi_info on rxe0 for a target (FI_REMOTE_WRITE): pmof with FI_RMA_PMEM"
else
	fail "fi_info on rxe0 for a target (exit $rc)" "$out"
fi

# --- 2. pmof_fabtest on rxe0 ------------------------------------------------
fabtest_check fabtest_msg
fabtest_check fabtest_rdm

# --- 3. fi_pingpong, rxe server, sroce client ----------------------------------
# Tagged: on rxe, which gathers one entry, eager messages past the inline
# size go from send buffers, and those past 8 KiB are read by the receiver.
for ep in msg rdm tagged; do
	port=$pp_port args=(-e "$ep")
	[[ $ep == rdm ]] && port=$pp_rdm_port
	[[ $ep == tagged ]] && port=$pp_tagged_port args=(-e rdm -m tagged)
	guest_server "pingpong_$ep" fi_pingpong -p pmof "${args[@]}" -c -I 10 -P "$port" "$guest_ip"
	if [[ $hrc == 0 && $grc == 0 ]]; then
		pass "fi_pingpong -p pmof ${args[*]} -c: sroce client, rxe server: $(grep -c '^[0-9]' "$WORK/pingpong_$ep.host.log") sizes"
	else
		fail "fi_pingpong ${args[*]}: sroce client exited $hrc, rxe server $grc" \
			"$(cat "$WORK/pingpong_$ep.host.log" 2>/dev/null; vm_step_output "pingpong_$ep")"
	fi
done

# --- 4. the remote log: sroce initiator, rxe target on device DAX -------------
# Linux rxe (6.2 and later, unpatched) computes the ICRC of a FLUSH over its
# headers twice (its opcode table gives FLUSH no payload offset) and drops
# every standard FLUSH; sroce learns from the first FLUSH rxe answers that
# this peer takes its form (docs/wire-protocol.md 4.4).  A patched rxe takes
# IBTA's form, and sroce must then never send the other.  Every record must
# be committed and found in the log on the device DAX.
taint=$(vm_step_output rxe_taint)
if [[ -n ${SROCE_VM_MODULES:-} ]]; then
	if [[ $taint == *O* ]]; then
		pass "the guest runs the patched rdma_rxe (taint $taint: out of tree)"
	else
		fail "the guest's rdma_rxe is not the patched module (taint '$taint')"
	fi
fi
SROCE_STATS=1 guest_server rlog "$rlog" -a "$guest_ip" -p "$rlog_port" -n "$records"
vrc=$(guest_rc rlog_verify 90)
legacy_tx=$(sed -n 's/.* tx_flush_legacy_icrc \([0-9]*\).*/\1/p' "$WORK/rlog.host.log" | sort -n | tail -n 1)
legacy_tx=${legacy_tx:-none}
if [[ $flush_form == legacy ]]; then
	form_ok=$([[ $legacy_tx != none ]] && ((legacy_tx > 0)) && echo 1)
	form_what="$legacy_tx FLUSHes in rxe's ICRC form"
else
	form_ok=$([[ $legacy_tx == 0 ]] && echo 1)
	form_what="no FLUSH in the non-IBTA form"
fi
if [[ $hrc == 0 && $grc == 0 && $vrc == 0 && -n $form_ok ]] &&
	vm_step_output rlog_verify | grep -qx "log ok: $records records"; then
	pass "fi_remote_log to rxe ($flush_form FLUSH form): $records records committed over WRITE + FLUSH, all in the log on device DAX ($form_what)"
else
	fail "fi_remote_log to rxe: initiator exited $hrc, target $grc, --verify $vrc, FLUSHes sent in rxe's form: $legacy_tx (expected: $form_what)" \
		"$(cat "$WORK/rlog.host.log"; vm_step_output rlog; vm_step_output rlog_verify)"
fi

# --- 5. manual commits from rxe to a sroce target ---------------------------------
if vm_wait "WAIT rlog_manual" 120; then
	vm_host_server "$WORK/manual.server.log" "$step_secs" "$rlog" --server --manual -a "$host_ip" \
		-p "$manual_port" --file "$WORK/manual.log" --size $((1 << 20))
	spid=$VM_SERVER_PID
	vm_send go-rlog_manual || true
	grc=$(guest_rc rlog_manual)
	# The target serves one connection and exits when it ends.
	srv=0
	wait "$spid" || srv=$?
	v=$("$rlog" --verify "$WORK/manual.log" 2>&1)
	if [[ $grc == 0 && $srv == 0 && $v == "log ok: $records records" ]]; then
		pass "fi_remote_log --manual: $records records from rxe, persisted by the sroce target's handler"
	else
		fail "fi_remote_log --manual: rxe initiator exited $grc, sroce target $srv, verify: $v" \
			"$(vm_step_output rlog_manual; cat "$WORK/manual.server.log")"
	fi
else
	fail "fi_remote_log --manual: the guest did not reach it"
fi

vm_finish 120
# --- the wire: FLUSH (opcode 0x1C) from sroce, and rxe's answers ---------------
if [[ -n $pcap ]]; then
	vm_capture_stop
	tshark -r "$pcap" -T fields -e ip.src -e infiniband.bth.opcode 2>/dev/null >"$WORK/wire.txt"
	# An IBTA FLUSH (RC opcode 28) is answered by an RDMA READ response
	# without payload (opcode 16).
	answers=$(awk -v g="$guest_ip" '$1 == g && $2 == 16' "$WORK/wire.txt" | wc -l)
	rc=0
	vm_wire_check --flush-forms "$pcap" "$host_ip" "$guest_ip" || rc=$?
	if ((rc == 0)); then
		forms=$(sed -n 's/^flush sroce //p' "$WORK/check.log")
		legacy=$(sed -n 's/^flush sroce .*legacy=\([0-9]*\)/\1/p' "$WORK/check.log")
		rxe_legacy=$(sed -n 's/^flush rxe .*legacy=\([0-9]*\)/\1/p' "$WORK/check.log")
		if [[ $flush_form == legacy ]]; then
			form_ok=$((${legacy:-0} > 0))
		else
			form_ok=$((${legacy:-1} == 0 && ${rxe_legacy:-1} == 0))
		fi
		if ((form_ok && answers >= records)); then
			pass "wire: sroce's FLUSHes ($forms) answered $answers times by rxe; every ICRC recomputed by scapy"
		else
			fail "wire: sroce's FLUSHes $forms, $answers answered by rxe"
		fi
	elif ((rc == 1)); then
		fail "wire check (roce_peer_check.py --flush-forms)" "$(cat "$WORK/check.log")"
	fi
fi
vm_report "$start_all"
finish
