#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# sroce against a real kernel peer: Linux rxe (rdma_rxe in Debian's kernel,
# booted under qemu with software emulation) on the far side of a tap
# device.  The tap, qemu and the host-side programs all live in a network
# namespace created here; the host end of the tap is 10.201.0.1 (sroce0),
# the guest's eth0 10.201.0.2 (rxe0).
#
# Every case runs once with the rxe side as the server and once with sroce
# as the server: ibv_rc_pingpong, sroce_xfer (tests/progs: a seeded random
# mix of RC operations with every byte checked, plain libibverbs), then
# perftest's ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw.  Both
# programs of every pair must exit 0.  This checks sroce's ICRC
# verification of rxe's packets (whose IP ID is a hash sroce cannot see),
# rxe's verification of sroce's, and the RC protocol of each against the
# other.
#
# Then rdma_cm, the sroce agent's IB CM against the kernel's (cm.c, cma.c)
# over QP1, each way: rping -v -V (every ping's data compared), ucmatose,
# ib_write_bw -R and cmtime, whose connection set-up times (100 connections;
# also of rxe connecting to itself inside the guest) are printed, not
# checked: under software emulation they are noise-bound.
#
# Usage: test_rxe_interop.sh BUILD-DIR
# Exits 77 without root, /dev/net/tun, qemu or the Debian kernel packages
# (scripts/setup.sh installs them).  The RoCEv2 traffic on the tap is
# captured (dumpcap, from tshark) and checked by tests/vm/roce_peer_check.py:
# scapy recomputes ICRCs from both sides, rxe must have sent packets with
# hashed IP IDs, and sroce segments of multi-packet sends (IP ID > 0: the
# segmentation-offload convention, wire-protocol.md §1.1, reaching rxe).
# SROCE_VM_CAPTURE=FILE keeps that capture in FILE.
#
# ctest: TIMEOUT=420 LABELS=vm,netns PROCESSORS=2 RESOURCE_LOCK=vm-10.201
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_interop.sh BUILD-DIR}"
# The guest's script takes about a minute under software emulation: room
# for a busy host, within ctest's TIMEOUT.
: "${VM_TIMEOUT:=300}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"
# shellcheck source=../vm/pairs.sh
. "$here/../vm/pairs.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip ss timeout ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw \
	rping ucmatose cmtime
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
vm_init "$BUILD_DIR"

ns=sroce-rxe-$$
host_ip=10.201.0.1
guest_ip=10.201.0.2
conf=$WORK/links.conf

vm_cleanup_on_exit

in_ns() { vm_in_ns "$@"; }

vm_tap_ns "$ns" "$host_ip" "$conf" || skip "$VM_ERR"
export SROCE_CONFIG=$conf
# The namespace's agent (QP1 and the CM) lives as long as the test, so that
# its counters at the end cover every case.
in_ns "$SROCE_BIN" agent start --idle-exit 0 --log "$WORK/agent.log" ||
	die "the sroce agent did not start in the namespace"

# The tap carries the IPv4 headers exactly as sent, so a capture there lets
# scapy recompute every ICRC, IP ID included (roce_peer_check.py).
pcap=
python=$(scapy_python)
if [[ -z $python ]]; then
	log "python3-scapy missing: the wire check is skipped"
elif vm_capture_start "${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}"; then
	pcap=${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}
else
	log "$VM_ERR: the wire check is skipped"
fi

# The cases (pairs.sh): @GID@ is the guest's RoCE v2 IPv4 GID index;
# sroce's IPv4 GID is index 1.
pt="-F -s 65536 -n 100"
PAIRS_CASES=(
	"pingpong_rxe_server|guest|ibv_rc_pingpong -d rxe0 -g @GID@ -p @PORT@|ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@ $guest_ip|"
	"pingpong_sroce_server|host|ibv_rc_pingpong -d rxe0 -g @GID@ -p @PORT@ $host_ip|ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@|"
)
# sroce_xfer: a seeded random mix of RC operations, every byte checked, on
# plain libibverbs (so it runs on rxe unchanged).
xfer=$BUILD_DIR/tests/progs/sroce_xfer
xfer_iters=${SROCE_TEST_XFER_ITERS:-400}
seed=${SROCE_TEST_XFER_SEED:-$$}
if [[ -x $xfer ]]; then
	xargs_client="-n $xfer_iters --seed $seed --depth 8"
	PAIRS_CASES+=(
		"xfer_rxe_server|guest|sroce_xfer -d rxe0 -g @GID@ -p @PORT@|$xfer -d sroce0 -g 1 -p @PORT@ $xargs_client $guest_ip|xfer"
		"xfer_sroce_server|host|sroce_xfer -d rxe0 -g @GID@ -p @PORT@ $xargs_client $host_ip|$xfer -d sroce0 -g 1 -p @PORT@|xfer"
	)
	echo "sroce_xfer: $xfer_iters operations each way, seed $seed"
else
	log "$xfer not built: the sroce_xfer cases are skipped"
fi
for bw in ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw; do
	args=$pt
	[[ $bw == ib_atomic_bw ]] && args="-F -n 200"
	PAIRS_CASES+=(
		"${bw}_rxe_server|guest|$bw -d rxe0 -x @GID@ $args -p @PORT@|$bw -d sroce0 -x 1 $args -p @PORT@ $guest_ip|"
		"${bw}_sroce_server|host|$bw -d rxe0 -x @GID@ $args -p @PORT@ $host_ip|$bw -d sroce0 -x 1 $args -p @PORT@|"
	)
done
# rdma_cm: the same programs on both sides; which address a program is
# given decides its role.
pings=10
rdma_cm_cases=(
	"rping|rping -s -a @SERVER@ -p @PORT@ -C $pings -v -V|rping -c -a @SERVER@ -p @PORT@ -C $pings -v -V|rping:$pings"
	"ucmatose|ucmatose -b @SERVER@ -p @PORT@|ucmatose -s @SERVER@ -p @PORT@|ucmatose"
	"ib_write_bw_R|ib_write_bw -d @DEV@ -x @GIDX@ -R $pt -p @PORT@|ib_write_bw -d @DEV@ -x @GIDX@ -R $pt -p @PORT@ @SERVER@|perftest_R"
	"cmtime|cmtime -b @SERVER@ -p @PORT@|cmtime -s @SERVER@ -p @PORT@ -c $PAIRS_CMTIME_CONNS|cmtime"
)
# cm_side CMD SERVER DEV GID: CMD for one side, with the server's address and
# this side's device.
cm_side() {
	local c=${1//@SERVER@/$2}
	c=${c//@DEV@/$3}
	echo "${c//@GIDX@/$4}"
}
for c in "${rdma_cm_cases[@]}"; do
	IFS='|' read -r name server client kind <<<"$c"
	PAIRS_CASES+=(
		"${name}_rxe_server|guest|$(cm_side "$server" "$guest_ip" rxe0 @GID@)|$(cm_side "$client" "$guest_ip" sroce0 1)|$kind"
		"${name}_sroce_server|host|$(cm_side "$client" "$host_ip" rxe0 @GID@)|$(cm_side "$server" "$host_ip" sroce0 1)|$kind"
	)
done

# The guest's script: one case after another, in order, each waiting for
# the host where the host's server has to be up first (guest-lib.sh's
# tries), then cmtime with rxe as both server and client: the kernel's
# rdma_cm refuses loopback addresses, but connects to its own eth0 address.
alone_port=18600
alone=cmtime_rxe_alone
mkdir -p "$WORK/overlay/test"
# shellcheck disable=SC2016 # the guest's shell expands these
{
	echo '. /etc/guest-lib.sh'
	echo 'rdma link add rxe0 type rxe netdev eth0 || exit 100'
	echo 'GID=$(roce_gid_index rxe0) || { echo "rxe0 has no RoCE v2 IPv4 GID"; exit 101; }'
	echo 'mark "GID $GID"'
	echo 'failed=0'
	pairs_guest_script | sed 's/@GID@/$GID/g'
	echo "local_pair $alone $alone_port $PAIRS_SECS 'cmtime -b $guest_ip -p $alone_port'" \
		"cmtime -s $guest_ip -p $alone_port -c $PAIRS_CMTIME_CONNS || failed=\$((failed + 1))"
	echo 'cm_counters rxe0'
	echo 'exit $failed'
} >"$WORK/overlay/test/run.sh"
[[ -x $xfer ]] && vm_add_program "$WORK/overlay" "$xfer"
vm_initrd "$WORK/overlay"

start_all=$SECONDS
vm_start --ns "$ns" --append "guest.ip=$guest_ip/24" -- "${VM_NET[@]}"
if ! vm_wait 'GID ' 120; then
	vm_dump >&2
	die "the guest did not bring up rxe0"
fi
boot_secs=$((SECONDS - start_all))
gid=$(vm_marker 'GID ' | awk '{print $2}')
echo "guest up with rxe0 in $boot_secs s; rxe0 RoCE v2 IPv4 GID index $gid"
in_ns "$SROCE_BIN" link show

pairs_run

# rxe on its own: both cmtimes in the guest.
vm_wait "DONE $alone rc=" $((PAIRS_SECS + 30)) || true
vm_step_output "$alone" >"$WORK/$alone.log"
grc=$(vm_marker "DONE $alone rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
bad=
[[ $grc == 0 ]] && bad=$(pairs_kind_check cmtime /dev/null /dev/null "$WORK/$alone.log")
if [[ $grc == 0 && -z $bad ]]; then
	PAIRS_RESULTS[$alone]=$(pairs_summary "$WORK/$alone.log")
	pass "$alone: ${PAIRS_RESULTS[$alone]}"
else
	fail "$alone: cmtime in the guest exited ${grc:-none} ${bad:+($bad)}"
	sed 's/^/  /' "$WORK/$alone.log"
fi
echo "rdma_cm connection set-up, cmtime -c $PAIRS_CMTIME_CONNS (server cmtime -b SERVER, client cmtime -s SERVER):"
for r in cmtime_sroce_server:"sroce server, rxe client" cmtime_rxe_server:"rxe server, sroce client" \
	"$alone:rxe server and client (the guest alone)"; do
	echo "  ${r#*:}: ${PAIRS_RESULTS[${r%%:*}]:-failed}"
done
# Retransmissions (each after seconds of waiting) and duplicates mean a
# message went unanswered: shown, not checked, as a busy host may cause
# them.  A QP1 packet or MAD of the kernel's that the agent dropped is an
# error of one side or the other.
vm_wait 'CM-COUNTERS' 30 || true
echo "kernel CM, retransmitted and duplicate messages: $(vm_marker CM-COUNTERS | cut -d' ' -f2-)"
agent=$(in_ns "$SROCE_BIN" -j agent status 2>&1)
counter() { grep -o "\"$1\":[0-9]*" <<<"$agent" | head -n 1 | cut -d: -f2; }
echo "sroce agent CM: $(counter tx_mads) MADs sent, $(counter retries) of them retransmissions," \
	"$(counter rx_mads) received"
if [[ $(counter rx_gsi_dropped) == 0 && $(counter rx_bad_mads) == 0 ]]; then
	pass "QP1: the sroce agent took every packet and MAD the kernel sent"
else
	fail "QP1: the sroce agent dropped packets ($(counter rx_gsi_dropped)) or MADs ($(counter rx_bad_mads)) from the kernel"
	echo "  agent status: $agent"
fi

vm_finish 60
if [[ -n $pcap ]]; then
	vm_capture_stop
	if "$python" "$here/../vm/roce_peer_check.py" --require-segmented "$pcap" "$host_ip" \
		"$guest_ip" >"$WORK/check.log" 2>&1; then
		pass "wire check: rxe and sroce ICRCs recomputed by scapy"
	else
		fail "wire check (roce_peer_check.py)"
	fi
	sed 's/^/  /' "$WORK/check.log"
fi
vm_report "$start_all" "boot $boot_secs s"
finish
