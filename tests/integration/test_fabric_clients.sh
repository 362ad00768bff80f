#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Communication libraries nobody here wrote, over sroce, server and client
# as separate processes under `sroce exec`, each with its data checked:
#
#   - libfabric's verbs provider: fi_pingpong -c (checks every buffer) over
#     FI_EP_MSG (verbs, rdma_cm) and FI_EP_RDM (verbs;ofi_rxm), a few sizes;
#   - UCX: ucx_perftest over rc_verbs (UCT put, get, active messages; UCP
#     tags and RMA, with ud_verbs for the wire-up), UCT ud_verbs, and
#     tests/progs/ucp_sockaddr_check, a UCP client and server that connect
#     through UCX's rdmacm connection manager and check tagged messages and
#     RMA byte for byte;
#   - librpma: tests/progs/rpma_flush_check, rpma_write + rpma_flush +
#     rpma_read, compared on both sides;
#   - Open MPI and MPICH over UCX rc_verbs (no shared memory):
#     tests/progs/mpi_check, a ping-pong, allreduces and one-sided
#     MPI_Put/MPI_Get/MPI_Accumulate over four ranks, two per device;
#   - OpenSHMEM (Open MPI's, spml ucx): tests/progs/shmem_check, puts, gets,
#     a fenced flag and atomics over four PEs.
#
# Several perftest pairs at once on one pair of devices are
# test_shared_device.sh's.  A client whose package (or test program) is
# missing is skipped with a line saying why; one that is installed and
# fails fails the script.
#
# libfabric's verbs provider ignores devices on loopback interfaces, so the
# script runs in a network namespace of its own (unshare --net, hence root)
# with a veth pair whose ends hold 10.14.0.1 (sroce0) and 10.14.0.2
# (sroce1).  Both ends are local addresses of the namespace: rdma_cm
# resolves a client's route to 10.14.0.1 onto sroce0 itself, so the
# clients that let rdma_cm pick their device (fi_pingpong, librpma) share
# sroce0 with their server, while UCX (told its device, and for rdma_cm a
# source address) and MPI use one device per side.
#
# Usage: test_fabric_clients.sh BUILD-DIR
#
# ctest: TIMEOUT=300 LABELS=netns PROCESSORS=2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ -z ${SROCE_FABRIC_NETNS:-} ]]; then
	((EUID == 0)) || skip "needs root for a network namespace of its own"
	command -v ip >/dev/null || skip "ip (iproute2) not installed"
	unshare --net true 2>/dev/null || skip "cannot make a network namespace (unshare --net)"
	SROCE_FABRIC_NETNS=1 exec unshare --net -- bash "$0" "$@"
fi
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_cmds ss timeout
PROGS=$BUILD_DIR/tests/progs
# The libfabric runs: verbs, and ofi_rxm over it.
fabric_init verbs ofi_rxm
S=10.14.0.1 C=10.14.0.2

if ! { ip link set lo up &&
	ip link add fab0 type veth peer name fab1 &&
	ip addr add $S/24 dev fab0 &&
	ip addr add $C/24 dev fab1 &&
	ip link set fab0 up &&
	ip link set fab1 up; }; then
	die "cannot set up the namespace's veth pair"
fi
export SROCE_CONFIG=$WORK/links.conf
"$SROCE_BIN" --config "$SROCE_CONFIG" link add sroce0 netdev fab0 addr $S ||
	die "sroce link add sroce0 netdev fab0 failed"
"$SROCE_BIN" --config "$SROCE_CONFIG" link add sroce1 netdev fab1 addr $C ||
	die "sroce link add sroce1 netdev fab1 failed"
private_agent
"$SROCE_BIN" agent start ${SROCE_AGENT_LOG:+--log "$SROCE_AGENT_LOG"}

SKIPPED=0
skip_client() {
	SKIPPED=$((SKIPPED + 1))
	echo "skip $1: $2"
}

# The last line of fi_pingpong's table: "SIZE usec/xfer".
fi_result() { awk '$3 ~ /^=/ { r = $1 " " $7 " us" } END { print r }' "$1"; }

# --- libfabric ------------------------------------------------------------------
# fi_pingpong_pair NAME PROVIDER EP SIZE [ARG...]: one server/client pair,
# data checked (-c), 10 round trips.
#
# ofi_rxm (libfabric 1.17) has a race at the end of an RDM run: the server,
# done first, closes its connection; the client's progress finds its verbs
# CQ empty, reads the disconnection, closes its side and so flushes its last
# send ("fin", FI_TRANSMIT_COMPLETE) even when the peer had acknowledged it
# meanwhile; the client then exits 125 with "Work Request Flushed Error".
# The server can lose the same race to a client that closed first (seen
# once on a loaded machine: the server exited 125, the client 0).
# It takes a CQ that still looks empty when the disconnection is read:
# with an RNIC, a client preempted between its CQ and EQ reads; with sroce,
# whose completions wait for a thread of the process to receive the
# acknowledgement, any such thread kept off the CPU (an overloaded host).
# By then every round trip has been checked and reported, so that ending,
# and only it, counts as a pass.
FI_RACES=0
fi_pingpong_pair() {
	local name=$1 prov=$2 ep=$3 size=$4
	shift 4
	if run_pair fi_pingpong -p "$prov" -e "$ep" -c -I 10 -S "$size" -B @PORT@ "$@" -- \
		fi_pingpong -p "$prov" -e "$ep" -c -I 10 -S "$size" -P @PORT@ "$@" $S \
		2>"$WORK/fi_pingpong.why" && grep -q '=10 ' "$RP_CLIENT_LOG"; then
		FI_FIGS+="$(fi_result "$RP_CLIENT_LOG"), "
		return 0
	fi
	local lost=
	if [[ $RP_SERVER_RC == 0 && $RP_CLIENT_RC == 125 ]]; then
		lost=$RP_CLIENT_LOG
	elif [[ $RP_SERVER_RC == 125 && $RP_CLIENT_RC == 0 ]]; then
		lost=$RP_SERVER_LOG
	fi
	if [[ $ep == rdm && -n $lost ]] &&
		grep -q '=10 ' "$RP_SERVER_LOG" && grep -q '=10 ' "$RP_CLIENT_LOG" &&
		grep -q 'cq_readerr: Work Request Flushed Error' "$lost"; then
		FI_RACES=$((FI_RACES + 1))
		FI_FIGS+="$(fi_result "$RP_CLIENT_LOG"), "
		return 0
	fi
	cat "$WORK/fi_pingpong.why" >&2
	fail "fi_pingpong $name, $size bytes"
	return 1
}
if ! command -v fi_pingpong >/dev/null; then
	skip_client libfabric "fi_pingpong not installed (libfabric-bin; run scripts/setup.sh)"
elif ! "$SROCE_BIN" exec -- fi_info -p verbs -d sroce0 >"$WORK/fi_info.log" 2>&1; then
	fail "libfabric's verbs provider lists no sroce0" "$(cat "$WORK/fi_info.log")"
else
	FI_FIGS=
	ok=1
	for size in 1 4096 1048576; do
		fi_pingpong_pair "verbs msg" verbs msg "$size" || ok=0
	done
	((ok)) && pass "fi_pingpong -p verbs -e msg -c: ${FI_FIGS%, }"
	FI_FIGS=
	ok=1
	for size in 1 4096 1048576; do
		fi_pingpong_pair "verbs;ofi_rxm rdm" 'verbs;ofi_rxm' rdm "$size" || ok=0
	done
	fi_pingpong_pair "verbs;ofi_rxm rdm tagged" 'verbs;ofi_rxm' rdm 65536 -m tagged || ok=0
	races=
	((FI_RACES == 0)) || races=" ($FI_RACES ended by ofi_rxm's shutdown race)"
	((ok)) && pass "fi_pingpong -p 'verbs;ofi_rxm' -e rdm -c (msg; tagged at 64 KiB): ${FI_FIGS%, }$races"
fi

# --- UCX ------------------------------------------------------------------------
# The last line of ucx_perftest -f: iterations, then latency percentile,
# average and overall, then bandwidth average and overall.
ucx_lat() { awk 'NF >= 8 && $1 ~ /^[0-9]+$/ { r = $2 " us median" } END { print r }' "$1"; }
ucx_bw() { awk 'NF >= 8 && $1 ~ /^[0-9]+$/ { r = $6 " MB/s" } END { print r }' "$1"; }

# UCX's UD transport drops every datagram whose GRH does not name one of the
# device's GIDs; which bytes it compares it takes from the receive
# completion's sl, the RoCE network header type (2: IPv4).  UCP wires
# rc_verbs up through ud_verbs, so everything below needs that right.
if ! command -v ucx_perftest >/dev/null; then
	skip_client UCX "ucx_perftest not installed (ucx-utils; run scripts/setup.sh)"
else
	for t in "put_bw -D zcopy -s 65536 -n 500" "get -D zcopy -s 65536 -n 500" \
		"am_lat -s 8 -n 1000" "am_bw -D bcopy -s 4096 -n 1000"; do
		# shellcheck disable=SC2086 # $t is the test's arguments
		if run_pair ucx_perftest -p @PORT@ -- \
			ucx_perftest $S -p @PORT@ -d sroce0:1 -x rc_verbs -t $t -w 50 -f; then
			r=$(ucx_bw "$RP_CLIENT_LOG")
			[[ $t == *_lat* ]] && r=$(ucx_lat "$RP_CLIENT_LOG")
			pass "ucx_perftest -x rc_verbs -t ${t%% -n *}: $r"
		else
			fail "ucx_perftest -x rc_verbs -t ${t%% -n *}"
		fi
	done
	if RP_TIMEOUT=20 run_pair ucx_perftest -p @PORT@ -- \
		ucx_perftest "$S" -p @PORT@ -d sroce0:1 -x ud_verbs -t am_lat -s 8 -n 1000 -w 50 -f; then
		pass "ucx_perftest -x ud_verbs -t am_lat: $(ucx_lat "$RP_CLIENT_LOG")"
	else
		fail "ucx_perftest -x ud_verbs -t am_lat"
	fi
	# UCP between the two devices; ud_verbs only wires rc_verbs up.
	ucp_env=(env "UCX_TLS=rc_verbs,ud_verbs:aux")
	for t in "tag_lat -s 8 -n 1000" "tag_bw -s 1048576 -n 50" "ucp_put_bw -s 65536 -n 200" \
		"ucp_get -s 65536 -n 200"; do
		# shellcheck disable=SC2086 # $t is the test's arguments
		if run_pair "${ucp_env[@]}" UCX_NET_DEVICES=sroce0:1 ucx_perftest -p @PORT@ -- \
			"${ucp_env[@]}" UCX_NET_DEVICES=sroce1:1 ucx_perftest $S -p @PORT@ -t $t -w 20 -f; then
			r=$(ucx_bw "$RP_CLIENT_LOG")
			[[ $t == *_lat* ]] && r=$(ucx_lat "$RP_CLIENT_LOG")
			pass "ucx_perftest UCP -t ${t%% -n *} over rc_verbs, sroce0 <-> sroce1: $r"
		else
			fail "ucx_perftest UCP -t ${t%% -n *} over rc_verbs"
		fi
	done
fi
# Connection establishment through rdma_cm: the listener must show up in
# the agent, and both endpoints must have an rdmacm lane and carry the data
# over rc_verbs on their own device (the client's source address picks
# sroce1).
if [[ ! -x $PROGS/ucp_sockaddr_check ]]; then
	skip_client "UCX rdmacm" "$PROGS/ucp_sockaddr_check not built (libucx-dev; run scripts/setup.sh)"
else
	cm_env=(env UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_TLS=rc_verbs)
	if cm_pair ucp_sockaddr 7511 \
		"${cm_env[@]}" UCX_NET_DEVICES=sroce0:1 "$PROGS/ucp_sockaddr_check" server $S 7511 -- \
		"${cm_env[@]}" UCX_NET_DEVICES=sroce1:1 UCX_RDMA_CM_SOURCE_ADDRESS=$C \
		"$PROGS/ucp_sockaddr_check" client $S 7511 &&
		grep -q 'lane.*cm rdmacm' "$WORK/ucp_sockaddr.server" &&
		grep -q 'lane.*rc_verbs/sroce0:1' "$WORK/ucp_sockaddr.server" &&
		grep -q 'lane.*cm rdmacm' "$WORK/ucp_sockaddr.client" &&
		grep -q 'lane.*rc_verbs/sroce1:1' "$WORK/ucp_sockaddr.client"; then
		pass "UCP client/server through UCX's rdmacm: tags 1 B to 1 MiB, put/flush/get of 1 MiB checked"
	else
		fail "UCP client/server through UCX's rdmacm" "$(cat "$WORK"/ucp_sockaddr.* 2>/dev/null)"
	fi
fi

# --- librpma --------------------------------------------------------------------
if [[ ! -x $PROGS/rpma_flush_check ]]; then
	skip_client librpma "$PROGS/rpma_flush_check not built (librpma-dev; run scripts/setup.sh)"
elif cm_pair rpma 7510 "$PROGS/rpma_flush_check" server $S 7510 -- \
	"$PROGS/rpma_flush_check" client $S 7510 &&
	grep -q "hold the last round's pattern" "$WORK/rpma.server" &&
	grep -q '^round 3: .* equal' "$WORK/rpma.client"; then
	pass "librpma: 4 rounds of rpma_write + rpma_flush + rpma_read of 1 MiB, equal on both sides"
else
	fail "librpma rpma_flush_check"
fi

# four_ranks PROG OPT...: the MPMD arguments of four processes of PROG, in
# RANKS: 0 and 2 on sroce0, 1 and 3 on sroce1 (so each ping-pong pair
# crosses devices), each after OPT... with @DEV@ standing for its device.
four_ranks() {
	local prog=$1 dev a
	shift
	RANKS=()
	for dev in sroce0 sroce1 sroce0 sroce1; do
		((${#RANKS[@]} == 0)) || RANKS+=(:)
		for a in "$@"; do
			RANKS+=("${a//@DEV@/$dev}")
		done
		RANKS+=("$prog")
	done
}
ROOT=()
((EUID != 0)) || ROOT=(--allow-run-as-root)

# --- Open MPI -------------------------------------------------------------------
# UCX with rc_verbs only for data: no shared memory transport, and no BTL
# but self.
if ! command -v mpirun >/dev/null; then
	skip_client "Open MPI" "mpirun not installed (openmpi-bin; run scripts/setup.sh)"
elif [[ ! -x $PROGS/mpi_check ]]; then
	skip_client "Open MPI" "$PROGS/mpi_check not built (libopenmpi-dev; run scripts/setup.sh)"
else
	four_ranks "$PROGS/mpi_check" -np 1 -x UCX_NET_DEVICES=@DEV@:1
	start=$(now)
	rc=0
	timeout -k 5 60 "$SROCE_BIN" exec -- env UCX_TLS=rc_verbs,ud_verbs:aux \
		mpirun "${ROOT[@]}" --oversubscribe --mca pml ucx --mca osc ucx --mca btl self "${RANKS[@]}" \
		>"$WORK/mpi.log" 2>&1 || rc=$?
	if ((rc == 0)) && (($(grep -c '^ok ' "$WORK/mpi.log") == 11)); then
		pass "Open MPI, 4 ranks over UCX rc_verbs: ping-pong 1 B to 1 MiB, allreduces, alltoalls, MPI_Put/MPI_Get between fences and MPI_Accumulate/MPI_Fetch_and_op under a lock checked ($(elapsed "$start") s; $(awk '/^ok ping-pong 1 bytes/ { print $7 " us" }' "$WORK/mpi.log") one way)"
	else
		# 124: the ranks outlived timeout(1)'s 60 s.
		fail "Open MPI mpi_check: exit $rc after $(elapsed "$start") s, $(grep -c '^ok ' "$WORK/mpi.log") of 11 checks" \
			"$(cat "$WORK/mpi.log")"
	fi
fi

# --- MPICH ----------------------------------------------------------------------
# Debian's MPICH is ch4:ucx.  The same four ranks and checks as Open MPI's;
# MPIR_CVAR_NOLOCAL sends ranks on one host through the netmod (UCX) rather
# than shared memory.
if ! command -v mpiexec.mpich >/dev/null; then
	skip_client MPICH "mpiexec.mpich not installed (mpich; run scripts/setup.sh)"
elif [[ ! -x $PROGS/mpi_check_mpich ]]; then
	skip_client MPICH "$PROGS/mpi_check_mpich not built (libmpich-dev; run scripts/setup.sh)"
else
	four_ranks "$PROGS/mpi_check_mpich" -n 1 -env UCX_NET_DEVICES @DEV@:1
	start=$(now)
	if timeout -k 5 90 "$SROCE_BIN" exec -- env UCX_TLS=rc_verbs,ud_verbs:aux MPIR_CVAR_NOLOCAL=1 \
		mpiexec.mpich "${RANKS[@]}" >"$WORK/mpich.log" 2>&1 &&
		(($(grep -c '^ok ' "$WORK/mpich.log") == 11)); then
		pass "MPICH (ch4:ucx), 4 ranks over UCX rc_verbs: ping-pong 1 B to 1 MiB, allreduces, alltoalls, MPI_Put/MPI_Get between fences and MPI_Accumulate/MPI_Fetch_and_op under a lock checked ($(elapsed "$start") s; $(awk '/^ok ping-pong 1 bytes/ { print $7 " us" }' "$WORK/mpich.log") one way)"
	else
		fail "MPICH mpi_check" "$(cat "$WORK/mpich.log")"
	fi
fi

# --- OpenSHMEM ------------------------------------------------------------------
# Open MPI's OpenSHMEM with its UCX SPML: four PEs, two per device.  Open
# MPI 4.1.4's memory hooks for UCX crash every PE in shmem_init (SIGSEGV,
# over shared memory without sroce as much as over sroce), so they are off.
if ! command -v oshrun >/dev/null; then
	skip_client OpenSHMEM "oshrun not installed (openmpi-bin; run scripts/setup.sh)"
elif [[ ! -x $PROGS/shmem_check ]]; then
	skip_client OpenSHMEM "$PROGS/shmem_check not built (libopenmpi-dev; run scripts/setup.sh)"
else
	four_ranks "$PROGS/shmem_check" -np 1 -x UCX_NET_DEVICES=@DEV@:1
	start=$(now)
	if timeout -k 5 90 "$SROCE_BIN" exec -- env UCX_TLS=rc_verbs,ud_verbs:aux \
		oshrun "${ROOT[@]}" --oversubscribe --mca spml ucx --mca pml ucx --mca btl self \
		--mca opal_common_ucx_opal_mem_hooks 0 "${RANKS[@]}" \
		>"$WORK/shmem.log" 2>&1 && (($(grep -c '^ok ' "$WORK/shmem.log") == 6)); then
		pass "OpenSHMEM (Open MPI, spml ucx), 4 PEs over UCX rc_verbs: puts, gets and non-blocking puts of 8 B to 1 MiB, a fenced flag, and atomics checked ($(elapsed "$start") s)"
	else
		fail "OpenSHMEM shmem_check" "$(cat "$WORK/shmem.log")"
	fi
fi

if ((CHECKS_PASSED + CHECKS_FAILED == 0)); then
	skip "none of the clients is installed ($SKIPPED skipped)"
fi
finish
