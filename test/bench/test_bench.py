"""Unit tests of bench.py's rules for the job table that need no gateway, target or fio: which
jobs write (and so get an untimed FLUSH after them) and where the warm variant reads the working
set in again, as rules and as run_pass carries them out (with every server, fio run and /proc
reading stubbed). Run by make test's py tier (test/pyunit.py).
"""
import os
import sys
import unittest
from types import SimpleNamespace
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def named(*names):
    """The bench's own job tuples for names, in the order given."""
    by = {j[0]: j for j in bench.JOBS}
    return [by[n] for n in names]


class PerfCountTest(unittest.TestCase):
    """parse_perf_count reads `perf stat -x,` output as perf 6.1 writes it."""

    def parse(self, text):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        try:
            return bench.parse_perf_count(f.name)
        finally:
            os.unlink(f.name)

    def test_counted(self):
        self.assertEqual(self.parse("# started on Sat Dec  5 10:15:41 2026\n\n"
                                    "382078,,raw_syscalls:sys_enter,871349486,100.00,,\n"), 382078)

    def test_not_counted_or_missing(self):
        self.assertIsNone(self.parse("<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n"))
        self.assertIsNone(self.parse(""))
        self.assertIsNone(bench.parse_perf_count("/nonexistent/perf.csv"))


class WritesTest(unittest.TestCase):
    def test_each_job_of_the_table(self):
        got = {name: bench.writes(args) for name, args, _ in bench.JOBS}
        self.assertEqual(got, {
            "randread-4k-qd1": False, "randread-4k-qd32": False, "randwrite-4k-qd32": True,
            "seqread-1m-qd8": False, "seqwrite-1m-qd8": True, "randrw70-4k-2jobs": True})


class WarmUpsTest(unittest.TestCase):
    def test_the_job_table(self):
        # the 1 MiB write goes around the pages and supersedes them: the mix after it is warmed
        # again, as is the 1 MiB read after the 4 KiB writes; the reads after reads are not
        got = dict(zip([j[0] for j in bench.JOBS], bench.warm_ups(bench.JOBS)))
        self.assertEqual(got, {
            "randread-4k-qd1": True, "randread-4k-qd32": False, "randwrite-4k-qd32": False,
            "seqread-1m-qd8": True, "seqwrite-1m-qd8": False, "randrw70-4k-2jobs": True})

    def test_first_job_is_warmed_even_if_it_writes(self):
        self.assertEqual(bench.warm_ups(named("seqwrite-1m-qd8", "seqwrite-1m-qd8")), [True, True])

    def test_reads_only_warm_once(self):
        self.assertEqual(bench.warm_ups(named("randread-4k-qd32", "seqread-1m-qd8", "randread-4k-qd1")),
                         [True, False, False])

    def test_no_jobs(self):
        self.assertEqual(bench.warm_ups([]), [])


class RunPassTest(unittest.TestCase):
    """run_pass with stub servers: the order of what it asks of each, as (system, what, job)."""

    def run_pass(self, system_names, jobs):
        calls = []

        def server(name):
            def start(_sock):
                stop = lambda: calls.append((name, "stop", None))  # noqa: E731
                return SimpleNamespace(uri=f"nbd+unix:///{name}", proc=SimpleNamespace(pid=1), stop=stop)
            return start
        by_uri = {}

        def fio(uri, job, args, *_a, **_kw):
            calls.append((by_uri[uri], "fio", job))
            return dict(ios=1, iops=1.0, bw_mib=1.0, p50_us=1.0, errors=0)

        def flush(uri):
            calls.append((by_uri[uri], "flush", None))
            return 0.0
        stubs = [(n, server(n), n.endswith("-cold")) for n in system_names]
        for n in system_names:
            by_uri[f"nbd+unix:///{n}"] = n
        a = SimpleNamespace(runtime=1, size="1m", alt_bin=None)
        with mock.patch.multiple(bench, systems=lambda *_a, **_kw: stubs, fio=fio, flush=flush,
                                 cpu_seconds=lambda _pid: 0.0, reset_peak_rss=lambda _pid: None,
                                 peak_rss_mib=lambda _pid: 0, log=lambda *_a: None,
                                 SyscallCount=lambda _pid, _work: SimpleNamespace(stop=lambda: 7)):
            rows = bench.run_pass(a, jobs, SimpleNamespace(proc=SimpleNamespace(pid=1)), "/nonexistent",
                                  None, 0, "shared", lambda s: s != "libiscsi-direct")
        return calls, rows

    def test_warm_variant_warms_after_writes_and_cold_never(self):
        jobs = named("randread-4k-qd32", "seqwrite-1m-qd8", "randrw70-4k-2jobs")
        calls, rows = self.run_pass(["iser-blk-wb-cold"], jobs)
        s = "iser-blk-wb-cold"
        self.assertEqual(calls, [
            (s, "fio", "randread-4k-qd32"), (s, "fio", "seqwrite-1m-qd8"), (s, "flush", None),
            (s, "fio", "randrw70-4k-2jobs"), (s, "flush", None),
            (s, "fio", "warmup"), (s, "fio", "randread-4k-qd32"), (s, "fio", "seqwrite-1m-qd8"), (s, "flush", None),
            (s, "fio", "warmup"), (s, "fio", "randrw70-4k-2jobs"), (s, "flush", None),
            (s, "stop", None)])
        self.assertEqual([(r["system"], r["job"]) for r in rows],
                         [("iser-blk-wb-cold", j[0]) for j in jobs] + [("iser-blk-wb-warm", j[0]) for j in jobs])

    def test_tls_system_runs_only_its_jobs_and_no_warm_up(self):
        jobs = named("randwrite-4k-qd32", "randread-4k-qd32", "seqread-1m-qd8")
        calls, _ = self.run_pass(["iser-blk-tls"], jobs)
        s = "iser-blk-tls"
        self.assertEqual(calls, [(s, "fio", "randread-4k-qd32"), (s, "fio", "seqread-1m-qd8"), (s, "stop", None)])


if __name__ == "__main__":
    unittest.main()
