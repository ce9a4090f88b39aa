"""Issue 39's rows with the target remote, on the host (native CPU): tgtd with its default settings
behind test/bench/delayproxy, which delays every byte by --delay-ms each way (0.5 ms by default:
the issue's netem, which this host's kernel lacks; the QEMU guest has netem, but there emulation
costs the gateway milliseconds per I/O and drowns the link); the gateways each a `serve` on a unix
socket with its default flags, each on a LUN of its own (a tgtd each, behind a delayproxy each),
except:

    off    --cache off
    wb     the RAM write-back cache (the default)
    cd     --cache-dev on a file of the host's own file system (CACHE_DIR, default /var/tmp)
    local  no gateway: the same fio job on a file of that same file system (the cache device's own)

Jobs: commit-4k-qd1 (a 4 KiB random write followed by an fsync, QD1: fio's fsync=1; on the
gateways an NBD FLUSH), seqwrite-1m-qd8, randread-4k-qd32-warm (a 256 MiB region written in
64 KiB requests, then read back: from the log and the RAM cache with cd, from the page cache or
the disk with local), and pgbench (PgBench: scale 10, 4 clients, synchronous_commit on, on ext4
over the export through nbdfuse and a loop device). Each pair runs every system once, the order
rotated from pair to pair.

    python3 test/bench/remote_ab.py PAIRS RUNTIME OUT.json [--delay-ms MS] [--jobs a,b]

Prints, per job, each system's medians and the median of its per-pair ratios to off and to local
(min–max); writes every run to OUT.json. Needs tgtd, fio, go and iser-blk built (bin/iser-blk).
Not part of make test: it measures.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (beside this file)

NAME = "remote-ab"  # for bench.py --systems
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEMS = ["off", "wb", "cd", "local"]
# The commit and pgbench also run on "mem": a gateway (--cache off) on a LUN in its own memory
# (mem://), no target and no network, so a write and a FLUSH cost only their way through NBD (and,
# for pgbench, nbdfuse and the loop device): the bound of any gateway on this host. cd's commit
# can come no closer to local's than local's plus mem's.
PG_SYSTEMS = SYSTEMS + ["mem"]
CEILING_JOBS = ("commit-4k-qd1", "pgbench")
FLAGS = {"off": ["--cache", "off"], "wb": [], "cd": None}  # cd's flags name its file (run)
JOBS = {"commit-4k-qd1": dict(rw="randwrite", bs="4k", iodepth=1, fsync=1),
        "seqwrite-1m-qd8": dict(rw="write", bs="1m", iodepth=8),
        "randread-4k-qd32-warm": dict(rw="randread", bs="4k", iodepth=32),
        "pgbench": None}  # PgBench
REGION = "256m"


class DelayProxy:
    """test/bench/delayproxy between the gateways and tgtd: every byte delayed by delay_ms each way
    (the host's kernel has no netem)."""

    def __init__(self, to_port, delay_ms, work):
        exe = os.path.join(work, "delayproxy")
        bench.run(["go", "build", "-o", exe, "./test/bench/delayproxy"], cwd=ROOT)
        self.exe, self.delay = exe, f"{int(delay_ms * 1000)}us"
        self.proc = subprocess.Popen([exe, "-listen", "127.0.0.1:0", "-to", f"127.0.0.1:{to_port}", "-delay",
                                      self.delay], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[1].rsplit(":", 1)[1])

    def echo_rtt_us(self):
        """The median round trip of a 48-byte message through a second proxy with the same delay
        to an echo server: what the link adds to one request and its answer."""
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def echo():
            c, _ = srv.accept()
            while d := c.recv(4096):
                c.sendall(d)
        threading.Thread(target=echo, daemon=True).start()
        p = subprocess.Popen([self.exe, "-listen", "127.0.0.1:0", "-to", f"127.0.0.1:{srv.getsockname()[1]}",
                              "-delay", self.delay], stdout=subprocess.PIPE, text=True)
        try:
            port = int(p.stdout.readline().split()[1].rsplit(":", 1)[1])
            c = socket.create_connection(("127.0.0.1", port))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rt = []
            for _ in range(200):
                t = time.perf_counter()
                c.sendall(b"x" * 48)
                c.recv(4096)
                rt.append((time.perf_counter() - t) * 1e6)
            c.close()
            return statistics.median(rt)
        finally:
            p.kill()
            p.wait()
            srv.close()

    def close(self):
        self.proc.kill()
        self.proc.wait()


PG_OFFSET, PG_SIZE = 512 << 20, 512 << 20  # where PgBench's ext4 lives on each 1 GiB LUN


class PgBench:
    """PostgreSQL on ext4 on a system: for a gateway, its NBD export as a file (nbdfuse), a loop
    device on that file's second half (the fio jobs write the first), ext4 on the loop device; for local, a directory of the cache device's own
    file system. A FLUSH from ext4 reaches the gateway as an NBD FLUSH (loop fsyncs the FUSE file,
    nbdfuse flushes). initdb and pgbench -i -s 10 once; then pgbench -c 4 per run, with
    synchronous_commit on (every commit waits for its WAL fsync)."""

    PORT = 55432

    def __init__(self, name, uri, local_dir, work):
        self.dir = os.path.join(work, "pg-" + name)
        self.loop = self.fuse = None
        os.makedirs(self.dir)
        os.chmod(self.dir, 0o777)  # postgres runs as its own user
        self.port = PgBench.PORT + PG_SYSTEMS.index(name)
        if uri is None:
            self.data = os.path.join(local_dir, f"iser-blk-remote-ab-{os.getpid()}-pg")
        else:
            self.fuse = os.path.join(self.dir, "fuse")
            os.makedirs(self.fuse)
            self.fuse_proc = subprocess.Popen(["nbdfuse", os.path.join(self.fuse, "nbd"), uri],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            bench.wait_for(lambda: os.path.exists(os.path.join(self.fuse, "nbd")), "nbdfuse", proc=self.fuse_proc)
            # the second half of the LUN: the fio jobs write its first REGION
            self.loop = bench.run(["losetup", "-f", "--show", "--offset", str(PG_OFFSET), "--sizelimit",
                                   str(PG_SIZE), os.path.join(self.fuse, "nbd")]).stdout.strip()
            bench.run(["mkfs.ext4", "-q", self.loop])
            self.mnt = os.path.join(self.dir, "mnt")
            os.makedirs(self.mnt)
            bench.run(["mount", self.loop, self.mnt])
            self.data = os.path.join(self.mnt, "pg")
        os.makedirs(self.data)
        shutil.chown(self.data, "postgres")
        self.pg(f"initdb -D {self.data}/data")
        self.pg(f"pg_ctl -D {self.data}/data -l {self.dir}/pg.log -o '-p {self.port} -k {self.dir} "
                f"-c listen_addresses= -c synchronous_commit=on' start")
        self.pg(f"pgbench -h {self.dir} -p {self.port} -i -s 10 postgres")

    def pg(self, cmd):
        return bench.run(["su", "postgres", "-s", "/bin/sh", "-c", cmd])

    def run(self, runtime):
        out = self.pg(f"pgbench -h {self.dir} -p {self.port} -c 4 -T {runtime} postgres").stdout
        tps = [l for l in out.splitlines() if l.startswith("tps = ")]
        lat = [l for l in out.splitlines() if l.startswith("latency average = ")]
        return dict(tps=float(tps[0].split()[2]), lat_ms=float(lat[0].split()[3]) if lat else None)

    def close(self):
        subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", f"pg_ctl -D {self.data}/data stop -m fast"],
                       capture_output=True)
        if self.loop:
            subprocess.run(["umount", self.mnt], capture_output=True)
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            subprocess.run(["umount", self.fuse], capture_output=True)  # nbdfuse then exits
            self.fuse_proc.wait()
        else:
            shutil.rmtree(self.data, ignore_errors=True)


def fio_local(path, job, args, runtime, work):
    """The job on a file of the cache device's file system: psync for QD1, libaio direct for
    deeper queues (buffered libaio would not queue)."""
    out = os.path.join(work, f"fio-local-{job}.json")
    argv = ["fio", "--name", job, f"--filename={path}", f"--size={REGION}", f"--runtime={runtime}",
            "--time_based", "--output-format=json", f"--output={out}", "--randrepeat=0"]
    if args.get("iodepth", 1) > 1:
        argv += ["--ioengine=libaio", "--direct=1"]
    else:
        argv += ["--ioengine=psync"]
    argv += [f"--{k}={v}" for k, v in args.items()]
    bench.run(argv)
    return parse(out)


def parse(path):
    with open(path) as f:
        j = json.load(f)["jobs"][0]
    side = j["write"] if j["write"]["total_ios"] else j["read"]
    pct = side["clat_ns"].get("percentile", {})
    sync = j.get("sync", {}).get("lat_ns", {}).get("percentile", {})
    return dict(iops=side["iops"], bw_mib=side["bw_bytes"] / 2**20, p50_us=pct.get("50.000000", 0) / 1000,
                p99_us=pct.get("99.000000", 0) / 1000, sync_p50_us=sync.get("50.000000", 0) / 1000,
                sync_p99_us=sync.get("99.000000", 0) / 1000, errors=j["error"])


def fio_nbd(uri, job, args, runtime, work):
    out = os.path.join(work, f"fio-{job}.json")
    argv = ["fio", "--name", job, "--ioengine=nbd", f"--uri={uri}", f"--size={REGION}", f"--runtime={runtime}",
            "--time_based", "--output-format=json", f"--output={out}", "--randrepeat=0"]
    argv += [f"--{k}={v}" for k, v in args.items()]
    bench.run(argv)
    return parse(out)


def metric(job):
    """What a job is judged by, and whether lower is better."""
    if job.startswith("commit"):
        return "commit_p50_us", True
    if job == "pgbench":
        return "tps", False
    return ("bw_mib", False) if job.startswith("seq") else ("iops", False)


def run(a):
    work = tempfile.mkdtemp(prefix="remote-ab-")
    os.chmod(work, 0o755)  # PostgreSQL's user reaches its directories below
    cache_file = os.path.join(a.cache_dir, f"iser-blk-remote-ab-{os.getpid()}.cache")
    local_file = os.path.join(a.cache_dir, f"iser-blk-remote-ab-{os.getpid()}.local")
    rows, servers, tgts, proxies, pgs = [], {}, [], [], {}
    try:
        # a LUN of its own for each gateway: a file system on one, or a cache of one, must never
        # meet another system's writes
        for s in SYSTEMS[:3]:
            tgt = bench.Tgtd(work, 1024, tuned=False)
            tgts.append(tgt)
            proxy = DelayProxy(tgt.port, a.delay_ms, work)
            proxies.append(proxy)
            url = tgt.url.replace(f":{tgt.port}/", f":{proxy.port}/")
            flags = FLAGS[s] if s != "cd" else ["--cache-dev", cache_file, "--cache-dev-size", "1GiB"]
            sock = os.path.join(work, s + ".sock")
            servers[s] = bench.NBDServer(s, [a.bin, "serve", "--target", url, "--listen", f"unix://{sock}",
                                             *flags], sock, work)
        if any(j in a.jobs for j in CEILING_JOBS):
            sock = os.path.join(work, "mem.sock")
            servers["mem"] = bench.NBDServer("mem", [a.bin, "serve", "--target", "mem://1GiB", "--listen",
                                                     f"unix://{sock}", "--cache", "off"], sock, work)
        rtt = proxies[0].echo_rtt_us()
        bench.log(f"remote target: {a.delay_ms} ms each way through delayproxy, echo RTT {rtt:.0f} us")
        # the local file written whole once first, as the gateway writes its new cache file: no
        # run of local then pays for converting unwritten extents that cd's log never pays for
        bench.run(["fio", "--name=prewrite", f"--filename={local_file}", f"--size={REGION}", "--rw=write", "--bs=1m",
                   "--ioengine=psync", "--end_fsync=1", "--output=/dev/null"])
        if "pgbench" in a.jobs:
            for s in PG_SYSTEMS:
                pgs[s] = PgBench(s, servers[s].uri if s in servers else None, a.cache_dir, work)
        for p in range(a.pairs):
            for job in a.jobs:
                names = PG_SYSTEMS if job in CEILING_JOBS else SYSTEMS
                order = names[p % len(names):] + names[:p % len(names)]
                for s in order:
                    if job == "pgbench":
                        m = pgs[s].run(a.runtime)
                        m.update(pair=p, job=job, system=s, load1=os.getloadavg()[0])
                        rows.append(m)
                        bench.log(f"pair {p} {job:22s} {s:5s} {m['tps']:9.1f} TPS")
                        continue
                    args = dict(JOBS[job])
                    if job.endswith("-warm"):  # the region written first, then read back
                        w = dict(rw="write", bs="64k", iodepth=8)
                        if s == "local":
                            fio_local(local_file, "warm-write", w, 3, work)
                        else:
                            fio_nbd(servers[s].uri, "warm-write", w, 3, work)
                    if s == "local":
                        m = fio_local(local_file, job, args, a.runtime, work)
                    else:
                        m = fio_nbd(servers[s].uri, job, args, a.runtime, work)
                    m["commit_p50_us"] = m["p50_us"] + m["sync_p50_us"]
                    m.update(pair=p, job=job, system=s, load1=os.getloadavg()[0])
                    rows.append(m)
                    bench.log(f"pair {p} {job:22s} {s:5s} {m['iops']:9.0f} IOPS {m['bw_mib']:8.1f} MiB/s "
                              f"p50 {m['p50_us']:8.1f} + sync {m['sync_p50_us']:8.1f} us")
                    if s != "local" and args["rw"] != "randread":
                        bench.flush(servers[s].uri)  # each job starts with nothing dirty in RAM
        return dict(delay_ms=a.delay_ms, echo_rtt_us=rtt, tgt_params=tgts[0].params, cache_dir=a.cache_dir,
                    runtime=a.runtime, rows=rows)
    finally:
        for pg in pgs.values():
            pg.close()
        for srv in servers.values():
            srv.stop()
        for p in proxies:
            p.close()
        for t in tgts:
            t.stop()
        for f in (cache_file, local_file):
            if os.path.exists(f):
                os.unlink(f)


def summary(d):
    """Markdown lines: per job and system the median of the metric and its per-pair ratios."""
    rows = d["rows"]
    lines = [f"Remote target: tgtd (default settings) behind test/bench/delayproxy, {d['delay_ms']} ms each "
             f"way (echo RTT {d['echo_rtt_us']:.0f} µs); cache device and local file on {d['cache_dir']}; "
             f"{max(r['pair'] for r in rows) + 1} interleaved pairs of {d['runtime']} s.", "",
             "| job | system | median | p50 write + sync µs | vs off: median (min–max) | vs local | vs wb |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    by = {}
    for r in rows:
        by.setdefault((r["job"], r["system"]), {})[r["pair"]] = r
    for job in JOBS:
        key, _ = metric(job)
        for s in PG_SYSTEMS:
            runs = by.get((job, s))
            if not runs:
                continue
            med = statistics.median(r[key] for r in runs.values())

            def ratios(ref):
                base = by.get((job, ref), {})
                rs = [r[key] / base[p][key] for p, r in runs.items() if p in base and base[p][key]]
                return "–" if not rs else f"{statistics.median(rs):.3f} ({min(rs):.3f}–{max(rs):.3f})"
            lat = "–"
            if job != "pgbench":
                wr = statistics.median(r["p50_us"] for r in runs.values())
                sy = statistics.median(r["sync_p50_us"] for r in runs.values())
                lat = f"{wr:.1f} + {sy:.1f}"
            lines.append(f"| {job} | {s} | {med:.1f} {key} | {lat} | {ratios('off')} | {ratios('local')} | {ratios('wb')} |")
    return lines


def chart(d, path, work):
    """A bar chart of the commit's median latency per system, the write and the flush stacked, y
    from 0 (gnuplot; nothing when it is missing)."""
    if not shutil.which("gnuplot"):
        return False
    rows = [r for r in d["rows"] if r["job"] == "commit-4k-qd1"]
    dat = os.path.join(work, "remote-commit.dat")
    with open(dat, "w") as f:
        for s in SYSTEMS:
            rs = [r for r in rows if r["system"] == s]
            if rs:
                f.write(f"{s} {statistics.median(r['p50_us'] for r in rs):.1f} "
                        f"{statistics.median(r['sync_p50_us'] for r in rs):.1f}\n")
    import curves  # noqa: E402  (beside this file; only the chart needs it)
    curves.gnuplot("set terminal pngcairo size 900,480 noenhanced\nset grid ytics\nset yrange [0:*]\n"
                   f"set output '{path}'\nset title 'Commit (4 KiB write + fsync, QD1), target "
                   f"{d['delay_ms']} ms away each way: median latency'\nset ylabel 'µs'\n"
                   "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8\n"
                   "set boxwidth 0.6\nset key top right\n"
                   f"plot '{dat}' using 2:xtic(1) title 'write', '' using 3 title 'flush (fsync)'\n")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", type=int)
    ap.add_argument("runtime", type=int)
    ap.add_argument("out")
    ap.add_argument("--delay-ms", type=float, default=0.5)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--cache-dir", default="/var/tmp")
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin", "iser-blk"))
    a = ap.parse_args()
    a.jobs = a.jobs.split(",")
    for j in a.jobs:
        if j not in JOBS:
            raise SystemExit(f"unknown job {j!r} ({', '.join(JOBS)})")
    d = run(a)
    with open(a.out, "w") as f:
        json.dump(d, f, indent=1)
    print("\n".join(summary(d)))
    png = os.path.splitext(a.out)[0] + "-commit.png"
    if chart(d, png, tempfile.mkdtemp(prefix="remote-ab-chart-")):
        print(f"\nchart: {png}")


if __name__ == "__main__":
    main()
