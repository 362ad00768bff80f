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

# host_verdict NAME [SECONDS]: after a failed attempt at NAME, whether the
# host wants another ("again-NAME") or not ("next-NAME", or nothing).
host_verdict() {
	while read -r -t "${2:-60}" _line </dev/ttyS1; do
		[ "$_line" = "again-$1" ] && return 0
		[ "$_line" = "next-$1" ] && return 1
	done
	return 1
}

# listen_wait PORT PID [SECONDS]: waits until TCP PORT listens, or an
# rdma_cm id listens on PORT (rdma_cm servers open no TCP port), giving up
# early when PID has exited.
listen_wait() {
	_i=0
	while [ "$_i" -lt $((${3:-30} * 10)) ]; do
		netstat -ltn 2>/dev/null | grep -q "[:.]$1 " && return 0
		rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .* src-addr [^ ]*:$1 " && return 0
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
# "@@READY NAME" once it listens on PORT (or "@@NOTREADY NAME"), then
# waits for it like step; "abort-NAME" from the host stops it, and so does
# "stop-NAME", which ends a server that serves until stopped (cmtime): one
# still running then counts as having exited 0.
serve() {
	_name=$1
	_port=$2
	_secs=$3
	shift 3
	_stopped=
	timeout -s KILL "$_secs" "$@" >"/tmp/$_name.out" 2>&1 &
	_pid=$!
	if listen_wait "$_port" "$_pid" "$_secs"; then
		mark "READY $_name"
		# The host sends "abort-NAME" when its client failed, so that a
		# server nobody will connect to does not run into its timeout.
		while kill -0 "$_pid" 2>/dev/null; do
			read -r -t 1 _line </dev/ttyS1 || continue
			case $_line in
			"abort-$_name") kill "$_pid" 2>/dev/null ;;
			"stop-$_name") kill "$_pid" 2>/dev/null && _stopped=1 ;;
			esac
		done
	else
		mark "NOTREADY $_name"
	fi
	wait "$_pid"
	_rc=$?
	[ -n "$_stopped" ] && _rc=0
	sed "s/^/$_name| /" "/tmp/$_name.out"
	mark "DONE $_name rc=$_rc"
	return $_rc
}

# attempt SIDE NAME PORT SECONDS CMD...: one run of a client/server pair
# whose other program runs on the host.  SIDE guest: CMD is the server
# (serve); SIDE host: CMD is the client, started when the host says
# "go-NAME" once its server is up ("@@WAIT NAME" asks for it).
attempt() {
	if [ "$1" = guest ]; then
		shift
		serve "$@"
		return
	fi
	_name=$2
	_secs=$4
	shift 4
	mark "WAIT $_name"
	if host_wait "go-$_name" "$_secs"; then
		step "$_name" "$_secs" "$@"
		return
	fi
	mark "DONE $_name rc=125"
	return 1
}

# tries N SIDE NAME PORT SECONDS CMD...: attempt, up to N times while the
# host answers a failed attempt with "again-NAME" (a race the programs lose
# on any stack); attempt K after the first is named NAME-K.
tries() {
	_n=$1
	_side=$2
	_base=$3
	shift 3
	_k=1
	while :; do
		_try=$_base
		[ "$_k" -gt 1 ] && _try=$_base-$_k
		attempt "$_side" "$_try" "$@" && return 0
		[ "$_k" -lt "$_n" ] || return 1
		host_verdict "$_base" "$2" || return 1
		_k=$((_k + 1))
	done
}

# local_pair NAME PORT SECONDS SERVER CLIENT...: both programs in the
# guest: the server command line SERVER in the background, then, once it
# listens on PORT, the client CLIENT as a step; the server (one that serves
# until stopped) is stopped when the client is done.
local_pair() {
	_name=$1
	_port=$2
	_secs=$3
	sh -c "exec timeout -s KILL $_secs $4" >"/tmp/$_name.server" 2>&1 &
	_pid=$!
	shift 4
	if listen_wait "$_port" "$_pid" "$_secs"; then
		step "$_name" "$_secs" "$@"
		_rc=$?
	else
		sed "s/^/$_name| /" "/tmp/$_name.server"
		mark "DONE $_name rc=126"
		_rc=126
	fi
	kill "$_pid" 2>/dev/null
	wait "$_pid"
	return $_rc
}

# cm_counters DEV: prints "@@CM-COUNTERS" and the kernel CM's non-zero
# retransmission and duplicate counters of DEV's port 1 (COUNTER/MESSAGE=N),
# or "none".
cm_counters() {
	_out=
	for _f in /sys/class/infiniband/"$1"/ports/1/cm_tx_retries/* \
		/sys/class/infiniband/"$1"/ports/1/cm_rx_duplicates/*; do
		_v=$(cat "$_f" 2>/dev/null)
		[ "${_v:-0}" = 0 ] || _out="$_out ${_f#*/ports/1/}=$_v"
	done
	mark "CM-COUNTERS${_out:- none}"
}

# gid_index_of DEV PREFIX: the index of DEV's first RoCE v2 GID on port 1
# that starts with PREFIX (as sysfs writes GIDs: fd00:0206:...).
gid_index_of() {
	for _i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
		case $(cat "/sys/class/infiniband/$1/ports/1/gids/$_i" 2>/dev/null) in
		"$2"*)
			if [ "$(cat "/sys/class/infiniband/$1/ports/1/gid_attrs/types/$_i" 2>/dev/null)" = "RoCE v2" ]; then
				echo "$_i"
				return 0
			fi
			;;
		esac
	done
	return 1
}

# roce_gid_index DEV: the index of DEV's IPv4-mapped RoCE v2 GID on port 1
# (the table is long, but the address GIDs come first).
roce_gid_index() { gid_index_of "$1" 0000:0000:0000:0000:0000:ffff:; }
