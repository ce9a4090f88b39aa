//go:build vm

package systemd_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestDeb: the Debian package `make deb` built (gotest.sh builds it on the host and passes it as
// $ISERBLK_DEB) installs with dpkg on this guest's root (the host's, under a tmpfs overlay), the
// installed binary prints the VERSION, every file is where dpkg -L says with /etc/iser-blk 0700
// and the sample configuration 0600, systemd knows the unit from /usr/lib, man finds the
// pages, bash loads the completion; dpkg -r keeps only the conffile, dpkg -P removes it and the
// generated initiator name, and afterwards every directory the package touched lists what it
// listed before.
func TestDeb(t *testing.T) {
	requirePID1(t)
	withoutMakeInstall(t)
	deb, root := os.Getenv("ISERBLK_DEB"), os.Getenv("ISERBLK_ROOT")
	if deb == "" {
		t.Fatal("ISERBLK_DEB is not set: test/vm/gotest.sh builds the package for the systemd tier (make deb)")
	}
	version, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(version))
	if out, code := run("dpkg-query", "-W", "-f=${Status}", "iser-blk"); code == 0 && strings.Contains(out, "installed") {
		t.Fatalf("iser-blk is installed before the test: %s", out)
	}

	// the package's files and directories, and a listing of every directory it touches
	var files, dirs []string
	for _, line := range strings.Split(strings.TrimSpace(must(t, "dpkg-deb", "-c", deb)), "\n") {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[len(f)-1], ".")
		if strings.HasSuffix(p, "/") {
			dirs = append(dirs, strings.TrimSuffix(p, "/"))
		} else {
			files = append(files, p)
		}
	}
	before := listing(t, dirs)
	t.Cleanup(func() { run("dpkg", "--purge", "iser-blk") })

	t.Logf("dpkg -i %s", filepath.Base(deb))
	must(t, "dpkg", "-i", deb)
	if out := must(t, "dpkg-query", "-W", "-f=${Status} ${Version}", "iser-blk"); out != "install ok installed "+v {
		t.Fatalf("dpkg-query after dpkg -i: %q, want install ok installed %s", out, v)
	}
	if out := must(t, "/usr/bin/iser-blk", "--version"); !strings.HasPrefix(out, "iser-blk "+v+" ") || !strings.Contains(out, "rdma") {
		t.Fatalf("iser-blk --version: %q, want iser-blk %s (... rdma)", out, v)
	}
	listed := strings.Split(strings.TrimSpace(must(t, "dpkg", "-L", "iser-blk")), "\n")
	for _, f := range files {
		if !slices.Contains(listed, f) {
			t.Errorf("dpkg -L does not list %s", f)
		}
		if _, err := os.Stat(f); err != nil {
			t.Errorf("installed: %v", err)
		}
	}
	for p, want := range map[string]os.FileMode{"/etc/iser-blk": os.ModeDir | 0o700, "/etc/iser-blk/example.conf.sample": 0o600,
		"/usr/bin/iser-blk": 0o755, "/usr/lib/systemd/system/iser-blk@.service": 0o644} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want || fi.Sys().(*syscall.Stat_t).Uid != 0 || fi.Sys().(*syscall.Stat_t).Gid != 0 {
			t.Errorf("%s: %v owned by %d:%d, want %v root:root", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, fi.Sys().(*syscall.Stat_t).Gid, want)
		}
	}
	// the postinst's daemon-reload: systemd knows the template from /usr/lib, and it points at /usr
	// (systemd 252 on a merged /usr names it by its /lib path)
	out := strings.TrimSpace(must(t, "systemctl", "show", "-p", "FragmentPath", "iser-blk@debtest.service"))
	if frag, err := filepath.EvalSymlinks(strings.TrimPrefix(out, "FragmentPath=")); err != nil || frag != "/usr/lib/systemd/system/iser-blk@.service" {
		t.Errorf("systemctl show iser-blk@debtest: %q (%v), want the package's /usr/lib/systemd/system/iser-blk@.service", out, err)
	}
	unit := must(t, "systemctl", "cat", "iser-blk@debtest.service")
	if !strings.Contains(unit, "ExecStart=/usr/bin/iser-blk ") || !strings.Contains(unit, "ExecStop=/usr/lib/iser-blk/iser-blk-unit-stop ") {
		t.Errorf("systemctl cat iser-blk@debtest does not run /usr/bin/iser-blk and /usr/lib/iser-blk/iser-blk-unit-stop:\n%s", unit)
	}
	rules, _ := filepath.Glob(filepath.Join(root, "contrib", "udev", "*.rules"))
	for _, r := range rules {
		if _, err := os.Stat("/usr/lib/udev/rules.d/" + filepath.Base(r)); err != nil {
			t.Errorf("udev rule: %v", err)
		}
	}
	if b, err := os.ReadFile("/usr/lib/modules-load.d/iser-blk.conf"); err != nil || !slices.Contains(strings.Split(string(b), "\n"), "nbd") {
		t.Errorf("/usr/lib/modules-load.d/iser-blk.conf does not load nbd: %q %v", b, err)
	}
	if out := must(t, "man", "-w", "iser-blk-attach"); strings.TrimSpace(out) != "/usr/share/man/man8/iser-blk-attach.8.gz" {
		t.Errorf("man -w iser-blk-attach: %q", out)
	}
	must(t, "bash", "-c", "source /usr/share/bash-completion/completions/iser-blk && complete -p iser-blk")

	// a gateway's first start without open-iscsi generates the initiator name (internal/initiatorname)
	if err := os.WriteFile("/etc/iser-blk/initiatorname", []byte("InitiatorName=iqn.2025-01.io.iser-blk:0123456789ab\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	must(t, "dpkg", "-r", "iser-blk")
	if out, _ := run("dpkg-query", "-W", "-f=${Status}", "iser-blk"); out != "deinstall ok config-files" {
		t.Errorf("dpkg-query after dpkg -r: %q, want deinstall ok config-files", out)
	}
	for _, f := range files {
		_, err := os.Stat(f)
		if keep := strings.HasPrefix(f, "/etc/"); keep != (err == nil) {
			t.Errorf("after dpkg -r: %s: %v (conffiles stay, the rest goes)", f, err)
		}
	}
	if out := must(t, "systemctl", "show", "-p", "LoadState", "iser-blk@debtest.service"); strings.TrimSpace(out) != "LoadState=not-found" {
		t.Errorf("after dpkg -r systemd still finds the unit: %q", out)
	}

	must(t, "dpkg", "-P", "iser-blk")
	if out, code := run("dpkg-query", "-W", "-f=${Status}", "iser-blk"); code == 0 && out != "unknown ok not-installed" {
		t.Errorf("dpkg-query after dpkg -P: %q (exit %d), want not installed", out, code)
	}
	after := listing(t, dirs)
	for d, was := range before {
		if now := after[d]; !slices.Equal(was, now) {
			t.Errorf("%s: before the install %q, after the purge %q", d, was, now)
		}
	}
}

// listing is each directory's entries (nil for a directory that does not exist).
func listing(t *testing.T, dirs []string) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	for _, d := range dirs {
		es, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		m[d] = names
	}
	return m
}
