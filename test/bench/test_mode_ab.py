"""Unit tests of mode_ab.py's summary (issue 37's findings quote it): ratios are taken per pair
against the last system and summarised by median and range, and a pair missing a system is left
out rather than compared with another pair's run. Run by make test's py tier; no gateway, target
or fio is involved.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mode_ab  # noqa: E402


def row(system, job, pair, p50=0.0, bw=0.0, cpu=1.0):
    return dict(system=system, job=job, pair=pair, p50_us=p50, bw_mib=bw, gw_cpu_us_per_io=cpu)


class SummaryTest(unittest.TestCase):
    def test_per_pair_ratios_against_the_last_system(self):
        job = "randread-4k-qd1-cold"
        rows = [row("wb", job, 0, p50=90, cpu=45), row("off", job, 0, p50=60, cpu=30),
                row("wb", job, 1, p50=70, cpu=40), row("off", job, 1, p50=70, cpu=40),
                row("wb", job, 2, p50=66, cpu=33), row("off", job, 2, p50=60, cpu=30)]
        d = dict(systems={"wb": "a:writeback", "off": "a:off"}, jobs=[job], rows=rows)
        lines = mode_ab.summary(d).splitlines()
        self.assertIn("3 pairs", lines[0])
        wb = lines[1].split()
        # p50 ratios 1.5, 1.0, 1.1: median 1.1, range 1.0–1.5; CPU ratios the same.
        self.assertEqual(wb[0], "wb")
        self.assertEqual(float(wb[1]), 70.0)
        self.assertEqual(wb[3], "1.100")
        self.assertEqual(wb[4], "(1.000–1.500)")
        self.assertEqual(wb[8], "1.100")
        off = lines[2].split()
        self.assertEqual((off[3], off[4]), ("1.000", "(1.000–1.000)"))

    def test_rate_jobs_use_bandwidth_and_incomplete_pairs_are_left_out(self):
        job = "seqread-1m-qd8"
        rows = [row("wb", job, 0, bw=900, cpu=260), row("off", job, 0, bw=1000, cpu=250),
                row("wb", job, 1, bw=100, cpu=999)]  # its partner never ran
        d = dict(systems={"wb": "a:writeback", "off": "a:off"}, jobs=[job], rows=rows)
        lines = mode_ab.summary(d).splitlines()
        self.assertIn("bw_mib", lines[0])
        self.assertIn("1 pairs", lines[0])
        wb = lines[1].split()
        self.assertEqual((wb[1], wb[3]), ("900.0", "0.900"))
        self.assertEqual(wb[8], "1.040")

    def test_faults_per_io_are_shown_when_recorded(self):
        job = "randread-4k-qd1-cold"
        rows = [row("wb", job, 0, p50=90, cpu=45), row("off", job, 0, p50=60, cpu=30),
                row("wb", job, 1, p50=70, cpu=40), row("off", job, 1, p50=70, cpu=40)]
        for r, f in zip(rows, (1.1, 0.0, 0.9, 0.02)):
            r["gw_minflt_per_io"] = f
        d = dict(systems={"wb": "a:writeback", "off": "a:off"}, jobs=[job], rows=rows)
        lines = mode_ab.summary(d).splitlines()
        self.assertTrue(lines[1].endswith("faults/IO 1.00"), lines[1])
        self.assertTrue(lines[2].endswith("faults/IO 0.01"), lines[2])
        # runs recorded before the field existed print no column
        for r in rows:
            del r["gw_minflt_per_io"]
        self.assertNotIn("faults", mode_ab.summary(d))


class ColdRunTest(unittest.TestCase):
    def test_a_cold_run_reads_a_few_blocks_of_its_own_region_once(self):
        args = dict(rw="randread", bs="4k", iodepth=1)
        run, size = mode_ab.cold_run(args, 9)
        self.assertEqual((run["offset"], size), (f"{9 * mode_ab.REGION_MB}m", f"{mode_ab.REGION_MB}m"))
        self.assertEqual((run["time_based"], run["number_ios"], run["rw"]), (0, mode_ab.COLD_IOS, "randread"))
        self.assertNotIn("offset", args)
        # a fifth of the region at most: few reads land beside a recent one (see the module doc)
        self.assertLessEqual(mode_ab.COLD_IOS * 4096 * 5, mode_ab.REGION_MB << 20)


if __name__ == "__main__":
    unittest.main()
