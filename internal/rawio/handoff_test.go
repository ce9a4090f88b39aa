package rawio

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"runtime/trace"
	"testing"

	"github.com/iser-blk/iser-blk/internal/blockcall/blockcalltest"
)

// TestLargeWritevHandsOffP: a writev of handOffMin bytes or more hands the P off while it copies
// (its thread enters the syscall state and releases the P itself); a smaller one makes a raw call,
// which never enters that state. Told from the runtime's execution trace (blockcalltest), not
// from timing; the bytes arrive whole either way.
func TestLargeWritevHandsOffP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, size := range []int{4 << 10, handOffMin - 1, handOffMin, 1 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := pair(t, "unix", t.TempDir()+"/s")
			defer p[0].Close()
			defer p[1].Close()
			w := New(p[0])
			payload := bytes.Repeat([]byte{0x5a}, size)
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(p[1], int64(3*size)))
				got <- b
			}()
			var tr bytes.Buffer
			if err := trace.Start(&tr); err != nil {
				t.Skipf("the execution tracer is in use: %v", err)
			}
			const rounds = 3
			for i := range rounds {
				blockcalltest.Begin(i)
				// Two buffers, as a PDU's header and data: the size is the sum.
				if _, err := w.Writev([][]byte{payload[:size/2], payload[size/2:]}); err != nil {
					t.Fatal(err)
				}
				blockcalltest.End(i)
			}
			trace.Stop()
			if b := <-got; len(b) != rounds*size || !bytes.Equal(b[:size], payload) {
				t.Fatalf("the peer read %d bytes, want %d", len(b), rounds*size)
			}
			rs, err := blockcalltest.Rounds(&tr, rounds)
			if err != nil {
				t.Fatal(err)
			}
			handOff := size >= handOffMin
			for i, r := range rs {
				if !r.Marked {
					t.Fatalf("round %d: marks not found in the trace", i)
				}
				// A large write hands off in its first call at least (a full socket may split
				// it: later calls are smaller); a small one never enters the syscall state.
				if handOff && !(r.Entered && r.Released) || !handOff && r.Entered {
					t.Errorf("round %d of %d bytes: entered the syscall state %v, released the P %v; want %v",
						i, size, r.Entered, r.Released, handOff)
				}
			}
		})
	}
}
