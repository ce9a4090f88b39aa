"""What the tests of make test's own counting share (test_pyunit.py, test_shell_tally.py): running
the Makefile's tally target on a tally file, with the environment of a make started from a test.
Not a test module itself: pyunit.py collects test_*.py only.
"""
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# What an outer make passes its children: under make test the py tier runs inside make, and a make
# these tests start must not inherit those flags.
MAKE_VARS = ("MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL", "MAKEFILES")


def make_tally(tally_lines):
    """Runs the Makefile's tally target on a tally file holding tally_lines; its output lines."""
    with tempfile.TemporaryDirectory() as tmp:
        tally = os.path.join(tmp, "tally")
        with open(tally, "w") as f:
            f.writelines(l + "\n" for l in tally_lines)
        env = {k: v for k, v in os.environ.items() if k not in MAKE_VARS}
        p = subprocess.run(["make", "-s", "--no-print-directory", "-C", os.path.dirname(HERE), "tally",
                            f"TALLY={tally}"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise AssertionError(f"make tally exited {p.returncode}: {p.stderr}")
    return p.stdout.splitlines()
