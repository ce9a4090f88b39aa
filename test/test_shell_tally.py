"""Unit tests of the tally lines that make test's shell writers produce: the Makefile's own test
recipe (lint and build counted as one check each, every tier run after a failure, the tally started
fresh), test/promrules.sh (each rules and rule-test file one check), test/fuzz.sh ("fuzz P F 0" and a FAILED line per target that failed, its -fuzztime
deadline rule included), test/e2e.sh (which tests the e2e tier runs), test/vm/test-vm.sh (the VM tier: the self-test's and Go tests' own lines
passed through, the smoke suite's counted from its closing line, a part that fails without
counting a failure counted as one, and a guest that dies before the smoke suite's closing line)
and test/vm/selftest.sh (each failed check one FAILED line, however many lines of the runner's
output it quotes). Each script runs as it is, copied into a throwaway tree beside stubs of what it
calls (the parts, `go`, pgrep), so nothing here boots a guest or fuzzes; the lines it writes are
then summed by the Makefile's own `make tally`.
"""
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from maketally import MAKE_VARS, make_tally  # noqa: E402


def write_script(path, body):
    """Writes an executable bash script at path (its directories made)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def read_lines(path):
    """The lines of the file at path; none if it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def child_env(**extra):
    """This environment for a script under test, without what would point it elsewhere: git's
    repository variables (a hook's GIT_DIR would make `git init` re-initialise that repository)
    and an outer TALLY or TMPDIR."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k not in ("TALLY", "TMPDIR")}
    env.update(extra)
    return env


EARLIER_TIER = "unit 5 0 0"  # a tier that ran before: every writer appends after it


def failing_stubs(gotest):
    """Stubs of a tier whose self-test and smoke suite count a failure each, and whose gotest.sh
    runs gotest (which should fail without counting one)."""
    return dict(selftest='echo "vm-self 7 1 0" >>"$TALLY"\necho "FAILED vm-self hung guest not killed" >>"$TALLY"\n'
                         'exit 1\n',
                smoke_output="PASS [  1.0s] serve and read\nFAIL [ 12.5s] attach, mkfs, fsck\n13 passed, 1 failed\n",
                smoke_status=1, gotest=gotest)


class VMTierTallyTest(unittest.TestCase):
    """test-vm.sh with stub parts: selftest.sh, gotest.sh and powercut.sh write their own lines to
    $TALLY (as the real ones do), run.sh prints what a smoke guest would. gotest.sh runs twice: for
    the vm-tagged tests, and with VM_INIT=systemd for the systemd unit's (gotest_systemd). These
    run the parts one after the other (VM_LANES=1); TwoLanesTallyTest runs them in two lanes."""

    def run_vm_tier(self, selftest, smoke_output, smoke_status, gotest,
                    gotest_systemd='echo "vm-systemd 6 0 0" >>"$TALLY"\n',
                    powercut='echo "vm-powercut 2 0 0" >>"$TALLY"\n', lanes="1"):
        """Runs test-vm.sh with these stubs; its process, the lines it appended to a tally that
        already held EARLIER_TIER (checked to stay first), and the files it left in TMPDIR."""
        with tempfile.TemporaryDirectory() as tmp:
            vm = os.path.join(tmp, "test", "vm")
            os.makedirs(vm)
            shutil.copy(os.path.join(HERE, "vm", "test-vm.sh"), vm)
            write_script(os.path.join(vm, "selftest.sh"), selftest)
            write_script(os.path.join(vm, "gotest.sh"),
                         f'if [ "${{VM_INIT:-}}" = systemd ]; then\n{gotest_systemd}exit 0\nfi\n{gotest}')
            with open(os.path.join(tmp, "smoke-output"), "w") as f:
                f.write(smoke_output)
            write_script(os.path.join(vm, "run.sh"),
                         f'cat "{tmp}/smoke-output"\necho "run.sh: stub stderr" >&2\nexit {smoke_status}\n')
            write_script(os.path.join(vm, "smoke.sh"), "exit 99  # run.sh's argument, never run here\n")
            write_script(os.path.join(vm, "powercut.sh"), powercut)
            tally = os.path.join(tmp, "tally")
            with open(tally, "w") as f:
                f.write(EARLIER_TIER + "\n")
            p = subprocess.run([os.path.join(vm, "test-vm.sh")], capture_output=True, text=True,
                               env=child_env(TALLY=tally, TMPDIR=tmp, VM_LANES=lanes))
            lines = read_lines(tally)
            leftovers = sorted(n for n in os.listdir(tmp) if n.startswith("vm-"))
        self.assertEqual(lines[:1], [EARLIER_TIER], "the tier appends to the tally, never overwrites it")
        return p, lines[1:], leftovers

    def expect(self, stubs, status, lines, closing):
        """Runs the tier with stubs and checks its exit status, the lines it appended and its
        closing line; returns the lines and the files it left."""
        got, leftovers, _ = self.expect_output(stubs, status, lines, closing)
        return got, leftovers

    def expect_output(self, stubs, status, lines, closing):
        """expect, returning its standard output too."""
        p, got, leftovers = self.run_vm_tier(**stubs)
        self.assertEqual(p.returncode, status, p.stdout + p.stderr)
        self.assertEqual(got, lines)
        self.assertEqual(p.stdout.splitlines()[-1], closing)
        return got, leftovers, p.stdout

    def test_every_part_passing(self):
        lines, leftovers = self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n',
                 smoke_output="PASS [  1.2s] serve and read\n14 passed, 0 failed\n", smoke_status=0,
                 gotest='echo "vm-go 338 0 2" >>"$TALLY"\n'),
            0, ["vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 338 0 2", "vm-systemd 6 0 0", "vm-powercut 2 0 0"],
            "vm: 368 passed, 0 failed, 2 skipped")
        self.assertEqual(make_tally([EARLIER_TIER] + lines), ["total: 373 passed, 0 failed, 2 skipped"])
        self.assertEqual(leftovers, [], "the tier's own tally and smoke log are removed")

    def test_failures_are_counted_once_and_named(self):
        gotest_failure = "FAILED vm Go tests tagged vm (guest): exit 2 without a counted failure (see its output)"
        lines, _ = self.expect(
            # the self-test counts its own failure: no second one from the runner; gotest.sh fails
            # without writing anything (a build error before any test ran)
            failing_stubs(gotest="exit 2\n"),
            1, ["vm-self 7 1 0", "FAILED vm-self hung guest not killed", "vm-smoke 13 1 0",
                "FAILED vm-smoke attach, mkfs, fsck", "vm 0 1 0", gotest_failure, "vm-systemd 6 0 0", "vm-powercut 2 0 0"],
            "vm: 28 passed, 3 failed, 0 skipped")
        self.assertEqual(make_tally([EARLIER_TIER] + lines), [
            "FAILED: vm-self hung guest not killed", "FAILED: vm-smoke attach, mkfs, fsck",
            "FAILED: " + gotest_failure[len("FAILED "):], "total: 33 passed, 3 failed, 0 skipped"])

    def test_a_part_that_counted_no_failure_but_failed(self):
        # gotest.sh when the guest times out after the summary was written: its counts say 0 failed
        self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n', smoke_output="14 passed, 0 failed\n",
                 smoke_status=0, gotest='echo "vm-go 338 0 0" >>"$TALLY"\nexit 124\n'),
            1, ["vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 338 0 0", "vm 0 1 0",
                "FAILED vm Go tests tagged vm (guest): exit 124 without a counted failure (see its output)",
                "vm-systemd 6 0 0", "vm-powercut 2 0 0"],
            "vm: 368 passed, 1 failed, 0 skipped")

    def test_the_systemd_part_counts_and_fails_on_its_own(self):
        # the systemd guest's tests count as their own tier; their failure fails the VM tier
        self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n', smoke_output="14 passed, 0 failed\n",
                 smoke_status=0, gotest='echo "vm-go 338 0 0" >>"$TALLY"\n',
                 gotest_systemd='echo "vm-systemd 4 2 0" >>"$TALLY"\n'
                                'echo "FAILED vm-systemd systemd_test.TestReloadKeepsPID" >>"$TALLY"\nexit 1\n'),
            1, ["vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 338 0 0", "vm-systemd 4 2 0",
                "FAILED vm-systemd systemd_test.TestReloadKeepsPID", "vm-powercut 2 0 0"],
            "vm: 366 passed, 2 failed, 0 skipped")

    def test_the_power_cut_part_counts_and_fails_on_its_own(self):
        # powercut.sh writes its own counts and one FAILED line per frontend that lost data
        self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n', smoke_output="14 passed, 0 failed\n",
                 smoke_status=0, gotest='echo "vm-go 338 0 0" >>"$TALLY"\n',
                 powercut='echo "vm-powercut 1 1 0" >>"$TALLY"\n'
                          'echo "FAILED vm-powercut nbd: durable records lost" >>"$TALLY"\nexit 1\n'),
            1, ["vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 338 0 0", "vm-systemd 6 0 0", "vm-powercut 1 1 0",
                "FAILED vm-powercut nbd: durable records lost"],
            "vm: 367 passed, 1 failed, 0 skipped")

    def test_a_smoke_guest_that_dies_before_its_closing_line(self):
        # one failure for the smoke part, not a second one from part(); a failed check's log,
        # echoed indented, may hold a line like the closing one
        self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n',
                 smoke_output=("PASS [  1.0s] serve and read\n    | 3 passed, 0 failed\nPASS [  2.0s] detach\n\n"
                               "booting the kernel\nKernel panic - not syncing\n"), smoke_status=125,
                 gotest='echo "vm-go 338 0 0" >>"$TALLY"\n'),
            1, ["vm-self 8 0 0", "vm-smoke 0 1 0",
                "FAILED vm-smoke the guest ended before the suite's closing line (run.sh exit 125); its last lines: "
                "PASS [  2.0s] detach|booting the kernel|Kernel panic - not syncing|run.sh: stub stderr|",
                "vm-go 338 0 0", "vm-systemd 6 0 0", "vm-powercut 2 0 0"],
            "vm: 354 passed, 1 failed, 0 skipped")


class TwoLanesTallyTest(VMTierTallyTest):
    """test-vm.sh with VM_LANES=2: lane one runs the vm-tagged packages but VM_LANE2_PKGS (gotest.sh
    with VM_GO_EXCLUDE), lane two the self-test, smoke suite, those packages (gotest.sh with them as
    arguments), the systemd tier and the power cut. The stub gotest.sh says which lane called it."""

    # lane one: every package but test/vm/cachedev; lane two: that package alone
    GOTEST = ('if [ "${1:-}" = ./test/vm/cachedev ]; then echo "vm-go 20 0 0" >>"$TALLY"; exit 0; fi\n'
              '[ "$VM_GO_EXCLUDE" = "^([.]/test/vm/cachedev)$" ] || { echo "vm-go 0 1 0 no exclusion" >>"$TALLY"; exit 1; }\n')

    def run_vm_tier(self, **stubs):
        stubs.setdefault("lanes", "2")
        return super().run_vm_tier(**stubs)

    def test_every_part_passing(self):
        lines, leftovers, out = self.expect_output(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n',
                 smoke_output="PASS [  1.2s] serve and read\n14 passed, 0 failed\n", smoke_status=0,
                 gotest=self.GOTEST + 'echo "vm-go 318 0 2" >>"$TALLY"\n'),
            0, ["vm-go 318 0 2", "vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 20 0 0", "vm-systemd 6 0 0",
                "vm-powercut 2 0 0"],
            "vm: 368 passed, 0 failed, 2 skipped")
        self.assertEqual(make_tally([EARLIER_TIER] + lines), ["total: 373 passed, 0 failed, 2 skipped"])
        self.assertEqual(leftovers, [], "the lanes' tallies and lane two's log are removed")
        parts = [l for l in out.splitlines() if l.startswith("=== vm tier: ") and l.endswith(" s wall")]
        self.assertEqual([p.split(":")[1].strip() for p in parts], [
            "Go tests tagged vm (guest)", "runner self-test (host)", "smoke suite (guest)",
            "Go tests tagged vm, lane two (guest)", "Go tests of the systemd unit (guest, systemd as PID 1)",
            "power cut under a cache device (two guest boots, QEMU killed between)"],
            "lane one's output, then lane two's")

    def test_failures_are_counted_once_and_named(self):
        gotest_failure = "FAILED vm Go tests tagged vm (guest): exit 2 without a counted failure (see its output)"
        lines, _ = self.expect(
            failing_stubs(gotest=self.GOTEST + "exit 2\n"),
            1, ["vm 0 1 0", gotest_failure, "vm-self 7 1 0", "FAILED vm-self hung guest not killed", "vm-smoke 13 1 0",
                "FAILED vm-smoke attach, mkfs, fsck", "vm-go 20 0 0", "vm-systemd 6 0 0", "vm-powercut 2 0 0"],
            "vm: 48 passed, 3 failed, 0 skipped")
        self.assertEqual(make_tally([EARLIER_TIER] + lines), [
            "FAILED: " + gotest_failure[len("FAILED "):], "FAILED: vm-self hung guest not killed",
            "FAILED: vm-smoke attach, mkfs, fsck", "total: 53 passed, 3 failed, 0 skipped"])

    def test_a_failure_in_lane_two_alone_fails_the_tier(self):
        self.expect(
            dict(selftest='echo "vm-self 8 0 0" >>"$TALLY"\n', smoke_output="14 passed, 0 failed\n",
                 smoke_status=0, gotest=self.GOTEST + 'echo "vm-go 318 0 0" >>"$TALLY"\n',
                 powercut='echo "vm-powercut 1 1 0" >>"$TALLY"\n'
                          'echo "FAILED vm-powercut nbd: durable records lost" >>"$TALLY"\nexit 1\n'),
            1, ["vm-go 318 0 0", "vm-self 8 0 0", "vm-smoke 14 0 0", "vm-go 20 0 0", "vm-systemd 6 0 0",
                "vm-powercut 1 1 0", "FAILED vm-powercut nbd: durable records lost"],
            "vm: 367 passed, 1 failed, 0 skipped")

    # The inherited tests below check the sequential order; their two-lane versions are above.
    test_a_part_that_counted_no_failure_but_failed = None
    test_the_systemd_part_counts_and_fails_on_its_own = None
    test_the_power_cut_part_counts_and_fails_on_its_own = None
    test_a_smoke_guest_that_dies_before_its_closing_line = None


class FuzzTallyTest(unittest.TestCase):
    """fuzz.sh in a throwaway module whose `go` is a stub: each target's outcome is chosen by name."""

    FAKE_GO = """\
        # go test -run='^$' -fuzz=^FuzzX$ -fuzztime=... ./dir
        for a in "$@"; do case $a in -fuzz=*) fn=${a#-fuzz=^}; fn=${fn%'$'} ;; ./*) dir=$a ;; esac; done
        echo "$fn" >>"$FUZZ_CALLS"
        reproducer() { mkdir -p "$dir/testdata/fuzz/$fn"; echo x >"$dir/testdata/fuzz/$fn/1"; }
        deadline() { echo "--- FAIL: $fn (5.01s)"; echo "    context deadline exceeded"; }
        case $fn in
        FuzzGood|FuzzParse) echo ok; exit 0 ;;
        FuzzCrash) echo "panic: index out of range"; echo "Failing input written to testdata/fuzz/$fn/1"; reproducer; exit 1 ;;
        FuzzDeadline) deadline; exit 1 ;;
        FuzzBuildBroken) echo "FAIL codec [build failed]"; exit 1 ;;
        FuzzSeedFails) echo "    fuzz_test.go:12: round trip differs"; deadline; exit 1 ;;
        FuzzSeedPanics) echo "panic: runtime error: slice bounds out of range"; deadline; exit 1 ;;
        FuzzDialTimeout) echo "--- FAIL: $fn"; echo "    dial: context deadline exceeded"; exit 1 ;;
        FuzzDeadlineNewInput) deadline; reproducer; exit 1 ;;
        FuzzKnownInput) echo "    Failing input written to testdata/fuzz/$fn/1"; reproducer; deadline; exit 1 ;;
        FuzzURL) echo "    url_test.go:70: round trip differs"; deadline; exit 1 ;;
        esac
        echo "unexpected target $fn"; exit 3
        """

    FILES = {
        "codec/fuzz_test.go": ["FuzzGood", "FuzzCrash", "FuzzDeadline", "FuzzBuildBroken", "FuzzSeedFails",
                               "FuzzSeedPanics", "FuzzDialTimeout", "FuzzDeadlineNewInput", "FuzzKnownInput"],
        "urls/url_test.go": ["FuzzParse", "FuzzURL"],  # a fuzz target's file need not be fuzz_test.go
    }

    def test_counts_and_names_the_failed_targets(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "mod")
            os.makedirs(os.path.join(root, "test"))
            shutil.copy(os.path.join(HERE, "fuzz.sh"), os.path.join(root, "test"))
            for path, targets in self.FILES.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)))
                with open(os.path.join(root, path), "w") as f:
                    f.write("package p\n" + "".join(f"\nfunc {t}(f *testing.F) {{}}\n" for t in targets))
            # an input already in the corpus, found failing again: the listing does not change
            known = os.path.join(root, "codec", "testdata", "fuzz", "FuzzKnownInput")
            os.makedirs(known)
            with open(os.path.join(known, "1"), "w") as f:
                f.write("x\n")
            os.makedirs(os.path.join(root, "vmonly"))
            with open(os.path.join(root, "vmonly", "fuzz_test.go"), "w") as f:
                f.write("// Fuzzed in the guest only.\n//go:build vm\n\npackage vmonly\n\nfunc FuzzTagged(f *testing.F) {}\n")
            bindir, scratch = os.path.join(tmp, "bin"), os.path.join(tmp, "scratch")
            os.mkdir(scratch)
            write_script(os.path.join(bindir, "go"), self.FAKE_GO)
            calls, tally = os.path.join(tmp, "calls"), os.path.join(tmp, "tally")
            with open(tally, "w") as f:
                f.write(EARLIER_TIER + "\n")
            env = child_env(PATH=bindir + os.pathsep + os.environ["PATH"], TALLY=tally, FUZZ_CALLS=calls,
                            TMPDIR=scratch)
            subprocess.run(["git", "init", "-q", root], check=True, env=env)
            p = subprocess.run([os.path.join(root, "test", "fuzz.sh")], capture_output=True, text=True, env=env)
            lines, called, leftovers = read_lines(tally), read_lines(calls), os.listdir(scratch)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertEqual(sorted(called), sorted(t for ts in self.FILES.values() for t in ts),
                         "every untagged target once, the vm-tagged file's never")
        # the deadline race (that line alone, no new input, no panic, failing input or failing test) is a pass;
        # everything else that exits non-zero is a failure, named
        self.assertEqual(lines, [EARLIER_TIER, "fuzz 3 8 0",
                                 "FAILED fuzz ./codec FuzzCrash", "FAILED fuzz ./codec FuzzBuildBroken",
                                 "FAILED fuzz ./codec FuzzSeedFails", "FAILED fuzz ./codec FuzzSeedPanics",
                                 "FAILED fuzz ./codec FuzzDialTimeout", "FAILED fuzz ./codec FuzzDeadlineNewInput",
                                 "FAILED fuzz ./codec FuzzKnownInput", "FAILED fuzz ./urls FuzzURL"])
        self.assertEqual(p.stdout.splitlines()[-1], "fuzz: 3 passed, 8 failed")
        self.assertEqual(make_tally(lines)[-1], "total: 8 passed, 8 failed, 0 skipped")
        self.assertEqual(leftovers, [], "fuzz.sh removes its log")


class E2ESelectionTest(unittest.TestCase):
    """test/e2e.sh in a throwaway module whose `go` is a stub that prints its arguments: the
    packages are those with an e2e-tagged _test.go file, -run names exactly their Test functions;
    `!e2e`, vm-only and untagged files and nested modules are left out; no e2e test at all fails."""

    FILES = {
        "a/x_e2e_test.go": "//go:build e2e\n\npackage a\n\nfunc TestA(t *testing.T) {}\nfunc TestB(t *testing.T) {}\n",
        "a/unit_test.go": "package a\n\nfunc TestUnit(t *testing.T) {}\n",
        "b/both_test.go": "//go:build e2e || vm\n\npackage b\n\nfunc TestC(t *testing.T) {}\n",
        "c/vm_test.go": "//go:build vm\n\npackage c\n\nfunc TestVM(t *testing.T) {}\n",
        "d/not_test.go": "//go:build !e2e\n\npackage d\n\nfunc TestNotE2E(t *testing.T) {}\n",
        "e/and_test.go": "//go:build linux && e2e\n\npackage e\n\nfunc TestD(t *testing.T) {}\n",
        "nested/go.mod": "module nested\n",
        "nested/p/n_test.go": "//go:build e2e\n\npackage p\n\nfunc TestNested(t *testing.T) {}\n",
    }

    def run_e2e(self, files):
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "mod")
            os.makedirs(os.path.join(root, "test"))
            shutil.copy(os.path.join(HERE, "e2e.sh"), os.path.join(root, "test"))
            for path, text in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w") as f:
                    f.write(text)
            bindir = os.path.join(tmp, "bin")
            write_script(os.path.join(bindir, "go"), 'printf "%s\\n" "$@"\n')
            env = child_env(PATH=bindir + os.pathsep + os.environ["PATH"])
            env.pop("GO", None)
            subprocess.run(["git", "init", "-q", root], check=True, env=env)
            return subprocess.run([os.path.join(root, "test", "e2e.sh"), "-race", "-json"],
                                  capture_output=True, text=True, env=env)

    def test_runs_the_e2e_tagged_tests_only(self):
        p = self.run_e2e(self.FILES)
        self.assertEqual(p.returncode, 0, p.stderr)
        args = p.stdout.splitlines()
        self.assertEqual(args, ["test", "-count=1", "-timeout", "20m", "-tags", "e2e", "-race", "-json",
                                "-run", "^(TestA|TestB|TestC|TestD)$", "./a", "./b", "./e"])

    def test_no_e2e_test_fails(self):
        p = self.run_e2e({k: v for k, v in self.FILES.items() if not k.startswith(("a/", "b/", "e/"))})
        self.assertEqual(p.returncode, 1)
        self.assertIn("no _test.go file has the e2e build tag", p.stderr)
        self.assertEqual(p.stdout, "", "go test is not run")


class PromRulesTallyTest(unittest.TestCase):
    """test/promrules.sh (make test-rules) in a throwaway tree whose promtool is a stub that fails
    the files a test names: each rules file and each *_test.yml is one check."""

    def run_rules(self, files, failing):
        """promrules.sh over contrib/prometheus holding files, promtool failing those in failing;
        its process, the lines it appended to a tally that held EARLIER_TIER, and promtool's calls."""
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "tree")
            os.makedirs(os.path.join(root, "test"))
            shutil.copy(os.path.join(HERE, "promrules.sh"), os.path.join(root, "test"))
            os.makedirs(os.path.join(root, "contrib", "prometheus"))
            for name in files:
                open(os.path.join(root, "contrib", "prometheus", name), "w").close()
            bindir, calls, tally = os.path.join(tmp, "bin"), os.path.join(tmp, "calls"), os.path.join(tmp, "tally")
            write_script(os.path.join(bindir, "promtool"),
                         'echo "$*" >>"$CALLS"\ncase " $STUB_FAIL " in *" ${3##*/} "*) exit 1 ;; esac\n')
            with open(tally, "w") as f:
                f.write(EARLIER_TIER + "\n")
            env = child_env(PATH=bindir + os.pathsep + os.environ["PATH"], TALLY=tally, CALLS=calls,
                            STUB_FAIL=" ".join(failing))
            p = subprocess.run([os.path.join(root, "test", "promrules.sh")], capture_output=True, text=True, env=env)
            return p, read_lines(tally), read_lines(calls)

    def test_every_file_passing(self):
        p, lines, calls = self.run_rules(["alerts.yml", "alerts_test.yml"], [])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(calls, ["check rules contrib/prometheus/alerts.yml",
                                 "test rules contrib/prometheus/alerts_test.yml"])
        self.assertEqual(lines, [EARLIER_TIER, "rules 2 0 0"])
        self.assertEqual(make_tally(lines)[-1], "total: 7 passed, 0 failed, 0 skipped")

    def test_failures_are_counted_and_named(self):
        p, lines, _ = self.run_rules(["alerts.yml", "alerts_test.yml", "more.yml"], ["alerts_test.yml", "more.yml"])
        self.assertEqual(p.returncode, 1)
        self.assertEqual(lines, [EARLIER_TIER, "rules 1 2 0", "FAILED rules check contrib/prometheus/more.yml",
                                 "FAILED rules test contrib/prometheus/alerts_test.yml"])
        self.assertEqual(p.stdout.splitlines()[-1], "rules: 1 passed, 2 failed")

    def test_no_rules_is_a_failure(self):
        p, lines, calls = self.run_rules([], [])
        self.assertEqual(p.returncode, 1)
        self.assertEqual(calls, [])
        self.assertEqual(lines, [EARLIER_TIER, "rules 0 1 0", "FAILED rules none found in contrib/prometheus"])


class SelfTestTallyTest(unittest.TestCase):
    """test/vm/selftest.sh beside a stub run.sh and a stub pgrep: no QEMU boots. The stub run.sh
    fails every command (exit 1, two lines on stdout, three on stderr), so the checks that quote
    the runner's output fail with several lines each, which must reach the tally as one FAILED
    line apiece. While a `sleep 1000` command runs, the stub marks its run as a live QEMU (a
    state file the stub pgrep answers from, as the real pgrep answers from QEMU's -name): the
    timeout check's run ends once the self-test has seen it, the SIGTERM check's run when
    signalled. So the checks that a QEMU was there and is gone, and the SIGTERM one, pass."""

    FAKE_RUN = """\
        # run.sh: VM_RUN_ID names the run; its QEMU is "alive" while $STUB_STATE/$VM_RUN_ID.running exists
        live="$STUB_STATE/$VM_RUN_ID.running"
        fail() { rm -f "$live"; printf 'stub out 1\\nstub out 2\\n'; printf 'stub err %s\\n' 1 2 3 >&2; exit 1; }
        [ "$*" = "sleep 1000" ] || fail
        touch "$live"
        if [ -n "${VM_TIMEOUT:-}" ]; then # the timeout check: end once the self-test has seen this QEMU
            for _ in $(seq 400); do [ -e "$STUB_STATE/$VM_RUN_ID.seen" ] && fail; sleep 0.05; done
            fail
        fi
        trap 'kill $s 2>/dev/null; rm -f "$live"; exit 143' TERM # the SIGTERM check
        sleep 60 & s=$!
        wait $s
        fail
        """

    FAKE_PGREP = """\
        # pgrep -f -- "-name ID " (qemu_of) and pgrep -af -- "-name ID " (a failure message)
        pat=${@: -1}; id=${pat#-name }; id=${id% }
        if [ -e "$STUB_STATE/$id.running" ]; then touch "$STUB_STATE/$id.seen"; echo "1 qemu -name $id "; exit 0; fi
        exit 1
        """

    def test_each_failure_is_one_line_of_the_tally(self):
        with tempfile.TemporaryDirectory() as tmp:
            vm, bindir, state = os.path.join(tmp, "test", "vm"), os.path.join(tmp, "bin"), os.path.join(tmp, "state")
            os.makedirs(vm)
            os.mkdir(state)
            shutil.copy(os.path.join(HERE, "vm", "selftest.sh"), vm)
            write_script(os.path.join(vm, "run.sh"), self.FAKE_RUN)
            write_script(os.path.join(bindir, "pgrep"), self.FAKE_PGREP)
            tally = os.path.join(tmp, "tally")
            with open(tally, "w") as f:
                f.write(EARLIER_TIER + "\n")
            env = child_env(PATH=bindir + os.pathsep + os.environ["PATH"], TALLY=tally, STUB_STATE=state,
                            TMPDIR=tmp)
            p = subprocess.run([os.path.join(vm, "selftest.sh")], capture_output=True, text=True, env=env,
                               timeout=120)
            lines = read_lines(tally)
            live = [n for n in os.listdir(state) if n.endswith(".running")]
            leftovers = sorted(n for n in os.listdir(tmp) if n.startswith("vm-selftest"))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 1, out)
        self.assertEqual(p.stdout.splitlines()[-1], "3 passed, 5 failed", out)
        self.assertEqual(lines[:2], [EARLIER_TIER, "vm-self 3 5 0"], out)
        stub_out, stub_err = "out='stub out 1 stub out 2'", "stderr: stub err 1 stub err 2 stub err 3"
        failed = lines[2:]
        self.assertEqual(len(failed), 5, failed)
        self.assertEqual(failed[0], f"FAILED vm-self exit code/output passthrough: rc=1 {stub_out} {stub_err}")
        self.assertRegex(failed[1], r"^FAILED vm-self timeout: rc=1 wall=[01]s " + re.escape(stub_err) + "$")
        self.assertEqual(failed[2], f"FAILED vm-self VM failure: rc=1 {stub_err}")
        self.assertEqual(failed[3], f"FAILED vm-self boot retry: rc=1 {stub_out} {stub_err}")
        self.assertEqual(failed[4], f"FAILED vm-self boot failures: rc=1 {stub_out} {stub_err}")
        self.assertEqual(make_tally(lines), ["FAILED: " + f[len("FAILED "):] for f in failed] +
                         ["total: 8 passed, 5 failed, 0 skipped"])
        for check in ("no QEMU left after a normal run", "QEMU was running during the hang and is gone after the timeout",
                      "SIGTERM to run.sh kills its QEMU (exit 143)"):
            self.assertIn("PASS " + check, p.stdout.splitlines(), out)
        self.assertEqual(live, [], "every stub QEMU was gone when the self-test ended")
        self.assertEqual(leftovers, [], "the self-test removes its scratch directory")


class MakeTestTallyTest(unittest.TestCase):
    """The Makefile's test recipe in a throwaway tree whose tiers and tools are stubs: each tier
    appends a line of its own, `go`, gofmt and staticcheck pass or fail as a test chooses."""

    # go env GOPATH (the Makefile puts its bin first on PATH); vet and both builds pass unless
    # told; go test prints nothing and exits as STUB_GOTEST_UNIT / _UNIT1CPU (the -cpu 1 pass) /
    # _E2E say (pipefail carries that past the summary), and the summary (go run
    # ./internal/testsummary) writes the tier.
    FAKE_GO = """\
        case $1 in
        env) echo "$STUB_GOPATH" ;;
        vet) exit "${STUB_VET:-0}" ;;
        build) [ "$2" = -o ] && exit "${STUB_BUILD:-0}"; exit 0 ;;
        test) case " $* " in *" -tags e2e "*) exit "${STUB_GOTEST_E2E:-0}" ;;
                             *" -cpu 1 "*) exit "${STUB_GOTEST_UNIT1CPU:-0}" ;;
                             *) exit "${STUB_GOTEST_UNIT:-0}" ;; esac ;;
        run) shift; while [ $# -gt 0 ]; do case $1 in -tier) t=$2 ;; -tally) f=$2 ;; esac; shift; done
             echo "$t 4 0 1" >>"$f" ;;
        *) echo "stub go: unexpected $*" >&2; exit 3 ;;
        esac
        """
    TIERS = ["unit 4 0 1", "unit-1cpu 4 0 1", "py 2 0 0", "fuzz 3 0 0", "e2e 4 0 1", "vm 5 0 0", "rules 2 0 0",
             "k8s 6 0 0", "dist 3 0 0"]

    def run_make_test(self, **stubs):
        """make test with these stub outcomes (STUB_VET, STUB_BUILD, STUB_STATICCHECK, STUB_GOFMT, and
        each tier's exit status: STUB_GOTEST_UNIT, STUB_GOTEST_UNIT1CPU, STUB_GOTEST_E2E, STUB_PY,
        STUB_FUZZ, STUB_VM, STUB_RULES, STUB_K8S, STUB_DIST);
        its process and the tally it left, which held a stale line from an earlier run before."""
        with tempfile.TemporaryDirectory() as tmp:
            root, gopath = os.path.join(tmp, "tree"), os.path.join(tmp, "gopath")
            os.makedirs(os.path.join(root, "mk"))
            os.makedirs(os.path.join(root, "packaging"))  # lint vets the packaging module there
            os.makedirs(os.path.join(root, "contrib", "kubernetes"))  # and the manifests' module
            shutil.copy(os.path.join(os.path.dirname(HERE), "Makefile"), root)
            with open(os.path.join(root, "mk", "vm.mk"), "w") as f:
                f.write("test-vm:\n\t@echo 'vm 5 0 0' >>$(TALLY); exit $${STUB_VM:-0}\n")
            with open(os.path.join(root, "mk", "kubernetes.mk"), "w") as f:
                f.write("test-k8s:\n\t@echo 'k8s 6 0 0' >>$(TALLY); exit $${STUB_K8S:-0}\n")
            with open(os.path.join(root, "mk", "release.mk"), "w") as f:
                f.write("test-rules:\n\t@echo 'rules 2 0 0' >>$(TALLY); exit $${STUB_RULES:-0}\n"
                        "test-dist:\n\t@echo 'dist 3 0 0' >>$(TALLY); exit $${STUB_DIST:-0}\n")
            write_script(os.path.join(root, "test", "deps.sh"), "echo 'deps: ok'\n")
            write_script(os.path.join(root, "test", "fuzz.sh"), 'echo "fuzz 3 0 0" >>"$TALLY"; exit "${STUB_FUZZ:-0}"\n')
            # test/e2e.sh picks the e2e-tagged tests of a real tree; here it is go test -tags e2e
            write_script(os.path.join(root, "test", "e2e.sh"), 'exec "${GO:-go}" test -tags e2e "$@"\n')
            with open(os.path.join(root, "test", "pyunit.py"), "w") as f:
                f.write("import os, sys\nopen(sys.argv[sys.argv.index('--tally') + 1], 'a').write('py 2 0 0\\n')\n"
                        "sys.exit(int(os.environ.get('STUB_PY', '0')))\n")
            # go and gofmt on the caller's PATH; staticcheck, as `make deps` installs it, only in
            # GOPATH/bin, which the recipe itself must put on PATH
            tools = os.path.join(tmp, "tools")
            write_script(os.path.join(tools, "go"), self.FAKE_GO)
            write_script(os.path.join(tools, "gofmt"), '[ -n "$STUB_GOFMT" ] && echo "$STUB_GOFMT"; exit 0\n')
            write_script(os.path.join(gopath, "bin", "staticcheck"), 'exit "${STUB_STATICCHECK:-0}"\n')
            os.makedirs(os.path.join(root, "bin"))
            tally = os.path.join(root, "bin", "test-tally")
            with open(tally, "w") as f:
                f.write("unit 99 9 0\nFAILED unit an earlier run\n")
            env = child_env(PATH=tools + os.pathsep + os.environ["PATH"], STUB_GOPATH=gopath, **stubs)
            for k in ("GO", "IN_MAKE_TEST") + MAKE_VARS:
                env.pop(k, None)
            subprocess.run(["git", "init", "-q", root], check=True, env=env)
            p = subprocess.run(["make", "test"], cwd=root, capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL)
            lines = read_lines(tally)
        return p, lines

    def test_every_check_passing(self):
        p, lines = self.run_make_test()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(lines, ["lint 1 0 0", "build 1 0 0"] + self.TIERS, "a fresh tally, every tier once")
        self.assertEqual(p.stdout.splitlines()[-1], "total: 35 passed, 0 failed, 3 skipped")

    def test_failed_lint_and_build_are_one_failure_each_and_the_tiers_still_run(self):
        p, lines = self.run_make_test(STUB_STATICCHECK="1", STUB_BUILD="1")
        self.assertNotEqual(p.returncode, 0)
        # e2e builds the binary first: with the build broken it writes nothing, the build's line says why
        self.assertEqual(lines, ["lint 0 1 0", "FAILED lint make lint (see its output above)",
                                 "build 0 1 0", "FAILED build make build (see its output above)",
                                 "unit 4 0 1", "unit-1cpu 4 0 1", "py 2 0 0", "fuzz 3 0 0", "vm 5 0 0",
                                 "rules 2 0 0", "k8s 6 0 0", "dist 3 0 0"])
        out = p.stdout.splitlines()
        self.assertEqual(out[-3:], ["FAILED: lint make lint (see its output above)",
                                    "FAILED: build make build (see its output above)",
                                    "total: 29 passed, 2 failed, 2 skipped"])

    def test_unformatted_code_fails_lint(self):
        p, lines = self.run_make_test(STUB_GOFMT="cache/cache.go")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("gofmt needed:\ncache/cache.go", p.stdout)
        self.assertEqual(lines[:3], ["lint 0 1 0", "FAILED lint make lint (see its output above)", "build 1 0 0"])
        self.assertEqual(lines[3:], self.TIERS)

    def test_failed_vet_fails_lint(self):
        p, lines = self.run_make_test(STUB_VET="1")
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(lines[:2], ["lint 0 1 0", "FAILED lint make lint (see its output above)"])
        self.assertEqual(p.stdout.splitlines()[-1], "total: 34 passed, 1 failed, 3 skipped")

    def test_any_failed_tier_fails_make_test_and_the_rest_still_run(self):
        # the stub tiers still write their passing lines: only the exit status can tell
        for which in ("STUB_GOTEST_UNIT", "STUB_GOTEST_UNIT1CPU", "STUB_GOTEST_E2E", "STUB_PY", "STUB_FUZZ",
                      "STUB_VM", "STUB_RULES", "STUB_K8S", "STUB_DIST"):
            with self.subTest(which):
                p, lines = self.run_make_test(**{which: "1"})
                self.assertNotEqual(p.returncode, 0)
                self.assertEqual(lines, ["lint 1 0 0", "build 1 0 0"] + self.TIERS)


if __name__ == "__main__":
    unittest.main()
