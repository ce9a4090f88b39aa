"""The table of `make bench-vm`'s initiator comparison (test/bench/vm-iser.sh): from the guest's
fio JSON files OUTDIR/guest/<rep>-<job>-<system>.json (and the guest's CPU µs per I/O beside each
in .json.cpu), per job and system the median over the repetitions with min–max of IOPS, MiB/s,
p50 latency and CPU per I/O, and the ratios to the kernel's initiator of the same transport
(iser systems to kernel-iser, TCP systems to kernel-tcp): throughput and IOPS as system/kernel
(higher is better), p50 and CPU as system/kernel (lower is better).

    python3 vm_iser.py OUTDIR
"""
import glob
import json
import os
import re
import statistics
import sys

JOBS = ["seqwrite-1m-qd8", "seqread-1m-qd8", "randread-4k-qd32", "randread-4k-qd1"]
SYSTEMS = ["iser-blk-iser", "kernel-iser", "iser-blk-tcp", "iser-blk-ublk-tcp", "iser-blk-ublk-tcp-workers",
           "kernel-tcp"]
NAME = re.compile(r"(\d+)-(.+)-(" + "|".join(re.escape(s) for s in SYSTEMS) + r")\.json$")


def reference(system):
    """The kernel initiator a system is compared with."""
    return "kernel-iser" if system.endswith("iser") else "kernel-tcp"


def load(out):
    """{(job, system): [dict(iops, mib, p50, cpu)]} from the guest's files."""
    runs = {}
    for f in sorted(glob.glob(os.path.join(out, "guest", "*.json"))):
        m = NAME.match(os.path.basename(f))
        if not m:
            continue
        _, job, system = m.groups()
        j = json.load(open(f))["jobs"][0]
        d = j["write"] if "write" in job else j["read"]
        cpu = calls = None
        if os.path.exists(f + ".cpu"):
            cpu = float(open(f + ".cpu").read())
        if os.path.exists(f + ".calls"):  # the gateway's read/write-class system calls in the run
            calls = int(open(f + ".calls").read()) / max(d.get("total_ios", 0), 1)
        p50 = d["clat_ns"].get("percentile", {}).get("50.000000", 0) / 1000
        runs.setdefault((job, system), []).append(
            dict(iops=d["iops"], mib=d["bw_bytes"] / 2**20, p50=p50, cpu=cpu, calls=calls))
    return runs


def med(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return (statistics.median(vals), min(vals), max(vals)) if vals else None


def cell(m, prec=1):
    return "–" if m is None else f"{m[0]:.{prec}f} [{m[1]:.{prec}f}–{m[2]:.{prec}f}]"


def ratio(a, b):
    return "–" if a is None or b is None or b[0] == 0 else f"{a[0] / b[0]:.2f}×"


def table(runs):
    lines = ["| job | system | IOPS | MiB/s | p50 µs | guest CPU µs/IO | gateway r/w syscalls/IO | "
             "vs kernel: speed | p50 | CPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for job in JOBS:
        for s in SYSTEMS:
            v = runs.get((job, s))
            if not v:
                continue
            ref = runs.get((job, reference(s)), [])
            mib, p50, cpu = med(v, "mib"), med(v, "p50"), med(v, "cpu")
            lines.append(f"| {job} | {s} | {cell(med(v, 'iops'))} | {cell(mib)} | {cell(p50)} | {cell(cpu)} | "
                         f"{cell(med(v, 'calls'), 2)} | "
                         f"{ratio(mib, med(ref, 'mib'))} | {ratio(p50, med(ref, 'p50'))} | "
                         f"{ratio(cpu, med(ref, 'cpu'))} |")
    reps = max((len(v) for v in runs.values()), default=0)
    lines.append("")
    lines.append(f"{reps} repetition(s) per cell; ratios are of the medians, to kernel-iser for the iSER "
                 "systems and to kernel-tcp for the TCP ones. Gateway r/w syscalls: the gateway's read- "
                 "and write-class system calls per I/O (/proc/PID/io syscr + syscw; io_uring_enter and "
                 "epoll waits are not counted).")
    return lines


if __name__ == "__main__":
    print("\n".join(table(load(sys.argv[1]))))
