"""Unit tests of the scaling curves' parsing, report tables and chart scripts (curves.py), and of
the two A/B sections built on ab.py that test_ab.py does not cover (default_ab.report,
metrics_ab.report). Issue 18's closing note quotes these tables; run by make test's py tier
(test/pyunit.py), with no gateway, target, fio or gnuplot.
"""
import os
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import curves  # noqa: E402
import default_ab  # noqa: E402
import metrics_ab  # noqa: E402


class ParseTest(unittest.TestCase):
    def test_ints_skip_empty_items(self):
        self.assertEqual(curves.ints("1,2, 4,,256"), [1, 2, 4, 256])
        self.assertEqual(curves.ints(""), [])

    def test_size_mib_takes_fio_suffixes_and_bytes(self):
        for s, want in (("512m", 512), ("1g", 1024), ("1G", 1024), ("2048k", 2), ("1t", 1 << 20),
                        (str(3 << 20), 3), (" 64M ", 64)):
            with self.subTest(s=s):
                self.assertEqual(curves.size_mib(s), want)


def qd_rows():
    return [dict(system=s, qd=qd, iops=iops, p99_us=p99, errors=0)
            for s, qd, iops, p99 in (("qemu-nbd", 1, 7000.4, 250.6), ("qemu-nbd", 32, 14000, 5000),
                                     ("iser-blk-nocache", 32, 21000, 4000))]


class ReportTest(unittest.TestCase):
    def test_qd_table_has_a_row_per_depth_and_a_dash_where_a_system_did_not_run(self):
        out = curves.report({"qd": qd_rows()})
        head = next(i for i, l in enumerate(out) if l.startswith("| QD |"))
        self.assertEqual(out[head], "| QD | qemu-nbd | iser-blk-nocache |")
        self.assertEqual(out[head + 2], "| 1 | 7000 / 251 | – |")
        self.assertEqual(out[head + 3], "| 32 | 14000 / 5000 | 21000 / 4000 |")
        self.assertTrue(any("curve-qd-iops.png" in l for l in out))

    def test_sessions_table_has_a_column_per_connection_count(self):
        rows = [dict(system="iser-blk-nocache --sessions 1", connections=n, bw_mib=100.0 * n, errors=0)
                for n in (1, 2)]
        rows.append(dict(system="qemu-nbd", connections=2, bw_mib=220.4, errors=0))
        out = curves.report({"sessions": rows})
        self.assertIn("| system | 1 conn | 2 conn |", out)
        self.assertIn("| iser-blk-nocache --sessions 1 | 100 | 200 |", out)
        self.assertIn("| qemu-nbd | – | 220 |", out)

    def test_rss_rows_say_met_against_their_bound(self):
        rows = [dict(cache_mib=64, written_mib=96, seconds=3, peak_rss_mib=500, bound_mib=640),
                dict(cache_mib=256, written_mib=384, seconds=9, peak_rss_mib=900, bound_mib=832)]
        out = curves.report({"rss": rows})
        self.assertIn("| 64 | 96 | 3 | 500 | 640 | yes |", out)
        self.assertIn("| 256 | 384 | 9 | 900 | 832 | no |", out)

    def test_rss_row_without_a_peak_is_not_met_and_does_not_break_the_report(self):
        # peak_rss_mib is None when the gateway's /proc entry was gone before it was read
        rows = [dict(cache_mib=64, written_mib=0, seconds=1, peak_rss_mib=None, bound_mib=640)]
        self.assertIn("| 64 | 0 | 1 | – | 640 | no |", curves.report({"rss": rows}))

    def test_no_curves_no_sections(self):
        self.assertEqual(curves.report({}), [])
        self.assertEqual(curves.report({"qd": [], "sessions": [], "rss": []}), [])


class ChartsTest(unittest.TestCase):
    def test_every_chart_starts_its_y_axis_at_zero_and_plots_every_system(self):
        scripts = []
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(curves, "gnuplot", side_effect=scripts.append):
            rss = [dict(cache_mib=64, written_mib=96, seconds=3, peak_rss_mib=None, bound_mib=640)]
            sess = [dict(system="qemu-nbd", connections=1, bw_mib=200.0, errors=0)]
            curves.charts(d, d, {"qd": qd_rows(), "sessions": sess, "rss": rss})
            # the qd data files: one per system, sorted by depth
            with open(os.path.join(d, "curve-qd-0.dat")) as f:
                self.assertEqual(f.read(), "1 7000.4 250.6\n32 14000.0 5000.0\n")
            with open(os.path.join(d, "curve-rss.dat")) as f:
                self.assertEqual(f.read(), "64 0.0 640\n")  # a missing peak plots at 0, not a crash
        names = ["curve-qd-iops.png", "curve-qd-p99.png", "curve-sessions.png", "curve-rss.png"]
        self.assertEqual(len(scripts), len(names))
        for s, name in zip(scripts, names):
            with self.subTest(chart=name):
                self.assertIn("set yrange [0:*]", s)
                self.assertIn(os.path.join(d, name), s)
        for system in ("qemu-nbd", "iser-blk-nocache"):
            self.assertIn(f"title '{system}'", scripts[0])


def ab_rows(tag, first, second, job, firsts, seconds, cpu_first=10.0, **extra):
    rows = []
    for pair, (x, y) in enumerate(zip(firsts, seconds)):
        for system, v, cpu in ((first, x, cpu_first), (second, y, 10.0)):
            rows.append(dict({"ab": tag, "job": job, "rep": 0, "pair": pair, "system": system,
                              bench.metric_of(job): v, "gw_cpu_us_per_io": cpu}, **extra))
    return rows


class ABSectionsTest(unittest.TestCase):
    def row_of(self, out, job):
        return next(l for l in out if l.startswith(f"| {job} |"))

    def test_default_ab_rows_say_met_against_0_95(self):
        rows = ab_rows(default_ab.NAME, default_ab.DEFAULT, default_ab.OFF, "seqwrite-1m-qd8",
                       [960, 950, 970, 940], [1000] * 4)
        rows += ab_rows(default_ab.NAME, default_ab.DEFAULT, default_ab.OFF, "seqread-1m-qd8",
                        [800, 850, 820, 900], [1000] * 4, cpu_first=12.0)
        out = default_ab.report(bench, rows)
        write = self.row_of(out, "seqwrite-1m-qd8").split(" | ")
        self.assertEqual(write[3], "0.955")   # the speed's median
        self.assertEqual(write[-1], "yes |")
        read = self.row_of(out, "seqread-1m-qd8").split(" | ")
        self.assertEqual(read[6], "1.200")    # the CPU ratio: default costs more
        self.assertEqual(read[-1], "no |")

    def test_default_ab_ignores_other_ab_rows(self):
        rows = ab_rows("release-ab", default_ab.DEFAULT, default_ab.OFF, "seqwrite-1m-qd8", [1] * 4, [1] * 4)
        self.assertEqual(default_ab.report(bench, rows), [])

    def test_metrics_ab_quotes_the_scrapes_per_on_run(self):
        rows = ab_rows(metrics_ab.NAME, metrics_ab.ON, metrics_ab.OFF, "randread-4k-qd32",
                       [20000, 19000, 21000, 20500], [20000] * 4)
        for r in rows:
            r["scrapes"] = 5 if r["system"] == metrics_ab.ON else None
        cells = self.row_of(metrics_ab.report(bench, rows), "randread-4k-qd32").split(" | ")
        self.assertEqual(cells[-2], "5")      # scrapes per on-run
        self.assertEqual(cells[-1], "yes |")  # median on/off 1.013


if __name__ == "__main__":
    unittest.main()
