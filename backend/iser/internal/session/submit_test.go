package session

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// completion is a Completer that records its call.
type completion struct {
	ch chan error
}

func newCompletion() *completion { return &completion{ch: make(chan error, 1)} }

func (c *completion) Complete(err error) {
	select {
	case c.ch <- err:
	default:
		panic("Complete called twice")
	}
}

func (c *completion) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("submitted command never completed")
		return nil
	}
}

func TestSubmit(t *testing.T) {
	keys := map[string]string{"ImmediateData": "Yes", "InitialR2T": "Yes", "MaxRecvDataSegmentLength": "8192",
		"FirstBurstLength": "65536"}
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", keys)
	dt := newDataTarget(t, keys, 1<<20)
	f.serve(dt.handle)
	s := newTestSession(t, d, nil)
	mustLogin(t, s)

	const n = 16
	bufs := make([][]byte, n)
	cmds := make([]scsi.Command, n)
	resps := make([]scsi.Response, n)
	dones := make([]*completion, n)
	for i := range n {
		bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, 4096)
		rw16(&cmds[i], true, int64(i)*8192, bufs[i])
		dones[i] = newCompletion()
		if !s.Submit(&cmds[i], &resps[i], dones[i]) {
			t.Fatalf("write %d not submitted", i)
		}
	}
	// A concurrent Execute flushes what Submit queued along with its own command.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var cmd scsi.Command
		var resp scsi.Response
		buf := bytes.Repeat([]byte{0xEE}, 20480) // solicited data: Execute's own path
		rw16(&cmd, true, 512<<10, buf[:20480])
		if err := s.Execute(t.Context(), &cmd, &resp); err != nil || resp.Status != scsi.StatusGood {
			t.Errorf("execute: %v %v", err, resp.Status)
		}
	}()
	s.Kick()
	for i := range n {
		if err := dones[i].wait(t); err != nil || resps[i].Status != scsi.StatusGood {
			t.Fatalf("write %d: %v, status %v", i, err, resps[i].Status)
		}
	}
	wg.Wait()
	for i := range n {
		got := make([]byte, 4096)
		rw16(&cmds[i], false, int64(i)*8192, got)
		dones[i] = newCompletion()
		if !s.Submit(&cmds[i], &resps[i], dones[i]) {
			t.Fatalf("read %d not submitted", i)
		}
		s.Kick()
		if err := dones[i].wait(t); err != nil || resps[i].Status != scsi.StatusGood {
			t.Fatalf("read %d: %v, status %v", i, err, resps[i].Status)
		}
		if !bytes.Equal(got, bufs[i]) {
			t.Fatalf("read %d returned other bytes than written", i)
		}
	}

	// A write whose data does not all fit in the command PDU is left to Execute, and
	// SubmitWriteMax says where that starts: the target's MaxRecvDataSegmentLength here.
	var cmd scsi.Command
	var resp scsi.Response
	if got := s.SubmitWriteMax(); got != 8192 {
		t.Fatalf("SubmitWriteMax = %d, want 8192 (immediate data up to the target's MaxRecvDataSegmentLength)", got)
	}
	rw16(&cmd, true, 0, make([]byte, 8192+512))
	if s.Submit(&cmd, &resp, newCompletion()) {
		t.Fatal("a write needing Data-Out PDUs was submitted")
	}
}

// TestSubmitWriteMaxWithoutImmediateData: with ImmediateData=No no write's data goes in the
// command PDU, so Submit takes no write and SubmitWriteMax says 0.
func TestSubmitWriteMaxWithoutImmediateData(t *testing.T) {
	keys := map[string]string{"ImmediateData": "No", "InitialR2T": "Yes", "MaxRecvDataSegmentLength": "8192"}
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", keys)
	dt := newDataTarget(t, keys, 1<<20)
	f.serve(dt.handle)
	s := newTestSession(t, d, nil)
	if got := s.SubmitWriteMax(); got != 0 {
		t.Fatalf("SubmitWriteMax before login = %d, want 0", got)
	}
	mustLogin(t, s)
	if got := s.SubmitWriteMax(); got != 0 {
		t.Fatalf("SubmitWriteMax with ImmediateData=No = %d, want 0", got)
	}
	var cmd scsi.Command
	var resp scsi.Response
	rw16(&cmd, true, 0, make([]byte, 512))
	if s.Submit(&cmd, &resp, newCompletion()) {
		t.Fatal("a write was submitted without immediate data")
	}
}

// TestSubmitWindowAndSlots: Submit never waits: it declines once the CmdSN window (64 commands
// of the fake target) is used up by commands not sent yet, and Kick then gets them all answered.
func TestSubmitWindowAndSlots(t *testing.T) {
	keys := map[string]string{"ImmediateData": "Yes"}
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", keys)
	dt := newDataTarget(t, keys, 1<<20)
	f.serve(dt.handle)
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var dones []*completion
	resps := make([]scsi.Response, 200)
	cmds := make([]scsi.Command, 200)
	for i := range cmds {
		rw16(&cmds[i], false, int64(i)*512, make([]byte, 512))
		c := newCompletion()
		if !s.Submit(&cmds[i], &resps[i], c) {
			break
		}
		dones = append(dones, c)
	}
	if len(dones) != 64 {
		t.Fatalf("%d commands submitted into a window of 64", len(dones))
	}
	s.Kick()
	for i, c := range dones {
		if err := c.wait(t); err != nil || resps[i].Status != scsi.StatusGood {
			t.Fatalf("command %d: %v %v", i, err, resps[i].Status)
		}
	}
}

// TestSubmitConnectionLoss: submitted commands whose connection dies complete with a ConnError.
func TestSubmitConnectionLoss(t *testing.T) {
	keys := map[string]string{"ImmediateData": "Yes"}
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", keys)
	got := make(chan struct{})
	f.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() == pdu.OpSCSICommand {
			close(got)
			f.nc.Close() // the target dies with the commands outstanding
			return errStopServing
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	var dones []*completion
	var resps [4]scsi.Response
	var cmds [4]scsi.Command
	for i := range cmds {
		rw16(&cmds[i], i%2 == 0, int64(i)*4096, make([]byte, 4096))
		c := newCompletion()
		if !s.Submit(&cmds[i], &resps[i], c) {
			t.Fatalf("command %d not submitted", i)
		}
		dones = append(dones, c)
	}
	s.Kick()
	<-got
	for i, c := range dones {
		var ce *ConnError
		if err := c.wait(t); !errors.As(err, &ce) {
			t.Fatalf("command %d ended with %v, want a ConnError", i, err)
		}
	}
	var resp scsi.Response
	if s.Submit(tur(), &resp, newCompletion()) {
		t.Fatal("submitted on a dead connection")
	}
}

// movingDialer makes the connections of a pipeDialer report MovesData, as iSER's do, so that
// Submit's choice for a transport that moves solicited data itself can be checked (the fake
// target still speaks TCP: nothing here is sent). Its connections cap a command at maxXfer and
// call every buffer registered (transport.DirectMemory) unless foreign is set.
type movingDialer struct {
	*pipeDialer
	maxXfer int
	foreign bool
}

func (d movingDialer) Dial(ctx context.Context, portal string, o transport.DialOptions) (transport.Conn, error) {
	c, err := d.pipeDialer.Dial(ctx, portal, o)
	if err != nil {
		return nil, err
	}
	return movingConn{Conn: c, maxXfer: d.maxXfer, foreign: d.foreign}, nil
}

type movingConn struct {
	transport.Conn
	maxXfer int
	foreign bool
}

func (movingConn) MovesData() bool          { return true }
func (c movingConn) MaxTransferLength() int { return c.maxXfer }
func (c movingConn) Direct(buf []byte) bool { return !c.foreign }

// TestSubmitWriteMaxMovingData: over iSER the target fetches solicited data by RDMA Read, so
// Submit takes any write up to the transport's cap unless unsolicited Data-Out PDUs would have
// to follow the command.
func TestSubmitWriteMaxMovingData(t *testing.T) {
	const maxXfer = 512 << 10
	for _, c := range []struct {
		name string
		keys map[string]string
		want int
	}{
		{"InitialR2T=Yes", map[string]string{"ImmediateData": "Yes", "InitialR2T": "Yes",
			"MaxRecvDataSegmentLength": "8192", "FirstBurstLength": "65536"}, maxXfer},
		{"no unsolicited data", map[string]string{"ImmediateData": "No", "InitialR2T": "Yes"}, maxXfer},
		{"unsolicited Data-Out beyond immediate data", map[string]string{"ImmediateData": "Yes", "InitialR2T": "No",
			"MaxRecvDataSegmentLength": "8192", "FirstBurstLength": "65536"}, 8192},
		{"unsolicited Data-Out only", map[string]string{"ImmediateData": "No", "InitialR2T": "No"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := movingSession(t, c.keys, false)
			if got := s.SubmitWriteMax(); got != c.want {
				t.Fatalf("SubmitWriteMax = %d, want %d", got, c.want)
			}
			var cmd scsi.Command
			var resp scsi.Response
			rw16(&cmd, true, 0, make([]byte, c.want+512))
			if s.Submit(&cmd, &resp, newCompletion()) {
				t.Fatalf("a %d-byte write was submitted (over the cap, or needing unsolicited Data-Out PDUs)", c.want+512)
			}
		})
	}
}

// TestSubmitForeignBufferMovingData: a buffer iSER would have to bounce (it is not in registered
// memory) is declined, since the bounce may wait for the transport's pool.
func TestSubmitForeignBufferMovingData(t *testing.T) {
	s := movingSession(t, map[string]string{"ImmediateData": "Yes", "InitialR2T": "Yes"}, true)
	var cmd scsi.Command
	var resp scsi.Response
	for _, write := range []bool{false, true} {
		rw16(&cmd, write, 0, make([]byte, 4096))
		if s.Submit(&cmd, &resp, newCompletion()) {
			t.Fatalf("a command (write %v) on a buffer the transport would bounce was submitted", write)
		}
	}
}

func movingSession(t *testing.T, keys map[string]string, foreign bool) *Session {
	t.Helper()
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", keys)
	f.serve(newDataTarget(t, keys, 1<<20).handle)
	s := newTestSession(t, nil, func(cfg *Config) {
		cfg.Transport = movingDialer{pipeDialer: d, maxXfer: 512 << 10, foreign: foreign}
	})
	mustLogin(t, s)
	return s
}
