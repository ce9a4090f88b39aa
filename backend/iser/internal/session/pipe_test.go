package session

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// newFakeTCP is newFake over a loopback TCP connection: a real socket, so the session's
// transport can splice from it (transport.PipeReader).
func newFakeTCP(t testing.TB, d *pipeDialer, portal string, keys map[string]string) *fakeTarget {
	a, b := fdtest.TCPPair(t)
	return attachFake(t, d, portal, keys, a, b)
}

// read16n builds READ(16) of n bytes at off with no data buffer (the data goes to a pipe).
func read16n(cmd *scsi.Command, off int64, n int) {
	*cmd = scsi.Command{LUN: scsi.EncodeLUN(1), CDBLen: 16, Attr: scsi.AttrSimple, Dir: scsi.DirRead}
	cmd.CDB[0] = 0x88
	binary.BigEndian.PutUint64(cmd.CDB[2:10], uint64(off/512))
	binary.BigEndian.PutUint32(cmd.CDB[10:14], uint32(n/512))
}

func TestSubmitToPipe(t *testing.T) {
	senseMedium := []byte{0x70, 0, 0x03, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11, 0x00, 0, 0, 0, 0}
	cases := []struct {
		name     string
		pipeSize int
		n        int
		inSeg    int // Data-In segment size of the target
		// failWith, if set, answers the READ instead of the data target.
		failWith func(f *fakeTarget, b *pdu.BHS) error
		check    func(t *testing.T, err error, resp *scsi.Response, got, want []byte)
	}{
		{name: "many Data-In PDUs", pipeSize: 1 << 20, n: 256 << 10, inSeg: 8192,
			check: func(t *testing.T, err error, resp *scsi.Response, got, want []byte) {
				if err != nil || resp.Status != scsi.StatusGood || resp.Residual != 0 {
					t.Fatalf("%v status %v residual %d", err, resp.Status, resp.Residual)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("pipe holds %d bytes, not the %d read", len(got), len(want))
				}
			}},
		{name: "odd segments", pipeSize: 1 << 20, n: 64 << 10, inSeg: 3000,
			check: func(t *testing.T, err error, resp *scsi.Response, got, want []byte) {
				if err != nil || resp.Status != scsi.StatusGood || !bytes.Equal(got, want) {
					t.Fatalf("%v status %v, %d bytes", err, resp.Status, len(got))
				}
			}},
		{name: "CHECK CONDITION", pipeSize: 1 << 20, n: 8192, inSeg: 8192,
			failWith: func(f *fakeTarget, b *pdu.BHS) error {
				return f.respond(b.ITT(), uint8(scsi.StatusCheckCondition), senseMedium, 0, 0)
			},
			check: func(t *testing.T, err error, resp *scsi.Response, got, _ []byte) {
				if err != nil || resp.Status != scsi.StatusCheckCondition || resp.SenseLen == 0 {
					t.Fatalf("%v status %v sense %d bytes", err, resp.Status, resp.SenseLen)
				}
				if len(got) != 0 {
					t.Fatalf("pipe holds %d bytes", len(got))
				}
			}},
		{name: "connection loss", pipeSize: 1 << 20, n: 8192, inSeg: 8192,
			failWith: func(f *fakeTarget, b *pdu.BHS) error {
				// Half the data, then the target dies.
				var r pdu.BHS
				pdu.EncodeDataIn(&r, 0, 0, 4096, b.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
				if err := f.write(&r, make([]byte, 4096)); err != nil {
					return err
				}
				f.nc.Close()
				return errStopServing
			},
			check: func(t *testing.T, err error, _ *scsi.Response, _, _ []byte) {
				var ce *ConnError
				if !errors.As(err, &ce) {
					t.Fatalf("%v, want a ConnError", err)
				}
			}},
		{name: "pipe full", pipeSize: 4096, n: 64 << 10, inSeg: 8192,
			check: func(t *testing.T, err error, resp *scsi.Response, got, want []byte) {
				if !errors.Is(err, transport.ErrPipeFull) {
					t.Fatalf("%v, want ErrPipeFull", err)
				}
				if len(got) > 4096 || !bytes.Equal(got, want[:len(got)]) {
					t.Fatalf("pipe holds %d bytes that are not the data's start", len(got))
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			keys := map[string]string{"ImmediateData": "Yes", "MaxRecvDataSegmentLength": "262144"}
			d := &pipeDialer{}
			f := newFakeTCP(t, d, "fake:3260", keys)
			dt := newDataTarget(t, keys, 1<<20)
			dt.inSeg = tc.inSeg
			for i := range dt.disk.data {
				dt.disk.data[i] = byte(i*5 + i>>9)
			}
			f.serve(func(f *fakeTarget, p wirePDU) error {
				if tc.failWith != nil && p.bhs.Opcode() == pdu.OpSCSICommand && p.bhs.CDB()[0] == 0x88 &&
					p.bhs.ExpectedDataTransferLength() == uint32(tc.n) {
					return tc.failWith(f, &p.bhs)
				}
				return dt.handle(f, p)
			})
			s := newTestSession(t, d, nil)
			mustLogin(t, s)
			pr, pw := fdtest.Pipe(t, tc.pipeSize)
			const off = 128 << 10
			var cmd scsi.Command
			var resp scsi.Response
			read16n(&cmd, off, tc.n)
			done := newCompletion()
			if !s.SubmitToPipe(&cmd, tc.n, pw, &resp, done) {
				t.Fatal("SubmitToPipe declined on a loopback TCP session")
			}
			s.Kick()
			err := done.wait(t)
			tc.check(t, err, &resp, fdtest.Drain(t, pr), dt.disk.data[off:off+tc.n])
			if tc.name == "connection loss" {
				return
			}
			// The connection is still in sync: an ordinary read works.
			buf := make([]byte, 4096)
			rw16(&cmd, false, 0, buf)
			if err := s.Execute(t.Context(), &cmd, &resp); err != nil || !bytes.Equal(buf, dt.disk.data[:4096]) {
				t.Fatalf("read after: %v", err)
			}
		})
	}
}

// TestSubmitToPipeDeclines: where the data cannot be spliced, SubmitToPipe sends nothing.
func TestSubmitToPipeDeclines(t *testing.T) {
	cases := []struct {
		name string
		tcp  bool
		keys map[string]string
		cmd  func(*scsi.Command)
	}{
		{name: "net.Pipe transport (no fd)", tcp: false, keys: map[string]string{}},
		{name: "data digest", tcp: true, keys: map[string]string{"DataDigest": "CRC32C"}},
		{name: "DataPDUInOrder=No", tcp: true, keys: map[string]string{"DataPDUInOrder": "No"}},
		{name: "a command with a buffer", tcp: true, keys: map[string]string{},
			cmd: func(c *scsi.Command) { rw16(c, false, 0, make([]byte, 4096)) }},
		{name: "a write", tcp: true, keys: map[string]string{},
			cmd: func(c *scsi.Command) { rw16(c, true, 0, nil) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &pipeDialer{}
			var f *fakeTarget
			if tc.tcp {
				f = newFakeTCP(t, d, "fake:3260", tc.keys)
			} else {
				f = newFake(t, d, "fake:3260", tc.keys)
			}
			dt := newDataTarget(t, tc.keys, 1<<20)
			f.serve(dt.handle)
			s := newTestSession(t, d, func(c *Config) {
				c.Proposal = login.DefaultProposal()
				if tc.keys["DataDigest"] != "" {
					c.Proposal.DataDigest = login.DigestCRC32C
				}
				if tc.keys["DataPDUInOrder"] == "No" {
					c.Proposal.DataPDUInOrder = false
				}
			})
			mustLogin(t, s)
			_, pw := fdtest.Pipe(t, 1<<16)
			var cmd scsi.Command
			read16n(&cmd, 0, 4096)
			if tc.cmd != nil {
				tc.cmd(&cmd)
			}
			var resp scsi.Response
			if s.SubmitToPipe(&cmd, 4096, pw, &resp, newCompletion()) {
				t.Fatal("SubmitToPipe accepted")
			}
			// Nothing was queued: the session still works.
			buf := make([]byte, 4096)
			rw16(&cmd, false, 0, buf)
			if err := s.Execute(t.Context(), &cmd, &resp); err != nil {
				t.Fatal(err)
			}
		})
	}
}
