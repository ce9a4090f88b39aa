#!/usr/bin/env python3
"""make test's py tier: the unit tests of the Python under test/ (the bench's statistics and
verdicts), every test_*.py file beside the code it tests. Prints one line per test and
"py: N passed, M failed, K skipped"; with --tally FILE appends "py N M K" to it and a
"FAILED py what" line per failure, as the Go tiers do (make tally sums the file and recaps the
failures). Exits non-zero if any test failed or none was found: a tier that
silently runs nothing is not a pass.

Each directory's tests run in a child process of their own (--dir): the bench's modules import
each other by bare name, so two directories in one interpreter would share sys.path and
sys.modules (a second bench.py would quietly be the first). A child that dies before reporting
its counts is one failure, and the tally line is written whatever happened.
"""
import argparse
import json
import os
import subprocess
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


def test_dirs():
    """The directories under test/ holding test_*.py files, less those a listed directory's
    discover already reaches (running them again would count them twice): discover descends
    only through packages, so a directory is left out only when every directory from a listed
    one down to it has an __init__.py."""
    found = []
    for d, subdirs, files in os.walk(ROOT):
        subdirs[:] = [s for s in subdirs if s != "__pycache__"]
        if any(f.startswith("test_") and f.endswith(".py") for f in files):
            found.append(d)
    out = []
    for d in sorted(found):
        if not any(reached_by_discover(p, d) for p in out):
            out.append(d)
    return out


def reached_by_discover(top, d):
    """Whether unittest's discover from top finds the tests in d, a directory below it."""
    if not d.startswith(top + os.sep):
        return False
    rel = os.path.relpath(d, top).split(os.sep)
    return all(os.path.exists(os.path.join(top, *rel[:i + 1], "__init__.py")) for i in range(len(rel)))


def run_dir(d):
    """Runs d's tests here and prints their counts as the last line, a JSON list."""
    suite = unittest.TestLoader().discover(d, pattern="test_*.py", top_level_dir=d)
    r = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result).run(suite)
    names = [t.id() for t, _ in r.failures + r.errors] + [t.id() for t in r.unexpectedSuccesses]
    # an expected failure is a known defect, not a pass
    print(json.dumps([r.passed, len(names), len(r.skipped) + len(r.expectedFailures), names]), flush=True)


def counts_of(d):
    """Runs d's tests in a child process, its output passed through; (passed, failed, skipped,
    the failed tests' names)."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--dir", d], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    out = p.stdout.rstrip("\n").split("\n")
    print("\n".join(out[:-1]))
    try:
        passed, failed, skipped, names = json.loads(out[-1])
    except (ValueError, TypeError):
        print(out[-1])
        why = f"{os.path.relpath(d, ROOT)}: the test run ended without its counts (exit status {p.returncode})"
        print("py:", why)
        return 0, 1, 0, [why]
    return passed, failed, skipped, names


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tally", help="append the tier's counts to this file")
    ap.add_argument("--dir", help=argparse.SUPPRESS)  # the child: one directory's tests
    a = ap.parse_args()
    if a.dir:
        run_dir(a.dir)
        return 0
    passed = failed = skipped = 0
    failures = []
    try:
        for d in test_dirs():
            p, f, s, names = counts_of(d)
            passed, failed, skipped = passed + p, failed + f, skipped + s
            failures += names
        if passed + failed + skipped == 0:
            failures.append(f"no tests found under {ROOT}")
            print("py:", failures[-1])
            failed = 1
    except Exception as e:  # the tier itself broke: a failure, still counted into the total
        failures.append(f"the tier broke: {e!r}")
        print("py:", failures[-1])
        failed += 1
    finally:
        if a.tally:
            with open(a.tally, "a") as f:
                f.write(f"py {passed} {failed} {skipped}\n")
                f.writelines(f"FAILED py {n}\n" for n in failures)
    print(f"py: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
