package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/internal/cli"
)

// runOut runs the CLI with args and returns its exit code, stdout and stderr.
func runOut(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

// documented is every command a user can run: not hidden, not cobra's help command.
func documented(root *cobra.Command) []*cobra.Command {
	var cmds []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		cmds = append(cmds, c)
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				walk(s)
			}
		}
	}
	walk(root)
	return cmds
}

// longFlags is c's visible long flags, --help included.
func longFlags(c *cobra.Command) []string {
	c.InitDefaultHelpFlag()
	var names []string
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, "--"+f.Name)
		}
	})
	return names
}

// TestExitCodesOfTheCLI: no command and an unknown one are usage errors (2) with the usage;
// help and --version exit 0; completion needs a known shell.
func TestExitCodesOfTheCLI(t *testing.T) {
	for _, tt := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{nil, exitUsage, "", "usage: iser-blk COMMAND"},
		{[]string{"bogus"}, exitUsage, "", `iser-blk: unknown command "bogus"`},
		{[]string{"-v"}, exitUsage, "", "unknown shorthand flag"},
		{[]string{"--help"}, exitOK, "", "commands:\n  attach"},
		{[]string{"help"}, exitOK, "", "commands:\n  attach"},
		{[]string{"help", "attach"}, exitOK, "", "usage: iser-blk attach "},
		{[]string{"--version"}, exitOK, "iser-blk ", ""},
		{[]string{"completion"}, exitUsage, "", "name a shell"},
		{[]string{"completion", "tcsh"}, exitUsage, "", `unknown shell "tcsh"`},
		{[]string{"completion", "bash"}, exitOK, "# bash completion", ""},
		{[]string{"stop", "gw"}, exitUsage, "", ""},                       // stop needs --keep
		{[]string{"attach", "--target", "mem://1MiB"}, exitUsage, "", ""}, // give exactly one of --nbd and --ublk
	} {
		code, stdout, stderr := runOut(tt.args...)
		if code != tt.code || !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
			t.Errorf("%q: exit %d, want %d with %q on stdout and %q on stderr:\nstdout: %s\nstderr: %s",
				tt.args, code, tt.code, tt.stdout, tt.stderr, stdout, stderr)
		}
	}
	code, stdout, _ := runOut("version")
	code2, stdout2, _ := runOut("--version")
	if code != exitOK || code2 != exitOK || stdout != stdout2 {
		t.Errorf("version (%d) %q and --version (%d) %q differ", code, stdout, code2, stdout2)
	}
	code, stdout, _ = runOut("version", "--json")
	var v map[string]any
	if err := json.Unmarshal([]byte(stdout), &v); code != exitOK || err != nil || v["version"] == nil {
		t.Errorf("version --json: exit %d, %v: %q", code, err, stdout)
	}
}

// TestHelpGroupsFlags: each command's help lists its flags under topic headings, hides what does
// not apply (attach's --export-name, the test-only mem:// target) and is the same through `help
// CMD`; every flag of Go's flag package era is still there.
func TestHelpGroupsFlags(t *testing.T) {
	_, _, attach := runOut("attach", "--help")
	_, _, help := runOut("help", "attach")
	if attach != help {
		t.Errorf("help attach differs from attach --help:\n%s\n---\n%s", help, attach)
	}
	headings := regexp.MustCompile(`(?m)^([A-Z].*):$`).FindAllStringSubmatch(attach, -1)
	var got []string
	for _, h := range headings {
		got = append(got, h[1])
	}
	want := []string{groupTarget, groupReliability, groupNBD, groupUblk, groupExport, groupCache, groupService, groupGeneral}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("attach --help headings %q, want %q", got, want)
	}
	for _, s := range []string{"--export-name", "mem://"} {
		if strings.Contains(attach, s) {
			t.Errorf("attach --help shows %s", s)
		}
	}
	_, _, serve := runOut("serve", "--help")
	for _, s := range []string{groupTLS + ":", groupServer + ":", "--export-name", "--tls-verify-peer", "--listen"} {
		if !strings.Contains(serve, s) {
			t.Errorf("serve --help lacks %s", s)
		}
	}
	// The flags each command had on Go's flag package (attach's --export-name still works, hidden).
	old := map[string]string{
		"attach":   "buffer-memory cache cache-dirty cache-read-around cache-size cache-write-around chap-secret-file chap-user command-timeout connections dead-conn-timeout debug depth initiator-name login-timeout max-inflight max-io metrics-listen name nbd nbd-ioctl noop-interval noop-timeout portals-from-discovery queues read-only replacement-timeout run-dir sessions splice target target-secret-file target-user timeout ublk",
		"serve":    "buffer-memory cache cache-dirty cache-read-around cache-size cache-write-around chap-secret-file chap-user command-timeout debug drain-timeout export-name initiator-name listen login-timeout max-inflight metrics-listen name noop-interval noop-timeout portals-from-discovery read-only replacement-timeout run-dir sessions splice target target-secret-file target-user tls tls-certificates tls-verify-peer",
		"info":     "chap-secret-file chap-user debug initiator-name json login-timeout target-secret-file target-user",
		"discover": "chap-secret-file chap-user debug initiator-name login-timeout target-secret-file target-user",
		"list":     "json run-dir",
		"status":   "check json run-dir",
		"detach":   "force run-dir timeout",
		"restart":  "run-dir timeout",
		"stop":     "keep run-dir timeout",
		"version":  "json",
		// and those of the commands that came after
		"csi": "debug endpoint initiator-name launcher max-volumes memory-budget node-id pool pool-claims pool-erase run-dir",
	}
	for name, flags := range old {
		_, _, out := runOut(name, "--help")
		for _, f := range strings.Fields(flags) {
			if !strings.Contains(out, "--"+f+" ") && !strings.Contains(out, "--"+f+"[") && !(name == "attach" && f == "export-name") {
				t.Errorf("%s --help lacks --%s", name, f)
			}
		}
	}
	if code, _, _ := runOut("attach", "--export-name", "x", "--help"); code != exitOK {
		t.Errorf("attach --export-name (hidden) is refused: exit %d", code)
	}
}

// TestSingleDashLongFlags: Go's flag package's -name and -name=value spellings still work on
// iser-blk's commands (cli.Normalise; internal/cli tests the rules).
func TestSingleDashLongFlags(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	for _, tt := range []struct{ in, want string }{
		{"attach -cache wb -ublk", "attach --cache wb --ublk"},
		{"serve -replacement-timeout -1s -target mem://1MiB", "serve --replacement-timeout -1s --target mem://1MiB"},
		{"detach -force -timeout 1m gw", "detach --force --timeout 1m gw"},
		{"help -json", "help -json"},
	} {
		if got := strings.Join(cli.Normalise(root, strings.Fields(tt.in)), " "); got != tt.want {
			t.Errorf("%q → %q, want %q", tt.in, got, tt.want)
		}
	}
	code, stdout, _ := runOut("version", "-json")
	if code != exitOK || !strings.HasPrefix(stdout, "{") {
		t.Errorf("version -json: exit %d, %q", code, stdout)
	}
	if exitUsage != cli.ExitUsage {
		t.Errorf("exitUsage %d, cli.ExitUsage %d", exitUsage, cli.ExitUsage)
	}
}

// TestManPages: gen-man writes a section-8 page for every command, and groff renders each
// without a warning, with its NAME and every long flag of that command.
func TestManPages(t *testing.T) {
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Fatal("groff is needed to check the man pages (test/deps.txt: groff-base; make deps)")
	}
	dir := t.TempDir()
	if code, _, stderr := runOut("gen-man", dir); code != exitOK {
		t.Fatalf("gen-man: exit %d: %s", code, stderr)
	}
	for _, c := range documented(newRootCmd(io.Discard, io.Discard)) {
		name := strings.ReplaceAll(c.CommandPath(), " ", "-")
		page := filepath.Join(dir, name+"."+manSection)
		if _, err := os.Stat(page); err != nil {
			t.Errorf("no man page for %s: %v", c.CommandPath(), err)
			continue
		}
		// Wide lines and no hyphenation, so that no flag is broken across lines.
		cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-rLL=400n", "-rHY=0", "-P-cbou", page)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil || errb.Len() > 0 {
			t.Errorf("groff %s: %v: %s", page, err, errb.String())
			continue
		}
		text := strings.NewReplacer("\u2010", "-", "\u2212", "-").Replace(out.String())
		if !strings.Contains(text, "NAME") || !strings.Contains(text, name+" - "+c.Short) {
			t.Errorf("%s: no NAME section naming %s:\n%s", page, name, text)
		}
		for _, f := range longFlags(c) {
			if !strings.Contains(text, f) {
				t.Errorf("%s does not show %s", page, f)
			}
		}
	}
}

// TestCompletions: the completion scripts parse in their shells (bash always; zsh and fish
// where installed: test/deps.txt lists both), and the completion the scripts call offers the
// commands, a command's flags and --cache's values.
func TestCompletions(t *testing.T) {
	checks := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}
	for shell, check := range checks {
		t.Run(shell, func(t *testing.T) {
			if _, err := exec.LookPath(check[0]); err != nil {
				if shell == "bash" {
					t.Fatal("bash is not installed")
				}
				t.Skipf("%s is not installed (make deps installs it)", shell)
			}
			code, script, stderr := runOut("completion", shell)
			if code != exitOK || !strings.Contains(script, "iser-blk") {
				t.Fatalf("completion %s: exit %d: %s", shell, code, stderr)
			}
			file := filepath.Join(t.TempDir(), "iser-blk."+shell)
			if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(check[0], append(check[1:], file)...).CombinedOutput(); err != nil || len(out) > 0 {
				t.Fatalf("%s %s: %v: %s", strings.Join(check, " "), file, err, out)
			}
		})
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", ""}, []string{"attach", "serve", "status", "completion"}},
		{[]string{"__complete", "attach", "--ca"}, []string{"--cache", "--cache-size"}},
		{[]string{"__complete", "attach", "--cache", ""}, []string{"writeback", "writethrough", "off"}},
		{[]string{"__complete", "serve", "--tls", ""}, []string{"off", "on", "require"}},
	} {
		code, stdout, _ := runOut(tt.args...)
		for _, w := range tt.want {
			if code != exitOK || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(w)+`(\t|$)`).MatchString(stdout) {
				t.Errorf("%q: exit %d, lacks %s:\n%s", tt.args, code, w, stdout)
			}
		}
	}
	if _, stdout, _ := runOut("__complete", ""); strings.Contains(stdout, "gen-man") {
		t.Errorf("the hidden gen-man is offered:\n%s", stdout)
	}
}

// A --name no gateway can have stops attach before anything is opened, as a bad argument (2).
func TestAttachBadNameIsUsage(t *testing.T) {
	if code, _, _ := runOut("attach", "--target", "mem://64MiB", "--ublk", "--name", "bad name", "--run-dir", t.TempDir()); code != exitUsage {
		t.Fatalf("attach --name 'bad name': exit %d, want %d", code, exitUsage)
	}
}
