// Package iscsitest is an in-process iSCSI target for tests (RFC 7143 over TCP on loopback): a
// plain login (AuthMethod None), the full-feature phase with SCSI commands executed by a
// scsitest.LUN (Data-In, R2T/Data-Out, SCSI Response with sense), NOP, TMF, Text and Logout —
// and, on demand, a misbehaving target: the next read is answered with a bad PDU (wrong ITT, data
// beyond the buffer, bad header or data digest, an opcode a target never sends). A correct
// initiator must treat each as a connection error (§7.1.4.1 at ERL 0), drop the connection and
// log in again; the fake then serves the new connection correctly.
//
// A discovery session's SendTargets reports Options.Advertise as the target's portals.
//
// FaultHang leaves a READ unanswered, to exercise command timeouts: ABORT TASK and LOGICAL UNIT
// RESET are answered "function complete".
//
// Every bad PDU carries Poison bytes, so a test can assert that none of them reached a client.
//
// It is test infrastructure: one goroutine per connection, allocation per PDU, no limits beyond
// what a test needs. Like net/http/httptest it is a public package, for the tests outside
// backend/iser (test/e2e/recovery); it lives inside backend/iser because it speaks the internal
// PDU and login codecs.
package iscsitest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// Fault is a misbehaviour injected into the answer to one READ command.
type Fault int

// Faults.
const (
	FaultNone             Fault = iota
	FaultWrongITT               // Data-In for an ITT the initiator never used
	FaultDataBeyondBuffer       // Data-In at an offset past the command's buffer
	FaultBadHeaderDigest        // Data-In whose header digest is wrong (needs Digests)
	FaultBadDataDigest          // Data-In whose data digest is wrong (needs Digests)
	FaultWrongOpcode            // a PDU with an initiator opcode (SCSI Command) sent by the target
	FaultWrongDataSN            // Data-In with DataSN out of sequence
	FaultHang                   // no answer at all (until ABORT TASK / LOGICAL UNIT RESET)
)

func (f Fault) String() string {
	return [...]string{"none", "wrong ITT", "data beyond the buffer", "bad header digest", "bad data digest",
		"wrong opcode", "wrong DataSN", "hang"}[f]
}

// PoisonByte fills the data segment of every bad PDU.
const PoisonByte = 0xEE

// Options configure a Target.
type Options struct {
	// Name is the target IQN (default iqn.2026-11.io.iser-blk:fake).
	Name string
	// Digests makes the target accept CRC32C header and data digests when offered.
	Digests bool
	// Advertise lists the portals ("host:port") a SendTargets discovery reports for Name
	// (default: this target's own address).
	Advertise []string
}

// Target is a running fake target.
type Target struct {
	Addr string // 127.0.0.1:PORT
	Name string
	lun  *scsitest.LUN
	opts Options

	ln     net.Listener
	faults chan Fault // consumed by READ commands, one per command
	logins atomic.Int64
	bad    atomic.Int64 // bad PDUs sent

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on a loopback port and serves lun until Close.
func Start(lun *scsitest.LUN, opts Options) (*Target, error) {
	if opts.Name == "" {
		opts.Name = "iqn.2026-11.io.iser-blk:fake"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Target{Addr: ln.Addr().String(), Name: opts.Name, lun: lun, opts: opts, ln: ln,
		faults: make(chan Fault, 64), conns: map[net.Conn]struct{}{}}
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// URL is the iscsi:// URL of LUN lun.
func (t *Target) URL(lun int) string { return fmt.Sprintf("iscsi://%s/%s/%d", t.Addr, t.Name, lun) }

// Inject queues a fault for the next READ command (faults are used in order, one per READ).
func (t *Target) Inject(f Fault) { t.faults <- f }

// Logins counts completed logins (a re-established connection adds one).
func (t *Target) Logins() int64 { return t.logins.Load() }

// BadPDUs counts the faults acted on (bad PDUs sent, READs left hanging).
func (t *Target) BadPDUs() int64 { return t.bad.Load() }

// Close stops listening and closes every connection.
func (t *Target) Close() error {
	err := t.ln.Close()
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

func (t *Target) accept() {
	defer t.wg.Done()
	for {
		nc, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		t.conns[nc] = struct{}{}
		t.mu.Unlock()
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			c := &conn{t: t, nc: nc, statSN: 1, maxRecv: 8192}
			_ = c.serve()
			nc.Close()
			t.mu.Lock()
			delete(t.conns, nc)
			t.mu.Unlock()
		}()
	}
}

// conn is one connection's state.
type conn struct {
	t      *Target
	nc     net.Conn
	hdrDig bool
	datDig bool

	statSN, expCmdSN uint32
	maxRecv          int // the initiator's MaxRecvDataSegmentLength: our Data-In segment bound
	maxBurst         int
	firstBurst       int
	discovery        bool // a SendTargets discovery session (§4.3)
}

type wire struct {
	bhs  pdu.BHS
	data []byte
}

func (c *conn) sns() pdu.TargetHeader {
	return pdu.TargetHeader{StatSN: c.statSN, ExpCmdSN: c.expCmdSN, MaxCmdSN: c.expCmdSN + 63}
}

func (c *conn) read() (wire, error) {
	var p wire
	if _, err := io.ReadFull(c.nc, p.bhs[:]); err != nil {
		return p, err
	}
	if n := p.bhs.TotalAHSLength(); n > 0 {
		if _, err := io.ReadFull(c.nc, make([]byte, n)); err != nil {
			return p, err
		}
	}
	if c.hdrDig {
		var d [4]byte
		if _, err := io.ReadFull(c.nc, d[:]); err != nil {
			return p, err
		}
		if pdu.GetDigest(d[:]) != pdu.HeaderDigest(&p.bhs, nil) {
			return p, errors.New("iscsitest: bad header digest from the initiator")
		}
	}
	if n := p.bhs.DataSegmentLength(); n > 0 {
		buf := make([]byte, pdu.Padded(n))
		if _, err := io.ReadFull(c.nc, buf); err != nil {
			return p, err
		}
		p.data = buf[:n]
		if c.datDig {
			var d [4]byte
			if _, err := io.ReadFull(c.nc, d[:]); err != nil {
				return p, err
			}
			if pdu.GetDigest(d[:]) != pdu.DataDigest(p.data) {
				return p, errors.New("iscsitest: bad data digest from the initiator")
			}
		}
	}
	return p, nil
}

// write sends one PDU; corrupt flips the header or data digest.
func (c *conn) write(bhs *pdu.BHS, data []byte, badHdr, badData bool) error {
	buf := append([]byte(nil), bhs[:]...)
	if c.hdrDig {
		d := pdu.HeaderDigest(bhs, nil)
		if badHdr {
			d = ^d
		}
		buf = binary.LittleEndian.AppendUint32(buf, d)
	}
	if len(data) > 0 {
		buf = append(buf, data...)
		buf = append(buf, pdu.ZeroPad(pdu.PadLen(len(data)))...)
		if c.datDig {
			d := pdu.DataDigest(data)
			if badData {
				d = ^d
			}
			buf = binary.LittleEndian.AppendUint32(buf, d)
		}
	}
	_, err := c.nc.Write(buf)
	return err
}

func (c *conn) serve() error {
	if err := c.login(); err != nil {
		return err
	}
	c.t.logins.Add(1)
	for {
		p, err := c.read()
		if err != nil {
			return err
		}
		if !p.bhs.Immediate() && (p.bhs.Opcode() == pdu.OpSCSICommand) {
			c.expCmdSN = p.bhs.CmdSN() + 1
		}
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			err = c.command(&p)
		case pdu.OpNOPOut:
			if p.bhs.ITT() == pdu.ReservedTag {
				continue // an answer to a ping of ours (we send none) or a bare NOP
			}
			var r pdu.BHS
			pdu.EncodeNOPIn(&r, len(p.data), p.bhs.LUN(), p.bhs.ITT(), pdu.ReservedTag, c.sns())
			c.statSN++
			err = c.write(&r, p.data, false, false)
		case pdu.OpTaskMgmtReq:
			var r pdu.BHS
			pdu.EncodeTaskMgmtResponse(&r, 0, p.bhs.ITT(), c.sns())
			c.statSN++
			err = c.write(&r, nil, false, false)
		case pdu.OpTextReq:
			var text []byte
			if c.discovery && strings.Contains(string(p.data), "SendTargets=") {
				kvs := []login.KeyValue{{Key: "TargetName", Value: c.t.Name}}
				adv := c.t.opts.Advertise
				if len(adv) == 0 {
					adv = []string{c.t.Addr}
				}
				for _, a := range adv {
					kvs = append(kvs, login.KeyValue{Key: "TargetAddress", Value: a + ",1"})
				}
				text = login.EncodeText(nil, kvs)
			}
			var r pdu.BHS
			pdu.EncodeTextResponse(&r, true, false, len(text), p.bhs.ITT(), pdu.ReservedTag, c.sns())
			c.statSN++
			err = c.write(&r, text, false, false)
		case pdu.OpLogoutReq:
			var r pdu.BHS
			pdu.EncodeLogoutResponse(&r, 0, p.bhs.ITT(), c.sns(), 0, 0)
			c.statSN++
			_ = c.write(&r, nil, false, false)
			return nil
		case pdu.OpDataOut:
			// Unsolicited data after the command was answered: ignore.
		default:
			return fmt.Errorf("iscsitest: unexpected %v", p.bhs.Opcode())
		}
		if err != nil {
			return err
		}
	}
}

// command runs one SCSI command on the LUN.
func (c *conn) command(p *wire) error {
	b := &p.bhs
	itt := b.ITT()
	edtl := int(b.ExpectedDataTransferLength())
	flags := b.Flags()
	cmd := scsi.Command{LUN: b.LUN()}
	cmd.CDBLen = uint8(copy(cmd.CDB[:], b.CDB()))
	switch {
	case flags&pdu.FlagWrite != 0:
		cmd.Dir = scsi.DirWrite
	case flags&pdu.FlagRead != 0:
		cmd.Dir = scsi.DirRead
	}
	buf := make([]byte, edtl)
	if cmd.Dir == scsi.DirWrite {
		if err := c.receiveWriteData(p, buf); err != nil {
			return err
		}
	}
	cmd.Data = buf
	var resp scsi.Response
	if err := c.t.lun.Execute(context.Background(), &cmd, &resp); err != nil {
		return err
	}
	if cmd.Dir == scsi.DirRead && isRead(cmd.CDB[0]) {
		select {
		case f := <-c.t.faults:
			if f != FaultNone {
				c.t.bad.Add(1)
				return c.sendFault(f, itt, edtl)
			}
		default:
		}
	}
	if cmd.Dir == scsi.DirRead && resp.Status == scsi.StatusGood {
		return c.sendDataIn(itt, buf[:edtl-int(max(resp.Residual, 0))], resp.Residual)
	}
	var sense []byte
	if resp.SenseLen > 0 {
		sense = binary.BigEndian.AppendUint16(nil, uint16(resp.SenseLen))
		sense = append(sense, resp.Sense[:resp.SenseLen]...)
	}
	var r pdu.BHS
	pdu.EncodeSCSIResponse(&r, 0, 0, uint8(resp.Status), len(sense), itt, c.sns(), 0, 0)
	c.statSN++
	return c.write(&r, sense, false, false)
}

// receiveWriteData fills buf with a write's data: the immediate data p carried, unsolicited
// Data-Out until F (when the command itself did not carry F), then the rest solicited with R2Ts,
// one burst at a time (RFC 7143 §11.8).
func (c *conn) receiveWriteData(p *wire, buf []byte) error {
	b := &p.bhs
	itt, edtl := b.ITT(), len(buf)
	got := copy(buf, p.data)
	for final := b.Final(); !final; {
		n, f, err := c.readDataOut(itt, buf, "unsolicited")
		if err != nil {
			return err
		}
		got, final = got+n, f
	}
	for r2tSN := uint32(0); got < edtl; r2tSN++ {
		n := min(edtl-got, c.maxBurst)
		var r pdu.BHS
		pdu.EncodeR2T(&r, b.LUN(), itt, 0x1000+r2tSN, c.sns(), r2tSN, uint32(got), uint32(n))
		if err := c.write(&r, nil, false, false); err != nil {
			return err
		}
		for want := got + n; got < want; {
			m, _, err := c.readDataOut(itt, buf, "solicited")
			if err != nil {
				return err
			}
			got += m
		}
	}
	return nil
}

// readDataOut reads the next PDU, which must be a Data-Out of itt, into buf at its offset; it
// returns the bytes copied and its F bit. kind ("solicited", "unsolicited") names the wait.
func (c *conn) readDataOut(itt uint32, buf []byte, kind string) (int, bool, error) {
	d, err := c.read()
	if err != nil {
		return 0, false, err
	}
	if d.bhs.Opcode() != pdu.OpDataOut || d.bhs.ITT() != itt {
		return 0, false, fmt.Errorf("iscsitest: %v while waiting for %s data", d.bhs.Opcode(), kind)
	}
	return copy(buf[d.bhs.BufferOffset():], d.data), d.bhs.Final(), nil
}

// sendDataIn sends data in Data-In PDUs of the initiator's MaxRecvDataSegmentLength, the status
// (GOOD, with residual as underflow) in the last (phase collapse, RFC 7143 §11.7).
func (c *conn) sendDataIn(itt uint32, data []byte, residual int64) error {
	n := len(data)
	for off, sn := 0, uint32(0); ; sn++ {
		seg := min(n-off, c.maxRecv)
		last := off+seg >= n
		var r pdu.BHS
		var fl uint8
		var resid uint32
		sns := c.sns()
		if last {
			fl = pdu.FlagFinal | pdu.FlagStatus
			if residual > 0 {
				fl |= pdu.FlagUnderflow
				resid = uint32(residual)
			}
			c.statSN++
		} else {
			sns.StatSN = 0 // reserved without S (§11.7.4)
		}
		pdu.EncodeDataIn(&r, fl, 0, seg, itt, pdu.ReservedTag, sns, sn, uint32(off), resid)
		if err := c.write(&r, data[off:off+seg], false, false); err != nil {
			return err
		}
		off += seg
		if last {
			return nil
		}
	}
}

func isRead(op byte) bool {
	return op == scsi.OpRead10 || op == scsi.OpRead16
}

// sendFault answers a READ with the bad PDU f; every data byte is PoisonByte.
func (c *conn) sendFault(f Fault, itt uint32, edtl int) error {
	if f == FaultHang {
		return nil // the task stays open; a TMF is answered "function complete"
	}
	seg := max(min(edtl, c.maxRecv, 4096), 4)
	poison := make([]byte, seg)
	for i := range poison {
		poison[i] = PoisonByte
	}
	var r pdu.BHS
	final := uint8(pdu.FlagFinal | pdu.FlagStatus)
	sns := c.sns()
	c.statSN++
	switch f {
	case FaultWrongITT:
		pdu.EncodeDataIn(&r, final, 0, seg, itt^0x7fff0000, pdu.ReservedTag, sns, 0, 0, 0)
		return c.write(&r, poison, false, false)
	case FaultDataBeyondBuffer:
		pdu.EncodeDataIn(&r, final, 0, seg, itt, pdu.ReservedTag, sns, 0, uint32(edtl), 0)
		return c.write(&r, poison, false, false)
	case FaultBadHeaderDigest:
		pdu.EncodeDataIn(&r, final, 0, seg, itt, pdu.ReservedTag, sns, 0, 0, 0)
		return c.write(&r, poison, true, false)
	case FaultBadDataDigest:
		pdu.EncodeDataIn(&r, final, 0, seg, itt, pdu.ReservedTag, sns, 0, 0, uint32(edtl-seg))
		if edtl > seg {
			r[1] |= pdu.FlagUnderflow
		}
		return c.write(&r, poison, false, true)
	case FaultWrongOpcode:
		pdu.EncodeDataIn(&r, final, 0, seg, itt, pdu.ReservedTag, sns, 0, 0, 0)
		r[0] = byte(pdu.OpSCSICommand)
		return c.write(&r, poison, false, false)
	case FaultWrongDataSN:
		pdu.EncodeDataIn(&r, final, 0, seg, itt, pdu.ReservedTag, sns, 7, 0, 0)
		return c.write(&r, poison, false, false)
	}
	return fmt.Errorf("iscsitest: unknown fault %d", f)
}

// login runs the login phase: AuthMethod None, operational keys answered with the initiator's
// first offer (digests per Options), TSIH 1.
func (c *conn) login() error {
	c.maxBurst, c.firstBurst = 256<<10, 64<<10
	for {
		p, err := c.read()
		if err != nil {
			return err
		}
		if p.bhs.Opcode() != pdu.OpLoginReq {
			return fmt.Errorf("iscsitest: %v during login", p.bhs.Opcode())
		}
		c.expCmdSN = p.bhs.CmdSN()
		csg, nsg := p.bhs.LoginStages()
		kvs, err := login.DecodeText(p.data)
		if err != nil {
			return err
		}
		out, err := c.answerKeys(kvs)
		if err != nil {
			return err
		}
		if csg == pdu.StageOperational {
			out = append(out, login.KeyValue{Key: "MaxRecvDataSegmentLength", Value: "262144"})
		}
		final := p.bhs.Transit() && nsg == pdu.StageFullFeature
		var tsih uint16
		if final {
			tsih = 1
		}
		text := login.EncodeText(nil, out)
		var r pdu.BHS
		pdu.EncodeLoginResponse(&r, p.bhs.Transit(), false, csg, nsg, len(text), p.bhs.ISID(), tsih, p.bhs.ITT(),
			c.sns(), 0, 0)
		if err := c.write(&r, text, false, false); err != nil {
			return err
		}
		c.statSN++
		if final {
			for _, kv := range out {
				switch kv.Key {
				case "HeaderDigest":
					c.hdrDig = kv.Value == "CRC32C"
				case "DataDigest":
					c.datDig = kv.Value == "CRC32C"
				}
			}
			return nil
		}
	}
}

// answerKeys answers the keys of one Login Request (RFC 7143 §13): no authentication, digests
// as Options.Digests allows, burst lengths no larger than ours, anything else echoed.
func (c *conn) answerKeys(kvs []login.KeyValue) ([]login.KeyValue, error) {
	var out []login.KeyValue
	for _, kv := range kvs {
		first := kv.Value
		if i := strings.IndexByte(first, ','); i >= 0 {
			first = first[:i]
		}
		switch kv.Key {
		case "AuthMethod":
			out = append(out, login.KeyValue{Key: "AuthMethod", Value: "None"})
		case "SessionType":
			c.discovery = kv.Value == "Discovery"
		case "InitiatorName", "InitiatorAlias":
		case "TargetName":
			if kv.Value != c.t.Name {
				return nil, fmt.Errorf("iscsitest: login to unknown target %q", kv.Value)
			}
		case "MaxRecvDataSegmentLength":
			if n, err := strconv.Atoi(kv.Value); err == nil && n > 0 {
				c.maxRecv = n
			}
		case "HeaderDigest", "DataDigest":
			v := "None"
			if c.t.opts.Digests && strings.Contains(kv.Value, "CRC32C") {
				v = "CRC32C"
			}
			out = append(out, login.KeyValue{Key: kv.Key, Value: v})
		case "MaxBurstLength", "FirstBurstLength":
			n, _ := strconv.Atoi(first)
			limit := &c.maxBurst
			if kv.Key == "FirstBurstLength" {
				limit = &c.firstBurst
			}
			*limit = min(max(n, 512), *limit)
			out = append(out, login.KeyValue{Key: kv.Key, Value: strconv.Itoa(*limit)})
		default:
			out = append(out, login.KeyValue{Key: kv.Key, Value: first})
		}
	}
	return out, nil
}
