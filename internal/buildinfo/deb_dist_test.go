//go:build dist

package buildinfo

// make test-dist: the Debian package `make deb` built into $ISERBLK_DIST (mk/deb.mk). The VM
// tier installs and removes it (test/vm/systemd, TestDeb); these check it from the outside.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// debPath is the .deb make deb wrote, iser-blk_VERSION_amd64.deb.
func debPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join(distDir(t), "iser-blk_"+releaseVersion(t)+"_amd64.deb")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("make deb did not write it: %v", err)
	}
	return p
}

func runOK(t *testing.T, name string, args ...string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

// extractDeb unpacks the package's files into a temporary directory.
func extractDeb(t *testing.T, deb string) string {
	t.Helper()
	dir := t.TempDir()
	runOK(t, "dpkg-deb", "-x", deb, dir)
	return dir
}

// TestDistDebContents: dpkg-deb -c lists exactly the files make install stages for Debian, each
// owned by root with its documented mode (/etc/iser-blk 0700, the sample configuration 0600),
// the man pages are the binary's own (gen-man), the only conffile is the sample, and the
// binary is the cgo (RDMA) build that prints the VERSION.
func TestDistDebContents(t *testing.T) {
	deb, v := debPath(t), releaseVersion(t)
	root := extractDeb(t, deb)
	bin := filepath.Join(root, "usr/bin/iser-blk")

	want := map[string]string{ // path -> mode as dpkg-deb -c prints it
		"/etc/iser-blk/":                                     "drwx------",
		"/etc/iser-blk/example.conf.sample":                  "-rw-------",
		"/usr/bin/iser-blk":                                  "-rwxr-xr-x",
		"/usr/lib/iser-blk/iser-blk-unit-stop":               "-rwxr-xr-x",
		"/usr/lib/modules-load.d/iser-blk.conf":              "-rw-r--r--",
		"/usr/lib/systemd/system/iser-blk@.service":          "-rw-r--r--",
		"/usr/share/bash-completion/completions/iser-blk":    "-rw-r--r--",
		"/usr/share/zsh/vendor-completions/_iser-blk":        "-rw-r--r--",
		"/usr/share/fish/vendor_completions.d/iser-blk.fish": "-rw-r--r--",
		"/usr/share/doc/iser-blk/copyright":                  "-rw-r--r--",
		"/usr/share/doc/iser-blk/changelog.gz":               "-rw-r--r--",
	}
	docs, _ := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	for _, f := range append(docs, "README.md", "CHANGELOG.md", "LICENSE") {
		want["/usr/share/doc/iser-blk/"+filepath.Base(f)] = "-rw-r--r--"
	}
	rules, _ := filepath.Glob(filepath.Join("..", "..", "contrib", "udev", "*.rules"))
	for _, f := range rules {
		want["/usr/lib/udev/rules.d/"+filepath.Base(f)] = "-rw-r--r--"
	}
	man := t.TempDir()
	runOK(t, bin, "gen-man", man)
	pages, _ := filepath.Glob(filepath.Join(man, "*.8"))
	if len(pages) < 10 {
		t.Fatalf("gen-man wrote %d pages", len(pages))
	}
	for _, p := range pages {
		want["/usr/share/man/man8/"+filepath.Base(p)+".gz"] = "-rw-r--r--"
	}

	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(runOK(t, "dpkg-deb", "-c", deb)), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 {
			t.Fatalf("dpkg-deb -c line %q: want 6 fields", line)
		}
		mode, owner, path := f[0], f[1], strings.TrimPrefix(f[5], ".")
		if owner != "root/root" {
			t.Errorf("%s is owned by %s, want root/root", path, owner)
		}
		if strings.HasSuffix(path, "/") && want[path] == "" { // a parent directory
			if mode != "drwxr-xr-x" {
				t.Errorf("directory %s has mode %s, want drwxr-xr-x", path, mode)
			}
			continue
		}
		got[path] = mode
	}
	for p, m := range want {
		if got[p] == "" {
			t.Errorf("the package lacks %s", p)
		} else if got[p] != m {
			t.Errorf("%s has mode %s, want %s", p, got[p], m)
		}
	}
	for p := range got {
		if want[p] == "" {
			t.Errorf("the package has %s, which make install does not stage for it", p)
		}
	}

	if conf := strings.TrimSpace(runOK(t, "dpkg-deb", "-I", deb, "conffiles")); conf != "/etc/iser-blk/example.conf.sample" {
		t.Errorf("conffiles: %q, want only /etc/iser-blk/example.conf.sample", conf)
	}
	for field, want := range map[string]string{"Package": "iser-blk", "Version": v, "Architecture": "amd64"} {
		if got := strings.TrimSpace(runOK(t, "dpkg-deb", "-f", deb, field)); got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}
	if interp, libs := linkage(t, bin); interp == "" || !slices.Contains(libs, "librdmacm.so.1") {
		t.Errorf("/usr/bin/iser-blk is not the cgo (RDMA) build: interpreter %q, libraries %v", interp, libs)
	}
	checkVersion(t, bin, v, []string{FeatureRDMA})
}

// TestDistDebPaths: the unit, its stop helper and the udev rules name the binary and the
// helper where the package puts them, never make install's default /usr/local.
func TestDistDebPaths(t *testing.T) {
	root := extractDeb(t, debPath(t))
	files := []string{"usr/lib/systemd/system/iser-blk@.service", "usr/lib/iser-blk/iser-blk-unit-stop"}
	rules, _ := filepath.Glob(filepath.Join(root, "usr/lib/udev/rules.d/*.rules"))
	for _, r := range rules {
		files = append(files, strings.TrimPrefix(r, root+"/"))
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("/usr/local")) {
			t.Errorf("/%s names /usr/local", f)
		}
	}
	if len(rules) == 0 {
		t.Error("the package has no udev rule")
	}
	for _, r := range rules {
		if b, _ := os.ReadFile(r); !bytes.Contains(b, []byte(`IMPORT{program}="/usr/bin/iser-blk udev-name %k"`)) {
			t.Errorf("/%s does not ask /usr/bin/iser-blk udev-name for the name", strings.TrimPrefix(r, root+"/"))
		}
	}
	unit, _ := os.ReadFile(filepath.Join(root, files[0]))
	for _, want := range []string{"ExecStart=/usr/bin/iser-blk ", "ExecStop=/usr/lib/iser-blk/iser-blk-unit-stop ", "ExecReload=/usr/bin/iser-blk restart"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("the packaged unit lacks %q", want)
		}
	}
}

// TestDistDebDepends: Depends is what dpkg-shlibdeps derives from the packaged binary, so a
// symbol from a newer libibverbs or glibc cannot slip in with a stale minimum version.
func TestDistDebDepends(t *testing.T) {
	deb := debPath(t)
	root := extractDeb(t, deb)
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, "debian"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "debian", "control"),
		[]byte("Source: iser-blk\n\nPackage: iser-blk\nArchitecture: amd64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("dpkg-shlibdeps", "-O", filepath.Join(root, "usr/bin/iser-blk"))
	cmd.Dir = work
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dpkg-shlibdeps: %v", err)
	}
	derived, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "shlibs:Depends=")
	if !ok {
		t.Fatalf("dpkg-shlibdeps printed %q", out)
	}
	if got := strings.TrimSpace(runOK(t, "dpkg-deb", "-f", deb, "Depends")); got != derived {
		t.Errorf("Depends: %s\ndpkg-shlibdeps derives: %s (update packaging/nfpm.yaml)", got, derived)
	}
}

// TestDistDebLintian: lintian (Debian's package checker) finds no error. Its warnings are logged:
// two are by design, /etc/iser-blk 0700 and the sample 0600 (the configuration holds CHAP
// secrets).
func TestDistDebLintian(t *testing.T) {
	deb := debPath(t)
	cmd := exec.Command("lintian", "--no-cfg", "--pedantic", deb)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		switch {
		case strings.HasPrefix(l, "E: "):
			t.Errorf("lintian: %s", l)
		case l != "":
			t.Logf("lintian: %s", l)
		}
	}
	if err != nil {
		t.Errorf("lintian: %v", err)
	}
}
