"""Issue 15's no-regression A/B for make bench with --alt-bin: this tree's gateway against the
--alt-bin one (a build from before the change to judge, e.g. 5469c4e, before the structure
pass), both `serve --cache off`, interleaved (ab.py) over the jobs that measure the data path.
The -alt systems in the job tables run each binary once per repetition, minutes apart, where
one binary's rate moves ±15 % between runs on this host; a 3 % verdict needs the pairs.

Cache off is the data path the structure pass rearranged without meaning to change it (the
write-back cache's speed changed on purpose, issue 18, and is compared in the tables). Speed
ratio = this tree / alt for a rate, alt / this tree for a p50 latency, so above 1 is faster;
no regression beyond noise is shown when the 95 % confidence interval of the ratio's geometric
mean (ab.geo_ci) lies at or above 0.97; one wholly below it is a regression; one that spans it
says the run had too few pairs to tell, and how many would (verdict).

Run alone on results files, it prints the section again over their pairs pooled (python3
release_ab.py results-*.json --alt-name NAME --per-start N), so that runs of the same two builds
add up.
"""
import argparse
import json
import math
import os
import sys

import ab  # noqa: E402  (beside this file)

NAME = "release-ab"  # for --systems
NEW, OLD = "iser-blk-nocache-head", "iser-blk-nocache-alt-bin"
JOBS = ("randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd32", "seqread-1m-qd8", "seqwrite-1m-qd8")
TARGET = 0.97


def run(bench, a, tgt, work, rep, preexec=None):
    """One repetition of the A/B; returns rows (marked ab=NAME, kept out of the job tables).
    Both gateways are started afresh every --release-ab-pairs-per-start pairs, so that whatever one
    process carries of its own (where the scheduler put its thread beside tgtd's and fio's, how
    its heap grew) falls on many starts. On 2026-12-02, 40 pairs restarted every 2 showed no such
    bias (the variance of a start's mean ratio matched the within-start variance / 2); what made
    three earlier runs of 10–15 pairs disagree by 8 % is that one pair's ratio spreads ±14 % (the
    standard deviation of its logarithm) at 4 KiB QD32, so 10 pairs pin the mean to ±9 %
    (docs/bench/release-ab-20261202.md). The verdict therefore rests on the confidence interval."""
    only = getattr(a, "release_ab_jobs", "")
    jobs = [(n, args) for n, args, _ in bench.JOBS if n in JOBS and (not a.jobs or n in a.jobs.split(","))
            and (not only or n in only.split(","))]
    if not jobs or not a.alt_bin or a.release_ab_pairs <= 0:
        return []

    cache = getattr(a, "release_ab_cache", "off")
    warm = cache == "writeback-warm"

    def start(name, binary):
        sock = os.path.join(work, f"{name}.sock")
        argv = [binary, "serve", "--target", tgt.url, "--listen", f"unix://{sock}",
                "--cache", "writeback" if warm else "off"]
        return bench.NBDServer(name, argv, sock, work, preexec=preexec)

    def warm_up(system):
        """Before every run of the warm variant: the working set read once through the pages, as
        bench.py warms its -warm systems (a write run may have dropped some); untimed, and
        before the run's CPU sample."""
        if warm:
            bench.fio(servers[system].uri, "warmup", dict(rw="read", bs="32k", iodepth=8, numjobs=1),
                      max(a.release_ab_runtime, 5), a.size, work, preexec)

    def mark(system, _):
        return {"cache": cache}
    per_start = a.release_ab_pairs_per_start or a.release_ab_pairs
    rows = []
    for pair0 in range(0, a.release_ab_pairs, per_start):
        servers = {}
        try:
            servers[NEW] = start(NEW, bench.BIN)
            servers[OLD] = start(OLD, a.alt_bin)
            rows += ab.interleave(bench, a, work, rep, servers, NEW, OLD, jobs,
                                  min(per_start, a.release_ab_pairs - pair0), a.release_ab_runtime, NAME,
                                  before=warm_up, after=mark, preexec=preexec, pair0=pair0)
        finally:
            for s in servers.values():
                s.stop()
    return rows


# A mean close to the goal needs pairs without bound (1 / log(mean / goal) squared): past this
# many, the verdict says so instead of quoting a number.
MAX_PAIRS_QUOTED = 1000


def verdict(rs, target):
    """yes: the 95 % interval of the geometric mean lies at or above target; no: wholly below it;
    otherwise "open", with the pairs that would settle it if the mean and spread held (none when
    the mean itself is short of target: only a regression could be shown then)."""
    ci = ab.geo_ci(rs)
    if ci is None:
        return "open (under 4 pairs)"
    g, lo, hi = ci
    if lo >= target:
        return "yes"
    if hi < target:
        return "no"
    if g <= target:
        return "open"
    # The interval's half-width is t975(n - 1) · sd / sqrt(n); the fewest pairs n at which it fits
    # in log(g / target). Both factors shrink with n: keeping this run's t, as scaling by 1/sqrt(n)
    # alone does, overstates the pairs by a third at 6 pairs.
    sd = ab.log_sd(rs)
    room = math.log(g / target)
    for n in range(len(rs) + 1, MAX_PAIRS_QUOTED + 1):
        if ab.t975(n - 1) * sd / math.sqrt(n) <= room:
            return f"open (~{n} pairs)"
    return f"open (over {MAX_PAIRS_QUOTED} pairs)"


def report(bench, rows, alt_version, per_start=0):
    """The A/B's section: per job, the speed ratio this tree / alt (median, spread, geometric mean
    with its 95 % interval), the CPU ratio and the verdict."""
    rows = [r for r in rows if r.get("ab") == NAME]
    if not rows:
        return []
    cache = {"off": "cache off", "writeback-warm": "write-back cache, warm (the working set read "
             "through the pages before every run, untimed)"}.get(rows[0].get("cache", "off"), rows[0].get("cache"))
    out = [f"\n## No regression (issue 15): this tree against {alt_version}, {cache}, interleaved pairs\n",
           "Each pair is one run of each gateway, back to back, order alternating (test/bench/ab.py); "
           + (f"both gateways are started afresh every {per_start} pairs. " if per_start else
              "both gateways run every pair of a repetition on one start. ")
           + "Speed = this tree / alt for IOPS and MiB/s, alt / this tree for a p50 latency (above 1: "
           f"this tree is faster); goal ≥ {TARGET:g}. CPU = the gateway's CPU per request, this "
           "tree / alt (below 1: this tree costs less). Spread: min–max and interquartile range over "
           "every pair of every repetition. 95 % CI: the interval of the speed ratio's geometric mean, "
           f"pairs taken as independent. met: yes when the interval lies at or above {TARGET:g}, no when "
           "it lies below, open when it spans the goal (the pairs that would settle it, if the mean and "
           "spread held).\n",
           "| job | this tree: median | alt: median | speed: median | min–max | IQR | "
           "CPU µs/IO: median | CPU IQR | pairs | speed: geo-mean (95 % CI) | met |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for job in JOBS:
        cs, _ = ab.cells(bench, rows, job, NEW, OLD, TARGET, digits=1)
        if cs is None:
            continue
        rs = ab.ratios(rows, job, bench.metric_of(job), NEW, OLD)
        ci = ab.geo_ci(rs)
        cell = "–" if ci is None else f"{ci[0]:.3f} ({ci[1]:.3f}–{ci[2]:.3f})"
        out.append(ab.table_row(cs, cell, verdict(rs, TARGET)))
    out += ["\nWhere the CPU per request goes: the CPU ratio over every pair, and each side's median "
            "context switches and system calls per request over its runs.\n"]
    out += ab.cost_table(rows, JOBS, NEW, OLD, "this tree", "alt")
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench as bench_module  # noqa: E402
    ap = argparse.ArgumentParser(description="Pool release A/B results files (runs of the same "
                                 "two builds, their repetitions kept apart) and print the section.")
    ap.add_argument("results", nargs="+", help="results-*.json files written by test/bench/run.sh")
    ap.add_argument("--alt-name", default="alt", help="what the alt build was, for the heading")
    ap.add_argument("--per-start", type=int, default=0,
                    help="the --release-ab-pairs-per-start the runs used (0: one start per repetition)")
    args = ap.parse_args()
    files, alt, per_start = args.results, args.alt_name, args.per_start
    pooled = []
    for i, path in enumerate(files):
        with open(path) as f:
            pooled += [dict(r, rep=(i, r.get("rep"))) for r in json.load(f)["results"]]
    print("\n".join(report(bench_module, pooled, alt, per_start)))
