# SPDX-License-Identifier: MIT
# shellcheck shell=bash
#
# Client/server pairs between sroce on the host (in the namespace of
# vm_tap_ns) and the guest's Linux rxe, one program on each side: the
# cases of test_rxe_interop.sh and test_rxe_ipv6.sh.  Source after lib.sh
# and vm.sh.
#
#   PAIRS_CASES+=("NAME|SERVER-SIDE|GUEST-CMD|HOST-CMD|KIND")
#   pairs_guest_script >>run.sh     # the guest's lines, after `. /etc/guest-lib.sh`
#   (boot the guest)
#   pairs_run                       # runs every case; PAIRS_RESULTS[NAME] = its figure
#
# SERVER-SIDE is guest or host.  In both commands @PORT@ is the case's port
# (TCP, or rdma_cm's TCP port space; one per case from PAIRS_PORT on).  The
# guest's command runs as it is; the host's as a word list under
# `timeout "$PAIRS_SECS" sroce exec --` in the namespace, or without
# `sroce exec` when it starts with the word "noexec" (a program that sets up
# its own devices).  Both programs must exit 0, and by KIND:
#   (empty)     nothing more;
#   xfer        both print sroce_xfer's OK line;
#   rping:N     the client printed N pings, each compared with what it sent
#               (rping -V fails on a mismatch);
#   ucmatose    the client reports "return status 0";
#   expect:TEXT the client printed TEXT;
#   cmtime      the server serves until stopped, and is stopped once its
#               client is done; the client reports no failed connection;
#   perftest_R  perftest -R connects twice, the second time to a listener
#               its server makes only after the first: a client that is
#               quicker is refused (REJ 8) on any stack (and Debian's
#               perftest 4.5-0.17 crashes in its own retry, which uses the
#               ids it has just destroyed), so a refused attempt is tried
#               again, up to PAIRS_RACE_TRIES times.  The emulated rxe server
#               is slow to listen again: sroce's client is refused in about
#               one attempt of five, one of three on a busy host.
# A perftest program (ib_*) gives up before its test when a loaded host
# scatters the samples it calibrates its clock with ("Can't produce a
# report", r^2 < 0.9): such an attempt is run once more, as
# test_shared_device.sh does.

PAIRS_CASES=()
PAIRS_PORT=18515
PAIRS_SECS=90
PAIRS_RACE_TRIES=8
PAIRS_CMTIME_CONNS=100
declare -A PAIRS_RESULTS=()

# pairs_tries KIND COMMAND: how many times a case of KIND whose side runs
# COMMAND may run.
pairs_tries() {
	if [[ $1 == perftest_R ]]; then
		echo "$PAIRS_RACE_TRIES"
	elif [[ $2 == ib_* ]]; then
		echo 2
	else
		echo 1
	fi
}

# pairs_guest_script: the guest's side of every case, in order, each
# waiting for the host where the host's server has to be up first
# (guest-lib.sh's tries); counts failures in the guest's $failed.
pairs_guest_script() {
	local c name side gcmd kind port=$PAIRS_PORT
	for c in "${PAIRS_CASES[@]}"; do
		IFS='|' read -r name side gcmd _ kind <<<"$c"
		echo "tries $(pairs_tries "$kind" "$gcmd") $side $name $port $PAIRS_SECS ${gcmd//@PORT@/$port}" \
			"|| failed=\$((failed + 1))"
		port=$((port + 1))
	done
}

# pairs_listening PORT: whether TCP PORT listens in the namespace, or an
# rdma_cm id of the namespace's sroce agent.
pairs_listening() {
	[[ -n $(vm_in_ns ss -Hltn "( sport = :$1 )" 2>/dev/null) ]] ||
		vm_in_ns "$SROCE_BIN" -j agent status 2>/dev/null | grep -q "\"port\":$1[,}]"
}

# pairs_cmtime_figures LOG: connect and disconnect times from a cmtime report.
pairs_cmtime_figures() {
	awk '$1 == "connect" && $2 == ":" { c = $3 " ms (" $NF " us/conn)" }
		$1 == "disconnect" && $2 == ":" { d = $3 " ms (" $NF " us/conn)" }
		END { if (c != "") print "connect " c ", disconnect " d }' "$1"
}

# pairs_summary LOG: the figure a client printed.
pairs_summary() {
	local r mbit usec
	r=$(pingpong_result "$1")
	if [[ -n $r ]]; then
		read -r mbit usec <<<"$r"
		echo "$mbit Mbit/s, $usec usec/iter"
		return
	fi
	r=$(grep -E '^xfer: .* OK$' "$1" | tail -n 1)
	if [[ -n $r ]]; then
		echo "$r"
		return
	fi
	r=$(pairs_cmtime_figures "$1")
	if [[ -n $r ]]; then
		echo "$PAIRS_CMTIME_CONNS connections: $r"
		return
	fi
	r=$(grep -c '^ping data: rdma-ping-' "$1")
	if ((r)); then
		echo "$r pings verified"
		return
	fi
	grep -q '^return status 0' "$1" && echo "return status 0" && return
	r=$(grep -E 'ops: |ATOMIC WRITE: ' "$1" | tail -n 1)
	if [[ -n $r ]]; then
		echo "${r#a19_check client: }"
		return
	fi
	r=$(perftest_result "$1")
	[[ -n $r ]] && echo "BW average $r MB/s" || echo "no figure"
}

# pairs_kind_check KIND HOST-LOG GUEST-LOG CLIENT-LOG: why a pair whose
# programs both exited 0 fails by KIND's rule (nothing when it passes).
pairs_kind_check() {
	case $1 in
	xfer)
		if ! grep -q '^xfer: .* OK$' "$2" || ! grep -q '^xfer: .* OK$' "$3"; then
			echo "no OK line"
		fi
		;;
	rping:*)
		local n
		n=$(grep -c '^ping data: rdma-ping-' "$4")
		((n == ${1#rping:})) || echo "$n of ${1#rping:} pings verified"
		;;
	ucmatose)
		grep -q '^return status 0' "$4" || echo "no 'return status 0'"
		;;
	expect:*)
		grep -qF -- "${1#expect:}" "$4" || echo "no '${1#expect:}'"
		;;
	cmtime)
		if grep -Eq '^event: |RDMA_CM_EVENT_|fail' "$4"; then
			echo "a connection failed"
		elif [[ -z $(pairs_cmtime_figures "$4") ]]; then
			echo "no report"
		fi
		;;
	esac
}

# _pairs_attempt NAME SIDE PORT HCMD KIND: one run of a pair, the guest's
# step NAME, the host running HCMD; sets hrc and grc (the exit statuses,
# grc "none" when the guest reported none), why (what went wrong before
# either ran), and leaves the logs in $WORK/NAME.{host,guest}.log.
_pairs_attempt() {
	local name=$1 side=$2 port=$3 hcmd=$4 kind=$5 spid i stopped="" wrap
	wrap=(timeout -k 5 "$PAIRS_SECS" "$SROCE_BIN" exec --)
	if [[ $hcmd == "noexec "* ]]; then
		wrap=(timeout -k 5 "$PAIRS_SECS")
		hcmd=${hcmd#noexec }
	fi
	hlog=$WORK/$name.host.log
	glog=$WORK/$name.guest.log
	hrc=none grc=none why=
	: >"$hlog"
	: >"$glog"
	# shellcheck disable=SC2086 # hcmd is a word list
	if [[ $side == guest ]]; then
		if ! vm_wait "(NOT)?READY $name|DONE $name rc=" 150 ||
			[[ $(vm_marker "(NOT)?READY $name|DONE $name rc=") != "READY $name" ]]; then
			why="the rxe server in the guest did not start"
		else
			hrc=0
			vm_in_ns "${wrap[@]}" $hcmd >"$hlog" 2>&1 || hrc=$?
			if ((hrc != 0)); then
				vm_send "abort-$name" || true
			elif [[ $kind == cmtime ]]; then
				vm_send "stop-$name" || true
			fi
		fi
	else
		if ! vm_wait "WAIT $name" 150; then
			why="the guest did not reach this case"
			return
		fi
		# Not through a function, which would run in a subshell of its
		# own: $! must be timeout(1) (ip netns exec execs it), so that a
		# TERM reaches the server's whole process group.
		ip netns exec "$VM_NS" "${wrap[@]}" $hcmd >"$hlog" 2>&1 &
		spid=$!
		for ((i = 0; i < 200; i++)); do
			pairs_listening "$port" && break
			kill -0 "$spid" 2>/dev/null || break
			sleep 0.05
		done
		vm_send "go-$name" || log "$name: cannot reach the guest's control port"
	fi
	vm_wait "DONE $name rc=" $((PAIRS_SECS + 30)) || true
	grc=$(vm_marker "DONE $name rc=" | sed -n 's/.*rc=\([0-9]*\).*/\1/p')
	grc=${grc:-none}
	if [[ $side == host ]]; then
		# A server whose client failed waits for nobody; one that serves
		# until stopped is done when its client is.
		if [[ $grc != 0 || $kind == cmtime ]] && kill "$spid" 2>/dev/null; then
			stopped=1
		fi
		hrc=0
		wait "$spid" || hrc=$?
		# timeout(1) passes the TERM on and exits 128 + 15.
		[[ $kind == cmtime && $grc == 0 && -n $stopped && $hrc == 143 ]] && hrc=0
	fi
	vm_step_output "$name" >"$glog"
}

# pairs_run: every case of PAIRS_CASES, a check each (lib.sh's pass/fail).
pairs_run() {
	local c name side gcmd hcmd kind port=$PAIRS_PORT port_now t0 n try run secs client_log
	local hlog glog hrc grc why
	for c in "${PAIRS_CASES[@]}"; do
		IFS='|' read -r name side gcmd hcmd kind <<<"$c"
		hcmd=${hcmd//@PORT@/$port}
		port_now=$port
		port=$((port + 1))
		t0=$(now)
		n=$(pairs_tries "$kind" "$gcmd")
		for ((try = 1; ; try++)); do
			run=$name
			((try > 1)) && run=$name-$try
			_pairs_attempt "$run" "$side" "$port_now" "$hcmd" "$kind"
			[[ $hrc == 0 && $grc == 0 ]] && break
			# The guest waits for a word after a failed attempt it may repeat.
			if ((try >= n)) || [[ $grc == 0 || $grc == none ]]; then break; fi
			if [[ $side == guest ]]; then client_log=$hlog; else client_log=$glog; fi
			# perftest -R's second connection beat its listener (perftest_R).
			if grep -qF 'RDMA_CM_EVENT_REJECTED; error: 8' "$client_log" ||
				grep -qF "Can't produce a report" "$hlog" "$glog"; then
				vm_send "again-$name" || break
				continue
			fi
			vm_send "next-$name" || true
			break
		done
		secs=$(elapsed "$t0")
		if [[ $side == guest ]]; then client_log=$hlog; else client_log=$glog; fi
		if [[ -z $why ]]; then
			if [[ $hrc != 0 || $grc != 0 ]]; then
				why="sroce side exited $hrc, rxe side exited $grc"
			else
				why=$(pairs_kind_check "$kind" "$hlog" "$glog" "$client_log")
			fi
		fi
		if [[ -z $why ]]; then
			PAIRS_RESULTS[$name]=$(pairs_summary "$client_log")
			((try > 1)) && PAIRS_RESULTS[$name]+=" (attempt $try)"
			pass "$name (${secs}s): ${PAIRS_RESULTS[$name]}"
		else
			fail "$name: $why (${secs}s)"
			{
				echo "--- sroce (host) side: $hcmd"
				cat "$hlog"
				echo "--- rxe (guest) side:"
				cat "$glog"
				echo "---"
			} | sed 's/^/  /'
		fi
	done
}
