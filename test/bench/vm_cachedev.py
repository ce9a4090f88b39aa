#!/usr/bin/env python3
"""Issue #39's VM rows for --cache-dev, from one run of test/vm/guest/bench-cachedev.sh: the goals
table (medians of per-repetition ratios with min–max), a table of each system's figures, a JSON
summary and a chart of commit latency (PNG, y axis from 0, gnuplot as test/bench/curves.py).

    python3 test/bench/vm_cachedev.py OUT     (OUT/guest holds the guest's files)

Writes OUT/summary.json and OUT/commit-latency.png and prints the Markdown on stdout. A ratio is
taken within one repetition (the systems of a job ran back to back, A B C A B C ...), so drift
between repetitions moves both sides alike; the verdict compares the median ratio with the goal.

Commit latency: fio reports a write's completion latency and the following fsync's latency
separately; a commit (write + fsync, QD1) is their sum. Its p50 here is the sum of the two p50s
(the goal rows compare that); its p99 the sum of the two p99s, an upper bound of the cycle's p99.
"""
import json
import os
import re
import statistics
import subprocess
import sys

SYSTEMS = ("local", "off", "wb", "cd")
NAMES = {"local": "local fs (the cache device's ext4)", "off": "--cache off",
         "wb": "RAM write-back (default)", "cd": "--cache-dev"}
SHORT = {"local": "local ext4", "off": "cache off", "wb": "RAM write-back", "cd": "--cache-dev"}
JOBS = ("commit-4k-qd1", "seqwrite-1m-qd8", "randread-4k-qd32", "pgbench")
FILE_RE = re.compile(r"(\d+)-(" + "|".join(JOBS) + r")-(" + "|".join(SYSTEMS) + r")\.(json|txt)$")

# (row, job, metric, system, reference, goal, "<=" or ">=", what the metric is)
GOALS = (
    ("1a", "commit-4k-qd1", "commit_p50_us", "cd", "local", 1.5, "<=",
     "4 KiB write + fsync QD1, p50 (write p50 + fsync p50): --cache-dev / local fs"),
    ("1b", "commit-4k-qd1", "commit_p50_us", "cd", "off", 0.3, "<=",
     "4 KiB write + fsync QD1, p50 (write p50 + fsync p50): --cache-dev / --cache off"),
    ("2a", "pgbench", "tps", "cd", "off", 3.0, ">=",
     "pgbench TPS (scale 10, 4 clients, synchronous_commit on): --cache-dev / --cache off"),
    ("2b", "pgbench", "tps", "cd", "wb", 1.5, ">=",
     "pgbench TPS: --cache-dev / RAM write-back"),
    ("3", "seqwrite-1m-qd8", "mibps", "cd", "off", 0.95, ">=",
     "1 MiB sequential write QD8 MiB/s: --cache-dev / --cache off"),
    ("4", "randread-4k-qd32", "iops", "cd", "local", 0.8, ">=",
     "warm 4 KiB random read QD32 IOPS: --cache-dev / local fs"),
)


def pct(lat, p):
    return lat["percentile"][f"{p:.6f}"] / 1e3


def parse_fio(path, job):
    """The figures of one fio JSON file."""
    with open(path) as f:
        j = json.load(f)["jobs"][0]
    d = j["read"] if job.startswith("randread") else j["write"]
    r = dict(iops=d["iops"], mibps=d["bw_bytes"] / 2**20, errors=j["error"])
    if job.startswith("commit"):
        w, s = d["clat_ns"], j["sync"]["lat_ns"]
        r.update(write_p50_us=pct(w, 50), write_p99_us=pct(w, 99),
                 sync_p50_us=pct(s, 50), sync_p99_us=pct(s, 99))
        r["commit_p50_us"] = r["write_p50_us"] + r["sync_p50_us"]
        r["commit_p99_us"] = r["write_p99_us"] + r["sync_p99_us"]
        # one write and one fsync per cycle: the mean cycle is the inverse of the write rate
        r["cycle_us"] = 1e6 / d["iops"] if d["iops"] else None
    return r


def parse_pgbench(text):
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    if not m:
        return None
    r = dict(tps=float(m.group(1)))
    m = re.search(r"latency average = ([0-9.]+) ms", text)
    if m:
        r["latency_ms"] = float(m.group(1))
    return r


def load(guest):
    """{(job, system): {rep: figures}} from a guest directory."""
    runs = {}
    for name in sorted(os.listdir(guest)):
        m = FILE_RE.match(name)
        if not m:
            continue
        rep, job, system, ext = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        path = os.path.join(guest, name)
        if ext == "json":
            r = parse_fio(path, job)
        else:
            with open(path) as f:
                r = parse_pgbench(f.read())
        if r is not None:
            runs.setdefault((job, system), {})[rep] = r
    return runs


def ratios(runs, job, metric, system, ref):
    a, b = runs.get((job, system), {}), runs.get((job, ref), {})
    return [a[k][metric] / b[k][metric] for k in sorted(a) if k in b and b[k].get(metric)]


def verdicts(runs):
    rows = []
    for row, job, metric, system, ref, goal, op, what in GOALS:
        rs = ratios(runs, job, metric, system, ref)
        med = statistics.median(rs) if rs else None
        met = None if med is None else (med <= goal if op == "<=" else med >= goal)
        # by how much: the factor the median must still move to reach the goal
        short = None if med is None or met else (med / goal if op == "<=" else goal / med)
        rows.append(dict(row=row, job=job, metric=metric, system=system, reference=ref, goal=goal,
                         op=op, what=what, ratios=rs, median=med, min=min(rs) if rs else None,
                         max=max(rs) if rs else None, met=met, off_by=short))
    return rows


def med(runs, job, system, key):
    v = [r[key] for r in runs.get((job, system), {}).values() if r.get(key) is not None]
    return (statistics.median(v), min(v), max(v)) if v else None


def cell(t, fmt="{:.1f}"):
    if t is None:
        return "–"
    return f"{fmt.format(t[0])} ({fmt.format(t[1])}–{fmt.format(t[2])})"


def reading_stats(guest):
    """What the cache-dev gateway's status said around each warm-read run: the log's fill and the
    RAM cache's hits and misses over the run (where the reads were served)."""
    out = []
    for name in sorted(os.listdir(guest)):
        m = re.match(r"(\d+)-randread-4k-qd32-cd\.before\.json$", name)
        if not m:
            continue
        after = os.path.join(guest, f"{m.group(1)}-randread-4k-qd32-cd.after.json")
        if not os.path.exists(after):
            continue
        with open(os.path.join(guest, name)) as f:
            b = json.load(f)["cache"]
        with open(after) as f:
            a = json.load(f)["cache"]
        out.append(dict(rep=int(m.group(1)), log_mib_before=b["device"]["log_bytes"] / 2**20,
                        log_mib_after=a["device"]["log_bytes"] / 2**20,
                        dirty_mib_before=b["device"]["dirty_bytes"] / 2**20,
                        ram_hits=a["hits"] - b["hits"], ram_misses=a["misses"] - b["misses"]))
    return out


def jbd2_commits(text):
    """(transactions, average commit time in µs) from /proc/fs/jbd2/<dev>/info."""
    t = re.search(r"^(\d+) transactions", text, re.M)
    a = re.search(r"^\s*(\d+)us average transaction commit time", text, re.M)
    return (int(t.group(1)) if t else None, int(a.group(1)) if a else None)


def commit_stats(guest, runs):
    """Per commit run of local and cd: ext4 journal commits per fsync on the local disk, and for cd
    the log's fdatasyncs per fsync (status --json before and after the run)."""
    out = []
    for name in sorted(os.listdir(guest)):
        m = re.match(r"(\d+)-commit-4k-qd1-(local|cd)\.jbd2\.before$", name)
        if not m:
            continue
        rep, system = int(m.group(1)), m.group(2)
        after = os.path.join(guest, name[:-len("before")] + "after")
        fio = os.path.join(guest, f"{rep}-commit-4k-qd1-{system}.json")
        if not (os.path.exists(after) and os.path.exists(fio)):
            continue
        with open(os.path.join(guest, name)) as f:
            b = jbd2_commits(f.read())
        with open(after) as f:
            a = jbd2_commits(f.read())
        with open(fio) as f:
            fsyncs = json.load(f)["jobs"][0]["sync"]["total_ios"]
        r = dict(rep=rep, system=system, fsyncs=fsyncs)
        if a[0] is not None and b[0] is not None and fsyncs:
            r["jbd2_commits_per_fsync"] = (a[0] - b[0]) / fsyncs
        # jbd2 keeps a moving average (each commit weighs a quarter): at the end of a run of
        # hundreds of commits it is the run's own
        r["jbd2_avg_commit_us"] = a[1]
        sb, sa = (os.path.join(guest, f"{rep}-commit-4k-qd1-cd.{w}.json") for w in ("before", "after"))
        if system == "cd" and os.path.exists(sb) and os.path.exists(sa) and fsyncs:
            with open(sb) as f:
                db = json.load(f)["cache"]["device"]
            with open(sa) as f:
                da = json.load(f)["cache"]["device"]
            r["log_syncs_per_fsync"] = (da["syncs"] - db["syncs"]) / fsyncs
        out.append(r)
    return out


def strace_stats(path):
    """Durations (µs) of the cache-dev gateway's fdatasyncs and writes in the diagnostic pass's
    strace -T output: {call: (count, p50, p99)}."""
    if not os.path.exists(path):
        return {}
    calls = {}
    names = "fdatasync|fsync|pwritev2|pwritev|pwrite64"
    with open(path) as f:
        for line in f:
            # a call another thread interrupted ends on a "<... NAME resumed>" line of its own
            m = re.search(r"(?:\b(" + names + r")\(|<\.\.\. (" + names + r") resumed>).*<([0-9.]+)>\s*$", line)
            if m:
                calls.setdefault(m.group(1) or m.group(2), []).append(float(m.group(3)) * 1e6)
    out = {}
    for c, v in calls.items():
        v.sort()
        out[c] = (len(v), statistics.median(v), v[min(len(v) - 1, int(len(v) * 0.99))])
    return out


def report(runs, rows, reads, commits=(), strace=None):
    reps = max((len(v) for v in runs.values()), default=0)
    out = ["| row | goal | measured: median of per-rep ratios (min–max) | met |", "| --- | --- | --- | --- |"]
    for r in rows:
        if r["median"] is None:
            out.append(f"| {r['row']} | {r['what']} {r['op'].replace('<=', '≤').replace('>=', '≥')} "
                       f"{r['goal']}× | – | – |")
            continue
        met = "yes" if r["met"] else f"no (off by {r['off_by']:.2f}×)"
        out.append(f"| {r['row']} | {r['what']} {r['op'].replace('<=', '≤').replace('>=', '≥')} {r['goal']}× | "
                   f"**{r['median']:.3f}** ({r['min']:.3f}–{r['max']:.3f}) | {met} |")
    out.append("| 5 | chart of commit latency (p50, p99 of write + fsync QD1) | commit-latency.png | – |")
    out.append("")
    out.append(f"{reps} repetition(s); ratios are taken within a repetition, then the median over them.")
    out.append("")
    out.append("Figures per system: median over repetitions (min–max).")
    out.append("")
    out.append("| job | figure | " + " | ".join(NAMES[s] for s in SYSTEMS) + " |")
    out.append("| --- | --- |" + " --- |" * len(SYSTEMS))
    for job, key, label in (("commit-4k-qd1", "write_p50_us", "write clat p50 (µs)"),
                            ("commit-4k-qd1", "sync_p50_us", "fsync lat p50 (µs)"),
                            ("commit-4k-qd1", "commit_p50_us", "write + fsync p50 (µs)"),
                            ("commit-4k-qd1", "commit_p99_us", "write p99 + fsync p99 (µs)"),
                            ("commit-4k-qd1", "cycle_us", "mean cycle, 1/IOPS (µs)"),
                            ("seqwrite-1m-qd8", "mibps", "MiB/s"),
                            ("randread-4k-qd32", "iops", "IOPS"),
                            ("pgbench", "tps", "TPS")):
        out.append(f"| {job} | {label} | " + " | ".join(cell(med(runs, job, s, key)) for s in SYSTEMS) + " |")
    if reads:
        out.append("")
        out.append("Warm read on --cache-dev, per repetition (status --json around the timed read): "
                   + "; ".join(f"rep {r['rep']}: log {r['log_mib_before']:.0f} → {r['log_mib_after']:.0f} MiB "
                               f"(dirty {r['dirty_mib_before']:.0f} MiB at start), RAM cache {r['ram_hits']} hits / "
                               f"{r['ram_misses']} misses" for r in reads) + ".")
    if commits:
        out.append("")
        out.append("Commit runs, per repetition: ext4 journal (jbd2) commits on the local disk per fsync and "
                   "their time (jbd2's moving average at the end of the run), and the log's fdatasyncs per fsync: " + "; ".join(
                       f"rep {c['rep']} {c['system']}: "
                       + (f"{c['jbd2_commits_per_fsync']:.2f} jbd2 commits/fsync" if "jbd2_commits_per_fsync" in c else "–")
                       + (f" (avg {c['jbd2_avg_commit_us']} µs)" if c.get("jbd2_avg_commit_us") is not None else "")
                       + (f", {c['log_syncs_per_fsync']:.2f} log fdatasyncs/fsync" if "log_syncs_per_fsync" in c else "")
                       for c in commits) + ".")
    if strace:
        out.append("")
        out.append("Diagnostic pass (the cache-dev commit job once more, the gateway under strace -T; not in the "
                   "table): " + "; ".join(f"{c} ×{n}: p50 {p50:.0f} µs, p99 {p99:.0f} µs"
                                          for c, (n, p50, p99) in sorted(strace.items())) + ".")
    return out


def chart(out_dir, runs):
    """commit-latency.png: p50 and p99 of write + fsync QD1 per system, bars from 0."""
    dat = os.path.join(out_dir, "commit-latency.dat")
    with open(dat, "w") as f:
        f.write("system p50 p99\n")
        for s in ("off", "wb", "cd", "local"):
            p50, p99 = med(runs, "commit-4k-qd1", s, "commit_p50_us"), med(runs, "commit-4k-qd1", s, "commit_p99_us")
            if p50 and p99:
                f.write(f"\"{SHORT[s]}\" {p50[0] / 1e3:.3f} {p99[0] / 1e3:.3f}\n")
    script = f"""set terminal pngcairo size 900,480 noenhanced
set output '{os.path.join(out_dir, "commit-latency.png")}'
set title "commit latency: 4 KiB write + fsync, QD1 (median over repetitions)\\np50 = write p50 + fsync p50; p99 = write p99 + fsync p99"
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'ms'
set xrange [-0.5:*]
set key top right
set grid ytics
plot '{dat}' using 2:xtic(1) title columnhead(2), '' using 3 title columnhead(3)
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=False)
    return script


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = argv[1]
    guest = os.path.join(out, "guest")
    runs = load(guest)
    rows = verdicts(runs)
    reads = reading_stats(guest)
    commits = commit_stats(guest, runs)
    strace = strace_stats(os.path.join(guest, "diag-strace-cd.txt"))
    print("\n".join(report(runs, rows, reads, commits, strace)))
    chart(out, runs)
    summary = dict(goals=rows, reads=reads, commits=commits, strace_cd={k: list(v) for k, v in strace.items()},
                   runs={f"{job} {s}": {str(k): v for k, v in sorted(reps.items())}
                         for (job, s), reps in sorted(runs.items())})
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
