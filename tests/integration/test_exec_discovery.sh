#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Discoverability outside libibverbs: under `sroce exec` the devices appear in
# /sys/class/infiniband, /sys/class/infiniband_verbs and /dev/infiniband with
# the values libibverbs reports (GIDs, GUID, port state, net device), UCX's
# `ucx_info -d` lists them, and `rdma link show [-j]` lists the links; a
# kernel's own devices (a fake rxe0 in a namespace of the test) stay next to
# them; the host's /sys and /dev, and every program outside `sroce exec`, see
# nothing of it.  Without root, `sroce exec` uses a user namespace (checked as
# nobody), and where no namespace can be made it runs the program as before
# with a one-line notice.
#
# Usage: test_exec_discovery.sh BUILD-DIR
#
# ctest: TIMEOUT=180 RESOURCE_LOCK=lo-127.0.14.1,lo-127.0.14.2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ibv_devinfo ucx_info rdma python3
require_loopback
sroce_config sroce0 127.0.14.1 sroce1 127.0.14.2
cd /

# A program under `sroce exec`; stderr is kept apart so a notice shows up.
inside() { "$SROCE_BIN" exec -- "$@" 2>>"$WORK/inside.err"; }

probe=$("$SROCE_BIN" exec -- true 2>&1)
[[ -z $probe ]] || skip "sroce exec cannot make a mount namespace here: $probe"

host_class=$(ls -A /sys/class)
[[ -e /sys/class/infiniband/sroce0 || -e /sys/class/infiniband_verbs/uverbs100 ]] &&
	skip "the host already shows sroce0 in /sys/class (run inside 'sroce exec'?)"

# Kernel-style strings to addresses, so "fe80:0000:...:0e01" == "fe80::e01".
same_ip() {
	python3 -c 'import ipaddress, sys
sys.exit(ipaddress.ip_address(sys.argv[1]) != ipaddress.ip_address(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

check() { # check NAME GOT WANT
	if [[ $2 == "$3" ]]; then pass "$1"; else fail "$1: got '$2', expected '$3'"; fi
}

# --- (a) the tree, against ibv_devinfo -v (ibv_query_gid, ibv_query_port) ---
lo_real=$(readlink -f /sys/class/net/lo)
for dev in sroce0 sroce1; do
	ib=/sys/class/infiniband/$dev
	port=$ib/ports/1
	info=$(inside ibv_devinfo -v -d "$dev")
	[[ -n $info ]] || fail "$dev: ibv_devinfo -v printed nothing"
	for i in 0 1; do
		line=$(sed -n "s/^[[:space:]]*GID\[ *$i\]:[[:space:]]*//p" <<<"$info")
		want=${line%%,*}
		got=$(inside cat "$port/gids/$i")
		if same_ip "$want" "$got"; then
			pass "$dev: gids/$i $got = ibv_query_gid $want"
		else
			fail "$dev: gids/$i '$got' differs from ibv_devinfo's '$want'"
		fi
		check "$dev: ibv_devinfo GID[$i] type" "${line#*, }" "RoCE v2"
		check "$dev: gid_attrs/types/$i" "$(inside cat "$port/gid_attrs/types/$i")" "RoCE v2"
		check "$dev: gid_attrs/ndevs/$i" "$(inside cat "$port/gid_attrs/ndevs/$i")" lo
	done
	want=$(sed -n 's/^[[:space:]]*node_guid:[[:space:]]*//p' <<<"$info")
	check "$dev: node_guid" "$(inside cat "$ib/node_guid")" "$want"
	check "$dev: port state" "$(inside cat "$port/state")" "4: ACTIVE"
	check "$dev: phys_state" "$(inside cat "$port/phys_state")" "5: LinkUp"
	check "$dev: link_layer" "$(inside cat "$port/link_layer")" Ethernet
	check "$dev: node_type" "$(inside cat "$ib/node_type")" "1: CA"
	check "$dev: device/net lists the configured netdev" "$(inside ls "$ib/device/net")" lo
	check "$dev: device/net/lo resolves to the interface" \
		"$(inside readlink -f "$ib/device/net/lo")" "$lo_real"

	# shellcheck disable=SC2016 # expanded by the inner shell
	uv=$(inside sh -c 'grep -lx "$1" /sys/class/infiniband_verbs/*/ibdev' sh "$dev")
	uv=$(basename "$(dirname "$uv")")
	check "$dev: ibv_device dev_name has a uverbs entry" "$uv" \
		"$(inside python3 -c 'import ctypes, sys
class Dev(ctypes.Structure):
    _fields_ = [("pad", ctypes.c_char * 16), ("node_type", ctypes.c_int),
                ("transport_type", ctypes.c_int), ("name", ctypes.c_char * 64),
                ("dev_name", ctypes.c_char * 64)]
v = ctypes.CDLL(None)  # the preloaded shim comes first
v.ibv_get_device_list.restype = ctypes.POINTER(ctypes.POINTER(Dev))
n = ctypes.c_int()
lst = v.ibv_get_device_list(ctypes.byref(n))
for i in range(n.value):
    if lst[i].contents.name.decode() == sys.argv[1]:
        print(lst[i].contents.dev_name.decode())' "$dev")"
	if inside test -c "/dev/infiniband/$uv" -a -r "/dev/infiniband/$uv" -a -w "/dev/infiniband/$uv"; then
		pass "$dev: /dev/infiniband/$uv is a character device open for reading and writing"
	else
		fail "$dev: /dev/infiniband/$uv is not a usable character device"
	fi
	node=$(inside stat -c '%t %T' "/dev/infiniband/$uv")
	check "$dev: infiniband_verbs/$uv/dev matches the node" \
		"$(inside cat "/sys/class/infiniband_verbs/$uv/dev")" "$((0x${node% *})):$((0x${node#* }))"
done
check "infiniband_verbs/abi_version" "$(inside cat /sys/class/infiniband_verbs/abi_version)" 6
check "the host's classes are all there" \
	"$(inside ls -A /sys/class | grep -vx 'infiniband\|infiniband_verbs')" \
	"$(grep -vx 'infiniband\|infiniband_verbs' <<<"$host_class")"
check "the host's net devices are there" "$(inside ls /sys/class/net)" "$(ls /sys/class/net)"

# --- (b) UCX lists the devices ---
pairs() { awk '/# *Transport:/ { t = $3 } /# *Device:/ { print t, $3 }'; }
ucx=$(inside ucx_info -d | pairs)
for dev in sroce0 sroce1; do
	if grep -qx "rc_verbs $dev:1" <<<"$ucx"; then
		pass "ucx_info -d: rc_verbs on $dev:1"
	else
		fail "ucx_info -d lacks rc_verbs on $dev:1; it lists:"$'\n'"$ucx"
	fi
	grep -qx "ud_verbs $dev:1" <<<"$ucx" && log "(ucx_info -d also lists ud_verbs on $dev:1)"
done
# Without UCX's memory events (UCX_MEM_EVENTS=no, as in containers that
# forbid its hooks) its registration cache is off and UCX 1.11-1.14 fall back
# to implicit on-demand paging where a device offers it, then crash closing
# the device (a memory handle passed where parameters are due; about half the
# devices, by their key).  sroce does not offer it, as Linux rxe does not:
# five runs over two devices exit cleanly.
crashes=0 first=5
for run in 1 2 3 4 5; do
	if ! inside env UCX_MEM_EVENTS=no ucx_info -d >"$WORK/ucx_no_events.$run" 2>&1; then
		((crashes++ > 0)) || first=$run
	fi
done
if ((crashes == 0)) && grep -q "Memory domain: sroce1" "$WORK/ucx_no_events.5"; then
	pass "UCX_MEM_EVENTS=no ucx_info -d: 5 runs over both devices exit 0"
else
	fail "UCX_MEM_EVENTS=no ucx_info -d: $crashes of 5 runs failed" "$(tail -20 "$WORK/ucx_no_events.$first")"
fi
# The shim alone is not enough for UCX: it looks in /dev/infiniband.
ucx=$(SROCE_EXEC_NAMESPACE=0 "$SROCE_BIN" exec -- ucx_info -d 2>&1 | pairs)
if grep -q sroce <<<"$ucx"; then
	fail "ucx_info -d lists sroce devices without the mount namespace"
else
	pass "ucx_info -d lists no sroce device with SROCE_EXEC_NAMESPACE=0"
fi

# --- (c) rdma link show ---
text=$(inside rdma link show)
for dev in sroce0 sroce1; do
	if grep -q "^link $dev/1 state ACTIVE physical_state LINK_UP netdev lo " <<<"$text"; then
		pass "rdma link show: $dev/1"
	else
		fail "rdma link show lacks $dev/1:"$'\n'"$text"
	fi
done
json=$(inside rdma link show -j)
if python3 -c 'import json, sys
rows = [r for r in json.loads(sys.argv[1]) if r["ifname"].startswith("sroce")]
assert [r["ifname"] for r in rows] == ["sroce0", "sroce1"], rows
for r in rows:
    assert r["port"] == 1 and r["netdev"] == "lo" and r["state"] == "ACTIVE", r
    assert r["physical_state"] == "LINK_UP" and r["netdev_index"] == int(sys.argv[2]), r
    assert isinstance(r["ifindex"], int), r' "$json" "$(cat /sys/class/net/lo/ifindex)"; then
	pass "rdma link show -j: sroce0 and sroce1 with iproute2's keys"
else
	fail "rdma link show -j: $json"
fi
check "rdma -j link is sroce link show -j" "$(inside rdma -j link | python3 -c 'import json, sys
print(json.dumps([r for r in json.load(sys.stdin) if r["ifname"].startswith("sroce")]))')" \
	"$("$SROCE_BIN" link show -j | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))')"
check "rdma link show sroce1/1" "$(inside rdma link show sroce1/1 | cut -d' ' -f1-2)" "link sroce1/1"
check "rdma -V is iproute2's" "$(inside rdma -V)" "$(rdma -V)"

# --- (d) nothing changes outside ---
"$SROCE_BIN" exec -- sleep 30 &
SROCE_BG_PIDS+=($!)
for _ in $(seq 50); do
	[[ $(readlink "/proc/$!/exe") == */sleep ]] && break
	sleep 0.1
done
check "the running program's tmpfs mounts" "$(grep -c ' - tmpfs sroce ' "/proc/$!/mountinfo")" 2
if grep -q ' - tmpfs sroce ' /proc/self/mountinfo; then
	fail "a mount of sroce exec reached the host"
else
	pass "no mount of sroce exec in the host's namespace"
fi
check "host /sys/class unchanged" "$(ls -A /sys/class)" "$host_class"
for p in /sys/class/infiniband/sroce0 /sys/class/infiniband_verbs/uverbs100 /dev/infiniband/uverbs100; do
	if [[ -e $p ]]; then fail "$p exists on the host"; else pass "$p does not exist on the host"; fi
done
kill "$!" 2>/dev/null
ucx=$(ucx_info -d 2>&1 | pairs)
if grep -q sroce <<<"$ucx"; then fail "ucx_info -d outside sroce exec lists sroce"; else
	pass "ucx_info -d outside sroce exec lists no sroce device"
fi
if rdma link show 2>/dev/null | grep -q sroce; then fail "rdma outside sroce exec lists sroce"; else
	pass "rdma link show outside sroce exec lists no sroce link"
fi
if [[ $(readlink -f "$(command -v rdma)") == "$(readlink -f "$SROCE_BIN")" ]]; then
	fail "rdma outside sroce exec is the wrapper"
else
	pass "rdma outside sroce exec is iproute2's"
fi

# --- the kernel's own devices stay: a fake rxe0 in a namespace of this test ---
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
	mkdir "$WORK/fake"
	# shellcheck disable=SC2016 # expanded by the inner shell
	out=$(unshare -m sh -c '
		set -e
		mount --make-rprivate /
		mount -t tmpfs fake "$1"
		mkdir "$1/ib" "$1/uv"
		ln -s ../../devices/virtual/infiniband/rxe0 "$1/ib/rxe0"
		ln -s ../../devices/virtual/infiniband_verbs/uverbs0 "$1/uv/uverbs0"
		echo 6 >"$1/uv/abi_version"
		mkdir "$1/class"
		mount --rbind /sys/class "$1/class"
		mount -t tmpfs class /sys/class
		for c in "$1"/class/*; do mkdir "/sys/class/${c##*/}"; mount --rbind "$c" "/sys/class/${c##*/}"; done
		mkdir /sys/class/infiniband /sys/class/infiniband_verbs
		mount --bind "$1/ib" /sys/class/infiniband
		mount --bind "$1/uv" /sys/class/infiniband_verbs
		exec "$2" exec -- sh -c "ls /sys/class/infiniband; ls /sys/class/infiniband_verbs; readlink /sys/class/infiniband/rxe0"
	' sh "$WORK/fake" "$SROCE_BIN" 2>&1)
	check "kernel devices are kept next to sroce's" "$(tr '\n' ' ' <<<"$out")" \
		"rxe0 sroce0 sroce1 abi_version uverbs0 uverbs100 uverbs101 ../../devices/virtual/infiniband/rxe0 "
fi

# --- without root ---
if [[ $(id -u) -ne 0 ]] || ! command -v setpriv >/dev/null; then
	log "(not root or no setpriv: the checks as nobody are skipped)"
	finish
fi
chmod 755 "$WORK"
chmod 644 "$SROCE_CONFIG"
nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
out=$(nobody "$SROCE_BIN" exec -- cat /sys/class/infiniband/sroce0/ports/1/gids/1 2>&1)
if [[ $out == "sroce: exec: "* ]]; then
	log "(no user namespace for nobody here: $out)"
else
	check "as nobody: gids/1 through a user namespace" "$out" \
		"$(inside cat /sys/class/infiniband/sroce0/ports/1/gids/1)"
	check "as nobody: the program runs as nobody" "$(nobody "$SROCE_BIN" exec -- id -un)" nobody
fi
# Where no namespace can be made (a root without CAP_SYS_ADMIN, in a user
# namespace allowing no further ones), the program runs with the shim only.
if unshare --user --map-root-user true 2>/dev/null; then
	out=$(unshare --user --map-root-user sh -c '
		echo 0 >/proc/sys/user/max_user_namespaces &&
		exec setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin "$@"' sh \
		"$SROCE_BIN" exec -- sh -c 'ls /sys/class/infiniband 2>/dev/null; ibv_devices' 2>"$WORK/fallback.err")
	rc=$?
	err=$(cat "$WORK/fallback.err")
	check "fallback: the program's status" "$rc" 0
	check "fallback: one line of notice" "$(wc -l <<<"$err")" 1
	if [[ $err == "sroce: exec: "*"do not show the sroce devices"* ]]; then
		pass "fallback: notice says why ($err)"
	else
		fail "fallback: notice is '$err'"
	fi
	if grep -q sroce0 <<<"$out" && ! grep -qx sroce0 <<<"$out"; then
		pass "fallback: libibverbs lists sroce0, /sys/class/infiniband does not"
	else
		fail "fallback: output was:"$'\n'"$out"
	fi
else
	log "(no user namespaces: the fallback check is skipped)"
fi

[[ -s $WORK/inside.err ]] && fail "programs under sroce exec printed: $(cat "$WORK/inside.err")"
finish
