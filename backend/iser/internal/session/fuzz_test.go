package session

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// FuzzTargetStream logs in to a fake target, issues a 4 KiB READ or WRITE, and lets the target answer
// with arbitrary bytes before closing the connection. Whatever the bytes, the session must not
// panic, Execute must return, and nothing outside the read buffer may change.
func FuzzTargetStream(f *testing.F) {
	th := pdu.TargetHeader{StatSN: 102, ExpCmdSN: 2, MaxCmdSN: 64}
	const itt = 0x00010000 // the first task of a fresh session
	var b pdu.BHS
	pdu.EncodeDataIn(&b, pdu.FlagFinal|pdu.FlagStatus, 0, 4096, itt, pdu.ReservedTag, th, 0, 0, 0)
	good := append(append([]byte(nil), b[:]...), make([]byte, 4096)...)
	f.Add(good, false)
	pdu.EncodeDataIn(&b, 0, 0, 2048, itt, pdu.ReservedTag, th, 0, 2048, 0)
	f.Add(append(append([]byte(nil), b[:]...), make([]byte, 2048)...), false)
	pdu.EncodeR2T(&b, 0, itt, 5, th, 0, 0, 512)
	f.Add(append([]byte(nil), b[:]...), true)
	r2t2 := append([]byte(nil), b[:]...)
	pdu.EncodeR2T(&b, 0, itt, 6, th, 1, 512, 3584)
	r2t2 = append(r2t2, b[:]...)
	pdu.EncodeSCSIResponse(&b, 0, 0, 0, 0, itt, th, 0, 0)
	f.Add(append(r2t2, b[:]...), true)
	pdu.EncodeSCSIResponse(&b, pdu.FlagUnderflow, 0, 2, 8, itt, th, 0, 4096)
	f.Add(append(append([]byte(nil), b[:]...), 0, 6, 0x70, 0, 5, 0, 0, 0), false)
	pdu.EncodeNOPIn(&b, 4, 0, pdu.ReservedTag, 9, th)
	f.Add(append(append([]byte(nil), b[:]...), 1, 2, 3, 4), false)
	pdu.EncodeReject(&b, 4, th)
	f.Add(append(append([]byte(nil), b[:]...), good[:48]...), false)
	pdu.EncodeAsyncMessage(&b, 0, 0, th, 4, 0, 0, 0, 0)
	f.Add(append([]byte(nil), b[:]...), false)
	f.Fuzz(fuzzBody)
}

func fuzzBody(t *testing.T, stream []byte, write bool) {
	{
		d := &pipeDialer{}
		ft := newFake(t, d, "fake:3260", nil)
		gotCmd := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer ft.nc.Close()
			if err := ft.login(); err != nil {
				return
			}
			if _, err := ft.read(); err != nil {
				return
			}
			close(gotCmd)
			// net.Pipe writes complete only when the initiator has read every byte; then the
			// deferred Close ends the connection. What the initiator sends meanwhile (NOP
			// answers, Data-Out, ABORT TASK) fails on the closed pipe, which is fine.
			ft.nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
			ft.nc.Write(stream)
		}()
		cfg := Config{Portal: "fake:3260", Transport: d, InitiatorName: "iqn.2026-11.io.iser-blk:fuzz",
			TargetName: "iqn.2026-11.io.iser-blk:fake", LoginTimeout: 2 * time.Second}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Login(context.Background()); err != nil {
			<-done
			return
		}
		backing := bytes.Repeat([]byte{0xa5}, 3*4096)
		buf := backing[4096:8192:8192]
		var cmd scsi.Command
		var resp scsi.Response
		rw16(&cmd, write, 0, buf)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Execute(ctx, &cmd, &resp)
		for i, c := range backing {
			if (i < 4096 || i >= 8192) && c != 0xa5 {
				t.Fatalf("byte %d outside the buffer changed", i-4096)
			}
		}
		if int(resp.SenseLen) > len(resp.Sense) {
			t.Fatal("sense length beyond the sense buffer")
		}
		ft.nc.Close()
		s.Close()
		<-done
	}
}
