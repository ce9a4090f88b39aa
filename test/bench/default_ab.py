"""Issue 18's first goal as an interleaved A/B (ab.py): the default mode (`serve` with no cache
flag: write-back, write-around and read-around at their defaults) against `--cache off`, 1 MiB
sequential read and write QD8, on the target-defaults placement's tgtd (tgt's default
parameters), the way a new user meets both. The job tables measure the same pair once per
repetition, minutes apart, where one binary's rate moves ±15 % between runs on this host; the
0.95 verdict needs the pairs.

Before the pairs both gateways serve a 4 KiB random read pass over the working set, so the
default mode's cache holds pages of the range its 1 MiB requests cross, as it does in the tables
after their random jobs. Ratio = default / cache off (above 1: the default mode is faster);
goal ≥ 0.95, or the upper quartile ≥ 0.95 and the gateway's CPU per request default / off
≤ 1 / 0.95 (ab.met).
"""
import os

import ab  # noqa: E402  (beside this file)

NAME = "default-ab"  # for --systems
DEFAULT, OFF = "iser-blk-default", "iser-blk-cache-off"
JOBS = ("seqread-1m-qd8", "seqwrite-1m-qd8")
TARGET = 0.95


def run(bench, a, tgt, work, rep, preexec=None):
    """One repetition of the A/B; returns rows (marked ab=NAME, kept out of the job tables)."""
    jobs = [(n, args) for n, args, _ in bench.JOBS if n in JOBS and (not a.jobs or n in a.jobs.split(","))]
    if not jobs or a.default_ab_pairs <= 0:
        return []

    def start(name, extra):
        sock = os.path.join(work, f"{name}.sock")
        argv = [bench.BIN, "serve", "--target", tgt.url, "--listen", f"unix://{sock}", *extra]
        return bench.NBDServer(name, argv, sock, work, preexec=preexec)
    servers = {}
    try:
        servers[DEFAULT] = start(DEFAULT, ())
        servers[OFF] = start(OFF, ("--cache", "off"))
        for s in servers.values():
            bench.fio(s.uri, "prefill", dict(rw="randread", bs="4k", iodepth=32, numjobs=1),
                      a.default_ab_runtime, a.size, work, preexec)
        return ab.interleave(bench, a, work, rep, servers, DEFAULT, OFF, jobs, a.default_ab_pairs,
                             a.default_ab_runtime, NAME, preexec=preexec,
                             placement="target-defaults")
    finally:
        for s in servers.values():
            s.stop()


def report(bench, rows):
    """The A/B's section: per job, the median ratio default / cache off and the CPU ratio."""
    rows = [r for r in rows if r.get("ab") == NAME]
    if not rows:
        return []
    out = ["\n## The default mode against cache off (issue 18), target with default settings, interleaved pairs\n",
           "Each pair is one run of each gateway, back to back, order alternating (test/bench/ab.py), "
           "after a 4 KiB random read pass on each. Speed = default / cache off (above 1: the default "
           f"mode is faster), goal ≥ {TARGET:g}; CPU = the gateway's CPU per request, default / cache "
           f"off (below 1: the default mode costs less). met: the speed's median reaches the goal, or its "
           f"upper quartile does and the CPU's median is ≤ {1 / TARGET:.3f}. Spread: "
           "min–max and interquartile range over every pair of every repetition.\n"]
    return out + ab.speed_table(bench, rows, JOBS, DEFAULT, OFF, TARGET, "default", "cache off", digits=0)

