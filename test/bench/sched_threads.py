"""Which of a gateway's threads a request wakes, and who wakes them: from the trace that
bench-iser.sh --sched keeps (OUTDIR/guest/<rep>-<job>-<system>.json.trace.gz, tracefs text of
sched_switch and sched_wakeup), per I/O of that run: the switches into each thread of the
gateway (all named iser-blk), and the wake-ups of those threads by waker (<idle>: an interrupt
on an idle CPU, i.e. a timer or a device; "iser-blk tid N": another of the gateway's threads).

    python3 sched_threads.py TRACE.gz IOS [COMM]
"""
import collections
import gzip
import re
import sys

LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (sched_\w+): (.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")


def task(comm):
    """A task's name without CPU and worker numbers: kworker/1:2H → kworker."""
    return re.sub(r"[/:].*|-*\d+$", "", comm)


def analyse(lines, comm="iser-blk"):
    """(switches into each thread of comm by TID, wake-ups of comm's threads by (waker, TID))."""
    into, wakes = collections.Counter(), collections.Counter()
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        cur, cur_pid, _, _, event, rest = m.groups()
        kv = dict(FIELD.findall(rest.replace(" ==> ", " ")))
        if event == "sched_switch" and kv.get("next_comm") == comm:
            into[kv["next_pid"]] += 1
        elif event == "sched_wakeup" and kv.get("comm") == comm:
            waker = f"{comm} tid {cur_pid}" if cur == comm else task(cur)
            wakes[(waker, kv["pid"])] += 1
    return into, wakes


def report(into, wakes, ios, top=8):
    out = ["switches into the gateway's threads per I/O, by TID:"]
    out += [f"  {tid}: {n / ios:.2f}" for tid, n in into.most_common(top)]
    out.append("wake-ups of the gateway's threads per I/O, by (waker, TID):")
    out += [f"  {w} -> {tid}: {n / ios:.2f}" for (w, tid), n in wakes.most_common(top)]
    return out


if __name__ == "__main__":
    path, ios = sys.argv[1], float(sys.argv[2])
    comm = sys.argv[3] if len(sys.argv) > 3 else "iser-blk"
    with gzip.open(path, "rt") as f:
        print("\n".join(report(*analyse(f, comm), ios)))
