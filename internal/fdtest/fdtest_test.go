package fdtest

import (
	"bytes"
	"io"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPipeAndDrain(t *testing.T) {
	r, w := Pipe(t, 1<<20)
	if got, _ := unix.FcntlInt(uintptr(w), unix.F_GETPIPE_SZ, 0); got < 1<<20 {
		t.Fatalf("pipe of %d bytes, want at least 1 MiB", got)
	}
	if got := Drain(t, r); len(got) != 0 {
		t.Fatalf("an empty pipe drained %d bytes", len(got))
	}
	want := bytes.Repeat([]byte("x"), 200<<10)
	if n, err := unix.Write(w, want); n != len(want) || err != nil {
		t.Fatalf("write %d, %v", n, err)
	}
	if got := Drain(t, r); !bytes.Equal(got, want) {
		t.Fatalf("drained %d bytes, want the %d written", len(got), len(want))
	}
}

func TestPairs(t *testing.T) {
	for name, pair := range map[string]func() (io.ReadWriter, io.ReadWriter){
		"tcp":  func() (io.ReadWriter, io.ReadWriter) { return TCPPair(t) },
		"unix": func() (io.ReadWriter, io.ReadWriter) { return Pair(t, "unix", t.TempDir()+"/s") },
	} {
		a, b := pair()
		if _, err := a.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(b, got); err != nil || string(got) != "ping" {
			t.Fatalf("%s: read %q, %v", name, got, err)
		}
	}
}
