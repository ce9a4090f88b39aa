"""Scaling curves for make bench (issue 18, goal 4), run after the job table as short extra passes
in the shared placement, one repetition each:

  qd        4 KiB random read IOPS and p99 over queue depth 1, 2, 4 ... 256: iser-blk with the
            cache off, iser-blk write-back warm (the working set read once in 32 KiB requests, which
            go through the pages), qemu-nbd
  sessions  1 MiB sequential read throughput (QD8 per connection) of iser-blk with the cache off
            over --sessions 1-4 (iSCSI sessions to the target) x NBD connections 1-4 (fio jobs,
            one connection each, each reading its own slice of the working set); qemu-nbd over
            the same connections for reference
  rss       the write-back gateway's peak RSS (VmHWM) over --cache-size 64 MiB - 4 GiB: 64 KiB
            random writes (cached: below the write-around cutoff, not sequential) of 1.5x the
            cache over a sparse LUN twice its size, so the cache fills, writes back and evicts;
            capped in time, the bytes written are reported beside it

Charts (PNG, gnuplot, y axis from 0) go beside latest.png: curve-qd-iops.png, curve-qd-p99.png,
curve-sessions.png, curve-rss.png. Called from bench.py with that module as b.
"""
import json
import os
import subprocess
import time

# --buffer-memory the rss curve (and the job table's write-back gateway) runs with: the bound is
# --cache-size + this + 64 MiB.
BUFFER_MIB = 512
RSS_SLACK_MIB = 64


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def size_mib(s):
    """fio-style size ("512m", "1g", "256") in MiB."""
    s = s.strip().lower()
    mult = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s) >> 20


def run_curves(b, a, tgt, work):
    """Runs the curves named in a.curves; returns {curve: rows}."""
    want = [c for c in a.curves.split(",") if c and c != "none"]
    out = {}
    if "qd" in want:
        out["qd"] = qd_curve(b, a, tgt, work)
    if "sessions" in want:
        out["sessions"] = sessions_curve(b, a, tgt, work)
    if "rss" in want:
        out["rss"] = rss_curve(b, a, work)
    return out


def serve(b, tgt, work, name, extra):
    sock = os.path.join(work, f"{name}.sock")
    return b.NBDServer(name, [b.BIN, "serve", "--target", tgt.url, "--listen", f"unix://{sock}"] + extra,
                       sock, work)


def qd_curve(b, a, tgt, work):
    rows = []
    starts = {
        "qemu-nbd": lambda: b.NBDServer("qemu-nbd", ["qemu-nbd", "-f", "raw", "--cache=none", "-e", "8", "-t", "-k",
                                                     os.path.join(work, "q.sock"), tgt.url],
                                        os.path.join(work, "q.sock"), work),
        "iser-blk-nocache": lambda: serve(b, tgt, work, "curve-nocache", ["--cache", "off"]),
        "iser-blk-wb-warm": lambda: serve(b, tgt, work, "curve-wb", ["--cache", "writeback"]),
    }
    for name, start in starts.items():
        srv = start()
        try:
            if name.endswith("-warm"):
                b.fio(srv.uri, "warmup", dict(rw="read", bs="32k", iodepth=8, numjobs=1),
                      max(a.curve_runtime, 5), a.size, work)
            for qd in ints(a.curve_qds):
                m = b.fio(srv.uri, f"qd{qd}", dict(rw="randread", bs="4k", iodepth=qd, numjobs=1),
                          a.curve_runtime, a.size, work)
                rows.append(dict(system=name, qd=qd, iops=m["iops"], p99_us=m["p99_us"], errors=m["errors"]))
                b.log(f"   curve qd {name:18s} QD{qd:<4d} {m['iops']:9.0f} IOPS p99 {m['p99_us']:8.1f} us")
        finally:
            srv.stop()
    return rows


def sessions_curve(b, a, tgt, work):
    rows = []
    total = size_mib(a.size)
    variants = [(f"iser-blk-nocache --sessions {s}", ["--cache", "off", "--sessions", str(s)])
                for s in ints(a.curve_sessions)]
    variants.append(("qemu-nbd", None))
    for name, extra in variants:
        if extra is None:
            sock = os.path.join(work, "qs.sock")
            srv = b.NBDServer("qemu-nbd", ["qemu-nbd", "-f", "raw", "--cache=none", "-e", "8", "-t", "-k", sock,
                                           tgt.url], sock, work)
        else:
            srv = serve(b, tgt, work, "curve-sessions", extra)
        try:
            for n in ints(a.curve_conns):
                per = max(total // n, 1)
                m = b.fio(srv.uri, f"conn{n}", dict(rw="read", bs="1m", iodepth=8, numjobs=n, size=f"{per}m",
                                                    offset_increment=f"{per}m"), a.curve_runtime, a.size, work)
                rows.append(dict(system=name, connections=n, bw_mib=m["bw_mib"], errors=m["errors"]))
                b.log(f"   curve sessions {name:32s} {n} conn {m['bw_mib']:8.1f} MiB/s")
        finally:
            srv.stop()
    return rows


def rss_curve(b, a, work):
    """Its own tgtd with a sparse LUN twice the largest cache (nothing to read: writes only)."""
    rows = []
    caches = ints(a.rss_caches)
    tgt = b.Tgtd(work, 2 * max(caches), fill=False)
    try:
        for mib in caches:
            srv = serve(b, tgt, work, f"curve-rss-{mib}", ["--cache", "writeback", "--cache-size", f"{mib}MiB",
                                                           "--buffer-memory", f"{BUFFER_MIB}MiB"])
            try:
                b.reset_peak_rss(srv.proc.pid)
                out = os.path.join(work, f"fio-rss-{mib}.json")
                t0 = time.monotonic()
                subprocess.run(["fio", "--name", "rss", "--ioengine=nbd", f"--uri={srv.uri}", "--rw=randwrite",
                                "--bs=64k", "--iodepth=16", f"--size={2 * mib}m", f"--io_size={mib * 3 // 2}m",
                                f"--runtime={a.rss_runtime}", "--randrepeat=0", "--output-format=json",
                                f"--output={out}"], check=True, capture_output=True)
                secs = time.monotonic() - t0
                with open(out) as f:
                    written = json.load(f)["jobs"][0]["write"]["io_bytes"] / (1 << 20)
                peak = b.peak_rss_mib(srv.proc.pid)
            finally:
                srv.stop()
            bound = mib + BUFFER_MIB + RSS_SLACK_MIB
            rows.append(dict(cache_mib=mib, written_mib=written, seconds=secs, peak_rss_mib=peak, bound_mib=bound))
            b.log(f"   curve rss cache {mib} MiB: wrote {written:.0f} MiB in {secs:.0f} s, peak RSS {mib_cell(peak)} "
                  f"MiB (bound {bound})")
    finally:
        tgt.stop()
    return rows


def mib_cell(peak):
    """A peak RSS in MiB for the log and the table; None (the gateway's /proc entry was gone
    before it was read, see bench.peak_rss_mib) is "–", never a crash that loses the report."""
    return "–" if peak is None else f"{peak:.0f}"


def report(curves):
    """Markdown tables of the curves."""
    out = []
    if curves.get("qd"):
        systems = list(dict.fromkeys(r["system"] for r in curves["qd"]))
        qds = sorted({r["qd"] for r in curves["qd"]})
        by = {(r["system"], r["qd"]): r for r in curves["qd"]}
        out += ["\n## Curve: 4k randread over queue depth (IOPS / p99 µs), shared placement, one run\n",
                "| QD | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
        for qd in qds:
            cells = [f"{by[(s, qd)]['iops']:.0f} / {by[(s, qd)]['p99_us']:.0f}" if (s, qd) in by else "–"
                     for s in systems]
            out.append(f"| {qd} | " + " | ".join(cells) + " |")
        out.append("\n![IOPS over QD](curve-qd-iops.png) ![p99 over QD](curve-qd-p99.png)\n")
    if curves.get("sessions"):
        systems = list(dict.fromkeys(r["system"] for r in curves["sessions"]))
        conns = sorted({r["connections"] for r in curves["sessions"]})
        by = {(r["system"], r["connections"]): r for r in curves["sessions"]}
        out += ["\n## Curve: 1M seq read QD8 per connection (MiB/s) over iSCSI sessions and NBD connections\n",
                "| system | " + " | ".join(f"{n} conn" for n in conns) + " |", "|---|" + "---|" * len(conns)]
        for s in systems:
            out.append(f"| {s} | " + " | ".join(f"{by[(s, n)]['bw_mib']:.0f}" if (s, n) in by else "–"
                                                 for n in conns) + " |")
        out.append("\n![throughput over sessions and connections](curve-sessions.png)\n")
    if curves.get("rss"):
        out += ["\n## Curve: write-back peak RSS over --cache-size (64 KiB random writes of 1.5× the cache)\n",
                "| --cache-size MiB | written MiB | seconds | peak RSS MiB | bound (cache + buffers + 64) MiB | met |",
                "|---|---|---|---|---|---|"]
        for r in curves["rss"]:
            peak = r["peak_rss_mib"]
            ok = peak is not None and peak <= r["bound_mib"]
            out.append(f"| {r['cache_mib']} | {r['written_mib']:.0f} | {r['seconds']:.0f} | {mib_cell(peak)} | "
                       f"{r['bound_mib']} | {'yes' if ok else 'no'} |")
        out.append("\n![peak RSS over cache size](curve-rss.png)\n")
    return out


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


def charts(out_dir, work, curves):
    """Line charts, y axis from 0."""
    head = "set terminal pngcairo size 900,480 noenhanced\nset grid\nset key top left\nset yrange [0:*]\n"
    if curves.get("qd"):
        systems = list(dict.fromkeys(r["system"] for r in curves["qd"]))
        files = []
        for s in systems:
            dat = os.path.join(work, f"curve-qd-{len(files)}.dat")
            with open(dat, "w") as f:
                for r in sorted((r for r in curves["qd"] if r["system"] == s), key=lambda r: r["qd"]):
                    f.write(f"{r['qd']} {r['iops']:.1f} {r['p99_us']:.1f}\n")
            files.append((s, dat))
        for col, name, ylabel, title in ((2, "iops", "IOPS", "4 KiB random read: IOPS over queue depth"),
                                         (3, "p99", "p99 latency (µs)", "4 KiB random read: p99 over queue depth")):
            plots = ", ".join(f"'{d}' using 1:{col} with linespoints lw 2 title '{s}'" for s, d in files)
            gnuplot(head + f"set output '{os.path.join(out_dir, f'curve-qd-{name}.png')}'\nset title '{title}'\n"
                    f"set logscale x 2\nset xlabel 'queue depth'\nset ylabel '{ylabel}'\nplot {plots}\n")
    if curves.get("sessions"):
        systems = list(dict.fromkeys(r["system"] for r in curves["sessions"]))
        plots = []
        for i, s in enumerate(systems):
            dat = os.path.join(work, f"curve-sess-{i}.dat")
            with open(dat, "w") as f:
                for r in sorted((r for r in curves["sessions"] if r["system"] == s), key=lambda r: r["connections"]):
                    f.write(f"{r['connections']} {r['bw_mib']:.1f}\n")
            plots.append(f"'{dat}' using 1:2 with linespoints lw 2 title '{s}'")
        gnuplot(head + f"set output '{os.path.join(out_dir, 'curve-sessions.png')}'\n"
                "set title '1 MiB sequential read, QD8 per connection'\nset xlabel 'NBD connections'\n"
                "set xtics 1\nset ylabel 'MiB/s'\nset key bottom right\nplot " + ", ".join(plots) + "\n")
    if curves.get("rss"):
        dat = os.path.join(work, "curve-rss.dat")
        with open(dat, "w") as f:
            for r in curves["rss"]:
                # gnuplot leaves a NaN point out: an unread peak is no point, not one at 0 under the bound
                peak = "NaN" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.1f}"
                f.write(f"{r['cache_mib']} {peak} {r['bound_mib']}\n")
        gnuplot(head + f"set output '{os.path.join(out_dir, 'curve-rss.png')}'\n"
                "set title 'write-back gateway: peak RSS over --cache-size'\nset logscale x 2\n"
                "set xlabel '--cache-size (MiB)'\nset ylabel 'MiB'\n"
                f"plot '{dat}' using 1:2 with linespoints lw 2 title 'peak RSS (VmHWM)', "
                f"'{dat}' using 1:3 with linespoints lw 2 dt 2 title 'bound: cache + {BUFFER_MIB} MiB buffers + "
                f"{RSS_SLACK_MIB} MiB'\n")
