"""Which of a gateway's threads a request wakes, and who wakes them: from the trace that
bench-iser.sh --sched keeps (OUTDIR/guest/<rep>-<job>-<system>.json.trace.gz, tracefs text of
sched_switch and sched_wakeup), per I/O of that run: the switches into each thread of the
gateway (all named iser-blk), the wake-ups of those threads by waker ("irq on X": an interrupt,
hard or soft, that came while X ran, <idle> being an idle CPU; "iser-blk tid N": another of the
gateway's threads; else the task that woke it), and for the thread switched into most, the gaps
between its wake-ups by interrupt (a thread woken by a timer at a steady pace is a sleeper's
tick, such as the Go runtime's sysmon).

    python3 sched_threads.py TRACE.gz IOS [COMM]     (and, where the trace has them, the
                                                 system calls of COMM's threads per I/O)
    python3 sched_threads.py --tally TRACE     (the guest: "COUNT TASK" lines, as uniq -c)
"""
import collections
import gzip
import re
import sys

FIELD = re.compile(r"(\w+)=(\S+)")


LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+(\S+)\s+([\d.]+): (sched_\w+): (.*)$")


def task(comm):
    """A task's name without CPU and worker numbers (kworker/1:2H → kworker), as bench-iser.sh's
    tally names it."""
    return re.sub(r"-*\d+$", "", re.sub(r"[/:].*", "", comm))


def tally(lines):
    """The context switches of a trace by the task switched to (task names): what bench-iser.sh
    --sched writes, per run, into .json.switches."""
    into = collections.Counter()
    for line in lines:
        m = LINE.match(line)
        if m and m.group(6) == "sched_switch":
            kv = dict(FIELD.findall(m.group(7).replace(" ==> ", " ")))
            into[task(kv["next_comm"])] += 1
    return into


def analyse(lines, comm="iser-blk"):
    """(switches into each thread of comm by TID, wake-ups of comm's threads by (waker, TID),
    the times of each thread's wake-ups by interrupt by TID)."""
    into, wakes, irq_times = collections.Counter(), collections.Counter(), collections.defaultdict(list)
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        cur, cur_pid, _, flags, ts, event, rest = m.groups()
        kv = dict(FIELD.findall(rest.replace(" ==> ", " ")))
        if event == "sched_switch" and kv.get("next_comm") == comm:
            into[kv["next_pid"]] += 1
        elif event == "sched_wakeup" and kv.get("comm") == comm:
            # the flags' third character: h/H hard interrupt, s/S softirq (tracefs's irq-info)
            if len(flags) > 2 and flags[2] in "hHsS":
                waker = "irq on " + task(cur)
                irq_times[kv["pid"]].append(float(ts))
            elif cur == comm:
                waker = f"{comm} tid {cur_pid}"
            else:
                waker = task(cur)
            wakes[(waker, kv["pid"])] += 1
    return into, wakes, irq_times


SYSCALL = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+[\d.]+: sys_enter: NR (\d+) ")

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl) of the calls a gateway makes
SYSCALL_NAMES = {
    0: "read", 1: "write", 7: "poll", 9: "mmap", 10: "mprotect", 11: "munmap", 13: "rt_sigaction",
    14: "rt_sigprocmask", 15: "rt_sigreturn", 16: "ioctl", 19: "readv", 20: "writev",
    24: "sched_yield", 28: "madvise", 35: "nanosleep", 39: "getpid", 44: "sendto", 45: "recvfrom",
    46: "sendmsg", 47: "recvmsg", 186: "gettid", 202: "futex", 228: "clock_gettime",
    232: "epoll_wait", 233: "epoll_ctl", 234: "tgkill", 270: "pselect6", 271: "ppoll",
    275: "splice", 281: "epoll_pwait", 426: "io_uring_enter", 441: "epoll_pwait2",
}


def syscalls(lines, comm="iser-blk"):
    """The system calls comm's threads entered (raw_syscalls:sys_enter, which bench-iser.sh
    --sched records for tasks named comm), by name ("NR n" for one not in SYSCALL_NAMES)."""
    calls = collections.Counter()
    for line in lines:
        m = SYSCALL.match(line)
        if m and m.group(1) == comm:
            nr = int(m.group(3))
            calls[SYSCALL_NAMES.get(nr, f"NR {nr}")] += 1
    return calls


def gaps(times):
    """(p10, p50, p90) in µs of the intervals between successive times, None for fewer than 2."""
    d = sorted((b - a) * 1e6 for a, b in zip(times, times[1:]))
    if not d:
        return None
    return tuple(d[min(int(len(d) * q), len(d) - 1)] for q in (0.1, 0.5, 0.9))


def report_syscalls(calls, ios, top=10):
    """Lines for calls per I/O, the commonest first; none without any (a trace without the
    system-call event)."""
    if not calls:
        return []
    out = [f"system calls of the gateway's threads per I/O: {sum(calls.values()) / ios:.2f}, by call:"]
    return out + [f"  {name}: {n / ios:.2f}" for name, n in calls.most_common(top)]


def report(into, wakes, irq_times, ios, top=8):
    out = ["switches into the gateway's threads per I/O, by TID:"]
    out += [f"  {tid}: {n / ios:.2f}" for tid, n in into.most_common(top)]
    out.append("wake-ups of the gateway's threads per I/O, by (waker, TID):")
    out += [f"  {w} -> {tid}: {n / ios:.2f}" for (w, tid), n in wakes.most_common(top)]
    if into:
        tid = into.most_common(1)[0][0]
        g = gaps(irq_times.get(tid, []))
        if g:
            out.append(f"TID {tid}: µs between its wake-ups by interrupt: p10 {g[0]:.0f}, p50 {g[1]:.0f}, p90 {g[2]:.0f}")
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--tally":
        with open(sys.argv[2]) as f:
            print("\n".join(f"{n} {t}" for t, n in sorted(tally(f).items())))
        sys.exit(0)
    path, ios = sys.argv[1], float(sys.argv[2])
    comm = sys.argv[3] if len(sys.argv) > 3 else "iser-blk"
    with gzip.open(path, "rt") as f:
        lines = f.readlines()
    into, wakes, irq_times = analyse(lines, comm)
    print("\n".join(report(into, wakes, irq_times, ios) + report_syscalls(syscalls(lines, comm), ios)))
