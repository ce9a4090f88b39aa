package iser

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// pipeLUN is a submitLUN that also takes reads into a pipe, like a session over TCP: the command
// runs on the scsitest LUN into a buffer whose bytes are then written into the pipe. With short
// set, only half of them go in and the command completes with transport.ErrPipeFull (a pipe that
// ran out of slots).
type pipeLUN struct {
	*submitLUN
	short bool
}

func (s *pipeLUN) SubmitToPipe(cmd *scsi.Command, n, pipeW int, resp *scsi.Response, done session.Completer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.decline || cmd.Data != nil {
		return false
	}
	short := s.short
	s.queued = append(s.queued, func() {
		*resp = scsi.Response{}
		buf := make([]byte, n)
		c := *cmd
		c.Data = buf
		err := s.LUN.Execute(context.Background(), &c, resp)
		if err == nil && resp.Status == scsi.StatusGood {
			if short {
				buf, err = buf[:n/2], transport.ErrPipeFull
			}
			if werr := fillPipe(pipeW, buf); werr != nil {
				panic(werr)
			}
		}
		done.Complete(err)
	})
	return true
}

func openPipeSubmit(t *testing.T, cfg scsitest.Config) (*Device, *pipeLUN) {
	t.Helper()
	return openWith(t, cfg, func(lun *scsitest.LUN) *pipeLUN { return &pipeLUN{submitLUN: &submitLUN{LUN: lun}} })
}

func testPipe(t testing.TB, size int) block.Pipe {
	r, w := fdtest.Pipe(t, size)
	return block.Pipe{R: r, W: w}
}

func pipeContents(t *testing.T, p block.Pipe) []byte { return fdtest.Drain(t, p.R) }

// TestSubmitReadToPipe: a clean GOOD leaves the data in the pipe; whatever is not a final answer
// (pipe full, UNIT ATTENTION, connection loss) is served again synchronously, with the pipe
// emptied of the failed attempt's bytes first; a final SCSI error is reported as ReadAt would.
func TestSubmitReadToPipe(t *testing.T) {
	ctx := context.Background()
	const n, off = 64 << 10, 1 << 20
	cases := []struct {
		name    string
		setup   func(*pipeLUN)
		wantErr error
		reads   int // READs that reach the LUN
	}{
		{name: "good", setup: func(*pipeLUN) {}, reads: 1},
		{name: "pipe full", setup: func(l *pipeLUN) { l.short = true }, reads: 2},
		{name: "unit attention", setup: func(l *pipeLUN) { l.SetUnitAttention(0x2A, 0x09) }, reads: 2},
		{name: "connection loss", setup: func(l *pipeLUN) {
			l.InjectFault(scsitest.Fault{Opcode: -1, Err: &session.ConnError{Err: errors.New("connection reset")}})
		}, reads: 1}, // the failed attempt never reached the LUN; the re-issue did
		{name: "medium error", setup: func(l *pipeLUN) {
			l.InjectFault(scsitest.Fault{Opcode: -1, Key: scsi.KeyMediumError, ASC: 0x11})
		}, wantErr: block.ErrMedium, reads: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, lun := openPipeSubmit(t, scsitest.Config{})
			data := randBytes(n)
			if err := d.WriteAt(ctx, data, off, 0); err != nil {
				t.Fatal(err)
			}
			lun.ResetOps()
			tc.setup(lun)
			p := testPipe(t, 1<<20)
			done := make(devCompletion, 1)
			if !d.SubmitReadToPipe(ctx, p, n, off, done) {
				t.Fatal("not submitted")
			}
			d.Kick()
			err := done.wait(t)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if got := pipeContents(t, p); !bytes.Equal(got, data) {
				t.Fatalf("pipe holds %d bytes, not the %d read", len(got), n)
			}
			if got := len(opsWith(lun.LUN, 0x28, 0x88)); got != tc.reads {
				t.Fatalf("%d READs reached the LUN, want %d", got, tc.reads)
			}
			if pt := d.paths[0]; pt.outstanding.Load() != 0 {
				t.Fatalf("outstanding %d after completion", pt.outstanding.Load())
			}
		})
	}
}

func TestSubmitReadToPipeDeclines(t *testing.T) {
	ctx := context.Background()
	d, lun := openPipeSubmit(t, scsitest.Config{})
	p := testPipe(t, 1<<20)
	done := make(devCompletion, 1)
	for _, tc := range []struct {
		name string
		n    int
		off  int64
	}{
		{"empty", 0, 0},
		{"misaligned", 512, 100},
		{"past the end", 512, 64 << 20},
		{"over one command", defaultMaxTransfer + 512, 0},
	} {
		if d.SubmitReadToPipe(ctx, p, tc.n, tc.off, done) {
			t.Errorf("%s: submitted", tc.name)
		}
	}
	lun.mu.Lock()
	lun.decline = true
	lun.mu.Unlock()
	if d.SubmitReadToPipe(ctx, p, 4096, 0, done) {
		t.Fatal("submitted although the executor declined")
	}
	if pt := d.paths[0]; pt.outstanding.Load() != 0 {
		t.Fatalf("a declined submit left outstanding %d", pt.outstanding.Load())
	}
}

// BenchmarkDeviceSubmitToPipe4K: a 4 KiB read through SubmitReadToPipe and its completion
// allocate nothing (0 allocs/op); the benchmark empties the pipe after each.
func BenchmarkDeviceSubmitToPipe4K(b *testing.B) {
	const n = 4096
	d, _ := openWith(b, scsitest.Config{}, func(lun *scsitest.LUN) *syncLUN {
		return &syncLUN{LUN: lun, zeros: make([]byte, n)}
	})
	ctx, p, done, sink := context.Background(), testPipe(b, 1<<20), make(devCompletion, 1), make([]byte, n)
	b.ReportAllocs()
	b.SetBytes(n)
	for i := 0; b.Loop(); i++ {
		if !d.SubmitReadToPipe(ctx, p, n, int64(i%1024)*n, done) {
			b.Fatal("SubmitReadToPipe declined")
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if k, err := unix.Read(p.R, sink); k != n || err != nil {
			b.Fatalf("pipe held %d bytes (%v), want %d", k, err, n)
		}
	}
}
