//go:build vm && cgo && linux && !nordma

package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/pool"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

const testInitiator = "iqn.2026-11.io.iser-blk:rdma-test"

// vmTarget starts an LIO target with iSER on soft-RoCE in the guest (test/vm/guest/lio-target.sh).
func vmTarget(t *testing.T) vmtest.LIOTarget {
	t.Helper()
	vmtest.Require(t)
	return vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: 64})
}

// miniSession drives one logged-in iSER connection with one command at a time: enough to prove
// the transport (login, SCSI command with STags, responses, reposting) without the session package.
type miniSession struct {
	t         *testing.T
	ic        *ISERConn
	p         *login.Params
	cmdSN     uint32
	expStatSN uint32
	itt       uint32
}

func loginISER(t *testing.T, ctx context.Context, portal, iqn string, p *pool.Pool) (*miniSession, error) {
	ic, err := DialISER(ctx, portal, Options{Pool: p})
	if err != nil {
		return nil, err
	}
	// every read and send of this hand-driven session is bounded: a silent target fails the test
	if dl, ok := ctx.Deadline(); ok {
		ic.SetDeadline(dl)
	}
	params, err := login.Login(ctx, ic, &login.Config{
		InitiatorName: testInitiator, TargetName: iqn, ISID: 0x023d00000001, CmdSN: 1, ITT: 0x1000,
		Hook: ic.LoginHook(),
	})
	if err != nil {
		ic.Close()
		return nil, err
	}
	if err := ic.Start(params); err != nil {
		ic.Close()
		return nil, err
	}
	return &miniSession{t: t, ic: ic, p: params, cmdSN: params.ExpCmdSN, expStatSN: params.StatSN + 1, itt: 1}, nil
}

// exec runs one command; immediate bytes of a write ride in the command PDU.
func (s *miniSession) exec(cmd *scsi.Command, immediate int) (*pdu.BHS, error) {
	s.itt++
	var bhs pdu.BHS
	c := pdu.SCSICommand{Final: true, Read: cmd.Dir == scsi.DirRead, Write: cmd.Dir == scsi.DirWrite,
		Attr: uint8(scsi.AttrSimple), DataSegmentLength: immediate, LUN: cmd.LUN, ITT: s.itt,
		ExpectedDataTransferLength: uint32(len(cmd.Data)), CmdSN: s.cmdSN, ExpStatSN: s.expStatSN,
		CDB: cmd.CDB[:cmd.CDBLen]}
	c.Encode(&bhs)
	s.cmdSN++
	task := transport.Task{ITT: s.itt, Dir: cmd.Dir, Buf: cmd.Data, Immediate: immediate, Unsolicited: immediate}
	if err := s.ic.WriteCommand(&bhs, nil, &task); err != nil {
		return nil, err
	}
	defer s.ic.TaskDone(s.itt)
	for {
		var r pdu.BHS
		if _, err := s.ic.ReadHeader(&r); err != nil {
			return nil, err
		}
		if r.DataSegmentLength() > 0 {
			if err := s.ic.DiscardData(); err != nil {
				return nil, err
			}
		}
		switch r.Opcode() {
		case pdu.OpSCSIResponse:
			s.expStatSN = r.StatSN() + 1
			if r.ITT() != s.itt {
				return nil, fmt.Errorf("response for ITT %#x, want %#x", r.ITT(), s.itt)
			}
			if r.Response() != 0 || r.Status() != 0 {
				return &r, fmt.Errorf("command %#02x: response %d status %#02x", cmd.CDB[0], r.Response(), r.Status())
			}
			return &r, nil
		case pdu.OpNOPIn, pdu.OpAsyncMessage:
			continue
		default:
			return nil, fmt.Errorf("unexpected %v", r.Opcode())
		}
	}
}

func newTestPool(t *testing.T) *pool.Pool {
	t.Helper()
	p, err := pool.New(pool.Config{MaxBytes: 64 << 20, MaxClass: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() }) // after the test's connections are closed (deferred)
	return p
}

func TestISERLoginAndIO(t *testing.T) {
	tg := vmTarget(t)
	portal, iqn := tg.Portal, tg.IQN
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := newTestPool(t)
	before := Stats()

	s, err := loginISER(t, ctx, portal, iqn, p)
	if err != nil {
		t.Fatalf("iSER login to %s %s: %v", portal, iqn, err)
	}
	t.Logf("negotiated: IRDSL=%s TRDSL=%s MOU=%s ImmediateData=%v InitialR2T=%v FirstBurst=%d MaxCmdSN-ExpCmdSN=%d",
		s.p.Extra[keyInitiatorRecvDSL], s.p.Extra[keyTargetRecvDSL], s.p.Extra[keyMaxOutstandingUnex],
		s.p.ImmediateData, s.p.InitialR2T, s.p.FirstBurstLength, s.p.MaxCmdSN-s.p.ExpCmdSN)
	if s.p.Extra[keyRDMAExtensions] != "Yes" {
		t.Fatalf("RDMAExtensions not negotiated: %v", s.p.Extra)
	}

	// INQUIRY into a Go-heap buffer: bounced through the pool.
	var cmd scsi.Command
	inq := make([]byte, 96)
	cmd.Inquiry(inq)
	if _, err := s.exec(&cmd, 0); err != nil {
		t.Fatalf("INQUIRY: %v", err)
	}
	if s.ic.Bounces.Load() != 1 {
		t.Fatalf("bounces after a heap-buffer INQUIRY: %d, want 1", s.ic.Bounces.Load())
	}
	t.Logf("INQUIRY: vendor %q product %q", bytes.TrimSpace(inq[8:16]), bytes.TrimSpace(inq[16:32]))
	if string(bytes.TrimSpace(inq[8:16])) == "" {
		t.Fatalf("INQUIRY returned no vendor: % x", inq[:36])
	}
	capb, _ := p.Get(ctx, 32)
	cmd.ReadCapacity16(capb)
	if _, err := s.exec(&cmd, 0); err != nil {
		t.Fatalf("READ CAPACITY(16): %v", err)
	}
	capy, err := scsi.ParseReadCapacity16(capb)
	p.Put(capb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capacity: %d blocks of %d bytes", capy.Blocks(), capy.BlockSize)
	bs := int(capy.BlockSize)

	regsBefore := Stats().MRRegistrations
	// Writes and reads straight from/into pool buffers, several sizes, including one with
	// immediate data (second SGE of the command Send).
	sizes := []int{4 << 10, 64 << 10, 512 << 10, 8 << 10, 128 << 10}
	var lba uint64
	for i, n := range sizes {
		wbuf, err := p.Get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		rand.Read(wbuf)
		imm := 0
		if s.p.ImmediateData && i == 3 {
			imm = min(n, int(s.p.FirstBurstLength), int(s.p.TargetMaxRecvDataSegmentLength))
		}
		cmd.Write16(lba, uint32(n/bs), false, wbuf)
		if _, err := s.exec(&cmd, imm); err != nil {
			t.Fatalf("WRITE(16) %d bytes (immediate %d): %v", n, imm, err)
		}
		rbuf, _ := p.Get(ctx, n)
		clear(rbuf)
		cmd.Read16(lba, uint32(n/bs), false, rbuf)
		if _, err := s.exec(&cmd, 0); err != nil {
			t.Fatalf("READ(16) %d bytes: %v", n, err)
		}
		if !bytes.Equal(rbuf, wbuf) {
			t.Fatalf("%d-byte read differs from what was written (immediate %d)", n, imm)
		}
		// and the bounced path: a heap buffer reading the same blocks
		hbuf := make([]byte, n)
		cmd.Read16(lba, uint32(n/bs), false, hbuf)
		if _, err := s.exec(&cmd, 0); err != nil {
			t.Fatalf("READ(16) into a heap buffer: %v", err)
		}
		if !bytes.Equal(hbuf, wbuf) {
			t.Fatalf("%d-byte bounced read differs", n)
		}
		p.Put(wbuf)
		p.Put(rbuf)
		lba += uint64(n / bs)
	}
	// Registration happens per region, never per I/O: any increase is exactly the regions the
	// pool mapped meanwhile.
	regsAfter := Stats().MRRegistrations
	st := p.Stats()
	t.Logf("MR registrations: %d before I/O, %d after %d commands; pool regions %d; bounces %d",
		regsBefore, regsAfter, 3*len(sizes), st.Regions, s.ic.Bounces.Load())
	if regsAfter-before.MRRegistrations != int64(st.Regions)+1 {
		t.Fatalf("registrations %d, want pool regions (%d) + 1 descriptor MR", regsAfter-before.MRRegistrations, st.Regions)
	}

	// A pool installed with SetPool after the connection exists is registered with it at once:
	// its buffers go to the target without a bounce.
	p2 := newTestPool(t)
	b2, err := p2.Get(ctx, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := SetPool(p2); err != nil {
		t.Fatalf("SetPool on a live connection: %v", err)
	}
	defer SetPool(nil)
	bouncesBefore := s.ic.Bounces.Load()
	cmd.Read16(0, uint32(len(b2)/bs), false, b2)
	if _, err := s.exec(&cmd, 0); err != nil {
		t.Fatalf("READ(16) into a buffer of a pool added later: %v", err)
	}
	if n := s.ic.Bounces.Load() - bouncesBefore; n != 0 {
		t.Fatalf("a buffer of the pool added with SetPool bounced (%d bounces)", n)
	}
	p2.Put(b2)

	if err := s.ic.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	after := Stats()
	if after.LiveQPs != before.LiveQPs || after.LiveMRs != before.LiveMRs || after.LiveCQs != before.LiveCQs || after.LivePDs != before.LivePDs {
		t.Fatalf("leak: before %+v after %+v", before, after)
	}
	for _, kind := range []string{"qp", "cq", "mr", "pd"} {
		if n := rdmaResCount(t, kind); n != 0 {
			out, _ := exec.Command("rdma", "res", "show", kind).CombinedOutput()
			t.Errorf("after close, rdma res show %s lists %d of ours:\n%s", kind, n, out)
		}
	}
}

func TestISERErrors(t *testing.T) {
	tg := vmTarget(t)
	portal, iqn, addr := tg.Portal, tg.IQN, tg.Addr
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := newTestPool(t)

	// LIO answers an unknown IQN on an iSER portal with a login reject, and sometimes tears the
	// connection down before that reject's Send completes: either way the error says so.
	_, err := loginISER(t, ctx, portal, iqn+".wrong", p)
	var le *login.Error
	if !errors.As(err, &le) && !(errors.Is(err, ErrDisconnected) && strings.Contains(err.Error(), "during login")) {
		t.Fatalf("wrong IQN: %v (%T), want a *login.Error or a disconnect during login", err, err)
	}
	t.Logf("wrong IQN: %v", err)

	_, err = loginISER(t, ctx, addr+":3299", iqn, p)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("no listener: %v, want ErrRefused", err)
	}
	t.Logf("refused: %v", err)

	_, err = loginISER(t, ctx, "192.0.2.1:3260", iqn, p)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("unreachable: %v, want ErrUnreachable", err)
	}
	t.Logf("unreachable: %v", err)

	// the target drops the connection mid-I/O: disable the TPG while reads are in flight
	tpg := "/sys/kernel/config/target/iscsi/" + iqn + "/tpgt_1"
	s, err := loginISER(t, ctx, portal, iqn, p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ic.Close()
	errc := make(chan error, 1)
	go func() {
		buf, _ := p.Get(ctx, 256<<10)
		defer p.Put(buf)
		var cmd scsi.Command
		for {
			cmd.Read16(0, uint32(len(buf)/512), false, buf)
			if _, err := s.exec(&cmd, 0); err != nil {
				errc <- err
				return
			}
		}
	}()
	if out, err := exec.Command("sh", "-c", "echo 0 > "+tpg+"/enable").CombinedOutput(); err != nil {
		t.Fatalf("disable TPG: %v %s", err, out)
	}
	defer exec.Command("sh", "-c", "echo 1 > "+tpg+"/enable").Run()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrDisconnected) {
			t.Fatalf("connection dropped by the target: %v, want ErrDisconnected", err)
		}
		t.Logf("dropped mid-I/O: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("I/O did not fail within 60 s after the target dropped the connection")
	}
}

// TestISERTgtLoginAndIO is the same transport check against tgt's userspace iSER target, which
// forces InitialR2T=Yes and ImmediateData=No and caps commands at 512 KiB.
func TestISERTgtLoginAndIO(t *testing.T) {
	vmtest.Require(t)
	tg := vmtest.StartTgt(t, vmtest.TgtOptions{SizeMiB: 64, Initiators: []string{testInitiator}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	defer func() {
		if t.Failed() {
			out, _ := exec.Command("sh", "-c", "tail -30 /run/iserblk-tgt/tgtd.log; dmesg | tail -20").CombinedOutput()
			t.Logf("tgtd log and dmesg:\n%s", out)
		}
	}()
	p := newTestPool(t)
	s, err := loginISER(t, ctx, tg.ISERPortal, tg.IQN, p)
	if err != nil {
		t.Fatalf("iSER login to tgt %s %s: %v", tg.ISERPortal, tg.IQN, err)
	}
	defer s.ic.Close()
	t.Logf("negotiated with tgt: %v ImmediateData=%v InitialR2T=%v", s.p.Extra, s.p.ImmediateData, s.p.InitialR2T)
	if s.p.ImmediateData || !s.p.InitialR2T {
		t.Errorf("tgt should force ImmediateData=No, InitialR2T=Yes: got %v, %v", s.p.ImmediateData, s.p.InitialR2T)
	}
	var cmd scsi.Command
	cmd.LUN = scsi.EncodeLUN(uint16(tg.LUN))
	// the first command to a fresh tgt LUN gets UNIT ATTENTION (power on): TEST UNIT READY
	// takes it, as every initiator does after login
	cmd.TestUnitReady()
	if r, err := s.exec(&cmd, 0); err != nil && (r == nil || r.Status() != uint8(scsi.StatusCheckCondition)) {
		t.Fatalf("TEST UNIT READY: %v", err)
	}
	capb, _ := p.Get(ctx, 32)
	cmd.ReadCapacity16(capb)
	if _, err := s.exec(&cmd, 0); err != nil {
		t.Fatalf("READ CAPACITY(16): %v", err)
	}
	capy, err := scsi.ParseReadCapacity16(capb)
	p.Put(capb)
	if err != nil {
		t.Fatal(err)
	}
	bs := int(capy.BlockSize)
	for _, n := range []int{4 << 10, 512 << 10, 64 << 10} {
		wbuf, _ := p.Get(ctx, n)
		rand.Read(wbuf)
		cmd.Write16(0, uint32(n/bs), false, wbuf)
		if _, err := s.exec(&cmd, 0); err != nil {
			t.Fatalf("WRITE(16) %d bytes: %v", n, err)
		}
		rbuf, _ := p.Get(ctx, n)
		clear(rbuf)
		cmd.Read16(0, uint32(n/bs), false, rbuf)
		if _, err := s.exec(&cmd, 0); err != nil {
			t.Fatalf("READ(16) %d bytes: %v", n, err)
		}
		if !bytes.Equal(rbuf, wbuf) {
			t.Fatalf("%d-byte read from tgt differs from what was written", n)
		}
		p.Put(wbuf)
		p.Put(rbuf)
	}
}

// TestISERConnAckTimeout: Options.AckTimeout reaches the iSER connection's queue pair (and,
// through the connect request, the target's: TestAckTimeoutReachesPeer); 0 keeps rdma_cm's.
func TestISERConnAckTimeout(t *testing.T) {
	tg := vmTarget(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct{ set, want int }{{0, 17}, {20, 20}} {
		ic, err := DialISER(ctx, tg.Portal, Options{AckTimeout: uint8(tc.set)})
		if err != nil {
			t.Fatalf("dial %s: %v", tg.Portal, err)
		}
		got, err := ic.c.AckTimeout()
		ic.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("Options.AckTimeout %d: QP ACK timeout exponent %d, want %d", tc.set, got, tc.want)
		}
	}
}
