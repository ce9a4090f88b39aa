"""Issue 16's metrics-cost A/B for make bench (bench.py calls it once per repetition, shared
placement): what serving Prometheus metrics costs the data path, at 4 KiB random read QD32 and
1 MiB sequential write QD8, the goal being at most 3 % apart.

"On" is `serve --cache off --metrics-listen` with /metrics scraped every --metrics-ab-scrape
seconds while fio runs (1 s by default, fifteen times Prometheus' default rate: an upper bound);
"off" is the same binary without --metrics-listen. The per-request counters themselves
(internal/status.IOCounters: atomics, no allocation) are kept in both, because `iser-blk status`
reads them; their cost is what the Go benchmarks and -benchmem show, and --alt-bin with a binary
from before issue 16 compares against none at all.

Noise: both gateways stay up for the whole A/B (each its own session to the same LUN: iser-blk
picks a random ISID) and short runs of the two alternate (ab.py); the report is the median
ratio on/off over every pair of every repetition, with min–max and the interquartile range.
"""
import os
import statistics
import threading
import urllib.request

import ab  # noqa: E402  (beside this file)

NAME = "metrics-ab"  # for --systems
ON, OFF = "iser-blk-metrics-on", "iser-blk-metrics-off"
JOBS = ("randread-4k-qd32", "seqwrite-1m-qd8")
TARGET = 0.97  # on/off, at least


class Scraper:
    """Fetches /metrics every interval seconds until stopped; counts the scrapes that worked."""

    def __init__(self, addr, interval):
        self.url, self.interval = f"http://{addr}/metrics", interval
        self.ok, self.stopped = 0, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stopped.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.ok += 1
            except OSError:
                pass

    def stop(self):
        self.stopped.set()
        self.thread.join()
        return self.ok


def run(bench, a, tgt, work, rep, preexec=None):
    """One repetition of the A/B; returns result rows (marked ab=NAME, kept out of the job tables)."""
    jobs = [(n, args) for n, args, _ in bench.JOBS if n in JOBS and (not a.jobs or n in a.jobs.split(","))]
    if not jobs or a.metrics_ab_pairs <= 0:
        return []
    run_dir = os.path.join(work, "run")
    addr = f"127.0.0.1:{bench.free_port()}"

    def start(name, extra):
        sock = os.path.join(work, f"{name}.sock")
        argv = [bench.BIN, "serve", "--target", tgt.url, "--listen", f"unix://{sock}", "--cache", "off",
                "--name", f"bench-{name}", "--run-dir", run_dir, *extra]
        return bench.NBDServer(name, argv, sock, work, preexec=preexec)

    def before(system):
        return Scraper(addr, a.metrics_ab_scrape) if system == ON else None

    def after(system, scraper):
        return dict(scrapes=scraper.stop() if scraper else None)
    servers = {}
    try:
        servers[ON] = start(ON, ("--metrics-listen", addr))
        servers[OFF] = start(OFF, ())
        return ab.interleave(bench, a, work, rep, servers, ON, OFF, jobs, a.metrics_ab_pairs,
                             a.metrics_ab_runtime, NAME, before, after, preexec)
    finally:
        for s in servers.values():
            s.stop()


def report(bench, rows):
    """The A/B's section of the report: per job, the median on/off ratio of the rate and of the
    gateway's CPU per request, with their spread. Rows of other A/Bs are left out."""
    rows = [r for r in rows if r.get("ab") == NAME]
    if not rows:
        return []
    out = ["\n## Metrics cost (issue 16): /metrics served and scraped against not served, same binary, "
           "cache off, interleaved pairs\n",
           f"Each pair is one run with metrics and one without, back to back, order alternating; "
           f"rate ratio = on / off (higher is better), goal ≥ {TARGET:g}. The gateway's CPU per request "
           "(its /proc stat around each run) is the cost itself and steadier than the rate, which "
           "moves ±15 % between runs of one binary on this host: CPU ratio = on / off, lower is better, "
           f"goal ≤ {1 / TARGET:.3f}. Spread: min–max and interquartile range over every pair of every "
           "repetition.\n",
           "| job | on: median | off: median | rate on / off: median | min–max | IQR | "
           "CPU µs/IO on / off: median | CPU IQR | pairs | scrapes per on-run | met |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for job in JOBS:
        cs, met = ab.cells(bench, rows, job, ON, OFF, TARGET)
        if cs is None:
            continue
        scrapes = [r["scrapes"] for r in rows if r["job"] == job and r["system"] == ON]
        out.append(ab.table_row(cs, f"{statistics.median(scrapes):.0f}", "yes" if met else "no"))
    out.append("\nmet: the rate ratio's median reaches its goal, or its upper quartile does (the gap is "
               "within the run-to-run noise) and the CPU per request (what metrics could cost) does.")
    return out
