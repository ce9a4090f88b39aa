//go:build dist

package buildinfo

// make test-dist: the binaries `make dist` built into $ISERBLK_DIST (build tag dist; without the
// variable the test fails, it never skips).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func distDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ISERBLK_DIST")
	if dir == "" {
		t.Fatal("ISERBLK_DIST is not set: run make test-dist")
	}
	return dir
}

func gitHead(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestDistFiles: exactly the two binaries and SHA256SUMS, whose sums match.
func TestDistFiles(t *testing.T) {
	dir, v := distDir(t), releaseVersion(t)
	static, rdma := "iser-blk-"+v+"-linux-amd64-static", "iser-blk-"+v+"-linux-amd64-rdma"
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSuffix(string(sums), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's format", line)
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: sha256 differs from SHA256SUMS", name)
		}
		listed = append(listed, name)
	}
	if slices.Sort(listed); !slices.Equal(listed, []string{rdma, static}) {
		t.Errorf("SHA256SUMS lists %v, want %s and %s", listed, static, rdma)
	}
}

// TestDistStatic: the static build has no ELF interpreter and no shared libraries, refuses an
// iser:// target at once with exit 2 and a message naming the rdma build, and says it has no
// rdma feature.
func TestDistStatic(t *testing.T) {
	v := releaseVersion(t)
	bin := filepath.Join(distDir(t), "iser-blk-"+v+"-linux-amd64-static")
	interp, libs := linkage(t, bin)
	if interp != "" || len(libs) != 0 {
		t.Errorf("%s is not static: interpreter %q, libraries %v", bin, interp, libs)
	}
	checkVersion(t, bin, v, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// TEST-NET-1: were the target dialed, the command would wait out the login timeout and
	// exit 5 (unreachable), not 2.
	cmd := exec.CommandContext(ctx, bin, "info", "--initiator-name", "iqn.2016-04.com.open-iscsi:0123456789ab",
		"iser://192.0.2.1/iqn.2003-01.org.example:disk/0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("info iser://: %v (want exit 2); stderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{"built without RDMA", "iser-blk-" + v + "-linux-amd64-rdma", "iscsi://"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
		}
	}
}

// TestDistRDMA: the rdma build links libibverbs and librdmacm and says it has the rdma feature.
func TestDistRDMA(t *testing.T) {
	v := releaseVersion(t)
	bin := filepath.Join(distDir(t), "iser-blk-"+v+"-linux-amd64-rdma")
	interp, libs := linkage(t, bin)
	if interp == "" {
		t.Errorf("%s has no ELF interpreter: not the cgo build", bin)
	}
	for _, lib := range []string{"libibverbs.so.1", "librdmacm.so.1"} {
		if !slices.Contains(libs, lib) {
			t.Errorf("%s does not link %s: %v", bin, lib, libs)
		}
	}
	checkVersion(t, bin, v, []string{FeatureRDMA})
}

// linkage is bin's ELF interpreter ("" for none) and DT_NEEDED libraries.
func linkage(t *testing.T, bin string) (interp string, libs []string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		t.Errorf("%s is for %v, want x86-64", bin, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	libs, err = f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	return interp, libs
}

// checkVersion: `version --json` says the VERSION file's version, this checkout's revision and
// exactly the features wanted.
func checkVersion(t *testing.T, bin, version string, features []string) {
	t.Helper()
	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("%s version --json: %v", bin, err)
	}
	var got Info
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("version --json %q: %v", out, err)
	}
	if got.Version != version || got.Revision != gitHead(t) || !strings.HasPrefix(got.Go, "go") {
		t.Errorf("%s version --json: %+v, want version %s at %s", filepath.Base(bin), got, version, gitHead(t))
	}
	if features == nil {
		features = []string{}
	}
	if !slices.Equal(got.Features, features) {
		t.Errorf("%s features %q, want %q", filepath.Base(bin), got.Features, features)
	}
}
