#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Runs the remote-persistence benchmark matrix on loopback.

Every way of making a remote write durable (the --method values of
ib_write_commit_lat/bw) at sizes 8 B ... 1 MiB, over two sroce links on lo,
together with the peers measured in the same run: raw UDP and TCP over
loopback (socket_loopback), libfabric's tcp provider writing with
FI_COMMIT_COMPLETE (fi_commit_bench) and the same program over the pmof
provider on the sroce links (an agent of the matrix's own for rdma_cm).  Writes results.md (tables, the target
ratios, the exact commands), results.json (every figure) and results.png
(latency and bandwidth against size) into --out.

--short runs a reduced matrix with few iterations: the test suite runs it so
that the tools cannot rot; its numbers mean nothing.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

METHODS = ["write", "native", "write-flush", "write-read", "write-send"]
FULL_SIZES = [8, 64, 512, 4096, 65536, 1048576]
SHORT_SIZES = [64, 65536]

# Bytes of BTH + RETH + ICRC around a 4096-byte WRITE MIDDLE payload: the
# datagram size a 64 KiB WRITE travels in, which the UDP ceiling must match.
ROCE_MIDDLE_OVERHEAD = 12 + 4
# fi_commit_bench's writes in flight, and the sroce series measured at it.
FI_DEPTH = 16
NATIVE_FI_DEPTH = "native (%d in flight)" % FI_DEPTH
# The shared-device series.
SHARED_ALONE = "native (shared series: alone)"
SHARED_APART = "native, 2 streams on 2 device pairs"
SHARED_BW = "native, 2 streams on 1 device pair"
SHARED_LAT = "native, idle process per device"
ROCE_ONLY_OVERHEAD = 12 + 16 + 4
# The UDP ping-pong's datagram: a 64-byte WRITE ONLY's UDP payload.
UDP_SMALL = 64 + ROCE_ONLY_OVERHEAD
# The 64 B series measured round-robin with the busy UDP ping-pong.
NEXT_TO_UDP = "%s (next to udp busy)"


class Matrix:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.sroce = os.path.join(self.build, "tools/sroce/sroce")
        self.perf = os.path.join(self.build, "tools/perf")
        self.bench = os.path.join(self.build, "tools/bench")
        self.work = tempfile.mkdtemp(prefix="perf-matrix.")
        self.port = args.port
        self.commands = []
        self.results = {"lat": {}, "bw": {}, "peers": {}}
        self.env = dict(os.environ)
        for k in ("LD_PRELOAD", "SROCE_FAULT", "SROCE_BUSY_POLL", "SROCE_APP_PROGRESS",
                  "SROCE_SPIN_US"):
            self.env.pop(k, None)
        self.env["SROCE_CONFIG"] = os.path.join(self.work, "links.conf")
        # pm2, pm3: a second pair of devices, two addresses further on, for
        # streams that share no device (the control of the shared ones).
        self.addrs = list(args.addr) + [bump(a, 2) for a in args.addr]
        for name, addr in zip(("pm0", "pm1", "pm2", "pm3"), self.addrs):
            subprocess.run([self.sroce, "link", "add", name, "netdev", "lo", "addr", addr],
                           env=self.env, check=True, stdout=subprocess.DEVNULL)
        # pmof connects through rdma_cm, which needs an agent: a private one.
        self.env["SROCE_AGENT_SOCKET"] = "perf-matrix-%d" % os.getpid()
        self.env["FI_PROVIDER_PATH"] = os.path.join(self.build, "libfabric-glue")
        self.agent = False

    def start_agent(self):
        if not self.agent:
            subprocess.run([self.sroce, "agent", "start"], env=self.env, check=True,
                           stdout=subprocess.DEVNULL)
            self.agent = True

    def stop_agent(self):
        if self.agent:
            subprocess.run([self.sroce, "agent", "stop"], env=self.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.agent = False

    # ------------------------------------------------------------ running
    def next_port(self):
        # fi_commit_bench also listens on PORT + 1.
        self.port += 2
        return self.port

    @staticmethod
    def listening(port):
        # Connecting to find out would be taken for the client itself.
        want = ":%04X " % port
        for path in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(path) as f:
                    for line in f:
                        fields = line.split()
                        if len(fields) > 3 and (fields[1] + " ").endswith(want) and \
                                fields[3] == "0A":
                            return True
            except OSError:
                pass
        return False

    def wait_listen(self, port, proc, timeout=15.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                return False
            if self.listening(port):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def median_run(runs):
        """The run whose central figure is the median: on a small shared
        machine a single run can lose a scheduler tick or two."""
        first = runs[0]["results"][0]
        key = "t_typical" if "t_typical" in first else "bw_avg_MBps"
        runs = sorted(runs, key=lambda r: r["results"][0][key])
        return runs[len(runs) // 2]

    def median_of_rounds(self, fn):
        """Runs one measurement --rounds times; the median run."""
        return self.median_run([fn(i) for i in range(self.args.rounds)])

    def interleaved(self, jobs):
        """Runs the measurements of `jobs` ([(name, fn(first_round))])
        round-robin, --rounds times, so that a slow spell of the machine
        falls on all of them alike; {name: median run}."""
        runs = {name: [] for name, _ in jobs}
        for i in range(self.args.rounds):
            for name, fn in jobs:
                runs[name].append(fn(i == 0))
        return {name: self.median_run(r) for name, r in runs.items()}

    def run_pair(self, server, client, env_extra=None, label=""):
        """Starts server, waits for its TCP port, runs client; returns the
        client's JSON results (the median of --rounds runs)."""
        return self.median_of_rounds(
            lambda i: self.run_pair_once(server, client, env_extra, label, i == 0))

    def run_pair_once(self, server, client, env_extra, label, record, parse=None):
        return self.run_pairs_once([(server, client)], env_extra, label, record, parse)[0]

    @staticmethod
    def reap(proc, started, timeout, tick=None):
        """Waits for `proc` as Popen.wait does, calling tick() meanwhile;
        the share of one CPU it and the children it waited for used since
        `started`, in per cent."""
        end = time.monotonic() + timeout
        while True:
            if tick:
                tick()
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                wall = max(time.monotonic() - started, 1e-6)
                return 100.0 * (ru.ru_utime + ru.ru_stime) / wall
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(0.05 if tick else 0.005)

    @staticmethod
    def with_cpu(result, server_pct, client_pct):
        """Puts the CPU shares beside the figures of `result`."""
        r = result["results"][0] if "results" in result else result
        r["cpu_server_pct"] = server_pct
        r["cpu_client_pct"] = client_pct
        return result

    def run_pairs_once(self, pairs, env_extra, label, record, parse=None, idle=()):
        """Starts every server of `pairs` ([(server, client)]) and the
        `idle` servers (which no client visits: processes holding a device),
        waits for their TCP ports, runs the clients at the same time; the
        clients' JSON results (or parse(stdout)), in order, each with the
        CPU its server and its client used (cpu_server_pct,
        cpu_client_pct: per cent of one CPU over each one's lifetime)."""
        env = dict(self.env)
        env.update(env_extra or {})
        started, clients, born = [], [], {}
        try:
            for server, client in list(pairs) + [(i, None) for i in idle]:
                port = self.next_port()
                out = os.path.join(self.work, "result-%d.json" % port)
                server = [a.replace("@PORT@", str(port)) for a in server]
                if client:
                    client = [a.replace("@PORT@", str(port)).replace("@JSON@", out)
                              for a in client]
                if record:
                    self.commands.append((label, env_extra or {}, server, client))
                slog = open(os.path.join(self.work, "server-%d.log" % port), "w")
                born[len(started)] = time.monotonic()
                srv = subprocess.Popen(server, env=env, stdout=slog, stderr=subprocess.STDOUT)
                started.append((srv, slog, server))
                if not self.wait_listen(port, srv):
                    raise RuntimeError("%s: server did not listen: %s\n%s" %
                                       (label, shlex.join(server), self.tail(slog.name)))
                if client:
                    clients.append((client, out))
            running = []
            for c, out in clients:
                clog = open(out + ".log", "w+")
                running.append((subprocess.Popen(c, env=env, stdout=clog,
                                                 stderr=subprocess.STDOUT),
                                time.monotonic(), clog, c, out))
            started += [(p, log, c) for p, _, log, c, _ in running]
            results = []
            for proc, t0, clog, client, out in running:
                cpu = self.reap(proc, t0, self.args.timeout)
                clog.seek(0)
                stdout = clog.read()
                if proc.returncode != 0:
                    raise RuntimeError("%s: client failed (%d): %s\n%s" %
                                       (label, proc.returncode, shlex.join(client), stdout))
                if parse:
                    results.append(parse(stdout))
                else:
                    with open(out) as f:
                        results.append(json.load(f))
                results[-1] = (results[-1], cpu)
            for i, (srv, slog, server) in enumerate(started[:len(clients)]):  # visited
                cpu = self.reap(srv, born[i], self.args.timeout)
                if srv.returncode != 0:
                    raise RuntimeError("%s: server failed (%d): %s\n%s" %
                                       (label, srv.returncode, shlex.join(server),
                                        self.tail(slog.name)))
                results[i] = self.with_cpu(results[i][0], cpu, results[i][1])
            return results
        finally:
            # Whatever failed or timed out, no server or client outlives the run.
            for proc, slog, _ in started:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if slog:
                    slog.close()

    def run_one(self, cmd, label=""):
        return self.median_of_rounds(lambda i: self.run_one_once(cmd, label, i == 0))

    def run_one_once(self, cmd, label, record):
        out = os.path.join(self.work, "result-%d.json" % self.next_port())
        cmd = [a.replace("@JSON@", out) for a in cmd]
        if record:
            self.commands.append((label, {}, None, cmd))
        cp = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                            timeout=self.args.timeout)
        if cp.returncode != 0:
            raise RuntimeError("%s: failed (%d): %s\n%s%s" %
                               (label, cp.returncode, shlex.join(cmd), cp.stdout, cp.stderr))
        with open(out) as f:
            return json.load(f)

    @staticmethod
    def tail(path, n=20):
        try:
            with open(path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def verbs_cmds(self, tool, size, args=(), server_only=(), seconds=None, devs=("pm0", "pm1")):
        """Server and client command lines of one size of one tool; `args`
        go to both sides (the server checks that they match), `server_only`
        to the server alone; `seconds`: a run of that length instead of a
        count."""
        iters = self.args.lat_iters if tool.endswith("_lat") else self.args.bw_iters
        if tool.endswith("_bw") and not self.args.short:
            # At least ~1.5 GB per run at large sizes, or a run lasts a
            # fraction of a second and one scheduler hiccup decides it.
            iters = max(iters, min(50000, int(1.5e9) // size))
        exe = os.path.join(self.perf, tool)
        count = ["-D", str(seconds)] if seconds else ["-n", str(iters)]
        common = ["-x", "1", "-p", "@PORT@", "-s", str(size)] + count + list(args)
        server = [self.sroce, "exec", "--", exe, "-d", devs[0]] + common + list(server_only)
        client = ([self.sroce, "exec", "--", exe, "-d", devs[1]] + common +
                  ["--out_json", "--out_json_file=@JSON@", "127.0.0.1"])
        return server, client

    def verbs_job(self, tool, size, args=(), server_only=(), env=None):
        """One run of one size of one tool, as fn(record) -> JSON."""
        server, client = self.verbs_cmds(tool, size, args, server_only)
        label = "%s %s" % (tool, " ".join(args))
        return lambda record: self.run_pair_once(server, client, env, label, record)

    def shared_job(self, tool, size, args, devs, idle=False):
        """Runs of one tool at the same time, one per (server device,
        client device) of `devs` — several on one device pair share it
        through the agent's slots — and with `idle` one more process on
        each of pm0 and pm1 that holds it open and does nothing; as
        fn(record) -> JSON whose bandwidth is the runs' sum."""
        seconds = self.args.peer_seconds if tool.endswith("_bw") else None
        pairs = [self.verbs_cmds(tool, size, args, (), seconds, d) for d in devs]
        # A server no client visits holds its device; one on each.
        server = pairs[0][0]
        holders = [server, [a if a != "pm0" else "pm1" for a in server]] if idle else []
        label = "%s %s, on %s%s" % (tool, " ".join(args),
                                    " and ".join("%s/%s" % d for d in devs),
                                    ", one idle process per device" if idle else "")

        def run(record):
            res = [r["results"][0] for r in
                   self.run_pairs_once(pairs, None, label, record, idle=holders)]
            out = dict(res[0])
            for key in ("bw_avg_MBps", "bw_peak_MBps", "msg_rate_Mpps"):
                if key in out:
                    out[key] = sum(r[key] for r in res)
            return {"results": [out]}
        return run

    def perftest_job(self, tool, size, args=(), env=None):
        """One run of one of Debian's perftest programs, exchanging QP
        numbers over its own TCP connection (no rdma_cm), as fn(record) ->
        its report table's figures."""
        lat = tool.endswith("_lat")
        if lat:
            iters = self.args.lat_iters
        else:
            iters = self.args.bw_iters if self.args.short else max(self.args.bw_iters, 20000)
        common = ["-d", "@DEV@", "-x", "1", "-p", "@PORT@", "-s", str(size), "-n", str(iters)]
        common += list(args)
        ex = [self.sroce, "exec", "--", tool]
        server = ex + [a.replace("@DEV@", "pm0") for a in common]
        client = ex + [a.replace("@DEV@", "pm1") for a in common] + ["127.0.0.1"]
        label = " ".join(["perftest", tool] + list(args))
        parse = self.perftest_table if lat else self.perftest_bw_table
        return lambda record: {"results": [self.run_pair_once(server, client, env, label, record,
                                                              parse=parse)]}

    @staticmethod
    def perftest_bw_table(text):
        """perftest's bandwidth report row as the matrix's keys."""
        on = False
        for line in text.splitlines():
            cols = line.split()
            if "#bytes" in cols and "MsgRate[Mpps]" in cols:
                on = True
            elif on and len(cols) >= 5 and cols[0].isdigit():
                return {"bw_peak_MBps": float(cols[2]), "bw_avg_MBps": float(cols[3]),
                        "msg_rate_Mpps": float(cols[4])}
        raise RuntimeError("no bandwidth table in perftest's output:\n" + text)

    @staticmethod
    def perftest_table(text):
        """perftest's latency table row as {column: value} (its --out_json
        file is not JSON)."""
        head = None
        for line in text.splitlines():
            cols = line.split()
            if "t_typical[usec]" in cols:
                head = [c.replace("[usec]", "") for c in cols]
            elif head and cols and cols[0].isdigit() and len(cols) >= len(head) - 2:
                # The two percentile headings are two words each, so only the
                # leading columns line up: those are the ones read.
                row = dict(zip(head, cols))
                return {k: float(row[k]) for k in ("t_min", "t_max", "t_typical", "t_avg")}
        raise RuntimeError("no latency table in perftest's output:\n" + text)

    def verbs_pair(self, tool, size, args=(), server_only=(), env=None):
        """The median of --rounds runs of verbs_job."""
        return self.median_of_rounds(
            lambda i: self.verbs_job(tool, size, args, server_only, env)(i == 0))["results"][0]

    def verbs_set(self, tool, size, named_args):
        """Several variants of one size, interleaved; {name: result}."""
        runs = self.interleaved([(name, self.verbs_job(tool, size, args))
                                 for name, args in named_args])
        return {name: run["results"][0] for name, run in runs.items()}

    # ------------------------------------------------------------- matrix
    def sroce_matrix(self):
        # Methods are compared with each other: measure them round-robin.
        for size in self.args.sizes:
            for kind in ("lat", "bw"):
                res = self.verbs_set("ib_write_commit_" + kind, size,
                                     [(m, ["--method", m]) for m in METHODS])
                for method in METHODS:
                    self.results[kind].setdefault(method, {})[size] = res[method]
                    self.progress(kind, method, size, res[method])
        # The target CPU answering from a blocked thread rather than a
        # spinning one: GPSPM as a server that does other work would run it.
        variants = [
            ("write-send (event server)", ["--method", "write-send"], ["-e"]),
            ("native ordered", ["--method", "native", "--ordered"], []),
            ("native imm", ["--method", "native", "--imm"], []),
            ("write-flush ordered", ["--method", "write-flush", "--ordered"], []),
        ]
        for name, cargs, sargs in variants:
            for kind in ("lat", "bw"):
                r = self.verbs_pair("ib_write_commit_" + kind, 64, cargs, sargs)
                self.results[kind].setdefault(name, {})[64] = r
                self.progress(kind, name, 64, r)
        # Message rate with operations posted 16 at a time, as an application
        # streaming commits would post them.
        res = self.verbs_set("ib_write_commit_bw", 64,
                             [("%s (post list 16)" % m, ["--method", m, "-l", "16"])
                              for m in ("write", "native", "write-flush")])
        for name, r in res.items():
            self.results["bw"].setdefault(name, {})[64] = r
            self.progress("bw", name, 64, r)
        self.small_latency_matrix()
        self.loss_matrix()
        self.shared_matrix()
        for size in (64, 65536) if not self.args.short else (64,):
            r = self.verbs_pair("ib_write_commit_bw", size, ["--method", "native"],
                                ["--target-mem", "file:" + os.path.join(self.work, "target")])
            self.results["bw"].setdefault("native (file target)", {})[size] = r
            self.progress("bw", "native (file target)", size, r)

    def small_latency_matrix(self):
        """The small-message round trips held to the busy-polling UDP
        ping-pong, measured round-robin with it: the same figures minutes
        apart differed by a fifth on this shared host.  The default mode,
        every thread busy-polling, and the program users run first (Debian's
        perftest, both sides spinning on memory rather than on a CQ)."""
        sl = os.path.join(self.bench, "socket_loopback")
        udp = [sl, "-P", "udp", "-m", "lat", "-s", str(UDP_SMALL), "-n",
               str(self.args.peer_iters), "--busy", "--out_json_file", "@JSON@"]
        lat = "ib_write_commit_lat"
        # (series, its table, its size, fn(record) -> JSON)
        jobs = [("udp lat busy", "peers", UDP_SMALL,
                 lambda record: self.run_one_once(udp, "udp lat busy", record)),
                (NEXT_TO_UDP % "write", "lat", 64,
                 self.verbs_job(lat, 64, ["--method", "write"])),
                (NEXT_TO_UDP % "native", "lat", 64,
                 self.verbs_job(lat, 64, ["--method", "native"])),
                ("write (busy poll)", "lat", 64,
                 self.verbs_job(lat, 64, ["--method", "write"], env={"SROCE_BUSY_POLL": "1"}))]
        if shutil.which("ib_write_lat"):
            for tool in ("ib_write_lat", "ib_send_lat", "ib_read_lat"):
                jobs.append(("perftest " + tool, "lat", 2, self.perftest_job(tool, 2)))
        else:
            print("perftest's ib_write_lat not installed: skipped")
        runs = self.interleaved([(name, fn) for name, _, _, fn in jobs])
        for name, table, size, _ in jobs:
            r = runs[name]["results"][0]
            self.results[table].setdefault(name, {})[size] = r
            self.progress("lat", name, size, r)

    # ------------------------------------------------- third-party programs
    def session_cpu(self, sid):
        """CPU seconds used so far by the processes of session `sid` and the
        children they waited for: {pid: seconds}."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # field 6, the session
                out[int(pid)] = sum(int(x) for x in fields[11:15]) / tick
        return out

    def served_job(self, name, server, client, parse, env=None, retry=None):
        """A server that serves until killed (qperf's), one client run
        against it, as fn(record) -> the client's figures with the CPU both
        used.  The server's processes (qperf forks one per test) are sampled
        while the client runs.  A client whose output contains `retry`
        (qperf 0.4.11's rdma_cm port race) is run again, up to five times."""
        def run(record):
            e = dict(self.env)
            e.update(env or {})
            for attempt in range(5):
                port = self.next_port()
                srv_cmd = [a.replace("@PORT@", str(port)) for a in server]
                cli_cmd = [a.replace("@PORT@", str(port)) for a in client]
                if record and attempt == 0:
                    self.commands.append((name, env or {}, srv_cmd, cli_cmd))
                slog = open(os.path.join(self.work, "server-%d.log" % port), "w")
                srv = subprocess.Popen(srv_cmd, env=e, stdout=slog, stderr=subprocess.STDOUT,
                                       start_new_session=True)
                try:
                    if not self.wait_listen(port, srv):
                        raise RuntimeError("%s: server did not listen: %s\n%s" %
                                           (name, shlex.join(srv_cmd), self.tail(slog.name)))
                    clog = open(os.path.join(self.work, "client-%d.log" % port), "w+")
                    t0 = time.monotonic()
                    cli = subprocess.Popen(cli_cmd, env=e, stdout=clog, stderr=subprocess.STDOUT)
                    used = {}
                    cpu = self.reap(cli, t0, self.args.timeout,
                                    lambda: used.update(self.session_cpu(srv.pid)))
                    time.sleep(0.1)
                    used.update(self.session_cpu(srv.pid))
                    wall = time.monotonic() - t0
                    clog.seek(0)
                    out = clog.read()
                    clog.close()
                finally:
                    os.killpg(srv.pid, 9)
                    srv.wait()
                    slog.close()
                if cli.returncode == 0:
                    return {"results": [self.with_cpu(parse(out), 100.0 * sum(used.values()) / wall,
                                                      cpu)]}
                if not retry or retry not in out:
                    raise RuntimeError("%s: client failed (%d): %s\n%s" %
                                       (name, cli.returncode, shlex.join(cli_cmd), out))
            raise RuntimeError("%s: refused five times: %s" % (name, shlex.join(cli_cmd)))
        return run

    @staticmethod
    def qperf_figure(text):
        """qperf's "latency = 12.3 us" (or ns, ms) in microseconds."""
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "sec": 1e6}
        for line in text.splitlines():
            cols = line.split()
            if len(cols) >= 4 and cols[0] == "latency" and cols[1] == "=":
                us = float(cols[2]) * scale[cols[3]]
                return {"t_typical": us, "t_avg": us}
        raise RuntimeError("no latency in qperf's output:\n" + text)

    @staticmethod
    def fi_pingpong_figure(text):
        """The usec/xfer of fi_pingpong's last row (an average)."""
        rows = [line.split() for line in text.splitlines()]
        rows = [r for r in rows if len(r) >= 8 and r[2].startswith("=")]
        if not rows:
            raise RuntimeError("no result in fi_pingpong's output:\n" + text)
        us = float(rows[-1][6])
        return {"t_typical": us, "t_avg": us}

    @staticmethod
    def ucx_figure(text):
        """ucx_perftest -f's last row: its median and average latency."""
        rows = [line.split() for line in text.splitlines()]
        rows = [r for r in rows if len(r) >= 8 and r[0].isdigit()]
        if not rows:
            raise RuntimeError("no result in ucx_perftest's output:\n" + text)
        return {"t_typical": float(rows[-1][1]), "t_avg": float(rows[-1][2])}

    def netns_job(self, label, server, client, parse):
        """A server and a client over two sroce devices on a veth pair in a
        network namespace of their own (netns_pair.sh), for programs that
        ignore devices on loopback interfaces; as fn(record) -> parse(the
        client's output) with both processes' CPU."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_pair.sh")

        def run(record):
            port = str(self.next_port())
            cmd = ["unshare", "--net", "--", "bash", script, self.sroce, self.work, port]
            cmd += [a.replace("@PORT@", port) for a in server] + ["--"]
            cmd += [a.replace("@PORT@", port) for a in client]
            if record:
                # As the other commands are listed: a fresh port, any
                # scratch directory.
                self.commands.append((label, {}, None, [
                    "unshare", "--net", "--", "bash", "tools/perf/netns_pair.sh", self.sroce,
                    "$(mktemp -d)", "@PORT@"] + list(server) + ["--"] + list(client)))
            cp = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                timeout=self.args.timeout)
            if cp.returncode != 0:
                raise RuntimeError("%s: failed (%d): %s\n%s%s" %
                                   (label, cp.returncode, shlex.join(cmd), cp.stdout, cp.stderr))
            cpu = [line.split() for line in cp.stdout.splitlines() if line.startswith("cpu ")]
            r = parse(cp.stdout)
            if cpu:
                self.with_cpu(r, float(cpu[-1][1]), float(cpu[-1][2]))
            return {"results": [r]}
        return run

    def clients_matrix(self):
        """What the programs users run first see, with their own defaults
        and options, each held to the UDP ping-pong measured round-robin
        with it: qperf's RC latencies over rdma_cm, polling and with
        completion events; fi_pingpong over pmof; UCP's tag_lat over
        rc_verbs.  (perftest's latencies are in small_latency_matrix.)
        Then 64 KiB RDMA WRITE bandwidth from perftest at its default depth
        and at 16 in flight, and at loss with selective repeat agreed in the
        packets (perftest has no rdma_cm here)."""
        self.start_agent()
        sl = os.path.join(self.bench, "socket_loopback")
        udp = [sl, "-P", "udp", "-m", "lat", "-s", str(UDP_SMALL), "-n",
               str(self.args.peer_iters), "--busy", "--out_json_file", "@JSON@"]
        ex = [self.sroce, "exec", "--"]
        a0 = self.args.addr[0]
        secs = "1" if self.args.short else "3"
        lat = [("udp lat busy (clients series)",
                lambda record: self.run_one_once(udp, "udp lat busy", record))]
        if shutil.which("qperf"):
            for test in ("rc_lat", "rc_rdma_write_lat"):
                for mode, opts in (("polling", ["-cp", "1", "-sp", "1"]), ("events", [])):
                    name = "qperf %s (%s)" % (test, mode)
                    lat.append((name, self.served_job(
                        name, ex + ["qperf", "-lp", "@PORT@"],
                        ex + ["qperf", "-lp", "@PORT@", "-cm1", "-t", secs] + opts + [a0, test],
                        self.qperf_figure, retry="Event rejected")))
        else:
            print("qperf not installed: skipped")
        iters = str(self.args.lat_iters * 4)
        if shutil.which("fi_pingpong"):
            fi = ["fi_pingpong", "-p", "pmof", "-e", "msg", "-I", iters, "-S", "64"]
            lat.append(("fi_pingpong pmof", lambda record: {"results": [self.run_pair_once(
                ex + fi + ["-B", "@PORT@"], ex + fi + ["-P", "@PORT@", "-d", "pm1", a0], None,
                "fi_pingpong -p pmof", record, parse=self.fi_pingpong_figure)]}))
            if os.geteuid() == 0 and shutil.which("unshare"):
                # libfabric's verbs provider skips devices on lo: a veth pair.
                # It takes the device the route to the server leaves from,
                # which for an address of this host is the server's own: both
                # processes share it (pmof's client is given its own, -d).
                fv = ["fi_pingpong", "-p", "verbs", "-e", "msg", "-I", iters, "-S", "64"]
                lat.append(("fi_pingpong verbs", self.netns_job(
                    "fi_pingpong -p verbs", fv + ["-B", "@PORT@"], fv + ["-P", "@PORT@", "@S@"],
                    self.fi_pingpong_figure)))
            else:
                print("fi_pingpong -p verbs needs a network namespace (root): skipped")
        if shutil.which("ucx_perftest"):
            def ucx(dev):
                return {"UCX_TLS": "rc_verbs,ud_verbs:aux", "UCX_NET_DEVICES": dev + ":1"}
            ucx_srv = ["env"] + ["%s=%s" % kv for kv in ucx("pm0").items()] + ex + [
                "ucx_perftest", "-p", "@PORT@"]
            ucx_cli = ["env"] + ["%s=%s" % kv for kv in ucx("pm1").items()] + ex + [
                "ucx_perftest", a0, "-p", "@PORT@", "-t", "tag_lat", "-s", "8", "-n", iters,
                "-w", "100", "-f"]
            lat.append(("ucx_perftest tag_lat", lambda record: {"results": [self.run_pair_once(
                ucx_srv, ucx_cli, None, "ucx_perftest -t tag_lat", record,
                parse=self.ucx_figure)]}))
        for name, run in self.interleaved(lat).items():
            r = run["results"][0]
            table = "peers" if name.startswith("udp") else "lat"
            size = UDP_SMALL if name.startswith("udp") else 8 if "ucx" in name else (
                64 if "pingpong" in name else 1)
            self.results[table].setdefault(name, {})[size] = r
            self.progress("lat", name, size, r)
        if not shutil.which("ib_write_bw"):
            print("perftest's ib_write_bw not installed: skipped")
            return
        bw = [("perftest ib_write_bw", self.perftest_job("ib_write_bw", 65536)),
              ("perftest ib_write_bw (16 in flight)",
               self.perftest_job("ib_write_bw", 65536, ["-t", str(FI_DEPTH)]))]
        for label, p, _, _ in self.LOSSES:
            bw.append(("perftest ib_write_bw, %s loss" % label,
                       self.perftest_job("ib_write_bw", 65536,
                                         env={"SROCE_FAULT": "drop=" + p})))
        for name, run in self.interleaved(bw).items():
            r = run["results"][0]
            self.results["bw"].setdefault(name, {})[65536] = r
            self.progress("bw", name, 65536, r)

    def peer_matrix(self):
        sl = os.path.join(self.bench, "socket_loopback")
        peers = self.results["peers"]
        iters = str(self.args.peer_iters)
        for size in self.args.sizes:
            for proto in ("udp", "tcp"):
                if proto == "udp" and size > 65000:
                    continue
                r = self.run_one([sl, "-P", proto, "-m", "lat", "-s", str(size), "-n", iters,
                                  "--out_json_file", "@JSON@"], "%s lat" % proto)
                peers.setdefault(proto + " lat", {})[size] = r["results"][0]
                self.progress("lat", proto, size, r["results"][0])
        # Ceilings for the 64 KiB WRITE: one datagram per RoCE packet.
        for proto, size in (("udp", 4096 + ROCE_MIDDLE_OVERHEAD), ("tcp", 65536)):
            r = self.run_one([sl, "-P", proto, "-m", "bw", "-s", str(size), "-D",
                              str(self.args.peer_seconds), "--out_json_file", "@JSON@"],
                             "%s bw" % proto)
            peers.setdefault(proto + " bw", {})[size] = r["results"][0]
            self.progress("bw", proto, size, r["results"][0])
        # Small-message ping-pong at the size of a 64-byte WRITE ONLY datagram,
        # blocking (busy: small_latency_matrix).
        r = self.run_one([sl, "-P", "udp", "-m", "lat", "-s", str(UDP_SMALL), "-n", iters,
                          "--out_json_file", "@JSON@"], "udp lat")
        peers.setdefault("udp lat", {})[UDP_SMALL] = r["results"][0]
        self.progress("lat", "udp lat", UDP_SMALL, r["results"][0])
        fi = os.path.join(self.bench, "fi_commit_bench")
        if not os.path.exists(fi):
            print("fi_commit_bench not built (libfabric-dev missing): libfabric peer skipped")
            return
        pmof = os.path.exists(os.path.join(self.build, "libfabric-glue", "libpmof-fi.so"))
        if pmof:
            self.start_agent()
        else:
            print("libpmof-fi.so not built: the pmof provider is skipped")
        # tcp and pmof measured round-robin, size by size: their ratio is a
        # target.
        for size in self.args.sizes:
            for kind in ("lat", "bw"):
                iters = self.args.lat_iters if kind == "lat" else self.args.bw_iters
                common = ["-m", kind, "-s", str(size), "-n", str(iters), "-P", "@PORT@"]
                jobs = [("tcp", self.fi_job([fi], ["-p", "tcp"] + common, "127.0.0.1", []))]
                if kind == "bw":
                    # The same depth as fi_commit_bench's (16): at 128 in
                    # flight, ib_write_commit_bw's 256 slots (up to 64 MiB a
                    # side) no longer fit in cache, while fi_commit_bench
                    # writes one buffer over and over.
                    jobs.append(("sroce", self.verbs_job("ib_write_commit_bw", size,
                                                         ["--method", "native", "-t",
                                                          str(FI_DEPTH)])))
                if pmof:
                    ex = [self.sroce, "exec", "--"]
                    jobs.append(("pmof", self.fi_job(ex + [fi], ["-p", "pmof"] + common,
                                                     self.args.addr[0],
                                                     ["-a", self.args.addr[0]])))
                for prov, r in self.interleaved(jobs).items():
                    if prov == "sroce":
                        self.results["bw"].setdefault(NATIVE_FI_DEPTH, {})[size] = r["results"][0]
                        self.progress("bw", NATIVE_FI_DEPTH, size, r["results"][0])
                        continue
                    name = "libfabric %s commit %s" % (prov, kind)
                    peers.setdefault(name, {})[size] = r["results"][0]
                    self.progress(kind, "libfabric %s commit" % prov, size, r["results"][0])

    def fi_job(self, fi, common, host, server_only):
        """One fi_commit_bench pair as fn(record) -> JSON; `fi` is the
        program with whatever runs it."""
        prov = common[1]
        server = fi + common + server_only
        client = fi + common + ["--out_json_file", "@JSON@", host]
        label = "fi_commit_bench %s %s" % (prov, common[3])
        return lambda record: self.run_pair_once(server, client, None, label, record)

    def progress(self, kind, name, size, r):
        if kind == "lat":
            print("  lat %-28s %8d B  t_typical %9.2f us  t_avg %9.2f us" %
                  (name, size, r["t_typical"], r["t_avg"]), flush=True)
        else:
            print("  bw  %-28s %8d B  %10.2f MB/s  %8.4f Mpps" %
                  (name, size, r["bw_avg_MBps"], r["msg_rate_Mpps"]), flush=True)

    def shared_matrix(self):
        """Several processes on one device: two native-commit streams on one
        device pair against two on two pairs (the same processes competing
        for the same CPUs, only the device shared or not), and the 64 B
        round trip with one more process on each device against none;
        interleaved.  The streams keep FI_DEPTH writes in flight."""
        one, two = ("pm0", "pm1"), ("pm2", "pm3")
        bw_args = ["--method", "native", "-t", str(FI_DEPTH)]
        lat_args = ["--method", "native"]
        for kind, size, jobs in (
                ("bw", 65536, [(SHARED_ALONE, self.shared_job("ib_write_commit_bw", 65536,
                                                              bw_args, [one])),
                               (SHARED_APART, self.shared_job("ib_write_commit_bw", 65536,
                                                              bw_args, [one, two])),
                               (SHARED_BW, self.shared_job("ib_write_commit_bw", 65536,
                                                           bw_args, [one, one]))]),
                ("lat", 64, [(SHARED_ALONE, self.shared_job("ib_write_commit_lat", 64,
                                                            lat_args, [one])),
                             (SHARED_LAT, self.shared_job("ib_write_commit_lat", 64, lat_args,
                                                          [one], idle=True))])):
            for n, run in self.interleaved(jobs).items():
                r = run["results"][0]
                self.results[kind].setdefault(n, {})[size] = r
                self.progress(kind, n, size, r)

    # (label, drop probability, whether go-back-N is measured too: only
    # where a run finishes in seconds, bandwidth kept against loss-free).
    LOSSES = (("0.1 %", "0.001", True, 0.8), ("1 %", "0.01", False, 0.5))

    def loss_matrix(self):
        """64 KiB RDMA WRITE streams while both sides drop a share of what
        they receive (SROCE_FAULT): with selective repeat, which the tool's
        capability exchange agrees on, and with IBTA's go-back-N
        (SROCE_SELECTIVE_REPEAT=0), interleaved with the loss-free run."""
        size = 65536
        jobs = [("write", self.verbs_job("ib_write_commit_bw", size, ["--method", "write"]))]
        for label, p, gbn, _ in self.LOSSES:
            jobs.append(("write, %s loss" % label,
                         self.verbs_job("ib_write_commit_bw", size, ["--method", "write"],
                                        env={"SROCE_FAULT": "drop=" + p})))
            if gbn:
                jobs.append(("write, %s loss, go-back-N" % label,
                             self.verbs_job("ib_write_commit_bw", size, ["--method", "write"],
                                            env={"SROCE_FAULT": "drop=" + p,
                                                 "SROCE_SELECTIVE_REPEAT": "0"})))
        for name, run in self.interleaved(jobs).items():
            r = run["results"][0]
            self.results["bw"].setdefault(name if name != "write" else "write (loss series)",
                                          {})[size] = r
            self.progress("bw", name, size, r)

    # ------------------------------------------------------------- report
    def ratios(self):
        lat, bw, peers = self.results["lat"], self.results["bw"], self.results["peers"]

        def get(table, name, size, key):
            try:
                return table[name][size][key]
            except KeyError:
                return None

        small = UDP_SMALL
        rows = []

        def add(what, num, den, target, sense, how):
            if num is None or den is None or den == 0:
                rows.append((what, None, target, sense, None, how))
                return
            r = num / den
            met = r <= target if sense == "<=" else r >= target
            rows.append((what, r, target, sense, met, how))

        add("native commit 64 B latency / write+FLUSH", get(lat, "native", 64, "t_typical"),
            get(lat, "write-flush", 64, "t_typical"), 0.9, "<=", "t_typical, RTT")
        add("native commit 64 B latency / write+SEND (spinning target CPU)",
            get(lat, "native", 64, "t_typical"), get(lat, "write-send", 64, "t_typical"), 0.6,
            "<=", "t_typical, RTT")
        add("native commit 64 B latency / write+SEND (target CPU woken by an event)",
            get(lat, "native", 64, "t_typical"),
            get(lat, "write-send (event server)", 64, "t_typical"), 0.6, "<=", "t_typical, RTT")
        add("native commit 64 B message rate / write+FLUSH", get(bw, "native", 64, "msg_rate_Mpps"),
            get(bw, "write-flush", 64, "msg_rate_Mpps"), 1.35, ">=", "MsgRate")
        add("native commit 64 B message rate / write+FLUSH, 16 per post",
            get(bw, "native (post list 16)", 64, "msg_rate_Mpps"),
            get(bw, "write-flush (post list 16)", 64, "msg_rate_Mpps"), 1.35, ">=",
            "MsgRate, -l 16")
        add("64 KiB RDMA WRITE bandwidth / raw UDP (%d B datagrams)" %
            (4096 + ROCE_MIDDLE_OVERHEAD), get(bw, "write", 65536, "bw_avg_MBps"),
            get(peers, "udp bw", 4096 + ROCE_MIDDLE_OVERHEAD, "bw_avg_MBps"), 0.6, ">=",
            "BW average")
        add("64 KiB write-commit to DRAM / RDMA WRITE bandwidth",
            get(bw, "native", 65536, "bw_avg_MBps"), get(bw, "write", 65536, "bw_avg_MBps"), 0.9,
            ">=", "BW average")
        add("64 B RDMA WRITE latency / UDP ping-pong (%d B, blocking receives)" % small,
            get(lat, "write", 64, "t_typical"), get(peers, "udp lat", small, "t_typical"), 1.5,
            "<=", "t_typical, RTT; sroce default mode")
        add("64 B RDMA WRITE latency / UDP ping-pong (%d B, busy-polling receives)" % small,
            get(lat, NEXT_TO_UDP % "write", 64, "t_typical"),
            get(peers, "udp lat busy", small, "t_typical"),
            1.5, "<=", "t_typical, RTT; sroce default mode: the client spins on its CQ and "
            "receives in its own thread, the target's progress thread polls after traffic")
        add("64 B RDMA WRITE latency, SROCE_BUSY_POLL=1 / UDP ping-pong (%d B, busy)" % small,
            get(lat, "write (busy poll)", 64, "t_typical"),
            get(peers, "udp lat busy", small, "t_typical"), 1.5, "<=",
            "t_typical, RTT; every progress thread spinning too")
        add("native commit 64 B latency / UDP ping-pong (%d B, busy-polling receives)" % small,
            get(lat, NEXT_TO_UDP % "native", 64, "t_typical"),
            get(peers, "udp lat busy", small, "t_typical"),
            1.2, "<=", "t_typical, RTT; sroce default mode")
        for tool, how in (("ib_write_lat", "both sides spinning on memory; it reports half "
                           "the round trip"),
                          ("ib_send_lat", "both sides spinning on the CQ; it reports half the "
                           "round trip"),
                          ("ib_read_lat", "the client spinning on the CQ; a READ's round trip")):
            add("perftest %s -s 2 / UDP ping-pong (%d B, busy-polling receives)" % (tool, small),
                get(lat, "perftest " + tool, 2, "t_typical"),
                get(peers, "udp lat busy", small, "t_typical"), 1.5, "<=",
                "t_typical; Debian's perftest, no rdma_cm, %s" % how)
            add("perftest %s -s 2: t_avg / t_typical" % tool,
                get(lat, "perftest " + tool, 2, "t_avg"),
                get(lat, "perftest " + tool, 2, "t_typical"), 2.0, "<=",
                "how far the average strays from the typical round trip")
        busy_c = get(peers, "udp lat busy (clients series)", small, "t_typical")
        for test in ("rc_lat", "rc_rdma_write_lat"):
            add("qperf -cm1 -cp 1 %s / UDP ping-pong (%d B, busy-polling receives)" % (test, small),
                get(lat, "qperf %s (polling)" % test, 1, "t_typical"), busy_c, 1.5, "<=",
                "qperf's latency (half the round trip), polling the CQ")
            add("qperf -cm1 %s / UDP ping-pong (%d B, blocking receives)" % (test, small),
                get(lat, "qperf %s (events)" % test, 1, "t_typical"),
                get(peers, "udp lat", small, "t_typical"), 1.5, "<=",
                "qperf's latency (half the round trip), its default: completion events")
        add("fi_pingpong -p pmof 64 B / UDP ping-pong (%d B, busy-polling receives)" % small,
            get(lat, "fi_pingpong pmof", 64, "t_typical"), busy_c, 1.5, "<=",
            "usec/xfer (half the round trip), FI_EP_MSG over rdma_cm")
        add("fi_pingpong -p verbs 64 B / UDP ping-pong (%d B, busy-polling receives)" % small,
            get(lat, "fi_pingpong verbs", 64, "t_typical"), busy_c, 1.5, "<=",
            "usec/xfer (half the round trip), libfabric's verbs provider, FI_EP_MSG, "
            "on a veth pair in a namespace of its own")
        add("ucx_perftest -t tag_lat 8 B (rc_verbs) / UDP ping-pong (%d B, busy)" % small,
            get(lat, "ucx_perftest tag_lat", 8, "t_typical"), busy_c, 1.5, "<=",
            "UCP's median latency (half the round trip)")
        tcp_bw = get(peers, "libfabric tcp commit bw", 65536, "bw_avg_MBps")
        add("perftest ib_write_bw -s 65536 (default depth) / libfabric tcp FI_COMMIT_COMPLETE",
            get(bw, "perftest ib_write_bw", 65536, "bw_avg_MBps"), tcp_bw, 1.0, ">=",
            "BW average; perftest's 128 in flight, fi_commit_bench's %d" % FI_DEPTH)
        add("native commit 64 KiB bandwidth (128 in flight) / libfabric tcp FI_COMMIT_COMPLETE",
            get(bw, "native", 65536, "bw_avg_MBps"), tcp_bw, 1.0, ">=",
            "BW average; ib_write_commit_bw's default depth, fi_commit_bench's %d" % FI_DEPTH)
        add("perftest ib_write_bw -s 65536, 128 in flight / 16",
            get(bw, "perftest ib_write_bw", 65536, "bw_avg_MBps"),
            get(bw, "perftest ib_write_bw (16 in flight)", 65536, "bw_avg_MBps"), 1.0, ">=",
            "BW average; more in flight must never be slower")
        add("native commit 64 KiB bandwidth, 128 in flight / 16",
            get(bw, "native", 65536, "bw_avg_MBps"),
            get(bw, NATIVE_FI_DEPTH, 65536, "bw_avg_MBps"), 1.0, ">=",
            "BW average; ib_write_commit_bw -t 128 / -t 16")
        for label, _, _, target in self.LOSSES:
            add("perftest ib_write_bw -s 65536 (no rdma_cm), %s loss / loss-free" % label,
                get(bw, "perftest ib_write_bw, %s loss" % label, 65536, "bw_avg_MBps"),
                get(bw, "perftest ib_write_bw", 65536, "bw_avg_MBps"), target, ">=",
                "BW average; selective repeat agreed in the packets (wire-protocol.md §3.3.1)")
        for size, name in ((65536, "64 KiB"), (1048576, "1 MiB")):
            add("native commit %s bandwidth / libfabric tcp FI_COMMIT_COMPLETE" % name,
                get(bw, NATIVE_FI_DEPTH, size, "bw_avg_MBps"),
                get(peers, "libfabric tcp commit bw", size, "bw_avg_MBps"), 1.0, ">=",
                "BW average; %d writes in flight on both (fi_commit_bench's default)" % FI_DEPTH)
        add("native commit bandwidth, 1 MiB / 64 KiB", get(bw, "native", 1048576, "bw_avg_MBps"),
            get(bw, "native", 65536, "bw_avg_MBps"), 1.0, ">=", "BW average")
        add("native commit 1 MiB latency / libfabric tcp FI_COMMIT_COMPLETE",
            get(lat, "native", 1048576, "t_typical"),
            get(peers, "libfabric tcp commit lat", 1048576, "t_typical"), 1.0, "<=",
            "t_typical, RTT")
        add("native commit 64 B latency / libfabric tcp FI_COMMIT_COMPLETE",
            get(lat, "native", 64, "t_typical"),
            get(peers, "libfabric tcp commit lat", 64, "t_typical"), 1.0, "<=", "t_typical, RTT")
        # Go-back-N's figures are in the bandwidth table: it has no target.
        for label, _, _, target in self.LOSSES:
            add("64 KiB RDMA WRITE bandwidth, %s loss / loss-free" % label,
                get(bw, "write, %s loss" % label, 65536, "bw_avg_MBps"),
                get(bw, "write (loss series)", 65536, "bw_avg_MBps"), target, ">=",
                "BW average; both sides drop at random (SROCE_FAULT), selective repeat")
        add("native commit 64 KiB bandwidth, 2 streams on one device pair / on two",
            get(bw, SHARED_BW, 65536, "bw_avg_MBps"), get(bw, SHARED_APART, 65536, "bw_avg_MBps"),
            0.9, ">=", "BW average, the two streams' sum, %d writes in flight each" % FI_DEPTH)
        add("native commit 64 B latency, one more process on each device / alone",
            get(lat, SHARED_LAT, 64, "t_typical"), get(lat, SHARED_ALONE, 64, "t_typical"), 1.1,
            "<=", "t_typical, RTT")
        add("libfabric pmof FI_COMMIT_COMPLETE 64 B latency / libfabric tcp",
            get(peers, "libfabric pmof commit lat", 64, "t_typical"),
            get(peers, "libfabric tcp commit lat", 64, "t_typical"), 0.85, "<=",
            "t_typical, RTT; fi_commit_bench -p pmof / -p tcp")
        add("libfabric pmof FI_COMMIT_COMPLETE 64 B latency / native commit (raw verbs)",
            get(peers, "libfabric pmof commit lat", 64, "t_typical"),
            get(lat, "native", 64, "t_typical"), 1.10, "<=",
            "t_typical, RTT; the provider's overhead over ib_write_commit_lat --method native")
        return rows

    def write_report(self):
        out = self.args.out
        os.makedirs(out, exist_ok=True)
        rows = self.ratios()
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"host": self.host_info(), "sizes": self.args.sizes,
                       "results": self.results,
                       "ratios": [{"what": w, "ratio": r, "target": t, "sense": s, "met": m,
                                   "figure": h} for (w, r, t, s, m, h) in rows]},
                      f, indent=1, default=str)
        md = []
        md.append("# Remote persistence on sroce: the benchmark matrix\n")
        md.append("Produced by `tools/perf/perf_matrix.py` (%s mode) on %s.\n" %
                  ("short" if self.args.short else "full", self.host_info()))
        md.append("Two sroce links on `lo` (%s, %s; the shared-device series also %s, %s); "
                  "every figure below comes from the same run, each the median of %d runs of "
                  "its benchmark (the methods of one size measured round-robin, and the 64 B "
                  "round trips held to the busy-polling UDP ping-pong round-robin with it: "
                  "the series `... (next to udp busy)`). " %
                  (tuple(self.addrs) + (self.args.rounds,)) +
                  "Latency is the round trip of one durable write (post to completion at the "
                  "initiator), `t_typical` (median) in microseconds; bandwidth is perftest's "
                  "BW average in MB/s (2^20 bytes) with the tools' default 128 operations in "
                  "flight, posted one at a time, except where a series names its depth: "
                  "libfabric's fi_commit_bench keeps %d in flight, on one buffer, and its "
                  "sroce counterpart (`native (%d in flight)`) keeps as many, so that the "
                  "two are compared at the same depth and both in cache.  Third-party programs "
                  "(perftest, qperf, fi_pingpong, ucx_perftest) are reported as each reports "
                  "itself: perftest's send and write latency, qperf's, fi_pingpong's and "
                  "ucx_perftest's are half the round trip, ib_read_lat's and the UDP "
                  "ping-pong's the whole.  libfabric's verbs provider ignores devices on "
                  "`lo`: its fi_pingpong runs on a veth pair in a network namespace of its "
                  "own, both processes on the server's device, which its route picks.\n" %
                  (FI_DEPTH, FI_DEPTH))
        md.append("## Target ratios\n")
        md.append("| ratio | measured | target | met | figure |")
        md.append("|---|---|---|---|---|")
        for w, r, t, s, m, h in rows:
            md.append("| %s | %s | %s %.2f | %s | %s |" %
                      (w, "n/a" if r is None else "%.2f" % r, s, t,
                       "n/a" if m is None else ("yes" if m else "**no**"), h))
        md.append("")
        for kind, title, key, fmt in (("lat", "Latency, t_typical [us]", "t_typical", "%.2f"),
                                      ("lat", "Latency, t_avg [us]", "t_avg", "%.2f"),
                                      ("lat", "Latency, 99.9% [us]", "p99_9", "%.2f"),
                                      ("bw", "Bandwidth, BW average [MB/s]", "bw_avg_MBps",
                                       "%.1f"),
                                      ("bw", "Message rate [Mpps]", "msg_rate_Mpps", "%.4f")):
            table = self.results[kind]
            names = [n for n in table]
            peer_names = [n for n in self.results["peers"] if kind in n.split()]
            md.append("## %s\n" % title)
            md.append("| size | " + " | ".join(names + peer_names) + " |")
            md.append("|---" * (1 + len(names) + len(peer_names)) + "|")
            sizes = sorted({s for n in names for s in table[n]} |
                           {s for n in peer_names for s in self.results["peers"][n]})
            for size in sizes:
                cells = []
                for n in names:
                    r = table[n].get(size)
                    cells.append(fmt % r[key] if r and key in r else "")
                for n in peer_names:
                    r = self.results["peers"][n].get(size)
                    cells.append(fmt % r[key] if r and key in r else "")
                md.append("| %s | %s |" % (human(size), " | ".join(cells)))
            md.append("")
        md.append("## CPU use of each process [% of one CPU]\n")
        md.append("Each server's and client's user and system time over its life, "
                  "`sroce exec` and the threads of the program included, beside its main "
                  "figure (t_typical in us, or BW average in MB/s): a figure reached by "
                  "starving the other side shows here.\n")
        md.append("| series | size | figure | server | client |")
        md.append("|---|---|---|---|---|")
        for kind, key in (("lat", "t_typical"), ("bw", "bw_avg_MBps")):
            tables = [self.results[kind]] + [{n: v for n, v in self.results["peers"].items()
                                              if kind in n.split()}]
            for table in tables:
                for n, series in table.items():
                    for size, r in sorted(series.items()):
                        if "cpu_client_pct" in r:
                            md.append("| %s | %s | %.2f | %.0f | %.0f |" %
                                      (n, human(size), r[key], r["cpu_server_pct"],
                                       r["cpu_client_pct"]))
        md.append("")
        md.append("![latency and bandwidth against size](results.png)\n")
        md.append("## Commands\n")
        md.append("Regenerate everything: `/usr/bin/python3 tools/perf/perf_matrix.py --build "
                  "build --out docs/performance`. Each measurement, in order "
                  "(`SROCE_CONFIG` names a file with the two links; `@PORT@` is a fresh TCP "
                  "port):\n")
        md.append("```sh")
        for label, env, server, client in self.commands:
            envs = "".join("%s=%s " % kv for kv in env.items())
            if server:
                md.append(envs + shlex.join(self.short_paths(server)) + " &")
            if client:
                md.append(envs + shlex.join(self.short_paths(client)))
        md.append("```")
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        self.plot(os.path.join(out, "results.png"))

    def short_paths(self, cmd):
        return [a.replace(self.build + "/", "build/").replace(self.work + "/", "$WORK/")
                for a in cmd]

    def plot(self, path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
        for ax, kind, key in ((ax1, "lat", "t_typical"), (ax2, "bw", "bw_avg_MBps")):
            lines = [(n, v, "o", "-") for n, v in self.results[kind].items()]
            lines += [(n, v, "x", "--") for n, v in self.results["peers"].items()
                      if kind in n.split()]
            for name, series, marker, style in lines:
                if len(series) > 1:
                    xs = sorted(series)
                    ax.plot(xs, [series[x][key] for x in xs], marker=marker, linestyle=style,
                            label=name)
        for ax, title, ylabel in ((ax1, "Durable write latency (RTT, median)", "microseconds"),
                                  (ax2, "Durable write bandwidth", "MB/s")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size [bytes]")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)

    @staticmethod
    def host_info():
        cpus = os.cpu_count()
        return "%s, %d CPUs, Linux %s, %s" % (platform.node() and "this host", cpus,
                                              platform.release(),
                                              datetime.date.today().isoformat())


def bump(addr, n):
    """An IPv4 address n further on (last octet)."""
    a = addr.split(".")
    return ".".join(a[:3] + [str(int(a[3]) + n)])


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="build directory (default: build)")
    p.add_argument("--out", default="docs/performance", help="output directory")
    p.add_argument("--short", action="store_true", help="reduced matrix for the test suite")
    p.add_argument("--addr", nargs=2, default=["127.0.12.1", "127.0.12.2"],
                   help="loopback addresses of the two sroce links (the shared-device "
                   "series also uses the two addresses after them, +2)")
    p.add_argument("--port", type=int, default=19400, help="first TCP port - 1")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per program")
    p.add_argument("--only", choices=("sroce", "clients", "peers"), action="append",
                   help="run this part alone (repeatable); the report then lacks the "
                   "ratios whose figures are elsewhere")
    p.add_argument("--rounds", type=int, help="runs of each measurement, the median kept "
                   "(default 3, 1 with --short)")
    args = p.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.short else 3
    if args.short:
        args.sizes, args.lat_iters, args.bw_iters = SHORT_SIZES, 300, 300
        args.peer_iters, args.peer_seconds = 2000, 1
    else:
        args.sizes, args.lat_iters, args.bw_iters = FULL_SIZES, 5000, 5000
        args.peer_iters, args.peer_seconds = 20000, 3
    m = Matrix(args)
    try:
        parts = args.only or ("sroce", "clients", "peers")
        if "sroce" in parts:
            print("sroce methods:", flush=True)
            m.sroce_matrix()
        if "clients" in parts:
            print("third-party programs:", flush=True)
            m.clients_matrix()
        if "peers" in parts:
            print("peers:", flush=True)
            m.peer_matrix()
        m.write_report()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print("perf_matrix: %s" % e, file=sys.stderr)
        return 1
    finally:
        m.stop_agent()
        subprocess.run(["rm", "-rf", m.work])
    print("wrote %s/results.md, results.json, results.png" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
