#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The congestion benchmarks (tools/perf/fabric_matrix.py) in their short
# mode: two senders into h0 through a 50 Mbit/s bottleneck marking ECN, with
# congestion control on (dcqcn) and off, perftest's ib_write_bw with and
# without rdma_cm, the victim's write-commit round trips (to h0 and to a
# host beside the bottleneck), 0.1 % loss, an
# Open MPI job (tests/progs/mpi_check) and a pmof job whose targets are
# killed, and the incast again with TCP (cubic, with and without ECN) and
# libfabric's tcp provider.  The numbers of a short run mean nothing; this
# keeps the benchmark from rotting.  Checks that every run completed (each
# stream's goodput, every program's exit status 0; with cc off a collapsed
# stream is what the run shows), that the report records the marking the
# fabric applied (sroce-fabric's RED defaults), that with dcqcn the
# bottleneck marked and h0 sent CNPs and with cc off it marked nothing,
# that the fairness index and the victim's percentiles were measured,
# that every MPI check passed and every log kept every committed record,
# and that the Markdown report holds the tables and the commands; also
# that the committed full run (docs/performance/congestion.json) has every
# figure.
#
# ctest: TIMEOUT=900 LABELS=netns,perf PROCESSORS=2
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
((EUID == 0)) || skip "needs root for network namespaces"
command -v ib_write_bw >/dev/null || skip "no perftest (run scripts/setup.sh)"
[[ -f $BUILD_DIR/tools/fabric/phantom_queue.bpf.o ]] || skip "no phantom queue (the build needs clang)"
ip netns add "sfab-probe-$$" 2>/dev/null || skip "ip netns unusable"
ip netns del "sfab-probe-$$"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
name="fm$$"
name=${name:0:8}
export SROCE_FABRIC_STATE=$WORK/fabric-state
cleanup_fabric() { "$BUILD_DIR/tools/fabric/sroce-fabric" --name "$name" down >/dev/null 2>&1; }
trap 'cleanup_fabric; _sroce_cleanup' EXIT

out=$WORK/out
if PYTHONDONTWRITEBYTECODE=1 python3 "$src/tools/perf/fabric_matrix.py" --build "$BUILD_DIR" --out "$out" --short \
	--victim --name "$name" >"$WORK/run.log" 2>&1; then
	pass "fabric_matrix.py --short: $(grep -c "^  cc" "$WORK/run.log") runs"
else
	tail -n 30 "$WORK/run.log" >&2
	die "fabric_matrix.py --short failed"
fi
[[ -s $out/congestion.md && -s $out/congestion.json ]] || die "congestion.md or .json missing"
# A server it waited for in vain: the run goes on, its clients late.
if grep -q "does not listen" "$WORK/run.log"; then
	fail "fabric_matrix.py waited in vain for a server" "$(grep "does not listen" "$WORK/run.log")"
else
	pass "every server listened before its clients started"
fi

check_json() { # FILE WHAT
	python3 - "$1" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
bad = []
modes = {m["cc"]: m for m in d["modes"]}
rm = re.fullmatch(r"(\d+)([kmg]?)bit", d["meta"]["rate"])
rate_Mbps = int(rm[1]) * {"": 1e-6, "k": 1e-3, "m": 1, "g": 1e3}[rm[2]] if rm else None


def measured(r):
    """What a run measured at h0: something, in windows whose real lengths
    are kept, and no more than the bottleneck lets through (a sampler that
    took its windows for shorter than they were would say more)."""
    if not r.get("arrival_Mbps"):
        bad.append(f"{r['label']}: nothing measured at h0")
        return
    if len(r.get("window_lengths_ms", [])) != r["windows"] or not r.get("window_ms"):
        bad.append(f"{r['label']}: {r['windows']} windows, lengths {r.get('window_ms')}")
    if rate_Mbps and r["arrival_Mbps"] > 1.1 * rate_Mbps:
        bad.append(f"{r['label']}: {r['arrival_Mbps']:.1f} Mbit/s through {d['meta']['rate']}")


if set(modes) != {"dcqcn", "off"}:
    bad.append(f"modes {sorted(modes)}")
# The marking the fabric applied (sroce-fabric's defaults: RED's ramp from
# 10,000 to 100,000 bytes up to 0.2), as the report says.
mark = [d["meta"].get(k) for k in ("mark_threshold_bytes", "mark_max_bytes", "mark_probability")]
if mark != [10000, 100000, 0.2]:
    bad.append(f"marking recorded as {mark}")
for cc, m in modes.items():
    runs = [m["solo"]] + m["runs"]
    labels = [r["label"] for r in runs]
    for want in ("one stream", "to 1", "over rdma_cm", "the victim", "loss"):
        if not any(want in l for l in labels):
            bad.append(f"{cc}: no run '{want}' in {labels}")
    for r in runs:
        # Without congestion control a stream may collapse (time out): that
        # is what the run shows.  Some data must still have arrived.
        done = [f for f in r["flows"] if f["rc"] == 0 and f["server_rc"] == 0 and f["MBps"]]
        if len(done) < len(r["flows"]) and (cc != "off" or not done):
            bad += [f"{r['label']}: {f['sender']} exit {f['rc']}/{f['server_rc']}, "
                    f"{f['MBps']} MB/s: {f.get('output', '')[-300:]}"
                    for f in r["flows"] if f not in done]
        measured(r)
        if r["senders"] > 1 and r.get("jain_mean") is None:
            bad.append(f"{r['label']}: no fairness index")
        marked = r["bottleneck"]["marked"]
        cnps = sum(f["cnps_sent"] or 0 for f in r["flows"])
        if cc == "off" and (marked or cnps):
            bad.append(f"{r['label']}: cc off, yet {marked} marked, {cnps} CNPs")
    if cc == "dcqcn" and not any(r["bottleneck"]["marked"] and
                                 sum(f["cnps_sent"] or 0 for f in r["flows"]) and
                                 sum(f["rate_cuts"] or 0 for f in r["flows"]) for r in runs):
        bad.append("dcqcn: no run with marks, CNPs and rate cuts")
    for key in ("victim_idle", "victim_idle_beside"):
        v = m.get(key) or {}
        if not v.get("t_p99_us"):
            bad.append(f"{cc}: {key} {v}")
    # Through the bottleneck to h0, and to a host beside it.
    busy = {r["victim"].get("server"): r["victim"] for r in runs if r.get("victim")}
    beside = f"h{d['meta']['senders'] + 2}"
    if set(busy) != {"h0", beside} or not all(v.get("t_p99_us") for v in busy.values()):
        bad.append(f"{cc}: victim during the incast {busy}")
    mpi, pmof = m.get("mpi") or {}, m.get("pmof") or {}
    if mpi.get("rc") != 0 or mpi.get("failed") or mpi.get("ok") != 11:
        bad.append(f"{cc}: Open MPI job {mpi}")
    if not pmof.get("ok") or not pmof.get("logs"):
        bad.append(f"{cc}: pmof job {pmof}")
peers = {p["label"]: p for p in d.get("peers", [])}
for want in ("TCP cubic", "TCP cubic, ECN", "libfabric tcp"):
    p = peers.get(want)
    if not p or p.get("unavailable"):
        bad.append(f"peer {want}: {p and p.get('unavailable')}")
        continue
    for r in (p["solo"], p["incast"]):
        for f in r["flows"]:
            if f["rc"] != 0 or f["server_rc"] != 0 or not f["MBps"]:
                bad.append(f"{r['label']}: {f['sender']} exit {f['rc']}/{f['server_rc']}, "
                           f"{f['MBps']} MB/s: {f.get('output', '')[-300:]}")
        measured(r)
    if p["incast"].get("jain_mean") is None:
        bad.append(f"{p['label']}: no fairness index")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
if why=$(check_json "$out/congestion.json"); then
	pass "every run complete: goodput, exits, fairness, marks and CNPs with dcqcn only, the victim, the Open MPI and pmof jobs, TCP and libfabric tcp"
else
	fail "short run: $why"
fi
for want in "| run | Mbit/s at h0" "## The victim" "## Jobs across the fabric" \
	"## Against the peers" "## Commands" "sroce-fabric --name"; do
	grep -qF -- "$want" "$out/congestion.md" || fail "congestion.md lacks '$want'"
done
pass "congestion.md has the tables and the commands"
# The victim's figures say where its server was; its commands show it: a
# server on h0 and one beside the bottleneck, and a client to each.
beside=h$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["meta"]["senders"] + 2)' \
	"$out/congestion.json")
servers=$(grep -oE "exec h[0-9]+ -- [^ ]*ib_write_commit_lat -e -s 64 -D [0-9]+ -p [0-9]+\$" "$out/congestion.md" |
	awk '{print $2}' | sort -u | tr '\n' ' ')
targets=$(grep -E "ib_write_commit_lat .*--out_json_file" "$out/congestion.md" | awk '{print $NF}' | sort -u | wc -l)
if [[ $servers == "h0 $beside " && $targets == 2 ]]; then
	pass "the victim's servers ran on h0 and $beside, its clients went to both"
else
	fail "the victim's commands: servers on '$servers' (want h0 $beside), clients to $targets addresses (want 2)"
fi
committed=$src/docs/performance/congestion.json
if [[ ! -f $committed ]]; then
	fail "no committed full run ($committed)"
elif why=$(check_json "$committed"); then
	if python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["meta"]["short"])' "$committed"; then
		pass "the committed full run has every figure"
	else
		fail "the committed run is a --short one"
	fi
else
	fail "committed full run: $why"
fi
finish
