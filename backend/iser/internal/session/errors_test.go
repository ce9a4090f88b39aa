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

// TestMalformedTargetPDUs: a lying or broken target breaks the connection (a connection error at
// ERL 0), the task fails with an error matching block.ErrIO, nothing panics and nothing is
// written outside the task's buffer.
func TestMalformedTargetPDUs(t *testing.T) {
	const bufLen = 8192
	tests := []struct {
		name   string
		digest bool
		write  bool
		// misbehave answers the command with something wrong.
		misbehave func(f *fakeTarget, cmd *pdu.BHS) error
	}{
		{name: "Data-In for an unknown ITT", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 512, cmd.ITT()^0x5a5a0000, pdu.ReservedTag, f.sns(), 0, 0, 0)
			return f.write(&r, make([]byte, 512))
		}},
		{name: "Data-In beyond the buffer", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 4096, cmd.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			if err := f.write(&r, bytes.Repeat([]byte{0xee}, 4096)); err != nil {
				return err
			}
			pdu.EncodeDataIn(&r, 0, 0, 4096+512, cmd.ITT(), pdu.ReservedTag, f.sns(), 1, 4096, 0)
			return f.write(&r, bytes.Repeat([]byte{0xee}, 4096+512))
		}},
		{name: "Data-In with a wrong DataSN", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 512, cmd.ITT(), pdu.ReservedTag, f.sns(), 3, 0, 0)
			return f.write(&r, make([]byte, 512))
		}},
		{name: "Data-In out of order", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 512, cmd.ITT(), pdu.ReservedTag, f.sns(), 0, 1024, 0)
			return f.write(&r, make([]byte, 512))
		}},
		{name: "bad data digest", digest: true, misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			f.dataDigest = false // write the digest by hand, wrong
			defer func() { f.dataDigest = true }()
			var r pdu.BHS
			pdu.EncodeDataIn(&r, pdu.FlagFinal|pdu.FlagStatus, 0, bufLen, cmd.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			data := append(bytes.Repeat([]byte{1}, bufLen), 0xde, 0xad, 0xbe, 0xef)
			return f.write(&r, data[:bufLen+4])
		}},
		{name: "bad header digest", digest: true, misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			f.hdrDigest = false
			defer func() { f.hdrDigest = true }()
			var r pdu.BHS
			pdu.EncodeSCSIResponse(&r, 0, 0, 0, 0, cmd.ITT(), f.sns(), 0, 0)
			f.wmu.Lock()
			defer f.wmu.Unlock()
			_, err := f.nc.Write(append(r[:], 1, 2, 3, 4))
			return err
		}},
		{name: "unknown opcode", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			r[0] = 0x3a
			return f.write(&r, nil)
		}},
		{name: "initiator opcode from the target", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag}).Encode(&r)
			return f.write(&r, nil)
		}},
		{name: "data segment above MaxRecvDataSegmentLength", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 0, cmd.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			r.SetDataSegmentLength(1 << 23) // we declared 256 KiB
			return f.write(&r, nil)
		}},
		{name: "SCSI Response with SenseLength past the segment", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeSCSIResponse(&r, 0, 0, 2, 4, cmd.ITT(), f.sns(), 0, 0)
			return f.write(&r, []byte{0, 200, 0x70, 0})
		}},
		{name: "R2T beyond the buffer", write: true, misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeR2T(&r, cmd.LUN(), cmd.ITT(), 0x10, f.sns(), 0, bufLen-512, 4096)
			return f.write(&r, nil)
		}},
		{name: "R2T for a read", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeR2T(&r, cmd.LUN(), cmd.ITT(), 0x10, f.sns(), 0, 0, 512)
			return f.write(&r, nil)
		}},
		{name: "Data-In for a write", write: true, misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeDataIn(&r, 0, 0, 512, cmd.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			return f.write(&r, make([]byte, 512))
		}},
		{name: "Login Response in full-feature phase", misbehave: func(f *fakeTarget, cmd *pdu.BHS) error {
			var r pdu.BHS
			pdu.EncodeLoginResponse(&r, true, false, 1, 3, 0, 0, 1, cmd.ITT(), f.sns(), 0, 0)
			return f.write(&r, nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := map[string]string{"ImmediateData": "No", "InitialR2T": "Yes"}
			if tt.digest {
				keys["HeaderDigest"], keys["DataDigest"] = "CRC32C", "CRC32C"
			}
			d := &pipeDialer{}
			f := newFake(t, d, "fake:3260", keys)
			done := f.serve(func(f *fakeTarget, p wirePDU) error {
				if p.bhs.Opcode() != pdu.OpSCSICommand {
					return nil
				}
				if err := tt.misbehave(f, &p.bhs); err != nil {
					return errStopServing // the initiator closed the connection first
				}
				return nil
			})
			s := newTestSession(t, d, func(c *Config) {
				c.Proposal = login.DefaultProposal()
				if tt.digest {
					c.Proposal.HeaderDigest, c.Proposal.DataDigest = login.DigestCRC32C, login.DigestCRC32C
				}
			})
			mustLogin(t, s)
			// The task's buffer sits between guard bytes that must stay untouched.
			backing := bytes.Repeat([]byte{0xa5}, bufLen+2*4096)
			buf := backing[4096 : 4096+bufLen : 4096+bufLen]
			var cmd scsi.Command
			var resp scsi.Response
			rw16(&cmd, tt.write, 0, buf)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := s.Execute(ctx, &cmd, &resp)
			var ce *ConnError
			if !errors.As(err, &ce) || !errors.Is(err, block.ErrIO) {
				t.Fatalf("Execute = %v, want a *ConnError matching block.ErrIO", err)
			}
			t.Logf("error: %v", err)
			for i, b := range backing {
				if (i < 4096 || i >= 4096+bufLen) && b != 0xa5 {
					t.Fatalf("byte %d outside the task buffer was overwritten", i-4096)
				}
			}
			select {
			case <-s.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the connection was not torn down")
			}
			// The session stays usable in the sense that it reports the failure and can be
			// closed; new commands fail fast.
			if err := s.Execute(context.Background(), tur(), &resp); !errors.Is(err, block.ErrIO) {
				t.Fatalf("command after the connection error: %v", err)
			}
			s.Close()
			f.nc.Close()
			<-done
		})
	}
}

// TestReject: a Reject of a command fails that task only (TaskError), the session keeps working.
func TestReject(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	n := 0
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			n++
			if n == 1 {
				var r pdu.BHS
				pdu.EncodeReject(&r, 0x05, f.sns()) // command not supported
				f.statSN++
				return f.write(&r, p.bhs[:])
			}
			return f.respond(p.bhs.ITT(), 0, nil, 0, 0)
		case pdu.OpLogoutReq:
			var r pdu.BHS
			pdu.EncodeLogoutResponse(&r, 0, p.bhs.ITT(), f.sns(), 0, 0)
			f.write(&r, nil)
			return errStopServing
		}
		return fmt.Errorf("unexpected %v", p.bhs.Opcode())
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var resp scsi.Response
	err := s.Execute(context.Background(), tur(), &resp)
	var te *TaskError
	if !errors.As(err, &te) || !errors.Is(err, block.ErrIO) {
		t.Fatalf("rejected command: %v", err)
	}
	t.Logf("error: %v", err)
	if err := s.Execute(context.Background(), tur(), &resp); err != nil || resp.Status != scsi.StatusGood {
		t.Fatalf("command after a reject: %v %v", err, resp.Status)
	}
	s.Close()
	<-done
}

// TestSenseAndResiduals: CHECK CONDITION with sense data and under/overflow residuals reach the
// caller; Data-In with status carries the residual too.
func TestSenseAndResiduals(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	sense := []byte{0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0}
	step := 0
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		b := &p.bhs
		switch b.Opcode() {
		case pdu.OpSCSICommand:
			step++
			switch step {
			case 1:
				return f.respond(b.ITT(), 2, sense, 0, 0)
			case 2: // a read that returns 1024 of 4096 bytes: underflow 3072 in Data-In with status
				var r pdu.BHS
				pdu.EncodeDataIn(&r, pdu.FlagFinal|pdu.FlagStatus|pdu.FlagUnderflow, 0, 1024, b.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 3072)
				f.statSN++
				return f.write(&r, bytes.Repeat([]byte{7}, 1024))
			case 3: // overflow reported in the SCSI Response
				return f.respond(b.ITT(), 0, nil, pdu.FlagOverflow, 512)
			}
		case pdu.OpLogoutReq:
			var r pdu.BHS
			pdu.EncodeLogoutResponse(&r, 0, b.ITT(), f.sns(), 0, 0)
			f.write(&r, nil)
			return errStopServing
		}
		return fmt.Errorf("unexpected %v", b.Opcode())
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var resp scsi.Response
	if err := s.Execute(context.Background(), tur(), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Status != scsi.StatusCheckCondition || !bytes.Equal(resp.Sense[:resp.SenseLen], sense) {
		t.Fatalf("status %v sense % x", resp.Status, resp.Sense[:resp.SenseLen])
	}
	var cmd scsi.Command
	buf := make([]byte, 4096)
	rw16(&cmd, false, 0, buf)
	if err := s.Execute(context.Background(), &cmd, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Status != scsi.StatusGood || resp.Residual != 3072 || resp.SenseLen != 0 || buf[1023] != 7 || buf[1024] != 0 {
		t.Fatalf("underflow: status %v residual %d", resp.Status, resp.Residual)
	}
	if err := s.Execute(context.Background(), tur(), &resp); err != nil || resp.Residual != -512 {
		t.Fatalf("overflow: %v residual %d", err, resp.Residual)
	}
	s.Close()
	<-done
}
