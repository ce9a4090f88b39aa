"""Interleaved A/B of gateway binaries and cache modes on the default mode's read path (issue 37),
small enough to run by hand beside other work (`make bench` runs the whole suite):

    python3 test/bench/mode_ab.py \\
        before-wb=/tmp/iser-blk-before:writeback,after-wb=bin/iser-blk:writeback,off=bin/iser-blk:off \\
        randread-4k-qd1-cold,seqread-1m-qd8 6 3 results.json

Systems are name=binary:cache-mode[:--flag=value...], each a `serve` on a unix socket in front of one tgtd with tgt's
default parameters (bench.Tgtd, tuned=False) on /dev/shm; the client is fio's nbd engine. Before
the pairs every system serves a 4 KiB random read pass (as default_ab.py does). Each pair runs
every system once, the order rotated from pair to pair, so that a drift in the host's speed falls
on all alike. The gateway's CPU comes from /proc/PID/task/*/schedstat (nanoseconds, every thread)
around each run, and its minor page faults (/proc/PID/stat) per I/O: a miss that fills a cache
page never used before faults that page in. A cold 4 KiB QD1 run reads COLD_IOS blocks of a
REGION_MB region that no system has read before (fio's random map reads each block at most once),
so with the cache on almost every read is a miss: the runs stop at COLD_IOS because a random read
that lands right after a recent one looks sequential to the cache, which then reads 512 KiB ahead,
and as a random map nears its end such neighbours become common (a whole 32 MiB region read this
way was 29 % hits, 3,000 reads of 64 MiB 2 %). Results,
one row per run, go to the JSON file; the summary printed at the end gives, per job and system,
the median and the median of the per-pair ratios to the last system, with their range.
"""
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (beside this file)

JOBS = {"seqread-1m-qd8": dict(rw="read", bs="1m", iodepth=8, numjobs=1),
        "seqwrite-1m-qd8": dict(rw="write", bs="1m", iodepth=8, numjobs=1),
        "randread-4k-qd1-cold": dict(rw="randread", bs="4k", iodepth=1, numjobs=1),
        # issue 39: a commit, a 4 KiB write followed by a FLUSH (fio's fsync=1 on the nbd engine)
        "write-4k-qd1-fsync": dict(rw="randwrite", bs="4k", iodepth=1, numjobs=1, fsync=1)}
LUN_MB, REGION_MB, COLD_IOS, WORKING_SET = 4096, 64, 3000, "512m"


def cold_run(args, region):
    """The fio arguments and size of a cold run in the region-th REGION_MB range of the LUN: at
    most COLD_IOS reads (see above), the runtime only a bound."""
    return dict(args, offset=f"{region * REGION_MB}m", time_based=0, number_ios=COLD_IOS), f"{REGION_MB}m"


def cpu_ns(pid):
    """CPU time of every thread of pid so far, in nanoseconds (schedstat's first field)."""
    t = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                t += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return t


def minor_faults(pid):
    """Minor page faults of pid so far, every thread (/proc/PID/stat's minflt, field 10). A read
    miss into a cache page never used before faults the page in: that is how many did."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def run(systems, jobs, pairs, runtime):
    work = tempfile.mkdtemp(prefix="mode-ab-")
    tgt = bench.Tgtd(work, LUN_MB, tuned=False)
    servers, rows, region = {}, [], int(WORKING_SET[:-1]) // REGION_MB
    try:
        for name, spec in systems.items():
            binary, mode, *extra = spec.split(":")
            sock = os.path.join(work, name + ".sock")
            servers[name] = bench.NBDServer(name, [binary, "serve", "--target", tgt.url, "--listen",
                                                   f"unix://{sock}", "--cache", mode, *extra], sock, work)
        names = list(systems)
        for s in names:
            bench.fio(servers[s].uri, "prefill", dict(rw="randread", bs="4k", iodepth=32, numjobs=1),
                      3, WORKING_SET, work)
        for job in jobs:
            for pair in range(pairs):
                k = pair % len(names)
                for s in names[k:] + names[:k]:
                    pid = servers[s].proc.pid
                    args, size = dict(JOBS[job]), WORKING_SET
                    if job.endswith("-cold"):
                        if (region + 1) * REGION_MB > LUN_MB:
                            raise SystemExit(f"the {LUN_MB} MiB LUN has no cold region left: fewer pairs")
                        args, size = cold_run(args, region)
                        region += 1
                    load = os.getloadavg()[0]
                    c0, f0 = cpu_ns(pid), minor_faults(pid)
                    m = bench.fio(servers[s].uri, job, args, runtime, size, work)
                    c1, f1 = cpu_ns(pid), minor_faults(pid)
                    if bench.writes(args):
                        bench.flush(servers[s].uri)  # untimed: no run pays an earlier one's write-back
                    m.update(system=s, job=job, pair=pair, load1=load,
                             gw_cpu_us_per_io=(c1 - c0) / 1e3 / max(m["ios"], 1),
                             gw_minflt_per_io=(f1 - f0) / max(m["ios"], 1))
                    m["gw_cpu_us_per_mib"] = m["gw_cpu_us_per_io"] * (1 if "1m" in job else 256)
                    if "fsync" in args:  # one write and one FLUSH per I/O: the commit's whole cost
                        m["commit_us"] = 1e6 / max(m["iops"], 1e-9)
                    rows.append(m)
                    bench.log(f"{job} pair {pair} {s:12s} {m['bw_mib']:7.1f} MiB/s p50 {m['p50_us']:8.1f} µs "
                              f"CPU {m['gw_cpu_us_per_io']:7.1f} µs/IO load {load:.1f} errors {m['errors']}")
    finally:
        for s in servers.values():
            s.stop()
        tgt.stop()
    return dict(systems=systems, jobs=jobs, pairs=pairs, runtime=runtime, tgt=tgt.params, rows=rows)


def summary(d):
    """Per job and system: the median, and the medians (min–max) of the per-pair ratios to the
    last system, of the job's metric and of the gateway's CPU per I/O."""
    names, ref = list(d["systems"]), list(d["systems"])[-1]
    out = []
    for job in d["jobs"]:
        key = "commit_us" if "fsync" in job else "p50_us" if "qd1" in job else "bw_mib"
        by = {}
        for r in d["rows"]:
            if r["job"] == job:
                by.setdefault(r["pair"], {})[r["system"]] = r
        full = [p for p in by.values() if all(s in p for s in names)]
        out.append(f"{job}: {key} and CPU µs/IO, ratios to {ref} per pair: median (min–max), {len(full)} pairs")
        for s in names:
            v = [p[s][key] for p in full]
            cpu = [p[s]["gw_cpu_us_per_io"] for p in full]
            rat = [p[s][key] / p[ref][key] for p in full]
            crat = [p[s]["gw_cpu_us_per_io"] / p[ref]["gw_cpu_us_per_io"] for p in full]
            faults = [p[s]["gw_minflt_per_io"] for p in full if "gw_minflt_per_io" in p[s]]
            out.append(f"  {s:12s} {statistics.median(v):8.1f} ratio {statistics.median(rat):.3f} "
                       f"({min(rat):.3f}–{max(rat):.3f})  CPU {statistics.median(cpu):7.1f} ratio "
                       f"{statistics.median(crat):.3f} ({min(crat):.3f}–{max(crat):.3f})"
                       + (f"  faults/IO {statistics.median(faults):.2f}" if faults else ""))
    return "\n".join(out)


def main():
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    systems = dict(s.split("=", 1) for s in sys.argv[1].split(","))
    jobs = sys.argv[2].split(",")
    for j in jobs:
        if j not in JOBS:
            raise SystemExit(f"unknown job {j!r} ({', '.join(JOBS)})")
    d = run(systems, jobs, int(sys.argv[3]), int(sys.argv[4]))
    with open(sys.argv[5], "w") as f:
        json.dump(d, f, indent=1)
    print(summary(d))


if __name__ == "__main__":
    main()
