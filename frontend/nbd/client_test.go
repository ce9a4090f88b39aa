package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
)

// testClient is a minimal NBD client for the tests: fixed newstyle negotiation and raw request /
// reply framing, so each test controls the exact bytes on the wire.
type testClient struct {
	t          testing.TB
	nc         net.Conn
	br         *bufio.Reader
	structured bool
	flags      uint16
	size       uint64
	blockSizes [3]uint32
	name       string
}

type optReplyT struct {
	opt, typ uint32
	data     []byte
}

func newTestClient(t testing.TB, nc net.Conn) *testClient {
	return &testClient{t: t, nc: nc, br: bufio.NewReaderSize(nc, 1<<16)}
}

func (c *testClient) greet(cflags uint32) error {
	var b [18]byte
	if _, err := io.ReadFull(c.br, b[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(b[0:]) != magicNBD || binary.BigEndian.Uint64(b[8:]) != magicOption {
		return errors.New("bad server greeting")
	}
	if hf := binary.BigEndian.Uint16(b[16:]); hf != flagFixedNewstyle|flagNoZeroes {
		return fmt.Errorf("handshake flags %#x", hf)
	}
	binary.BigEndian.PutUint32(b[:4], cflags)
	_, err := c.nc.Write(b[:4])
	return err
}

func (c *testClient) sendOpt(opt uint32, data []byte) error {
	b := make([]byte, 16+len(data))
	binary.BigEndian.PutUint64(b[0:], magicOption)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], uint32(len(data)))
	copy(b[16:], data)
	_, err := c.nc.Write(b)
	return err
}

func (c *testClient) readOptReply() (optReplyT, error) {
	var h [20]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return optReplyT{}, err
	}
	if binary.BigEndian.Uint64(h[0:]) != magicOptReply {
		return optReplyT{}, errors.New("bad option reply magic")
	}
	r := optReplyT{opt: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	r.data = make([]byte, binary.BigEndian.Uint32(h[16:]))
	_, err := io.ReadFull(c.br, r.data)
	return r, err
}

func goData(name string, infos ...uint16) []byte {
	b := make([]byte, 4+len(name)+2+2*len(infos))
	binary.BigEndian.PutUint32(b, uint32(len(name)))
	copy(b[4:], name)
	binary.BigEndian.PutUint16(b[4+len(name):], uint16(len(infos)))
	for i, t := range infos {
		binary.BigEndian.PutUint16(b[6+len(name)+2*i:], t)
	}
	return b
}

// connect negotiates with NBD_OPT_GO (optionally structured replies) and fails the test on error.
func (c *testClient) connect(structured bool) *testClient {
	c.t.Helper()
	if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
		c.t.Fatalf("greet: %v", err)
	}
	return c.goExport(structured)
}

// goExport is connect after the greeting (and, with TLS, after STARTTLS).
func (c *testClient) goExport(structured bool) *testClient {
	c.t.Helper()
	if structured {
		if err := c.sendOpt(optStructuredReply, nil); err != nil {
			c.t.Fatal(err)
		}
		r, err := c.readOptReply()
		if err != nil || r.typ != repAck {
			c.t.Fatalf("structured reply: %+v %v", r, err)
		}
		c.structured = true
	}
	if err := c.sendOpt(optGo, goData("", infoName, infoBlockSize)); err != nil {
		c.t.Fatal(err)
	}
	for {
		r, err := c.readOptReply()
		if err != nil {
			c.t.Fatalf("GO: %v", err)
		}
		if r.typ == repAck {
			return c
		}
		if r.typ != repInfo {
			c.t.Fatalf("GO reply type %#x %q", r.typ, r.data)
		}
		switch binary.BigEndian.Uint16(r.data) {
		case infoExport:
			c.size = binary.BigEndian.Uint64(r.data[2:])
			c.flags = binary.BigEndian.Uint16(r.data[10:])
		case infoBlockSize:
			for i := range 3 {
				c.blockSizes[i] = binary.BigEndian.Uint32(r.data[2+4*i:])
			}
		case infoName:
			c.name = string(r.data[2:])
		}
	}
}

func (c *testClient) send(typ, flags uint16, handle, off uint64, length uint32, payload []byte) error {
	b := make([]byte, requestHeaderLen+len(payload))
	putRequest(b, header{Type: typ, Flags: flags, Handle: handle, Offset: off, Length: length})
	copy(b[requestHeaderLen:], payload)
	_, err := c.nc.Write(b)
	return err
}

type replyT struct {
	handle uint64
	errno  uint32
	data   []byte // READ data, reassembled from OFFSET_DATA chunks
	off    uint64 // offset of the first data chunk
	msg    string
	// structured: the server answered with structured reply chunks.
	structured bool
}

// readReply reads one complete reply. readLen is the request length to expect for a simple READ
// reply (the simple reply carries no length); pass 0 for other commands.
func (c *testClient) readReply(readLen func(handle uint64) int) (replyT, error) {
	var h [20]byte
	if _, err := io.ReadFull(c.br, h[:4]); err != nil {
		return replyT{}, err
	}
	switch binary.BigEndian.Uint32(h[:4]) {
	case magicSimple:
		if _, err := io.ReadFull(c.br, h[4:16]); err != nil {
			return replyT{}, err
		}
		r := replyT{errno: binary.BigEndian.Uint32(h[4:]), handle: binary.BigEndian.Uint64(h[8:])}
		if r.errno == 0 && readLen != nil {
			if n := readLen(r.handle); n > 0 {
				r.data = make([]byte, n)
				if _, err := io.ReadFull(c.br, r.data); err != nil {
					return r, err
				}
			}
		}
		return r, nil
	case magicStructured:
		r := replyT{structured: true}
		for first := true; ; first = false {
			if !first {
				if _, err := io.ReadFull(c.br, h[:4]); err != nil {
					return r, err
				}
				if binary.BigEndian.Uint32(h[:4]) != magicStructured {
					return r, errors.New("mixed reply magics within one reply")
				}
			}
			if _, err := io.ReadFull(c.br, h[4:20]); err != nil {
				return r, err
			}
			flags := binary.BigEndian.Uint16(h[4:])
			typ := binary.BigEndian.Uint16(h[6:])
			r.handle = binary.BigEndian.Uint64(h[8:])
			p := make([]byte, binary.BigEndian.Uint32(h[16:]))
			if _, err := io.ReadFull(c.br, p); err != nil {
				return r, err
			}
			switch typ {
			case replyTypeOffsetData:
				if len(r.data) == 0 {
					r.off = binary.BigEndian.Uint64(p)
				}
				r.data = append(r.data, p[8:]...)
			case replyTypeError:
				r.errno = binary.BigEndian.Uint32(p)
				ml := binary.BigEndian.Uint16(p[4:])
				r.msg = string(p[6 : 6+ml])
			case replyTypeNone:
			default:
				return r, fmt.Errorf("unexpected chunk type %d", typ)
			}
			if flags&replyFlagDone != 0 {
				return r, nil
			}
		}
	default:
		return replyT{}, fmt.Errorf("bad reply magic %#x", binary.BigEndian.Uint32(h[:4]))
	}
}

// do sends one request and waits for its reply (no other request in flight).
func (c *testClient) do(typ, flags uint16, off uint64, length uint32, payload []byte) replyT {
	c.t.Helper()
	if err := c.send(typ, flags, 7, off, length, payload); err != nil {
		c.t.Fatalf("send: %v", err)
	}
	r, err := c.readReply(func(uint64) int {
		if typ == cmdRead {
			return int(length)
		}
		return 0
	})
	if err != nil {
		c.t.Fatalf("reply to cmd %d: %v", typ, err)
	}
	if r.handle != 7 {
		c.t.Fatalf("reply handle %d, want 7", r.handle)
	}
	return r
}
