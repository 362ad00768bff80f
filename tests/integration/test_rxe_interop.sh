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
# perftest's ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw.  Both programs of every pair must exit 0.
# This checks sroce's ICRC verification of rxe's packets (whose IP ID is a
# hash sroce cannot see), rxe's verification of sroce's, and the RC
# protocol of each against the other.
#
# Usage: test_rxe_interop.sh BUILD-DIR
# Exits 77 without root, /dev/net/tun, qemu or the Debian kernel packages
# (scripts/setup.sh installs them).  The RoCEv2 traffic on the tap is
# captured (dumpcap, from tshark) and checked by tests/vm/roce_peer_check.py:
# scapy recomputes ICRCs from both sides, and rxe must have sent packets with
# hashed IP IDs.  SROCE_VM_CAPTURE=FILE keeps that capture in FILE.
#
# ctest: TIMEOUT=420 LABELS=vm,netns PROCESSORS=2
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_interop.sh BUILD-DIR}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip ss timeout ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
vm_init "$BUILD_DIR"

ns=sroce-rxe-$$
host_ip=10.201.0.1
guest_ip=10.201.0.2
conf=$WORK/links.conf
cap_pid=

kill_ns() {
	local p
	# Whatever runs inside the namespace was started by this script.
	for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
}
cleanup() {
	vm_cleanup
	[[ -n $cap_pid ]] && kill "$cap_pid" 2>/dev/null && wait "$cap_pid" 2>/dev/null
	kill_ns
	ip netns del "$ns" 2>/dev/null
	_sroce_cleanup
}
trap cleanup EXIT

in_ns() { ip netns exec "$ns" "$@"; }

ip netns add "$ns" 2>"$WORK/err" || skip "ip netns unusable: $(cat "$WORK/err")"
in_ns ip link set lo up
in_ns ip tuntap add dev tap0 mode tap 2>"$WORK/err" || skip "cannot create a tap device: $(cat "$WORK/err")"
in_ns ip addr add "$host_ip/24" dev tap0
in_ns ip link set tap0 up
in_ns "$SROCE_BIN" --config "$conf" link add sroce0 netdev tap0 addr "$host_ip" ||
	die "sroce link add sroce0 netdev tap0 addr $host_ip failed"
export SROCE_CONFIG=$conf

# The tap carries the IPv4 headers exactly as sent, so a capture there lets
# scapy recompute every ICRC, IP ID included (roce_peer_check.py).
pcap=
python=
for p in /usr/bin/python3 python3; do
	if command -v "$p" >/dev/null && "$p" -c 'import scapy.contrib.roce' 2>/dev/null; then
		python=$p
		break
	fi
done
if command -v dumpcap >/dev/null && [[ -n $python ]]; then
	pcap=${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}
	# dumpcap may write as a dropped user; -B: a 64 MiB buffer, so that no
	# burst is lost from the capture.
	chmod 1777 "$WORK"
	in_ns dumpcap -q -P -B 64 -i tap0 -f 'udp port 4791' -w "$pcap" >"$WORK/dumpcap.log" 2>&1 &
	cap_pid=$!
	for ((i = 0; i < 100; i++)); do
		grep -q "Capturing on" "$WORK/dumpcap.log" && break
		kill -0 "$cap_pid" 2>/dev/null || break
		sleep 0.1
	done
	if ! grep -q "Capturing on" "$WORK/dumpcap.log"; then
		log "no capture: $(cat "$WORK/dumpcap.log")"
		pcap=
	fi
else
	log "dumpcap or python3-scapy missing: the wire check is skipped"
fi

# name|server side|guest command|host command.  @GID@ is the guest's RoCE v2
# IPv4 GID index, @PORT@ the case's TCP port.  sroce's IPv4 GID is index 1.
pt="-F -s 65536 -n 100"
cases=(
	"pingpong_rxe_server|guest|ibv_rc_pingpong -d rxe0 -g @GID@ -p @PORT@|ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@ $guest_ip"
	"pingpong_sroce_server|host|ibv_rc_pingpong -d rxe0 -g @GID@ -p @PORT@ $host_ip|ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@"
)
# sroce_xfer: a seeded random mix of RC operations, every byte checked, on
# plain libibverbs (so it runs on rxe unchanged).
xfer=$BUILD_DIR/tests/progs/sroce_xfer
xfer_iters=${SROCE_TEST_XFER_ITERS:-400}
seed=${SROCE_TEST_XFER_SEED:-$$}
if [[ -x $xfer ]]; then
	xargs_client="-n $xfer_iters --seed $seed --depth 8"
	cases+=(
		"xfer_rxe_server|guest|sroce_xfer -d rxe0 -g @GID@ -p @PORT@|$xfer -d sroce0 -g 1 -p @PORT@ $xargs_client $guest_ip"
		"xfer_sroce_server|host|sroce_xfer -d rxe0 -g @GID@ -p @PORT@ $xargs_client $host_ip|$xfer -d sroce0 -g 1 -p @PORT@"
	)
	echo "sroce_xfer: $xfer_iters operations each way, seed $seed"
else
	log "$xfer not built: the sroce_xfer cases are skipped"
fi
for bw in ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw; do
	args=$pt
	[[ $bw == ib_atomic_bw ]] && args="-F -n 200"
	cases+=(
		"${bw}_rxe_server|guest|$bw -d rxe0 -x @GID@ $args -p @PORT@|$bw -d sroce0 -x 1 $args -p @PORT@ $guest_ip"
		"${bw}_sroce_server|host|$bw -d rxe0 -x @GID@ $args -p @PORT@ $host_ip|$bw -d sroce0 -x 1 $args -p @PORT@"
	)
done

# The guest's script: one step per case, in order, each waiting for the
# host where the host's server has to be up first.
step_secs=90
mkdir -p "$WORK/overlay/test"
# shellcheck disable=SC2016 # the guest's shell expands these
{
	echo '. /etc/guest-lib.sh'
	echo 'rdma link add rxe0 type rxe netdev eth0 || exit 100'
	echo 'GID=$(roce_gid_index rxe0) || { echo "rxe0 has no RoCE v2 IPv4 GID"; exit 101; }'
	echo 'mark "GID $GID"'
	echo 'failed=0'
	port=18515
	for c in "${cases[@]}"; do
		IFS='|' read -r name side gcmd _ <<<"$c"
		gcmd=${gcmd//@GID@/\$GID}
		gcmd=${gcmd//@PORT@/$port}
		if [[ $side == guest ]]; then
			echo "serve $name $port $step_secs $gcmd || failed=\$((failed + 1))"
		else
			echo "mark 'WAIT $name'"
			echo "if host_wait go-$name $step_secs; then step $name $step_secs $gcmd || failed=\$((failed + 1)); else mark 'DONE $name rc=125'; failed=\$((failed + 1)); fi"
		fi
		port=$((port + 1))
	done
	echo 'exit $failed'
} >"$WORK/overlay/test/run.sh"
[[ -x $xfer ]] && vm_add_program "$WORK/overlay" "$xfer"
vm_initrd "$WORK/overlay"

start_all=$SECONDS
vm_start --ns "$ns" --append "guest.ip=$guest_ip/24" -- \
	-netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,romfile=
if ! vm_wait 'GID ' 120; then
	vm_dump >&2
	die "the guest did not bring up rxe0"
fi
boot_secs=$((SECONDS - start_all))
gid=$(vm_marker 'GID ' | awk '{print $2}')
echo "guest up with rxe0 in $boot_secs s; rxe0 RoCE v2 IPv4 GID index $gid"
in_ns "$SROCE_BIN" link show

# ns_listening PORT: whether TCP PORT listens in the namespace.
ns_listening() { [[ -n $(in_ns ss -Hltn "( sport = :$1 )" 2>/dev/null) ]]; }

host_run() { in_ns timeout -k 5 "$step_secs" "$SROCE_BIN" exec -- "$@"; }

# summary NAME LOG: the figure a pingpong or perftest run printed.
summary() {
	local r
	r=$(pingpong_result "$2")
	if [[ -n $r ]]; then
		read -r mbit usec <<<"$r"
		echo "$mbit Mbit/s, $usec usec/iter"
		return
	fi
	r=$(grep -E '^xfer: .* OK$' "$2" | tail -n 1)
	if [[ -n $r ]]; then
		echo "$r"
		return
	fi
	r=$(perftest_result "$2")
	[[ -n $r ]] && echo "BW average $r MB/s" || echo "no figure"
}

declare -A results
port=18515
for c in "${cases[@]}"; do
	IFS='|' read -r name side _ hcmd <<<"$c"
	hcmd=${hcmd//@PORT@/$port}
	port_now=$port
	port=$((port + 1))
	hlog=$WORK/$name.host.log
	glog=$WORK/$name.guest.log
	t0=$(now)
	hrc=
	# shellcheck disable=SC2086 # hcmd is a word list
	if [[ $side == guest ]]; then
		if ! vm_wait "(NOT)?READY $name|DONE $name rc=" 150 || [[ $(vm_marker "(NOT)?READY $name|DONE $name rc=") != "READY $name" ]]; then
			fail "$name: the rxe server in the guest did not start"
			continue
		fi
		hrc=0
		host_run $hcmd >"$hlog" 2>&1 || hrc=$?
		((hrc == 0)) || vm_send "abort-$name" || true
	else
		if ! vm_wait "WAIT $name" 150; then
			fail "$name: the guest did not reach this case"
			continue
		fi
		host_run $hcmd >"$hlog" 2>&1 &
		spid=$!
		for ((i = 0; i < 200; i++)); do
			ns_listening "$port_now" && break
			kill -0 "$spid" 2>/dev/null || break
			sleep 0.05
		done
		vm_send "go-$name" || log "$name: cannot reach the guest's control port"
	fi
	vm_wait "DONE $name rc=" $((step_secs + 30)) || true
	grc=$(vm_marker "DONE $name rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	grc=${grc:-none}
	if [[ $side == host ]]; then
		hrc=0
		wait "$spid" || hrc=$?
	fi
	vm_step_output "$name" >"$glog"
	secs=$(elapsed "$t0")
	if [[ $name == xfer_* && $hrc == 0 && $grc == 0 ]] &&
		! { grep -q '^xfer: .* OK$' "$hlog" && grep -q '^xfer: .* OK$' "$glog"; }; then
		hrc="$hrc (no OK line)"
	fi
	if [[ $hrc == 0 && $grc == 0 ]]; then
		if [[ $side == guest ]]; then client_log=$hlog; else client_log=$glog; fi
		results[$name]=$(summary "$name" "$client_log")
		pass "$name (${secs}s): ${results[$name]}"
	else
		fail "$name: sroce side exited $hrc, rxe side exited $grc (${secs}s)"
		{
			echo "--- sroce (host) side: $hcmd"
			cat "$hlog"
			echo "--- rxe (guest) side:"
			cat "$glog"
			echo "---"
		} | sed 's/^/  /'
	fi
done

vm_finish 60
if [[ -n $pcap ]]; then
	# dumpcap writes its last packets when it stops.
	kill "$cap_pid" 2>/dev/null
	wait "$cap_pid" 2>/dev/null
	cap_pid=
	if "$python" "$here/../vm/roce_peer_check.py" "$pcap" "$host_ip" "$guest_ip" >"$WORK/check.log" 2>&1; then
		pass "wire check: rxe and sroce ICRCs recomputed by scapy"
	else
		fail "wire check (roce_peer_check.py)"
	fi
	sed 's/^/  /' "$WORK/check.log"
fi
echo "guest exited $VM_RC after ${VM_SECONDS}s (boot $boot_secs s); whole test $((SECONDS - start_all)) s"
if [[ $VM_RC != 0 && $CHECKS_FAILED == 0 ]]; then
	vm_dump >&2
	fail "guest script exited $VM_RC"
fi
if ((CHECKS_FAILED)); then
	vm_console | grep -E '^\[ *[0-9]+\.[0-9]+\]' | tail -n 30 | sed 's/^/  guest kernel: /'
fi
finish
