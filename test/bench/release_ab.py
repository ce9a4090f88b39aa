"""Issue 15's no-regression A/B for make bench with --alt-bin: this tree's gateway against the
--alt-bin one (a build from before the change to judge, e.g. 5469c4e, before the structure
pass), both `serve --cache off`, interleaved (ab.py) over the jobs that measure the data path.
The -alt systems in the job tables run each binary once per repetition, minutes apart, where
one binary's rate moves ±15 % between runs on this host; a 3 % verdict needs the pairs.

Cache off is the data path the structure pass rearranged without meaning to change it (the
write-back cache's speed changed on purpose, issue 18, and is compared in the tables). Speed
ratio = this tree / alt for a rate, alt / this tree for a p50 latency, so above 1 is faster;
no regression beyond noise: median ≥ 0.97, or the upper quartile ≥ 0.97 and CPU per request
this tree / alt ≤ 1.03 (ab.met).
"""
import os

import ab  # noqa: E402  (beside this file)

NAME = "release-ab"  # for --systems
NEW, OLD = "iser-blk-nocache-head", "iser-blk-nocache-alt-bin"
JOBS = ("randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd32", "seqread-1m-qd8", "seqwrite-1m-qd8")
TARGET = 0.97


def run(bench, a, tgt, work, rep, preexec=None):
    """One repetition of the A/B; returns rows (marked ab=NAME, kept out of the job tables)."""
    jobs = [(n, args) for n, args, _ in bench.JOBS if n in JOBS and (not a.jobs or n in a.jobs.split(","))]
    if not jobs or not a.alt_bin or a.release_ab_pairs <= 0:
        return []

    def start(name, binary):
        sock = os.path.join(work, f"{name}.sock")
        argv = [binary, "serve", "--target", tgt.url, "--listen", f"unix://{sock}", "--cache", "off"]
        return bench.NBDServer(name, argv, sock, work, preexec=preexec)
    servers = {}
    try:
        servers[NEW] = start(NEW, bench.BIN)
        servers[OLD] = start(OLD, a.alt_bin)
        return ab.interleave(bench, a, work, rep, servers, NEW, OLD, jobs, a.release_ab_pairs,
                             a.release_ab_runtime, NAME, preexec=preexec)
    finally:
        for s in servers.values():
            s.stop()


def report(bench, rows, alt_version):
    """The A/B's section: per job, the median speed ratio this tree / alt and the CPU ratio."""
    rows = [r for r in rows if r.get("ab") == NAME]
    if not rows:
        return []
    out = [f"\n## No regression (issue 15): this tree against {alt_version}, cache off, interleaved pairs\n",
           "Each pair is one run of each gateway, back to back, order alternating (test/bench/ab.py). "
           "Speed = this tree / alt for IOPS and MiB/s, alt / this tree for a p50 latency (above 1: "
           f"this tree is faster); goal ≥ {TARGET:g}. CPU = the gateway's CPU per request, this "
           f"tree / alt (below 1: this tree costs less). met: the speed's median reaches the goal, or "
           f"its upper quartile does (the gap is within the noise) and the CPU's median is ≤ {1 / TARGET:.3f}. Spread: min–max and interquartile range over every pair "
           "of every repetition.\n"]
    return out + ab.speed_table(bench, rows, JOBS, NEW, OLD, TARGET, "this tree", "alt", digits=1)

