#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The benchmark matrix (tools/perf/perf_matrix.py) in its short mode: every
# method of ib_write_commit_lat/bw and every peer benchmark runs once at two
# sizes, and the Markdown table, the JSON and the PNG plot are produced.  The
# numbers of a short run mean nothing; this keeps the tools and the script
# from rotting.  It also checks that both the short run and the committed
# full run (docs/performance/) measure every performance target, the latter
# each with a figure and the commands that produced them.
#
# ctest: TIMEOUT=600 LABELS=perf RESOURCE_LOCK=lo-127.0.10.1,lo-127.0.10.2,lo-127.0.10.3,lo-127.0.10.4
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
require_loopback
python=/usr/bin/python3
[[ -x $python ]] || skip "no /usr/bin/python3"
"$python" -c 'import matplotlib' 2>/dev/null || skip "python3-matplotlib missing (run scripts/setup.sh)"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

out=$WORK/out
"$python" "$src/tools/perf/perf_matrix.py" --build "$BUILD_DIR" --out "$out" --short \
	--addr 127.0.10.1 127.0.10.2 --port 19600 || die "perf_matrix.py failed"

for f in results.md results.json results.png; do
	[[ -s $out/$f ]] || die "$f missing or empty"
done
# A real PNG, not an empty canvas written by mistake.
[[ $(head -c 8 "$out/results.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
	die "results.png is not a PNG"
"$python" - "$out/results.json" "$src/docs/performance/results.json" <<'PY' || die "results.json is incomplete"
import json, os, sys
# The performance targets the matrix must measure in one run, each named by
# the start of its ratio's description.
TARGETS = (
    "native commit 64 KiB bandwidth / libfabric tcp",
    "native commit 1 MiB bandwidth / libfabric tcp",
    "native commit bandwidth, 1 MiB / 64 KiB",
    "native commit 1 MiB latency / libfabric tcp",
    "native commit 64 B latency / UDP ping-pong (96 B, busy-polling receives)",
    "perftest ib_write_lat -s 2 / UDP ping-pong (96 B, busy-polling receives)",
    "perftest ib_write_lat -s 2: t_avg / t_typical",
    "perftest ib_send_lat -s 2 / UDP ping-pong",
    "perftest ib_read_lat -s 2 / UDP ping-pong",
    "qperf -cm1 -cp 1 rc_lat / UDP ping-pong",
    "qperf -cm1 rc_lat / UDP ping-pong (96 B, blocking receives)",
    "qperf -cm1 -cp 1 rc_rdma_write_lat / UDP ping-pong",
    "qperf -cm1 rc_rdma_write_lat / UDP ping-pong (96 B, blocking receives)",
    "fi_pingpong -p pmof 64 B / UDP ping-pong",
    "fi_pingpong -p verbs 64 B / UDP ping-pong",
    "ucx_perftest -t tag_lat 8 B (rc_verbs) / UDP ping-pong",
    "perftest ib_write_bw -s 65536 (default depth) / libfabric tcp",
    "native commit 64 KiB bandwidth (128 in flight) / libfabric tcp",
    "perftest ib_write_bw -s 65536, 128 in flight / 16",
    "native commit 64 KiB bandwidth, 128 in flight / 16",
    "perftest ib_write_bw -s 65536 (no rdma_cm), 0.1 % loss / loss-free",
    "perftest ib_write_bw -s 65536 (no rdma_cm), 1 % loss / loss-free",
    "64 KiB RDMA WRITE bandwidth, 0.1 % loss / loss-free",
    "64 KiB RDMA WRITE bandwidth, 1 % loss / loss-free",
    "native commit 64 KiB bandwidth, 2 streams on one device pair / on two",
    "native commit 64 B latency, one more process on each device / alone",
    "libfabric pmof FI_COMMIT_COMPLETE 64 B latency / libfabric tcp",
    "libfabric pmof FI_COMMIT_COMPLETE 64 B latency / native commit",
)


def ratios_with_targets(d, full):
    ratios = {x["what"]: x for x in d["ratios"]}
    for t in TARGETS:
        if not full and "-p verbs" in t and os.geteuid() != 0:
            continue  # its veth pair needs a network namespace of its own
        found = [x for w, x in ratios.items() if w.startswith(t)]
        assert found, ("no ratio", t, sorted(ratios))
        for x in found:
            # The short matrix has no 1 MiB runs.
            if full or "1 MiB" not in t:
                assert x["ratio"] is not None and x["ratio"] > 0, x
                assert x["met"] in (True, False), x
    return d["ratios"]


# The committed full run: every target with a figure, 1 MiB included.
ratios_with_targets(json.load(open(sys.argv[2])), True)
d = json.load(open(sys.argv[1]))
ratios_with_targets(d, False)
r = d["results"]
methods = ["write", "native", "write-flush", "write-read", "write-send"]
for kind in ("lat", "bw"):
    for m in methods:
        for size in ("64", "65536"):
            row = r[kind][m][size]
            assert row["bytes"] == int(size), (kind, m, size, row)
            key = "t_typical" if kind == "lat" else "bw_avg_MBps"
            assert row[key] > 0, (kind, m, size, row)
for peer in ("udp lat", "udp lat busy", "tcp lat", "udp bw", "tcp bw", "libfabric tcp commit lat",
             "libfabric tcp commit bw"):
    assert peer in r["peers"], peer
ratios = d["ratios"]
assert len(ratios) >= 9, ratios
# The short matrix has no 1 MiB runs: only those ratios may lack a figure.
assert all(x["ratio"] is not None and x["ratio"] > 0 for x in ratios
           if "1 MiB" not in x["what"]), ratios
assert "perftest ib_write_lat" in r["lat"], r["lat"].keys()
# Two streams on shared devices: their sum, with a count of its own.
for name in ("native, 2 streams on 1 device pair", "native, 2 streams on 2 device pairs",
             "native (16 in flight)"):
    assert r["bw"][name]["65536"]["bw_avg_MBps"] > 0, (name, r["bw"].keys())
assert r["lat"]["native, idle process per device"]["64"]["t_typical"] > 0, r["lat"].keys()
# Every pair's processes have their CPU use beside their figures.
for kind in ("lat", "bw"):
    for name, series in r[kind].items():
        for size, row in series.items():
            assert row["cpu_client_pct"] > 0 and row["cpu_server_pct"] > 0, (name, size, row)
# The 64 B round trips held to the busy UDP ping-pong are measured next to it.
assert r["peers"]["udp lat busy"]["96"]["t_typical"] > 0, r["peers"].keys()
for name in ("native (next to udp busy)", "write (next to udp busy)", "write (busy poll)"):
    assert r["lat"][name]["64"]["t_typical"] > 0, (name, r["lat"].keys())
print("results.json: %d ratios, every method and peer present" % len(ratios))
PY
# The table lists every target ratio and every method, and the committed
# full run the commands that produced it.
grep -q '^## Target ratios' "$out/results.md" || die "no ratio table"
grep -q '^## Commands' "$src/docs/performance/results.md" ||
	die "docs/performance/results.md lists no commands"
for m in native write-flush write-read write-send "libfabric tcp commit"; do
	grep -q -- "$m" "$out/results.md" || die "results.md does not mention $m"
done
log "perf matrix (short): $(grep -c '^| ' "$out/results.md") table rows"
