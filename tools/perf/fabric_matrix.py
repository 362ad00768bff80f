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
alone and during the incast, to h0 through the bottleneck and, to tell the
fabric's share from the CPUs', to one more host beside it.  The incast
again with random loss at the bottleneck.

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
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from perf_matrix import Matrix as PerfMatrix

FIRST_TCP_PORT = 18515
VICTIM_PORT = 18700
IPERF_PORT = 5201
FI_PORT = 18800  # fi_commit_bench: a side channel and the provider's listener each
WINDOW_S = 0.1
# perftest 4.5's -R server listens twice on its port, for the control
# connection and then for the data QPs; a client whose data REQ comes
# before the second listen is rejected (no listener: reason 8), as by the
# kernel's CM, and Debian's perftest then crashes in its retry (fixed
# upstream in perftest 26.04).
PERFTEST_CM_RACE = "RDMA_CM_EVENT_REJECTED; error: 8"
STATS_RE = re.compile(r"sroce: \S+: (.*)$", re.M)


def jain(xs):
    s, q = sum(xs), sum(x * x for x in xs)
    return (s * s) / (len(xs) * q) if q else 1.0


def window_span(modes):
    """The range of the runs' median window lengths in ms, as text."""
    ms = [r["window_ms"]["median"] for m in modes for r in [m.get("solo")] + m["runs"]
          if r and r.get("window_ms")]
    if not ms:
        return "—"
    lo, hi = f"{min(ms):.0f}", f"{max(ms):.0f}"
    return lo if lo == hi else f"{lo}–{hi}"


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
        self.marking = {}  # the last fabric's, for the report

    def fab(self, *args, check=True):
        return subprocess.run([self.tool, "--name", self.name, *args], env=self.env,
                              capture_output=True, text=True, check=check)

    def up(self, hosts, a, loss):
        self.fab("down", check=False)
        args = ["up", "-n", str(hosts), "--rate", a.rate, "--queue", str(a.queue), "--ecn",
                "--mark-rate", str(a.mark_rate)]
        # The marking sroce-fabric's defaults leave alone is its own.
        for opt in ("mark_threshold", "mark_max", "mark_probability"):
            if getattr(a, opt) is not None:
                args += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
        if loss:
            args += ["--loss", f"{loss}%"]
        r = self.fab(*args, check=False)
        if r.returncode:
            sys.exit(f"fabric_matrix: sroce-fabric up: {r.stderr.strip()}")
        self.state = json.loads(self.fab("show", "-j").stdout)
        self.marking = {k: self.state[k] for k in ("mark_threshold", "mark_max",
                                                   "mark_probability")}

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

    def plain_argv(self, h, prog):
        """A program on a host without its sroce device: a peer's."""
        return ["ip", "netns", "exec", self.netns(h), *prog]

    def sysctl_all(self, name, value):
        for h in self.state["hosts"]:
            subprocess.run(["ip", "netns", "exec", self.netns(h), "sysctl", "-qw",
                            f"{name}={value}"], check=True)

    def bottleneck(self):
        return json.loads(self.fab("show", "-j").stdout)["bottleneck"]

    def netns(self, h):
        return self.host(h)["netns"]


class Sampler:
    """Bytes from each sender arriving at h0, every WINDOW_S: nft counters
    on h0's ingress.  Everything a sender sends to h0 counts (RoCE, TCP,
    and perftest's few bytes of set-up), so that sroce and its peers are
    measured alike.  With the bottleneck's backlog (the switch port towards
    h0) at each sample.

    nft and tc stay running (`nft -i`, `tc -batch -`), one in h0's
    namespace and one in the switch's, and answer a line of JSON for each
    command the sampling thread writes them: a process and a namespace
    set-up for every sample (`ip netns exec`) stretched 100 ms windows to
    300 ms and more on 2 loaded CPUs.  The thread runs at a higher priority
    than the programs measured, and each window's real length is kept."""

    def __init__(self, fabric, senders):
        self.fabric, self.senders = fabric, senders
        self.ns = fabric.netns("h0")
        rules = ["table netdev sroce_fabric_matrix {",
                 "  chain in {", "    type filter hook ingress device eth0 priority 0;"]
        for s in senders:
            addr = fabric.host(s)["ipv4"]
            rules.append(f"    ip saddr {addr} counter name {s}")
        rules.append("  }")
        rules += [f"  counter {s} {{}}" for s in senders]
        rules.append("}")
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"],
                       input="\n".join(rules) + "\n", text=True, check=True)
        self.samples, self.queue, self.stop = [], [], threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    @staticmethod
    def persistent(ns, argv):
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                bufsize=1)

    @staticmethod
    def ask(proc, command):
        """The line `proc` answers `command` with, or "" once it has died or
        said nothing for 5 s (an error goes to its stderr, not a line).
        Each answer is one line, read whole, so nothing waits in the
        reader's buffer when select() looks."""
        try:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            if not select.select([proc.stdout], [], [], 5.0)[0]:
                return ""
            return proc.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):
            return ""

    @staticmethod
    def read(text):
        """Bytes per counter, from nft's JSON."""
        got = {}
        try:
            items = json.loads(text or "{}").get("nftables", [])
        except ValueError:
            return got
        for item in items:
            c = item.get("counter")
            if c:
                got[c["name"]] = c.get("bytes", 0)
        return got

    @staticmethod
    def backlog(text):
        """Bytes in the bottleneck's queue, from tc's JSON, or None."""
        try:
            return max(q.get("backlog", 0) for q in json.loads(text or "[]")
                       if q.get("kind") != "clsact")
        except ValueError:
            return None

    def loop(self):
        try:
            # Punctual windows: the programs measured spin on the same CPUs.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except OSError:
            pass
        nft = self.persistent(self.ns, ["nft", "-j", "-i"])
        tc = self.persistent(self.fabric.state["switch"], ["tc", "-s", "-j", "-batch", "-"])
        nxt = time.monotonic()
        while not self.stop.is_set():
            t = time.monotonic()
            text = self.ask(nft, "list counters table netdev sroce_fabric_matrix")
            if not text:
                print("fabric_matrix: nft stopped answering; the run's samples end here",
                      file=sys.stderr, flush=True)
                break
            self.samples.append((t, self.read(text)))
            self.queue.append(self.backlog(self.ask(tc, "qdisc show dev p0")))
            nxt += WINDOW_S
            if time.monotonic() - nxt > WINDOW_S:
                nxt = time.monotonic()  # behind by more than a window: start afresh
            self.stop.wait(max(0.0, nxt - time.monotonic()))
        for p in (nft, tc):
            p.stdin.close()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

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
        programs connect, which on a loaded machine takes up to seconds.
        self.lengths has each window's length in seconds."""
        series, lengths = [], []
        for (ta, a), (tb, b) in zip(self.samples, self.samples[1:]):
            series.append([b.get(s, 0) - a.get(s, 0) for s in self.senders])
            lengths.append(tb - ta)
        self.span = (0, 0)
        self.lengths = []
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
        self.span = (max(firsts) + skip, min(lasts) + 1 - skip)
        self.lengths = lengths[self.span[0]:self.span[1]]
        return series[self.span[0]:self.span[1]]

    def queue_bytes(self):
        """The bottleneck queue's samples over the windows windows() gave
        (each taken at a window's start)."""
        return [q for q in self.queue[self.span[0]:self.span[1]] if q is not None]


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
        # rdma_cm's streams start as their connections are made, up to a
        # second apart each while the others already load the machine and
        # the bottleneck: they run longer, so that all of them still run at
        # once for about the measured duration.
        seconds = self.args.duration + (max(2, len(self.fabric.state["hosts"]) - 2) if cm else 0)
        common = [*prog, "-d", self.fabric.host(sender)["device"], "-s", str(self.args.size),
                  "-D", str(seconds), "-p", str(port)]
        if cm:
            common.append("-R")
        server = ["env", "SROCE_STATS=1", *common]
        client = ["env", "SROCE_STATS=1", *common, self.fabric.host("h0")["ipv4"]]
        return server, client

    def victim_cmds(self, seconds, target):
        """The victim's server on `target` and its client."""
        # Sleeping on events, as the streams beside it do (see streams()).
        tool = os.path.join(self.build, "tools/perf/ib_write_commit_lat")
        common = [tool, "-e", "-s", "64", "-D", str(seconds), "-p", str(VICTIM_PORT)]
        server = list(common)
        client = [*common, "--out_json",
                  "--out_json_file", os.path.join(self.work, "victim.json"),
                  self.fabric.host(target)["ipv4"]]
        return self.fabric.argv(target, server), self.fabric.argv(self.victim_host(), client)

    def victim_host(self):
        return f"h{self.args.senders + 1}"

    def beside_host(self):
        """Where the victim's round trips go without crossing the
        bottleneck: they meet the same two CPUs, not the queue."""
        return f"h{self.args.senders + 2}"

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

    def streams(self, label, senders, cm, victim=None):
        """Runs one stream from each of `senders` into h0 at once; the
        figures.  With victim (the host its server runs on), the victim's
        round trips run in the middle of them, and every program sleeps on
        completion events instead of polling: 2 CPUs cannot give 18 polling
        processes a CPU each, as hosts of their own would, and the victim's
        round trips would wait for the scheduler rather than for the
        fabric."""
        servers, clients = [], []
        for i, s in enumerate(senders):
            srv, cli = self.stream_cmds(i, s, cm, victim is not None)
            self.record(f"{label}: server on h0 (one per sender, -p {FIRST_TCP_PORT}+i)",
                        self.fabric.argv("h0", srv))
            self.record(f"{label}: sender hI", self.fabric.argv(s, cli))
            servers.append(self.spawn(self.fabric.argv("h0", srv)))
            clients.append((s, cli))
        vsrv = vproc = None
        if victim:
            vs, vc = self.victim_cmds(self.victim_seconds(), victim)
            self.record(f"victim: server on {victim}", vs)
            self.record(f"victim: client, to {victim}", vc)
            vsrv = self.spawn(vs)
        self.wait_listening([FIRST_TCP_PORT + i for i in range(len(senders))], cm, servers)
        if vsrv:
            self.wait_listening([VICTIM_PORT], False, [vsrv], host=victim)
        time.sleep(0.2)
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
                "ce_seen": sst.get("rx_ce"), "cnps_sent": sst.get("tx_cnp"),
                "held": sst.get("rx_held")})
            if rc or src or res["flows"][-1]["MBps"] is None:
                res["flows"][-1]["output"] = (out + sout)[-2000:]
        self.figures(res, sampler, before, after)
        res["timeouts"] = sum(f["timeouts"] or 0 for f in res["flows"])
        if vout:
            res["victim"] = self.victim_figures(*vout)
            res["victim"]["server"] = victim
        return res

    def figures(self, res, sampler, before, after):
        """What the switch and h0's counters saw of a run's flows."""
        senders = [f["sender"] for f in res["flows"]]
        res["bottleneck"] = {k: after[k] - before.get(k, 0) for k in after
                             if k != "phantom_peak_bytes"}
        windows = sampler.windows(settle_s=0.5 if self.args.duration >= 4 else 0.1)
        res["windows"] = len(windows)
        res["series_bytes"] = windows
        q = sampler.queue_bytes()
        if q:
            # Sampled every window: a picture of the standing queue, not of
            # its every burst.
            res["queue_bytes"] = {"median": percentile(q, 50), "p90": percentile(q, 90),
                                  "max": max(q)}
            rate = self.fabric.state.get("rate")
            if rate:
                res["queue_us"] = {k: v * 8e6 / rate for k, v in res["queue_bytes"].items()}
        if len(senders) > 1 and windows:
            idx = [jain(w) for w in windows if sum(w)]
            res["jain_mean"] = sum(idx) / len(idx) if idx else None
            res["jain_p5"] = percentile(idx, 5)
        if windows:
            # What reached h0 while every stream ran: the figure compared
            # with one stream's, since perftest's own periods need not
            # overlap.
            total = sum(sum(w) for w in windows)
            res["arrival_Mbps"] = total * 8 / sum(sampler.lengths) / 1e6
            res["window_ms"] = {"median": percentile(sampler.lengths, 50) * 1e3,
                                "max": max(sampler.lengths) * 1e3}
            res["window_lengths_ms"] = [round(x * 1e3, 2) for x in sampler.lengths]
        bws = [f["MBps"] for f in res["flows"] if f["MBps"] is not None]
        res["goodput_MBps"] = sum(bws) if len(bws) == len(senders) else None

    # ------------------------------------------------------------ jobs
    def mpi_job(self):
        """Open MPI over UCX rc_verbs on h0..h(R-1), R even and at most 8,
        mpirun on the last host: tests/progs/mpi_check, every result of its
        ping-pongs, allreduces, alltoalls and one-sided operations checked.
        Open MPI starts its daemons through a remote shell, here a script
        that enters a host with a host name of its own (the hosts share the
        machine's, and Open MPI would take them for one node)."""
        hosts = sorted(self.fabric.state["hosts"], key=lambda h: int(h[1:]))
        nranks = min(8, len(hosts) - 1) // 2 * 2
        prog = os.path.join(self.build, "tests/progs/mpi_check")
        if not shutil.which("mpirun") or not os.path.exists(prog):
            return {"unavailable": "no mpirun or tests/progs/mpi_check (scripts/setup.sh)"}
        agent = os.path.join(self.work, "fabric-rsh")
        with open(agent, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\nhost=$1\nshift\n"
                    f"exec {shlex.quote(self.fabric.tool)} --name {shlex.quote(self.fabric.name)} "
                    'exec "$host" -- unshare --uts sh -c "hostname $host && exec $*"\n')
        os.chmod(agent, 0o755)
        dev = self.fabric.host("h0")["device"]
        argv = ["mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", agent,
                "--mca", "plm_rsh_no_tree_spawn", "1", "--host", ",".join(hosts[:nranks]),
                "-np", str(nranks), "-x", f"UCX_NET_DEVICES={dev}:1",
                "-x", "UCX_TLS=rc_verbs,ud_verbs:aux", "--mca", "pml", "ucx",
                "--mca", "osc", "ucx", "--mca", "btl", "self", prog]
        self.record(f"Open MPI, {nranks} ranks (the remote shell: `sroce-fabric exec` of the "
                    "host under `unshare --uts`)", self.fabric.plain_argv(hosts[-1], argv))
        t0 = time.monotonic()
        rc, out = self.finish([self.spawn(self.fabric.plain_argv(hosts[-1], argv))], 300)[0]
        res = {"ranks": nranks, "hosts": hosts[:nranks], "rc": rc,
               "seconds": time.monotonic() - t0, "ok": len(re.findall(r"^ok ", out, re.M)),
               "failed": len(re.findall(r"^FAIL ", out, re.M))}
        for what, key in ((r"alltoall of (\d+) bytes per pair .*: ([\d.]+) us", "alltoall_us"),):
            res[key] = {m[0]: float(m[1]) for m in re.findall(what, out)}
        if rc or res["failed"] or not res["ok"]:
            res["output"] = out[-3000:]
        return res

    def pmof_job(self):
        """A pmof job: fi_remote_log from h1..hK (K at most 7) appending
        32-byte records with FI_COMMIT into logs kept by targets on h0; the
        targets killed with SIGKILL mid-stream.  Every initiator must stop
        with a completion error, and every log must hold every record its
        initiator saw committed (and at most the 16 in flight beyond)."""
        prog = os.path.join(self.build, "tests/compile/fi_remote_log")
        provider = os.path.join(self.build, "libfabric-glue")
        if not os.path.exists(prog):
            return {"unavailable": f"{prog} not built"}
        env = ["env", "FI_PROVIDER=pmof", f"FI_PROVIDER_PATH={provider}"]
        h0 = self.fabric.host("h0")["ipv4"]
        senders = [f"h{i}" for i in range(1, min(7, self.args.senders) + 1)]
        targets = []
        for s in senders:
            log = os.path.join(self.work, f"log-{s}")
            out = open(os.path.join(self.work, f"target-{s}.out"), "w+", encoding="utf-8")
            argv = self.fabric.argv("h0", [*env, prog, "--server", "-a", h0, "--file", log,
                                           "--size", str(16 << 20)])
            self.record("pmof: a target on h0 per initiator", argv)
            targets.append((s, log, out, subprocess.Popen(argv, env=self.fabric.env, stdout=out,
                                                          stderr=subprocess.STDOUT)))
        ports = {}
        end = time.monotonic() + 30
        while len(ports) < len(targets) and time.monotonic() < end:
            for s, _, out, _ in targets:
                out.seek(0)
                m = re.search(r"listening on port (\d+)", out.read())
                if m:
                    ports[s] = m.group(1)
            time.sleep(0.1)
        res = {"initiators": len(senders), "logs": []}
        inits = []
        for s in senders:
            if s in ports:
                argv = self.fabric.argv(s, [*env, prog, "-a", h0, "-p", ports[s], "-n",
                                            "100000000", "--record-size", "32"])
                self.record("pmof: an initiator on hI", argv)
                out = open(os.path.join(self.work, f"initiator-{s}.out"), "w+", encoding="utf-8")
                inits.append((s, out, subprocess.Popen(argv, env=self.fabric.env, stdout=out,
                                                       stderr=subprocess.STDOUT,
                                                       start_new_session=True)))
        # The targets die once every initiator has had its first commit (a
        # loaded machine connects them seconds apart), and then some time.
        end = time.monotonic() + 60
        while time.monotonic() < end:
            started = 0
            for _, out, p in inits:
                out.seek(0)
                started += p.poll() is not None or "committed" in out.read()
            if started == len(inits):
                break
            time.sleep(0.1)
        time.sleep(max(2.0, self.args.duration / 4))
        for _, _, _, t in targets:
            t.kill()
        for _, _, _, t in targets:
            t.wait()
        outs = []
        for _, out, p in inits:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.seek(0)
            outs.append((p.returncode, out.read()))
            out.close()
        for (s, _, _), (rc, out) in zip(inits, outs):
            log = os.path.join(self.work, f"log-{s}")
            last = ([0] + [int(x) for x in re.findall(r"^committed (\d+)", out, re.M)])[-1]
            v = subprocess.run([prog, "--verify", log, "--record-size", "32"],
                               capture_output=True, text=True)
            m = re.search(r"^log ok: (\d+) records", v.stdout, re.M)
            head = int(m.group(1)) if m else None
            entry = {"initiator": s, "rc": rc, "committed": last, "head": head,
                     "ok": rc == 3 and last > 0 and head is not None and last <= head <= last + 16}
            if not entry["ok"]:
                entry["output"] = (out[-1000:] + v.stdout[-500:] + v.stderr[-500:])
            res["logs"].append(entry)
        for _, _, out, _ in targets:
            out.close()
        res["missing_targets"] = [s for s in senders if s not in ports]
        res["ok"] = (not res["missing_targets"] and len(res["logs"]) == len(senders) and
                     all(e["ok"] for e in res["logs"]))
        return res

    # ------------------------------------------------------------ peers
    def peer_cmds(self, peer, i):
        """Server and client argv of sender i's stream with `peer`, and
        the file its figures go to."""
        h0 = self.fabric.host("h0")["ipv4"]
        d, size = str(self.args.duration), str(self.args.size)
        result = os.path.join(self.work, f"peer{i}.json")
        if peer["kind"] == "tcp":
            port = str(IPERF_PORT + i)
            # -l: the size of each write, as the RDMA streams' messages.
            return (["iperf3", "-s", "-1", "-B", h0, "-p", port],
                    ["iperf3", "-c", h0, "-p", port, "-t", d, "-l", size, "-C", peer["cc"], "-J",
                     "--logfile", result], result)
        port = str(FI_PORT + 2 * i)
        # The tcp provider's RMA writes, each completed once the target has
        # it (as an RC WRITE is by its ACK); both sides sleep in
        # fi_cq_sread, as TCP's programs sleep in the kernel.
        bench = os.path.join(self.build, "tools/bench/fi_commit_bench")
        return ([bench, "-p", "tcp", "-a", h0, "-P", port, "--blocking"],
                [bench, "-p", "tcp", "-P", port, "-m", "bw", "-s", size, "-D", d,
                 "--completion", "delivery", "--blocking", "--out_json_file", result, h0], result)

    @staticmethod
    def peer_figures(peer, path):
        """(MB/s at the receiver, retransmissions) from a client's file."""
        try:
            with open(path, encoding="utf-8") as f:
                r = json.load(f)
        except (OSError, ValueError):
            return None, None
        if peer["kind"] == "tcp":
            end = r.get("end", {})
            bps = end.get("sum_received", {}).get("bits_per_second")
            return (bps / 8e6 if bps else None), end.get("sum_sent", {}).get("retransmits")
        res = (r.get("results") or [{}])[0]
        return res.get("bw_avg_MBps"), None

    def peer_streams(self, label, senders, peer):
        """One stream of `peer` from each sender into h0 at once."""
        servers, clients = [], []
        for i, s in enumerate(senders):
            srv, cli, result = self.peer_cmds(peer, i)
            # iperf3's --logfile appends.
            if os.path.exists(result):
                os.unlink(result)
            self.record(f"{peer['label']}: server on h0 (one per sender)",
                        self.fabric.plain_argv("h0", srv))
            self.record(f"{peer['label']}: sender hI", self.fabric.plain_argv(s, cli))
            servers.append(self.spawn(self.fabric.plain_argv("h0", srv)))
            clients.append((s, cli, result))
        port0 = IPERF_PORT if peer["kind"] == "tcp" else FI_PORT
        step = 1 if peer["kind"] == "tcp" else 2
        self.wait_listening([port0 + step * i for i in range(len(senders))], False, servers)
        time.sleep(0.2)
        before = self.fabric.bottleneck()
        sampler = Sampler(self.fabric, senders)
        sampler.start()
        cprocs = [self.spawn(self.fabric.plain_argv(s, c)) for s, c, _ in clients]
        couts = self.finish(cprocs, self.args.duration * 6 + 30)
        sampler.finish()
        souts = self.finish(servers, 20)
        after = self.fabric.bottleneck()
        res = {"label": label, "senders": len(senders), "peer": peer["label"], "flows": []}
        for (s, _, result), (rc, out), (src, sout) in zip(clients, couts, souts):
            mbps, retrans = self.peer_figures(peer, result)
            res["flows"].append({"sender": s, "rc": rc, "server_rc": src, "MBps": mbps,
                                 "retransmits": retrans})
            if rc or src or mbps is None:
                res["flows"][-1]["output"] = (out + sout)[-2000:]
        self.figures(res, sampler, before, after)
        res["retransmits"] = sum(f["retransmits"] or 0 for f in res["flows"])
        return res

    def peers(self):
        """The same incast with TCP and libfabric's tcp provider, on a
        fabric like the RDMA runs' (ECN marking on: TCP with ECN sees it)."""
        a = self.args
        senders = [f"h{i}" for i in range(1, a.senders + 1)]
        if shutil.which("modprobe"):
            subprocess.run(["modprobe", "-q", "tcp_dctcp"], capture_output=True)
        try:
            with open("/proc/sys/net/ipv4/tcp_available_congestion_control",
                      encoding="utf-8") as f:
                algos = f.read().split()
        except OSError:
            algos = []
        plan = [{"label": "TCP cubic", "kind": "tcp", "cc": "cubic", "ecn": 0},
                {"label": "TCP cubic, ECN", "kind": "tcp", "cc": "cubic", "ecn": 1},
                {"label": "TCP dctcp", "kind": "tcp", "cc": "dctcp", "ecn": 1},
                {"label": "libfabric tcp", "kind": "libfabric", "ecn": 0}]
        out = []
        self.fabric.up(a.senders + 1, a, 0.0)
        try:
            for peer in plan:
                if peer["kind"] == "tcp" and peer["cc"] not in algos:
                    peer["unavailable"] = (f"this kernel has no {peer['cc']} "
                                           f"(it has {' '.join(algos) or 'none'})")
                elif peer["kind"] == "tcp" and not shutil.which("iperf3"):
                    peer["unavailable"] = "no iperf3 (run scripts/setup.sh)"
                if peer.get("unavailable"):
                    print(f"  {peer['label']}: {peer['unavailable']}", flush=True)
                    out.append(peer)
                    continue
                self.fabric.sysctl_all("net.ipv4.tcp_ecn", peer["ecn"])
                peer["solo"] = self.peer_streams(f"{peer['label']}: one stream", senders[:1], peer)
                self.progress(peer["solo"])
                peer["incast"] = self.peer_streams(f"{peer['label']}: {a.senders} to 1", senders,
                                                   peer)
                self.progress(peer["incast"])
                out.append(peer)
        finally:
            self.fabric.down()
        return out

    def wait_listening(self, ports, cm, procs, timeout=30.0, host="h0"):
        """Waits until `host` listens on every one of `ports` (rdma_cm ports
        as its agent lists them, else TCP), or one of `procs` has exited.  A
        client that came first would be refused: a fixed pause is too short
        for eight servers on a loaded machine."""
        info = self.fabric.host(host)
        if cm:
            cmd = [self.fabric.state["sroce"], "--config", info["config"], "-j", "agent",
                   "status"]
            pattern = r'"port":\s*(\d+)'
        else:
            cmd, pattern = ["ss", "-Hltn"], r":(\d+)\s"
        end, have = time.monotonic() + timeout, set()
        while time.monotonic() < end:
            out = subprocess.run(self.fabric.plain_argv(host, cmd), capture_output=True,
                                 text=True).stdout
            have = {int(x) for x in re.findall(pattern, out)}
            if all(p in have for p in ports):
                return True
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.1)
        # The clients then fail on their own; this says why first.
        print(f"fabric_matrix: {host} does not listen on {sorted(set(ports) - have)} "
              f"({'rdma_cm' if cm else 'TCP'}): a server exited or is slow to start",
              file=sys.stderr, flush=True)
        return False

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

    def victim_idle(self, target):
        vs, vc = self.victim_cmds(self.victim_seconds(), target)
        srv = self.spawn(vs)
        self.wait_listening([VICTIM_PORT], False, [srv], host=target)
        out = self.finish([self.spawn(vc)], 120)[0]
        self.finish([srv], 20)
        return self.victim_figures(*out)

    def mode(self, cc):
        """Every run with congestion control `cc` (dcqcn or off)."""
        a = self.args
        hosts = a.senders + 1 + (2 if a.victim else 0)
        senders = [f"h{i}" for i in range(1, a.senders + 1)]
        out = {"cc": cc, "runs": []}
        for loss in ([0.0] + ([a.loss] if a.loss else [])):
            self.fabric.up(hosts, a, loss)
            try:
                for h in self.fabric.state["hosts"]:
                    self.fabric.set_cc(h, cc, a.cc_param if cc != "off" else [])
                tag = f"cc {cc}" + (f", {loss:g}% loss" if loss else "")
                if not loss:
                    out["solo"] = self.streams(f"{tag}: one stream", senders[:1], False)
                    self.progress(out["solo"])
                    if a.victim:
                        out["victim_idle"] = self.victim_idle("h0")
                        out["victim_idle_beside"] = self.victim_idle(self.beside_host())
                plan = [("", False, None)]
                if not loss:
                    plan.append((" over rdma_cm", True, None))
                    if a.victim:
                        plan.append((", events, and the victim", False, "h0"))
                        plan.append((", events, and a victim beside it", False,
                                     self.beside_host()))
                for what, cm, victim in plan:
                    for attempt in range(1, 4):
                        r = self.streams(f"{tag}: {a.senders} to 1{what}", senders, cm, victim)
                        if not any(PERFTEST_CM_RACE in f.get("output", "") for f in r["flows"]):
                            break
                        print(f"  {r['label']}: perftest's rdma_cm race (REJ before its server "
                              "listened again), run again", flush=True)
                    r["attempts"] = attempt
                    r["loss_pct"] = loss
                    self.progress(r)
                    out["runs"].append(r)
                if not loss and a.jobs:
                    out["mpi"] = self.mpi_job()
                    print(f"  {tag}: Open MPI {job_line(out['mpi'])}", flush=True)
                    out["pmof"] = self.pmof_job()
                    print(f"  {tag}: pmof {job_line(out['pmof'])}", flush=True)
            finally:
                self.fabric.down()
        return out

    @staticmethod
    def progress(r):
        print(f"  {r['label']}: {fmt(r.get('arrival_Mbps'))} Mbit/s at h0, the programs "
              f"{fmt(r.get('goodput_MBps'))} MB/s, Jain "
              f"{fmt(r.get('jain_mean'), 3)} (p5 {fmt(r.get('jain_p5'), 3)}), "
              + (f"{r['timeouts']} timeouts, " if "timeouts" in r else
                 f"{r['retransmits']} retransmissions, ") +
              f"{r['bottleneck'].get('dropped')} dropped, "
              f"{r['bottleneck'].get('marked')} marked, queue {queue_cell(r)} µs", flush=True)

    # ------------------------------------------------------------ report
    def report(self, modes, peers):
        a = self.args
        mark = self.fabric.marking
        os.makedirs(a.out, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "host": platform.node(),
                "cpus": os.cpu_count(), "kernel": platform.release(), "rate": a.rate,
                "queue_packets": a.queue, "mark_rate": a.mark_rate,
                "mark_threshold_bytes": mark.get("mark_threshold"),
                "mark_max_bytes": mark.get("mark_max"),
                "mark_probability": mark.get("mark_probability"), "senders": a.senders, "duration_s": a.duration,
                "size": a.size, "cc_params": a.cc_param, "short": a.short}
        with open(os.path.join(a.out, "congestion.json"), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "modes": modes, "peers": peers}, f, indent=1)
        L = [f"# Congestion on a fabric of {a.senders + 1 + (2 if a.victim else 0)} hosts",
             "",
             f"Made by `tools/perf/fabric_matrix.py` on {meta['date']} ({meta['cpus']} CPUs, "
             f"kernel {meta['kernel']}){' with --short: the numbers mean nothing' if a.short else ''}.",
             f"{a.senders} senders write {a.size}-byte RDMA WRITEs into h0 for {a.duration} s "
             f"(perftest's `ib_write_bw` defaults); the switch port towards h0 runs at "
             f"{a.rate} over a {a.queue}-packet tail-drop queue and marks CE as RED does "
             f"from a phantom queue drained at {a.mark_rate:g} of the rate: past "
             f"{mark.get('mark_threshold')} bytes with a probability growing to "
             f"{mark.get('mark_probability')} at {mark.get('mark_max')} bytes, every packet "
             "past that.  Goodput is perftest's; "
             "fairness is Jain's index over the bytes "
             f"each sender delivered to h0 in {int(WINDOW_S * 1000)} ms windows (mean, and "
             "the 5th percentile of the windows).  Both count only the windows in which every "
             "stream runs (programs connect one by one on a loaded machine), less half a "
             "second at either end; Mbit/s is what reached h0 then (headers and resends included), "
             "compared with one stream alone measured so; perftest's figures, each over "
             "its own stream's time, are summed beside it.",
             "The queue is the bottleneck's backlog sampled at the start of each window, as "
             "the time it takes to drain (median / 90th percentile).",
             f"The windows were {window_span(modes)} ms long (each run's median; every "
             "window's real length is in the JSON).",
             "", "| run | Mbit/s at h0 | of one stream | perftest MB/s (sum) | Jain mean | "
             "Jain p5 | queue, µs | timeouts | selective resends | dropped | marked | CNPs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in modes:
            solo = (m.get("solo") or {}).get("arrival_Mbps")
            for r in [m.get("solo")] + m["runs"]:
                if not r:
                    continue
                g = r.get("arrival_Mbps")
                ratio = g / solo if g and solo else None
                again = (f" (run {r['attempts']} times: perftest's rdma_cm race)"
                         if r.get("attempts", 1) > 1 else "")
                L.append(f"| {r['label']}{again} | {fmt(g, 1)} | {fmt(ratio, 3)} | "
                         f"{fmt(r.get('goodput_MBps'))} | "
                         f"{fmt(r.get('jain_mean'), 3)} | {fmt(r.get('jain_p5'), 3)} | "
                         f"{queue_cell(r)} | {r['timeouts']} | "
                         f"{sum(f['resent_selective'] or 0 for f in r['flows'])} | "
                         f"{r['bottleneck'].get('dropped')} | {r['bottleneck'].get('marked')} | "
                         f"{sum(f['cnps_sent'] or 0 for f in r['flows'])} |")
        if a.victim:
            L += ["", "## The victim: a 64-byte write-commit from a further host", "",
                  f"Its round trips to h0 cross the bottleneck; those to {self.beside_host()} "
                  "do not, and meet only the same two CPUs as the incast's programs.", "",
                  "| cc | server | idle typical µs | idle p99 µs | incast typical µs | "
                  "incast p99 µs | p99 ratio |", "|---|---|---|---|---|---|---|"]
            for m in modes:
                for where, key in (("h0", "victim_idle"), (self.beside_host(),
                                                           "victim_idle_beside")):
                    idle = m.get(key) or {}
                    busy = next((r["victim"] for r in m["runs"]
                                 if (r.get("victim") or {}).get("server") == where), {})
                    ratio = (busy.get("t_p99_us") / idle["t_p99_us"]
                             if busy.get("t_p99_us") and idle.get("t_p99_us") else None)
                    L.append(f"| {m['cc']} | {where} | {fmt(idle.get('t_typical_us'))} | "
                             f"{fmt(idle.get('t_p99_us'))} | {fmt(busy.get('t_typical_us'))} | "
                             f"{fmt(busy.get('t_p99_us'))} | {fmt(ratio, 2)} |")
        if any("mpi" in m or "pmof" in m for m in modes):
            L += ["", "## Jobs across the fabric", "",
                  "Open MPI over UCX rc_verbs runs tests/progs/mpi_check (ping-pongs, allreduces, "
                  "alltoalls and one-sided operations, every result checked) on h0 and further "
                  "hosts; a pmof job appends 32-byte records with FI_COMMIT from up to 7 hosts "
                  "into logs on h0 (fi_remote_log), whose targets are then killed with SIGKILL: "
                  "each initiator must stop with a completion error and each log must hold "
                  "every record its initiator saw committed.", "",
                  "| cc | Open MPI | checks passed / failed | seconds | alltoall of 256 KiB "
                  "per pair, µs | pmof initiators | commits completed before the kill | "
                  "every one kept |", "|---|---|---|---|---|---|---|---|"]
            for m in modes:
                mpi, pm = m.get("mpi") or {}, m.get("pmof") or {}
                mpi_cell = (f"not run: {mpi['unavailable']}" if mpi.get("unavailable") else
                            f"{mpi.get('ranks')} ranks, exit {mpi.get('rc')}")
                pm_cells = ([f"not run: {pm['unavailable']}", "", ""] if pm.get("unavailable")
                            else [str(pm.get("initiators")),
                                  str(sum(e["committed"] for e in pm.get("logs", []))),
                                  "yes" if pm.get("ok") else "NO"])
                L.append(f"| {m['cc']} | {mpi_cell} | {mpi.get('ok')} / {mpi.get('failed')} | "
                         f"{fmt(mpi.get('seconds'), 1)} | "
                         f"{fmt((mpi.get('alltoall_us') or {}).get('262144'), 0)} | "
                         + " | ".join(pm_cells) + " |")
        if peers:
            L += self.peer_report(modes, peers)
        L += ["", "## Commands", "", "```sh",
              "python3 tools/perf/fabric_matrix.py " + " ".join(
                  shlex.quote(x) for x in sys.argv[1:])]
        for label, argv in self.commands:
            L.append(f"# {label}")
            L.append(" ".join(shlex.quote(x) for x in short_path(argv, self.build, self.work)))
        L.append("```")
        with open(os.path.join(a.out, "congestion.md"), "w", encoding="utf-8") as f:
            f.write("\n".join(L) + "\n")


    def peer_report(self, modes, peers):
        a = self.args
        L = ["", "## Against the peers", "",
             f"The same {a.senders}-to-1 incast through the same bottleneck with TCP (iperf3, "
             f"writes of {a.size} bytes; `net.ipv4.tcp_ecn` on every host for the ECN runs) and "
             "with libfabric's tcp provider (fi_commit_bench: RMA writes of the same size, 16 "
             "in flight, each completed on delivery).  sroce's rows are the RDMA runs above.  "
             "Retransmissions are TCP's own (iperf3) or sroce's timeouts and selective resends.",
             "", "| transport | one stream Mbit/s | incast Mbit/s at h0 | of one stream | "
             "Jain mean | Jain p5 | queue, µs | retransmissions | dropped | marked |",
             "|---|---|---|---|---|---|---|---|---|---|"]

        def row(name, solo, r, retrans):
            g, s1 = r.get("arrival_Mbps"), (solo or {}).get("arrival_Mbps")
            return (f"| {name} | {fmt(s1, 1)} | {fmt(g, 1)} | "
                    f"{fmt(g / s1 if g and s1 else None, 3)} | {fmt(r.get('jain_mean'), 3)} | "
                    f"{fmt(r.get('jain_p5'), 3)} | {queue_cell(r)} | {retrans} | "
                    f"{r['bottleneck'].get('dropped')} | {r['bottleneck'].get('marked')} |")
        for m in modes:
            for r in m["runs"]:
                if r.get("loss_pct") or r.get("victim"):
                    continue
                resent = sum(f["resent_selective"] or 0 for f in r["flows"])
                L.append(row(f"sroce, cc {m['cc']}{' over rdma_cm' if r['cm'] else ''}",
                             m.get("solo"), r, f"{r['timeouts']} + {resent}"))
        for p in peers:
            if p.get("unavailable"):
                L.append(f"| {p['label']} | not run: {p['unavailable']} | | | | | | | | |")
            else:
                L.append(row(p["label"], p["solo"], p["incast"], p["incast"]["retransmits"]))
        return L


def queue_cell(r):
    q = r.get("queue_us")
    return f"{q['median']:.0f} / {q['p90']:.0f}" if q else "—"


def job_line(r):
    if r.get("unavailable"):
        return f"not run: {r['unavailable']}"
    if "ranks" in r:
        return (f"{r['ranks']} ranks, exit {r['rc']}, {r['ok']} checks passed, "
                f"{r['failed']} failed, {r['seconds']:.1f} s")
    return (f"{r['initiators']} initiators, targets killed: " +
            ", ".join(f"{e['initiator']} exit {e['rc']} committed {e['committed']} head {e['head']}"
                      for e in r["logs"]) + (" — all kept" if r["ok"] else " — FAILED"))


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
    p.add_argument("--mark-threshold", type=int,
                   help="where the phantom queue starts marking, bytes (default: "
                        "sroce-fabric's)")
    p.add_argument("--mark-rate", type=float, default=0.95,
                   help="phantom queue drain, a fraction of the rate (default 0.95)")
    p.add_argument("--mark-max", type=int,
                   help="where it marks every packet, bytes (default: sroce-fabric's)")
    p.add_argument("--mark-probability", type=float,
                   help="RED's probability at --mark-max (default: sroce-fabric's)")
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
    p.add_argument("--no-jobs", dest="jobs", action="store_false",
                   help="leave out the Open MPI and pmof jobs")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="leave out the incast with TCP and libfabric tcp")
    p.add_argument("--short", action="store_true", help="three hosts, two seconds")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("fabric_matrix: needs root (network namespaces)")
    if args.short:
        args.senders, args.duration = 2, 2
        args.rate = "50mbit"
    m = Matrix(args)
    modes, peers = [], []
    try:
        for cc in args.cc:
            print(f"cc {cc}:", flush=True)
            modes.append(m.mode(cc))
        if args.peers:
            print("peers:", flush=True)
            peers = m.peers()
    finally:
        m.fabric.down()
        shutil.rmtree(m.work, ignore_errors=True)
    m.report(modes, peers)
    print(f"wrote {os.path.join(args.out, 'congestion.md')}")


if __name__ == "__main__":
    main()
