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
#   vm_start [--ns NS] [--append 'K=V ...'] [-- QEMU-ARGS...]
#   vm_wait 'READY x' 60               # waits for "@@READY x" on the console
#   vm_send go-x                       # a line on the guest's control port
#   vm_finish 60                       # waits for power-off; VM_RC = guest rc
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
	echo "guest: $(cat "$VM_GUEST/kernel-version") ($VM_GUEST, $((SECONDS - t0)) s)"
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
# guest in the background (in network namespace NS if given).
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

# vm_dump: the console and qemu's own messages, for a failure report.
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
