package buildinfo

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// What a release ships besides the binary (issue 36), checked from the module root.

// semver is SemVer 2.0.0's version grammar (semver.org's suggested expression).
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

func readRoot(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// releaseVersion is the VERSION file's one line: the version make build and make dist stamp.
func releaseVersion(t *testing.T) string {
	t.Helper()
	v := readRoot(t, "VERSION")
	if !strings.HasSuffix(v, "\n") || strings.Count(v, "\n") != 1 {
		t.Fatalf("VERSION is %q: want one line", v)
	}
	v = strings.TrimSuffix(v, "\n")
	if !semver.MatchString(v) {
		t.Fatalf("VERSION %q is not a semantic version (no leading v)", v)
	}
	return v
}

// TestChangelogHasTheVersion: CHANGELOG.md (Keep a Changelog) has an Unreleased section and a
// dated section for VERSION with a link for each, so a release is never cut without its entry.
func TestChangelogHasTheVersion(t *testing.T) {
	v := releaseVersion(t)
	cl := readRoot(t, "CHANGELOG.md")
	heading := regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(v) + `\] - \d{4}-\d{2}-\d{2}$`)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^## \[Unreleased\]$`),
		heading,
		regexp.MustCompile(`(?m)^\[Unreleased\]: \S+$`),
		regexp.MustCompile(`(?m)^\[` + regexp.QuoteMeta(v) + `\]: \S+v` + regexp.QuoteMeta(v) + `$`),
	} {
		if !want.MatchString(cl) {
			t.Errorf("CHANGELOG.md lacks a line matching %s", want)
		}
	}
	if i := heading.FindStringIndex(cl); i != nil && !strings.Contains(cl[i[1]:], "### Added") {
		t.Errorf("CHANGELOG.md's %s section lists nothing under ### Added", v)
	}
}

// TestLicense: LICENSE is the Apache License 2.0, verbatim (the text Debian ships as
// /usr/share/common-licenses/Apache-2.0 and apache.org as LICENSE-2.0.txt), and README says so.
func TestLicense(t *testing.T) {
	const apache2 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
	sum := sha256.Sum256([]byte(readRoot(t, "LICENSE")))
	if got := hex.EncodeToString(sum[:]); got != apache2 {
		t.Errorf("LICENSE sha256 %s: not the Apache-2.0 text (%s)", got, apache2)
	}
	readme := readRoot(t, "README.md")
	if !regexp.MustCompile(`(?m)^## License\n\n.*Apache License, Version 2\.0`).MatchString(readme) {
		t.Error("README.md has no License section naming the Apache License, Version 2.0")
	}
}
