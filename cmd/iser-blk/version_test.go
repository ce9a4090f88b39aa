package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
)

func TestWriteVersion(t *testing.T) {
	info := buildinfo.Info{Version: "0.9.0", Revision: "0123456789abcdef", Modified: true, Go: "go1.26.8", Features: []string{"rdma"}}
	var b bytes.Buffer
	if err := writeVersion(&b, info, false); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "iser-blk 0.9.0 (rev 0123456789ab, modified; go1.26.8; rdma)\n"; got != want {
		t.Errorf("plain: %q, want %q", got, want)
	}
	b.Reset()
	if err := writeVersion(&b, info, true); err != nil {
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

// TestVersionUsage: version takes --json and --help and refuses arguments with exit 2.
func TestVersionUsage(t *testing.T) {
	var out bytes.Buffer
	for _, tt := range []struct {
		args []string
		code int
	}{{[]string{"--help"}, exitOK}, {[]string{"extra"}, exitUsage}, {[]string{"--bogus"}, exitUsage}} {
		out.Reset()
		if code := run(context.Background(), append([]string{"version"}, tt.args...), io.Discard, &out); code != tt.code {
			t.Errorf("version %v: exit %d, want %d", tt.args, code, tt.code)
		}
		if n := strings.Count(out.String(), "usage: iser-blk version "); n != 1 {
			t.Errorf("version %v: usage printed %d times", tt.args, n)
		}
	}
	if buildVersion() != buildinfo.Version() || buildVersion() == "" {
		t.Errorf("buildVersion %q", buildVersion())
	}
}
