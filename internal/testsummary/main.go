// Command testsummary reads `go test -json` events on stdin and prints what a person wants to see:
// each package's ok/FAIL line, the full output of every failing test, and a closing count. It
// appends the counts to the file named by -tally so that `make test` can print one total line
// over all tiers (unit, fuzz, e2e, vm). It exits non-zero when any test or package failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	tally := flag.String("tally", "", "file to append 'passed failed skipped' counts to")
	tier := flag.String("tier", "tests", "one-word name of the tier for the closing line")
	flag.Parse()

	outputs := map[key][]string{}
	var passed, failed, skipped int
	var failedNames []string
	pkgFailed := false
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
			// Build errors and other non-JSON lines go straight through.
			fmt.Println(string(line))
			if strings.Contains(string(line), "FAIL") || strings.Contains(string(line), "build failed") {
				pkgFailed = true
			}
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "output":
			if ev.Test == "" {
				// Package-level output: keep ok/FAIL/coverage lines and panics.
				o := ev.Output
				if strings.HasPrefix(o, "ok") || strings.HasPrefix(o, "FAIL") || strings.HasPrefix(o, "panic") {
					fmt.Print(o)
				}
				outputs[k] = append(outputs[k], o)
			} else {
				outputs[k] = append(outputs[k], ev.Output)
			}
		case "pass":
			if ev.Test != "" {
				passed++
				delete(outputs, k)
			}
		case "skip":
			if ev.Test != "" {
				skipped++
				delete(outputs, k)
			}
		case "fail":
			if ev.Test != "" {
				failed++
				failedNames = append(failedNames, ev.Package+"."+ev.Test)
				fmt.Printf("=== FAIL %s %s (%.2fs)\n%s", ev.Package, ev.Test, ev.Elapsed, strings.Join(outputs[k], ""))
				delete(outputs, k)
			} else {
				pkgFailed = true
				if len(outputs[k]) > 0 && !strings.Contains(strings.Join(outputs[k], ""), "--- FAIL") {
					fmt.Printf("=== package %s failed:\n%s", ev.Package, strings.Join(outputs[k], ""))
				}
			}
		}
	}
	sort.Strings(failedNames)
	for _, n := range failedNames {
		fmt.Println("FAILED:", n)
	}
	if pkgFailed && failed == 0 {
		failed = 1 // a package that failed to build or crashed outside a test counts once
	}
	fmt.Printf("%s: %d passed, %d failed, %d skipped\n", *tier, passed, failed, skipped)
	if *tally != "" {
		f, err := os.OpenFile(*tally, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, "%s %d %d %d\n", *tier, passed, failed, skipped)
			f.Close()
		}
	}
	if failed > 0 || pkgFailed {
		os.Exit(1)
	}
}
