package procs

import (
	"os"
	"runtime"
	"testing"
)

// TestSmallHostHonoursGOMAXPROCS: an explicit GOMAXPROCS is left alone; otherwise only a host
// with at most two CPUs gets one P.
func TestSmallHostHonoursGOMAXPROCS(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	SmallHost()
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Errorf("with GOMAXPROCS=3 set: %d Ps", got)
	}
	t.Setenv("GOMAXPROCS", "")
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}
	SmallHost()
	want := 3
	if runtime.NumCPU() <= 2 {
		want = 1
	}
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Errorf("%d CPUs: %d Ps, want %d", runtime.NumCPU(), got, want)
	}
}
