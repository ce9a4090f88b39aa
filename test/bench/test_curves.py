"""Unit tests of the scaling curves' parsing, report tables and chart scripts (curves.py), and of
the two A/B sections built on ab.py that test_ab.py does not cover (default_ab.report,
metrics_ab.report). Issue 18's closing note quotes these tables; run by make test's py tier
(test/pyunit.py), with no gateway, target, fio or gnuplot.
"""
import json
import os
import sys
import tempfile
import unittest
from types import SimpleNamespace
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402
import bench  # noqa: E402
import curves  # noqa: E402
import default_ab  # noqa: E402
import metrics_ab  # noqa: E402
from test_ab import pair_rows  # noqa: E402


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
                dict(cache_mib=256, written_mib=384, seconds=9, peak_rss_mib=900, bound_mib=832),
                dict(cache_mib=128, written_mib=192, seconds=5, peak_rss_mib=704, bound_mib=704)]
        out = curves.report({"rss": rows})
        self.assertIn("| 64 | 96 | 3 | 500 | 640 | yes |", out)
        self.assertIn("| 128 | 192 | 5 | 704 | 704 | yes |", out)  # at the bound is within it
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
        qd = list(reversed(qd_rows()))  # out of order: the data files must sort by depth
        sess = [dict(system=s, connections=n, bw_mib=100.0 * n, errors=0)
                for s in ("iser-blk-nocache --sessions 1", "qemu-nbd") for n in (2, 1)]
        rss = [dict(cache_mib=64, written_mib=96, seconds=3, peak_rss_mib=None, bound_mib=640),
               dict(cache_mib=128, written_mib=192, seconds=5, peak_rss_mib=700.25, bound_mib=704)]
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(curves, "gnuplot", side_effect=scripts.append):
            curves.charts(d, d, {"qd": qd, "sessions": sess, "rss": rss})
            with open(os.path.join(d, "curve-qd-1.dat")) as f:  # qemu-nbd: the second system seen
                self.assertEqual(f.read(), "1 7000.4 250.6\n32 14000.0 5000.0\n")
            with open(os.path.join(d, "curve-sess-0.dat")) as f:
                self.assertEqual(f.read(), "1 100.0\n2 200.0\n")
            with open(os.path.join(d, "curve-rss.dat")) as f:
                # an unread peak is no point (gnuplot skips NaN), not a point at 0 under the bound
                self.assertEqual(f.read(), "64 NaN 640\n128 700.2 704\n")
        names = ["curve-qd-iops.png", "curve-qd-p99.png", "curve-sessions.png", "curve-rss.png"]
        self.assertEqual(len(scripts), len(names))
        for s, name in zip(scripts, names):
            with self.subTest(chart=name):
                self.assertIn("set yrange [0:*]", s)
                self.assertIn(os.path.join(d, name), s)
        for script, col in ((scripts[0], 2), (scripts[1], 3)):  # IOPS, then p99
            self.assertEqual(script.count(f"using 1:{col} "), 2)
            for system in ("qemu-nbd", "iser-blk-nocache"):
                self.assertIn(f"title '{system}'", script)
        for system in ("qemu-nbd", "iser-blk-nocache --sessions 1"):
            self.assertIn(f"title '{system}'", scripts[2])


class RSSCurveTest(unittest.TestCase):
    def test_an_unreadable_peak_is_logged_and_kept_as_none(self):
        """rss_curve runs before the report: a peak it cannot read must not end the bench."""
        logged = []
        server = SimpleNamespace(proc=SimpleNamespace(pid=4242), uri="nbd+unix:///?socket=x", stop=lambda: None)
        b = SimpleNamespace(BIN="iser-blk", log=logged.append, peak_rss_mib=lambda pid: None,
                            reset_peak_rss=lambda pid: None, Tgtd=lambda *a, **kw: SimpleNamespace(url="iscsi://t",
                                                                                                 stop=lambda: None),
                            NBDServer=lambda *a, **kw: server)
        a = SimpleNamespace(rss_caches="64", rss_runtime=1)

        def fio(argv, **kw):
            out = next(x.split("=", 1)[1] for x in argv if x.startswith("--output="))
            with open(out, "w") as f:
                json.dump({"jobs": [{"write": {"io_bytes": 96 << 20}}]}, f)
        with tempfile.TemporaryDirectory() as d, mock.patch.object(curves.subprocess, "run", side_effect=fio):
            rows = curves.rss_curve(b, a, d)
        self.assertEqual(len(rows), 1)
        self.assertIsNone(rows[0]["peak_rss_mib"])
        self.assertEqual(rows[0]["written_mib"], 96)
        self.assertEqual(rows[0]["bound_mib"], 64 + curves.BUFFER_MIB + curves.RSS_SLACK_MIB)
        self.assertIn("peak RSS – MiB", logged[-1])


def ab_rows(tag, first, second, job, firsts, seconds, cpu_first=10.0):
    """test_ab's pair_rows for another A/B's systems, keyed by the job's metric."""
    return pair_rows(job, firsts, seconds, key=bench.metric_of(job), tag=tag, first=first, second=second,
                     cpu_first=cpu_first)


class ABSectionsTest(unittest.TestCase):
    def row_of(self, out, job):
        return next(l for l in out if l.startswith(f"| {job} |"))

    def test_default_ab_rows_say_met_against_0_95(self):
        def verdict(firsts, cpu_first=10.0):
            rows = ab_rows(default_ab.NAME, default_ab.DEFAULT, default_ab.OFF, "seqwrite-1m-qd8",
                           firsts, [1000] * len(firsts), cpu_first=cpu_first)
            return self.row_of(default_ab.report(bench, rows), "seqwrite-1m-qd8").split(" | ")
        at = verdict([940, 950, 950, 960])
        self.assertEqual((at[3], at[-1]), ("0.950", "yes |"))    # the median at the goal
        below = verdict([900, 940, 948, 949])
        self.assertEqual((below[3], below[-1]), ("0.944", "no |"))  # median and upper quartile short
        # median short, upper quartile at the goal: the CPU per request decides (≤ 1 / 0.95)
        self.assertEqual(verdict([900, 940, 950, 960], cpu_first=10.0)[-1], "yes |")
        costly = verdict([900, 940, 950, 960], cpu_first=10.6)
        self.assertEqual((costly[6], costly[-1]), ("1.060", "no |"))

    def test_default_ab_cold_row_says_met_against_1_03(self):
        def cells(defaults):
            rows = ab_rows(default_ab.NAME, default_ab.DEFAULT, default_ab.OFF, default_ab.COLD,
                           defaults, [100.0] * len(defaults), cpu_first=12.0)
            return self.row_of(default_ab.report(bench, rows), default_ab.COLD).split(" | ")
        within = cells([101.0, 102.5, 103.0, 104.0])  # p50 1.028x cache off's: off / default 0.973
        self.assertEqual((within[1], within[3], within[-1]), ("102.8 µs p50", "0.973", "yes |"))
        above = cells([103.0, 104.0, 104.0, 105.0])  # 1.04x, and the CPU (1.2x) does not rescue it
        self.assertEqual((above[3], above[-1]), ("0.962", "no |"))

    def test_default_ab_cold_pairs_each_read_a_range_nobody_read(self):
        a = SimpleNamespace(size="512m", lun_mb=1024, default_ab_pairs=4)
        region = default_ab.cold_region(a)
        args = dict(rw="randread", bs="4k", iodepth=1, numjobs=1)
        got = [region(default_ab.COLD, args, pair) for pair in range(4)]
        self.assertEqual([g[0]["offset"] for g in got], ["512m", "576m", "640m", "704m"])
        self.assertTrue(all(g[1] == "64m" and g[0]["time_based"] == 0 and g[0]["rw"] == "randread" and
                            g[0]["number_ios"] == default_ab.COLD_IOS for g in got))
        self.assertNotIn("offset", args)  # the job's own arguments are left as they were
        self.assertTrue(default_ab.cold_room(a))
        self.assertTrue(default_ab.cold_room(SimpleNamespace(size="512m", lun_mb=1024, default_ab_pairs=8)))
        self.assertFalse(default_ab.cold_room(SimpleNamespace(size="512m", lun_mb=1024, default_ab_pairs=9)))

    def test_interleave_gives_both_runs_of_a_pair_its_region(self):
        calls = []

        class FakeBench:
            def metric_of(self, job):
                return bench.metric_of(job)

            def cpu_seconds(self, pid):
                return 0.0

            def switches_and_syscalls(self, pid):
                return 0, 0

            def fio(self, uri, job, args, runtime, size, work, preexec=None):
                calls.append((uri, args.get("offset"), size))
                return dict(p50_us=100.0, ios=1000)

            def writes(self, args):
                return False

            def log(self, *a):
                pass
        servers = {n: SimpleNamespace(uri=n, proc=SimpleNamespace(pid=1)) for n in ("a", "b")}
        a = SimpleNamespace(size="512m", lun_mb=1024, default_ab_pairs=2)
        with tempfile.TemporaryDirectory() as d:
            rows = ab.interleave(FakeBench(), a, d, 0, servers, "a", "b",
                                 [(default_ab.COLD, dict(rw="randread"))], 2, 5, "t",
                                 region=default_ab.cold_region(a))
        self.assertEqual(calls, [("a", "512m", "64m"), ("b", "512m", "64m"),
                                 ("b", "576m", "64m"), ("a", "576m", "64m")])
        self.assertEqual(len(rows), 4)

    def test_default_ab_ignores_other_ab_rows(self):
        rows = ab_rows("release-ab", default_ab.DEFAULT, default_ab.OFF, "seqwrite-1m-qd8", [1] * 4, [1] * 4)
        self.assertEqual(default_ab.report(bench, rows), [])

    def test_metrics_ab_quotes_the_scrapes_per_on_run(self):
        rows = ab_rows(metrics_ab.NAME, metrics_ab.ON, metrics_ab.OFF, "randread-4k-qd32",
                       [20000, 19000, 21000, 20500], [20000] * 4)
        for r in rows:
            r["scrapes"] = 5 if r["system"] == metrics_ab.ON else None
        # another A/B's rows in the same list are left out (bench.py passes them all)
        rows += ab_rows(default_ab.NAME, metrics_ab.ON, metrics_ab.OFF, "randread-4k-qd32", [1] * 4, [1000] * 4)
        cells = self.row_of(metrics_ab.report(bench, rows), "randread-4k-qd32").split(" | ")
        self.assertEqual(cells[-2], "5")      # scrapes per on-run
        self.assertEqual(cells[-1], "yes |")  # median on/off 1.013


if __name__ == "__main__":
    unittest.main()
