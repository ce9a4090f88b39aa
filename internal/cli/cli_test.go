package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// testRoot is a program "prog" with a leaf "get NAME" (flags in two groups, one hidden, one of no
// group) whose run returns code, and a leaf "ls" with no flags of its own.
func testRoot(code int, out *bytes.Buffer) (root *cobra.Command, ran *[]string) {
	ran = new([]string)
	root = &cobra.Command{Use: "prog COMMAND", Short: "a program", SilenceErrors: true, SilenceUsage: true}
	root.SetOut(out)
	root.SetErr(out)
	SetUsage(root, "\nfooter\n")
	get := Leaf("get NAME [flags]", "get a thing", "Get the thing NAME.", 1, func(_ *cobra.Command, args []string) int {
		*ran = args
		return code
	})
	Group(get, "Target", func(fs *pflag.FlagSet) {
		fs.String("cache", "writeback", "cache mode")
		fs.Bool("ublk", false, "use ublk")
		fs.String("export-name", "", "hidden")
	})
	Group(get, "Output", func(fs *pflag.FlagSet) {
		fs.Bool("json", false, "print JSON")
		fs.Duration("timeout", time.Second, "give up after this long")
	})
	get.Flags().Bool("debug", false, "debug logging")
	Hide(get, "export-name")
	CompleteWords(get, "cache", "writeback", "off")
	root.AddCommand(get, Leaf("ls", "list things", "", 0, func(*cobra.Command, []string) int { return 0 }))
	return root, ran
}

// TestHelpGroupsEveryFlagOnce: a command's help lists each visible flag exactly once, under its
// group's heading, groups in the order added and General (--help, --debug) last; hidden flags
// not at all; the footer only on a command with subcommands.
func TestHelpGroupsEveryFlagOnce(t *testing.T) {
	var out bytes.Buffer
	root, _ := testRoot(0, &out)
	if code := Execute(context.Background(), root, []string{"get", "--help"}); code != 0 {
		t.Fatalf("get --help: exit %d", code)
	}
	help := out.String()
	want := []string{"usage: prog get NAME [flags]\n", "\nGet the thing NAME.\n", "\nTarget:\n", "--cache", "--ublk",
		"\nOutput:\n", "--json", "--timeout", "\nGeneral:\n", "--debug", "--help"}
	at := 0
	for _, w := range want {
		i := strings.Index(help[at:], w)
		if i < 0 {
			t.Fatalf("help lacks %q after offset %d:\n%s", w, at, help)
		}
		at += i + len(w)
	}
	for _, f := range []string{"--cache", "--ublk", "--json", "--timeout", "--debug", "--help"} {
		if n := strings.Count(help, f+" ") + strings.Count(help, f+"["); n != 1 {
			t.Errorf("%s listed %d times:\n%s", f, n, help)
		}
	}
	if strings.Contains(help, "export-name") || strings.Contains(help, "footer") {
		t.Errorf("help shows a hidden flag or the root's footer:\n%s", help)
	}
	out.Reset()
	if code := Execute(context.Background(), root, []string{"help"}); code != 0 ||
		!strings.Contains(out.String(), "\n  get         get a thing\n") || !strings.HasSuffix(out.String(), "\nfooter\n") {
		t.Errorf("help: exit %d:\n%s", code, out.String())
	}
}

// TestExecuteExitCodes: a leaf's exit code is the process's; a usage error (flag, argument count,
// unknown command) is ExitUsage, reported with the command's usage, before the command runs.
func TestExecuteExitCodes(t *testing.T) {
	for _, tt := range []struct {
		args []string
		run  int
		code int
		out  string
	}{
		{[]string{"get", "x"}, 0, 0, ""},
		{[]string{"get", "x"}, 7, 7, ""},
		{[]string{"get"}, 0, ExitUsage, "prog get: expected 1 argument(s), got 0\n\nusage: prog get NAME"},
		{[]string{"get", "--nope", "x"}, 0, ExitUsage, "prog get: unknown flag: --nope\n\nusage: prog get NAME"},
		{[]string{"get", "-debug", "x"}, 0, 0, ""},
		{[]string{"get", "x", "-h"}, 0, 0, "usage: prog get NAME"},
	} {
		var out bytes.Buffer
		root, ran := testRoot(tt.run, &out)
		code := Execute(context.Background(), root, tt.args)
		if code != tt.code || !strings.HasPrefix(out.String(), tt.out) || (tt.out != "") == (len(*ran) == 1) {
			t.Errorf("%q: exit %d (ran %q), want %d:\n%s", tt.args, code, *ran, tt.code, out.String())
		}
	}
}

// TestNormaliseRewritesOnlyKnownLongFlags: a single-dash word naming a long flag of the command
// becomes --name; flag values, positional arguments, short flags, unknown words and everything
// after "--" are left alone.
func TestNormaliseRewritesOnlyKnownLongFlags(t *testing.T) {
	root, _ := testRoot(0, new(bytes.Buffer))
	for _, tt := range []struct{ in, want string }{
		{"get -cache wb -ublk x", "get --cache wb --ublk x"},
		{"get -cache=wb --json=true x", "get --cache=wb --json=true x"},
		{"get --cache -debug -debug", "get --cache -debug --debug"},
		{"get -timeout -1s -cache off x", "get --timeout -1s --cache off x"},
		{"get -json x -- -debug", "get --json x -- -debug"},
		{"get -h -x x", "get -h -x x"},
		{"get -help x", "get --help x"},
		{"get ---json x", "get ---json x"},
		{"help -json", "help -json"},
		{"bogus -json", "bogus -json"},
	} {
		if got := strings.Join(Normalise(root, strings.Fields(tt.in)), " "); got != tt.want {
			t.Errorf("%q → %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestCompletion: the named values complete, hidden flags do not.
func TestCompletion(t *testing.T) {
	var out bytes.Buffer
	root, _ := testRoot(0, &out)
	root.InitDefaultCompletionCmd()
	if code := Execute(context.Background(), root, []string{"__complete", "get", "--cache", ""}); code != 0 ||
		!strings.Contains(out.String(), "writeback\noff\n") {
		t.Errorf("exit %d:\n%s", code, out.String())
	}
	out.Reset()
	Execute(context.Background(), root, []string{"__complete", "get", "--"})
	if !strings.Contains(out.String(), "--cache") || strings.Contains(out.String(), "--export-name") {
		t.Errorf("flags offered:\n%s", out.String())
	}
}

// TestUnknownFlagPanics: hiding or completing a flag the command lacks is a programming error.
func TestUnknownFlagPanics(t *testing.T) {
	for name, f := range map[string]func(*cobra.Command){
		"Hide":          func(c *cobra.Command) { Hide(c, "nope") },
		"CompleteFiles": func(c *cobra.Command) { CompleteFiles(c, "nope") },
		"CompleteDirs":  func(c *cobra.Command) { CompleteDirs(c, "nope") },
		"CompleteWords": func(c *cobra.Command) { CompleteWords(c, "nope", "a") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s of an unknown flag did not panic", name)
				}
			}()
			f(&cobra.Command{Use: "x"})
		}()
	}
}

// TestGenMan: a page per command, in a directory GenMan creates, without cobra's generated-by tag.
func TestGenMan(t *testing.T) {
	root, _ := testRoot(0, new(bytes.Buffer))
	dir := filepath.Join(t.TempDir(), "man8")
	if err := GenMan(root, dir, &doc.GenManHeader{Section: "8", Source: "prog 1.0"}); err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"prog.8", "prog-get.8", "prog-ls.8"} {
		b, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("Auto generated")) {
			t.Errorf("%s has cobra's tag", page)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "prog-get.8")); !bytes.Contains(b, []byte("cache")) || bytes.Contains(b, []byte("export-name")) {
		t.Errorf("prog-get.8:\n%s", b)
	}
}
