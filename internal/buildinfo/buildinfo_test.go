package buildinfo

import (
	"bytes"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, mod string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "1"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: mod}}
	}
	for _, tt := range []struct {
		name     string
		ld       linked
		bi       *debug.BuildInfo
		version  string
		revision string
		modified bool
	}{
		{"no build info at all", linked{}, nil, DevVersion, "", false},
		{"go build without VCS stamping", linked{}, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, DevVersion, "", false},
		{"go install @v0.9.1", linked{}, &debug.BuildInfo{Main: debug.Module{Version: "v0.9.1"}}, "0.9.1", "", false},
		{"go build with VCS stamping", linked{}, &debug.BuildInfo{Main: debug.Module{Version: "v0.9.1-0.20261203101010-0123456789ab+dirty"}, Settings: vcs("0123456789abcdef", "true")},
			"0.9.1-0.20261203101010-0123456789ab+dirty", "0123456789abcdef", true},
		{"make build: ldflags win", linked{"0.9.0", "fedcba9876543210", "false"}, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123", "true")},
			"0.9.0", "fedcba9876543210", false},
		{"make build of a modified tree", linked{"0.9.0", "fedcba98", "true"}, nil, "0.9.0", "fedcba98", true},
		{"ldflags version only keeps VCS revision", linked{version: "v1.0.0"}, &debug.BuildInfo{Settings: vcs("0123", "false")}, "1.0.0", "0123", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			i := resolve(tt.ld, tt.bi)
			if i.Version != tt.version || i.Revision != tt.revision || i.Modified != tt.modified {
				t.Errorf("got %q %q %v, want %q %q %v", i.Version, i.Revision, i.Modified, tt.version, tt.revision, tt.modified)
			}
			if i.Go == "" || !strings.HasPrefix(i.Go, "go") {
				t.Errorf("Go = %q", i.Go)
			}
			if i.Features == nil {
				t.Error("Features is nil (JSON null); want a list")
			}
		})
	}
}

// TestFeaturesFollowTheBuild: "rdma" is listed exactly when the cgo iSER transport is built in,
// whose constraint is cgo && linux && !nordma (backend/iser checks its own side of it).
func TestFeaturesFollowTheBuild(t *testing.T) {
	want := runtime.GOOS == "linux" && cgoEnabled(t) && !tagged(t, "nordma")
	if got := Get().Has(FeatureRDMA); got != want {
		t.Fatalf("Has(rdma) = %v in a build with cgo=%v on %s", got, cgoEnabled(t), runtime.GOOS)
	}
}

func cgoEnabled(t *testing.T) bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("test binary without build info")
	}
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" {
			return s.Value == "1"
		}
	}
	t.Fatal("build info has no CGO_ENABLED setting")
	return false
}

func tagged(t *testing.T, tag string) bool {
	bi, _ := debug.ReadBuildInfo()
	for _, s := range bi.Settings {
		if s.Key == "-tags" {
			for _, x := range strings.Split(s.Value, ",") {
				if x == tag {
					return true
				}
			}
		}
	}
	return false
}

func TestJSONFieldNames(t *testing.T) {
	b, err := json.Marshal(Info{Version: "0.9.0", Revision: "abc", Modified: true, Go: "go1.26.8", Features: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"version":"0.9.0","revision":"abc","modified":true,"go":"go1.26.8","features":[]}`
	if string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
}

func TestString(t *testing.T) {
	for _, tt := range []struct {
		i    Info
		want string
	}{
		{Info{Version: "0.9.0", Revision: "0123456789abcdef", Modified: true, Go: "go1.26.8", Features: []string{"rdma"}}, "0.9.0 (rev 0123456789ab, modified; go1.26.8; rdma)"},
		{Info{Version: DevVersion, Go: "go1.26.8", Features: []string{}}, "0.0.0-dev (go1.26.8; no rdma)"},
	} {
		if got := tt.i.String(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

// TestWrite: the version line and the --json schema.
func TestWrite(t *testing.T) {
	info := Info{Version: "0.9.0", Revision: "0123456789abcdef", Modified: true, Go: "go1.26.8", Features: []string{"rdma"}}
	var b bytes.Buffer
	if err := info.Write(&b, false); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "iser-blk 0.9.0 (rev 0123456789ab, modified; go1.26.8; rdma)\n"; got != want {
		t.Errorf("plain: %q, want %q", got, want)
	}
	b.Reset()
	if err := info.Write(&b, true); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("--json output %q: %v", b.String(), err)
	}
	for k, v := range map[string]any{"version": "0.9.0", "revision": "0123456789abcdef", "modified": true, "go": "go1.26.8"} {
		if got[k] != v {
			t.Errorf("--json %s = %v, want %v", k, got[k], v)
		}
	}
	if f, ok := got["features"].([]any); !ok || len(f) != 1 || f[0] != "rdma" {
		t.Errorf("--json features = %v", got["features"])
	}
	if len(got) != 5 {
		t.Errorf("--json has %d fields, want 5: %v", len(got), got)
	}
}
