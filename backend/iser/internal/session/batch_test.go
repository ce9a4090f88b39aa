package session

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// batchRecorder is a BatchCompleter for every command of a test and the one Flusher they all
// return: it records the order of completions ("c") and flushes ("f").
type batchRecorder struct {
	mu     sync.Mutex
	events []byte
	errs   []error
	flushd chan struct{} // a token per Flush
	first  chan struct{} // closed by the first Flush
	once   sync.Once
}

func newBatchRecorder() *batchRecorder {
	return &batchRecorder{flushd: make(chan struct{}, 1024), first: make(chan struct{})}
}

func (b *batchRecorder) Complete(error) { panic("Complete called on a BatchCompleter") }

func (b *batchRecorder) CompleteBatched(err error) block.Flusher {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, 'c')
	b.errs = append(b.errs, err)
	return b
}

func (b *batchRecorder) Flush() {
	b.mu.Lock()
	b.events = append(b.events, 'f')
	b.mu.Unlock()
	b.once.Do(func() { close(b.first) })
	b.flushd <- struct{}{}
}

// waitFlushed waits until n completions happened and the last event is a Flush, and returns
// the runs: the number of completions before each Flush.
func (b *batchRecorder) waitFlushed(t *testing.T, n int) []int {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		done := bytes.Count(b.events, []byte{'c'}) == n && b.events[len(b.events)-1] == 'f'
		events := append([]byte(nil), b.events...)
		b.mu.Unlock()
		if done {
			var runs []int
			run := 0
			for _, e := range events {
				if e == 'c' {
					run++
					continue
				}
				runs = append(runs, run)
				run = 0
			}
			return runs
		}
		select {
		case <-b.flushd:
		case <-deadline:
			t.Fatalf("events %q: want %d completions, the last one flushed", events, n)
		}
	}
}

// holdConn buffers the fake target's writes while hold is set, so that the responses to many
// commands reach the initiator's socket in one write (and so one read).
type holdConn struct {
	net.Conn
	mu   sync.Mutex
	hold bool
	buf  []byte
}

func (h *holdConn) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hold {
		h.buf = append(h.buf, p...)
		return len(p), nil
	}
	return h.Conn.Write(p)
}

func (h *holdConn) release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hold = false
	_, err := h.Conn.Write(h.buf)
	return err
}

// batchTarget answers TEST UNIT READY with GOOD, holding the responses until n commands came
// and sending them in one write.
func batchTarget(t *testing.T, n int) *Session {
	d := &pipeDialer{}
	f := newFakeTCP(t, d, "fake:3260", map[string]string{"ImmediateData": "Yes"})
	dt := newDataTarget(t, map[string]string{"ImmediateData": "Yes"}, 4096) // logout
	seen := 0
	var hc *holdConn
	f.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() != pdu.OpSCSICommand {
			return dt.handle(f, p)
		}
		if hc == nil {
			hc = &holdConn{Conn: f.nc, hold: true}
			f.nc = hc
		}
		seen++
		if err := f.respond(p.bhs.ITT(), 0, nil, 0, 0); err != nil {
			return err
		}
		if seen == n {
			return hc.release()
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	return s
}

// submitTURs submits n TEST UNIT READYs completed by done and sends them.
func submitTURs(t *testing.T, s *Session, n int, done Completer) {
	t.Helper()
	resps := make([]scsi.Response, n)
	for i := range n {
		if !s.Submit(tur(), &resps[i], done) {
			t.Fatalf("command %d not submitted", i)
		}
	}
	s.Kick()
}

// TestBatchedCompletions: the responses of one read are completed with CompleteBatched and
// flushed together, once, before the reader waits for more.
func TestBatchedCompletions(t *testing.T) {
	const n = 16
	s := batchTarget(t, n)
	b := newBatchRecorder()
	submitTURs(t, s, n, b)
	runs := b.waitFlushed(t, n)
	if len(runs) >= n {
		t.Fatalf("runs %v: %d responses in one write were flushed one by one", runs, n)
	}
	for _, r := range runs {
		if r == 0 {
			t.Fatalf("runs %v: a Flush without a completion before it", runs)
		}
	}
	for i, err := range b.errs {
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
}

// TestBatchedCompletionsBounded: a run ends after maxBatchedCompletions even while more
// responses are buffered.
func TestBatchedCompletionsBounded(t *testing.T) {
	const n = maxBatchedCompletions + 8
	s := batchTarget(t, n)
	b := newBatchRecorder()
	submitTURs(t, s, n, b)
	runs := b.waitFlushed(t, n)
	if len(runs) < 2 {
		t.Fatalf("runs %v: %d completions in one run", runs, n)
	}
	for _, r := range runs {
		if r == 0 || r > maxBatchedCompletions {
			t.Fatalf("runs %v: a run of 0 or over %d", runs, maxBatchedCompletions)
		}
	}
}

// TestBatchedCompletionsConnectionLoss: commands that the connection's end fails are flushed too
// (a waiting reply writer would otherwise never be woken).
func TestBatchedCompletionsConnectionLoss(t *testing.T) {
	d := &pipeDialer{}
	f := newFakeTCP(t, d, "fake:3260", map[string]string{"ImmediateData": "Yes"})
	got := make(chan struct{})
	f.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() == pdu.OpSCSICommand {
			close(got)
			f.nc.Close()
			return errStopServing
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	b := newBatchRecorder()
	submitTURs(t, s, 4, b)
	<-got
	b.waitFlushed(t, 4)
	for i, err := range b.errs {
		var ce *ConnError
		if !errors.As(err, &ce) {
			t.Fatalf("command %d ended with %v, want a ConnError", i, err)
		}
	}
}

// TestBatchedCompletionsFlushBeforeData: a run ends before the reader waits for a data segment
// that is not all buffered: a completed command's reply must not wait for another command's data.
func TestBatchedCompletionsFlushBeforeData(t *testing.T) {
	d := &pipeDialer{}
	keys := map[string]string{"ImmediateData": "Yes"}
	f := newFakeTCP(t, d, "fake:3260", keys)
	dt := newDataTarget(t, keys, 4096) // logout
	b := newBatchRecorder()
	itts := map[byte]uint32{}
	f.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() != pdu.OpSCSICommand {
			return dt.handle(f, p)
		}
		itts[p.bhs.CDB()[0]] = p.bhs.ITT()
		if len(itts) < 2 {
			return nil
		}
		// The TEST UNIT READY's response and the READ's Data-In header with half its data in
		// one write; the other half only once the first completion was flushed.
		real := f.nc
		hc := &holdConn{Conn: real, hold: true}
		f.nc = hc
		if err := f.respond(itts[0x00], 0, nil, 0, 0); err != nil {
			return err
		}
		var r pdu.BHS
		pdu.EncodeDataIn(&r, pdu.FlagFinal|pdu.FlagStatus, 0, 4096, itts[0x88], pdu.ReservedTag, f.sns(), 0, 0, 0)
		f.statSN++
		if err := f.write(&r, make([]byte, 4096)); err != nil {
			return err
		}
		f.nc = real
		cut := len(hc.buf) - 2048
		if _, err := real.Write(hc.buf[:cut]); err != nil {
			return err
		}
		select {
		case <-b.first:
		case <-time.After(10 * time.Second):
			t.Error("the TEST UNIT READY's completion was not flushed while the reader waited for data")
		}
		_, err := real.Write(hc.buf[cut:])
		return err
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var resps [2]scsi.Response
	var read scsi.Command
	rw16(&read, false, 0, make([]byte, 4096))
	if !s.Submit(tur(), &resps[0], b) || !s.Submit(&read, &resps[1], b) {
		t.Fatal("not submitted")
	}
	s.Kick()
	b.waitFlushed(t, 2)
	for i, err := range b.errs {
		if err != nil || resps[i].Status != scsi.StatusGood {
			t.Fatalf("command %d: %v, status %v", i, err, resps[i].Status)
		}
	}
}
