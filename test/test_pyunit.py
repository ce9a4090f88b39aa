"""Unit tests of make test's own counting: the py tier (pyunit.py) counts and names what failed,
and `make tally` sums every tier's line and recaps the failures above the total (CI shows a log's
tail, so the recap is how a red run says what broke). Run by the py tier itself, on throwaway
test directories and tally files; nothing here runs the real tiers.
"""
import contextlib
import io
import os
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyunit  # noqa: E402
from maketally import make_tally  # noqa: E402

MIXED = textwrap.dedent("""\
    import unittest

    class Mixed(unittest.TestCase):
        def test_passes(self):
            pass

        def test_fails(self):
            self.assertEqual(1, 2)

        def test_breaks(self):
            raise RuntimeError("boom")

        @unittest.skip("not here")
        def test_skipped(self):
            pass

        @unittest.expectedFailure
        def test_known_defect(self):
            self.assertEqual(1, 2)

        @unittest.expectedFailure
        def test_defect_gone_unnoticed(self):
            pass
    """)


def make_test_dir(parent, name, source):
    d = os.path.join(parent, name)
    os.mkdir(d)
    with open(os.path.join(d, "test_it.py"), "w") as f:
        f.write(source)
    return d


def quietly(fn, *args):
    """Calls fn with its output (the child's test log, passed through) kept out of this tier's."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def run_tier(dirs):
    """Runs the py tier's main on dirs with --tally; its exit status and the tally's lines."""
    with tempfile.TemporaryDirectory() as tmp:
        tally = os.path.join(tmp, "tally")
        with mock.patch.object(pyunit, "test_dirs", return_value=dirs), \
                mock.patch.object(sys, "argv", ["pyunit.py", "--tally", tally]):
            rc = quietly(pyunit.main)
        with open(tally) as f:
            return rc, f.read().splitlines()


class PyTierTest(unittest.TestCase):
    def test_counts_and_names_of_a_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            passed, failed, skipped, names = quietly(pyunit.counts_of, make_test_dir(tmp, "mixed", MIXED))
        # an expected failure is a skip, not a pass; an unexpected success is a failure
        self.assertEqual((passed, failed, skipped), (1, 3, 2))
        self.assertEqual(sorted(names), ["test_it.Mixed.test_breaks", "test_it.Mixed.test_defect_gone_unnoticed",
                                         "test_it.Mixed.test_fails"])

    def test_a_child_that_dies_is_one_named_failure(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = make_test_dir(tmp, "dies", "import os\nos._exit(3)\n")
            passed, failed, skipped, names = quietly(pyunit.counts_of, d)
        self.assertEqual((passed, failed, skipped), (0, 1, 0))
        self.assertEqual(len(names), 1)
        self.assertIn("dies: the test run ended without its counts (exit status 3)", names[0])

    def test_tally_gets_the_counts_and_a_line_per_failure(self):
        with tempfile.TemporaryDirectory() as tmp:
            dirs = [make_test_dir(tmp, "mixed", MIXED), make_test_dir(tmp, "dies", "import os\nos._exit(3)\n")]
            rc, lines = run_tier(dirs)
        self.assertEqual(rc, 1)
        self.assertEqual(lines[0], "py 1 4 2")
        self.assertEqual(len(lines), 5)
        self.assertTrue(all(l.startswith("FAILED py ") for l in lines[1:]), lines)

    def test_dirs_leave_out_only_what_a_listed_directory_discovers(self):
        with tempfile.TemporaryDirectory() as root:
            def tests_in(rel, package=False):
                d = os.path.join(root, rel)
                os.makedirs(d, exist_ok=True)
                open(os.path.join(d, "test_x.py"), "w").close()
                if package:
                    open(os.path.join(d, "__init__.py"), "w").close()
            tests_in("")                                # root itself
            tests_in("bench")                           # not a package: discover from root misses it
            tests_in("pkg", package=True)               # a package under root: discover finds it
            tests_in("pkg/sub", package=True)           # and its subpackage
            os.makedirs(os.path.join(root, "vm"))       # not a package ...
            tests_in("vm/pyx", package=True)            # ... so this package is out of root's reach
            os.makedirs(os.path.join(root, "__pycache__"))
            open(os.path.join(root, "__pycache__", "test_x.py"), "w").close()
            with mock.patch.object(pyunit, "ROOT", root):
                got = [os.path.relpath(d, root) for d in pyunit.test_dirs()]
        self.assertEqual(got, [".", "bench", os.path.join("vm", "pyx")])

    def test_no_tests_at_all_is_a_failure(self):
        rc, lines = run_tier([])
        self.assertEqual(rc, 1)
        self.assertEqual(lines[0], "py 0 1 0")
        self.assertTrue(lines[1].startswith("FAILED py no tests found"), lines)


class MakeTallyTest(unittest.TestCase):
    def test_sums_every_tier(self):
        out = make_tally(["lint 1 0 0", "unit 1112 0 22", "py 18 0 0", "vm 360 0 0"])
        self.assertEqual(out, ["total: 1491 passed, 0 failed, 22 skipped"])

    def test_failures_recapped_above_the_total(self):
        out = make_tally(["unit 10 1 0", "FAILED unit ./cache: TestFlushAfterError", "e2e 5 1 2",
                          "FAILED e2e ./frontend/nbd: TestTLS/wrong_ca"])
        self.assertEqual(out, ["FAILED: unit ./cache: TestFlushAfterError",
                               "FAILED: e2e ./frontend/nbd: TestTLS/wrong_ca",
                               "total: 15 passed, 2 failed, 2 skipped"])

    def test_only_the_first_twelve_failures_then_how_many_more(self):
        lines = ["unit 0 14 0"] + [f"FAILED unit Test{i}" for i in range(14)]
        out = make_tally(lines)
        self.assertEqual(out[:12], [f"FAILED: unit Test{i}" for i in range(12)])
        self.assertEqual(out[12], "FAILED: ... and 2 more (see each tier above)")
        self.assertEqual(out[13], "total: 0 passed, 14 failed, 0 skipped")
        self.assertEqual(len(out), 14)

    def test_a_long_failure_line_is_cut(self):
        out = make_tally(["vm 0 1 0", "FAILED vm " + "x" * 500])
        self.assertEqual(out[0], "FAILED: vm " + "x" * 237)  # 240 characters of "tier what"
        self.assertEqual(out[1], "total: 0 passed, 1 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
