package nbd

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
)

// streamConn is a net.Conn whose reads come from a fixed byte stream and whose writes are
// discarded: it lets the fuzzers drive the real negotiation and transmission code.
type streamConn struct {
	r io.Reader
}

func (c *streamConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c *streamConn) Close() error                       { return nil }
func (c *streamConn) LocalAddr() net.Addr                { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (c *streamConn) RemoteAddr() net.Addr               { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (c *streamConn) SetDeadline(t time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return nil }

func optBytes(opt uint32, data []byte) []byte {
	b := make([]byte, 16+len(data))
	binary.BigEndian.PutUint64(b, magicOption)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], uint32(len(data)))
	copy(b[16:], data)
	return b
}

func reqBytes(r header, payload []byte) []byte {
	b := make([]byte, requestHeaderLen+len(payload))
	putRequest(b, r)
	copy(b[requestHeaderLen:], payload)
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// FuzzHandshake feeds arbitrary client bytes to the negotiation. It must end (EOF at the latest)
// without panicking, and only ever enter transmission with the one export's size.
func FuzzHandshake(f *testing.F) {
	cf := []byte{0, 0, 0, 3}
	f.Add(cat(cf, optBytes(optGo, goData("", infoBlockSize))))
	f.Add(cat(cf, optBytes(optStructuredReply, nil), optBytes(optInfo, goData("iser-blk", infoName, infoDescription)),
		optBytes(optGo, goData("iser-blk"))))
	f.Add(cat(cf, optBytes(optList, nil), optBytes(99, []byte("junk")), optBytes(optExportName, nil)))
	f.Add(cat(cf, optBytes(optAbort, nil)))
	f.Add(cat([]byte{0, 0, 0, 1}, optBytes(optExportName, []byte("nope"))))
	f.Add(cat(cf, optBytes(optGo, []byte{0, 0, 0xff, 0xff, 0})))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(dev, Options{Description: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := newConn(srv, &streamConn{r: bytes.NewReader(data)}).negotiate()
		if err == nil && e.size != 1<<20 {
			t.Fatalf("negotiated export size %d", e.size)
		}
	})
}

// FuzzParseGoRequest checks the NBD_OPT_INFO/GO decoder: it never panics and whatever it accepts
// re-encodes to the same bytes.
func FuzzParseGoRequest(f *testing.F) {
	f.Add(goData("", infoBlockSize))
	f.Add(goData("iser-blk", infoName, infoDescription, infoExport))
	f.Add([]byte{0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 'a', 0, 2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := parseGoRequest(data)
		if err != nil {
			return
		}
		if re := goData(g.name, g.infos...); !bytes.Equal(re, data) {
			t.Fatalf("re-encoding differs: %x vs %x", re, data)
		}
	})
}

// FuzzRequestHeader checks request decoding and validation: only a bad magic is a decode error,
// and a request judged valid is inside the export, aligned, of an advertised command and within
// the payload limit.
func FuzzRequestHeader(f *testing.F) {
	seed := func(r header) []byte { return reqBytes(r, nil) }
	f.Add(seed(header{Type: cmdRead, Length: 4096}), uint16(0x0fff), true)
	f.Add(seed(header{Type: cmdWrite, Flags: cmdFlagFUA, Offset: 1 << 20, Length: 512}), uint16(0x0fff), false)
	f.Add(seed(header{Type: cmdWriteZeroes, Flags: cmdFlagNoHole | cmdFlagFastZero, Length: 1 << 30}), uint16(0x0fff), true)
	f.Add(seed(header{Type: cmdTrim, Offset: ^uint64(0) - 10, Length: 4096}), uint16(flagHasFlags|flagReadOnly), false)
	f.Add(seed(header{Type: 99}), uint16(1), false)
	f.Add(make([]byte, requestHeaderLen), uint16(1), false)
	f.Fuzz(func(t *testing.T, raw []byte, tflags uint16, structured bool) {
		if len(raw) < requestHeaderLen {
			return
		}
		var b [requestHeaderLen]byte
		copy(b[:], raw)
		r, err := parseRequest(&b)
		if err != nil {
			if binary.BigEndian.Uint32(b[:4]) == magicRequest {
				t.Fatalf("good magic rejected: %v", err)
			}
			return
		}
		e := export{size: 64 << 20, minBlock: 512, tflags: tflags | flagHasFlags, structured: structured}
		v, errno := e.validate(&r)
		switch v {
		case verdictOK:
			if errno != 0 {
				t.Fatalf("ok verdict with errno %d", errno)
			}
			if r.Type == cmdFlush {
				return
			}
			if r.Length == 0 || r.Offset%512 != 0 || r.Length%512 != 0 || r.Offset+uint64(r.Length) > e.size ||
				r.Offset+uint64(r.Length) < r.Offset {
				t.Fatalf("invalid range accepted: %+v", r)
			}
			if (r.Type == cmdRead || r.Type == cmdWrite) && r.Length > MaxPayload {
				t.Fatalf("oversize accepted: %+v", r)
			}
			if r.Flags&^e.allowedFlags(r.Type) != 0 {
				t.Fatalf("flags %#x accepted for cmd %d", r.Flags, r.Type)
			}
			if e.tflags&flagReadOnly != 0 && (r.Type == cmdWrite || r.Type == cmdTrim || r.Type == cmdWriteZeroes) {
				t.Fatalf("write accepted on read-only export: %+v", r)
			}
		case verdictReply:
			if errno == 0 {
				t.Fatal("error verdict without errno")
			}
		case verdictDisconnect:
			if r.Type != cmdWrite || r.Length <= MaxPayload {
				t.Fatalf("disconnect for %+v", r)
			}
		}
	})
}

// FuzzTransmission drives the whole transmission phase (reader, workers, writer, device) with an
// arbitrary byte stream. It must end when the stream does, without panicking or leaking slots.
func FuzzTransmission(f *testing.F) {
	f.Add(cat(reqBytes(header{Type: cmdWrite, Flags: cmdFlagFUA, Handle: 1, Length: 512}, make([]byte, 512)),
		reqBytes(header{Type: cmdRead, Handle: 2, Length: 512}, nil),
		reqBytes(header{Type: cmdFlush, Handle: 3}, nil),
		reqBytes(header{Type: cmdTrim, Handle: 4, Offset: 4096, Length: 8192}, nil),
		reqBytes(header{Type: cmdWriteZeroes, Flags: cmdFlagNoHole, Handle: 5, Length: 4096}, nil),
		reqBytes(header{Type: cmdDisc}, nil)), true)
	f.Add(cat(reqBytes(header{Type: cmdWrite, Handle: 1, Length: 1 << 20}, make([]byte, 100))), false)
	f.Add(cat(reqBytes(header{Type: 77, Handle: 1, Length: 512}, nil), []byte{1, 2, 3}), false)
	f.Add(reqBytes(header{Type: cmdRead, Handle: 1, Offset: 1 << 40, Length: 512}, nil), true)
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(dev, Options{MaxInflight: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, stream []byte, structured bool) {
		c := newConn(srv, &streamConn{r: bytes.NewReader(stream)})
		c.exp = srv.export(structured)
		c.transmit()
		if len(c.free) != srv.opts.MaxInflight {
			t.Fatalf("%d of %d request slots returned", len(c.free), srv.opts.MaxInflight)
		}
	})
}

// FuzzStartTLS feeds arbitrary client bytes to a negotiation that requires TLS, with the TLS
// handshake replaced by a pass-through so that the options after NBD_OPT_STARTTLS come from the
// same bytes. Whatever the input: before STARTTLS is acknowledged, every reply is
// NBD_REP_ERR_TLS_REQD (or a refusal of a malformed STARTTLS, or the ACK of ABORT), and the client
// enters transmission only after the ACK.
func FuzzStartTLS(f *testing.F) {
	cf := []byte{0, 0, 0, 3}
	f.Add(cat(cf, optBytes(optStartTLS, nil), optBytes(optStructuredReply, nil), optBytes(optGo, goData(""))))
	f.Add(cat(cf, optBytes(optList, nil), optBytes(optGo, goData("")), optBytes(optStartTLS, nil),
		optBytes(optStartTLS, nil), optBytes(optExportName, nil)))
	f.Add(cat(cf, optBytes(optStartTLS, []byte("x")), optBytes(optAbort, nil)))
	f.Add(cat(cf, optBytes(optExportName, nil)))
	f.Add(cat([]byte{0, 0, 0, 2}, optBytes(optStartTLS, nil)))
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(dev, Options{})
	if err != nil {
		f.Fatal(err)
	}
	srv.tlsHandshake = func(nc net.Conn, _ *tls.Config) (net.Conn, error) { return nc, nil }
	policy := &TLS{Config: &tls.Config{}, Require: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		nc := &captureConn{streamConn: streamConn{r: bytes.NewReader(data)}}
		c := newConn(srv, nc)
		c.tls = policy
		e, err := c.negotiate()
		acked := checkRepliesBeforeTLS(t, nc.out.Bytes())
		if err == nil && (!acked || e.size != 1<<20) {
			t.Fatalf("entered transmission (size %d) with STARTTLS acknowledged: %v", e.size, acked)
		}
	})
}

// checkRepliesBeforeTLS walks the server's option replies up to the STARTTLS ACK, failing on any
// reply a FORCEDTLS server must not send in the clear; it reports whether the ACK came.
func checkRepliesBeforeTLS(t *testing.T, out []byte) (acked bool) {
	if len(out) < 18 {
		return false
	}
	for out = out[18:]; len(out) >= optReplyHeaderLen; {
		if binary.BigEndian.Uint64(out) != magicOptReply {
			t.Fatalf("non-reply bytes %x before STARTTLS", out[:8])
		}
		opt, typ := binary.BigEndian.Uint32(out[8:]), binary.BigEndian.Uint32(out[12:])
		n := binary.BigEndian.Uint32(out[16:])
		switch {
		case opt == optStartTLS && typ == repAck:
			return true
		case typ == repErrTLSReqd && opt != optStartTLS && opt != optAbort:
		case opt == optStartTLS && typ == repErrInvalid:
		case opt == optAbort && typ == repAck:
		default:
			t.Fatalf("reply %#x to option %d before TLS", typ, opt)
		}
		out = out[min(len(out), optReplyHeaderLen+int(n)):]
	}
	return false
}
