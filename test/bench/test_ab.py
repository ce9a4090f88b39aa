"""Unit tests of the bench's statistics and verdicts (ab.py, release_ab.py): the numbers issue
15's and 18's closing notes quote come from these functions, so each is checked against values
worked by hand or against the table it approximates. Run by make test's py tier
(test/pyunit.py); no gateway, target or fio is involved.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402
import bench  # noqa: E402
import release_ab  # noqa: E402

# Student's t at 97.5 % (two-sided 95 %), from the printed table.
T_TABLE = {3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 8: 2.3060, 10: 2.2281, 15: 2.1314, 20: 2.0860,
           30: 2.0423, 60: 2.0003, 120: 1.9799}


def pair_rows(job, new_vals, old_vals, key="iops", rep=0, tag=release_ab.NAME, first=release_ab.NEW,
              second=release_ab.OLD, cpu_first=10.0, **extra):
    """Rows of an A/B (release_ab's unless tag, first and second say another) as ab.interleave
    records them: one per system per pair; first's CPU per request is cpu_first, second's 10."""
    rows = []
    for pair, (n, o) in enumerate(zip(new_vals, old_vals)):
        for system, v, cpu in ((first, n, cpu_first), (second, o, 10.0)):
            rows.append(dict({"ab": tag, "job": job, "rep": rep, "pair": pair,
                              "system": system, key: v, "gw_cpu_us_per_io": cpu}, **extra))
    return rows


class RatioTest(unittest.TestCase):
    def test_rate_and_latency_point_the_same_way(self):
        self.assertAlmostEqual(ab.ratio("iops", 110, 100), 1.1)
        self.assertAlmostEqual(ab.ratio("bw_mib", 90, 100), 0.9)
        # a latency: lower is better, so the first system's 90 µs against 100 is 1.11× better
        self.assertAlmostEqual(ab.ratio("p50_us", 90, 100), 100 / 90)

    def test_zero_denominator_is_no_ratio(self):
        self.assertEqual(ab.ratio("iops", 5, 0), 0)
        self.assertEqual(ab.ratio("p50_us", 0, 5), 0)

    def test_ratios_pair_by_repetition_and_pair(self):
        rows = pair_rows("randread-4k-qd32", [100, 200], [50, 100])
        rows += pair_rows("randread-4k-qd32", [300], [100], rep=1)
        rows.append({"job": "randread-4k-qd32", "rep": 2, "pair": 0, "system": release_ab.NEW, "iops": 7})
        got = ab.ratios(rows, "randread-4k-qd32", "iops", release_ab.NEW, release_ab.OLD)
        # rep 2 has no alt run: no ratio from it
        self.assertEqual(sorted(got), [2.0, 2.0, 3.0])

    def test_cost_ratios_are_plain(self):
        rows = pair_rows("randread-4k-qd1", [50], [100], key="p50_us")
        got = ab.ratios(rows, "randread-4k-qd1", "p50_us", release_ab.NEW, release_ab.OLD, better=False)
        self.assertEqual(got, [0.5])


class IntervalTest(unittest.TestCase):
    def test_t975_against_the_table(self):
        # from df 3: geo_ci's fewest pairs, 4
        for df, t in T_TABLE.items():
            self.assertLess(abs(ab.t975(df) / t - 1), 0.002, f"df={df}: {ab.t975(df):.4f} against {t}")

    def test_geo_ci_needs_four_positive_ratios(self):
        self.assertIsNone(ab.geo_ci([1.0, 1.0, 1.0]))
        self.assertIsNone(ab.geo_ci([1.0, 1.0, 0.0, 1.0]))

    def test_geo_ci_by_hand(self):
        # logs ±0.1 alternating: mean 0, sample sd sqrt(4 · 0.01 / 3), half-width t(3) · sd / 2
        e = math.exp(0.1)
        g, lo, hi = ab.geo_ci([e, 1 / e, e, 1 / e])
        half = T_TABLE[3] * math.sqrt(0.04 / 3) / 2
        self.assertAlmostEqual(g, 1.0)
        self.assertAlmostEqual(math.log(lo), -half, delta=0.002 * half)  # t975's 0.2 % at df 3
        self.assertAlmostEqual(math.log(hi), half, delta=0.002 * half)

    def test_geo_ci_is_symmetric_under_inversion(self):
        rs = [0.91, 1.07, 0.99, 1.12, 0.95, 1.03]
        g, lo, hi = ab.geo_ci(rs)
        gi, loi, hii = ab.geo_ci([1 / r for r in rs])
        self.assertAlmostEqual(g * gi, 1.0)
        self.assertAlmostEqual(lo * hii, 1.0)
        self.assertAlmostEqual(hi * loi, 1.0)

    def test_identical_ratios_have_no_width(self):
        g, lo, hi = ab.geo_ci([1.02] * 5)
        self.assertAlmostEqual(g, 1.02)
        self.assertAlmostEqual(lo, 1.02)
        self.assertAlmostEqual(hi, 1.02)


class VerdictTest(unittest.TestCase):
    def test_yes_no_open(self):
        self.assertEqual(release_ab.verdict([1.0, 1.01, 0.99, 1.0, 1.02, 0.98], 0.97), "yes")
        self.assertEqual(release_ab.verdict([0.90, 0.91, 0.89, 0.90, 0.92, 0.88], 0.97), "no")
        self.assertEqual(release_ab.verdict([1.0, 1.0], 0.97), "open (under 4 pairs)")

    def test_open_says_how_many_pairs_would_settle_it(self):
        # The quoted count is the pairs at which the interval, shrinking as 1/sqrt(pairs), clears
        # the goal if mean and spread hold: repeating the pattern to 10 % more pairs than quoted
        # must say yes, to 30 % fewer still open (a repeated pattern's sample spread is a little
        # smaller than the 6 pairs': sqrt(5/6)).
        pattern = [1.10, 0.90, 1.10, 0.90, 1.12, 0.92]
        got = release_ab.verdict(pattern, 0.97)
        self.assertRegex(got, r"^open \(~\d+ pairs\)$")
        need = int(got.split("~")[1].split()[0])
        self.assertGreater(need, 2 * len(pattern))  # far from settled at 6 pairs
        more = pattern * math.ceil(need * 1.1 / len(pattern))
        fewer = pattern * math.floor(need * 0.7 / len(pattern))
        self.assertEqual(release_ab.verdict(more, 0.97), "yes")
        self.assertTrue(release_ab.verdict(fewer, 0.97).startswith("open"), len(fewer))

    def test_a_mean_at_the_goal_quotes_no_number(self):
        self.assertEqual(release_ab.verdict([0.90, 1.04, 0.90, 1.04], 0.97), "open")  # mean below goal
        rs = [0.8, 1.18, 0.8, 1.18, 0.8, 1.18]  # mean just above the goal, wide spread
        self.assertGreater(ab.geo_ci(rs)[0], 0.97)
        self.assertEqual(release_ab.verdict(rs, 0.97), f"open (over {release_ab.MAX_PAIRS_QUOTED} pairs)")

    def test_met_lets_cpu_decide_only_within_the_rate_noise(self):
        self.assertTrue(ab.met([0.98, 0.99, 1.0], [1.2], 0.97))            # median reaches it
        self.assertTrue(ab.met([0.90, 0.95, 0.98, 1.01], [1.0], 0.97))     # upper quartile + CPU
        self.assertFalse(ab.met([0.90, 0.95, 0.98, 1.01], [1.05], 0.97))   # CPU short of it
        self.assertFalse(ab.met([0.90, 0.91, 0.92, 0.93], [0.5], 0.97))    # both quartiles short


class ReportTest(unittest.TestCase):
    def rows(self):
        rs = pair_rows("randread-4k-qd32", [100, 101, 99, 100, 102], [100, 100, 100, 100, 100],
                       gw_switches_per_io=0.6, gw_syscalls_per_io=3.0)
        # a latency job: the alt's p50 over this tree's, so 110 µs against 100 is 0.909
        rs += pair_rows("randread-4k-qd1", [110, 110, 110, 110], [100, 100, 100, 100], key="p50_us")
        return rs + pair_rows("seqwrite-1m-qd8", [90, 91, 89, 90], [100, 100, 100, 100], key="bw_mib")

    def test_report_has_a_row_and_verdict_per_job_with_pairs(self):
        out = "\n".join(release_ab.report(bench, self.rows(), "5469c4e", per_start=2))
        self.assertIn("this tree against 5469c4e", out)
        self.assertIn("started afresh every 2 pairs", out)
        read = [line for line in out.splitlines() if line.startswith("| randread-4k-qd32 |")]
        write = [line for line in out.splitlines() if line.startswith("| seqwrite-1m-qd8 |")]
        self.assertEqual(len(read), 2)  # the speed table and the cost table
        self.assertTrue(read[0].endswith("| yes |"), read[0])
        self.assertTrue(write[0].endswith("| no |"), write[0])
        self.assertIn("| 0.60 | 0.60 | 3.00 | 3.00 |", read[1])
        self.assertIn("| – | – | – | – |", write[1])  # rows without the counters
        qd1 = [line for line in out.splitlines() if line.startswith("| randread-4k-qd1 |")]
        self.assertIn("110.0 µs p50", qd1[0])
        self.assertIn("| 0.909 |", qd1[0])
        self.assertTrue(qd1[0].endswith("| no |"), qd1[0])

    def test_report_names_the_cache_mode_its_rows_ran(self):
        out = "\n".join(release_ab.report(bench, self.rows(), "5469c4e"))
        self.assertIn("5469c4e, cache off, interleaved", out)  # rows from before the field: off
        warm = [dict(r, cache="writeback-warm") for r in self.rows()]
        out = "\n".join(release_ab.report(bench, warm, "5469c4e"))
        self.assertIn("5469c4e, write-back cache, warm", out)

    def test_report_of_nothing_is_empty(self):
        self.assertEqual(release_ab.report(bench, [], "x"), [])

    def test_pooling_cli_keeps_repetitions_of_each_file_apart(self):
        # two files, each with rep 0 and pair 0: pooled, they are two pairs, not one overwritten
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, (n, o) in enumerate(((100, 100), (120, 100))):
                rows = pair_rows("randwrite-4k-qd32", [n, n, n, n], [o, o, o, o])
                paths.append(os.path.join(d, f"results-{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump({"results": rows}, f)
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "release_ab.py")
            out = subprocess.run([sys.executable, script, *paths, "--alt-name", "old", "--per-start", "2"],
                                 capture_output=True, text=True, check=True).stdout
        self.assertIn("this tree against old", out)
        row = [line for line in out.splitlines() if line.startswith("| randwrite-4k-qd32 |")][0]
        self.assertIn("| 8 |", row)  # 4 pairs from each file


class ProcCountersTest(unittest.TestCase):
    """bench.switches_and_syscalls and cpu_seconds read /proc: checked on this process."""

    def test_another_threads_syscalls_and_switches_count(self):
        # The work happens on a second thread, as a gateway's I/O runs on threads other than its
        # main one, and is read while that thread lives: /proc/PID/task lists live threads only
        # (a Go gateway keeps its threads; this Python one does not).
        worked, release = threading.Event(), threading.Event()

        def work():
            fd = os.open("/dev/zero", os.O_RDONLY)
            try:
                for _ in range(200):
                    os.read(fd, 1)
            finally:
                os.close(fd)
            for _ in range(20):
                time.sleep(0.0005)  # each one parks the thread: a voluntary context switch
            worked.set()
            release.wait()
        s0, y0 = bench.switches_and_syscalls(os.getpid())
        t = threading.Thread(target=work)
        t.start()
        try:
            self.assertTrue(worked.wait(10))
            s1, y1 = bench.switches_and_syscalls(os.getpid())
        finally:
            release.set()
            t.join()
        self.assertGreaterEqual(y1 - y0, 200)
        self.assertGreaterEqual(s1 - s0, 20)

    def test_a_gone_process_reads_as_zero(self):
        p = subprocess.Popen(["true"])
        p.wait()
        self.assertEqual(bench.switches_and_syscalls(p.pid), (0, 0))
        self.assertEqual(bench.cpu_seconds(p.pid), 0.0)


if __name__ == "__main__":
    unittest.main()
