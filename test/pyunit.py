#!/usr/bin/env python3
"""make test's py tier: the unit tests of the Python under test/ (the bench's statistics and
verdicts), every test_*.py file beside the code it tests. Prints one line per test and
"py: N passed, M failed, K skipped"; with --tally FILE appends "py N M K" to it, as the Go tiers
do (make tally sums the file). Exits non-zero if any test failed or none was found: a tier that
silently runs nothing is not a pass.
"""
import argparse
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.abspath(__file__))


class Result(unittest.TextTestResult):
    """Counts passes too (TestResult counts only what did not pass)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def suites():
    """One suite per directory under test/ holding test_*.py files, imported from that directory
    (the bench's modules import each other by bare name)."""
    loader = unittest.TestLoader()
    for d, _, files in sorted(os.walk(ROOT)):
        if "__pycache__" in d or not any(f.startswith("test_") and f.endswith(".py") for f in files):
            continue
        yield loader.discover(d, pattern="test_*.py", top_level_dir=d)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tally", help="append the tier's counts to this file")
    a = ap.parse_args()
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
    passed = failed = skipped = 0
    for suite in suites():
        r = runner.run(suite)
        passed += r.passed
        failed += len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
        skipped += len(r.skipped)
    if passed + failed + skipped == 0:
        print("py: no tests found under", ROOT)
        failed = 1
    if a.tally:
        with open(a.tally, "a") as f:
            f.write(f"py {passed} {failed} {skipped}\n")
    print(f"py: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
