#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A configured link whose address is not on the host is a port that is
# down, as rxe's when its net device lost the address, and it breaks no
# program that uses the other devices.  In a network namespace of its own
# (a veth pair, both ends inside): ld0 on 10.28.0.1 and ld1 on 10.28.0.2,
# whose address is removed after `sroce link add`.
#
#   1. ld1's port is DOWN in `sroce link show`, ibv_devinfo and the sysfs
#      view of `sroce exec`; ld0's is ACTIVE; nothing on stderr.
#   2. ibv_rc_pingpong on ld0, fi_info and fi_pingpong through libfabric's
#      verbs and pmof providers on ld0 work, and say nothing about ld1.
#   3. A program holding ld1 open sees create_qp refused (EADDRNOTAVAIL),
#      then IBV_EVENT_PORT_ACTIVE once the address is added, then its QP
#      reaches RTS; IBV_EVENT_PORT_ERR when the veth loses its carrier,
#      and modify_qp to RTR refused (ENETDOWN).
#   4. ibv_rc_pingpong between ld0 and ld1 once the address is back.
#
# Usage: test_link_down.sh BUILD-DIR
# Exits 77 without root or network namespaces.  Traffic stays inside the
# namespace made here, so it takes no loopback address of the host.
#
# ctest: TIMEOUT=300 LABELS=netns
set -uo pipefail

if [[ -z ${SROCE_LINK_DOWN_NETNS:-} ]]; then
	((EUID == 0)) || { echo "SKIP: needs root for a network namespace" >&2; exit 77; }
	command -v unshare >/dev/null || { echo "SKIP: no unshare(1)" >&2; exit 77; }
	SROCE_LINK_DOWN_NETNS=1 exec unshare --net -- bash "$0" "$@"
fi

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ip ss ibv_devinfo ibv_rc_pingpong
PORT_CHECK=$BUILD_DIR/tests/progs/port_check
[[ -x $PORT_CHECK ]] || die "$PORT_CHECK is not built"

A=10.28.0.1
B=10.28.0.2
{ ip link set lo up &&
	ip link add ld-veth0 type veth peer name ld-veth1 &&
	ip link set ld-veth0 up && ip link set ld-veth1 up &&
	ip addr add $A/24 dev ld-veth0 && ip addr add $B/32 dev ld-veth0; } 2>"$WORK/ip.err" ||
	skip "cannot set up a veth pair in a new namespace: $(cat "$WORK/ip.err")"
# The veth's carrier comes a moment after both ends are up.
for _ in $(seq 50); do
	ip -o link show ld-veth0 | grep -q LOWER_UP && break
	sleep 0.1
done
export SROCE_CONFIG=$WORK/links.conf
"$SROCE_BIN" --config "$SROCE_CONFIG" link add ld0 netdev ld-veth0 addr $A || die "link add ld0"
"$SROCE_BIN" --config "$SROCE_CONFIG" link add ld1 netdev ld-veth0 addr $B || die "link add ld1"
ip addr del $B/32 dev ld-veth0 || die "cannot remove $B"
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"}

# No line on stderr may tell of ld1's address (the bind error every
# program printed before).
quiet_about_ld1() {
	local name=$1 file=$2
	if grep -a -E "ld1|$B|Cannot assign" "$file" >"$WORK/noise"; then
		fail "$name: stderr speaks of the down device" "$(cat "$WORK/noise")"
		return 1
	fi
}

# --- 1. the port's state, seen everywhere ----------------------------------------
show=$("$SROCE_BIN" link show 2>&1)
if grep -q "^link ld1/1 state DOWN physical_state DISABLED" <<<"$show" &&
	grep -q "^link ld0/1 state ACTIVE" <<<"$show"; then
	pass "sroce link show: ld1 DOWN, ld0 ACTIVE"
else
	fail "sroce link show" "$show"
fi

"$SROCE_BIN" exec -- ibv_devinfo >"$WORK/devinfo" 2>"$WORK/devinfo.err"
rc=$?
states=$(awk '/hca_id:/ { d = $2 } /state:/ && /PORT_/ { print d, $2 }' "$WORK/devinfo" | tr '\n' ' ')
if ((rc == 0)) && [[ $states == "ld0 PORT_ACTIVE ld1 PORT_DOWN " ]] && [[ ! -s $WORK/devinfo.err ]]; then
	pass "ibv_devinfo: both devices listed, ld1 PORT_DOWN, exit 0, nothing on stderr"
else
	fail "ibv_devinfo: exit $rc, states '$states'" "$(cat "$WORK/devinfo" "$WORK/devinfo.err")"
fi

sys=$("$SROCE_BIN" exec -- cat /sys/class/infiniband/ld1/ports/1/state \
	/sys/class/infiniband/ld1/ports/1/phys_state /sys/class/infiniband/ld0/ports/1/state 2>&1 |
	tr '\n' ',')
if [[ $sys == "1: DOWN,3: Disabled,4: ACTIVE," ]]; then
	pass "sysfs under sroce exec: ld1 1: DOWN (3: Disabled), ld0 4: ACTIVE"
else
	fail "sysfs under sroce exec: '$sys'"
fi

# --- 2. the other device works as before ------------------------------------------
if run_pair ibv_rc_pingpong -d ld0 -g 1 -p @PORT@ -- \
	ibv_rc_pingpong -d ld0 -g 1 -p @PORT@ $A &&
	grep -q "1000 iters" "$RP_CLIENT_LOG"; then
	quiet_about_ld1 "ibv_rc_pingpong -d ld0 (server)" "$RP_SERVER_LOG" &&
		quiet_about_ld1 "ibv_rc_pingpong -d ld0 (client)" "$RP_CLIENT_LOG" &&
		pass "ibv_rc_pingpong on ld0 while ld1 is down: $(pingpong_result "$RP_CLIENT_LOG")"
else
	fail "ibv_rc_pingpong on ld0 while ld1 is down"
fi

if command -v fi_pingpong >/dev/null; then
	export FI_PROVIDER_PATH=$BUILD_DIR/libfabric-glue
	fabric_init verbs pmof
	for prov in verbs pmof; do
		"$SROCE_BIN" exec -- fi_info -p $prov >"$WORK/fi_info.$prov" 2>"$WORK/fi_info.$prov.err"
		rc=$?
		if ((rc == 0)) && grep -q "domain: ld0$" "$WORK/fi_info.$prov" &&
			! grep -q "domain: ld1" "$WORK/fi_info.$prov" &&
			quiet_about_ld1 "fi_info -p $prov" "$WORK/fi_info.$prov.err"; then
			pass "fi_info -p $prov: ld0 offered, ld1 not"
		else
			fail "fi_info -p $prov: exit $rc" "$(cat "$WORK/fi_info.$prov" "$WORK/fi_info.$prov.err")"
		fi
		if run_pair fi_pingpong -p $prov -e msg -c -I 10 -S 4096 -B @PORT@ -- \
			fi_pingpong -p $prov -e msg -c -I 10 -S 4096 -P @PORT@ $A &&
			grep -q '=10 ' "$RP_CLIENT_LOG"; then
			quiet_about_ld1 "fi_pingpong -p $prov (server)" "$RP_SERVER_LOG" &&
				quiet_about_ld1 "fi_pingpong -p $prov (client)" "$RP_CLIENT_LOG" &&
				pass "fi_pingpong -p $prov -e msg -c on ld0 while ld1 is down"
		else
			fail "fi_pingpong -p $prov -e msg -c on ld0 while ld1 is down"
		fi
	done
else
	log "skip fi_pingpong: not installed (libfabric-bin)"
fi

# --- 3. a program holding ld1 open sees it come up and go down --------------------
out=$WORK/port_check
"$SROCE_BIN" exec -- "$PORT_CHECK" ld1 state qp wait PORT_ACTIVE 20 state qp \
	wait PORT_ERR 20 state qp >"$out" 2>"$out.err" &
pc=$!
SROCE_BG_PIDS+=("$pc")
if wait_for "$out" 20 "^waiting PORT_ACTIVE" "$pc"; then
	t0=$(now)
	ip addr add $B/32 dev ld-veth0 || die "cannot add $B"
	if wait_for "$out" 20 "^event PORT_ACTIVE" "$pc"; then
		log "IBV_EVENT_PORT_ACTIVE $(elapsed "$t0") s after the address was added"
	fi
	if wait_for "$out" 20 "^waiting PORT_ERR" "$pc"; then
		# Both ends of a veth must be up for carrier: ld-veth0 loses it.
		ip link set ld-veth1 down || die "cannot take ld-veth1 down"
	fi
fi
bg_wait "$pc"
expect="state PORT_DOWN
qp create_qp: Cannot assign requested address
waiting PORT_ACTIVE
event PORT_ACTIVE
state PORT_ACTIVE
qp ok
waiting PORT_ERR
event PORT_ERR
state PORT_DOWN
qp modify_qp RTR: Network is down"
if ((BG_RC == 0)) && [[ $(cat "$out") == "$expect" ]] && [[ ! -s $out.err ]]; then
	pass "ld1 held open: create_qp EADDRNOTAVAIL, PORT_ACTIVE on the address, a QP to RTS," \
		"PORT_ERR on carrier loss, RTR ENETDOWN"
else
	fail "port_check ld1: exit $BG_RC" "$(cat "$out" "$out.err")"
fi
ip link set ld-veth1 up
for _ in $(seq 50); do
	[[ $("$SROCE_BIN" link show ld1 2>&1) == *"state ACTIVE"* ]] && break
	sleep 0.1
done

# --- 4. the device that came up carries traffic ------------------------------------
if run_pair ibv_rc_pingpong -d ld1 -g 1 -p @PORT@ -- \
	ibv_rc_pingpong -d ld0 -g 1 -p @PORT@ $B &&
	grep -q "1000 iters" "$RP_CLIENT_LOG"; then
	pass "ibv_rc_pingpong ld0 -> ld1 once $B is back: $(pingpong_result "$RP_CLIENT_LOG")"
else
	fail "ibv_rc_pingpong ld0 -> ld1 once $B is back"
fi

finish
