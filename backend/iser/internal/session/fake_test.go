package session

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

// An in-process fake iSCSI target speaking the wire protocol over net.Pipe. Tests script its
// full-feature behaviour with a handler; login is a simple, correct exchange that answers our
// keys with the values in keys.

type wirePDU struct {
	bhs  pdu.BHS
	data []byte
}

type fakeTarget struct {
	t    testing.TB
	nc   net.Conn
	keys map[string]string // the target's values for negotiated keys

	hdrDigestNext, dataDigestNext bool

	hdrDigest, dataDigest bool
	statSN                uint32
	expCmdSN, maxCmdSN    uint32
	window                uint32 // MaxCmdSN = ExpCmdSN + window - 1 after each command

	wmu sync.Mutex

	readErr error // what ended serve's reading (read it after serve's channel closed)
}

// pipeDialer hands out pre-made connections, one per Dial.
type pipeDialer struct {
	mu    sync.Mutex
	conns map[string][]net.Conn
	dials []string
}

func (d *pipeDialer) Dial(_ context.Context, portal string, _ transport.DialOptions) (transport.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dials = append(d.dials, portal)
	q := d.conns[portal]
	if len(q) == 0 {
		return nil, fmt.Errorf("dial %s: connection refused", portal)
	}
	c := q[0]
	d.conns[portal] = q[1:]
	return transport.NewTCPConn(c), nil
}

func (d *pipeDialer) DefaultPort() int { return 3260 }

// newFake creates a fake target reachable at portal through d.
func newFake(t testing.TB, d *pipeDialer, portal string, keys map[string]string) *fakeTarget {
	a, b := net.Pipe()
	return attachFake(t, d, portal, keys, a, b)
}

// attachFake creates a fake target on b, the target's end of a connection whose initiator end a
// the next Dial of portal through d returns; b closes with the test.
func attachFake(t testing.TB, d *pipeDialer, portal string, keys map[string]string, a, b net.Conn) *fakeTarget {
	d.mu.Lock()
	if d.conns == nil {
		d.conns = map[string][]net.Conn{}
	}
	d.conns[portal] = append(d.conns[portal], a)
	d.mu.Unlock()
	t.Cleanup(func() { b.Close() })
	return &fakeTarget{t: t, nc: b, keys: keys, statSN: 100, expCmdSN: 1, maxCmdSN: 64, window: 64}
}

func (f *fakeTarget) sns() pdu.TargetHeader {
	return pdu.TargetHeader{StatSN: f.statSN, ExpCmdSN: f.expCmdSN, MaxCmdSN: f.maxCmdSN}
}

func (f *fakeTarget) read() (wirePDU, error) {
	var p wirePDU
	if _, err := io.ReadFull(f.nc, p.bhs[:]); err != nil {
		return p, err
	}
	if n := p.bhs.TotalAHSLength(); n > 0 {
		if _, err := io.ReadFull(f.nc, make([]byte, n)); err != nil {
			return p, err
		}
	}
	if f.hdrDigest {
		var d [4]byte
		if _, err := io.ReadFull(f.nc, d[:]); err != nil {
			return p, err
		}
		if pdu.GetDigest(d[:]) != pdu.HeaderDigest(&p.bhs, nil) {
			return p, errors.New("fake target: bad header digest from initiator")
		}
	}
	n := p.bhs.DataSegmentLength()
	if n > 0 {
		buf := make([]byte, pdu.Padded(n))
		if _, err := io.ReadFull(f.nc, buf); err != nil {
			return p, err
		}
		p.data = buf[:n]
		if f.dataDigest {
			var d [4]byte
			if _, err := io.ReadFull(f.nc, d[:]); err != nil {
				return p, err
			}
			if pdu.GetDigest(d[:]) != pdu.DataDigest(p.data) {
				return p, errors.New("fake target: bad data digest from initiator")
			}
		}
	}
	return p, nil
}

func (f *fakeTarget) write(bhs *pdu.BHS, data []byte) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	buf := append([]byte(nil), bhs[:]...)
	if f.hdrDigest {
		buf = binary.LittleEndian.AppendUint32(buf, pdu.HeaderDigest(bhs, nil))
	}
	if len(data) > 0 {
		buf = append(buf, data...)
		buf = append(buf, pdu.ZeroPad(pdu.PadLen(len(data)))...)
		if f.dataDigest {
			buf = binary.LittleEndian.AppendUint32(buf, pdu.DataDigest(data))
		}
	}
	_, err := f.nc.Write(buf)
	return err
}

// login runs a correct login: security stage with AuthMethod=None, operational stage answering
// every key of ours with f.keys (or echoing ours), TSIH 1.
func (f *fakeTarget) login() error {
	var isid uint64
	for {
		p, err := f.read()
		if err != nil {
			return err
		}
		if p.bhs.Opcode() != pdu.OpLoginReq {
			return fmt.Errorf("fake target: %v during login", p.bhs.Opcode())
		}
		isid = p.bhs.ISID()
		csg, nsg := p.bhs.LoginStages()
		kvs, err := login.DecodeText(p.data)
		if err != nil {
			return err
		}
		var out []login.KeyValue
		for _, kv := range kvs {
			switch kv.Key {
			case "AuthMethod":
				out = append(out, login.KeyValue{Key: "AuthMethod", Value: "None"})
			case "InitiatorName", "SessionType", "TargetName", "InitiatorAlias":
			case "MaxRecvDataSegmentLength":
				// declarative: answer with ours below
			default:
				v, ok := f.keys[kv.Key]
				if !ok {
					v = kv.Value
					if i := indexComma(v); i >= 0 {
						v = v[:i]
					}
				}
				out = append(out, login.KeyValue{Key: kv.Key, Value: v})
			}
		}
		if tpgt := f.keys["TargetPortalGroupTag"]; tpgt != "" {
			out = append(out, login.KeyValue{Key: "TargetPortalGroupTag", Value: tpgt}) // declared (§13.9)
		}
		if csg == pdu.StageOperational {
			mrdsl := f.keys["MaxRecvDataSegmentLength"]
			if mrdsl == "" {
				mrdsl = "8192"
			}
			out = append(out, login.KeyValue{Key: "MaxRecvDataSegmentLength", Value: mrdsl})
			for _, kv := range out {
				switch kv.Key {
				case "HeaderDigest":
					f.hdrDigestNext = kv.Value == "CRC32C"
				case "DataDigest":
					f.dataDigestNext = kv.Value == "CRC32C"
				}
			}
		}
		var tsih uint16
		if p.bhs.Transit() && nsg == pdu.StageFullFeature {
			tsih = 1
		}
		text := login.EncodeText(nil, out)
		var r pdu.BHS
		pdu.EncodeLoginResponse(&r, p.bhs.Transit(), false, csg, nsg, len(text), isid, tsih, p.bhs.ITT(), f.sns(), 0, 0)
		if err := f.write(&r, text); err != nil {
			return err
		}
		f.statSN++
		if p.bhs.Transit() && nsg == pdu.StageFullFeature {
			f.hdrDigest, f.dataDigest = f.hdrDigestNext, f.dataDigestNext
			return nil
		}
	}
}

func indexComma(s string) int {
	for i := range s {
		if s[i] == ',' {
			return i
		}
	}
	return -1
}

// serve runs login and then calls handle for every PDU until the connection ends or handle
// returns an error. It runs in its own goroutine; failures are reported with t.Error.
func (f *fakeTarget) serve(handle func(f *fakeTarget, p wirePDU) error) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f.login(); err != nil {
			f.t.Errorf("fake target login: %v", err)
			return
		}
		for {
			p, err := f.read()
			if err != nil {
				f.readErr = err
				return
			}
			if p.bhs.Opcode() == pdu.OpSCSICommand && !p.bhs.Immediate() {
				f.expCmdSN = p.bhs.CmdSN() + 1
				f.maxCmdSN = f.expCmdSN + f.window - 1
			}
			if err := handle(f, p); err != nil {
				if !errors.Is(err, errStopServing) {
					f.t.Errorf("fake target: %v", err)
				}
				return
			}
		}
	}()
	return done
}

var errStopServing = errors.New("stop serving")

// respond sends a SCSI Response with GOOD status.
func (f *fakeTarget) respond(itt uint32, status uint8, sense []byte, flags uint8, residual uint32) error {
	var data []byte
	if len(sense) > 0 {
		data = binary.BigEndian.AppendUint16(nil, uint16(len(sense)))
		data = append(data, sense...)
	}
	var b pdu.BHS
	pdu.EncodeSCSIResponse(&b, flags, 0, status, len(data), itt, f.sns(), 0, residual)
	f.statSN++
	return f.write(&b, data)
}

// newTestSession creates a session whose only portal is the fake target.
func newTestSession(t *testing.T, d *pipeDialer, mod func(*Config)) *Session {
	t.Helper()
	cfg := Config{Portal: "fake:3260", Transport: d, InitiatorName: "iqn.2026-11.io.iser-blk:unit",
		TargetName: "iqn.2026-11.io.iser-blk:fake", Logger: zaptest.NewLogger(t), LoginTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustLogin(t *testing.T, s *Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Login(ctx); err != nil {
		t.Fatalf("login: %v", err)
	}
	t.Cleanup(func() { s.Close() })
}

func atoiKey(m map[string]string, k string, def int) int {
	if v, ok := m[k]; ok {
		n, _ := strconv.Atoi(v)
		return n
	}
	return def
}
