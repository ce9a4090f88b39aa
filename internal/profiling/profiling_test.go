package profiling_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/profiling"
)

// TestStart: off without an address; with one it says where and serves the profiles' index; an
// address it cannot listen on leaves profiling off and says why.
func TestStart(t *testing.T) {
	var out bytes.Buffer
	if a := profiling.Start("", &out); a != nil || out.Len() != 0 {
		t.Fatalf("no address: %v %q", a, out.String())
	}
	a := profiling.Start("127.0.0.1:0", &out)
	if a == nil || out.String() != "iser-blk: pprof on http://"+a.String()+"/debug/pprof/\n" {
		t.Fatalf("%v %q", a, out.String())
	}
	resp, err := http.Get("http://" + a.String() + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("index: %s %.200s", resp.Status, body)
	}
	out.Reset()
	if a := profiling.Start("127.0.0.1:-1", &out); a != nil || !strings.HasPrefix(out.String(), "iser-blk: ISERBLK_PPROF=127.0.0.1:-1: ") ||
		!strings.HasSuffix(out.String(), " (profiling off)\n") {
		t.Fatalf("bad address: %v %q", a, out.String())
	}
}
