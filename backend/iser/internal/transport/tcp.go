package transport

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/internal/rawio"
)

// TCP is the iSCSI/TCP transport (RFC 7143 §4, §11): PDUs on one TCP stream, optional CRC32C
// digests, data moved by the session with R2T/Data-Out/Data-In.
type TCP struct{}

func init() { Register("iscsi", TCP{}) }

// DefaultPort is the IANA iSCSI port (RFC 7143 §13.8 default for TargetAddress).
const DefaultPort = 3260

// DefaultPort implements Dialer.
func (TCP) DefaultPort() int { return DefaultPort }

// Dial connects to portal ("host:port"). TCP_NODELAY is on (Go's default, set explicitly anyway):
// iSCSI is request/response and Nagle would delay every small PDU.
func (TCP) Dial(ctx context.Context, portal string, opts DialOptions) (Conn, error) {
	d := net.Dialer{Timeout: opts.Timeout, KeepAlive: 15 * time.Second}
	if opts.Source != "" {
		a, err := net.ResolveTCPAddr("tcp", opts.Source)
		if err != nil {
			return nil, fmt.Errorf("transport: source address %q: %w", opts.Source, err)
		}
		d.LocalAddr = a
	}
	nc, err := d.DialContext(ctx, "tcp", portal)
	if err != nil {
		return nil, err
	}
	tc := nc.(*net.TCPConn)
	if err := tc.SetNoDelay(true); err != nil {
		nc.Close()
		return nil, fmt.Errorf("transport: TCP_NODELAY: %w", err)
	}
	return NewTCPConn(tc), nil
}

// readBufferSize is the bufio size for the receive side: headers and small segments (4 KiB
// reads at a deep queue) are batched into one read(2).
const readBufferSize = 64 << 10

// directReadMin is the part of a data segment, beyond what bufio already holds, from which
// ReadData reads straight from the socket into the caller's buffer and the next header is read
// without read-ahead. Through bufio a large segment is copied twice: its tail by the fill that
// also reads ahead the next header, and up to readBufferSize of the next segment by the fill that
// reads that header (the runtime.memmove in a 1 MiB read profile). Going round bufio costs one
// more read(2) of 48 bytes per segment instead.
const directReadMin = 32 << 10

// TCPConn is a Conn over a net.Conn. Create with NewTCPConn (tests use net.Pipe).
type TCPConn struct {
	nc net.Conn
	br *bufio.Reader

	headerDigest, dataDigest bool
	maxRecv                  int // bound for DataSegmentLength we accept

	// Receive state (reader goroutine only).
	remaining int // data segment length of the last header, not yet consumed
	hasData   bool
	ahs       [pdu.MaxAHSLength]byte
	trailer   [3 + pdu.DigestLen]byte
	hd        [pdu.DigestLen]byte
	scratch   []byte

	// Send state (serialised by the caller).
	head [pdu.BHSLen + pdu.MaxAHSLength + pdu.DigestLen]byte
	tail [3 + pdu.DigestLen]byte
	iov  [3][]byte

	// Batch send scratch (allocated on first use).
	bheads [][pdu.BHSLen + pdu.DigestLen]byte
	btails [][3 + pdu.DigestLen]byte
	biov   [][]byte

	// raw carries the per-PDU reads (under br), the writevs and the splices into a pipe
	// (pipe.go) with raw system calls (see package rawio).
	raw *rawio.Conn

	// lend is the pipe lent segments are spliced through (lend.go).
	lend lendPipe

	// exact: the last data segment went round br (spliced into a pipe, or read straight into the
	// caller's buffer), so the next one likely will too; its header is read without read-ahead.
	exact bool
}

// NewTCPConn wraps nc.
func NewTCPConn(nc net.Conn) *TCPConn {
	raw := rawio.New(nc)
	return &TCPConn{nc: nc, raw: raw, br: bufio.NewReaderSize(raw, readBufferSize), maxRecv: 8192 * 2, lend: newLendPipe()}
}

// writev writes iov whole (one writev(2) unless the socket is full; no allocation).
func (c *TCPConn) writev(iov [][]byte) error {
	_, err := c.raw.Writev(iov)
	return err
}

// WritePDU implements Conn: header, AHS, header digest, data, padding and data digest go out in
// one vectored write (writev).
func (c *TCPConn) WritePDU(bhs *pdu.BHS, ahs, data []byte) error {
	if len(ahs)%4 != 0 || len(ahs) > pdu.MaxAHSLength {
		return fmt.Errorf("transport: AHS of %d bytes", len(ahs))
	}
	if len(data) > pdu.MaxDataSegmentLength || bhs.DataSegmentLength() != len(data) || bhs.TotalAHSLength() != len(ahs) {
		return fmt.Errorf("transport: header says AHS %d data %d, got %d and %d",
			bhs.TotalAHSLength(), bhs.DataSegmentLength(), len(ahs), len(data))
	}
	n := copy(c.head[:], bhs[:])
	n += copy(c.head[n:], ahs)
	if c.headerDigest {
		pdu.PutDigest(c.head[n:], pdu.HeaderDigest(bhs, ahs))
		n += pdu.DigestLen
	}
	iov := c.iov[:0]
	iov = append(iov, c.head[:n])
	if len(data) > 0 {
		iov = append(iov, data)
		pad := pdu.PadLen(len(data))
		t := copy(c.tail[:], pdu.ZeroPad(pad))
		if c.dataDigest {
			pdu.PutDigest(c.tail[t:], pdu.DataDigest(data))
			t += pdu.DigestLen
		}
		if t > 0 {
			iov = append(iov, c.tail[:t])
		}
	}
	if err := c.writev(iov); err != nil {
		return fmt.Errorf("transport: write to %s: %w", c.RemoteAddr(), err)
	}
	return nil
}

// maxBatch bounds the PDUs of one writev (each takes up to 3 iovecs; IOV_MAX is 1024).
const maxBatch = 64

// WritePDUs implements BatchWriter: the whole batch goes out in as few writev calls as possible.
func (c *TCPConn) WritePDUs(batch []OutPDU) error {
	for len(batch) > 0 {
		n := min(len(batch), maxBatch)
		if err := c.writeBatch(batch[:n]); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}

func (c *TCPConn) writeBatch(batch []OutPDU) error {
	if c.bheads == nil {
		c.bheads = make([][pdu.BHSLen + pdu.DigestLen]byte, maxBatch)
		c.btails = make([][3 + pdu.DigestLen]byte, maxBatch)
		c.biov = make([][]byte, 0, 3*maxBatch)
	}
	iov := c.biov[:0]
	for i := range batch {
		p := &batch[i]
		data := p.Data
		if p.Task != nil {
			data = p.Task.Buf[:p.Task.Immediate]
		}
		if len(p.AHS) != 0 || p.BHS.TotalAHSLength() != 0 {
			// Rare (extended CDBs): flush what we have and send this one alone.
			if len(iov) > 0 {
				if err := c.writev(iov); err != nil {
					return fmt.Errorf("transport: write to %s: %w", c.RemoteAddr(), err)
				}
				iov = c.biov[:0]
			}
			if err := c.WritePDU(p.BHS, p.AHS, data); err != nil {
				return err
			}
			continue
		}
		if len(data) > pdu.MaxDataSegmentLength || p.BHS.DataSegmentLength() != len(data) {
			return fmt.Errorf("transport: header says data %d, got %d", p.BHS.DataSegmentLength(), len(data))
		}
		h := &c.bheads[i]
		n := copy(h[:], p.BHS[:])
		if c.headerDigest {
			pdu.PutDigest(h[n:], pdu.HeaderDigest(p.BHS, nil))
			n += pdu.DigestLen
		}
		iov = append(iov, h[:n])
		if c.canLend(p, data) {
			// The header and what precedes it by writev, then the segment by reference.
			if err := c.writev(iov); err != nil {
				return fmt.Errorf("transport: write to %s: %w", c.RemoteAddr(), err)
			}
			iov = c.biov[:0]
			err := c.sendLent(p, data)
			if err == nil {
				continue
			}
			if err != errLendRefused {
				return fmt.Errorf("transport: send to %s: %w", c.RemoteAddr(), err)
			}
			// Refused before any byte went: the segment is copied like any other.
		}
		if len(data) > 0 {
			iov = append(iov, data)
			tl := &c.btails[i]
			pad := pdu.PadLen(len(data))
			t := copy(tl[:], pdu.ZeroPad(pad))
			if c.dataDigest {
				pdu.PutDigest(tl[t:], pdu.DataDigest(data))
				t += pdu.DigestLen
			}
			if t > 0 {
				iov = append(iov, tl[:t])
			}
		}
	}
	if len(iov) == 0 {
		return nil
	}
	if err := c.writev(iov); err != nil {
		return fmt.Errorf("transport: write to %s: %w", c.RemoteAddr(), err)
	}
	return nil
}

// WriteCommand implements Conn: over TCP the command PDU simply carries the immediate data.
func (c *TCPConn) WriteCommand(bhs *pdu.BHS, ahs []byte, t *Task) error {
	return c.WritePDU(bhs, ahs, t.Buf[:t.Immediate])
}

// Buffered is the number of received bytes read from the socket and not yet consumed: the
// session's reader flushes its batched completions when less than a header is left (a next
// ReadHeader might block).
func (c *TCPConn) Buffered() int { return c.br.Buffered() }

// ReadHeader implements Conn.
func (c *TCPConn) ReadHeader(bhs *pdu.BHS) ([]byte, error) {
	if c.hasData {
		return nil, fmt.Errorf("transport: ReadHeader before the previous data segment was consumed")
	}
	src := c.next()
	c.exact = false
	if _, err := io.ReadFull(src, bhs[:]); err != nil {
		return nil, c.readErr(err)
	}
	n := bhs.TotalAHSLength()
	ahs := c.ahs[:n]
	if n > 0 {
		if _, err := io.ReadFull(src, ahs); err != nil {
			return nil, c.readErr(err)
		}
	}
	if c.headerDigest {
		if _, err := io.ReadFull(src, c.hd[:]); err != nil {
			return nil, c.readErr(err)
		}
		if got, want := pdu.GetDigest(c.hd[:]), pdu.HeaderDigest(bhs, ahs); got != want {
			return nil, &pdu.DigestError{What: "header", Got: got, Want: want}
		}
	}
	if err := bhs.Validate(c.maxRecv); err != nil {
		return nil, err
	}
	c.remaining = bhs.DataSegmentLength()
	c.hasData = c.remaining > 0
	return ahs, nil
}

// ReadData implements Conn: the segment is read from the socket into dst directly.
func (c *TCPConn) ReadData(dst []byte) error {
	if len(dst) == 0 && !c.hasData {
		return nil
	}
	if !c.hasData || len(dst) != c.remaining {
		return fmt.Errorf("transport: ReadData of %d bytes, the segment has %d", len(dst), c.remaining)
	}
	c.hasData = false
	if err := c.readSegment(dst); err != nil {
		return c.readErr(err)
	}
	var crc uint32
	if c.dataDigest { // a CRC nobody checks costs ~60 µs per MiB read
		crc = pdu.CRC32C(0, dst)
	}
	return c.finishData(crc, len(dst))
}

// next is the reader for the bytes after the current data segment (its padding and digest, the
// next header). After a segment that went round bufio (c.exact) with bufio empty it is the socket
// itself: a bufio fill would read ahead the start of the next segment, which then has to be copied
// out of bufio instead of read or spliced in place.
func (c *TCPConn) next() io.Reader {
	if c.exact && c.br.Buffered() == 0 {
		return c.raw
	}
	return c.br
}

// readSegment fills dst with the data segment: first what bufio holds, then, if at least
// directReadMin is left, straight from the conn (see directReadMin).
func (c *TCPConn) readSegment(dst []byte) error {
	n := 0
	if b := c.br.Buffered(); b > 0 {
		m, err := c.br.Read(dst[:min(b, len(dst))])
		if err != nil {
			return err
		}
		n = m
	}
	if len(dst)-n < directReadMin {
		_, err := io.ReadFull(c.br, dst[n:])
		return err
	}
	c.exact = true
	_, err := io.ReadFull(c.raw, dst[n:])
	return err
}

// DiscardData implements Conn.
func (c *TCPConn) DiscardData() error {
	if !c.hasData {
		return nil
	}
	c.hasData = false
	n := c.remaining
	if !c.dataDigest {
		if _, err := c.br.Discard(pdu.Padded(n)); err != nil {
			return c.readErr(err)
		}
		return nil
	}
	if c.scratch == nil {
		c.scratch = make([]byte, 16<<10)
	}
	var crc uint32
	for left := n; left > 0; {
		chunk := c.scratch[:min(left, len(c.scratch))]
		if _, err := io.ReadFull(c.br, chunk); err != nil {
			return c.readErr(err)
		}
		crc = pdu.CRC32C(crc, chunk)
		left -= len(chunk)
	}
	return c.finishData(crc, n)
}

func (c *TCPConn) finishData(crc uint32, n int) error {
	pad := pdu.PadLen(n)
	t := pad
	if c.dataDigest {
		t += pdu.DigestLen
	}
	if t == 0 {
		return nil
	}
	if _, err := io.ReadFull(c.next(), c.trailer[:t]); err != nil {
		return c.readErr(err)
	}
	if c.dataDigest {
		crc = pdu.CRC32C(crc, c.trailer[:pad])
		if got := pdu.GetDigest(c.trailer[pad:t]); got != crc {
			return &pdu.DigestError{What: "data", Got: got, Want: crc}
		}
	}
	return nil
}

func (c *TCPConn) readErr(err error) error {
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return fmt.Errorf("transport: read from %s: %w", c.RemoteAddr(), err)
}

// LoginHook implements Conn: TCP negotiates no keys of its own.
func (c *TCPConn) LoginHook() login.Hook { return nil }

// Start implements Conn: digests and the receive limit take effect for the next PDU.
func (c *TCPConn) Start(p *login.Params) error {
	c.headerDigest, c.dataDigest = p.HeaderDigest, p.DataDigest
	c.maxRecv = int(p.MaxRecvDataSegmentLength)
	return nil
}

// MovesData implements Conn: over TCP the session moves the data.
func (c *TCPConn) MovesData() bool { return false }

// TaskDone implements Conn (nothing to release over TCP).
func (c *TCPConn) TaskDone(uint32) {}

// SetDeadline implements Conn.
func (c *TCPConn) SetDeadline(t time.Time) error { return c.nc.SetDeadline(t) }

// RemoteAddr implements Conn.
func (c *TCPConn) RemoteAddr() string {
	if a := c.nc.RemoteAddr(); a != nil {
		return a.String()
	}
	return "?"
}

// Close implements Conn. The lend pipe closes after the socket (see lendPipe).
func (c *TCPConn) Close() error {
	err := c.nc.Close()
	c.lend.close()
	return err
}

var _ Aborter = (*TCPConn)(nil)

// Abort implements Aborter: with SO_LINGER 0 the close discards the send queue and resets the
// connection (socket(7)); a net.Conn that is no TCP socket (tests' pipes) is simply closed.
func (c *TCPConn) Abort() error {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		tc.SetLinger(0) //nolint:errcheck // the close below is what must happen; a reset is best effort
	}
	err := c.nc.Close()
	c.lend.close()
	return err
}

// JoinHostPort adds the default port to a portal without one.
func JoinHostPort(portal string, defaultPort int) string {
	if _, _, err := net.SplitHostPort(portal); err == nil {
		return portal
	}
	h := portal
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	return net.JoinHostPort(h, strconv.Itoa(defaultPort))
}
