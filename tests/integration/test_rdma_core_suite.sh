#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# rdma-core's own test suite (the pyverbs tests Debian ships in
# python3-pyverbs under /usr/share/doc/rdma-core/tests) over one sroce
# device, unmodified: copied to a temporary directory, unpacked and run
# under `sroce exec` with /usr/bin/python3 (the interpreter pyverbs is built
# for).  tests/integration/rdma_core_suite.py runs it (a run that hangs is
# killed after RUN_TIMEOUT seconds and the remaining tests go on in a new
# run), parses unittest's output and judges every test:
#
#   - a test that fails, errors, hangs or crashes fails this script;
#   - a skipped test is fine only when its skip reason matches ACCEPTABLE
#     (for good: hardware, interfaces or host setup sroce will never have),
#     or its name matches NOT_YET (a feature sroce must still gain);
#     any other skip fails this script;
#   - a test listed in NOT_YET that passes prints a notice to remove it from
#     the list.
#
# tests/pyverbs/test_*.py, this project's own tests written on the suite's
# harness (tests.base, tests.utils), run with it and are judged alike.
#
# Prints a summary per test module and per feature, and writes every non-ok
# test with its reason, grouped by feature, to BUILD-DIR/rdma-core-suite.md
# (unittest's own output: BUILD-DIR/rdma-core-suite.log).
#
# The device's address must be the first address of its net interface: the
# rdma_cm tests take it from `ip addr show` of the device's netdev (on lo
# that is 127.0.0.1, which no sroce device has).  So, as root, the script
# runs in a network namespace of its own (unshare --net) with the device on
# a veth whose only address is 10.13.0.1; otherwise on lo at 127.0.13.1
# (tests/README.md) or SROCE_SUITE_ADDR (test_trixie.sh's Debian 13 root
# uses 127.0.17.3), where the rdma_cm tests are expected to fail.
#
# Usage: test_rdma_core_suite.sh BUILD-DIR
#
# ctest: TIMEOUT=900 LABELS=rdma-core RESOURCE_LOCK=lo-127.0.13.1
set -uo pipefail
if [[ -z ${SROCE_SUITE_NETNS:-} ]] && ((EUID == 0)) && command -v ip >/dev/null &&
	unshare --net true 2>/dev/null; then
	SROCE_SUITE_NETNS=1 exec unshare --net -- bash "$0" "$@"
fi
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"

SUITE_SRC=${RDMA_CORE_TESTS:-/usr/share/doc/rdma-core/tests}
PYTHON=/usr/bin/python3
# Seconds one run of the suite may take; the whole suite takes about one.
: "${RUN_TIMEOUT:=240}"

# Skips that are acceptable for good, matched against the skip reason.
# REASON-REGEX | CATEGORY | why sroce never runs these
read -r -d '' ACCEPTABLE <<'EOF'
non MLX5 device|not an MLX5 device                  | other vendors' hardware | mlx5 direct verbs, DevX, steering: Mellanox/NVIDIA interfaces
non EFA device                                      | other vendors' hardware | EFA direct verbs: AWS interfaces
Converting timestamp to nanoseconds is not supported | other vendors' hardware | mlx5dv_get_clock_info/mlx5dv_ts_to_ns convert mlx5 clock ticks only
[Dd]mabuf|cuda|CUDA|/dev/dri/renderD               | GPUs / dmabuf           | memory of a GPU (DRM render node, CUDA): not host memory
PCI device must be passed                           | PCI / VFIO              | mlx5 VFIO driver over a PCI function
Raw Packet QP|QP type 8 is not supported            | raw packet QPs          | Ethernet frames from user space, flow steering, RSS: NIC hardware features, not RoCE
Device memory is not supported                      | device memory           | on-NIC memory (ibv_alloc_dm): a software NIC has none
Parent Domain is not supported                      | parent domains          | ibv_alloc_parent_domain: provider-private allocators, mlx5 only
huge pages of size                                  | host configuration      | needs 2 MiB huge pages reserved on the host (vm.nr_hugepages)
ODP implicit is not supported                       | by choice, as rxe       | a region over the whole address space: not offered, as Linux rxe does not (sroce.8, Memory registration)
EOF

# Not yet: features sroce must gain.  Each entry is a test-name regex (the
# unittest id, tests.MODULE.CLASS.TEST), the feature (one of the groups of
# rdma_core_suite.py: UD, UC, SRQ, XRC, MW, ODP, rereg MR, AH, extended
# CQ/QP, net interface/sysfs, rt values, other), what the test may do
# meanwhile (skip; or fail: it may also fail or error, a known failure) and
# what exactly it waits for.  Remove an entry when the feature lands (the
# script says when).
# TEST-REGEX | FEATURE | EXPECT | waits for
NOT_YET='' # none today

[[ -x $PYTHON ]] || skip "$PYTHON not installed (run scripts/setup.sh)"
$PYTHON -c 'import pyverbs.device' 2>/dev/null || skip "pyverbs not installed for $PYTHON (python3-pyverbs; run scripts/setup.sh)"
[[ -f $SUITE_SRC/run_tests.py ]] || skip "$SUITE_SRC/run_tests.py missing (python3-pyverbs; run scripts/setup.sh)"

if [[ -n ${SROCE_SUITE_NETNS:-} ]]; then
	if ! { ip link set lo up &&
		ip link add sroce-suite0 type veth peer name sroce-suite1 &&
		ip link set sroce-suite1 up &&
		ip addr add 10.13.0.1/24 dev sroce-suite0 &&
		ip link set sroce-suite0 up; }; then
		die "cannot set up the namespace's veth"
	fi
	export SROCE_CONFIG=$WORK/links.conf
	"$SROCE_BIN" --config "$SROCE_CONFIG" link add sroce0 netdev sroce-suite0 addr 10.13.0.1 ||
		die "sroce link add sroce0 netdev sroce-suite0 failed"
	log "in a network namespace of its own: sroce0 on veth sroce-suite0, 10.13.0.1"
else
	require_loopback
	sroce_config sroce0 "${SROCE_SUITE_ADDR:-127.0.13.1}"
	NOT_YET+="test_rdmacm\.  | rdma_cm | fail | a device on lo: the tests take 127.0.0.1, the interface's first address (as root the suite runs in a namespace of its own)"
fi

# The package ships most modules gzipped, and the directory is not writable
# for a user: unpack a private copy.
mkdir -p "$WORK/suite"
cp -r "$SUITE_SRC" "$WORK/suite/tests" || die "cannot copy $SUITE_SRC"
chmod -R u+w "$WORK/suite/tests"
find "$WORK/suite/tests" -name '*.gz' -exec gunzip -f {} + || die "cannot unpack the suite"
# This project's own tests in the suite's harness (tests/pyverbs): what the
# suite checks only through one vendor's direct verbs.
cp "$(dirname "${BASH_SOURCE[0]}")"/../pyverbs/test_*.py "$WORK/suite/tests/" ||
	die "cannot add tests/pyverbs to the suite"

printf '%s\n' "$ACCEPTABLE" >"$WORK/acceptable.txt"
printf '%s\n' "$NOT_YET" >"$WORK/not-yet.txt"

$PYTHON "$(dirname "${BASH_SOURCE[0]}")/rdma_core_suite.py" \
	--suite "$WORK/suite" --sroce "$SROCE_BIN" --python "$PYTHON" \
	--dev sroce0 --gid 1 --run-timeout "$RUN_TIMEOUT" \
	--acceptable "$WORK/acceptable.txt" --not-yet "$WORK/not-yet.txt" \
	--log "$BUILD_DIR/rdma-core-suite.log" --report "$BUILD_DIR/rdma-core-suite.md"
