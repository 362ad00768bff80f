#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Debian's own, unmodified RDMA programs (ibverbs-utils, perftest) over two
# sroce devices on lo: sroce0 = 127.0.0.1 (servers), sroce1 = 127.0.0.2
# (clients).  Checks exit statuses on both sides and the figures the
# programs report, and prints those figures in a table at the end.
#
# Usage: test_real_clients.sh BUILD-DIR
# ctest: TIMEOUT=400 RESOURCE_LOCK=lo-127.0.0.1,lo-127.0.0.2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout ibv_devices ibv_devinfo ibv_rc_pingpong \
	ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat ib_atomic_bw ib_atomic_lat
require_loopback
sroce_config sroce0 127.0.0.1 sroce1 127.0.0.2
script_start=$(now)

# Rows of the final table: "TEST|OPTIONS|FIGURE|UNIT|SECONDS".
rows=()

# run_tool NAME CMD...: runs a one-shot command under sroce; leaves its
# stdout+stderr in $out.
run_tool() {
	local name=$1 rc=0
	shift
	out=$(timeout -k 5 30 "$SROCE_BIN" exec -- "$@" 2>&1) || rc=$?
	if ((rc)); then
		fail "$name" "(exit $rc): $out"
		return 1
	fi
	return 0
}

# expect_in NAME PATTERN: $out must contain the fixed string PATTERN.
expect_in() {
	if grep -qF -- "$2" <<<"$out"; then
		pass "$1: has '$2'"
	else
		fail "$1" "lacks '$2' in:"$'\n'"$out"
	fi
}

# --- device discovery --------------------------------------------------------
if run_tool ibv_devices ibv_devices; then
	for dev in sroce0 sroce1; do
		if grep -qE "^[[:space:]]*${dev}[[:space:]]" <<<"$out"; then
			pass "ibv_devices lists $dev"
		else
			fail "ibv_devices lists $dev" "in:"$'\n'"$out"
		fi
	done
fi

if run_tool "ibv_devinfo -d sroce0" ibv_devinfo -d sroce0; then
	expect_in "ibv_devinfo -d sroce0" "hca_id:	sroce0"
	expect_in "ibv_devinfo -d sroce0" "PORT_ACTIVE (4)"
	expect_in "ibv_devinfo -d sroce0" "link_layer:		Ethernet"
	if grep -q "sroce1" <<<"$out"; then fail "ibv_devinfo -d sroce0" "also shows sroce1"; fi
fi

if run_tool "ibv_devinfo -v" ibv_devinfo -v; then
	expect_in "ibv_devinfo -v" "hca_id:	sroce0"
	expect_in "ibv_devinfo -v" "hca_id:	sroce1"
	# The GID table entry a RoCE v2 application selects with -g 1 / -x 1.
	if grep -qE 'GID\[ *1\]:[[:space:]]+::ffff:127\.0\.0\.1, RoCE v2' <<<"$out"; then
		pass "ibv_devinfo -v: sroce0 GID[1] ::ffff:127.0.0.1, RoCE v2"
	else
		fail "ibv_devinfo -v: sroce0 GID" "no 'GID[1]: ::ffff:127.0.0.1, RoCE v2' in:"$'\n'"$out"
	fi
	if grep -qE 'GID\[ *1\]:[[:space:]]+::ffff:127\.0\.0\.2, RoCE v2' <<<"$out"; then
		pass "ibv_devinfo -v: sroce1 GID[1] ::ffff:127.0.0.2, RoCE v2"
	else
		fail "ibv_devinfo -v: sroce1 GID" "no 'GID[1]: ::ffff:127.0.0.2, RoCE v2' in:"$'\n'"$out"
	fi
	n=$(grep -cE "state:[[:space:]]+PORT_ACTIVE" <<<"$out" || true)
	if [[ $n == 2 ]]; then pass "ibv_devinfo -v: both ports PORT_ACTIVE"; else fail "ibv_devinfo -v: PORT_ACTIVE" "$n ports active, expected 2"; fi
	n=$(grep -c "link_layer:[[:space:]]*Ethernet" <<<"$out" || true)
	if [[ $n == 2 ]]; then pass "ibv_devinfo -v: both link layers Ethernet"; else fail "ibv_devinfo -v: link_layer" "$n Ethernet ports, expected 2"; fi
fi

# --- ibv_rc_pingpong ---------------------------------------------------------
# Options this version of ibv_rc_pingpong has (its usage text goes to stdout
# or stderr, with a non-zero status, depending on the version).
pp_help=$(ibv_rc_pingpong -h 2>&1 || true)
pp_variants=("")
grep -q -- '--events' <<<"$pp_help" && pp_variants+=("-e")
grep -q -- '--new_send' <<<"$pp_help" && pp_variants+=("-N")
grep -q -- '--chk' <<<"$pp_help" && pp_variants+=("-c")
if grep -q -- '--events' <<<"$pp_help" && grep -q -- '--new_send' <<<"$pp_help" &&
	grep -q -- '--chk' <<<"$pp_help"; then
	pp_variants+=("-e -N -c")
fi

for opts in "${pp_variants[@]}"; do
	name="ibv_rc_pingpong -g 1${opts:+ $opts}"
	# shellcheck disable=SC2086 # opts is a list of options
	if run_pair ibv_rc_pingpong -d sroce0 -g 1 -p @PORT@ $opts -- \
		ibv_rc_pingpong -d sroce1 -g 1 -p @PORT@ $opts 127.0.0.1; then
		read -r mbit usec <<<"$(pingpong_result "$RP_CLIENT_LOG")" || true
		if [[ -n ${usec:-} ]] && num_between "$usec" 0 100000 && num_between "$mbit" 0 1e12; then
			pass "$name ($mbit Mbit/s, $usec usec/iter)"
			rows+=("ibv_rc_pingpong|-g 1 ${opts:-}|$usec|usec/iter|$RP_SECONDS")
		else
			fail "$name" "no plausible result in:"$'\n'"$(cat "$RP_CLIENT_LOG")"
		fi
		if [[ -z $(pingpong_result "$RP_SERVER_LOG") ]]; then
			fail "$name server" "printed no result:"$'\n'"$(cat "$RP_SERVER_LOG")"
		fi
	else
		fail "$name" "exit status (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
	fi
	mbit="" usec=""
done

# --- perftest ----------------------------------------------------------------
# Sizes and counts keep each run around a second on this machine.
perftest_run() {
	local tool=$1 extra=$2 args=() unit name fig wr_api
	case $tool in
	*_bw) unit=MB/s ;;
	*) unit=usec ;;
	esac
	case $tool in
	ib_atomic_bw) args=(-n 2000) ;;
	ib_atomic_lat) args=(-n 1000) ;;
	*_bw) args=(-s 65536 -n 2000) ;;
	*_lat) args=(-s 2 -n 1000) ;;
	esac
	# shellcheck disable=SC2206 # extra is a list of options
	args+=(-x 1 $extra)
	name="$tool ${args[*]}"
	if ! run_pair "$tool" -d sroce0 -p @PORT@ "${args[@]}" -- \
		"$tool" -d sroce1 -p @PORT@ "${args[@]}" 127.0.0.1; then
		fail "$name" "exit status (server $RP_SERVER_RC, client ${RP_CLIENT_RC:-not run})"
		return
	fi
	fig=$(perftest_result "$RP_CLIENT_LOG")
	if [[ $unit == MB/s ]] && num_between "$fig" 0 1e12; then
		pass "$name: $fig MB/s average"
	elif [[ $unit == usec ]] && num_between "$fig" 0 100000; then
		pass "$name: t_avg $fig usec"
	else
		fail "$name" "implausible or missing result '${fig}' in:"$'\n'"$(cat "$RP_CLIENT_LOG")"
		return
	fi
	# perftest enables its ibv_wr_* code path only on devices it recognizes
	# by vendor part id; the table shows which one ran.
	wr_api=$(sed -nE 's/^ *ibv_wr\* API *: *([A-Z]+).*/\1/p' "$RP_CLIENT_LOG" | head -n1)
	rows+=("$tool|${args[*]}${wr_api:+ [ibv_wr* $wr_api]}|$fig|$unit|$RP_SECONDS")
}

for tool in ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat ib_atomic_bw ib_atomic_lat; do
	perftest_run "$tool" ""
	perftest_run "$tool" "--use_old_post_send"
done

# --- two servers on one device ------------------------------------------------
# A device is shared (docs/shared-device.md): while one server holds sroce0,
# a second server opens sroce0 too, and each completes its exchange with its
# own client.
name="two servers on sroce0"
next_port
p1=$PORT
sroce_bg "$WORK/first.log" ibv_rc_pingpong -d sroce0 -g 1 -n 100 -c -p "$p1"
s1=$BG_PID
next_port
p2=$PORT
sroce_bg "$WORK/second.log" ibv_rc_pingpong -d sroce0 -g 1 -n 100 -c -p "$p2"
s2=$BG_PID
if wait_listen "$p1" "$s1" && wait_listen "$p2" "$s2"; then
	rc=0
	for p in "$p1" "$p2"; do
		timeout -k 5 "$RP_TIMEOUT" "$SROCE_BIN" exec -- ibv_rc_pingpong -d sroce1 -g 1 -n 100 -c \
			-p "$p" 127.0.0.1 >>"$WORK/clients.log" 2>&1 || rc=$?
	done
	bg_wait "$s1"
	r1=$BG_RC
	bg_wait "$s2"
	if ((rc == 0 && r1 == 0 && BG_RC == 0)); then
		pass "$name: both exchanges complete, buffers checked"
	else
		fail "$name" "clients $rc, servers $r1 $BG_RC:"$'\n'"$(cat "$WORK/first.log" "$WORK/second.log" "$WORK/clients.log")"
	fi
else
	fail "$name" "a server did not start:"$'\n'"$(cat "$WORK/first.log" "$WORK/second.log")"
fi

# --- summary -----------------------------------------------------------------
echo
echo "Measured over sroce on lo (server sroce0 127.0.0.1, client sroce1 127.0.0.2):"
printf '%-16s %-58s %10s %-9s %5s\n' test options result unit secs
printf '%-16s %-58s %10s %-9s %5s\n' ---- ------- ------ ---- ----
for row in "${rows[@]}"; do
	IFS='|' read -r t o f u s <<<"$row"
	printf '%-16s %-58s %10s %-9s %5s\n' "$t" "$o" "$f" "$u" "$s"
done
echo "total $(elapsed "$script_start") s"
finish
