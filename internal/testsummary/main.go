// Command testsummary reads `go test -json` events on stdin and prints what a person wants to see:
// each package's ok/FAIL line, the full output of every failing test, and a closing count. It
// appends the counts to the file named by -tally so that `make test` can print one total line
// over all tiers (unit, fuzz, e2e, vm), and one "FAILED tier what" line per failure there for the
// recap printed above it. It exits non-zero when any test or package failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json). Since Go 1.24 a build's output arrives as
// build-output events keyed by ImportPath, and a package that did not build fails with
// FailedBuild set.
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string
	FailedBuild string
}

type key struct{ pkg, test string }

// summary is what one tier's events add up to.
type summary struct {
	passed, failed, skipped int
	failedTests             []string // "pkg.Test", sorted
	pkgsFailedAlone         []string // "pkg (why)" for packages that failed with no failed test
	buildFailed             bool     // a non-JSON FAIL line: the build broke before any event
}

func main() {
	tally := flag.String("tally", "", "file to append 'passed failed skipped' counts to")
	tier := flag.String("tier", "tests", "one-word name of the tier for the closing line")
	flag.Parse()

	s := summarize(os.Stdin, os.Stdout)
	fmt.Printf("%s: %d passed, %d failed, %d skipped\n", *tier, s.passed, s.failed, s.skipped)
	if *tally != "" {
		f, err := os.OpenFile(*tally, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		s.writeTally(f, *tier)
		f.Close()
	}
	if s.failed > 0 {
		os.Exit(1)
	}
}

// summarize reads test2json events from r, passes the interesting output through to w and counts.
func summarize(r io.Reader, w io.Writer) summary {
	var s summary
	outputs := map[key][]string{}
	testFailedIn := map[string]bool{}
	pkgFailed := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
			// Build errors and other non-JSON lines go straight through.
			fmt.Fprintln(w, string(line))
			if strings.Contains(string(line), "FAIL") || strings.Contains(string(line), "build failed") {
				s.buildFailed = true
			}
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output) // the compiler's errors
		case "build-fail":
			s.buildFailed = true
		case "output":
			if ev.Test == "" {
				// Package-level output: keep ok/FAIL/coverage lines and panics.
				o := ev.Output
				if strings.HasPrefix(o, "ok") || strings.HasPrefix(o, "FAIL") || strings.HasPrefix(o, "panic") {
					fmt.Fprint(w, o)
				}
			}
			outputs[k] = append(outputs[k], ev.Output)
		case "pass":
			if ev.Test != "" {
				s.passed++
				delete(outputs, k)
			}
		case "skip":
			if ev.Test != "" {
				s.skipped++
				delete(outputs, k)
			}
		case "fail":
			if ev.Test != "" {
				s.failed++
				s.failedTests = append(s.failedTests, ev.Package+"."+ev.Test)
				testFailedIn[ev.Package] = true
				fmt.Fprintf(w, "=== FAIL %s %s (%.2fs)\n%s", ev.Package, ev.Test, ev.Elapsed, strings.Join(outputs[k], ""))
				delete(outputs, k)
			} else {
				pkgFailed = true
				switch {
				case ev.FailedBuild != "":
					s.pkgsFailedAlone = append(s.pkgsFailedAlone, ev.Package+" (did not build: "+ev.FailedBuild+")")
				case !testFailedIn[ev.Package]:
					s.pkgsFailedAlone = append(s.pkgsFailedAlone, ev.Package+" (failed outside any test: a crash, TestMain or a timeout)")
				}
				if len(outputs[k]) > 0 && !strings.Contains(strings.Join(outputs[k], ""), "--- FAIL") {
					fmt.Fprintf(w, "=== package %s failed:\n%s", ev.Package, strings.Join(outputs[k], ""))
				}
			}
		}
	}
	sort.Strings(s.failedTests)
	for _, n := range s.failedTests {
		fmt.Fprintln(w, "FAILED:", n)
	}
	if (pkgFailed || s.buildFailed) && s.failed == 0 {
		s.failed = 1 // a package that failed to build or crashed outside a test counts once
	}
	return s
}

// writeTally appends the tier's counts and its failures by name (make test's recap).
func (s summary) writeTally(w io.Writer, tier string) {
	fmt.Fprintf(w, "%s %d %d %d\n", tier, s.passed, s.failed, s.skipped)
	for _, n := range s.failedTests {
		fmt.Fprintf(w, "FAILED %s %s\n", tier, n)
	}
	for _, p := range s.pkgsFailedAlone {
		fmt.Fprintf(w, "FAILED %s %s\n", tier, p)
	}
	if s.buildFailed && len(s.failedTests) == 0 && len(s.pkgsFailedAlone) == 0 {
		fmt.Fprintf(w, "FAILED %s a build failed (see the output above)\n", tier)
	}
}
