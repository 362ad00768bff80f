#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Runs rdma-core's pyverbs test suite over one sroce device and judges it.

Driven by test_rdma_core_suite.sh, which owns the two lists this script
applies (see there):

  acceptable  REASON-REGEX | CATEGORY | why              skips that are fine for good
  not-yet     TEST-REGEX   | FEATURE  | EXPECT | note    what sroce must still gain

EXPECT is "skip" (the test may skip) or "fail" (it may also fail or error:
a known failure, waiting for a fix outside the files that made the list).

(columns separated by a bar with blanks around it).

The suite is one unittest process.  It runs with -v (one status line per
test) and -b (the tests' own output is held back, so status lines stay
whole).  A run that outlives --run-timeout, or dies, is killed; the test it
was in is recorded as hung or crashed and the tests not yet run are started
again in a new run, so one bad test costs a run, not the whole result.

Exit status: 0 when every test passed or was skipped for a listed reason,
1 otherwise.  Prints a summary; --report writes every non-ok test with its
reason, grouped by feature, as Markdown.
"""

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import time

# Order of the feature groups in the summary and the report; a not-yet
# entry's FEATURE must be one of these.
FEATURES = [
    "UD", "UC", "SRQ", "XRC", "MW", "ODP", "rereg MR", "AH",
    "extended CQ/QP", "net interface/sysfs", "rdma_cm", "rt values", "other",
]

# A status line: "test_x (tests.mod.Cls.test_x) ... ok", where a docstring's
# first line may stand between the name and " ... " on the next line.
START_RE = re.compile(r"^(\w+) \(([\w.]+)\)(?: \((.*)\))?")
STATUS_RE = re.compile(
    r" \.\.\. (ok|FAIL|ERROR|skipped (?P<reason>.*)|expected failure|unexpected success)$")
BLOCK_RE = re.compile(r"^(ERROR|FAIL): (\w+) \(([\w.]+)\)")
# The line of a traceback naming the exception ("pkg.SomeError: message").
EXC_RE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b(: .*)?$")

# Worst first: when a test reports twice (a subTest, a tearDown error), the
# worse status stands.
RANK = {"hung": 0, "crashed": 1, "not run": 2, "ERROR": 3, "FAIL": 4,
        "unexpected success": 5, "skipped": 6, "expected failure": 7, "ok": 8}
BAD = {"hung", "crashed", "not run", "ERROR", "FAIL", "unexpected success"}


def test_id(name, paren):
    # A test prints as "name (module.Class.name)"; a fixture that failed
    # (setUpClass, setUpModule) as "setUpClass (module.Class)".
    return paren if paren.endswith("." + name) else paren + "." + name


def load_list(path, ncols):
    entries = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            # Columns are separated by " | " (blanks around the bar), so a
            # regex may use "|" without blanks.
            cols = [c.strip() for c in re.split(r"\s+\|\s+", line)]
            if len(cols) != ncols:
                sys.exit(f"{path}:{n}: expected {ncols} ' | '-separated columns: {line}")
            try:
                cols[0] = re.compile(cols[0])
            except re.error as e:
                sys.exit(f"{path}:{n}: bad regex: {e}")
            entries.append(cols)
    return entries


class Run:
    """Parses one run's stderr: statuses, and failure reasons from the
    tracebacks unittest prints at the end."""

    def __init__(self):
        self.status = {}   # id -> (status, reason)
        self.current = None
        self.order = []

    def record(self, tid, status, reason=""):
        old = self.status.get(tid)
        if old is None:
            self.order.append(tid)
        if old is None or RANK[status] < RANK[old[0]]:
            self.status[tid] = (status, reason)

    def parse(self, text):
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("=" * 70):
                i = self._block(lines, i + 1)
                continue
            m = START_RE.match(line)
            if m:
                self.current = test_id(m.group(1), m.group(2))
            s = STATUS_RE.search(line)
            if s and self.current:
                word = s.group(1)
                if word.startswith("skipped"):
                    reason = s.group("reason")
                    if len(reason) >= 2 and reason[0] in "'\"" and reason[-1] == reason[0]:
                        reason = reason[1:-1]
                    self.record(self.current, "skipped", reason)
                else:
                    self.record(self.current, word)
                self.current = None
            i += 1

    def _block(self, lines, i):
        # "ERROR: name (id)", the docstring's first line if any, a dashed
        # line, the traceback (then, with -b, the test's held-back output
        # after "Stdout:" / "Stderr:").  The reason is the exception line.
        if i >= len(lines):
            return i
        m = BLOCK_RE.match(lines[i])
        if not m:
            return i
        tid = test_id(m.group(2), m.group(3))
        i += 1
        while i < len(lines) and not lines[i].startswith("-" * 70):
            i += 1
        i += 1
        tb = []
        while i < len(lines) and not lines[i].startswith(("=" * 70, "-" * 70)):
            if lines[i].startswith(("Stdout:", "Stderr:")):
                while i < len(lines) and not lines[i].startswith(("=" * 70, "-" * 70)):
                    i += 1
                break
            tb.append(lines[i])
            i += 1
        exc = [t for t in tb if EXC_RE.match(t)]
        text = [t.strip() for t in tb if t.strip()]
        reason = exc[-1] if exc else (text[-1] if text else "(no traceback)")
        if tid not in self.status:
            self.record(tid, m.group(1))
        self.status[tid] = (self.status[tid][0], reason.strip()[:300])
        return i


def run_suite(args, names, log):
    cmd = [args.sroce, "exec", "--", args.python, "tests/run_tests.py",
           "--dev", args.dev, "--gid", str(args.gid), "-v", "-b"] + names
    log.write(f"$ {' '.join(cmd[:9])} ... ({len(names)} tests)\n")
    log.flush()
    p = subprocess.Popen(cmd, cwd=args.suite, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace",
                         start_new_session=True)
    timed_out = False
    try:
        out, _ = p.communicate(timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # The run is its own process group (start_new_session): this kills
        # the suite and anything it started, and nothing else.
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    log.write(out)
    log.flush()
    r = Run()
    r.parse(out)
    return r, p.returncode, timed_out


def list_tests(args):
    cmd = [args.sroce, "exec", "--", args.python, "tests/run_tests.py",
           "--dev", args.dev, "--gid", str(args.gid), "--list-tests"]
    p = subprocess.run(cmd, cwd=args.suite, capture_output=True, text=True, timeout=120)
    names = [l.strip() for l in p.stdout.splitlines() if re.match(r"^tests\.[\w.]+$", l.strip())]
    # --list-tests runs no test, which unittest of Python >= 3.12 reports
    # with exit status 5.
    if p.returncode not in (0, 5) or not names:
        sys.stderr.write(p.stdout + p.stderr)
        sys.exit("cannot list the suite's tests")
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", required=True, help="directory holding tests/")
    ap.add_argument("--sroce", required=True, help="the sroce command")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--dev", default="sroce0")
    ap.add_argument("--gid", type=int, default=1)
    ap.add_argument("--acceptable", required=True)
    ap.add_argument("--not-yet", required=True)
    ap.add_argument("--run-timeout", type=int, default=240)
    ap.add_argument("--max-restarts", type=int, default=4)
    ap.add_argument("--log", required=True)
    ap.add_argument("--report")
    args = ap.parse_args()
    args.sroce = os.path.abspath(args.sroce)

    acceptable = load_list(args.acceptable, 3)
    not_yet = load_list(args.not_yet, 4)
    for e in not_yet:
        if e[1] not in FEATURES:
            sys.exit(f"not-yet entry {e[0].pattern}: feature '{e[1]}' is not one of {FEATURES}")
        if e[2] not in ("skip", "fail"):
            sys.exit(f"not-yet entry {e[0].pattern}: expect '{e[2]}' is neither skip nor fail")

    all_tests = list_tests(args)
    results = {}
    start = time.monotonic()
    with open(args.log, "w") as log:
        remaining = list(all_tests)
        restarts = 0
        while remaining:
            r, rc, timed_out = run_suite(args, remaining, log)
            results.update(r.status)
            for tid in r.order:
                if tid not in all_tests:
                    all_tests.append(tid)   # a failed fixture
            remaining = [t for t in remaining if t not in results]
            if not timed_out and (rc in (0, 1) or not remaining):
                break
            # Killed, or died: the test it was in is to blame.  Its id was
            # printed without a status; otherwise it is the first not run.
            victim = r.current or (remaining[0] if remaining else None)
            if victim:
                how = "hung" if timed_out else "crashed"
                why = (f"no result within the run timeout ({args.run_timeout} s)"
                       if timed_out else f"the suite process exited with status {rc}")
                results[victim] = (how, why)
                print(f"*** {victim}: {how}: {why}", flush=True)
            remaining = [t for t in remaining if t not in results]
            restarts += 1
            if restarts > args.max_restarts:
                break
    for t in remaining:
        results.setdefault(t, ("not run", "the suite was given up after too many hung runs"))
    for t in all_tests:
        results.setdefault(t, ("not run", "the suite did not report this test"))
    elapsed = time.monotonic() - start

    # Classify.
    ok, problems, notices, known_failures = [], [], [], []
    by_feature = collections.defaultdict(list)     # not-yet
    by_category = collections.defaultdict(list)    # acceptable
    used = set()
    for tid in all_tests:
        status, reason = results[tid]
        entry = next((e for e in not_yet if e[0].search(tid)), None)
        if status in ("ok", "expected failure"):
            ok.append(tid)
            if entry:
                notices.append(f"{tid} now passes: remove it from the not-yet list "
                               f"('{entry[0].pattern}', {entry[1]})")
                used.add(entry[0].pattern)
            continue
        if status == "skipped":
            # An acceptable reason first: a not-yet test whose feature has
            # landed may go on to skip for a reason that is fine for good
            # (e.g. it is an mlx5 test), and its entry should then go.
            acc = next((a for a in acceptable if a[0].search(reason)), None)
            if acc:
                by_category[acc[1]].append((tid, reason, acc[2]))
                continue
            if entry:
                by_feature[entry[1]].append((tid, reason, entry[3]))
                used.add(entry[0].pattern)
                continue
            problems.append((tid, "skipped (reason not allowed)", reason))
            continue
        if entry and entry[2] == "fail" and status in ("FAIL", "ERROR"):
            by_feature[entry[1]].append((tid, f"{status}: {reason}", entry[3]))
            known_failures.append((tid, status, reason))
            used.add(entry[0].pattern)
            continue
        problems.append((tid, status, reason))
    for e in not_yet:
        if e[0].pattern not in used:
            notices.append(f"not-yet entry '{e[0].pattern}' ({e[1]}) matches no skipped "
                           "test: remove it")

    counts = collections.Counter(results[t][0] for t in all_tests)
    nskip = counts["skipped"]
    n_acc = sum(len(v) for v in by_category.values())
    n_ny = sum(len(v) for v in by_feature.values()) - len(known_failures)

    # Per-module table.
    mods = collections.OrderedDict()
    for tid in all_tests:
        mod = tid.split(".")[1] if tid.count(".") >= 2 else tid
        mods.setdefault(mod, collections.Counter())
    bad_ids = {p[0] for p in problems}
    ny_ids = {t for v in by_feature.values() for t, _, _ in v}
    for tid in all_tests:
        mod = tid.split(".")[1] if tid.count(".") >= 2 else tid
        status = results[tid][0]
        c = mods[mod]
        if tid in bad_ids:
            c["problem"] += 1
        elif status == "skipped" or tid in ny_ids:
            c["not-yet" if tid in ny_ids else "acceptable"] += 1
        else:
            c["ok"] += 1

    print()
    print(f"{'module':32} {'ok':>4} {'not-yet':>8} {'accept':>7} {'PROBLEM':>8}")
    for mod, c in mods.items():
        print(f"{mod:32} {c['ok']:4} {c['not-yet']:8} {c['acceptable']:7} "
              f"{c['problem'] or '':>8}")
    print()
    print("not yet (skipped, or known failures, until sroce has the feature):")
    for f in FEATURES:
        if by_feature.get(f):
            print(f"  {f:22} {len(by_feature[f]):4}")
    print("acceptable skips:")
    for cat, v in sorted(by_category.items()):
        print(f"  {cat:22} {len(v):4}")
    print()
    for n in notices:
        print(f"NOTICE: {n}")
    for tid, status, reason in known_failures:
        print(f"known failure (not-yet list): {tid}: {status}: {reason[:160]}")
    for tid, status, reason in problems:
        print(f"PROBLEM: {tid}: {status}: {reason[:160]}")
    print()
    print(f"{len(all_tests)} tests in {elapsed:.1f} s: {len(ok)} ok, {counts['FAIL']} failed, "
          f"{counts['ERROR']} errors, {nskip} skipped ({n_acc} acceptable, {n_ny} not yet), "
          f"{counts['hung'] + counts['crashed'] + counts['not run']} hung/crashed/not run; "
          f"{len(known_failures)} known failure(s), {len(problems)} problem(s)")

    if args.report:
        write_report(args.report, all_tests, results, ok, problems, notices,
                     by_feature, by_category, counts, elapsed)
        print(f"report: {args.report}")
    return 1 if problems else 0


def write_report(path, all_tests, results, ok, problems, notices, by_feature,
                 by_category, counts, elapsed):
    def esc(s):
        return s.replace("|", "\\|")

    with open(path, "w") as f:
        f.write("# rdma-core test suite over sroce\n\n")
        f.write("rdma-core's own pyverbs tests (python3-pyverbs, "
                "/usr/share/doc/rdma-core/tests), run by "
                "tests/integration/test_rdma_core_suite.sh on one sroce device.\n\n")
        f.write(f"{len(all_tests)} tests in {elapsed:.1f} s: **{len(ok)} ok**, "
                f"{counts['FAIL']} failed, {counts['ERROR']} errors, "
                f"{counts['skipped']} skipped, "
                f"{counts['hung'] + counts['crashed'] + counts['not run']} hung/crashed/not run.\n\n")
        f.write("## Problems (fail the test)\n\n")
        if problems:
            f.write("| test | status | reason |\n|---|---|---|\n")
            for tid, status, reason in problems:
                f.write(f"| `{tid}` | {status} | {esc(reason)} |\n")
        else:
            f.write("None.\n")
        if notices:
            f.write("\n## Notices\n\n")
            for n in notices:
                f.write(f"- {esc(n)}\n")
        f.write("\n## Not yet: features sroce must gain\n\n")
        for feat in FEATURES:
            v = by_feature.get(feat)
            if not v:
                continue
            f.write(f"### {feat} ({len(v)})\n\n| test | skip reason or failure | waits for |\n"
                    "|---|---|---|\n")
            for tid, reason, note in v:
                f.write(f"| `{tid}` | {esc(reason)} | {esc(note)} |\n")
            f.write("\n")
        f.write("## Acceptable skips\n\n")
        for cat, v in sorted(by_category.items()):
            f.write(f"### {cat} ({len(v)})\n\n| test | skip reason |\n|---|---|\n")
            for tid, reason, _ in v:
                f.write(f"| `{tid}` | {esc(reason)} |\n")
            f.write("\n")
        f.write("## Passing\n\n")
        for tid in ok:
            f.write(f"- `{tid}`\n")


if __name__ == "__main__":
    sys.exit(main())
