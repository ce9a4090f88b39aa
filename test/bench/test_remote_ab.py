"""Unit test of remote_ab.py's summary: per job and system the median of the job's metric and the
per-pair ratios to off, local and wb. Run by make test's py tier (test/pyunit.py)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remote_ab  # noqa: E402


def commit(pair, system, write_us, sync_us):
    return dict(pair=pair, job="commit-4k-qd1", system=system, p50_us=write_us, sync_p50_us=sync_us,
                commit_p50_us=write_us + sync_us)


class SummaryTest(unittest.TestCase):
    def test_commit_ratios_are_per_pair(self):
        rows = [commit(0, "off", 1300, 1300), commit(0, "cd", 35, 125), commit(0, "local", 7, 153),
                commit(0, "wb", 40, 2560),
                commit(1, "off", 1300, 1700), commit(1, "cd", 40, 140), commit(1, "local", 6, 174),
                commit(1, "wb", 40, 2960)]
        rows += [dict(pair=p, job="pgbench", system=s, tps=t) for p, s, t in
                 [(0, "off", 400), (0, "cd", 1200), (0, "wb", 400), (0, "local", 2000)]]
        d = dict(delay_ms=0.5, echo_rtt_us=1150.0, cache_dir="/var/tmp", runtime=5, rows=rows)
        lines = remote_ab.summary(d)
        by = {tuple(l.split(" | ")[:2]): l for l in lines if l.startswith("| ")}
        cd = by[("| commit-4k-qd1", "cd")]
        # pair 0: 160/2600 = 0.0615, pair 1: 180/3000 = 0.06, median 0.0608; vs local 1.0 and 1.0
        self.assertIn("| 0.061 (0.060–0.062) | 1.000 (1.000–1.000) |", cd)
        self.assertIn("170.0 commit_p50_us", cd)
        self.assertIn("37.5 + 132.5", cd)
        pg = by[("| pgbench", "cd")]
        self.assertIn("| 3.000 (3.000–3.000) | 0.600 (0.600–0.600) | 3.000 (3.000–3.000) |", pg)
        self.assertIn("| – |", pg)  # no write + sync latency for pgbench
        self.assertIn("2 interleaved pairs of 5 s", lines[0])


if __name__ == "__main__":
    unittest.main()
