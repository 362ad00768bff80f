#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Runs the congestion benchmarks on a fabric of hosts (sroce-fabric).

N senders write 64 KiB RDMA WRITE streams (perftest's ib_write_bw with its
defaults, and again over rdma_cm) into one host through a bottleneck that
marks ECN from a phantom queue, with sroce's congestion control on (DCQCN)
and off.  Measured at the receiving host's interface: bytes per sender in
100 ms windows (Jain's fairness index over them); from perftest: each
stream's goodput; from sroce's counters: retransmission timeouts, selective
resends, CNPs; from the switch: drops and marks.  With --victim a further
host measures the round trip of a 64-byte write-commit (ib_write_commit_lat)
alone and during the incast.  The incast again with random loss at the
bottleneck.

Writes congestion.md (tables, the targets, the commands) and
congestion.json into --out.  --short runs three hosts for two seconds: the
test suite runs it so that the benchmark cannot rot; its numbers mean
nothing.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from perf_matrix import Matrix as PerfMatrix

RDMA_PORT = 4791
FIRST_TCP_PORT = 18515
VICTIM_PORT = 18700
WINDOW_S = 0.1
STATS_RE = re.compile(r"sroce: \S+: (.*)$", re.M)


def jain(xs):
    s, q = sum(xs), sum(x * x for x in xs)
    return (s * s) / (len(xs) * q) if q else 1.0


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else 0.0


class Fabric:
    """One sroce-fabric, made and removed by this run."""

    def __init__(self, tool, name, state_dir):
        self.tool, self.name = tool, name
        self.env = dict(os.environ, SROCE_FABRIC_STATE=state_dir)
        for k in ("LD_PRELOAD", "SROCE_FAULT", "SROCE_CONFIG", "SROCE_STATS"):
            self.env.pop(k, None)
        self.state = None

    def fab(self, *args, check=True):
        return subprocess.run([self.tool, "--name", self.name, *args], env=self.env,
                              capture_output=True, text=True, check=check)

    def up(self, hosts, rate, queue, loss, threshold, mark_rate):
        self.fab("down", check=False)
        args = ["up", "-n", str(hosts), "--rate", rate, "--queue", str(queue), "--ecn",
                "--mark-threshold", str(threshold), "--mark-rate", str(mark_rate)]
        if loss:
            args += ["--loss", f"{loss}%"]
        r = self.fab(*args, check=False)
        if r.returncode:
            sys.exit(f"fabric_matrix: sroce-fabric up: {r.stderr.strip()}")
        self.state = json.loads(self.fab("show", "-j").stdout)

    def down(self):
        self.fab("down", check=False)

    def host(self, h):
        return self.state["hosts"][h]

    def set_cc(self, h, mode, params):
        info = self.host(h)
        cmd = ["ip", "netns", "exec", info["netns"], self.state["sroce"], "--config",
               info["config"], "link", "set", info["device"], "cc", mode]
        for p in params:
            cmd += p.split("=", 1)
        subprocess.run(cmd, env=self.env, check=True, capture_output=True)

    def argv(self, h, prog):
        return [self.tool, "--name", self.name, "exec", h, "--", *prog]

    def bottleneck(self):
        return json.loads(self.fab("show", "-j").stdout)["bottleneck"]

    def netns(self, h):
        return self.host(h)["netns"]


class Sampler:
    """Bytes of RoCE from each sender arriving at h0, every WINDOW_S: nft
    counters on h0's ingress, read by one thread."""

    def __init__(self, fabric, senders):
        self.fabric, self.senders = fabric, senders
        self.ns = fabric.netns("h0")
        rules = ["table netdev sroce_fabric_matrix {",
                 "  chain in {", "    type filter hook ingress device eth0 priority 0;"]
        for s in senders:
            addr = fabric.host(s)["ipv4"]
            rules.append(f"    ip saddr {addr} udp dport {RDMA_PORT} counter name {s}")
        rules.append("  }")
        rules += [f"  counter {s} {{}}" for s in senders]
        rules.append("}")
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"],
                       input="\n".join(rules) + "\n", text=True, check=True)
        self.samples, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def read(self):
        out = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-j", "list", "counters",
                              "table", "netdev", "sroce_fabric_matrix"],
                             capture_output=True, text=True).stdout
        got = {}
        for item in json.loads(out or "{}").get("nftables", []):
            c = item.get("counter")
            if c:
                got[c["name"]] = c.get("bytes", 0)
        return got

    def loop(self):
        nxt = time.monotonic()
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.read()))
            nxt += WINDOW_S
            self.stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self):
        self.thread.start()

    def wait_all_running(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = self.samples[-2:]
            if len(s) == 2 and all(s[1][1].get(x, 0) > s[0][1].get(x, 0) for x in self.senders):
                return
            time.sleep(WINDOW_S)

    def finish(self):
        self.stop.set()
        self.thread.join()
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "delete", "table", "netdev",
                        "sroce_fabric_matrix"], capture_output=True)

    def windows(self, settle_s):
        """Per-window byte counts of each sender, [[bytes per sender]], while
        every stream runs: from the last one's first bytes to the first
        one's last, less settle_s at either end.  Streams start as their
        programs connect, which on a loaded machine takes up to seconds."""
        series = []
        for (ta, a), (tb, b) in zip(self.samples, self.samples[1:]):
            series.append([b.get(s, 0) - a.get(s, 0) for s in self.senders])
        if not series:
            return []
        # Running: past a quarter of the stream's typical window, not the
        # few packets of a connection's set-up (rdma_cm's MADs count too).
        firsts, lasts = [], []
        for col in zip(*series):
            typical = sorted(col)[len(col) * 3 // 4]
            on = [i for i, x in enumerate(col) if typical and x > typical / 4]
            if not on:
                return []
            firsts.append(on[0])
            lasts.append(on[-1])
        skip = int(round(settle_s / WINDOW_S))
        return series[max(firsts) + skip:min(lasts) + 1 - skip]


class Matrix:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.work = tempfile.mkdtemp(prefix="fabric-matrix.")
        self.fabric = Fabric(os.path.join(self.build, "tools/fabric/sroce-fabric"),
                             args.name, os.path.join(self.work, "state"))
        self.commands = []

    # ------------------------------------------------------------ running
    def record(self, label, argv):
        if label not in [c[0] for c in self.commands]:
            self.commands.append((label, argv))

    @staticmethod
    def perftest_bw(text):
        """perftest's BW average in MB/s (perf_matrix.py's parser), or None.
        perftest ends its last line without a newline, so SROCE_STATS's
        report at exit can follow on the same line: it goes first."""
        try:
            return PerfMatrix.perftest_bw_table(STATS_RE.sub("", text))["bw_avg_MBps"]
        except RuntimeError:
            return None

    @staticmethod
    def sroce_stats(text):
        m = STATS_RE.findall(text)
        if not m:
            return {}
        words = m[-1].split()
        return {k: int(v) for k, v in zip(words[::2], words[1::2]) if v.isdigit()}

    def stream_cmds(self, i, sender, cm, events):
        port = FIRST_TCP_PORT + i
        # perftest's ib_write_bw has no events for WRITE; the project's
        # ib_write_commit_bw sends the same plain WRITEs with --method write.
        prog = ["ib_write_bw"]
        if events:
            prog = [os.path.join(self.build, "tools/perf/ib_write_commit_bw"), "--method=write",
                    "-e"]
        common = [*prog, "-d", self.fabric.host(sender)["device"], "-s", str(self.args.size),
                  "-D", str(self.args.duration), "-p", str(port)]
        if cm:
            common.append("-R")
        server = ["env", "SROCE_STATS=1", *common]
        client = ["env", "SROCE_STATS=1", *common, self.fabric.host("h0")["ipv4"]]
        return server, client

    def victim_cmds(self, seconds):
        victim = self.victim_host()
        # Sleeping on events, as the streams beside it do (see streams()).
        tool = os.path.join(self.build, "tools/perf/ib_write_commit_lat")
        common = [tool, "-e", "-s", "64", "-D", str(seconds), "-p", str(VICTIM_PORT)]
        server = list(common)
        client = [*common, "--out_json",
                  "--out_json_file", os.path.join(self.work, "victim.json"),
                  self.fabric.host("h0")["ipv4"]]
        return self.fabric.argv("h0", server), self.fabric.argv(victim, client)

    def victim_host(self):
        return f"h{self.args.senders + 1}"

    def spawn(self, argv):
        return subprocess.Popen(argv, env=self.fabric.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def finish(self, procs, timeout):
        outs = []
        end = time.monotonic() + timeout
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                out += "\n(killed: did not finish in time)\n"
            outs.append((p.returncode, out))
        return outs

    def streams(self, label, senders, cm, victim=False):
        """Runs one stream from each of `senders` into h0 at once; the
        figures.  With victim, the victim's round trips run in the middle of
        them, and every program sleeps on completion events instead of
        polling: 2 CPUs cannot give 18 polling processes a CPU each, as
        hosts of their own would, and the victim's round trips would wait
        for the scheduler rather than for the fabric."""
        servers, clients = [], []
        for i, s in enumerate(senders):
            srv, cli = self.stream_cmds(i, s, cm, victim)
            self.record(f"{label}: server on h0 (one per sender, -p {FIRST_TCP_PORT}+i)",
                        self.fabric.argv("h0", srv))
            self.record(f"{label}: sender hI", self.fabric.argv(s, cli))
            servers.append(self.spawn(self.fabric.argv("h0", srv)))
            clients.append((s, cli))
        vsrv = vproc = None
        if victim:
            vs, vc = self.victim_cmds(self.victim_seconds())
            self.record("victim: server on h0", vs)
            self.record("victim: client", vc)
            vsrv = self.spawn(vs)
        time.sleep(1.0 + 0.05 * len(senders))
        before = self.fabric.bottleneck()
        sampler = Sampler(self.fabric, senders)
        sampler.start()
        cprocs = [self.spawn(self.fabric.argv(s, c)) for s, c in clients]
        if vsrv:
            # The victim starts once every stream has been running a while.
            sampler.wait_all_running(self.args.duration / 2)
            time.sleep(min(1.0, self.args.duration / 8))
            vproc = self.spawn(vc)
        limit = self.args.duration * 6 + 30
        couts = self.finish(cprocs, limit)
        sampler.finish()
        vout = self.finish([vproc], limit)[0] if vproc else None
        souts = self.finish(servers + ([vsrv] if vsrv else []), 20)
        after = self.fabric.bottleneck()
        res = {"label": label, "senders": len(senders), "cm": cm, "flows": []}
        for (s, _), (rc, out), (src, sout) in zip(clients, couts, souts):
            st, sst = self.sroce_stats(out), self.sroce_stats(sout)
            res["flows"].append({
                "sender": s, "rc": rc, "server_rc": src, "MBps": self.perftest_bw(out),
                "timeouts": st.get("timeouts"), "retransmits": st.get("retransmits"),
                "resent_selective": st.get("tx_resent_selective"),
                "cnps_received": st.get("rx_cnp"), "rate_cuts": st.get("cc_rate_cuts"),
                "ce_seen": sst.get("rx_ce"), "cnps_sent": sst.get("tx_cnp")})
            if rc or src or res["flows"][-1]["MBps"] is None:
                res["flows"][-1]["output"] = (out + sout)[-2000:]
        res["bottleneck"] = {k: after[k] - before.get(k, 0) for k in after
                             if k != "phantom_peak_bytes"}
        windows = sampler.windows(settle_s=0.5 if self.args.duration >= 4 else 0.1)
        res["windows"] = len(windows)
        res["series_bytes"] = windows
        if len(senders) > 1 and windows:
            idx = [jain(w) for w in windows if sum(w)]
            res["jain_mean"] = sum(idx) / len(idx) if idx else None
            res["jain_p5"] = percentile(idx, 5)
        if windows:
            # What reached h0 while every stream ran: the figure compared
            # with one stream's, since perftest's own periods need not
            # overlap.
            total = sum(sum(w) for w in windows)
            res["arrival_Mbps"] = total * 8 / (len(windows) * WINDOW_S) / 1e6
        bws = [f["MBps"] for f in res["flows"] if f["MBps"] is not None]
        res["goodput_MBps"] = sum(bws) if len(bws) == len(senders) else None
        res["timeouts"] = sum(f["timeouts"] or 0 for f in res["flows"])
        if vout:
            res["victim"] = self.victim_figures(*vout)
        return res

    def victim_figures(self, rc, out):
        try:
            with open(os.path.join(self.work, "victim.json"), encoding="utf-8") as f:
                r = json.load(f)["results"][0]
        except (OSError, ValueError, KeyError, IndexError):
            return {"rc": rc, "output": out[-2000:]}
        return {"rc": rc, "t_typical_us": r.get("t_typical"), "t_p99_us": r.get("p99"),
                "t_max_us": r.get("t_max")}

    def victim_seconds(self):
        """A third of the streams' duration, so that it ends before they do."""
        return max(1, self.args.duration // 3)

    def victim_idle(self):
        vs, vc = self.victim_cmds(self.victim_seconds())
        srv = self.spawn(vs)
        time.sleep(1.0)
        out = self.finish([self.spawn(vc)], 120)[0]
        self.finish([srv], 20)
        return self.victim_figures(*out)

    def mode(self, cc):
        """Every run with congestion control `cc` (dcqcn or off)."""
        a = self.args
        hosts = a.senders + 1 + (1 if a.victim else 0)
        senders = [f"h{i}" for i in range(1, a.senders + 1)]
        out = {"cc": cc, "runs": []}
        for loss in ([0.0] + ([a.loss] if a.loss else [])):
            self.fabric.up(hosts, a.rate, a.queue, loss, a.mark_threshold, a.mark_rate)
            try:
                for h in self.fabric.state["hosts"]:
                    self.fabric.set_cc(h, cc, a.cc_param if cc != "off" else [])
                tag = f"cc {cc}" + (f", {loss:g}% loss" if loss else "")
                if not loss:
                    out["solo"] = self.streams(f"{tag}: one stream", senders[:1], False)
                    self.progress(out["solo"])
                    if a.victim:
                        out["victim_idle"] = self.victim_idle()
                plan = [("", False, False)]
                if not loss:
                    plan.append((" over rdma_cm", True, False))
                    if a.victim:
                        plan.append((", events, and the victim", False, True))
                for what, cm, victim in plan:
                    r = self.streams(f"{tag}: {a.senders} to 1{what}", senders, cm, victim)
                    r["loss_pct"] = loss
                    self.progress(r)
                    out["runs"].append(r)
            finally:
                self.fabric.down()
        return out

    @staticmethod
    def progress(r):
        print(f"  {r['label']}: {fmt(r.get('arrival_Mbps'))} Mbit/s at h0, perftest "
              f"{fmt(r.get('goodput_MBps'))} MB/s, Jain "
              f"{fmt(r.get('jain_mean'), 3)} (p5 {fmt(r.get('jain_p5'), 3)}), "
              f"{r['timeouts']} timeouts, {r['bottleneck'].get('dropped')} dropped, "
              f"{r['bottleneck'].get('marked')} marked", flush=True)

    # ------------------------------------------------------------ report
    def report(self, modes):
        a = self.args
        os.makedirs(a.out, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "host": platform.node(),
                "cpus": os.cpu_count(), "kernel": platform.release(), "rate": a.rate,
                "queue_packets": a.queue, "mark_threshold_bytes": a.mark_threshold,
                "mark_rate": a.mark_rate, "senders": a.senders, "duration_s": a.duration,
                "size": a.size, "cc_params": a.cc_param, "short": a.short}
        with open(os.path.join(a.out, "congestion.json"), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "modes": modes}, f, indent=1)
        L = [f"# Congestion on a fabric of {a.senders + 1 + (1 if a.victim else 0)} hosts",
             "",
             f"Made by `tools/perf/fabric_matrix.py` on {meta['date']} ({meta['cpus']} CPUs, "
             f"kernel {meta['kernel']}){' with --short: the numbers mean nothing' if a.short else ''}.",
             f"{a.senders} senders write {a.size}-byte RDMA WRITEs into h0 for {a.duration} s "
             f"(perftest's `ib_write_bw` defaults); the switch port towards h0 runs at "
             f"{a.rate} over a {a.queue}-packet tail-drop queue and marks CE past "
             f"{a.mark_threshold} bytes of a phantom queue drained at {a.mark_rate:g} of "
             "the rate.  Goodput is perftest's; fairness is Jain's index over the bytes "
             f"each sender delivered to h0 in {int(WINDOW_S * 1000)} ms windows (mean, and "
             "the 5th percentile of the windows).  Both count only the windows in which every "
             "stream runs (programs connect one by one on a loaded machine), less half a "
             "second at either end; Mbit/s is what reached h0 then (headers and resends included), "
             "compared with one stream alone measured so; perftest's figures, each over "
             "its own stream's time, are summed beside it.",
             "", "| run | Mbit/s at h0 | of one stream | perftest MB/s (sum) | Jain mean | "
             "Jain p5 | timeouts | selective resends | dropped | marked | CNPs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in modes:
            solo = (m.get("solo") or {}).get("arrival_Mbps")
            for r in [m.get("solo")] + m["runs"]:
                if not r:
                    continue
                g = r.get("arrival_Mbps")
                ratio = g / solo if g and solo else None
                L.append(f"| {r['label']} | {fmt(g, 1)} | {fmt(ratio, 3)} | "
                         f"{fmt(r.get('goodput_MBps'))} | "
                         f"{fmt(r.get('jain_mean'), 3)} | {fmt(r.get('jain_p5'), 3)} | "
                         f"{r['timeouts']} | "
                         f"{sum(f['resent_selective'] or 0 for f in r['flows'])} | "
                         f"{r['bottleneck'].get('dropped')} | {r['bottleneck'].get('marked')} | "
                         f"{sum(f['cnps_sent'] or 0 for f in r['flows'])} |")
        if a.victim:
            L += ["", "## The victim: a 64-byte write-commit from a further host", "",
                  "| cc | idle typical µs | idle p99 µs | incast typical µs | incast p99 µs | "
                  "p99 ratio |", "|---|---|---|---|---|---|"]
            for m in modes:
                idle = m.get("victim_idle") or {}
                busy = next((r.get("victim") for r in m["runs"] if r.get("victim")), {})
                ratio = (busy.get("t_p99_us") / idle["t_p99_us"]
                         if busy.get("t_p99_us") and idle.get("t_p99_us") else None)
                L.append(f"| {m['cc']} | {fmt(idle.get('t_typical_us'))} | "
                         f"{fmt(idle.get('t_p99_us'))} | {fmt(busy.get('t_typical_us'))} | "
                         f"{fmt(busy.get('t_p99_us'))} | {fmt(ratio, 2)} |")
        L += ["", "## Commands", "", "```sh",
              "python3 tools/perf/fabric_matrix.py " + " ".join(
                  shlex.quote(x) for x in sys.argv[1:])]
        for label, argv in self.commands:
            L.append(f"# {label}")
            L.append(" ".join(shlex.quote(x) for x in short_path(argv, self.build, self.work)))
        L.append("```")
        with open(os.path.join(a.out, "congestion.md"), "w", encoding="utf-8") as f:
            f.write("\n".join(L) + "\n")


def short_path(argv, build, work):
    return [x.replace(build + "/", "build/").replace(work + "/", "") for x in argv]


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="build directory (default: build)")
    p.add_argument("--out", default="docs/performance", help="output directory")
    p.add_argument("--name", default="fm", help="the fabric's name (default fm)")
    p.add_argument("--senders", type=int, default=8, help="streams into h0 (default 8)")
    p.add_argument("--rate", default="200mbit", help="the bottleneck (default 200mbit)")
    p.add_argument("--queue", type=int, default=1000, help="its queue in packets")
    p.add_argument("--mark-threshold", type=int, default=30000,
                   help="phantom queue threshold, bytes (default 30000)")
    p.add_argument("--mark-rate", type=float, default=0.95,
                   help="phantom queue drain, a fraction of the rate (default 0.95)")
    p.add_argument("--duration", type=int, default=8, help="seconds per run (default 8)")
    p.add_argument("--size", type=int, default=65536, help="message size (default 65536)")
    p.add_argument("--cc", nargs="+", default=["dcqcn", "off"], choices=("dcqcn", "off"),
                   help="congestion control modes to compare (default: dcqcn off)")
    p.add_argument("--cc-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter of 'sroce link set ... cc dcqcn' (repeatable)")
    p.add_argument("--victim", action="store_true",
                   help="a further host's 64-byte write-commit round trips")
    p.add_argument("--loss", type=float, default=0.1,
                   help="also run the incast with this %% random loss (0: not)")
    p.add_argument("--short", action="store_true", help="three hosts, two seconds")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("fabric_matrix: needs root (network namespaces)")
    if args.short:
        args.senders, args.duration = 2, 2
        args.rate = "50mbit"
    m = Matrix(args)
    modes = []
    try:
        for cc in args.cc:
            print(f"cc {cc}:", flush=True)
            modes.append(m.mode(cc))
    finally:
        m.fabric.down()
        shutil.rmtree(m.work, ignore_errors=True)
    m.report(modes)
    print(f"wrote {os.path.join(args.out, 'congestion.md')}")


if __name__ == "__main__":
    main()
