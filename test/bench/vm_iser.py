"""The table of `make bench-vm`'s initiator comparison (test/bench/vm-iser.sh): from the guest's
fio JSON files OUTDIR/guest/<rep>-<job>-<system>.json (and the guest's CPU µs per I/O beside each
in .json.cpu), per job and system the median over the repetitions with min–max of IOPS, MiB/s,
p50 latency and CPU per I/O, and the ratios to the kernel's initiator of the same transport
(iser systems to kernel-iser, TCP systems to kernel-tcp): throughput and IOPS as system/kernel
(higher is better), p50 and CPU as system/kernel (lower is better). Then the bounds of issue 37's
ublk + iSCSI/TCP rows against kernel-tcp, from the two floors the guest also measures
(iser-blk-ublk-mem, kernel-ram) and what a MiB over loopback TCP costs (OUTDIR/guest/tcp-*.txt).

    python3 vm_iser.py OUTDIR
"""
import glob
import json
import os
import re
import statistics
import sys

JOBS = ["seqwrite-1m-qd8", "seqread-1m-qd8", "randread-4k-qd32", "randread-4k-qd1"]
SYSTEMS = ["iser-blk-iser", "iser-blk-ublk-iser", "kernel-iser", "iser-blk-tcp", "iser-blk-ublk-tcp",
           "iser-blk-ublk-tcp-workers", "kernel-tcp", "iser-blk-ublk-mem", "kernel-ram"]
# bench-iser.sh --ab-gomaxprocs N adds the ublk gateways again with GOMAXPROCS=N: SYSTEM-pN
VARIANT = re.compile(r"iser-blk-ublk-(?:tcp|iser)-p\d+")
NAME = re.compile(r"(\d+)-(.+)-(" + "|".join(re.escape(s) for s in SYSTEMS) + "|" + VARIANT.pattern + r")\.json$")


def reference(system):
    """The kernel initiator a system is compared with."""
    return "kernel-iser" if re.sub(r"-p\d+$", "", system).endswith("iser") else "kernel-tcp"


def systems(runs):
    """SYSTEMS, each followed by its --ab-gomaxprocs variants that ran."""
    out = []
    for s in SYSTEMS:
        out.append(s)
        out.extend(sorted({v for _, v in runs if v.startswith(s + "-p") and VARIANT.fullmatch(v)}))
    return out


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
        cpu = calls = ctr = None
        if os.path.exists(f + ".cpu"):
            cpu = float(open(f + ".cpu").read())
        if os.path.exists(f + ".ctr"):  # counters per I/O (bench-iser.sh's counters)
            ctr = json.load(open(f + ".ctr"))
        if os.path.exists(f + ".sched"):  # --sched: switches into each task per I/O
            sc = json.load(open(f + ".sched"))
            ctr = dict(ctr or {}, sched=dict(sc["into"], total=sum(sc["into"].values()),
                                             overrun=sc["overrun"]))
        if os.path.exists(f + ".calls"):  # the gateway's read/write-class system calls in the run
            calls = int(open(f + ".calls").read()) / max(d.get("total_ios", 0), 1)
        # the total latency where the guest recorded its percentiles (lat_percentiles=1): a ublk
        # device does part of its work inside io_submit, which clat does not see
        lat = d["lat_ns"] if d.get("lat_ns", {}).get("percentile") else d["clat_ns"]
        p50 = lat.get("percentile", {}).get("50.000000", 0) / 1000
        runs.setdefault((job, system), []).append(
            dict(iops=d["iops"], mib=d["bw_bytes"] / 2**20, p50=p50, cpu=cpu, calls=calls, **flat(ctr)))
    return runs


# The counters table's columns: key in a run, heading.
COUNTERS = [("ctxt", "context switches"), ("sent_pkts", "RoCE pkts sent"), ("rcvd_pkts", "RoCE pkts rcvd"),
            ("rdma.send_work_requests", "send WRs"), ("rdma.send_posts", "send posts"),
            ("rdma.recv_work_requests", "recv WRs"), ("rdma.recv_posts", "recv posts"),
            ("rdma.completions", "completions"), ("rdma.completion_events", "CQ events")]


def flat(ctr, prefix=""):
    """{"rdma": {"send_posts": x}} → {"rdma.send_posts": x}; None → {}."""
    out = {}
    for k, v in (ctr or {}).items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def counters_table(runs):
    """Per job and system, the median per I/O of each counter the guest recorded (issue 37: why
    the kernel's ib_iser is ahead, with counters before any change)."""
    if not any(r.get("ctxt") is not None for v in runs.values() for r in v):
        return []
    lines = ["| job | system | " + " | ".join(h for _, h in COUNTERS) + " |",
             "| --- | --- |" + " --- |" * len(COUNTERS)]
    for job in JOBS:
        for s in systems(runs):
            v = runs.get((job, s))
            if not v:
                continue
            cells = []
            for k, _ in COUNTERS:
                m = med(v, k)
                cells.append("–" if m is None else f"{m[0]:.2f}")
            lines.append(f"| {job} | {s} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Per I/O, medians over the repetitions: the whole guest's context switches (/proc/stat ctxt), "
                 "the soft-RoCE device's packets (every iSER initiator's traffic crosses it; the TCP "
                 "systems' do not), and for the iser-blk iSER gateways their verbs work (status --json's "
                 "rdma: work requests, the posts that carried them, completions polled, completion-channel "
                 "events, i.e. poller wake-ups).")
    return lines


# The switches table's tasks: the gateways' threads (all named iser-blk), the idle task, the
# kernel's workers, the client; every other task is in "others".
SCHED_TASKS = [("iser-blk", "gateway threads"), ("swapper", "idle"), ("kworker", "kworker"), ("fio", "fio")]


def sched_table(runs):
    """With bench-iser.sh --sched: per job and system, the median per I/O of the context switches
    into each task (issue 37: which threads a request wakes, and how often)."""
    if not any(r.get("sched.total") is not None for v in runs.values() for r in v):
        return []
    lines = ["| job | system | all | " + " | ".join(h for _, h in SCHED_TASKS) + " | others | events lost |",
             "| --- | --- | --- |" + " --- |" * (len(SCHED_TASKS) + 2)]
    named = {"sched." + t for t, _ in SCHED_TASKS} | {"sched.total", "sched.overrun"}
    for job in JOBS:
        for s in systems(runs):
            v = [r for r in runs.get((job, s), []) if r.get("sched.total") is not None]
            if not v:
                continue
            # per run, each column's value (a task the run never switched to: 0), runs left as they are
            cols = [dict({"sched." + t: r.get("sched." + t, 0.0) for t, _ in SCHED_TASKS},
                         **{"sched.total": r["sched.total"],
                            "sched.others": sum(x for k, x in r.items() if k.startswith("sched.") and k not in named)})
                    for r in v]
            cells = []
            for k in ["total"] + [t for t, _ in SCHED_TASKS] + ["others"]:
                cells.append(f"{med(cols, 'sched.' + k)[0]:.2f}")
            cells.append(str(max(int(r["sched.overrun"]) for r in v)))
            lines.append(f"| {job} | {s} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Per I/O, medians over the repetitions: the guest's context switches (tracefs "
                 "sched_switch) by the task switched to. A traced run's speeds are not those of an "
                 "untraced one; \"events lost\" > 0 makes its row an undercount.")
    return lines


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
        for s in systems(runs):
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


def load_tcp(out):
    """What a MiB over loopback TCP between two processes costs, per repetition: (send, receive)
    µs of CPU."""
    return [tuple(float(x) for x in open(f).read().split()[:2])
            for f in sorted(glob.glob(os.path.join(out, "guest", "tcp-*.txt")))]


def bounds(runs, tcps=()):
    """Issue 37's rows for ublk + iSCSI/TCP against kernel-tcp, each beside the bound the machine
    sets, from medians. The gateway and the kernel initiator share the guest's vCPUs with LIO, and
    in these jobs the guest is busy (the busy vCPUs column), so CPU per I/O sets the speed.

    - 1 MiB write: the gateway costs at least what a ublk gateway with a free backend costs
      (iser-blk-ublk-mem: the request's round trip and ublk's copy) plus sending the MiB from its
      memory into a TCP socket (the sender's half of a MiB between two processes over loopback
      TCP); LIO's work is left out, so the floor is low. iscsi_tcp pays neither part: it sends
      the bio's pages. 1 MiB read: the same with the receiver's half.
    - 4 KiB QD1 p50: a gateway answers no faster than a ublk gateway whose backend costs nothing
      (iser-blk-ublk-mem): a sound floor. The estimate adds what the network and the target add
      to the kernel's own path: p50(ublk-mem) + p50(kernel-tcp) − p50(kernel-ram).
    - 4 KiB QD32: the same estimate for CPU per I/O, cpu(ublk-mem) + cpu(kernel-tcp) −
      cpu(kernel-ram); the IOPS bound is kernel-tcp's IOPS × its CPU per I/O / that estimate.
      Over iSER the same, with iser-blk-ublk-iser against kernel-iser.
    """
    def m(job, system, key):
        v = med(runs.get((job, system), []), key)
        return None if v is None else v[0]

    gw, k, mem, ram = "iser-blk-ublk-tcp", "kernel-tcp", "iser-blk-ublk-mem", "kernel-ram"
    lines = ["| row | goal | measured | bound | gap to the bound | how the bound is made |",
             "| --- | --- | --- | --- | --- | --- |"]
    send = statistics.median(t[0] for t in tcps) if tcps else None
    recv = statistics.median(t[1] for t in tcps) if tcps else None

    def busy(job, system):
        c, i = m(job, system, "cpu"), m(job, system, "iops")
        return None if c is None or i is None else c * i / 1e6

    def row(name, goal, measured, bound, how, higher_better):
        if measured is None or bound is None:
            lines.append(f"| {name} | {goal} | – | – | – | {how} |")
            return
        gap = measured / bound if higher_better else bound / measured
        lines.append(f"| {name} | {goal} | {measured:.2f}× | {bound:.2f}× | {gap:.2f} | {how} |")

    for job, half, side in (("seqwrite-1m-qd8", send, "send"), ("seqread-1m-qd8", recv, "receive")):
        kc, gc, mc = m(job, k, "cpu"), m(job, gw, "cpu"), m(job, mem, "cpu")
        ki, gi = m(job, k, "mib"), m(job, gw, "mib")
        floor = None if None in (half, mc) else mc + half
        row(f"{job}: speed", "≥ 1.0×", None if gi is None or not ki else gi / ki,
            None if floor is None or kc is None else min(kc / floor, 1.0),
            f"CPU-bound (busy vCPUs: kernel {fmt(busy(job, k))}, gateway {fmt(busy(job, gw))}); "
            f"gateway CPU floor {fmt(floor, 0)} µs per I/O = {mem} {fmt(mc, 0)} + TCP {side} {fmt(half, 0)}, "
            f"kernel {fmt(kc, 0)}", True)
        row(f"{job}: CPU per I/O", "–", None if gc is None or not kc else gc / kc,
            None if floor is None or not kc else max(floor / kc, 1.0), f"gateway {fmt(gc, 0)} µs against the floor",
            False)
    job = "randread-4k-qd1"
    kp, gp, mp, rp = (m(job, s, "p50") for s in (k, gw, mem, ram))
    row(f"{job}: p50 (sound)", "≤ 1.1×", None if gp is None or not kp else gp / kp,
        None if mp is None or not kp else mp / kp, f"p50 of {mem} {fmt(mp, 0)} µs, kernel {fmt(kp, 0)} µs", False)
    est = None if None in (mp, kp, rp) else mp + kp - rp
    row(f"{job}: p50 (estimate)", "≤ 1.1×", None if gp is None or not kp else gp / kp,
        None if est is None else est / kp, f"{mem} + kernel-tcp − kernel-ram ({fmt(rp, 0)} µs) = {fmt(est, 0)} µs", False)
    job = "randread-4k-qd32"
    for g, kern, over in ((gw, k, ""), ("iser-blk-ublk-iser", "kernel-iser", " over iSER")):
        kc, gc, mc, rc = (m(job, s, "cpu") for s in (kern, g, mem, ram))
        est = None if None in (kc, mc, rc) else mc + kc - rc
        gi, ki = m(job, g, "iops"), m(job, kern, "iops")
        row(f"{job}{over}: IOPS (estimate)", "≥ 1.0×", None if gi is None or not ki else gi / ki,
            None if est is None else kc / est,
            f"CPU-bound (busy vCPUs: kernel {fmt(busy(job, kern))}, gateway {fmt(busy(job, g))}); "
            f"CPU floor {fmt(est, 0)} µs = {mem} {fmt(mc, 0)} + kernel {fmt(kc, 0)} − kernel-ram {fmt(rc, 0)}", True)
        row(f"{job}{over}: CPU per I/O (estimate)", "≤ 1.0×", None if gc is None or not kc else gc / kc,
            None if est is None or not kc else est / kc, f"gateway {fmt(gc, 0)} µs against the floor", False)
    lines.append("")
    lines.append(f"A MiB over loopback TCP between two processes: {fmt(send, 0)} µs of guest CPU to send, "
                 f"{fmt(recv, 0)} to receive (medians of {len(tcps)}). Ratios are "
                 f"{gw} / kernel-tcp (rows over iSER: iser-blk-ublk-iser / kernel-iser); gap = measured / "
                 "bound for speed, bound / measured for p50 and CPU "
                 "(1.00 = at the bound). A sound bound holds whatever the gateway does; an estimate adds "
                 "measured parts and can be beaten by overlapping them.")
    return lines


def fmt(v, prec=2):
    return "–" if v is None else f"{v:.{prec}f}"


if __name__ == "__main__":
    out = sys.argv[1]
    runs = load(out)
    print("\n".join(table(runs)))
    print()
    ct = counters_table(runs)
    if ct:
        print("\n".join(ct))
        print()
    st = sched_table(runs)
    if st:
        print("\n".join(st))
        print()
    print("\n".join(bounds(runs, load_tcp(out))))
