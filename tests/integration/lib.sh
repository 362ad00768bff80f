# SPDX-License-Identifier: MIT
# shellcheck shell=bash
#
# Shared helpers for the integration scripts and scripts/demo.sh.  Source it
# and call sroce_init with the build directory:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   sroce_init "${1:?usage: $0 BUILD-DIR}"
#   require_cmds ib_write_bw
#   sroce_config sroce0 127.0.0.1 sroce1 127.0.0.2
#   run_pair ib_write_bw -d sroce0 -x 1 -p @PORT@ -- \
#            ib_write_bw -d sroce1 -x 1 -p @PORT@ 127.0.0.1
#
# Exit statuses follow ctest's conventions: 77 = skipped.

# Seconds a server or client of run_pair may run before it is killed.
: "${RP_TIMEOUT:=60}"
# Seconds run_pair waits for the server's TCP port to listen.
: "${RP_LISTEN_WAIT:=10}"

SROCE_BG_PIDS=()

# Prints to stderr.
log() { printf '%s\n' "$*" >&2; }

die() {
	log "error: $*"
	exit 1
}

skip() {
	log "SKIP: $*"
	exit 77
}

_sroce_cleanup() {
	local pid
	# Only the background processes this script started, by their ids.
	for pid in "${SROCE_BG_PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${SROCE_BG_PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	# Gone already (idle exit) is fine.
	netns_cleanup
	[[ -z ${SROCE_PRIVATE_AGENT:-} ]] || "$SROCE_BIN" agent stop &>/dev/null || true
	[[ -n ${WORK:-} && -d $WORK ]] && rm -rf "$WORK"
	return 0
}

# private_agent: this script's processes use an agent of their own (stopped
# on exit) rather than the namespace's, so that stopping or killing it
# disturbs no other test.  Its addresses must still be the script's alone.
private_agent() {
	export SROCE_AGENT_SOCKET=sroce-test-$$
	SROCE_PRIVATE_AGENT=1
}

# build_sanitizer: SANITIZER becomes the build's SROCE_SANITIZE (address,
# thread, or empty).  Under address, programs that link the ASan runtime
# themselves may run under `sroce exec`: it preloads libsroce.so ahead of the
# runtime, which ASan refuses by default, though the program initializes the
# runtime before any library's constructor runs.
build_sanitizer() {
	SANITIZER=
	[[ -f $BUILD_DIR/CMakeCache.txt ]] &&
		SANITIZER=$(sed -n 's/^SROCE_SANITIZE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
	if [[ $SANITIZER == address ]]; then
		export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
	fi
}

# foreground_agent: the private agent run by the test itself (`agent run`,
# gone once idle), so that its exit status and its sanitizer reports count;
# AGENT_PID and AGENT_LOG say where.  After private_agent.
foreground_agent() {
	AGENT_LOG=$WORK/agent.log
	"$SROCE_BIN" agent run --idle-exit 0 >"$AGENT_LOG" 2>&1 &
	AGENT_PID=$!
	SROCE_BG_PIDS+=("$AGENT_PID")
	wait_for "$AGENT_LOG" 30 "listening on" "$AGENT_PID" ||
		die "the agent did not start: $(cat "$AGENT_LOG")"
}

# sroce_init BUILD-DIR: finds the sroce command and libsroce.so in the build
# tree, makes $WORK (removed on exit) and unsets anything from the caller's
# environment that would change which devices programs see.
sroce_init() {
	local build=${1:?sroce_init BUILD-DIR}
	[[ -d $build ]] || die "build directory '$build' does not exist"
	BUILD_DIR=$(cd "$build" && pwd)
	SROCE_BIN=$BUILD_DIR/tools/sroce/sroce
	[[ -x $SROCE_BIN ]] || die "$SROCE_BIN not built"
	SROCE_SHIM=$BUILD_DIR/libibverbs-ext/shim/libsroce.so
	[[ -f $SROCE_SHIM ]] || die "$SROCE_SHIM not built"
	export SROCE_SHIM
	unset LD_PRELOAD SROCE_FAULT
	# Debian's libfabric links libinfinipath (PSM), whose constructor
	# catches SIGSEGV, SIGABRT, SIGTERM, SIGINT, SIGBUS and SIGILL in every
	# program that loads libfabric, writes PROG.80s-PID,HOST.btr into the
	# working directory and calls exit(1) from the handler: a crash then
	# runs the exit handlers on a broken heap (and can hang in free()), and
	# a timeout's SIGTERM becomes exit status 1.  PSM2 does the same only
	# when HFI_BACKTRACE is set.
	export IPATH_NO_BACKTRACE=1
	unset HFI_BACKTRACE
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/sroce-test.XXXXXX")
	# pmof_fabtest's FI_PMEM files: a run killed by a timeout leaves them,
	# here removed with the rest.
	export FT_PMEM_DIR=$WORK
	trap _sroce_cleanup EXIT
	trap 'exit 130' INT TERM
	PORT_NEXT=$((20000 + RANDOM % 10000))
}

# fabric_init PROVIDER...: libfabric offers the test's programs these
# providers only (FI_PROVIDER), and the test runs in $WORK, so that nothing
# a library leaves in a working directory lands in the source tree.  Paths
# given to the script must be absolute or resolved before (sroce_init's
# BUILD_DIR is).
fabric_init() {
	local IFS=,
	export FI_PROVIDER="$*"
	cd "$WORK" || die "cd $WORK"
}

# require_cmds CMD...: skips the test when a program is not installed
# (scripts/setup.sh installs all of them).
require_cmds() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null || skip "$c not installed (run scripts/setup.sh)"
	done
}

# Skips unless lo is up with 127.0.0.1 (a fresh network namespace has it down).
# scapy_python: prints a python3 that has scapy's RoCE layer (the system's
# first: a user's pyenv may lack python3-scapy), or nothing.
scapy_python() {
	local p
	for p in /usr/bin/python3 python3; do
		if command -v "$p" >/dev/null && "$p" -c 'import scapy.contrib.roce' 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

# capture_lo PCAP FILTER: starts tshark on lo with a capture FILTER writing
# PCAP, and returns once packets are being captured (CAPTURE_PID); skips
# the test when lo cannot be captured.  Stop it with capture_stop.
capture_lo() {
	local log=$1.log
	tshark -i lo -B 64 -f "$2" -w "$1" >/dev/null 2>"$log" &
	CAPTURE_PID=$!
	SROCE_BG_PIDS+=("$CAPTURE_PID")
	for _ in $(seq 100); do
		grep -q "Capturing on" "$log" && break
		kill -0 "$CAPTURE_PID" 2>/dev/null || skip "tshark cannot capture on lo: $(cat "$log")"
		sleep 0.1
	done
	grep -q "Capturing on" "$log" || skip "tshark did not start capturing on lo"
	# The filter is attached once tshark says so; a moment more for libpcap.
	sleep 0.5
}
# capture_stop: lets the last packets reach the capture, then ends it.
capture_stop() {
	sleep 0.5
	kill -INT "$CAPTURE_PID"
	bg_wait "$CAPTURE_PID"
}

# in_segmenting_netns "$0" "$@": runs the calling script again, once, in a
# network namespace of its own whose lo cuts every segmentation-offload send
# into datagrams in software (tx-udp-segmentation off), so that a capture on
# lo holds what a wire would carry, each with the IP ID the kernel gave it.
# Skips without root, unshare(1) or ethtool(8).
in_segmenting_netns() {
	[[ -z ${SROCE_TEST_NETNS:-} ]] || return 0
	((EUID == 0)) || skip "needs root for a network namespace"
	require_cmds unshare ethtool
	# shellcheck disable=SC2016 # expanded by the inner shell
	exec env SROCE_TEST_NETNS=1 unshare --net -- bash -c '
		ip link set lo up || { echo "SKIP: cannot bring lo up in a new namespace" >&2; exit 77; }
		ethtool -K lo tx-udp-segmentation off >/dev/null 2>&1 ||
			{ echo "SKIP: this kernel cannot turn UDP segmentation offload off on lo" >&2; exit 77; }
		exec bash "$@"' bash "$@"
}

require_loopback() {
	ip -o -4 addr show dev lo 2>/dev/null | grep -q 'inet 127\.' ||
		skip "loopback interface is down or has no 127.0.0.0/8 address"
}

# sroce_config NAME ADDR [NAME ADDR]...: writes a private link configuration
# with one device per NAME bound to ADDR on lo, through `sroce link add` (so
# its checks apply), and exports SROCE_CONFIG.
sroce_config() {
	(($# >= 2 && $# % 2 == 0)) || die "sroce_config NAME ADDR [NAME ADDR]..."
	export SROCE_CONFIG=$WORK/links.conf
	rm -f "$SROCE_CONFIG"
	while (($#)); do
		"$SROCE_BIN" --config "$SROCE_CONFIG" link add "$1" netdev lo addr "$2" ||
			die "sroce link add $1 netdev lo addr $2 failed"
		shift 2
	done
}

# Whether anything (listening, connected or in TIME_WAIT) uses TCP port $1.
port_busy() {
	[[ -n $(ss -Htan "( sport = :$1 or dport = :$1 )" 2>/dev/null) ]]
}

# next_port: sets PORT to a TCP port nobody uses.  Ports are taken from below
# the ephemeral range, starting at a random point and never reused within a
# run, so consecutive runs do not collide with each other's TIME_WAIT.
next_port() {
	local tries=0
	while :; do
		PORT=$PORT_NEXT
		PORT_NEXT=$((PORT_NEXT >= 32000 ? 20000 : PORT_NEXT + 1))
		port_busy "$PORT" || return 0
		((++tries < 1000)) || die "no free TCP port found"
	done
}

# wait_listen PORT PID [SECONDS]: waits until TCP PORT listens.  Fails early
# when PID has exited.
wait_listen() {
	local port=$1 pid=$2 secs=${3:-$RP_LISTEN_WAIT} i
	for ((i = 0; i < secs * 20; i++)); do
		[[ -n $(ss -Hltn "( sport = :$port )" 2>/dev/null) ]] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# netns_pair A B: two network namespaces of the script's own, A and B, joined
# by a veth pair (veth-a in A, veth-b in B) with every link up and the
# carrier there; skips where namespaces or veth are unusable.  netns_cleanup
# (called from _sroce_cleanup) kills what runs in them and deletes them.
# in_a and in_b then run a command in A or B.
SROCE_NETNS=()
NETNS_A='' NETNS_B=''
in_a() { ip netns exec "$NETNS_A" "$@"; }
in_b() { ip netns exec "$NETNS_B" "$@"; }
netns_pair() {
	NETNS_A=$1 NETNS_B=$2
	local err deadline
	err=$(ip netns add "$1" 2>&1) || skip "ip netns unusable: $err"
	SROCE_NETNS+=("$1")
	err=$(ip netns add "$2" 2>&1) || skip "ip netns unusable: $err"
	SROCE_NETNS+=("$2")
	# Made inside the namespaces, so the names cannot clash with the host's.
	err=$(ip link add veth-a netns "$1" type veth peer name veth-b netns "$2" 2>&1) ||
		skip "cannot create a veth pair: $err"
	if ! { ip -n "$1" link set lo up && ip -n "$2" link set lo up &&
		ip -n "$1" link set veth-a up && ip -n "$2" link set veth-b up; }; then
		die "cannot bring up the links of $1 and $2"
	fi
	# sroce reports a port's state from its interface's.
	deadline=$((SECONDS + 10))
	until [[ $(ip netns exec "$1" cat /sys/class/net/veth-a/operstate) == up &&
		$(ip netns exec "$2" cat /sys/class/net/veth-b/operstate) == up ]]; do
		((SECONDS < deadline)) || die "the veth pair of $1 and $2 did not come up"
		sleep 0.05
	done
}
# netns_fixed_macs MAC-A MAC-B: gives veth-a and veth-b (netns_pair) these
# MACs, so that their link-local addresses are known (fe80:: and the
# EUI-64 of the MAC), and waits until no IPv6 address of either namespace
# is tentative (addresses added later with nodad never are).
netns_fixed_macs() {
	local ns
	{ in_a ip link set veth-a down && in_b ip link set veth-b down &&
		in_a ip link set veth-a address "$1" && in_b ip link set veth-b address "$2" &&
		in_a ip link set veth-a up && in_b ip link set veth-b up; } ||
		die "cannot set the veth pair's MACs"
	for ns in "$NETNS_A" "$NETNS_B"; do
		for _ in $(seq 100); do
			ip -n "$ns" -6 addr show scope link | grep -q "inet6 fe80" &&
				! ip -n "$ns" -6 addr show | grep -q tentative && break
			sleep 0.1
		done
	done
}
# netns_sroce TAG: sroce in both namespaces of netns_pair, each with its
# own configuration ($WORK/a.conf, $WORK/b.conf) and an agent of this test
# alone (TAG names its socket).  link_a and link_b ARGS add a link (sroce
# link add ARGS); run_a and run_b run a command under `sroce exec`.
netns_sroce() {
	export SROCE_AGENT_SOCKET=sroce-test-$1-$$
}
link_a() { in_a "$SROCE_BIN" --config "$WORK/a.conf" link add "$@"; }
link_b() { in_b "$SROCE_BIN" --config "$WORK/b.conf" link add "$@"; }
run_a() { in_a env SROCE_CONFIG="$WORK/a.conf" "$SROCE_BIN" --config "$WORK/a.conf" exec -- "$@"; }
run_b() { in_b env SROCE_CONFIG="$WORK/b.conf" "$SROCE_BIN" --config "$WORK/b.conf" exec -- "$@"; }

netns_cleanup() {
	local ns p
	for ns in "${SROCE_NETNS[@]}"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
	done
	# Deleting a namespace also deletes its end of the veth pair.
	for ns in "${SROCE_NETNS[@]}"; do ip netns del "$ns" 2>/dev/null; done
	SROCE_NETNS=()
}

# netns_run_pair NAME TIMEOUT SERVER-CMD... -- CLIENT-CMD...: the server in
# the first namespace (the caller's run_a, whose ss(8) in_a runs), the
# client in the second (run_b) once the server listens on a TCP port; true
# when both exit 0, else both outputs on stderr.  Output in
# $WORK/NAME.{a,b}.
netns_run_pair() {
	netns_pair_run "$1" "" "${@:2}"
}

# netns_cm_pair NAME WANT TIMEOUT SERVER-CMD... -- CLIENT-CMD...: the same
# for programs that meet through rdma_cm: the client starts once the status
# of the first namespace's agent (sroce -j agent status) matches the
# extended regular expression WANT: a listener's port, a multicast group.
netns_cm_pair() {
	netns_pair_run "$@"
}

# Both: WANT empty waits for a TCP listener.
netns_pair_run() {
	local name=$1 want=$2 limit=$3 server=() i
	shift 3
	while [[ $1 != -- ]]; do
		server+=("$1")
		shift
	done
	shift
	run_a timeout "$limit" "${server[@]}" >"$WORK/$name.a" 2>&1 &
	NETNS_SERVER=$!
	for ((i = 0; i < 400; i++)); do
		if [[ -z $want ]]; then
			[[ -n $(in_a ss -Hltn 2>/dev/null) ]] && break
		else
			in_a "$SROCE_BIN" -j agent status 2>/dev/null | grep -Eq -- "$want" && break
		fi
		kill -0 "$NETNS_SERVER" 2>/dev/null || break
		sleep 0.05
	done
	netns_pair_client "$name" "$limit" "$@"
}

# netns_perftest_cm NAME WANT TIMEOUT SERVER-CMD... -- CLIENT-CMD...:
# netns_cm_pair for perftest -R, tried again (up to five times) while the
# client was refused for its second connection (perftest_cm says why).
netns_perftest_cm() {
	local try
	for ((try = 1; try <= 5; try++)); do
		netns_cm_pair "$@" 2>"$WORK/$1.why" && return 0
		grep -qF 'RDMA_CM_EVENT_REJECTED; error: 8' "$WORK/$1.b" || break
	done
	cat "$WORK/$1.why" >&2
	return 1
}

# The client half of both: runs it, waits for the server NETNS_SERVER.
netns_pair_client() {
	local name=$1 limit=$2 rc_a rc_b
	shift 2
	run_b timeout "$limit" "$@" >"$WORK/$name.b" 2>&1
	rc_b=$?
	wait "$NETNS_SERVER"
	rc_a=$?
	((rc_a == 0 && rc_b == 0)) && return 0
	echo "  $name: server exit $rc_a, client exit $rc_b" >&2
	sed "s/^/  $name.a: /" "$WORK/$name.a" >&2
	sed "s/^/  $name.b: /" "$WORK/$name.b" >&2
	return 1
}

# now: seconds since the epoch with microseconds.
now() { printf '%s\n' "${EPOCHREALTIME/,/.}"; }
# stat_sum NAME FILE...: the sum of counter NAME over the SROCE_STATS=1
# lines in FILEs (0 when none has it).
stat_sum() { grep -ho "$1 [0-9]*" "${@:2}" | awk '{ s += $2 } END { print s + 0 }'; }

# elapsed START: seconds since START (from now), two decimals.
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# sroce_bg LOG CMD...: starts CMD under `sroce exec` in the background with
# stdout and stderr in LOG and the run_pair timeout; sets BG_PID.
sroce_bg() {
	local out=$1
	shift
	timeout -k 5 "$RP_TIMEOUT" "$SROCE_BIN" exec -- "$@" >"$out" 2>&1 &
	BG_PID=$!
	SROCE_BG_PIDS+=("$BG_PID")
}

# wait_for FILE SECONDS PATTERN PID: waits until FILE contains PATTERN;
# fails after SECONDS, or early once process PID has exited.
wait_for() {
	local deadline=$((SECONDS + $2))
	until grep -q -- "$3" "$1" 2>/dev/null; do
		kill -0 "$4" 2>/dev/null || return 1
		((SECONDS < deadline)) || return 1
		sleep 0.05
	done
}

# show_logs PREFIX: the last lines of PREFIX.server and PREFIX.client.
show_logs() {
	local f
	for f in server client; do
		[[ -s $1.$f ]] && tail -n 15 "$1.$f" | sed "s/^/  $f: /"
	done
	return 0
}

# kill_mid_stream NAME PREFIX SPID CPID: the kill tests' crash: once the
# client (started by sroce_bg, output PREFIX.client) has committed a
# record and a second has passed with both still running, the server dies
# by SIGKILL.  Then both are reaped: BG_RC is the client's status,
# KILLED_AT when the server died.  Fails (a failed check, both reaped) when
# the stream never started or ended before the kill.
kill_mid_stream() {
	local name=$1 out=$2 spid=$3 cpid=$4 why=
	if ! wait_for "$out.client" 60 "^committed " "$cpid"; then
		why="no record was committed"
	else
		sleep 1
		if ! kill -0 "$cpid" 2>/dev/null || ! kill -0 "$spid" 2>/dev/null; then
			why="the stream ended before the target was killed"
		fi
	fi
	if [[ -n $why ]]; then
		fail "$name: $why"
		show_logs "$out"
	fi
	kill -9 "$spid" 2>/dev/null
	# shellcheck disable=SC2034 # for the caller
	KILLED_AT=$(now)
	# (bash reports the killed job on stderr)
	bg_wait "$spid" 2>/dev/null
	bg_wait "$cpid"
	[[ -z $why ]]
}

# check_log_head NAME VERIFY-OUTPUT LAST DEPTH: the kill tests' verdict on
# a remote log after the crash: --verify's head must cover the LAST
# completed commit and be at most DEPTH (the appends in flight) past it.
check_log_head() {
	local name=$1 out=$2 last=$3 depth=$4 head
	head=$(sed -n 's/^log ok: \([0-9]*\) records$/\1/p' "$out")
	if [[ -z $head ]]; then
		fail "$name: --verify printed no head: $(cat "$out")"
	elif ((head < last)); then
		fail "$name: head $head < $last, the last completed commit"
	elif ((head > last + depth)); then
		fail "$name: head $head is more than $depth records past $last"
	else
		pass "$name: head $head covers the $last completed commits, every record valid"
	fi
}

# bg_wait PID: waits for a process started by sroce_bg and sets BG_RC to its
# exit status.  The id is forgotten afterwards, so the exit trap never signals
# an unrelated process that happens to reuse it.
bg_wait() {
	local pid=$1 p keep=()
	BG_RC=0
	wait "$pid" || BG_RC=$?
	for p in "${SROCE_BG_PIDS[@]}"; do
		[[ $p == "$pid" ]] || keep+=("$p")
	done
	SROCE_BG_PIDS=("${keep[@]}")
}

# run_pair SERVER-CMD... -- CLIENT-CMD...
# Runs a client/server pair over sroce: the server in the background, the
# client once the server's TCP port listens, each under `sroce exec` and
# killed after RP_TIMEOUT seconds.  Every @PORT@ in either command is replaced
# by a fresh TCP port.  Succeeds when both exit 0; otherwise prints why and
# both logs.  Leaves RP_PORT, RP_SERVER_LOG, RP_CLIENT_LOG (stdout+stderr),
# RP_SERVER_RC, RP_CLIENT_RC and RP_SECONDS (wall time of the pair) behind.
RP_SEQ=0
run_pair() {
	local server=() client=() arg seen=0
	next_port
	RP_PORT=$PORT
	for arg in "$@"; do
		if ((!seen)) && [[ $arg == -- ]]; then
			seen=1
			continue
		fi
		arg=${arg//@PORT@/$RP_PORT}
		if ((seen)); then client+=("$arg"); else server+=("$arg"); fi
	done
	((seen && ${#server[@]} && ${#client[@]})) || die "run_pair SERVER-CMD... -- CLIENT-CMD..."
	[[ " $* " == *@PORT@* ]] || die "run_pair: the commands must name their port as @PORT@"

	RP_SEQ=$((RP_SEQ + 1))
	RP_SERVER_LOG=$WORK/pair$RP_SEQ.server.log
	RP_CLIENT_LOG=$WORK/pair$RP_SEQ.client.log
	RP_SERVER_RC=
	RP_CLIENT_RC=
	: >"$RP_CLIENT_LOG"
	local start why=
	start=$(now)
	sroce_bg "$RP_SERVER_LOG" "${server[@]}"
	local spid=$BG_PID
	if wait_listen "$RP_PORT" "$spid"; then
		RP_CLIENT_RC=0
		timeout -k 5 "$RP_TIMEOUT" "$SROCE_BIN" exec -- "${client[@]}" >"$RP_CLIENT_LOG" 2>&1 ||
			RP_CLIENT_RC=$?
		[[ $RP_CLIENT_RC == 0 ]] || why="client exited $RP_CLIENT_RC"
	else
		why="server did not listen on TCP port $RP_PORT within ${RP_LISTEN_WAIT}s"
		kill "$spid" 2>/dev/null || true
	fi
	bg_wait "$spid"
	RP_SERVER_RC=$BG_RC
	# shellcheck disable=SC2034 # for the caller
	RP_SECONDS=$(elapsed "$start")
	if [[ $RP_SERVER_RC != 0 ]]; then
		why="${why:+$why; }server exited $RP_SERVER_RC"
	fi
	[[ $RP_SERVER_RC == 124 || $RP_CLIENT_RC == 124 ]] && why="$why (124: timed out after ${RP_TIMEOUT}s)"
	if [[ -n $why ]]; then
		{
			echo "run_pair failed: $why"
			echo "--- server: ${server[*]}"
			cat "$RP_SERVER_LOG"
			echo "--- client: ${client[*]}"
			cat "$RP_CLIENT_LOG"
			echo "---"
		} >&2
		return 1
	fi
	return 0
}

# wait_cm_listen PORT PID: waits until the agent lists an rdma_cm listener
# on PORT (up to 15 s); fails early when PID has exited.
wait_cm_listen() {
	local i
	for ((i = 0; i < 150; i++)); do
		"$SROCE_BIN" -j agent status 2>/dev/null | grep -q "\"port\":$1[,}]" && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# cm_pair NAME PORT SERVER-CMD... -- CLIENT-CMD...: like run_pair, for
# programs whose server listens on an rdma_cm port (not TCP): the client
# starts once the agent lists the server's listener on PORT.  Logs go to
# $WORK/NAME.server and $WORK/NAME.client.
cm_pair() {
	local name=$1 port=$2 server=() client=() seen=0 arg
	shift 2
	for arg in "$@"; do
		if ((!seen)) && [[ $arg == -- ]]; then
			seen=1
			continue
		fi
		if ((seen)); then client+=("$arg"); else server+=("$arg"); fi
	done
	sroce_bg "$WORK/$name.server" "${server[@]}"
	local spid=$BG_PID crc=0
	if wait_cm_listen "$port" "$spid"; then
		timeout -k 5 60 "$SROCE_BIN" exec -- "${client[@]}" >"$WORK/$name.client" 2>&1 || crc=$?
	else
		crc=1
		echo "the server never listened on rdma_cm port $port" >"$WORK/$name.client"
		kill "$spid" 2>/dev/null || true
	fi
	# A failed client leaves its server waiting: no point in waiting too.
	((crc == 0)) || kill "$spid" 2>/dev/null || true
	bg_wait "$spid"
	if ((crc == 0 && BG_RC == 0)); then
		return 0
	fi
	{
		echo "--- $name: client exit $crc, server exit $BG_RC"
		echo "--- server: ${server[*]}"
		cat "$WORK/$name.server"
		echo "--- client: ${client[*]}"
		cat "$WORK/$name.client"
	} >&2
	return 1
}

# stat_counter LOG DEV NAME: the counter NAME of the line SROCE_STATS printed
# for DEV (a sed pattern: "sroce_x[01]" matches either of two devices).
stat_counter() {
	# Not anchored: perftest ends its report without a newline.
	sed -n "s/^.*sroce: $2:.* $3 \([0-9]*\).*/\1/p" "$1" | head -n 1
}

# check_counters NAME DEV SERVER-LOG CLIENT-LOG EXPR...: each EXPR is "SIDE
# COUNTER OP VALUE" (SIDE server or client, OP ==, >, <= or <=%: at most
# VALUE per cent of the packets that side received), held against that side's
# SROCE_STATS line for DEV.  One check: passed with the client's
# "xfer: ... OK" line (or perftest's bandwidth), or failed naming every
# counter that missed.
check_counters() {
	local name=$1 dev=$2 slog=$3 clog=$4 side counter op want log got bad=
	shift 4
	for expr in "$@"; do
		read -r side counter op want <<<"$expr"
		log=$slog
		[[ $side == client ]] && log=$clog
		got=$(stat_counter "$log" "$dev" "$counter")
		if [[ -z $got ]]; then
			bad+=" $side's $counter missing;"
		elif ! case $op in
			'==') ((got == want)) ;;
			'>') ((got > want)) ;;
			'<=') ((got <= want)) ;;
			'<=%') ((got * 100 <= want * $(stat_counter "$log" "$dev" rx_pkts))) ;;
			*) die "check_counters: unknown operator $op" ;;
			esac then
			bad+=" $side $counter $got (want $op $want);"
		fi
	done
	if [[ -z $bad ]]; then
		local what
		what=$(grep -h '^xfer:.*OK' "$clog" | head -n 1 || true)
		[[ -n $what ]] || what="$(perftest_result "$clog") MB/s"
		pass "$name: $what"
	else
		fail "$name:$bad" "$(grep -h "sroce: $dev:" "$slog" "$clog")"
	fi
}

# perftest's -R makes two rdma_cm connections, the second to a listener the
# server creates only after the first: a client that is quicker is refused
# on any stack (REJ 8, no listener; for a UD id the SIDR_REP's status 1).
# perftest_cm NAME PORT REFUSAL LABEL SERVER... -- CLIENT...: cm_pair, tried
# again (up to five times: a busy host loses the race often) while the
# client's log shows REFUSAL; one check named LABEL, passed with the
# client's bandwidth.
#
# With LOSSY_CLOSE=1 (QPs that drop packets on purpose), a client that
# printed its report and then failed its closing exchange's send with status
# 12 (IBV_WC_RETRY_EXC_ERR) passes too: perftest's server exits as soon as it
# has received the client's last message, so when the ACK of that message is
# lost the client retransmits to a QP that no longer exists — the same
# outcome on any RNIC, and after the measured run.
perftest_cm() {
	local name=$1 port=$2 refusal=$3 label=$4 tries=0 result
	shift 4
	while :; do
		tries=$((tries + 1))
		if cm_pair "$name" "$port" "$@" 2>"$WORK/$name.why"; then
			pass "$label: $(perftest_result "$WORK/$name.client") MB/s (attempt $tries)"
			return
		fi
		result=$(perftest_result "$WORK/$name.client")
		if ((${LOSSY_CLOSE:-0})) && [[ -n $result ]] &&
			grep -q '^ *Bad wc status 12$' "$WORK/$name.client"; then
			pass "$label: $result MB/s (attempt $tries; the closing exchange lost its last ACK)"
			return
		fi
		((tries < 5)) && grep -qF "$refusal" "$WORK/$name.client" && continue
		cat "$WORK/$name.why" >&2
		fail "$label"
		return
	done
}

# perftest_result LOG: prints the main figure of a perftest report: the
# "BW average" column of a bandwidth test or "t_avg" of a latency test.
# Prints nothing when LOG has no result line.
perftest_result() {
	awk '
		/#bytes/ {
			line = $0
			gsub(/BW peak/, "BW_peak", line)
			gsub(/BW average/, "BW_average", line)
			n = split(line, h, " ")
			col = 0
			for (i = 1; i <= n; i++)
				if (h[i] ~ /^BW_average/ || h[i] ~ /^t_avg/) col = i
			next
		}
		col && $1 ~ /^[0-9]+$/ && NF >= col { print $col; exit }
	' "$1"
}

# pingpong_result LOG: prints "MBIT USEC" from an ibv_*_pingpong report.
pingpong_result() {
	awk '
		/bytes in .* seconds =/ { mbit = $(NF - 1) }
		/iters in .* seconds =/ { usec = $(NF - 1) }
		END { if (mbit != "" && usec != "") print mbit, usec }
	' "$1"
}

# Floating-point comparison: num_between X LOW HIGH (exclusive).
num_between() {
	awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x ~ /^[0-9.]+$/ && x + 0 > lo + 0 && x + 0 < hi + 0) }'
}

# Result bookkeeping for scripts that run many checks and report them all.
CHECKS_PASSED=0
CHECKS_FAILED=0
FAILED_CHECKS=()
pass() {
	CHECKS_PASSED=$((CHECKS_PASSED + 1))
	echo "ok   $*"
}
fail() {
	CHECKS_FAILED=$((CHECKS_FAILED + 1))
	FAILED_CHECKS+=("$1")
	echo "FAIL $*"
}
# finish: prints the tally and exits 1 if any check failed.
finish() {
	echo "$CHECKS_PASSED checks passed, $CHECKS_FAILED failed"
	if ((CHECKS_FAILED)); then
		printf '  failed: %s\n' "${FAILED_CHECKS[@]}"
		exit 1
	fi
	exit 0
}
