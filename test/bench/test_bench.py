"""Unit tests of bench.py's rules for the job table that need no gateway, target or fio: which
jobs write (and so get an untimed FLUSH after them) and where the warm variant reads the working
set in again. Run by make test's py tier (test/pyunit.py).
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def named(*names):
    """The bench's own job tuples for names, in the order given."""
    by = {j[0]: j for j in bench.JOBS}
    return [by[n] for n in names]


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


if __name__ == "__main__":
    unittest.main()
