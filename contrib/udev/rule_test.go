package udev

import (
	"os"
	"strings"
	"testing"
)

// installedBinary is the path the rule runs; make install rewrites it to $(PREFIX)/bin, as it
// does in contrib/systemd.
const installedBinary = "/usr/local/bin/iser-blk"

// TestRuleRunsTheHelperItsLinksNeed: the rule imports the helper's properties by the names it
// prints, links whole disks and partitions under /dev/iser-blk, and leaves everything that is
// not an nbd or ublk disk alone. Each rule line must parse as udev's KEY[{attr}]OP"VALUE"
// comma-separated list.
func TestRuleRunsTheHelperItsLinksNeed(t *testing.T) {
	b, err := os.ReadFile("60-iser-blk.rules")
	if err != nil {
		t.Fatal(err)
	}
	rule := string(b)
	for _, want := range []string{
		`IMPORT{program}="` + installedBinary + ` udev-name %k"`,
		`SYMLINK+="iser-blk/$env{ISER_BLK_NAME}"`,
		`SYMLINK+="iser-blk/$env{ISER_BLK_NAME}-part%n"`,
		`IMPORT{parent}="ISER_BLK_*"`,
		`KERNEL!="nbd*|ublkb*", GOTO="iser_blk_end"`,
		`LABEL="iser_blk_end"`,
	} {
		if !strings.Contains(rule, want) {
			t.Errorf("the rule lacks %s", want)
		}
	}
	for i, line := range strings.Split(rule, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := parseRuleLine(line); err != "" {
			t.Errorf("line %d %q: %s", i+1, line, err)
		}
	}
}

// parseRuleLine checks udev's rule syntax (udev(7)): KEY, an optional {attribute}, an operator,
// a double-quoted value; pairs separated by ", ". It returns what is wrong, or "".
func parseRuleLine(line string) string {
	for rest := line; rest != ""; {
		k := strings.IndexAny(rest, "=!+-:")
		if k <= 0 {
			return "no key"
		}
		key := rest[:k]
		if strings.Trim(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") != "" {
			if open := strings.IndexByte(key, '{'); open <= 0 || !strings.HasSuffix(key, "}") {
				return "bad key " + key
			}
		}
		rest = rest[k:]
		op := ""
		for _, o := range []string{"==", "!=", "+=", "-=", ":=", "="} {
			if strings.HasPrefix(rest, o) {
				op = o
				break
			}
		}
		if op == "" || !strings.HasPrefix(rest[len(op):], `"`) {
			return "bad operator or unquoted value after " + key
		}
		rest = rest[len(op)+1:]
		end := strings.IndexByte(rest, '"')
		if end < 0 {
			return "unterminated value of " + key
		}
		rest = rest[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ", ") {
				return "pairs must be separated by \", \""
			}
			rest = rest[2:]
		}
	}
	return ""
}
