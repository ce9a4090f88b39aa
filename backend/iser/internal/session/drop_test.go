package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// TestDropFailsOutstandingAndReinstates: Drop (what a keepalive or command-timeout watchdog
// calls) fails the command in flight with a ConnError carrying the cause, and a second Login on
// the same Session works on a new connection.
func TestDropFailsOutstandingAndReinstates(t *testing.T) {
	d := &pipeDialer{}
	f1 := newFake(t, d, "fake:3260", nil)
	got := make(chan struct{}, 1)
	f1.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() == pdu.OpSCSICommand {
			got <- struct{}{}
			return nil // never answers: the connection is "stuck"
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)

	errc := make(chan error, 1)
	go func() {
		var resp scsi.Response
		buf := make([]byte, 512)
		var cmd scsi.Command
		rw16(&cmd, false, 0, buf)
		errc <- s.Execute(context.Background(), &cmd, &resp)
	}()
	<-got
	cause := errors.New("keepalive: no NOP-In")
	s.Drop(cause)
	select {
	case err := <-errc:
		var ce *ConnError
		if !errors.As(err, &ce) || !errors.Is(err, cause) || !errors.Is(err, block.ErrIO) {
			t.Fatalf("outstanding command after Drop: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("outstanding command still waiting 5 s after Drop")
	}
	if s.Connected() {
		t.Fatal("Connected after Drop")
	}
	if !errors.Is(s.Err(), cause) {
		t.Fatalf("Err after Drop: %v", s.Err())
	}

	f2 := newFake(t, d, "fake:3260", nil)
	f2.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			return f.respond(p.bhs.ITT(), 0, nil, 0, 0)
		case pdu.OpLogoutReq:
			return logoutOK(f, &p.bhs)
		}
		return fmt.Errorf("unexpected %v", p.bhs.Opcode())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Login(ctx); err != nil {
		t.Fatalf("login after Drop: %v", err)
	}
	var resp scsi.Response
	if err := s.Execute(ctx, tur(), &resp); err != nil || resp.Status != scsi.StatusGood {
		t.Fatalf("TEST UNIT READY after reinstatement: %v %v", err, resp.Status)
	}
}

// TestDropResetsLogoutCloses: over a real TCP connection, Drop resets it (the transport's Abort:
// nothing still queued reaches the target after its tasks are re-issued elsewhere), while a
// completed Logout ends it with a plain close, which the target reads as the end of the stream.
func TestDropResetsLogoutCloses(t *testing.T) {
	for _, drop := range []bool{true, false} {
		d := &pipeDialer{}
		a, b := fdtest.TCPPair(t)
		f := attachFake(t, d, "fake:3260", nil, a, b)
		done := f.serve(func(f *fakeTarget, p wirePDU) error {
			if p.bhs.Opcode() == pdu.OpLogoutReq {
				var r pdu.BHS
				pdu.EncodeLogoutResponse(&r, 0, p.bhs.ITT(), f.sns(), 0, 0)
				return f.write(&r, nil)
			}
			return fmt.Errorf("unexpected %v", p.bhs.Opcode())
		})
		s := newTestSession(t, d, nil)
		mustLogin(t, s)
		if drop {
			s.Drop(errors.New("keepalive: no NOP-In"))
		} else if err := s.Logout(context.Background()); err != nil {
			t.Fatalf("logout: %v", err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("drop=%v: the target still reads 5 s later", drop)
		}
		switch {
		case drop && !errors.Is(f.readErr, syscall.ECONNRESET):
			t.Fatalf("after Drop the target read %v, want a reset", f.readErr)
		case !drop && f.readErr != io.EOF:
			t.Fatalf("after Logout the target read %v, want the end of the stream", f.readErr)
		}
	}
}

// recordingConn records how the session ends its transport.
type recordingConn struct {
	*transport.TCPConn
	aborted, closed atomic.Bool
}

func (c *recordingConn) Abort() error { c.aborted.Store(true); return c.TCPConn.Abort() }
func (c *recordingConn) Close() error { c.closed.Store(true); return c.TCPConn.Close() }

// recordingDialer is a pipeDialer whose connections are recordingConns.
type recordingDialer struct {
	*pipeDialer
	last *recordingConn
}

func (d *recordingDialer) Dial(ctx context.Context, portal string, o transport.DialOptions) (transport.Conn, error) {
	c, err := d.pipeDialer.Dial(ctx, portal, o)
	if err != nil {
		return nil, err
	}
	d.last = &recordingConn{TCPConn: c.(*transport.TCPConn)}
	return d.last, nil
}

// TestLogoutEndsGracefully: after the target's Logout Response the connection is closed, not
// reset, also when the target closes its end first (as targets do after a Logout Response) and
// the reader's EOF ends the connection before Logout does; a Logout the target never answers
// ends it with a reset.
func TestLogoutEndsGracefully(t *testing.T) {
	for _, answer := range []bool{true, false} {
		pd := &pipeDialer{}
		d := &recordingDialer{pipeDialer: pd}
		f := newFake(t, pd, "fake:3260", nil)
		f.serve(func(f *fakeTarget, p wirePDU) error {
			if p.bhs.Opcode() != pdu.OpLogoutReq {
				return fmt.Errorf("unexpected %v", p.bhs.Opcode())
			}
			if !answer {
				return nil // never answered
			}
			var r pdu.BHS
			pdu.EncodeLogoutResponse(&r, 0, p.bhs.ITT(), f.sns(), 0, 0)
			if err := f.write(&r, nil); err != nil {
				return err
			}
			f.nc.Close() // the target ends the connection after its response
			return errStopServing
		})
		s := newTestSession(t, d.pipeDialer, func(c *Config) { c.Transport = d })
		mustLogin(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := s.Logout(ctx)
		cancel()
		rc := d.last
		switch {
		case answer && err != nil:
			t.Fatalf("logout: %v", err)
		case !answer && err == nil:
			t.Fatal("a Logout nobody answered succeeded")
		case answer && (rc.aborted.Load() || !rc.closed.Load()):
			t.Fatalf("answered Logout: aborted %v, closed %v; want a plain close", rc.aborted.Load(), rc.closed.Load())
		case !answer && !rc.aborted.Load():
			t.Fatal("unanswered Logout: the connection was not reset")
		}
	}
}
