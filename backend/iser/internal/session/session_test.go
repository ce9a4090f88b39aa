package session

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// memDisk is the fake target's LUN: a byte slice addressed by READ(16)/WRITE(16).
type memDisk struct {
	mu   sync.Mutex
	data []byte
}

func cdbRange(b *pdu.BHS) (off, n int) {
	cdb := b.CDB()
	return int(binary.BigEndian.Uint64(cdb[2:10])) * 512, int(binary.BigEndian.Uint32(cdb[10:14])) * 512
}

// writeTask tracks one write on the fake target: what arrived and which R2Ts are outstanding.
type writeTask struct {
	lun      uint64
	itt      uint32
	off, n   int
	buf      []byte
	got      int    // bytes received
	nextR2T  int    // next offset to solicit
	r2tSN    uint32 // next R2TSN
	open     map[uint32]*r2tState
	unsolEnd bool // unsolicited phase over
}

type r2tState struct {
	off, n  int
	dataSN  uint32
	written int
}

// dataTarget is a fake target implementing READ(16)/WRITE(16)/TEST UNIT READY with R2T rules
// from its keys, checking every Data-Out the initiator sends against RFC 7143.
type dataTarget struct {
	t        *testing.T
	disk     *memDisk
	keys     map[string]string
	writes   map[uint32]*writeTask
	mrdsl    int // the target's MaxRecvDataSegmentLength: the largest Data-Out we accept
	maxBurst int
	first    int
	maxR2T   int
	initR2T  bool
	immData  bool
	inSeg    int // Data-In segment size the target sends
	r2ts     int // R2Ts issued (for assertions)
}

func newDataTarget(t *testing.T, keys map[string]string, size int) *dataTarget {
	return &dataTarget{
		t: t, disk: &memDisk{data: make([]byte, size)}, keys: keys, writes: map[uint32]*writeTask{},
		mrdsl: atoiKey(keys, "MaxRecvDataSegmentLength", 8192), maxBurst: atoiKey(keys, "MaxBurstLength", 262144),
		first: atoiKey(keys, "FirstBurstLength", 65536), maxR2T: atoiKey(keys, "MaxOutstandingR2T", 1),
		initR2T: keys["InitialR2T"] != "No", immData: keys["ImmediateData"] != "No", inSeg: 3000,
	}
}

func (d *dataTarget) handle(f *fakeTarget, p wirePDU) error {
	b := &p.bhs
	switch b.Opcode() {
	case pdu.OpSCSICommand:
		switch b.CDB()[0] {
		case 0x00:
			return f.respond(b.ITT(), 0, nil, 0, 0)
		case 0x88:
			return d.read(f, b)
		case 0x8a:
			return d.startWrite(f, p)
		}
		return fmt.Errorf("unexpected CDB % x", b.CDB()[:1])
	case pdu.OpDataOut:
		return d.dataOut(f, p)
	case pdu.OpLogoutReq:
		var r pdu.BHS
		pdu.EncodeLogoutResponse(&r, 0, b.ITT(), f.sns(), 0, 0)
		f.statSN++
		if err := f.write(&r, nil); err != nil {
			return err
		}
		return errStopServing
	case pdu.OpNOPOut:
		if b.ITT() != pdu.ReservedTag {
			var r pdu.BHS
			pdu.EncodeNOPIn(&r, len(p.data), 0, b.ITT(), pdu.ReservedTag, f.sns())
			f.statSN++
			return f.write(&r, p.data)
		}
		return nil
	}
	return fmt.Errorf("unexpected %v", b.Opcode())
}

func (d *dataTarget) read(f *fakeTarget, b *pdu.BHS) error {
	off, n := cdbRange(b)
	if int(b.ExpectedDataTransferLength()) != n || b.Flags()&pdu.FlagRead == 0 {
		return fmt.Errorf("READ: EDTL %d for %d bytes", b.ExpectedDataTransferLength(), n)
	}
	d.disk.mu.Lock()
	src := append([]byte(nil), d.disk.data[off:off+n]...)
	d.disk.mu.Unlock()
	var sn uint32
	for sent := 0; sent < n || n == 0; {
		k := min(d.inSeg, n-sent)
		last := sent+k == n
		var flags uint8
		if last {
			flags = pdu.FlagFinal | pdu.FlagStatus
		}
		var r pdu.BHS
		pdu.EncodeDataIn(&r, flags, 0, k, b.ITT(), pdu.ReservedTag, f.sns(), sn, uint32(sent), 0)
		if last {
			f.statSN++
		}
		if err := f.write(&r, src[sent:sent+k]); err != nil {
			return err
		}
		sn++
		sent += k
		if last {
			break
		}
	}
	return nil
}

func (d *dataTarget) startWrite(f *fakeTarget, p wirePDU) error {
	b := &p.bhs
	off, n := cdbRange(b)
	if int(b.ExpectedDataTransferLength()) != n || b.Flags()&pdu.FlagWrite == 0 {
		return fmt.Errorf("WRITE: EDTL %d for %d bytes", b.ExpectedDataTransferLength(), n)
	}
	w := &writeTask{lun: b.LUN(), itt: b.ITT(), off: off, n: n, buf: make([]byte, n), open: map[uint32]*r2tState{}}
	d.writes[w.itt] = w
	imm := len(p.data)
	switch {
	case imm > 0 && !d.immData:
		return fmt.Errorf("immediate data with ImmediateData=No")
	case imm > d.first || imm > d.mrdsl:
		return fmt.Errorf("%d bytes of immediate data exceed FirstBurstLength %d / MaxRecvDataSegmentLength %d", imm, d.first, d.mrdsl)
	case d.immData && imm != min(n, d.first, d.mrdsl):
		return fmt.Errorf("%d bytes of immediate data, expected %d", imm, min(n, d.first, d.mrdsl))
	}
	copy(w.buf, p.data)
	w.got = imm
	w.nextR2T = imm
	unsolicited := imm
	if !d.initR2T {
		unsolicited = min(n, d.first)
	}
	if b.Final() != (unsolicited == imm) {
		return fmt.Errorf("command F=%v with %d unsolicited bytes and %d immediate", b.Final(), unsolicited, imm)
	}
	if b.Final() {
		w.unsolEnd = true
	}
	w.nextR2T = unsolicited
	if w.unsolEnd {
		return d.solicit(f, w)
	}
	return nil
}

// solicit issues R2Ts up to MaxOutstandingR2T, each at most MaxBurstLength (§11.8), or
// completes the write.
func (d *dataTarget) solicit(f *fakeTarget, w *writeTask) error {
	if w.got == w.n && len(w.open) == 0 {
		d.disk.mu.Lock()
		copy(d.disk.data[w.off:], w.buf)
		d.disk.mu.Unlock()
		delete(d.writes, w.itt)
		return f.respond(w.itt, 0, nil, 0, 0)
	}
	for len(w.open) < d.maxR2T && w.nextR2T < w.n {
		k := min(d.maxBurst, w.n-w.nextR2T)
		ttt := 0x1000 + w.r2tSN
		w.open[ttt] = &r2tState{off: w.nextR2T, n: k}
		var r pdu.BHS
		pdu.EncodeR2T(&r, w.lun, w.itt, ttt, f.sns(), w.r2tSN, uint32(w.nextR2T), uint32(k))
		if err := f.write(&r, nil); err != nil {
			return err
		}
		d.r2ts++
		w.r2tSN++
		w.nextR2T += k
	}
	return nil
}

func (d *dataTarget) dataOut(f *fakeTarget, p wirePDU) error {
	b := &p.bhs
	w := d.writes[b.ITT()]
	if w == nil {
		return fmt.Errorf("Data-Out for unknown ITT 0x%x", b.ITT())
	}
	n, off := len(p.data), int(b.BufferOffset())
	if n > d.mrdsl {
		return fmt.Errorf("Data-Out of %d bytes exceeds MaxRecvDataSegmentLength %d", n, d.mrdsl)
	}
	if off+n > w.n {
		return fmt.Errorf("Data-Out beyond the write")
	}
	copy(w.buf[off:], p.data)
	w.got += n
	if b.TTT() == pdu.ReservedTag {
		if w.unsolEnd || off+n > min(w.n, d.first) {
			return fmt.Errorf("unsolicited Data-Out [%d,+%d) beyond FirstBurstLength %d", off, n, d.first)
		}
		if b.Final() {
			w.unsolEnd = true
			if off+n != w.nextR2T {
				return fmt.Errorf("unsolicited burst ended at %d, expected %d", off+n, w.nextR2T)
			}
			return d.solicit(f, w)
		}
		return nil
	}
	r := w.open[b.TTT()]
	if r == nil {
		return fmt.Errorf("Data-Out with unknown TTT 0x%x", b.TTT())
	}
	if b.DataSN() != r.dataSN || off != r.off+r.written {
		return fmt.Errorf("Data-Out DataSN %d offset %d, expected %d and %d", b.DataSN(), off, r.dataSN, r.off+r.written)
	}
	r.dataSN++
	r.written += n
	if b.Final() != (r.written == r.n) {
		return fmt.Errorf("Data-Out F=%v after %d of %d bytes", b.Final(), r.written, r.n)
	}
	if b.Final() {
		delete(w.open, b.TTT())
		return d.solicit(f, w)
	}
	return nil
}

// TestR2TSequences writes and reads back through the fake target for every ImmediateData ×
// InitialR2T combination, with segment, burst and outstanding-R2T limits small enough that every
// boundary is crossed. The target checks each PDU against RFC 7143 §11.7-8 and §13.
func TestR2TSequences(t *testing.T) {
	for _, imm := range []string{"Yes", "No"} {
		for _, r2t := range []string{"Yes", "No"} {
			for _, digest := range []string{"None", "CRC32C"} {
				name := fmt.Sprintf("ImmediateData=%s/InitialR2T=%s/Digest=%s", imm, r2t, digest)
				t.Run(name, func(t *testing.T) {
					keys := map[string]string{
						"ImmediateData": imm, "InitialR2T": r2t, "MaxRecvDataSegmentLength": "4096",
						"MaxBurstLength": "16384", "FirstBurstLength": "8192", "MaxOutstandingR2T": "2",
						"HeaderDigest": digest, "DataDigest": digest,
					}
					d := &pipeDialer{}
					f := newFake(t, d, "fake:3260", keys)
					dt := newDataTarget(t, keys, 1<<20)
					done := f.serve(dt.handle)
					s := newTestSession(t, d, func(c *Config) {
						c.Proposal = login.DefaultProposal()
						if digest == "CRC32C" {
							c.Proposal.HeaderDigest, c.Proposal.DataDigest = login.DigestCRC32C, login.DigestCRC32C
						}
					})
					mustLogin(t, s)
					p := s.Params()
					if p.MaxOutstandingR2T != 2 || p.TargetMaxRecvDataSegmentLength != 4096 || p.MaxBurstLength != 16384 ||
						p.FirstBurstLength != 8192 || p.ImmediateData != (imm == "Yes") || p.InitialR2T != (r2t == "Yes") ||
						p.HeaderDigest != (digest == "CRC32C") {
						t.Fatalf("negotiated %s", p.String())
					}
					var wg sync.WaitGroup
					errs := make(chan error, 16)
					for g := 0; g < 8; g++ {
						wg.Add(1)
						go func(g int) {
							defer wg.Done()
							// Sizes straddle 4 KiB segments, the 8 KiB first burst and 16 KiB bursts.
							sizes := []int{512, 4096, 8192, 8704, 16384, 20480, 65536 + 512}
							n := sizes[g%len(sizes)]
							off := int64(g) * 128 << 10
							buf := make([]byte, n)
							for i := range buf {
								buf[i] = byte(i*7 + g)
							}
							var cmd scsi.Command
							var resp scsi.Response
							rw16(&cmd, true, off, buf)
							if err := s.Execute(context.Background(), &cmd, &resp); err != nil || resp.Status != scsi.StatusGood {
								errs <- fmt.Errorf("write %d bytes: %v status %v", n, err, resp.Status)
								return
							}
							got := make([]byte, n)
							rw16(&cmd, false, off, got)
							if err := s.Execute(context.Background(), &cmd, &resp); err != nil || resp.Status != scsi.StatusGood {
								errs <- fmt.Errorf("read %d bytes: %v status %v", n, err, resp.Status)
								return
							}
							if !bytes.Equal(got, buf) {
								errs <- fmt.Errorf("read back %d bytes differ", n)
							}
						}(g)
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Error(err)
					}
					if err := s.Close(); err != nil {
						t.Errorf("close: %v", err)
					}
					<-done
					if imm == "No" && r2t == "Yes" && dt.r2ts == 0 {
						t.Error("no R2T was issued")
					}
				})
			}
		}
	}
}

// TestCommandWindow checks that commands wait while the window is closed (CmdSN > MaxCmdSN),
// are sent in CmdSN order once the target opens it, that a waiting command honours its context,
// that immediate pings pass a closed window, and that a target's NOP-In ping is answered.
func TestCommandWindow(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	f.maxCmdSN = 1 // login ends with ExpCmdSN 1, MaxCmdSN 1: room for exactly one command
	f.window = 0   // after each command: MaxCmdSN = ExpCmdSN - 1 (closed)
	type seen struct {
		cmdSN uint32
		op    pdu.Opcode
		itt   uint32
	}
	events := make(chan seen, 16)
	var pending []uint32
	pinged := false
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		b := &p.bhs
		events <- seen{b.CmdSN(), b.Opcode(), b.ITT()}
		switch b.Opcode() {
		case pdu.OpSCSICommand:
			pending = append(pending, b.ITT())
			if !pinged {
				// Ping the initiator while its window is closed.
				pinged = true
				var r pdu.BHS
				pdu.EncodeNOPIn(&r, 4, 0x77, pdu.ReservedTag, 0xabcd, f.sns())
				return f.write(&r, []byte("ping"))
			}
			return nil
		case pdu.OpNOPOut:
			if b.ITT() == pdu.ReservedTag {
				if b.TTT() != 0xabcd || !bytes.Equal(p.data, []byte("ping")) || b.LUN() != 0x77 || !b.Immediate() {
					return fmt.Errorf("bad NOP-Out answer: TTT %x LUN %x data %q", b.TTT(), b.LUN(), p.data)
				}
				return nil
			}
			// The initiator's own ping (immediate: allowed in a closed window). Answer it, then
			// answer the pending command and open the window by one.
			var r pdu.BHS
			pdu.EncodeNOPIn(&r, len(p.data), 0, b.ITT(), pdu.ReservedTag, f.sns())
			f.statSN++
			if err := f.write(&r, p.data); err != nil {
				return err
			}
			for len(pending) > 0 {
				itt := pending[0]
				pending = pending[1:]
				f.maxCmdSN = f.expCmdSN
				if err := f.respond(itt, 0, nil, 0, 0); err != nil {
					return err
				}
			}
			return nil
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

	ping := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Ping(ctx, []byte("are you there")); err != nil {
			t.Fatalf("ping: %v", err)
		}
		if ev := <-events; ev.op != pdu.OpNOPOut || ev.itt == pdu.ReservedTag {
			t.Fatalf("expected our ping, got %v ITT %x", ev.op, ev.itt)
		}
	}

	first := make(chan error, 1)
	go func() {
		var resp scsi.Response
		first <- s.Execute(context.Background(), tur(), &resp)
	}()
	if ev := <-events; ev.op != pdu.OpSCSICommand || ev.cmdSN != 1 {
		t.Fatalf("first PDU %v CmdSN %d", ev.op, ev.cmdSN)
	}
	if ev := <-events; ev.op != pdu.OpNOPOut || ev.itt != pdu.ReservedTag {
		t.Fatalf("expected the answer to the target's ping, got %v", ev.op)
	}
	// The window is closed and nobody opens it: a command gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	var resp scsi.Response
	err := s.Execute(ctx, tur(), &resp)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("command in a closed window: %v", err)
	}
	ping()
	if err := <-first; err != nil {
		t.Fatalf("first command: %v", err)
	}
	// The window opens by one per response: commands go one at a time, in CmdSN order.
	results := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			var resp scsi.Response
			results <- s.Execute(context.Background(), tur(), &resp)
		}()
	}
	for i := 0; i < 3; i++ {
		ev := <-events
		if ev.op != pdu.OpSCSICommand || ev.cmdSN != uint32(2+i) {
			t.Fatalf("command %d: %v CmdSN %d", i, ev.op, ev.cmdSN)
		}
		ping()
		if err := <-results; err != nil {
			t.Fatalf("command: %v", err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	<-done
}
