package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// lendKeys make the fake target take 256 KiB segments, 64 KiB of them as immediate data, so a
// write's data goes out in segments the TCP transport lends (transport.LendMin).
var lendKeys = map[string]string{"MaxRecvDataSegmentLength": "262144", "ImmediateData": "Yes",
	"InitialR2T": "Yes", "FirstBurstLength": "65536", "MaxBurstLength": "262144"}

const lendWriteLen = 256 << 10

// lendTarget is a fake target on a real TCP connection (the transport lends only to a socket)
// that solicits the rest of every write with one R2T, reads its Data-Out and then neither
// answers the command nor closes: a stalled target. TMF requests go to tmfs, and are answered
// with the response sent on answer.
func lendTarget(t *testing.T, d *pipeDialer, got chan<- struct{}, tmfs chan<- pdu.BHS, answer <-chan uint8) {
	a, b := fdtest.TCPPair(t)
	f := attachFake(t, d, "fake:3260", lendKeys, a, b)
	received := 0
	f.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			received = len(p.data)
			var r pdu.BHS
			pdu.EncodeR2T(&r, p.bhs.LUN(), p.bhs.ITT(), 0x10, f.sns(), 0, uint32(received), uint32(lendWriteLen-received))
			return f.write(&r, nil)
		case pdu.OpDataOut:
			if received += len(p.data); received == lendWriteLen {
				got <- struct{}{}
			}
			return nil
		case pdu.OpTaskMgmtReq:
			tmfs <- p.bhs
			var r pdu.BHS
			pdu.EncodeTaskMgmtResponse(&r, <-answer, p.bhs.ITT(), f.sns())
			f.statSN++
			return f.write(&r, nil)
		case pdu.OpLogoutReq:
			return logoutOK(f, &p.bhs)
		}
		return nil
	})
}

// holdSignal returns a logger for t that also reports on the channel when a lent write starts
// waiting for the reinstatement (holdLent).
func holdSignal(t *testing.T) (*zap.Logger, <-chan struct{}) {
	held := make(chan struct{}, 4)
	log := zaptest.NewLogger(t, zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
		if strings.Contains(e.Message, "waiting for the session's reinstatement") {
			held <- struct{}{}
		}
		return nil
	})))
	return log, held
}

func startWrite(ctx context.Context, s *Session) <-chan error {
	errc := make(chan error, 1)
	go func() {
		var cmd scsi.Command
		var resp scsi.Response
		rw16(&cmd, true, 0, make([]byte, lendWriteLen))
		errc <- s.Execute(ctx, &cmd, &resp)
	}()
	return errc
}

func within(t *testing.T, c <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10 s", what)
		return nil
	}
}

// arrived waits for a signal on c (bounded, so that a broken session fails the test instead of
// hanging it).
func arrived(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing after 10 s", what)
	}
}

func notYet(t *testing.T, c <-chan error, what string) {
	t.Helper()
	select {
	case err := <-c:
		t.Fatalf("%s returned (%v) while the target could still read its data", what, err)
	default:
	}
}

// TestLentWriteHeldUntilReinstated: a write whose data went out by reference and whose
// connection is dropped before the target answered fails only once the session has been
// reinstated (the target ends the old connection's tasks before it answers that login), so the
// caller cannot reuse its buffer while a stalled target could still read it. Without lending the
// same write fails at once, as before.
func TestLentWriteHeldUntilReinstated(t *testing.T) {
	for _, lend := range []bool{true, false} {
		t.Run(map[bool]string{true: "lent", false: "copied"}[lend], func(t *testing.T) {
			d := &pipeDialer{}
			got := make(chan struct{}, 1)
			lendTarget(t, d, got, nil, nil)
			log, held := holdSignal(t)
			s := newTestSession(t, d, func(c *Config) { c.LendPages, c.Logger = lend, log })
			mustLogin(t, s)
			errc := startWrite(context.Background(), s)
			arrived(t, got, "the write's data at the target")
			s.Drop(errors.New("command timeout"))
			if !lend {
				if err := within(t, errc, "copied write after Drop"); !errors.Is(err, block.ErrIO) {
					t.Fatalf("copied write after Drop: %v, want a connection error", err)
				}
				return
			}
			select {
			case <-held:
			case err := <-errc:
				t.Fatalf("lent write returned (%v) after Drop, before the reinstatement", err)
			case <-time.After(10 * time.Second):
				t.Fatal("lent write neither returned nor waited 10 s after Drop")
			}
			notYet(t, errc, "lent write")
			lendTarget(t, d, make(chan struct{}, 1), nil, nil) // the reinstating login's target
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Login(ctx); err != nil {
				t.Fatal(err)
			}
			var ce *ConnError
			if err := within(t, errc, "lent write after the reinstatement"); !errors.As(err, &ce) {
				t.Fatalf("lent write after the reinstatement: %v, want a ConnError", err)
			}
		})
	}
}

// TestLentWriteHoldEnds: without a reinstatement a lent write still returns, when the session
// closes or when LendHold passes.
func TestLentWriteHoldEnds(t *testing.T) {
	for _, by := range []string{"close", "timeout"} {
		t.Run(by, func(t *testing.T) {
			d := &pipeDialer{}
			got := make(chan struct{}, 1)
			lendTarget(t, d, got, nil, nil)
			log, held := holdSignal(t)
			hold := time.Hour
			if by == "timeout" {
				hold = 50 * time.Millisecond
			}
			s := newTestSession(t, d, func(c *Config) { c.LendPages, c.LendHold, c.Logger = true, hold, log })
			mustLogin(t, s)
			errc := startWrite(context.Background(), s)
			arrived(t, got, "the write's data at the target")
			s.Drop(errors.New("command timeout"))
			if by == "close" {
				arrived(t, held, "the lent write's wait for the reinstatement")
				s.Close()
			}
			if err := within(t, errc, "lent write"); !errors.Is(err, block.ErrIO) {
				t.Fatalf("lent write: %v, want a connection error", err)
			}
		})
	}
}

// TestLentWriteCallerGivesUp: a caller whose context ends while its write's data is lent and the
// connection lives does not get its buffer back until the target confirmed the task's end
// (ABORT TASK answered on the same connection, which the target reads in order); it then gets
// its context's error. An ABORT TASK the target refuses ends the connection: the caller then
// gets its error at once, since nothing can reach the target any more before the session's
// reinstatement, which ends the old command. So does a caller that gives up while its write
// waits for that reinstatement.
func TestLentWriteCallerGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		response uint8 // to the ABORT TASK
		drop     bool  // the connection is dropped before the caller gives up
	}{{"abort answered", 0, false}, {"abort refused", 5, false}, {"during the hold", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := &pipeDialer{}
			got := make(chan struct{}, 1)
			tmfs := make(chan pdu.BHS, 1)
			answer := make(chan uint8, 1)
			lendTarget(t, d, got, tmfs, answer)
			log, held := holdSignal(t)
			s := newTestSession(t, d, func(c *Config) { c.LendPages, c.Logger = true, log })
			mustLogin(t, s)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := startWrite(ctx, s)
			arrived(t, got, "the write's data at the target")
			if tc.drop {
				s.Drop(errors.New("command timeout"))
				arrived(t, held, "the lent write's wait for the reinstatement")
				notYet(t, errc, "lent write")
				cancel()
				if err := within(t, errc, "lent write whose caller gave up during the hold"); !errors.Is(err, context.Canceled) {
					t.Fatalf("lent write whose caller gave up during the hold: %v, want context.Canceled", err)
				}
				return
			}
			cancel()
			var tmf pdu.BHS
			select {
			case tmf = <-tmfs:
			case err := <-errc:
				t.Fatalf("the write returned (%v) before the ABORT TASK was even sent", err)
			case <-time.After(10 * time.Second):
				t.Fatal("no ABORT TASK 10 s after the caller gave up")
			}
			if fn := tmf.Flags() & 0x7f; fn != pdu.TMFAbortTask {
				t.Fatalf("TMF function %d, want ABORT TASK", fn)
			}
			notYet(t, errc, "abandoned lent write")
			answer <- tc.response
			if err := within(t, errc, "abandoned lent write"); !errors.Is(err, context.Canceled) {
				t.Fatalf("abandoned lent write: %v, want context.Canceled", err)
			}
			if refused := tc.response != 0; s.Connected() == refused {
				t.Fatalf("ABORT TASK answered %d: connected %v afterwards", tc.response, s.Connected())
			}
		})
	}
}
