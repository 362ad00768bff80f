#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# sroce against Linux rxe over IPv6: the guest (qemu, Debian's kernel) on a
# tap in a network namespace created here, a dual-stack link as most are -
# host tap0 10.206.0.1 and fd00:206::1 (MAC 02:00:00:00:06:01, link-local
# fe80::ff:fe00:601), guest eth0 10.206.0.2 and fd00:206::2 (MAC
# 52:54:00:00:06:02, fe80::5054:ff:fe00:602).  Both devices follow their
# interface, so both GID tables are filled the kernel's way: the link-local
# GID at index 0, then the IPv4-mapped one, then the global IPv6 one.  Every
# case runs once with each side as the server (tests/vm/pairs.sh):
#   - ibv_rc_pingpong -g 0: the link-local GID, the index most programs
#     take when told nothing;
#   - sroce_xfer (a seeded random mix of RC operations, every byte checked),
#     ib_write_bw, and ib_send_bw over UD (the IPv6 GRH in the receive
#     buffer), with the global IPv6 GID;
#   - rdma_cm, the sroce agent's IB CM against the kernel's: rping -v -V to
#     the global address and to the link-local one with its scope, and
#     ucmatose (the kernel's cma.c checks the IPv6 addresses of the CM's
#     private-data header);
#   - FLUSH and ATOMIC WRITE through rdma_cm over IPv6 (tests/progs/a19_check
#     --case ops, rxe's region on the guest's emulated NVDIMM as device
#     DAX): every completion checked, the data read back.  Debian 12's
#     rdma-core 44 in the guest posts ATOMIC WRITE but no FLUSH, which
#     a19_check then says;
#   - with SROCE_VM_USERSPACE=ROOT (a Debian 13 root with this project built
#     in ROOT/src/build: test_trixie.sh): the guest's programs are the
#     root's, so rxe posts FLUSH too, and ib_write_bw -R over IPv6 with
#     perftest 25.01 (--ipv6-addr) on both sides; the host's side runs in the
#     root as well, with the root's build of sroce.
# The RoCEv2 traffic on the tap is captured; tests/vm/roce_peer_check.py
# recomputes the ICRCs of both sides over the IPv6 headers and checks that
# no RoCEv2 packet went over IPv4.
#
# Usage: test_rxe_ipv6.sh BUILD-DIR
# Skips (77) without root, /dev/net/tun, qemu or the guest's packages
# (scripts/setup.sh vm); the wire check needs tshark and scapy.
#
# ctest: TIMEOUT=600 LABELS=vm,netns PROCESSORS=2 RESOURCE_LOCK=vm-10.206
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_rxe_ipv6.sh BUILD-DIR}"
: "${VM_TIMEOUT:=420}"
: "${VM_MEM:=1G}"
# shellcheck source=../vm/vm.sh
. "$here/../vm/vm.sh"
# shellcheck source=../vm/pairs.sh
. "$here/../vm/pairs.sh"

((EUID == 0)) || skip "needs root for a network namespace and a tap device"
require_cmds ip ss timeout sysctl ibv_rc_pingpong ib_write_bw ib_send_bw rping ucmatose
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
a19=$BUILD_DIR/tests/progs/a19_check
xfer=$BUILD_DIR/tests/progs/sroce_xfer
[[ -x $a19 && -x $xfer ]] || die "a19_check or sroce_xfer is not built in $BUILD_DIR/tests/progs"
vm_init "$BUILD_DIR"
vm_require_rxe_flush
userspace=${SROCE_VM_USERSPACE:-}

ns=sroce-rxe6-$$
host_ip=10.206.0.1
guest_ip=10.206.0.2
host_ip6=fd00:206::1
guest_ip6=fd00:206::2
host_ll=fe80::ff:fe00:601
guest_ll=fe80::5054:ff:fe00:602
# A name of this test's own: the root's programs (SROCE_VM_USERSPACE) reach
# the agent through it.
export SROCE_AGENT_SOCKET=sroce-test-rxe6-$$
vm_cleanup_on_exit
vm_sroce_ns "$ns" "$host_ip" "$host_ip6" 02:00:00:00:06:01 52:54:00:00:06:02
vm_capture_or_not "${SROCE_VM_CAPTURE:-$WORK/tap0.pcap}"
pcap=$VM_PCAP

# sroce0's GID table, as test_gid_table.sh checks it for rxe's order.
# shellcheck disable=SC2016 # sh -c expands it
host_gids=$(vm_in_ns "$SROCE_BIN" exec -- sh -c \
	'for i in 0 1 2; do cat /sys/class/infiniband/sroce0/ports/1/gids/$i; done' 2>&1 | tr '\n' ' ')
want_gids="fe80:0000:0000:0000:0000:00ff:fe00:0601 0000:0000:0000:0000:0000:ffff:0ace:0001 fd00:0206:0000:0000:0000:0000:0000:0001 "
if [[ $host_gids == "$want_gids" ]]; then
	pass "sroce0 follows tap0 as rxe: GIDs $host_gids"
else
	fail "sroce0's GIDs 0-2: '$host_gids', expected '$want_gids'"
fi
hg6=2

# --- the cases -------------------------------------------------------------------
# @G6@ is rxe0's global IPv6 GID index (the guest finds it); the programs'
# TCP side channels go over IPv4.
pt="-F -s 65536 -n 100"
seed=${SROCE_TEST_XFER_SEED:-$$}
xargs_client="-n ${SROCE_TEST_XFER_ITERS:-400} --seed $seed --depth 8"
PAIRS_PORT=18700
PAIRS_CASES=(
	"pingpong_gid0_rxe_server|guest|ibv_rc_pingpong -d rxe0 -g 0 -p @PORT@|ibv_rc_pingpong -d sroce0 -g 0 -p @PORT@ $guest_ip|"
	"pingpong_gid0_sroce_server|host|ibv_rc_pingpong -d rxe0 -g 0 -p @PORT@ $host_ip|ibv_rc_pingpong -d sroce0 -g 0 -p @PORT@|"
	"xfer_rxe_server|guest|sroce_xfer -d rxe0 -g @G6@ -p @PORT@|$xfer -d sroce0 -g $hg6 -p @PORT@ $xargs_client $guest_ip|xfer"
	"xfer_sroce_server|host|sroce_xfer -d rxe0 -g @G6@ -p @PORT@ $xargs_client $host_ip|$xfer -d sroce0 -g $hg6 -p @PORT@|xfer"
	"ib_write_bw_rxe_server|guest|ib_write_bw -d rxe0 -x @G6@ $pt -p @PORT@|ib_write_bw -d sroce0 -x $hg6 $pt -p @PORT@ $guest_ip|"
	"ib_write_bw_sroce_server|host|ib_write_bw -d rxe0 -x @G6@ $pt -p @PORT@ $host_ip|ib_write_bw -d sroce0 -x $hg6 $pt -p @PORT@|"
	"ib_send_bw_ud_rxe_server|guest|ib_send_bw -d rxe0 -x @G6@ -c UD -s 1024 -n 200 -p @PORT@|ib_send_bw -d sroce0 -x $hg6 -c UD -s 1024 -n 200 -p @PORT@ $guest_ip|"
	"ib_send_bw_ud_sroce_server|host|ib_send_bw -d rxe0 -x @G6@ -c UD -s 1024 -n 200 -p @PORT@ $host_ip|ib_send_bw -d sroce0 -x $hg6 -c UD -s 1024 -n 200 -p @PORT@|"
	"rping_rxe_server|guest|rping -s -a $guest_ip6 -p @PORT@ -C 10 -v -V|rping -c -a $guest_ip6 -p @PORT@ -C 10 -v -V|rping:10"
	"rping_sroce_server|host|rping -c -a $host_ip6 -p @PORT@ -C 10 -v -V|rping -s -a $host_ip6 -p @PORT@ -C 10 -v -V|rping:10"
	"rping_link_local_rxe_server|guest|rping -s -a $guest_ll%eth0 -p @PORT@ -C 10 -v -V|rping -c -a $guest_ll%tap0 -p @PORT@ -C 10 -v -V|rping:10"
	"rping_link_local_sroce_server|host|rping -c -a $host_ll%eth0 -p @PORT@ -C 10 -v -V|rping -s -a $host_ll%tap0 -p @PORT@ -C 10 -v -V|rping:10"
	"ucmatose_rxe_server|guest|ucmatose -b $guest_ip6 -p @PORT@|ucmatose -s $guest_ip6 -p @PORT@|ucmatose"
	"ucmatose_sroce_server|host|ucmatose -s $host_ip6 -p @PORT@|ucmatose -b $host_ip6 -p @PORT@|ucmatose"
)
# FLUSH and ATOMIC WRITE.  What rxe's side can post decides what its
# client reports.
ops_all='ops: 4 FLUSH kinds and ATOMIC WRITE checked'
ops_guest=$ops_all
ga19=a19_check
if [[ -z $userspace ]]; then
	ops_guest='ATOMIC WRITE: IBV_WC_ATOMIC_WRITE, 8 bytes read back intact'
fi
truncate -s $((1 << 20)) "$WORK/target.pm"
PAIRS_CASES+=(
	"a19_rxe_server|guest|@A19@ --server -a $guest_ip6 -p @PORT@ --pmem /dev/dax0.0 --size $((4 << 20))|$a19 -p @PORT@ --case ops $guest_ip6|expect:$ops_all"
	"a19_sroce_server|host|@A19@ -p @PORT@ --case ops $host_ip6|$a19 --server -a $host_ip6 -p @PORT@ --pmem $WORK/target.pm --size $((1 << 20))|expect:$ops_guest"
)

overlay=$WORK/overlay
mkdir -p "$overlay/test"
if [[ -n $userspace ]]; then
	libdir=/usr/lib/x86_64-linux-gnu
	[[ -x $userspace/src/build/tests/progs/a19_check && -x $userspace/src/build/tools/sroce/sroce ]] ||
		die "no a19_check or sroce built in $userspace/src/build"
	vm_add_root_userspace "$overlay" "$userspace" userspace /src/build/tests/progs/a19_check \
		/usr/bin/ib_write_bw "$libdir/libibverbs/librxe-rdmav34.so"
	mkdir -p "$overlay/userspace/etc/libibverbs.d"
	cp "$userspace/etc/libibverbs.d/rxe.driver" "$overlay/userspace/etc/libibverbs.d/"
	ga19="chroot /userspace /src/build/tests/progs/a19_check"
	log "guest user space: $(cat "$userspace/etc/debian_version" 2>/dev/null) from $userspace"
	# The host's side of ib_write_bw -R: the root's perftest under the
	# root's sroce exec, in this namespace, with this test's links and agent.
	mkdir -p "$WORK/archives"
	cat >"$WORK/in-root" <<-EOF
		#!/usr/bin/env bash
		. "$here/lib.sh"
		. "$here/debroot.sh"
		DEBROOT_TIMEOUT=$PAIRS_SECS debroot_run "$userspace" "$WORK/archives" "$WORK:/work" -- \\
			env SROCE_CONFIG=/work/links.conf SROCE_AGENT_SOCKET=$SROCE_AGENT_SOCKET \\
			/src/build/tools/sroce/sroce exec -- "\$@"
	EOF
	rpt="-d @DEV@ -R --ipv6-addr -F -s 65536 -n 100 -p @PORT@"
	rg="chroot /userspace ib_write_bw ${rpt//@DEV@/rxe0}"
	rh="noexec bash $WORK/in-root ib_write_bw ${rpt//@DEV@/sroce0}"
	PAIRS_CASES+=(
		"ib_write_bw_R_rxe_server|guest|$rg|$rh $guest_ip6|perftest_R"
		"ib_write_bw_R_sroce_server|host|$rg $host_ip6|$rh|perftest_R"
	)
else
	vm_add_program "$overlay" "$a19"
	log "ib_write_bw -R over IPv6 needs perftest 25.01 on both sides: run by test_trixie.sh"
fi
vm_add_program "$overlay" "$xfer"

# shellcheck disable=SC2016 # the guest's shell expands these
{
	echo '. /etc/guest-lib.sh'
	echo 'rdma link add rxe0 type rxe netdev eth0 || exit 100'
	echo "G6=\$(gid_index_of rxe0 fd00:0206:) || { echo 'rxe0 has no GID of $guest_ip6'; exit 101; }"
	echo 'mark "GID $G6 $(cat /sys/class/infiniband/rxe0/ports/1/gids/0)"'
	echo 'step dax 60 ndctl create-namespace -f -e namespace0.0 -m devdax || exit 102'
	[[ -z $userspace ]] || vm_chroot_setup userspace
	echo 'failed=0'
	pairs_guest_script | sed -e 's/@G6@/$G6/g' -e "s#@A19@#$ga19#g"
	echo 'exit $failed'
} >"$overlay/test/run.sh"
vm_initrd "$overlay"

start_all=$SECONDS
vm_start_nvdimm "$ns" "$guest_ip" "guest.ip6=$guest_ip6/64"
if ! vm_wait 'GID ' 120; then
	vm_dump >&2
	die "the guest did not bring up rxe0"
fi
read -r _ g6 gid0 <<<"$(vm_marker 'GID ')"
echo "guest up in $((SECONDS - start_all)) s: rxe0's global IPv6 GID index $g6, GID 0 $gid0"
if [[ $gid0 == fe80:0000:0000:0000:5054:00ff:fe00:0602 ]]; then
	pass "rxe0's GID 0 is eth0's link-local address, as sroce0's is tap0's"
else
	fail "rxe0's GID 0 is $gid0"
fi

pairs_run
vm_finish 60

if [[ -n $pcap ]]; then
	rc=0
	vm_wire_check --ipv6-only --flush-forms "$pcap" "$host_ip6,$host_ll" "$guest_ip6,$guest_ll" || rc=$?
	if ((rc == 0)); then
		pass "wire: every RoCEv2 packet over IPv6, the ICRCs of both sides recomputed by scapy; FLUSH forms: $(vm_flush_forms)"
	elif ((rc == 1)); then
		fail "wire check (roce_peer_check.py --ipv6-only)"
	fi
	((rc == 2)) || sed 's/^/  /' "$WORK/check.log"
fi
vm_report "$start_all"
finish
