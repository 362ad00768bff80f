# SPDX-License-Identifier: MIT
# shellcheck shell=sh disable=SC3045 # busybox sh has read -t
#
# Helpers for test scripts running inside the guest (busybox sh), installed
# as /etc/guest-lib.sh.  Every line starting with "@@" on the console is for
# the host side (tests/vm/vm.sh); the host answers on the control line, the
# guest's second serial port.

mark() { echo "@@$*"; }

# host_wait WORD [SECONDS]: waits until the host sends the line WORD.
host_wait() {
	_want=$1
	_secs=${2:-60}
	while read -r -t "$_secs" _line </dev/ttyS1; do
		[ "$_line" = "$_want" ] && return 0
	done
	return 1
}

# listen_wait PORT PID [SECONDS]: waits until TCP PORT listens, giving up
# early when PID has exited.
listen_wait() {
	_i=0
	while [ "$_i" -lt $((${3:-30} * 10)) ]; do
		netstat -ltn 2>/dev/null | grep -q "[:.]$1 " && return 0
		kill -0 "$2" 2>/dev/null || return 1
		usleep 100000
		_i=$((_i + 1))
	done
	return 1
}

# step NAME SECONDS CMD...: runs CMD (killed after SECONDS), prints its
# output with "NAME| " in front of each line, then "@@DONE NAME rc=N".
step() {
	_name=$1
	_secs=$2
	shift 2
	timeout -s KILL "$_secs" "$@" >"/tmp/$_name.out" 2>&1
	_rc=$?
	sed "s/^/$_name| /" "/tmp/$_name.out"
	mark "DONE $_name rc=$_rc"
	return $_rc
}

# serve NAME PORT SECONDS CMD...: starts the server CMD, prints
# "@@READY NAME" once it listens on TCP PORT (or "@@NOTREADY NAME"), then
# waits for it like step; "abort-NAME" from the host stops it.
serve() {
	_name=$1
	_port=$2
	_secs=$3
	shift 3
	timeout -s KILL "$_secs" "$@" >"/tmp/$_name.out" 2>&1 &
	_pid=$!
	if listen_wait "$_port" "$_pid" "$_secs"; then
		mark "READY $_name"
		# The host sends "abort-NAME" when its client failed, so that a
		# server nobody will connect to does not run into its timeout.
		while kill -0 "$_pid" 2>/dev/null; do
			if read -r -t 1 _line </dev/ttyS1 && [ "$_line" = "abort-$_name" ]; then
				kill "$_pid" 2>/dev/null
			fi
		done
	else
		mark "NOTREADY $_name"
	fi
	wait "$_pid"
	_rc=$?
	sed "s/^/$_name| /" "/tmp/$_name.out"
	mark "DONE $_name rc=$_rc"
	return $_rc
}

# roce_gid_index DEV: the index of DEV's IPv4-mapped RoCE v2 GID on port 1
# (the table is long, but the address GIDs come first).
roce_gid_index() {
	for _i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
		case $(cat "/sys/class/infiniband/$1/ports/1/gids/$_i" 2>/dev/null) in
		0000:0000:0000:0000:0000:ffff:*)
			if [ "$(cat "/sys/class/infiniband/$1/ports/1/gid_attrs/types/$_i" 2>/dev/null)" = "RoCE v2" ]; then
				echo "$_i"
				return 0
			fi
			;;
		esac
	done
	return 1
}
