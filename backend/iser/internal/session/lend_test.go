package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
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
func lendTarget(t *testing.T, d *pipeDialer, keys map[string]string, got chan<- struct{}, tmfs chan<- pdu.BHS, answer <-chan uint8) {
	lendTargetAt(t, d, "fake:3260", keys, got, tmfs, answer)
}

// lendTargetAt is lendTarget at portal.
func lendTargetAt(t *testing.T, d *pipeDialer, portal string, keys map[string]string, got chan<- struct{}, tmfs chan<- pdu.BHS, answer <-chan uint8) {
	a, b := fdtest.TCPPair(t)
	f := attachFake(t, d, portal, keys, a, b)
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
			if f.write(&r, nil) != nil {
				return errStopServing // the test dropped the connection instead of waiting for this
			}
			return nil
		case pdu.OpLogoutReq:
			return logoutOK(f, &p.bhs)
		}
		return nil
	})
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

// withTPGT is lendKeys with the target declaring portal group tag tpgt.
func withTPGT(tpgt string) map[string]string {
	m := map[string]string{"TargetPortalGroupTag": tpgt}
	for k, v := range lendKeys {
		m[k] = v
	}
	return m
}

// TestLentWriteConnLoss: a lent write whose connection is dropped before the target answered
// fails at once with its ConnError, like a copied one (the device re-issues it on the same
// session, which its reinstatement reaches first: lend.go). Lending stays on after a login that
// reinstates the session (same portal group) and is off after one that reaches another portal
// group, or that a redirect answered, where the same ISID may make a new session instead.
func TestLentWriteConnLoss(t *testing.T) {
	for _, tc := range []struct {
		name       string
		next       string // the reinstating login's portal group
		redirect   bool   // the reinstating login is redirected (to the same portal group)
		lendsAfter bool
	}{{"same portal group", "1", false, true}, {"other portal group", "2", false, false}, {"redirected", "1", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			d := &pipeDialer{}
			got := make(chan struct{}, 1)
			lendTarget(t, d, withTPGT("1"), got, nil, nil)
			s := newTestSession(t, d, func(c *Config) { c.LendPages = true })
			mustLogin(t, s)
			before := transport.LentSegments()
			errc := startWrite(context.Background(), s)
			arrived(t, got, "the write's data at the target")
			if transport.LentSegments() == before {
				t.Fatal("the write's data was copied")
			}
			s.Drop(errors.New("command timeout"))
			var ce *ConnError
			if err := within(t, errc, "lent write after Drop"); !errors.As(err, &ce) {
				t.Fatalf("lent write after Drop: %v, want a ConnError", err)
			}
			got2 := make(chan struct{}, 1)
			if tc.redirect {
				redirect(newFake(t, d, "fake:3260", nil), "fake2:3260,1")
				lendTargetAt(t, d, "fake2:3260", withTPGT(tc.next), got2, nil, nil)
			} else {
				lendTarget(t, d, withTPGT(tc.next), got2, nil, nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Login(ctx); err != nil {
				t.Fatal(err)
			}
			before = transport.LentSegments()
			startWrite(context.Background(), s)
			arrived(t, got2, "the second write's data at the target")
			if lent := transport.LentSegments() > before; lent != tc.lendsAfter {
				t.Fatalf("after a login to portal group %s: lent %v, want %v", tc.next, lent, tc.lendsAfter)
			}
		})
	}
}

// TestLentWriteCallerGivesUp: a caller whose context ends while its write's data is lent and the
// connection lives does not get its buffer back until the target confirmed the task's end
// (ABORT TASK answered on the same connection, which the target reads in order); it then gets
// its context's error. An ABORT TASK the target refuses ends the connection, and so does a
// connection lost while the ABORT TASK is out: the caller then gets its error too.
func TestLentWriteCallerGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		response uint8 // to the ABORT TASK
		drop     bool  // the connection is dropped instead of answering
	}{{"abort answered", 0, false}, {"task does not exist", 1, false}, {"abort refused", 5, false}, {"connection lost", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := &pipeDialer{}
			got := make(chan struct{}, 1)
			tmfs := make(chan pdu.BHS, 1)
			answer := make(chan uint8, 1)
			lendTarget(t, d, lendKeys, got, tmfs, answer)
			s := newTestSession(t, d, func(c *Config) { c.LendPages = true })
			mustLogin(t, s)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := startWrite(ctx, s)
			arrived(t, got, "the write's data at the target")
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
			if tc.drop {
				s.Drop(errors.New("keepalive: no NOP-In"))
				defer func() { answer <- 0 }() // lets the fake's handler end: its answer finds the connection reset
			} else {
				answer <- tc.response
			}
			if err := within(t, errc, "abandoned lent write"); !errors.Is(err, context.Canceled) {
				t.Fatalf("abandoned lent write: %v, want context.Canceled", err)
			}
			if ended := tc.drop || tc.response > 1; s.Connected() == ended {
				t.Fatalf("connected %v afterwards, want %v", s.Connected(), !ended)
			}
		})
	}
}
