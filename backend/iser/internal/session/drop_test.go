package session

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
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
