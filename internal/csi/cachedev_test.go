package csi

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestStageCacheDev: a volume that asks for a cache device (cache-dev-size) is refused on a node
// whose plugin has no --cache-dev-dir; elsewhere its gateway gets --cache-dev in that directory,
// named after the gateway, and the record keeps the path. Unstage detaches (the detach writes
// the log back) and removes the file.
func TestStageCacheDev(t *testing.T) {
	r := newRig(t)
	req := r.stageReq("vol-cd", blockCap())
	req.VolumeContext = map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "64MiB"}
	wantCode(t, "stage without --cache-dev-dir", r.stage(req), codes.FailedPrecondition)

	dir := filepath.Join(t.TempDir(), "cache-dev") // made at the first stage
	r.node.cacheDir = dir
	r.ok("stage", r.stage(req))
	name := GatewayName("vol-cd")
	file := filepath.Join(dir, name+".cache")
	spec := r.gw.specs[name]
	if spec.CacheDev != file || spec.CacheDevSize != 64<<20 {
		t.Fatalf("gateway spec: cache dev %q, %d bytes; want %q, 64 MiB", spec.CacheDev, spec.CacheDevSize, file)
	}
	args := (&ExecGateways{RunDir: "/run/x"}).Args(spec)
	if i := slices.Index(args, "--cache-dev"); i < 0 || args[i+1] != file || !slices.Contains(args, "--cache-dev-size") {
		t.Fatalf("attach command line %q lacks --cache-dev %s", args, file)
	}
	if rec, ok, err := r.node.records.Load(name); err != nil || !ok || rec.CacheDev != file {
		t.Fatalf("record: %+v %v %v", rec, ok, err)
	}
	// The same volume with another size is another volume context.
	req2 := r.stageReq("vol-cd", blockCap())
	req2.VolumeContext = map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "128MiB"}
	wantCode(t, "stage with another size", r.stage(req2), codes.AlreadyExists)

	if err := os.WriteFile(file, []byte("log"), 0o600); err != nil { // what the gateway made
		t.Fatal(err)
	}
	r.ok("unstage", r.unstage("vol-cd"))
	if got := r.gw.count(r.gw.detaches, name); got != 1 {
		t.Fatalf("%d detaches, want 1", got)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the cache device file is still there after unstage: %v", err)
	}
}

// TestUnstageRecoversCacheDev: a gateway that died leaving no device waiting (an NBD device the
// kernel dropped) may still leave a log its target lacks: unstage starts a gateway on it (which
// recovers the log) and detaches it (which writes the log back) before removing anything.
func TestUnstageRecoversCacheDev(t *testing.T) {
	r := newRig(t)
	r.node.cacheDir = t.TempDir()
	req := r.stageReq("vol-cd", blockCap())
	req.VolumeContext = map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "64MiB"}
	r.ok("stage", r.stage(req))
	name := GatewayName("vol-cd")
	file := r.gw.specs[name].CacheDev
	if err := os.WriteFile(file, []byte("log"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.gw.kill(name)
	r.gw.mu.Lock()
	delete(r.gw.waiting, name) // no device waits for a successor
	r.gw.mu.Unlock()
	r.ok("unstage", r.unstage("vol-cd"))
	if s, d := r.gw.count(r.gw.starts, name), r.gw.count(r.gw.detaches, name); s != 2 || d != 1 {
		t.Fatalf("%d starts and %d detaches, want 2 (stage, then recovery) and 1", s, d)
	}
	if r.gw.specs[name].CacheDev != file {
		t.Fatalf("the recovering gateway was started without the cache device: %+v", r.gw.specs[name])
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the cache device file is still there after unstage: %v", err)
	}
}
