package main

import (
	"bytes"
	"strings"
	"testing"
)

// events builds test2json lines: each item is "action pkg [test]".
func events(items ...string) string {
	var b strings.Builder
	for _, it := range items {
		f := strings.Fields(it)
		test := ""
		if len(f) > 2 {
			test = f[2]
		}
		b.WriteString(`{"Action":"` + f[0] + `","Package":"` + f[1] + `","Test":"` + test + `"}` + "\n")
	}
	return b.String()
}

func TestSummaryCountsAndRecap(t *testing.T) {
	in := events(
		"pass ex/a TestOK", "skip ex/a TestSkipped", "fail ex/a TestBroken", "fail ex/a",
		"pass ex/b TestOK", "fail ex/b", // failed outside any test: TestMain, a crash after the tests
		"pass ex/c TestOK", "pass ex/c",
	)
	var out, tally bytes.Buffer
	s := summarize(strings.NewReader(in), &out)
	if s.passed != 3 || s.failed != 1 || s.skipped != 1 {
		t.Fatalf("counts %d/%d/%d, want 3/1/1", s.passed, s.failed, s.skipped)
	}
	s.writeTally(&tally, "unit")
	want := "unit 3 1 1\n" +
		"FAILED unit ex/a.TestBroken\n" +
		"FAILED unit ex/b (failed outside any test: a crash, TestMain or a timeout)\n"
	if tally.String() != want {
		t.Fatalf("tally:\n%s\nwant:\n%s", tally.String(), want)
	}
	if !strings.Contains(out.String(), "FAILED: ex/a.TestBroken") {
		t.Fatalf("output lacks the failed test's name:\n%s", out.String())
	}
}

// A package that does not build counts once and is named in the recap, with the compiler's
// errors passed through, in both of go test -json's forms.
func TestSummaryBuildFailures(t *testing.T) {
	for _, tc := range []struct{ name, in, tally string }{{
		name: "Go 1.24 and later: build-output events, the package's fail with FailedBuild",
		in: `{"ImportPath":"ex/d [ex/d.test]","Action":"build-output","Output":"ex/d/d.go:3:1: syntax error\n"}
{"ImportPath":"ex/d [ex/d.test]","Action":"build-fail"}
{"Action":"start","Package":"ex/d"}
{"Action":"output","Package":"ex/d","Output":"FAIL\tex/d [build failed]\n"}
{"Action":"fail","Package":"ex/d","Elapsed":0,"FailedBuild":"ex/d [ex/d.test]"}
`,
		tally: "unit 1 1 0\nFAILED unit ex/d (did not build: ex/d [ex/d.test])\n",
	}, {
		name:  "before Go 1.24 (or GODEBUG=gotestjsonbuildtext=1): plain text",
		in:    "# ex/d\nex/d/d.go:3:1: syntax error\nFAIL\tex/d [build failed]\n",
		tally: "unit 1 1 0\nFAILED unit a build failed (see the output above)\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var out, tally bytes.Buffer
			s := summarize(strings.NewReader(tc.in+events("pass ex/e TestOK")), &out)
			s.writeTally(&tally, "unit")
			if tally.String() != tc.tally {
				t.Fatalf("tally %q, want %q", tally.String(), tc.tally)
			}
			if !strings.Contains(out.String(), "d.go:3:1: syntax error") {
				t.Fatalf("the compiler's error did not pass through:\n%s", out.String())
			}
		})
	}
}

func TestSummaryAllPassWritesNoFailures(t *testing.T) {
	var out, tally bytes.Buffer
	s := summarize(strings.NewReader(events("pass ex/a TestOK", "pass ex/a")), &out)
	s.writeTally(&tally, "vm-go")
	if tally.String() != "vm-go 1 0 0\n" {
		t.Fatalf("tally %q", tally.String())
	}
}
