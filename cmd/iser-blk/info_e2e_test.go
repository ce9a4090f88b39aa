//go:build e2e

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/chapcreds"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

var (
	cliBinOnce sync.Once
	cliBin     string
	cliBinErr  error
)

// iserBlkBin returns the CLI under test: $ISERBLK_BIN when it exists (make test-e2e builds it),
// else a fresh build of this package.
func iserBlkBin(t *testing.T) string {
	t.Helper()
	cliBinOnce.Do(func() {
		if p := os.Getenv("ISERBLK_BIN"); p != "" {
			if _, err := os.Stat(p); err == nil {
				cliBin = p
				return
			}
		}
		dir, err := os.MkdirTemp("", "iser-blk-cli-e2e-")
		if err != nil {
			cliBinErr = err
			return
		}
		cliBin = filepath.Join(dir, "iser-blk")
		out, err := exec.Command("go", "build", "-o", cliBin, ".").CombinedOutput()
		if err != nil {
			cliBinErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if cliBinErr != nil {
		t.Fatal(cliBinErr)
	}
	return cliBin
}

type cliResult struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func runCLI(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(iserBlkBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running iser-blk: %v", err)
	}
	t.Logf("iser-blk %s → exit %d in %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.took, r.stdout, r.stderr)
	return r
}

func addLUN(t *testing.T, tg *tgtd.Target, lun int, size int64, blockSize int) {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "iser-blk-cli-e2e-*.img")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := tg.TGTAdm("--mode", "logicalunit", "--op", "new", "--tid", strconv.Itoa(tg.TID), "--lun", strconv.Itoa(lun),
		"--backing-store", f.Name(), "--blocksize", strconv.Itoa(blockSize)); err != nil {
		t.Fatal(err)
	}
}

// tgtadmLUNs parses `tgtadm --mode target --op show` (one target per fixture) into LUN → (size in MB as tgtadm rounds
// it, block size), the target's own view of what it exports.
func tgtadmLUNs(t *testing.T, tg *tgtd.Target) map[int][2]int64 {
	t.Helper()
	// Without --tid, show lists targets with their LUNs (with --tid it lists parameters).
	out, err := tg.TGTAdm("--mode", "target", "--op", "show")
	if err != nil {
		t.Fatal(err)
	}
	luns := map[int][2]int64{}
	cur := -1
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(line, "LUN: "); ok {
			cur, _ = strconv.Atoi(n)
			continue
		}
		// "Size: 105 MB, Block size: 512"
		var mb, bs int64
		if _, err := fmt.Sscanf(line, "Size: %d MB, Block size: %d", &mb, &bs); err == nil && cur >= 0 {
			luns[cur] = [2]int64{mb, bs}
		}
	}
	return luns
}

func TestE2EInfo(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 100 << 20})
	addLUN(t, tg, 2, 48<<20, 4096)
	configured := tgtadmLUNs(t, tg)
	for _, tc := range []struct {
		lun       int
		size      int64
		blockSize int
		human     string
	}{{1, 100 << 20, 512, "100 MiB"}, {2, 48 << 20, 4096, "48 MiB"}} {
		url := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tc.lun)
		r := runCLI(t, nil, "info", url)
		if r.code != exitOK {
			t.Fatalf("info exit %d", r.code)
		}
		for _, want := range []string{
			"Vendor:", "IET", "Product:", "VIRTUAL-DISK", "Serial:", "WWN:", "naa.",
			fmt.Sprintf("Capacity:             %d bytes (%s, %d blocks)", tc.size, tc.human, tc.size/int64(tc.blockSize)),
			fmt.Sprintf("Logical block size:   %d\n", tc.blockSize),
			"Physical block size:", "Max transfer:", "Optimal transfer:", "Thin provisioning:", "Write cache:",
			"FUA:", "Read-only:            no",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("LUN %d: output lacks %q", tc.lun, want)
			}
		}
		j := runCLI(t, nil, "info", "--json", url)
		var got struct { // the fields of info's stable JSON this test checks
			CapacityBytes    int64  `json:"capacity_bytes"`
			Blocks           uint64 `json:"blocks"`
			LogicalBlockSize uint32 `json:"logical_block_size"`
		}
		if err := json.Unmarshal([]byte(j.stdout), &got); err != nil || j.code != 0 {
			t.Fatalf("info --json: exit %d, %v", j.code, err)
		}
		if got.CapacityBytes != tc.size || int(got.LogicalBlockSize) != tc.blockSize || got.Blocks != uint64(tc.size)/uint64(tc.blockSize) {
			t.Fatalf("LUN %d: json %+v, want %d bytes in %d-byte blocks", tc.lun, got, tc.size, tc.blockSize)
		}
		// And against what tgtadm itself reports (sizes in decimal MB, rounded).
		c, ok := configured[tc.lun]
		if !ok || c[1] != int64(got.LogicalBlockSize) || (got.CapacityBytes+500_000)/1_000_000 != c[0] {
			t.Fatalf("LUN %d: tgtadm shows %v (MB, block size), info says %d bytes, %d-byte blocks", tc.lun, c, got.CapacityBytes, got.LogicalBlockSize)
		}
	}
}

func TestE2EDiscover(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{})
	r := runCLI(t, nil, "discover", tg.Portal)
	if r.code != 0 || !strings.Contains(r.stdout, tg.Portal+",1 "+tg.Name+"\n") {
		t.Fatalf("discover: exit %d, stdout %q", r.code, r.stdout)
	}
	// Flags after the positional argument work too.
	if r := runCLI(t, nil, "discover", tg.Portal, "--debug"); r.code != 0 {
		t.Fatalf("discover --debug: exit %d", r.code)
	}
}

func TestE2EExitCodes(t *testing.T) {
	const user, secret = "cliuser", "cli-secret-0123456"
	const tuser, tsecret = "clitarget", "cli-target-secret-9876"
	tg := tgtd.Start(t, tgtd.Options{CHAP: &tgtd.Account{User: user, Password: secret},
		MutualCHAP: &tgtd.Account{User: tuser, Password: tsecret}})
	dir := t.TempDir()
	writeSecret := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := writeSecret("good", secret)
	bad := writeSecret("bad", "wrong-secret-000000")
	target := writeSecret("target", tsecret)
	url := fmt.Sprintf("iscsi://%s@%s/%s/1", user, tg.Portal, tg.Name)

	cases := []struct {
		name     string
		env      []string
		args     []string
		code     int
		stderr   []string
		deadline time.Duration
	}{
		{"CHAP secret from file", nil, []string{"info", "--chap-secret-file", good, url}, exitOK, nil, 0},
		{"CHAP secret from env", []string{chapcreds.EnvSecret + "=" + secret}, []string{"info", url}, exitOK, nil, 0},
		{"mutual CHAP", nil, []string{"info", "--chap-secret-file", good, "--target-user", tuser, "--target-secret-file", target, url}, exitOK, nil, 0},
		{"mutual CHAP from env", []string{chapcreds.EnvSecret + "=" + secret, chapcreds.EnvSecretMutual + "=" + tsecret}, []string{"info", url}, exitOK, nil, 0},
		{"wrong secret", nil, []string{"info", "--chap-secret-file", bad, url}, exitAuth,
			[]string{"authentication failed", tg.Name}, 5 * time.Second},
		{"wrong mutual secret", []string{chapcreds.EnvSecret + "=" + secret, chapcreds.EnvSecretMutual + "=not-the-target-secret"},
			[]string{"info", url}, exitAuth, []string{"authentication failed", tg.Name}, 5 * time.Second},
		{"wrong IQN", []string{chapcreds.EnvSecret + "=" + secret},
			[]string{"info", fmt.Sprintf("iscsi://%s@%s/iqn.2026-11.io.iser-blk:no-such-target/1", user, tg.Portal)},
			exitNotFound, []string{"target not found"}, 5 * time.Second},
		{"no such LUN", []string{chapcreds.EnvSecret + "=" + secret}, []string{"info", fmt.Sprintf("iscsi://%s@%s/%s/7", user, tg.Portal, tg.Name)},
			exitNotFound, []string{"logical unit not found"}, 5 * time.Second},
		{"closed port", nil, []string{"info", fmt.Sprintf("iscsi://%s/%s/1", tgtd.ClosedPort(t), tg.Name)},
			exitUnreachable, []string{"portal unreachable"}, 5 * time.Second},
		{"discover closed port", nil, []string{"discover", tgtd.ClosedPort(t)}, exitUnreachable, []string{"portal unreachable"}, 5 * time.Second},
		{"secret in URL refused", nil, []string{"info", fmt.Sprintf("iscsi://%s:%s@%s/%s/1", user, secret, tg.Portal, tg.Name)},
			exitUsage, []string{"must not be in the URL"}, 0},
		{"user without secret", nil, []string{"info", url}, exitUsage, []string{"needs a secret"}, 0},
		{"no URL", nil, []string{"info"}, exitUsage, []string{"usage: iser-blk info"}, 0},
		{"help", nil, []string{"info", "--help"}, exitOK, []string{"usage: iser-blk info", "-chap-secret-file"}, 0},
		{"discover help", nil, []string{"discover", "-h"}, exitOK, []string{"usage: iser-blk discover"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := append([]string{chapcreds.EnvSecret + "=", chapcreds.EnvSecretMutual + "="}, c.env...)
			r := runCLI(t, env, c.args...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d", r.code, c.code)
			}
			for _, s := range c.stderr {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr lacks %q", s)
				}
			}
			if c.deadline > 0 && r.took > c.deadline {
				t.Errorf("took %v, want under %v", r.took, c.deadline)
			}
			for _, s := range []string{secret, tsecret} {
				if strings.Contains(r.stdout+r.stderr, s) && c.name != "secret in URL refused" {
					t.Errorf("output contains a secret")
				}
			}
			if c.name == "secret in URL refused" && strings.Contains(r.stderr, secret) {
				t.Errorf("the refused URL's secret is echoed")
			}
		})
	}
}
