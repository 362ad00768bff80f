# SPDX-License-Identifier: MIT
# shellcheck shell=bash
#
# Host side of the qemu tests: builds (or reuses) the guest of
# build_guest.sh, boots it under software emulation with a test script in
# its initramfs, and follows the markers the guest prints (guest-lib.sh).
#
#   . tests/vm/vm.sh
#   vm_init BUILD-DIR                  # VM_GUEST; skips (77) without qemu/kernel
#   mkdir "$WORK/overlay/test"; write "$WORK/overlay/test/run.sh"
#   vm_initrd "$WORK/overlay"          # VM_INITRD = guest initramfs + overlay
#   vm_start [--ns NS] [--append 'K=V ...'] [-- QEMU-ARGS...]   # returns once /init is up
#   vm_wait 'READY x' 60               # waits for "@@READY x" on the console
#   vm_send go-x                       # a line on the guest's control port
#   vm_finish 60                       # waits for power-off; VM_RC = guest rc
#
# A guest whose eth0 is a tap on the host, with sroce on the host's end:
#   vm_tap_ns NS HOST-IP CONF          # namespace, tap0, link sroce0; VM_NET
#   vm_in_ns CMD...                    # CMD in that namespace
#   vm_capture_start FILE; vm_capture_stop   # RoCEv2 on tap0 (dumpcap)
#   vm_cleanup_on_exit                 # EXIT trap: vm_cleanup, vm_ns_cleanup
#
# The console goes to $VM_LOG (CRs removed when read).  qemu runs under
# `timeout -s KILL $VM_TIMEOUT` and is killed on exit by vm_cleanup, which
# the caller's EXIT trap must call.

VM_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${VM_TIMEOUT:=240}"
: "${VM_SMP:=2}"
: "${VM_MEM:=512}"
VM_PID=

vm_skip() {
	echo "SKIP: $*" >&2
	exit 77
}

# vm_init BUILD-DIR [WORKDIR]: checks for qemu and builds the guest under
# BUILD-DIR/vm (cached); sets VM_GUEST (its directory) and VM_WORK.
vm_init() {
	local build=${1:?vm_init BUILD-DIR} rc=0
	VM_WORK=${2:-${WORK:?vm_init needs WORK or a WORKDIR}}
	command -v qemu-system-x86_64 >/dev/null ||
		vm_skip "qemu-system-x86_64 not installed (qemu-system-x86, run scripts/setup.sh)"
	command -v cpio >/dev/null || vm_skip "cpio not installed (run scripts/setup.sh)"
	local t0=$SECONDS
	VM_GUEST=$(bash "$VM_HERE/build_guest.sh" "$build/vm") || rc=$?
	((rc == 77)) && exit 77
	((rc == 0)) || {
		echo "error: building the guest failed ($rc)" >&2
		exit 1
	}
	local kver pkg
	kver=$(cat "$VM_GUEST/kernel-version")
	# The Debian upload it comes from: the mirror moves, logs should say.
	pkg=$(dpkg-query -W -f='${Package} ${Version}\n' "linux-image-$kver" "linux-image-$kver-unsigned" 2>/dev/null |
		awk 'NF == 2 { print; exit }')
	echo "guest: $kver${pkg:+ ($pkg)} ($VM_GUEST, $((SECONDS - t0)) s)"
	VM_LOG=$VM_WORK/console.log
	VM_CTL=$VM_WORK/ctl
}

# vm_add_program DIR FILE [DEST]: copies the ELF program or library FILE to
# DIR/DEST (default DIR/usr/bin/NAME) with the shared libraries it needs
# that the guest does not already have.
vm_add_program() {
	local dir=$1 file=$2 dest=${3:-/usr/bin/${2##*/}} lib
	mkdir -p "$dir${dest%/*}"
	cp -L "$file" "$dir$dest"
	while IFS= read -r lib; do
		grep -qxF "$lib" "$VM_GUEST/files.txt" && continue
		[[ -e $dir$lib ]] && continue
		mkdir -p "$dir${lib%/*}"
		cp -L "$lib" "$dir$lib"
	done < <(ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
}

# vm_add_root_userspace DIR ROOT NAME FILE...: copies FILEs (paths inside
# the Debian root ROOT) with the shared libraries they need there to
# DIR/NAME, for programs the guest runs with `chroot /NAME` (vm_chroot_setup):
# another Debian release's user space on the guest's kernel.
vm_add_root_userspace() {
	local dir=$1/$3 root=$2 f lib
	shift 3
	for f in "$@"; do
		mkdir -p "$dir${f%/*}"
		cp -L "$root$f" "$dir$f"
		while IFS= read -r lib; do
			[[ -e $dir$lib ]] && continue
			mkdir -p "$dir${lib%/*}"
			cp -L "$root$lib" "$dir$lib"
		done < <(chroot "$root" ldd "$f" 2>/dev/null |
			awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
	done
}

# vm_chroot_setup NAME: the guest's commands that give /NAME the guest's
# /dev, /sys, /proc and a /tmp.
vm_chroot_setup() {
	printf '%s\n' "mkdir -p /$1/dev /$1/sys /$1/proc /$1/tmp" "mount -o bind /dev /$1/dev" \
		"mount -o bind /sys /$1/sys" "mount -t proc proc /$1/proc"
}

# vm_initrd DIR: VM_INITRD becomes the guest's initramfs followed by an
# archive of DIR (the kernel unpacks both; DIR's files land in /).
vm_initrd() {
	local dir=${1:?vm_initrd DIR}
	VM_INITRD=$VM_WORK/initrd.img
	cp "$VM_GUEST/initrd.img" "$VM_INITRD"
	# The kernel looks for the next archive only at a 4-byte boundary and
	# skips zeros in between.
	local size
	size=$(stat -c %s "$VM_INITRD")
	head -c $(((4 - size % 4) % 4)) /dev/zero >>"$VM_INITRD"
	(cd "$dir" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >>"$VM_INITRD"
}

# vm_start [--ns NS] [--append KERNEL-ARGS] [-- QEMU-ARGS...]: boots the
# guest in the background (in network namespace NS if given) and returns
# once its /init is up (@@GUEST-UP) or the guest is gone.  A kernel that
# dies of an int3 it did not place while booting is booted again, at most
# twice, saying so: under software emulation a vCPU can run an instruction
# another vCPU is patching (the kernel's text_poke), which real hardware's
# serialisation never lets it see.  Nothing of the test runs before
# @@GUEST-UP, so a boot again loses nothing.
vm_start() {
	local ns='' append='' pre=()
	while (($#)); do
		case $1 in
		--ns)
			ns=$2
			shift 2
			;;
		--append)
			append=$2
			shift 2
			;;
		--)
			shift
			break
			;;
		*)
			echo "vm_start: unknown option $1" >&2
			return 1
			;;
		esac
	done
	[[ -n $ns ]] && pre=(ip netns exec "$ns")
	local try
	for try in 1 2 3; do
		rm -f "$VM_CTL.in" "$VM_CTL.out" "$VM_LOG"
		mkfifo "$VM_CTL.in" "$VM_CTL.out"
		: >"$VM_LOG"
		# Software emulation (no KVM here); ttyS0 is the console, ttyS1 the
		# control line the host writes to.
		timeout -s KILL "$VM_TIMEOUT" "${pre[@]}" qemu-system-x86_64 \
			-machine pc -accel tcg -cpu max -smp "$VM_SMP" -m "$VM_MEM" \
			-nodefaults -display none -no-reboot \
			-kernel "$VM_GUEST/vmlinuz" -initrd "${VM_INITRD:-$VM_GUEST/initrd.img}" \
			-append "console=ttyS0 panic=-1 loglevel=4 $append" \
			-serial "file:$VM_LOG" -serial "pipe:$VM_CTL" \
			"$@" >"$VM_WORK/qemu.log" 2>&1 &
		VM_PID=$!
		VM_START=$SECONDS
		vm_wait GUEST-UP "$VM_TIMEOUT" && return 0
		kill -0 "$VM_PID" 2>/dev/null && return 0 # out of time: the caller's waits tell
		vm_console | grep -q 'Oops: int3' || return 0
		echo "guest: the kernel died of a stray int3 while booting (an emulation race)$( ((try < 3)) && echo ', booting again'):" >&2
		vm_console | grep -E 'Oops: int3|RIP: ' | head -n 2 | sed 's/^/  /' >&2
		wait "$VM_PID" 2>/dev/null
	done
	return 0
}

# vm_console: the console so far, without CRs.
vm_console() { tr -d '\r' <"$VM_LOG"; }

# vm_wait WHAT SECONDS: waits until the console has the line "@@WHAT..."
# (WHAT is an extended regular expression).  Fails when qemu exits first or
# the time is up.
vm_wait() {
	local what=$1 secs=$2 i
	for ((i = 0; i < secs * 10; i++)); do
		vm_console | grep -Eq "^@@($what)" && return 0
		kill -0 "$VM_PID" 2>/dev/null || break
		sleep 0.1
	done
	vm_console | grep -Eq "^@@($what)"
}

# vm_marker WHAT: prints the last "@@WHAT..." line without the "@@".
vm_marker() { vm_console | grep -E "^@@($1)" | tail -n 1 | sed 's/^@@//'; }

# vm_step_output NAME: the output the guest printed for step NAME.
vm_step_output() { vm_console | sed -n "s/^$1| //p"; }

# vm_send LINE: sends LINE to the guest's control port.
vm_send() {
	# shellcheck disable=SC2016 # expanded by the inner shell
	timeout 5 bash -c 'printf "%s\n" "$1" >"$2"' _ "$1" "$VM_CTL.in"
}

# vm_finish SECONDS: waits for the guest to power off; VM_RC becomes the
# status the guest's script exited with (255 when it never finished).
vm_finish() {
	local secs=$1
	vm_wait 'GUEST-EXIT' "$secs" || true
	local i
	for ((i = 0; i < 100; i++)); do
		kill -0 "$VM_PID" 2>/dev/null || break
		sleep 0.1
	done
	vm_cleanup
	VM_RC=$(vm_marker GUEST-EXIT | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	VM_RC=${VM_RC:-255}
	# shellcheck disable=SC2034 # for the caller
	VM_SECONDS=$((SECONDS - VM_START))
}

# vm_report START [NOTE]: the last words of a guest test that began at
# SECONDS START: how long the guest and the test ran (NOTE in parentheses);
# a guest script that failed while no check did fails the test; after any
# failed check, the guest kernel's last messages and the sroce agent's log
# (WORK/agent.log).
vm_report() {
	echo "guest exited $VM_RC after ${VM_SECONDS}s${2:+ ($2)}; whole test $((SECONDS - $1)) s"
	if [[ $VM_RC != 0 && $CHECKS_FAILED == 0 ]]; then
		vm_dump 80 >&2
		fail "guest script exited $VM_RC"
	fi
	if ((CHECKS_FAILED)); then
		vm_console | grep -E '^\[ *[0-9]+\.[0-9]+\]' | tail -n 30 | sed 's/^/  guest kernel: /'
		tail -n 30 "$WORK/agent.log" 2>/dev/null | sed 's/^/  agent log: /'
	fi
}

# vm_dump [LINES]: the console's last LINES (80) and qemu's own messages,
# for a failure report.
vm_dump() {
	echo "--- guest console:"
	vm_console | tail -n "${1:-80}"
	echo "--- qemu:"
	cat "$VM_WORK/qemu.log" 2>/dev/null
	echo "---"
}

# vm_cleanup: kills qemu if it still runs (only the process started here).
vm_cleanup() {
	local i
	if [[ -n $VM_PID ]]; then
		# TERM reaches qemu through timeout(1), which KILL would not.
		kill -TERM "$VM_PID" 2>/dev/null
		for ((i = 0; i < 50; i++)); do
			kill -0 "$VM_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$VM_PID" 2>/dev/null
		wait "$VM_PID" 2>/dev/null
		VM_PID=
	fi
	return 0
}

# --- the host's end: a network namespace with the tap the guest's eth0 is on

# vm_tap_ns NS HOST-IP CONF [HOST-IP6 MAC GUEST-MAC]: makes network
# namespace NS with lo up and tap0 at HOST-IP/24, and the sroce link sroce0
# on tap0 in the link configuration CONF; VM_NS becomes NS (vm_ns_cleanup
# removes it) and VM_NET the qemu options that put the guest's eth0 on the
# tap.  sroce0 is bound to HOST-IP; with HOST-IP6 the tap also has that
# address (/64, without duplicate address detection, as its link-local one)
# and the MAC MAC, the guest's eth0 GUEST-MAC, and sroce0 follows tap0 as
# an rxe link does: its GIDs are the link-local, HOST-IP and HOST-IP6.
# Fails with the reason in VM_ERR.
VM_NS=
VM_NET=()
vm_tap_ns() {
	local ns=$1 ip=$2 conf=$3 ip6=${4:-} mac=${5:-} guest_mac=${6:-} err=$VM_WORK/vm_tap_ns.err
	local link=(link add sroce0 netdev tap0 addr "$ip") nic=virtio-net-pci,netdev=n0,romfile=
	VM_ERR=
	if ! ip netns add "$ns" 2>"$err"; then
		VM_ERR="ip netns unusable: $(cat "$err")"
		return 1
	fi
	VM_NS=$ns
	if ! vm_in_ns ip link set lo up 2>"$err" ||
		! vm_in_ns ip tuntap add dev tap0 mode tap 2>"$err" ||
		! vm_in_ns ip addr add "$ip/24" dev tap0 2>"$err"; then
		VM_ERR="cannot set up the tap device: $(cat "$err")"
		return 1
	fi
	if [[ -n $ip6 ]]; then
		if ! vm_in_ns sysctl -qw net.ipv6.conf.tap0.accept_dad=0 2>"$err" ||
			! vm_in_ns ip link set tap0 address "$mac" 2>"$err" ||
			! vm_in_ns ip addr add "$ip6/64" dev tap0 nodad 2>"$err"; then
			VM_ERR="cannot give the tap device IPv6: $(cat "$err")"
			return 1
		fi
		link=(link add sroce0 netdev tap0)
		nic+=,mac=$guest_mac
	fi
	if ! vm_in_ns ip link set tap0 up 2>"$err"; then
		VM_ERR="cannot set up the tap device: $(cat "$err")"
		return 1
	fi
	if ! vm_in_ns "${SROCE_BIN:?vm_tap_ns needs SROCE_BIN}" --config "$conf" "${link[@]}" 2>"$err"; then
		VM_ERR="sroce ${link[*]} failed: $(cat "$err")"
		return 1
	fi
	# shellcheck disable=SC2054,SC2034 # qemu options (commas included), for the caller
	VM_NET=(-netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device "$nic")
}

# vm_require_rxe_flush: skips the test unless the guest's rxe executes FLUSH
# (Linux >= 6.2, or modules of rxe-patches/ in SROCE_VM_MODULES).
vm_require_rxe_flush() {
	local kver
	kver=$(cat "$VM_GUEST/kernel-version")
	[[ -n ${SROCE_VM_MODULES:-} || $(printf '%s\n' 6.2 "$kver" | sort -V | head -n 1) == 6.2 ]] ||
		skip "the guest's kernel $kver has an rxe without FLUSH (install linux-image-6.12-amd64: scripts/setup.sh vm)"
}

# vm_start_nvdimm NS GUEST-IP [KERNEL-ARGS]: vm_start in namespace NS, the
# guest's eth0 on its tap at GUEST-IP, with an emulated 256 MiB NVDIMM
# backed by WORK/nvdimm.img (the same file for every boot of one test).
vm_start_nvdimm() {
	vm_start --ns "$1" --append "guest.ip=$2/24${3:+ $3}" -- \
		-machine pc,nvdimm=on -m "$VM_MEM,slots=2,maxmem=4G" \
		-object "memory-backend-file,id=mem1,share=on,mem-path=$WORK/nvdimm.img,size=256M" \
		-device nvdimm,memdev=mem1 "${VM_NET[@]}"
}

# vm_in_ns CMD...: runs CMD in the namespace of vm_tap_ns.
vm_in_ns() { ip netns exec "$VM_NS" "$@"; }

# vm_sroce_ns NS HOST-IP [HOST-IP6 MAC GUEST-MAC]: what the sroce side of a
# guest test needs - vm_tap_ns with the link configuration in
# WORK/links.conf (exported as SROCE_CONFIG) and a sroce agent in the
# namespace for the test's lifetime (rdma_cm, QP1).  Skips the test when
# the namespace cannot be made.
vm_sroce_ns() {
	vm_tap_ns "$1" "$2" "$WORK/links.conf" "${@:3}" || skip "$VM_ERR"
	export SROCE_CONFIG=$WORK/links.conf
	vm_in_ns "$SROCE_BIN" agent start --idle-exit 0 --log "$WORK/agent.log" ||
		die "the sroce agent did not start in the namespace"
}

# vm_host_server LOG SECONDS CMD...: runs the server CMD on the host's side
# (in the namespace, under `sroce exec`, killed after SECONDS) with its
# output in LOG, and returns once it printed "listening" (or exited);
# VM_SERVER_PID is its process.
VM_SERVER_PID=
vm_host_server() {
	local log=$1 secs=$2
	shift 2
	vm_in_ns timeout -k 5 "$secs" "$SROCE_BIN" exec -- "$@" >"$log" 2>&1 &
	VM_SERVER_PID=$!
	wait_for "$log" 10 listening "$VM_SERVER_PID" || true
}

# vm_capture_start FILE: captures the RoCEv2 traffic on the namespace's
# tap into FILE (dumpcap, from tshark; the tap carries the IPv4 headers
# exactly as sent, so every ICRC can be recomputed).  Fails, with the
# reason in VM_ERR, when dumpcap is missing or does not start.
VM_CAP_PID=
vm_capture_start() {
	local file=$1 log=$VM_WORK/dumpcap.log i
	VM_ERR=
	command -v dumpcap >/dev/null || {
		VM_ERR="dumpcap (tshark) is not installed"
		return 1
	}
	# dumpcap may write as a dropped user; -B: a 64 MiB buffer, so that no
	# burst is lost from the capture.
	chmod 1777 "$VM_WORK"
	: >"$log"
	vm_in_ns dumpcap -q -P -B 64 -i tap0 -f 'udp port 4791' -w "$file" >"$log" 2>&1 &
	VM_CAP_PID=$!
	for ((i = 0; i < 100; i++)); do
		grep -q "Capturing on" "$log" && return 0
		kill -0 "$VM_CAP_PID" 2>/dev/null || break
		sleep 0.1
	done
	# shellcheck disable=SC2034 # for the caller
	VM_ERR="no capture: $(cat "$log")"
	vm_capture_stop
	return 1
}

# vm_capture_stop: stops the capture (dumpcap writes its last packets then).
# vm_capture_or_not FILE: vm_capture_start if tshark is there; VM_PCAP
# becomes FILE, or empty (logged) when there is no capture.
VM_PCAP=
vm_capture_or_not() {
	VM_PCAP=
	if ! command -v tshark >/dev/null || ! vm_capture_start "$1"; then
		log "no capture (${VM_ERR:-tshark missing}): the wire check is skipped"
		return 0
	fi
	# shellcheck disable=SC2034 # for the caller
	VM_PCAP=$1
}

vm_capture_stop() {
	[[ -n $VM_CAP_PID ]] || return 0
	kill "$VM_CAP_PID" 2>/dev/null
	wait "$VM_CAP_PID" 2>/dev/null
	VM_CAP_PID=
}

# vm_wire_check ARGS...: stops the capture and runs roce_peer_check.py ARGS
# (scapy recomputes the ICRCs of both sides), its report in $WORK/check.log.
# Status: 0 every check passed, 1 one failed, 2 no scapy (said on stderr).
vm_wire_check() {
	local python
	vm_capture_stop
	python=$(scapy_python)
	if [[ -z $python ]]; then
		log "scapy is missing: the capture is not checked"
		return 2
	fi
	"$python" "$VM_HERE/roce_peer_check.py" "$@" >"$WORK/check.log" 2>&1 || return 1
}

# vm_flush_forms: the FLUSH forms each side used, from vm_wire_check's
# report with --flush-forms ("sroce ..., rxe ...").
vm_flush_forms() {
	echo "sroce $(sed -n 's/^flush sroce //p' "$WORK/check.log"), rxe $(sed -n 's/^flush rxe //p' "$WORK/check.log")"
}

# vm_wire_ops SIDE REGEX: how many packets of opcodes matching REGEX (as
# 0x1c) SIDE (sroce or rxe) sent, from vm_wire_check's report.
vm_wire_ops() {
	awk -v who="$1:" -v re="$2" '/^[a-z]+:/ { s = ($1 == who) } s && $1 ~ re { n += $NF } END { print n + 0 }' "$WORK/check.log"
}

# vm_cleanup_on_exit: the EXIT trap of a test that uses vm_tap_ns: qemu,
# the namespace and lib.sh's own cleanup.
vm_cleanup_on_exit() {
	trap 'vm_cleanup; vm_ns_cleanup; _sroce_cleanup' EXIT
}

# vm_ns_cleanup: the capture, everything running in the namespace (all of
# it started by the test) and the namespace itself.
vm_ns_cleanup() {
	local p
	vm_capture_stop
	[[ -n $VM_NS ]] || return 0
	for p in $(ip netns pids "$VM_NS" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
	ip netns del "$VM_NS" 2>/dev/null
	VM_NS=
}
