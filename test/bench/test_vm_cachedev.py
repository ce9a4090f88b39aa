"""Unit tests of vm_cachedev.py, the goals table of issue #39's VM rows for --cache-dev: file
parsing (fio's separate write and sync latencies, pgbench's TPS line), per-repetition ratios and
verdicts, and the chart's y axis from 0. Run by make test's py tier (test/pyunit.py), with no
guest, fio or gnuplot.
"""
import io
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vm_cachedev  # noqa: E402


def fio_json(iops, mibps=1.0, write_p50=100, write_p99=200, sync_p50=None, sync_p99=None, read=False, syncs=0):
    """A fio JSON document with the fields vm_cachedev reads; latencies in µs."""
    def lat(p50, p99):
        return {"percentile": {"50.000000": p50 * 1e3, "99.000000": p99 * 1e3}}
    d = {"iops": iops, "bw_bytes": mibps * 2**20, "clat_ns": lat(write_p50, write_p99)}
    empty = {"iops": 0, "bw_bytes": 0, "clat_ns": lat(0, 0)}
    j = {"error": 0, "read": d if read else empty, "write": empty if read else d}
    if sync_p50 is not None:
        j["sync"] = {"total_ios": syncs, "lat_ns": lat(sync_p50, sync_p99)}
    return {"jobs": [j]}


PGBENCH = """transaction type: <builtin: TPC-B (sort of)>
number of clients: 4
latency average = 35.000 ms
initial connection time = 12.345 ms
tps = {tps} (without initial connection time)
"""


class Fixture(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.guest = os.path.join(self.tmp.name, "guest")
        os.mkdir(self.guest)

    def tearDown(self):
        self.tmp.cleanup()

    def put(self, name, doc):
        with open(os.path.join(self.guest, name), "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))

    def two_reps(self):
        # rep 1 and rep 2 differ (drift): the ratios are per repetition
        for rep, k in ((1, 1.0), (2, 2.0)):
            self.put(f"{rep}-commit-4k-qd1-local.json", fio_json(1000, write_p50=50 * k, sync_p50=50 * k, sync_p99=90 * k, write_p99=60 * k))
            self.put(f"{rep}-commit-4k-qd1-off.json", fio_json(200, write_p50=200 * k, sync_p50=200 * k, sync_p99=3000 * k, write_p99=2000 * k))
            self.put(f"{rep}-commit-4k-qd1-wb.json", fio_json(300, write_p50=100 * k, sync_p50=1900 * k, sync_p99=4000 * k, write_p99=300 * k))
            # cd: 1.2× local and 0.3× off in rep 1; 1.4× and 0.35× in rep 2
            self.put(f"{rep}-commit-4k-qd1-cd.json", fio_json(900, write_p50=60 * k * (1 if rep == 1 else 7 / 6),
                                                              sync_p50=60 * k * (1 if rep == 1 else 7 / 6),
                                                              write_p99=100 * k, sync_p99=200 * k))
            self.put(f"{rep}-seqwrite-1m-qd8-off.json", fio_json(100, mibps=100 * k))
            self.put(f"{rep}-seqwrite-1m-qd8-cd.json", fio_json(96, mibps=96 * k))
            self.put(f"{rep}-randread-4k-qd32-local.json", fio_json(1000 * k, read=True))
            self.put(f"{rep}-randread-4k-qd32-cd.json", fio_json(700 * k, read=True))
            self.put(f"{rep}-pgbench-off.txt", PGBENCH.format(tps=10 * k))
            self.put(f"{rep}-pgbench-wb.txt", PGBENCH.format(tps=20 * k))
            self.put(f"{rep}-pgbench-cd.txt", PGBENCH.format(tps=35 * k))
        # files of other kinds in the directory are not runs
        self.put("1-randread-fill-cd.txt", "fill: (groupid=0): err= 0\n")
        self.put("cd.status.json", {})


class ParseTest(Fixture):
    def test_commit_sums_write_and_sync_latency(self):
        self.put("1-commit-4k-qd1-cd.json", fio_json(2000, write_p50=70, write_p99=150, sync_p50=30, sync_p99=400))
        r = vm_cachedev.load(self.guest)[("commit-4k-qd1", "cd")][1]
        self.assertAlmostEqual(r["commit_p50_us"], 100)
        self.assertAlmostEqual(r["commit_p99_us"], 550)
        self.assertAlmostEqual(r["cycle_us"], 500)

    def test_randread_reads_the_read_side(self):
        self.put("3-randread-4k-qd32-local.json", fio_json(1234, mibps=4.8, read=True))
        self.assertEqual(vm_cachedev.load(self.guest)[("randread-4k-qd32", "local")][3]["iops"], 1234)

    def test_pgbench_tps_and_a_run_without_it(self):
        self.assertEqual(vm_cachedev.parse_pgbench(PGBENCH.format(tps="123.456789")),
                         dict(tps=123.456789, latency_ms=35.0))
        self.assertIsNone(vm_cachedev.parse_pgbench("pgbench: error: connection refused\n"))

    def test_other_files_are_not_runs(self):
        self.two_reps()
        runs = vm_cachedev.load(self.guest)
        self.assertNotIn(("randread-fill", "cd"), runs)
        self.assertEqual(sorted(runs[("pgbench", "cd")]), [1, 2])


JBD2 = """{n} transactions ({n} requested), each up to 8192 blocks
average: 
  0ms waiting for transaction
  0ms logging transaction
  {avg}us average transaction commit time
  2 handles per transaction
"""


class DiagnosticsTest(Fixture):
    def test_journal_commits_and_log_syncs_per_fsync(self):
        self.put("1-commit-4k-qd1-cd.json", fio_json(100, sync_p50=1, sync_p99=2, syncs=200))
        self.put("1-commit-4k-qd1-cd.jbd2.before", JBD2.format(n=10, avg=900))
        self.put("1-commit-4k-qd1-cd.jbd2.after", JBD2.format(n=210, avg=1100))
        self.put("1-commit-4k-qd1-cd.before.json", {"cache": {"device": {"syncs": 5}}})
        self.put("1-commit-4k-qd1-cd.after.json", {"cache": {"device": {"syncs": 405}}})
        c = vm_cachedev.commit_stats(self.guest, {})
        self.assertEqual(c, [dict(rep=1, system="cd", fsyncs=200, jbd2_commits_per_fsync=1.0,
                                  jbd2_avg_commit_us=1100, log_syncs_per_fsync=2.0)])

    def test_strace_durations_include_resumed_calls(self):
        self.put("diag-strace-cd.txt", "\n".join([
            "101   fdatasync(7)                      = 0 <0.001000>",
            "101   fdatasync(7 <unfinished ...>",
            "102   pwritev(7, [{iov_base=\"x\", iov_len=4096}], 1, 8192) = 4096 <0.000050>",
            "101   <... fdatasync resumed>)           = 0 <0.003000>",
            "101   fdatasync(7)                      = 0 <0.002000>",
            "102   futex(0x1, FUTEX_WAKE, 1)         = 1 <0.000010>",
        ]) + "\n")
        st = vm_cachedev.strace_stats(os.path.join(self.guest, "diag-strace-cd.txt"))
        self.assertEqual(st["fdatasync"], (3, 2000.0, 3000.0))
        self.assertEqual(st["pwritev"], (1, 50.0, 50.0))
        self.assertNotIn("futex", st)
        self.assertEqual(vm_cachedev.strace_stats(os.path.join(self.guest, "none.txt")), {})


class VerdictTest(Fixture):
    def test_ratios_are_per_repetition_and_the_verdict_takes_their_median(self):
        self.two_reps()
        rows = {r["row"]: r for r in vm_cachedev.verdicts(vm_cachedev.load(self.guest))}
        self.assertEqual([round(x, 3) for x in rows["1a"]["ratios"]], [1.2, 1.4])
        self.assertAlmostEqual(rows["1a"]["median"], 1.3)
        self.assertTrue(rows["1a"]["met"])
        # 0.3 and 0.35 against ≤ 0.3: the median 0.325 misses, by 0.325 / 0.3
        self.assertAlmostEqual(rows["1b"]["median"], 0.325)
        self.assertFalse(rows["1b"]["met"])
        self.assertAlmostEqual(rows["1b"]["off_by"], 0.325 / 0.3)
        self.assertAlmostEqual(rows["2a"]["median"], 3.5)
        self.assertTrue(rows["2a"]["met"])
        self.assertAlmostEqual(rows["2b"]["median"], 1.75)
        self.assertAlmostEqual(rows["3"]["median"], 0.96)
        self.assertTrue(rows["3"]["met"])
        # a ≥ goal missed: 0.7 against 0.8 is off by 0.8 / 0.7
        self.assertFalse(rows["4"]["met"])
        self.assertAlmostEqual(rows["4"]["off_by"], 0.8 / 0.7)

    def test_a_repetition_missing_one_side_gives_no_ratio(self):
        self.two_reps()
        os.remove(os.path.join(self.guest, "2-pgbench-off.txt"))
        rows = {r["row"]: r for r in vm_cachedev.verdicts(vm_cachedev.load(self.guest))}
        self.assertEqual(rows["2a"]["ratios"], [3.5])

    def test_no_runs_is_no_verdict_not_a_pass(self):
        rows = vm_cachedev.verdicts({})
        self.assertTrue(all(r["met"] is None and r["median"] is None for r in rows))
        table = "\n".join(vm_cachedev.report({}, rows, []))
        self.assertNotIn("yes", table)


class ReportTest(Fixture):
    def test_table_and_summary_and_chart(self):
        self.two_reps()
        self.put("1-randread-4k-qd32-cd.before.json",
                 {"cache": {"hits": 10, "misses": 5, "device": {"log_bytes": 80 << 20, "dirty_bytes": 64 << 20}}})
        self.put("1-randread-4k-qd32-cd.after.json",
                 {"cache": {"hits": 1010, "misses": 25, "device": {"log_bytes": 0, "dirty_bytes": 0}}})
        scripts = []
        with mock.patch.object(vm_cachedev.subprocess, "run", lambda cmd, input, **kw: scripts.append(input)), \
                mock.patch("sys.stdout", new_callable=io.StringIO):
            self.assertEqual(vm_cachedev.main(["vm_cachedev.py", self.tmp.name]), 0)
        with open(os.path.join(self.tmp.name, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(len(s["goals"]), 6)
        self.assertEqual(s["reads"][0]["ram_hits"], 1000)
        self.assertIn("1", s["runs"]["pgbench cd"])
        table = "\n".join(vm_cachedev.report(vm_cachedev.load(self.guest), vm_cachedev.verdicts(
            vm_cachedev.load(self.guest)), vm_cachedev.reading_stats(self.guest)))
        self.assertIn("| 1b |", table)
        self.assertIn("no (off by 1.08×)", table)
        self.assertIn("**1.300** (1.200–1.400) | yes", table)
        self.assertIn("RAM cache 1000 hits / 20 misses", table)
        # the chart: one script, y axis from 0, every system with a commit run
        self.assertEqual(len(scripts), 1)
        self.assertIn("set yrange [0:*]", scripts[0])
        with open(os.path.join(self.tmp.name, "commit-latency.dat")) as f:
            dat = f.read()
        for name in ("cache off", "RAM write-back", "--cache-dev", "local ext4"):
            self.assertIn(name, dat)


if __name__ == "__main__":
    unittest.main()
