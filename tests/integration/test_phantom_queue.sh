#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# sroce-fabric(8)'s phantom queue, packet by packet: phantom_check.py runs
# the tc program on crafted packets (BPF_PROG_TEST_RUN) with its drain
# stopped, and checks which it marks CE, for a single threshold and for
# RED's ramp between two (a count within six standard deviations of what
# the ramp's probabilities add up to); IPv4's checksum after a mark, IPv6's
# traffic class, packets that are not ECN-capable left alone.  Then
# sroce-fabric refuses a ramp it cannot describe.
#
# Usage: test_phantom_queue.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces or
# the compiled program.  No packet leaves the program: BPF_PROG_TEST_RUN
# hands them back.
#
# ctest: TIMEOUT=120 LABELS=netns
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_phantom_queue.sh BUILD-DIR}"
here=$(dirname "${BASH_SOURCE[0]}")
fabric=$BUILD_DIR/tools/fabric/sroce-fabric
[[ -x $fabric ]] || die "$fabric is not built"
[[ -f $BUILD_DIR/tools/fabric/phantom_queue.bpf.o ]] || skip "no phantom queue (built with clang)"
((EUID == 0)) || skip "needs root for network namespaces and bpf(2)"
command -v tc >/dev/null || skip "no tc(8)"

ns=sfab-pq-$$
ip netns add "$ns" 2>/dev/null || skip "ip netns unusable"
trap 'ip netns del "$ns" 2>/dev/null; _sroce_cleanup' EXIT
ip -n "$ns" link add p0 type veth peer name p1 || die "a veth pair in $ns"
ip -n "$ns" link set p0 up

if python3 "$here/phantom_check.py" "$fabric" "$ns" >"$WORK/check.out" 2>&1; then
	pass "phantom queue: $(grep -c '^ok' "$WORK/check.out") checks"
	sed 's/^/  /' "$WORK/check.out" >&2
else
	cat "$WORK/check.out" >&2
	fail "phantom queue: $(grep '^FAIL' "$WORK/check.out" | tr '\n' ' ')"
fi

export SROCE_FABRIC_STATE=$WORK/state
fab=pq$((RANDOM % 10000))
# Should one be accepted after all, the fabric it made goes too.
trap '"$fabric" --name "$fab" down &>/dev/null; ip netns del "$ns" 2>/dev/null; _sroce_cleanup' EXIT
for bad in "--mark-probability 0" "--mark-probability 1.5" "--mark-max 2147483648" \
	"--mark-threshold 50000 --mark-max 40000"; do
	# shellcheck disable=SC2086 # options and their values
	out=$("$fabric" --name "$fab" up -n 1 --rate 50mbit --ecn $bad 2>&1)
	rc=$?
	if ((rc == 2)) && grep -q "^sroce-fabric: --mark-" <<<"$out"; then
		pass "up $bad refused: $out"
	else
		fail "up $bad: rc $rc, '$out'"
	fi
done
finish
