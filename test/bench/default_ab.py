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

Issue 18's third goal, a cold 4 KiB random read at QD1 with a p50 at most 1.03× cache off's, is
paired the same way (issue 37 restates it): the job tables measure it once per repetition, on a
gateway started for the tables. Each pair reads COLD_IOS blocks of a COLD_MB range past the
working set that neither gateway has read since it started (mode_ab.py says why so few: about
2 % of them are then hits of a read-ahead), so that nearly every read of the default mode is a
miss; the ratio is cache off's p50 / the default's, so the goal is ≥ 1 / 1.03.
"""
import os

import ab  # noqa: E402  (beside this file)
import curves  # noqa: E402  (beside this file)

NAME = "default-ab"  # for --systems
DEFAULT, OFF = "iser-blk-default", "iser-blk-cache-off"
JOBS = ("seqread-1m-qd8", "seqwrite-1m-qd8")
TARGET = 0.95
COLD, COLD_TARGET, COLD_MB, COLD_IOS = "randread-4k-qd1", 1 / 1.03, 64, 3000


def cold_region(a):
    """region() for ab.interleave: pair k of a repetition reads COLD_IOS blocks of [working set +
    k COLD_MB, +COLD_MB), each at most once. The gateways are started afresh for each repetition,
    so each starts cold again."""
    base = curves.size_mib(a.size)

    def region(job, args, pair):
        return (dict(args, offset=f"{base + pair * COLD_MB}m", time_based=0, number_ios=COLD_IOS),
                f"{COLD_MB}m")
    return region


def cold_room(a):
    """Whether the LUN has a cold range for every pair of a repetition."""
    return curves.size_mib(a.size) + a.default_ab_pairs * COLD_MB <= a.lun_mb


def run(bench, a, tgt, work, rep, preexec=None):
    """One repetition of the A/B; returns rows (marked ab=NAME, kept out of the job tables)."""
    wanted = [(n, args) for n, args, _ in bench.JOBS if not a.jobs or n in a.jobs.split(",")]
    jobs = [(n, args) for n, args in wanted if n in JOBS]
    cold = [(n, args) for n, args in wanted if n == COLD]
    if cold and not cold_room(a):
        bench.log(f"   {NAME}: no cold {COLD} pairs: the {a.lun_mb} MiB LUN has no {COLD_MB} MiB range "
                  f"past the {a.size} working set for each of {a.default_ab_pairs} pairs")
        cold = []
    if not (jobs or cold) or a.default_ab_pairs <= 0:
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
        rows = ab.interleave(bench, a, work, rep, servers, DEFAULT, OFF, jobs, a.default_ab_pairs,
                             a.default_ab_runtime, NAME, preexec=preexec,
                             placement="target-defaults")
        return rows + ab.interleave(bench, a, work, rep, servers, DEFAULT, OFF, cold, a.default_ab_pairs,
                                    a.default_ab_runtime, NAME, preexec=preexec,
                                    placement="target-defaults", region=cold_region(a))
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
           "min–max and interquartile range over every pair of every repetition. "
           f"{COLD}: a cold read (each pair {COLD_IOS} reads of a {COLD_MB} MiB range neither gateway has "
           "read), speed = "
           f"cache off's p50 / the default's, goal ≥ {COLD_TARGET:.3f} (p50 ≤ 1.03× cache off's).\n"]
    out += ab.speed_table(bench, rows, JOBS, DEFAULT, OFF, TARGET, "default", "cache off", digits=0)
    cs, ok = ab.cells(bench, rows, COLD, DEFAULT, OFF, COLD_TARGET, digits=1)
    if cs is not None:
        out.append(ab.table_row(cs, "yes" if ok else "no"))
    return out

