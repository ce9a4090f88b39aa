package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

// countingDevice wraps a Device, counts flushes and FUA writes, and can fail or block calls.
type countingDevice struct {
	block.Device
	flushes   atomic.Int64
	fuaWrites atomic.Int64
	failWith  error         // returned by every ReadAt/WriteAt when set
	gate      chan struct{} // when set, WriteAt waits for it to close
	entered   chan struct{} // when set, WriteAt signals it on entry (non-blocking)
}

func (d *countingDevice) Flush(ctx context.Context) error {
	d.flushes.Add(1)
	return d.Device.Flush(ctx)
}

func (d *countingDevice) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	if d.entered != nil {
		select {
		case d.entered <- struct{}{}:
		default:
		}
	}
	if d.gate != nil {
		<-d.gate
	}
	if d.failWith != nil {
		return d.failWith
	}
	if f&block.FUA != 0 {
		d.fuaWrites.Add(1)
	}
	return d.Device.WriteAt(ctx, p, off, f)
}

func (d *countingDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	if d.failWith != nil {
		return d.failWith
	}
	return d.Device.ReadAt(ctx, p, off)
}

func newMem(t testing.TB, size int64, url string) *memdev.Device {
	t.Helper()
	if url != "" {
		d, err := memdev.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, err := memdev.New(size, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type fixture struct {
	t    testing.TB
	srv  *Server
	path string
	errc chan error
}

func startServer(t testing.TB, dev block.Device, opts Options) *fixture {
	t.Helper()
	srv, err := NewServer(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, srv: srv, path: path, errc: make(chan error, 1)}
	go func() { f.errc <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-f.errc; !errors.Is(err, errServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return f
}

func (f *fixture) dial() *testClient {
	f.t.Helper()
	nc, err := net.Dial("unix", f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { nc.Close() })
	return newTestClient(f.t, nc)
}

func TestNegotiationAdvertisesDeviceCapabilities(t *testing.T) {
	dev := newMem(t, 64<<20, "")
	f := startServer(t, dev, Options{ExportName: "disk0"})
	c := f.dial().connect(true)
	want := uint16(flagHasFlags | flagSendFlush | flagSendFUA | flagSendTrim | flagSendWriteZeroes |
		flagSendFastZero | FlagCanMultiConn | flagSendCache | flagSendDF)
	if c.flags != want {
		t.Errorf("flags %#x, want %#x", c.flags, want)
	}
	if c.size != 64<<20 {
		t.Errorf("size %d", c.size)
	}
	if c.blockSizes != [3]uint32{512, 4096, MaxPayload} {
		t.Errorf("block sizes %v", c.blockSizes)
	}
	if c.name != "disk0" {
		t.Errorf("name %q", c.name)
	}
}

func TestTransmissionFlagsFollowLimits(t *testing.T) {
	cases := []struct {
		name string
		lim  block.Limits
		ro   bool
		want uint16
	}{
		{"nothing", block.Limits{}, false, flagHasFlags | flagSendCache},
		{"flush only", block.Limits{CanFlush: true}, false, flagHasFlags | flagSendCache | flagSendFlush | flagSendFUA},
		{"read-only drops writes", block.Limits{ReadOnly: true, CanFlush: true, CanDiscard: true, CanWriteZeroes: true},
			false, flagHasFlags | flagSendCache | flagReadOnly | flagSendFlush},
		{"forced read-only", block.Limits{CanDiscard: true}, true, flagHasFlags | flagSendCache | flagReadOnly},
		{"zeroes without fast", block.Limits{CanWriteZeroes: true}, false, flagHasFlags | flagSendCache | flagSendWriteZeroes},
		{"everything", block.Limits{CanFlush: true, CanFUA: true, CanDiscard: true, CanWriteZeroes: true, CanFastZero: true,
			MultiConn: true, Rotational: true}, false,
			flagHasFlags | flagSendCache | flagSendFlush | flagSendFUA | flagSendTrim | flagSendWriteZeroes |
				flagSendFastZero | FlagCanMultiConn | flagRotational},
	}
	for _, tc := range cases {
		if got := transmissionFlags(tc.lim, tc.ro); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

func TestOptionHaggling(t *testing.T) {
	f := startServer(t, newMem(t, 1<<20, ""), Options{ExportName: "exp", Description: "a test"})
	c := f.dial()
	if err := c.greet(cflagFixedNewstyle); err != nil {
		t.Fatal(err)
	}
	expect := func(opt uint32, data []byte, typ uint32) optReplyT {
		t.Helper()
		if err := c.sendOpt(opt, data); err != nil {
			t.Fatal(err)
		}
		r, err := c.readOptReply()
		if err != nil {
			t.Fatal(err)
		}
		if r.opt != opt || r.typ != typ {
			t.Fatalf("option %d: reply %d type %#x (%q), want %#x", opt, r.opt, r.typ, r.data, typ)
		}
		return r
	}
	r := expect(optList, nil, repServer)
	if string(r.data) != "\x00\x00\x00\x03exp" {
		t.Errorf("LIST entry %q", r.data)
	}
	if r, _ = c.readOptReply(); r.typ != repAck {
		t.Errorf("LIST end %#x", r.typ)
	}
	expect(optList, []byte("x"), repErrInvalid)
	expect(99, []byte("whatever"), repErrUnsup)
	expect(optStartTLS, nil, repErrPolicy)
	expect(optSetMetaContext, []byte{0, 0, 0, 0}, repErrUnsup)
	expect(optInfo, goData("nope"), repErrUnknown)
	expect(optInfo, []byte{0, 0, 0, 9, 'a'}, repErrInvalid)
	expect(optStructuredReply, []byte{1}, repErrInvalid)
	// INFO with a description request, then the export is still selectable.
	if err := c.sendOpt(optInfo, goData("exp", infoDescription)); err != nil {
		t.Fatal(err)
	}
	var sawDesc bool
	for {
		r, err := c.readOptReply()
		if err != nil {
			t.Fatal(err)
		}
		if r.typ == repAck {
			break
		}
		if r.typ == repInfo && r.data[1] == infoDescription {
			sawDesc = string(r.data[2:]) == "a test"
		}
	}
	if !sawDesc {
		t.Error("NBD_INFO_DESCRIPTION missing")
	}
	expect(optAbort, nil, repAck)
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Errorf("after ABORT: %v, want EOF", err)
	}
}

func TestExportNameEndsNegotiation(t *testing.T) {
	f := startServer(t, newMem(t, 1<<20, ""), Options{})
	for _, noZeroes := range []bool{false, true} {
		c := f.dial()
		cf := uint32(cflagFixedNewstyle)
		if noZeroes {
			cf |= cflagNoZeroes
		}
		if err := c.greet(cf); err != nil {
			t.Fatal(err)
		}
		if err := c.sendOpt(optExportName, []byte("iser-blk")); err != nil {
			t.Fatal(err)
		}
		n := 10 + 124
		if noZeroes {
			n = 10
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(c.br, b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[:8], []byte{0, 0, 0, 0, 0, 0x10, 0, 0}) {
			t.Errorf("size bytes %x", b[:8])
		}
		c.structured = false
		if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
			t.Errorf("flush errno %d", r.errno)
		}
	}
	// An unknown export name ends the session (it cannot be answered with an error).
	c := f.dial()
	if err := c.greet(cflagFixedNewstyle); err != nil {
		t.Fatal(err)
	}
	if err := c.sendOpt(optExportName, []byte("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Errorf("unknown export: %v, want EOF", err)
	}
}

func TestUnknownClientFlagsCloseConnection(t *testing.T) {
	f := startServer(t, newMem(t, 1<<20, ""), Options{})
	c := f.dial()
	if err := c.greet(1 << 7); err != nil {
		t.Fatal(err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Errorf("got %v, want EOF", err)
	}
}

func TestReadWriteRoundTrip(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			dev := newMem(t, 64<<20, "")
			f := startServer(t, dev, Options{})
			c := f.dial().connect(structured)
			for _, n := range []int{512, 4096, 1 << 20, 3<<20 + 4096, MaxPayload} {
				data := make([]byte, n)
				rand.Read(data)
				off := uint64(8 << 20)
				if r := c.do(cmdWrite, cmdFlagFUA, off, uint32(n), data); r.errno != 0 {
					t.Fatalf("write %d: errno %d", n, r.errno)
				}
				r := c.do(cmdRead, 0, off, uint32(n), nil)
				if r.errno != 0 || !bytes.Equal(r.data, data) {
					t.Fatalf("read %d: errno %d, equal %v", n, r.errno, bytes.Equal(r.data, data))
				}
				if structured && r.off != off {
					t.Fatalf("chunk offset %d", r.off)
				}
				got := make([]byte, n)
				if err := dev.ReadAt(context.Background(), got, int64(off)); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("device content differs (%v)", err)
				}
			}
			if st := dev.Stats(); st.FUAWrites == 0 {
				t.Error("FUA flag did not reach the device")
			}
		})
	}
}

// TestConcurrentOutOfOrder keeps many requests in flight on one connection and checks that every
// reply matches its request, whatever the order.
func TestConcurrentOutOfOrder(t *testing.T) {
	dev := newMem(t, 32<<20, "")
	f := startServer(t, dev, Options{MaxInflight: 16})
	c := f.dial().connect(true)
	const n = 400
	blocks := make([][]byte, n)
	for i := range blocks {
		blocks[i] = bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 2048)
	}
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			if err := c.send(cmdWrite, 0, uint64(i), uint64(i)*4096, 4096, blocks[i]); err != nil {
				errc <- err
				return
			}
		}
		for i := range n {
			if err := c.send(cmdRead, 0, uint64(n+i), uint64(i)*4096, 4096, nil); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	seen := map[uint64]bool{}
	for range 2 * n {
		r, err := c.readReply(nil)
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.handle] {
			t.Fatalf("duplicate reply for %d", r.handle)
		}
		seen[r.handle] = true
		if r.errno != 0 {
			t.Fatalf("handle %d errno %d", r.handle, r.errno)
		}
		if r.handle >= n {
			i := r.handle - n
			if !bytes.Equal(r.data, blocks[i]) && !bytes.Equal(r.data, make([]byte, 4096)) {
				t.Fatalf("read %d returned foreign data", i)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for i := range n {
		got := make([]byte, 4096)
		_ = dev.ReadAt(context.Background(), got, int64(i)*4096)
		if !bytes.Equal(got, blocks[i]) {
			t.Fatalf("block %d lost", i)
		}
	}
}

// TestFlushReachesDevice: a FLUSH from the client is a Flush on the device, after the writes it
// must cover.
func TestFlushReachesDevice(t *testing.T) {
	dev := &countingDevice{Device: newMem(t, 8<<20, "")}
	f := startServer(t, dev, Options{})
	c := f.dial().connect(false)
	if r := c.do(cmdWrite, 0, 0, 4096, make([]byte, 4096)); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if dev.flushes.Load() != 0 {
		t.Fatal("flush before FLUSH")
	}
	for i := 1; i <= 3; i++ {
		if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
			t.Fatalf("flush errno %d", r.errno)
		}
		if got := dev.flushes.Load(); got != int64(i) {
			t.Fatalf("device flushes %d, want %d", got, i)
		}
	}
	// TRIM with FUA must be durable too.
	if r := c.do(cmdTrim, cmdFlagFUA, 0, 4096, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if dev.flushes.Load() != 4 {
		t.Fatalf("TRIM+FUA did not flush")
	}
}

func TestTrimAndWriteZeroes(t *testing.T) {
	dev := newMem(t, 8<<20, "")
	f := startServer(t, dev, Options{})
	c := f.dial().connect(true)
	ones := bytes.Repeat([]byte{1}, 1<<20)
	for _, tc := range []struct {
		cmd, flags uint16
	}{{cmdTrim, 0}, {cmdWriteZeroes, 0}, {cmdWriteZeroes, cmdFlagNoHole}, {cmdWriteZeroes, cmdFlagFastZero}} {
		if r := c.do(cmdWrite, 0, 1<<20, 1<<20, ones); r.errno != 0 {
			t.Fatal(r.errno)
		}
		if r := c.do(tc.cmd, tc.flags, 1<<20+4096, 8192, nil); r.errno != 0 {
			t.Fatalf("cmd %d flags %d: errno %d", tc.cmd, tc.flags, r.errno)
		}
		r := c.do(cmdRead, 0, 1<<20, 16384, nil)
		want := append(append(bytes.Repeat([]byte{1}, 4096), make([]byte, 8192)...), bytes.Repeat([]byte{1}, 4096)...)
		if !bytes.Equal(r.data, want) {
			t.Fatalf("cmd %d: range not zeroed", tc.cmd)
		}
	}
	if r := c.do(cmdCache, 0, 0, 1<<20, nil); r.errno != 0 {
		t.Fatalf("CACHE errno %d", r.errno)
	}
}

// TestLargeTrimIsSplit: a TRIM larger than the device's MaxDiscard is split, not refused (the
// kernel and mkfs send whole-device discards).
func TestLargeTrimIsSplit(t *testing.T) {
	lim := block.Limits{CanDiscard: true, CanWriteZeroes: true, MaxDiscard: 1 << 20, MaxWriteZeroes: 64 << 10, DiscardZeroes: true}
	dev, err := memdev.New(256<<20, memdev.Options{Limits: &lim})
	if err != nil {
		t.Fatal(err)
	}
	f := startServer(t, dev, Options{})
	c := f.dial().connect(false)
	if r := c.do(cmdTrim, 0, 0, 200<<20, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if r := c.do(cmdWriteZeroes, 0, 0, 1<<20, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if st := dev.Stats(); st.Discards != 200 || st.WriteZeroes != 16 {
		t.Errorf("discards %d write-zeroes %d, want 200 and 16", st.Discards, st.WriteZeroes)
	}
}

// TestSmallMaxTransferIsSplit: READ/WRITE larger than the device's MaxTransfer become several
// device calls.
func TestSmallMaxTransferIsSplit(t *testing.T) {
	dev := newMem(t, 0, "mem://16MiB?maxtransfer=64KiB")
	f := startServer(t, dev, Options{})
	c := f.dial().connect(true)
	data := make([]byte, 1<<20)
	rand.Read(data)
	if r := c.do(cmdWrite, 0, 0, 1<<20, data); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if r := c.do(cmdRead, 0, 0, 1<<20, nil); !bytes.Equal(r.data, data) {
		t.Fatal("data differs")
	}
	if st := dev.Stats(); st.Writes != 16 || st.Reads != 16 {
		t.Errorf("writes %d reads %d, want 16 each", st.Writes, st.Reads)
	}
}

func TestDeviceErrorsMapToNBD(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want uint32
	}{
		{block.ErrIO, eio}, {block.ErrNoSpace, enospc}, {block.ErrReadOnly, eperm},
		{block.ErrInvalid, einval}, {block.ErrClosed, eshutdown}, {block.ErrMedium, eio},
		{block.ErrTimeout, eio}, {block.ErrNotSupported, enotsup}, {fmt.Errorf("wrapped: %w", block.ErrNoSpace), enospc},
		{context.Canceled, eio}, {errors.New("other"), eio},
	} {
		if got := wireErrno(tc.err); got != tc.want {
			t.Errorf("wireErrno(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	// And through the wire, for both reply styles: a failing READ sends no data.
	dev := &countingDevice{Device: newMem(t, 1<<20, ""), failWith: fmt.Errorf("lun: %w", block.ErrNoSpace)}
	f := startServer(t, dev, Options{})
	for _, structured := range []bool{false, true} {
		c := f.dial().connect(structured)
		if r := c.do(cmdWrite, 0, 0, 512, make([]byte, 512)); r.errno != enospc {
			t.Errorf("write errno %d", r.errno)
		}
		r := c.do(cmdRead, 0, 0, 512, nil)
		if r.errno != enospc || len(r.data) != 0 {
			t.Errorf("read errno %d data %d", r.errno, len(r.data))
		}
		if structured && r.msg == "" {
			t.Error("structured error without message")
		}
		// The connection still works.
		if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
			t.Errorf("flush after errors: %d", r.errno)
		}
	}
}

// ---- bad input: each of these is an acceptance item ----

func TestBadMagicClosesOnlyThatConnection(t *testing.T) {
	f := startServer(t, newMem(t, 1<<20, ""), Options{})
	good := f.dial().connect(true)
	bad := f.dial().connect(true)
	hdr := make([]byte, requestHeaderLen)
	putRequest(hdr, header{Type: cmdRead, Handle: 1, Length: 512})
	hdr[0] ^= 0xff
	if _, err := bad.nc.Write(hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.br.ReadByte(); err != io.EOF {
		t.Fatalf("bad connection: %v, want EOF", err)
	}
	if r := good.do(cmdRead, 0, 0, 512, nil); r.errno != 0 || len(r.data) != 512 {
		t.Fatalf("other connection broken: %+v", r.errno)
	}
	// And new connections are still accepted.
	if r := f.dial().connect(false).do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
}

func TestOutOfRangeKeepsConnection(t *testing.T) {
	f := startServer(t, newMem(t, 1<<20, ""), Options{})
	for _, structured := range []bool{false, true} {
		c := f.dial().connect(structured)
		cases := []struct {
			name    string
			cmd     uint16
			off     uint64
			length  uint32
			payload []byte
			want    uint32
		}{
			{"read past end", cmdRead, 1<<20 - 512, 1024, nil, einval},
			{"read at huge offset", cmdRead, 1 << 62, 512, nil, einval},
			{"offset+length wraps", cmdRead, ^uint64(0) - 511, 1024, nil, einval},
			{"write past end (spec: ENOSPC)", cmdWrite, 1 << 20, 512, make([]byte, 512), enospc},
			{"trim past end", cmdTrim, 1<<20 - 512, 4096, nil, einval},
			{"zeroes past end", cmdWriteZeroes, 1 << 20, 512, nil, enospc},
			{"misaligned read", cmdRead, 100, 512, nil, einval},
			{"misaligned write", cmdWrite, 0, 100, make([]byte, 100), einval},
			{"zero-length read", cmdRead, 0, 0, nil, einval},
			{"unknown command", 42, 0, 512, nil, einval},
			{"block status without meta context", cmdBlockStatus, 0, 512, nil, einval},
			{"unknown flag", cmdRead, 0, 512, nil, einval},
			{"NO_HOLE on write", cmdWrite, 0, 512, make([]byte, 512), einval},
			{"read over maximum", cmdRead, 0, MaxPayload + 512, nil, einval},
		}
		for _, tc := range cases {
			var flags uint16
			switch tc.name {
			case "unknown flag":
				flags = 1 << 9
			case "NO_HOLE on write":
				flags = cmdFlagNoHole
			}
			r := c.do(tc.cmd, flags, tc.off, tc.length, tc.payload)
			if r.errno != tc.want || len(r.data) != 0 {
				t.Errorf("structured=%v %s: errno %d (data %d), want %d", structured, tc.name, r.errno, len(r.data), tc.want)
			}
			// After each bad request the connection still serves.
			if r := c.do(cmdRead, 0, 0, 512, nil); r.errno != 0 || len(r.data) != 512 {
				t.Fatalf("structured=%v after %s: errno %d", structured, tc.name, r.errno)
			}
		}
		if structured {
			if r := c.do(cmdRead, cmdFlagDF, 0, MaxPayload+512, nil); r.errno != eoverflow {
				t.Errorf("DF read over maximum: errno %d, want EOVERFLOW", r.errno)
			}
		}
	}
}

// TestOversizeWriteClosesConnection: a WRITE whose payload exceeds the maximum block size is a
// denial of service (proto.md "Block size constraints"): the server must not buffer it, and ends
// that connection only.
func TestOversizeWriteClosesConnection(t *testing.T) {
	dev := newMem(t, 1<<30, "")
	f := startServer(t, dev, Options{})
	other := f.dial().connect(false)
	c := f.dial().connect(false)
	if err := c.send(cmdWrite, 0, 1, 0, MaxPayload+4096, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("got %v, want EOF", err)
	}
	if st := dev.Stats(); st.Writes != 0 {
		t.Fatal("oversize write reached the device")
	}
	if r := other.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
}

func TestReadOnlyExport(t *testing.T) {
	dev := newMem(t, 0, "mem://1MiB?ro=1")
	f := startServer(t, dev, Options{})
	c := f.dial().connect(true)
	if c.flags&flagReadOnly == 0 || c.flags&(flagSendTrim|flagSendWriteZeroes|flagSendFUA) != 0 {
		t.Fatalf("flags %#x", c.flags)
	}
	if r := c.do(cmdWrite, 0, 0, 512, make([]byte, 512)); r.errno != eperm {
		t.Errorf("write: errno %d, want EPERM", r.errno)
	}
	if r := c.do(cmdTrim, 0, 0, 512, nil); r.errno != eperm {
		t.Errorf("trim: errno %d, want EPERM", r.errno)
	}
	if r := c.do(cmdRead, 0, 0, 512, nil); r.errno != 0 {
		t.Errorf("read: errno %d", r.errno)
	}
	// ForceReadOnly on a writable device behaves the same.
	f2 := startServer(t, newMem(t, 1<<20, ""), Options{ForceReadOnly: true})
	c2 := f2.dial().connect(false)
	if r := c2.do(cmdWrite, 0, 0, 512, make([]byte, 512)); r.errno != eperm {
		t.Errorf("forced read-only write: errno %d", r.errno)
	}
}

func TestClientVanishingMidPayload(t *testing.T) {
	dev := newMem(t, 8<<20, "")
	f := startServer(t, dev, Options{})
	other := f.dial().connect(true)
	c := f.dial().connect(false)
	hdr := make([]byte, requestHeaderLen)
	putRequest(hdr, header{Type: cmdWrite, Handle: 1, Length: 1 << 20})
	if _, err := c.nc.Write(append(hdr, make([]byte, 1000)...)); err != nil {
		t.Fatal(err)
	}
	c.nc.Close()
	// The server notices, that connection ends, the partial write never reaches the device, and
	// everything else keeps working.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.srv.mu.Lock()
		n := len(f.srv.conns)
		f.srv.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open", n)
		}
		time.Sleep(time.Millisecond) // polling the server's state, not synchronising with it
	}
	if st := dev.Stats(); st.Writes != 0 {
		t.Error("partial payload was written")
	}
	if r := other.do(cmdWrite, 0, 0, 4096, make([]byte, 4096)); r.errno != 0 {
		t.Fatal(r.errno)
	}
}

// TestDiscDrainsInFlight: NBD_CMD_DISC right behind a slow write: the write is still executed and
// answered before the server closes.
func TestDiscDrainsInFlight(t *testing.T) {
	dev := &countingDevice{Device: newMem(t, 1<<20, ""), gate: make(chan struct{})}
	f := startServer(t, dev, Options{})
	c := f.dial().connect(false)
	if err := c.send(cmdWrite, 0, 5, 0, 512, bytes.Repeat([]byte{9}, 512)); err != nil {
		t.Fatal(err)
	}
	if err := c.send(cmdDisc, 0, 6, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	close(dev.gate)
	r, err := c.readReply(nil)
	if err != nil || r.handle != 5 || r.errno != 0 {
		t.Fatalf("write reply %+v %v", r, err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("after DISC: %v", err)
	}
	got := make([]byte, 512)
	_ = dev.ReadAt(context.Background(), got, 0)
	if got[0] != 9 {
		t.Fatal("write lost")
	}
}

// TestShutdownDrainsInFlight: Shutdown waits for a request in progress, answers it, and closes.
func TestShutdownDrainsInFlight(t *testing.T) {
	dev := &countingDevice{Device: newMem(t, 1<<20, ""), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	srv, err := NewServer(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := newTestClient(t, nc).connect(true)
	if err := c.send(cmdWrite, 0, 1, 0, 512, make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	// Wait until the write is blocked in the device.
	<-dev.entered
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(dev.gate)
	r, err := c.readReply(nil)
	if err != nil || r.errno != 0 || r.handle != 1 {
		t.Fatalf("in-flight write: %+v %v", r, err)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, errServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("connection not closed: %v", err)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
}

// TestManyConnections exercises several connections writing disjoint ranges concurrently (the
// multi-conn case) and flushes on one of them.
func TestManyConnections(t *testing.T) {
	dev := &countingDevice{Device: newMem(t, 16<<20, "")}
	f := startServer(t, dev, Options{})
	var wg sync.WaitGroup
	for k := range 4 {
		c := f.dial().connect(k%2 == 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := bytes.Repeat([]byte{byte(k + 1)}, 64<<10)
			for i := range 32 {
				off := uint64(k)*(4<<20) + uint64(i)*(64<<10)
				if err := c.send(cmdWrite, 0, uint64(i), off, 64<<10, buf); err != nil {
					t.Error(err)
					return
				}
			}
			for range 32 {
				if r, err := c.readReply(nil); err != nil || r.errno != 0 {
					t.Errorf("conn %d: %v %d", k, err, r.errno)
					return
				}
			}
		}()
	}
	wg.Wait()
	c := f.dial().connect(false)
	if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 || dev.flushes.Load() != 1 {
		t.Fatalf("flush errno %d flushes %d", r.errno, dev.flushes.Load())
	}
	for k := range 4 {
		r := c.do(cmdRead, 0, uint64(k)*(4<<20), 2<<20, nil)
		if !bytes.Equal(r.data, bytes.Repeat([]byte{byte(k + 1)}, 2<<20)) {
			t.Fatalf("conn %d data wrong", k)
		}
	}
}

// TestBoundedPoolDoesNotDeadlock: many large requests on several connections against a small
// bounded pool complete, because each request reserves its whole payload before taking buffers.
// (The clients read replies while they send, as real clients do: a client that stops reading
// stalls its own replies and the payload memory they hold.)
func TestBoundedPoolDoesNotDeadlock(t *testing.T) {
	p, err := pool.New(pool.Config{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dev := newMem(t, 64<<20, "")
	f := startServer(t, dev, Options{Pool: p, PayloadBudget: 8 << 20})
	var wg sync.WaitGroup
	for k := range 4 {
		c := f.dial().connect(k%2 == 1)
		wg.Add(2)
		go func() {
			defer wg.Done()
			payload := make([]byte, 6<<20)
			for i := range 8 {
				var err error
				if i%2 == 0 {
					err = c.send(cmdWrite, 0, uint64(i), uint64(k)*(16<<20), 6<<20, payload)
				} else {
					err = c.send(cmdRead, 0, uint64(i), uint64(k)*(16<<20), 6<<20, nil)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 8 {
				r, err := c.readReply(func(h uint64) int {
					if h%2 == 1 {
						return 6 << 20
					}
					return 0
				})
				if err != nil || r.errno != 0 {
					t.Errorf("conn %d: %v errno %d", k, err, r.errno)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// captureConn is a net.Conn reading a fixed stream and recording what the server writes.
type captureConn struct {
	streamConn
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

// TestRequestsDuringShutdownGetESHUTDOWN: once the server is shutting down, requests still read
// from a connection are answered with ESHUTDOWN (proto.md "Terminating the transmission phase")
// — a write's payload is consumed, never executed.
func TestRequestsDuringShutdownGetESHUTDOWN(t *testing.T) {
	dev := newMem(t, 1<<20, "")
	srv, err := NewServer(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stream := cat(reqBytes(header{Type: cmdWrite, Handle: 1, Length: 512}, bytes.Repeat([]byte{1}, 512)),
		reqBytes(header{Type: cmdRead, Handle: 2, Length: 512}, nil),
		reqBytes(header{Type: cmdFlush, Handle: 3}, nil))
	nc := &captureConn{streamConn: streamConn{r: bytes.NewReader(stream)}}
	c := newConn(srv, nc)
	c.exp = srv.export(false)
	c.shutting.Store(true)
	c.transmit()
	out := nc.out.Bytes()
	if len(out) != 3*simpleReplyLen {
		t.Fatalf("%d reply bytes, want 3 simple replies", len(out))
	}
	for i := range 3 {
		r := out[i*simpleReplyLen:]
		if e := uint32(r[4])<<24 | uint32(r[5])<<16 | uint32(r[6])<<8 | uint32(r[7]); e != eshutdown {
			t.Errorf("reply %d: errno %d, want ESHUTDOWN", i, e)
		}
	}
	if st := dev.Stats(); st.Writes != 0 || st.Reads != 0 || st.Flushes != 0 {
		t.Errorf("requests reached the device during shutdown: %+v", st)
	}
}
