package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

func logoutOK(f *fakeTarget, b *pdu.BHS) error {
	var r pdu.BHS
	pdu.EncodeLogoutResponse(&r, 0, b.ITT(), f.sns(), 2, 0)
	f.statSN++
	f.write(&r, nil)
	return errStopServing
}

// TestCancelAbortsAndReaps: a caller whose context ends gets ctx.Err() at once; the task is
// aborted with ABORT TASK; Data-In arriving for it meanwhile never reaches the caller's buffer;
// the ITT is reused only after the target's TMF response (MaxTasks=1 proves the reaping).
func TestCancelAbortsAndReaps(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	gotCmd := make(chan pdu.BHS, 4)
	gotTMF := make(chan pdu.BHS, 1)
	release := make(chan struct{})
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		b := p.bhs
		switch b.Opcode() {
		case pdu.OpSCSICommand:
			gotCmd <- b
			if b.CDB()[0] == 0x00 {
				return f.respond(b.ITT(), 0, nil, 0, 0)
			}
			return nil // the read hangs until aborted
		case pdu.OpTaskMgmtReq:
			gotTMF <- b
			select {
			case <-release:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("test never released the TMF")
			}
			// Late Data-In for the aborted read: must be discarded, not written to the buffer.
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 512, b.Word20(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			if err := f.write(&r, bytes.Repeat([]byte{0xff}, 512)); err != nil {
				return err
			}
			pdu.EncodeTaskMgmtResponse(&r, 0, b.ITT(), f.sns())
			f.statSN++
			return f.write(&r, nil)
		case pdu.OpLogoutReq:
			return logoutOK(f, &b)
		}
		return fmt.Errorf("unexpected %v", b.Opcode())
	})
	s := newTestSession(t, d, func(c *Config) { c.MaxTasks = 1 }) // one SCSI slot; the TMF uses a control slot
	mustLogin(t, s)

	buf := make([]byte, 4096)
	var cmd scsi.Command
	rw16(&cmd, false, 0, buf)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		var resp scsi.Response
		errc <- s.Execute(ctx, &cmd, &resp)
	}()
	read := <-gotCmd
	cancel()
	start := time.Now()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("cancellation took %v", d)
	}
	tmf := <-gotTMF
	if tmf.Flags()&0x7f != pdu.TMFAbortTask || tmf.Word20() != read.ITT() || !tmf.Immediate() || tmf.Word32() != read.CmdSN() {
		t.Fatalf("TMF function %d ref ITT %x (read %x) RefCmdSN %d", tmf.Flags()&0x7f, tmf.Word20(), read.ITT(), tmf.Word32())
	}
	// While the aborted task holds its slot, a new command must wait for it.
	waitCtx, waitCancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	var resp scsi.Response
	if err := s.Execute(waitCtx, tur(), &resp); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("command while the aborted task holds the only slot: %v", err)
	}
	waitCancel()
	close(release)
	// After the TMF response the slot is free again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := s.Execute(ctx2, tur(), &resp); err != nil || resp.Status != scsi.StatusGood {
		t.Fatalf("command after the abort: %v", err)
	}
	if next := <-gotCmd; next.ITT() == read.ITT() {
		t.Fatalf("the aborted task's ITT %x was reused", read.ITT())
	}
	if !bytes.Equal(buf, make([]byte, 4096)) {
		t.Fatal("data for the abandoned read reached the caller's buffer")
	}
	s.Close()
	<-done
}

// TestConnectionLossFailsAllAndReloginReinstates: every outstanding task fails with a
// ConnError (block.ErrIO) when the connection dies; Login again uses the same ISID with TSIH 0.
func TestConnectionLossFailsAllAndReloginReinstates(t *testing.T) {
	d := &pipeDialer{}
	f1 := newFake(t, d, "fake:3260", nil)
	f2 := newFake(t, d, "fake:3260", nil)
	got := make(chan struct{}, 8)
	done1 := f1.serve(func(f *fakeTarget, p wirePDU) error {
		got <- struct{}{}
		return nil // never answers
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	errc := make(chan error, 5)
	for i := 0; i < 5; i++ {
		go func() {
			var resp scsi.Response
			errc <- s.Execute(context.Background(), tur(), &resp)
		}()
	}
	for i := 0; i < 5; i++ {
		<-got
	}
	f1.nc.Close()
	for i := 0; i < 5; i++ {
		err := <-errc
		var ce *ConnError
		if !errors.As(err, &ce) || !errors.Is(err, block.ErrIO) {
			t.Fatalf("outstanding task after connection loss: %v", err)
		}
	}
	<-done1
	loginISID := make(chan [2]uint64, 1)
	// Capture the second login's ISID/TSIH from the wire.
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		p, err := f2.read()
		if err != nil {
			t.Errorf("fake 2: %v", err)
			return
		}
		loginISID <- [2]uint64{p.bhs.ISID(), uint64(p.bhs.TSIH())}
		// Answer the first login PDU and go on normally.
		var r pdu.BHS
		text := login.EncodeText(nil, []login.KeyValue{{Key: "AuthMethod", Value: "None"}})
		pdu.EncodeLoginResponse(&r, true, false, 0, 1, len(text), p.bhs.ISID(), 0, p.bhs.ITT(), f2.sns(), 0, 0)
		f2.write(&r, text)
		if err := f2.login(); err != nil {
			t.Errorf("fake 2 login: %v", err)
			return
		}
		for {
			p, err := f2.read()
			if err != nil {
				return
			}
			switch p.bhs.Opcode() {
			case pdu.OpSCSICommand:
				f2.expCmdSN = p.bhs.CmdSN() + 1
				f2.maxCmdSN = f2.expCmdSN + 63
				f2.respond(p.bhs.ITT(), 0, nil, 0, 0)
			case pdu.OpLogoutReq:
				logoutOK(f2, &p.bhs)
				return
			}
		}
	}()
	if err := s.Login(context.Background()); err != nil {
		t.Fatalf("re-login: %v", err)
	}
	ids := <-loginISID
	if ids[0] != s.ISID() || ids[1] != 0 {
		t.Fatalf("re-login with ISID %x TSIH %d, want ISID %x TSIH 0", ids[0], ids[1], s.ISID())
	}
	var resp scsi.Response
	if err := s.Execute(context.Background(), tur(), &resp); err != nil {
		t.Fatalf("command after re-login: %v", err)
	}
	s.Close()
	<-done2
}

// TestAsyncLogoutRequest: AsyncEvent 1 (target requests logout) makes the session log out.
func TestAsyncLogoutRequest(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	sawLogout := make(chan pdu.BHS, 1)
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			if err := f.respond(p.bhs.ITT(), 0, nil, 0, 0); err != nil {
				return err
			}
			var r pdu.BHS
			pdu.EncodeAsyncMessage(&r, 0, 0, f.sns(), 1, 0, 0, 0, 2)
			f.statSN++
			return f.write(&r, nil)
		case pdu.OpLogoutReq:
			sawLogout <- p.bhs
			return logoutOK(f, &p.bhs)
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var resp scsi.Response
	if err := s.Execute(context.Background(), tur(), &resp); err != nil {
		t.Fatal(err)
	}
	b := <-sawLogout
	if b.Flags()&0x7f != pdu.LogoutCloseSession {
		t.Fatalf("logout reason %d", b.Flags()&0x7f)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session still connected after the requested logout")
	}
	<-done
	s.Close()
}

// redirect answers f's next login with a temporary redirect to to (§11.13.5) and closes; the
// channel closes when it has.
func redirect(f *fakeTarget, to string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := f.read()
		if err != nil {
			return
		}
		text := login.EncodeText(nil, []login.KeyValue{{Key: "TargetAddress", Value: to}})
		var r pdu.BHS
		pdu.EncodeLoginResponse(&r, false, false, 0, 0, len(text), p.bhs.ISID(), 0, p.bhs.ITT(), f.sns(), 1, 1)
		f.write(&r, text) //nolint:errcheck // the login fails the test if it does not arrive
		f.nc.Close()
	}()
	return done
}

// TestLoginRedirect: status class 1 with TargetAddress is followed; a loop is bounded.
func TestLoginRedirect(t *testing.T) {
	t.Run("followed", func(t *testing.T) {
		d := &pipeDialer{}
		a := newFake(t, d, "a:3260", nil)
		b := newFake(t, d, "10.9.9.9:3261", nil)
		da := redirect(a, "10.9.9.9:3261,7")
		db := b.serve(func(f *fakeTarget, p wirePDU) error {
			if p.bhs.Opcode() == pdu.OpLogoutReq {
				return logoutOK(f, &p.bhs)
			}
			return nil
		})
		s := newTestSession(t, d, func(c *Config) { c.Portal = "a:3260" })
		mustLogin(t, s)
		if got := d.dials; len(got) != 2 || got[1] != "10.9.9.9:3261" {
			t.Fatalf("dials %v", got)
		}
		s.Close()
		<-da
		<-db
	})
	t.Run("loop", func(t *testing.T) {
		d := &pipeDialer{}
		var dones []<-chan struct{}
		for i := 0; i < 3; i++ {
			dones = append(dones, redirect(newFake(t, d, "a:3260", nil), "a:3260"))
		}
		s := newTestSession(t, d, func(c *Config) { c.Portal = "a:3260"; c.MaxRedirects = 2 })
		err := s.Login(context.Background())
		if !errors.Is(err, login.ErrTooManyRedirects) {
			t.Fatalf("redirect loop: %v", err)
		}
		for _, d := range dones {
			<-d
		}
	})
}

// TestTextContinuation: a Text Response split over several PDUs (C bit, TTT) is reassembled.
func TestTextContinuation(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	full := login.EncodeText(nil, []login.KeyValue{
		{Key: "TargetName", Value: "iqn.2026-11.test:one"}, {Key: "TargetAddress", Value: "1.2.3.4:3260,1"},
		{Key: "TargetName", Value: "iqn.2026-11.test:two"}, {Key: "TargetAddress", Value: "[::1]:3260,2"},
	})
	chunks := [][]byte{full[:10], full[10:33], full[33:]} // splits inside key=value pairs
	i := 0
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		b := &p.bhs
		switch b.Opcode() {
		case pdu.OpTextReq:
			if i == 0 && string(p.data) != "SendTargets=All\x00" {
				return fmt.Errorf("text request %q", p.data)
			}
			if i > 0 && (b.TTT() != uint32(0x500+i-1) || len(p.data) != 0) {
				return fmt.Errorf("continuation with TTT %x and %d bytes", b.TTT(), len(p.data))
			}
			last := i == len(chunks)-1
			ttt := uint32(0x500 + i)
			if last {
				ttt = pdu.ReservedTag
			}
			var r pdu.BHS
			pdu.EncodeTextResponse(&r, last, !last, len(chunks[i]), b.ITT(), ttt, f.sns())
			f.statSN++
			i++
			return f.write(&r, chunks[i-1])
		case pdu.OpLogoutReq:
			return logoutOK(f, b)
		}
		return fmt.Errorf("unexpected %v", b.Opcode())
	})
	s := newTestSession(t, d, func(c *Config) { c.Discovery = true; c.TargetName = "" })
	mustLogin(t, s)
	kvs, err := s.Text(context.Background(), []login.KeyValue{{Key: "SendTargets", Value: "All"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 4 || kvs[2].Value != "iqn.2026-11.test:two" || kvs[3].Value != "[::1]:3260,2" {
		t.Fatalf("text = %+v", kvs)
	}
	s.Close()
	<-done
}
