"""Interleaved A/B runs for make bench: two gateways up side by side, short runs of the same job
alternating between them, the order flipped every pair (A, B, then B, A) so that a drift in the
host's speed falls on both alike. Each pair gives one ratio; a verdict rests on the median over
every pair of every repetition, reported with min–max and the interquartile range, so one
disturbed run cannot decide it. On this 2-core host one binary's rate moves ±15 % between runs;
the gateway's CPU per request (its /proc stat around each run) is steadier and is reported
beside the rate.

Used by metrics_ab.py (issue 16: metrics served against not), release_ab.py (issue 15: this
tree against --alt-bin) and default_ab.py (issue 18: the default mode against cache off).
"""
import math
import os
import statistics


def interleave(bench, a, work, rep, servers, first, second, jobs, pairs, runtime, tag, before=None,
               after=None, preexec=None, placement="shared", pair0=0, region=None):
    """Runs pairs alternating pairs of every job on servers[first] and servers[second] (NBDServer)
    and returns one row per run, marked ab=tag. before(system) may start something for the run
    and returns what after(system, it) gets; after returns fields added to the row. Pairs are
    numbered from pair0, so that rounds on freshly started servers (release_ab) add up.
    region(job, args, pair), where given, returns the fio arguments and size both runs of a pair
    use instead of args and a.size (default_ab's cold reads: a range neither gateway has read)."""
    rows = []
    for job, args in jobs:
        key = bench.metric_of(job)
        for pair in range(pair0, pair0 + pairs):
            order = (first, second) if pair % 2 == 0 else (second, first)
            run_args, size = region(job, args, pair) if region else (args, a.size)
            got = {}
            for system in order:
                stale = os.path.join(work, f"fio-{job}.json")  # never read the other run's output
                if os.path.exists(stale):
                    os.unlink(stale)
                it = before(system) if before else None
                pid = servers[system].proc.pid
                c0, (s0, y0) = bench.cpu_seconds(pid), bench.switches_and_syscalls(pid)
                m = bench.fio(servers[system].uri, job, run_args, runtime, size, work, preexec)
                c1, (s1, y1) = bench.cpu_seconds(pid), bench.switches_and_syscalls(pid)
                if bench.writes(run_args):
                    bench.flush(servers[system].uri)  # untimed: no run pays an earlier one's backlog
                m.update(ab=tag, rep=rep, placement=placement, system=system, job=job, pair=pair,
                         gw_cpu_us_per_io=(c1 - c0) * 1e6 / max(m["ios"], 1),
                         gw_switches_per_io=(s1 - s0) / max(m["ios"], 1),
                         gw_syscalls_per_io=(y1 - y0) / max(m["ios"], 1))
                if after:
                    m.update(after(system, it))
                rows.append(m)
                got[system] = m[key]
            bench.log(f"   {tag} {job:18s} pair {pair + 1}: {first} {got[first]:9.1f} "
                      f"{second} {got[second]:9.1f} ratio {ratio(key, got[first], got[second]):.3f}")
    return rows


def ratio(key, x, y):
    """How much better x is than y: x / y for a rate, y / x for a latency (p50), so that above 1
    is better either way."""
    if key == "p50_us":
        return y / x if x else 0
    return x / y if y else 0


def ratios(rows, job, key, first, second, better=True):
    """first against second for every pair of job: ratio() when better, else plainly x / y (for
    costs such as CPU per request, where below 1 is better)."""
    by = {}
    for r in rows:
        if r["job"] == job:
            by.setdefault((r["rep"], r["pair"]), {})[r["system"]] = r.get(key)
    out = []
    for p in by.values():
        x, y = p.get(first), p.get(second)
        if x is None or not y:
            continue
        out.append(ratio(key, x, y) if better else x / y)
    return out


def spread(rs):
    """median, min–max and interquartile range of ratios, as report cells."""
    q = statistics.quantiles(rs, n=4, method="inclusive") if len(rs) >= 2 else [rs[0], rs[0], rs[0]]
    return statistics.median(rs), f"{min(rs):.3f}–{max(rs):.3f}", f"{q[0]:.3f}–{q[2]:.3f}"


# The Cornish-Fisher expansion of Student's t about the normal quantile z (Abramowitz & Stegun
# 26.7.5, five terms), for t975: z and the coefficients g1..g4 of 1/df .. 1/df⁴.
_Z975 = statistics.NormalDist().inv_cdf(0.975)
_T_TERMS = tuple(c(_Z975) for c in (
    lambda z: (z ** 3 + z) / 4,
    lambda z: (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
    lambda z: (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
    lambda z: (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160))


def t975(df):
    """Student's t at 97.5 % for df degrees of freedom (the expansion above): within 0.2 % of the
    table from df 3 up, the fewest geo_ci takes (statistics has the normal distribution, not
    Student's; the earlier 1.96 + 2.4/df + 3/df² was 1.0 % short at df 4, 2.8 % at df 3, so its
    intervals were too narrow)."""
    return _Z975 + sum(g / df ** (k + 1) for k, g in enumerate(_T_TERMS))


def log_sd(rs):
    """The sample standard deviation of the ratios' logarithms (geo_ci's spread)."""
    return statistics.stdev(math.log(r) for r in rs)


def geo_ci(rs):
    """The geometric mean of ratios and its 95 % confidence interval (lo, hi), pairs taken as
    independent: a t interval on the logarithms, where a ratio and its inverse are symmetric.
    Needs 4 ratios; None below."""
    if len(rs) < 4 or min(rs) <= 0:
        return None
    m = statistics.mean(math.log(r) for r in rs)
    half = t975(len(rs) - 1) * log_sd(rs) / math.sqrt(len(rs))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def median_of(rows, job, system, key):
    return statistics.median(r[key] for r in rows if r["job"] == job and r["system"] == system)


def met(rs, cpu, target):
    """The verdict on a goal of ratio ≥ target: the median reaches it, or the rate's noise covers
    it (the upper quartile reaches it) and the CPU per request does (≤ 1 / target). A median and
    upper quartile both short of the target are a real difference, whatever the CPU says: the
    time then goes to waiting, not computing."""
    med = statistics.median(rs)
    q3 = statistics.quantiles(rs, n=4, method="inclusive")[2] if len(rs) >= 2 else rs[0]
    return med >= target or (q3 >= target and bool(cpu) and statistics.median(cpu) <= 1 / target)


UNITS = {"p50_us": "µs p50", "iops": "IOPS", "bw_mib": "MiB/s"}


def cells(bench, rows, job, first, second, target, digits=0):
    """One report row of an A/B for job, or None without pairs: the cells job, first's and
    second's median, the ratio's median, min–max, IQR, the CPU ratio's median and IQR, the pairs;
    and the verdict (met)."""
    key = bench.metric_of(job)
    rs = ratios(rows, job, key, first, second)
    if not rs:
        return None, False
    unit = UNITS[key]
    a, b = median_of(rows, job, first, key), median_of(rows, job, second, key)
    med, mm, iqr = spread(rs)
    cpu = ratios(rows, job, "gw_cpu_us_per_io", first, second, better=False)
    cmed, _, ciqr = spread(cpu) if cpu else (None, "–", "–")
    return [job, f"{a:.{digits}f} {unit}", f"{b:.{digits}f} {unit}", f"{med:.3f}", mm, iqr,
            "–" if cmed is None else f"{cmed:.3f}", ciqr, str(len(rs))], met(rs, cpu, target)


def table_row(cs, *more):
    return "| " + " | ".join(list(cs) + list(more)) + " |"


def cost_table(rows, jobs, first, second, label_first, label_second):
    """Where the gateway's CPU per request goes, per job with pairs: the CPU ratio first / second
    as a geometric mean with its 95 % interval (geo_ci), and each side's median context switches
    and read/write-class system calls per request (interleave records them; rows from before
    they were recorded show –). The same kernel work on both sides puts a CPU difference in user
    space."""
    out = [f"| job | CPU µs/IO ratio: geo-mean (95 % CI) | switches/IO: {label_first} | "
           f"{label_second} | syscalls/IO: {label_first} | {label_second} |",
           "|---|---|---|---|---|---|"]
    for job in jobs:
        ci = geo_ci(ratios(rows, job, "gw_cpu_us_per_io", first, second, better=False))
        if ci is None:
            continue
        cs = [job, f"{ci[0]:.3f} ({ci[1]:.3f}–{ci[2]:.3f})"]
        for key in ("gw_switches_per_io", "gw_syscalls_per_io"):
            for system in (first, second):
                have = [r[key] for r in rows if r["job"] == job and r["system"] == system and key in r]
                cs.append(f"{statistics.median(have):.2f}" if have else "–")
        out.append(table_row(cs))
    return out


def speed_table(bench, rows, jobs, first, second, target, label_first, label_second, digits=0):
    """The table of a speed A/B (release_ab, default_ab): one row per job of jobs with pairs."""
    out = [f"| job | {label_first}: median | {label_second}: median | speed: median | min–max | IQR | "
           "CPU µs/IO: median | CPU IQR | pairs | met |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for job in jobs:
        cs, ok = cells(bench, rows, job, first, second, target, digits)
        if cs is not None:
            out.append(table_row(cs, "yes" if ok else "no"))
    return out
