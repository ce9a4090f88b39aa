package login

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// scriptConn is an in-memory login.Conn: every request goes to respond, whose answers are read
// back in order.
type scriptConn struct {
	t       *testing.T
	respond func(req *pdu.BHS, kvs []KeyValue, raw []byte) []wire
	queue   []wire
	cur     wire
	reqs    [][]KeyValue
	hdrs    []pdu.BHS
	partial []byte // text of C-bit requests not yet complete
}

type wire struct {
	bhs  pdu.BHS
	data []byte
}

func (c *scriptConn) WritePDU(bhs *pdu.BHS, ahs, data []byte) error {
	c.partial = append(c.partial, data...)
	var kvs []KeyValue
	if !bhs.Continue() {
		var err error
		if kvs, err = DecodeText(c.partial); err != nil {
			c.t.Fatalf("initiator sent malformed text (%d bytes): %v", len(c.partial), err)
		}
		c.partial = nil
	}
	c.reqs = append(c.reqs, kvs)
	c.hdrs = append(c.hdrs, *bhs)
	c.queue = append(c.queue, c.respond(bhs, kvs, data)...)
	return nil
}

func (c *scriptConn) ReadHeader(bhs *pdu.BHS) ([]byte, error) {
	if len(c.queue) == 0 {
		return nil, errors.New("script: no response queued")
	}
	c.cur, c.queue = c.queue[0], c.queue[1:]
	*bhs = c.cur.bhs
	return nil, bhs.Validate(0)
}

func (c *scriptConn) ReadData(dst []byte) error {
	if len(dst) != len(c.cur.data) {
		return fmt.Errorf("script: ReadData %d of %d", len(dst), len(c.cur.data))
	}
	copy(dst, c.cur.data)
	return nil
}

func (c *scriptConn) DiscardData() error { return nil }
func (c *scriptConn) RemoteAddr() string { return "192.0.2.1:3260" }

func resp(req *pdu.BHS, transit, cont bool, csg, nsg uint8, kvs []KeyValue, class, detail uint8) wire {
	text := EncodeText(nil, kvs)
	var b pdu.BHS
	var tsih uint16
	if transit && nsg == pdu.StageFullFeature {
		tsih = 9
	}
	pdu.EncodeLoginResponse(&b, transit, cont, csg, nsg, len(text), req.ISID(), tsih, req.ITT(),
		pdu.TargetHeader{StatSN: 50, ExpCmdSN: 1, MaxCmdSN: 32}, class, detail)
	return wire{b, text}
}

func get(kvs []KeyValue, k string) (string, bool) {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return "", false
}

// target builds a responder: security stage answered with AuthMethod=None, operational stage
// answered by opAnswer (which sees our keys and returns the target's).
func target(opAnswer func(ours []KeyValue) ([]KeyValue, bool)) func(*pdu.BHS, []KeyValue, []byte) []wire {
	return func(req *pdu.BHS, kvs []KeyValue, _ []byte) []wire {
		csg, nsg := req.LoginStages()
		if csg == pdu.StageSecurity {
			return []wire{resp(req, req.Transit(), false, 0, nsg, []KeyValue{{"AuthMethod", "None"}, {"TargetPortalGroupTag", "1"}}, 0, 0)}
		}
		ans, transit := opAnswer(kvs)
		return []wire{resp(req, transit, false, 1, 3, ans, 0, 0)}
	}
}

func baseConfig() *Config {
	return &Config{InitiatorName: "iqn.2026-11.test:init", TargetName: "iqn.2026-11.test:tgt", ISID: 0x800000000001,
		Proposal: DefaultProposal()}
}

func TestNegotiationResults(t *testing.T) {
	tests := []struct {
		name   string
		answer map[string]string // target answers to our offers
		check  func(p *Params) error
		err    error
	}{
		{
			name: "target values",
			answer: map[string]string{"InitialR2T": "Yes", "ImmediateData": "No", "MaxBurstLength": "131072",
				"FirstBurstLength": "16384", "MaxOutstandingR2T": "2", "DefaultTime2Wait": "5", "DefaultTime2Retain": "0",
				"MaxRecvDataSegmentLength": "32768", "HeaderDigest": "None", "DataDigest": "None"},
			check: func(p *Params) error {
				if !p.InitialR2T || p.ImmediateData || p.MaxBurstLength != 131072 || p.FirstBurstLength != 16384 ||
					p.MaxOutstandingR2T != 2 || p.DefaultTime2Wait != 5*time.Second || p.TargetMaxRecvDataSegmentLength != 32768 ||
					p.MaxRecvDataSegmentLength != 256<<10 || p.TSIH != 9 || p.TargetPortalGroupTag != 1 || p.ExpCmdSN != 1 || p.MaxCmdSN != 32 {
					return fmt.Errorf("%+v", *p)
				}
				return nil
			},
		},
		{
			name: "min/max never exceed our offer, OR/AND rules",
			// A sloppy target answers above our offers; the result functions still apply.
			answer: map[string]string{"MaxBurstLength": "16777215", "DefaultTime2Wait": "1", "ImmediateData": "Yes",
				"InitialR2T": "No", "DataPDUInOrder": "No", "MaxRecvDataSegmentLength": "8192"},
			check: func(p *Params) error {
				if p.MaxBurstLength != 16<<20-1024 || p.DefaultTime2Wait != 2*time.Second || !p.ImmediateData ||
					p.InitialR2T || !p.DataPDUInOrder {
					return fmt.Errorf("%+v", *p)
				}
				return nil
			},
		},
		{
			name:   "NotUnderstood and Irrelevant keep defaults",
			answer: map[string]string{"MaxOutstandingR2T": "NotUnderstood", "FirstBurstLength": "Irrelevant", "DefaultTime2Retain": "Reject"},
			check: func(p *Params) error {
				if p.MaxOutstandingR2T != 1 || p.FirstBurstLength != 65536 || p.DefaultTime2Retain != 20*time.Second {
					return fmt.Errorf("%+v", *p)
				}
				return nil
			},
		},
		{name: "digest not offered", answer: map[string]string{"HeaderDigest": "CRC32C"}, err: ErrNegotiation},
		{name: "bad boolean", answer: map[string]string{"ImmediateData": "Maybe"}, err: ErrNegotiation},
		{name: "number out of range", answer: map[string]string{"MaxBurstLength": "100"}, err: ErrNegotiation},
		{name: "ERL above 0", answer: map[string]string{"ErrorRecoveryLevel": "1"}, err: nil,
			check: func(p *Params) error {
				if p.ErrorRecoveryLevel != 0 {
					return errors.New("ERL > 0 accepted")
				}
				return nil
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &scriptConn{t: t, respond: target(func(ours []KeyValue) ([]KeyValue, bool) {
				var out []KeyValue
				for _, kv := range ours {
					v := kv.Value
					if a, ok := tt.answer[kv.Key]; ok {
						v = a
					} else if i := strings.IndexByte(v, ','); i >= 0 {
						v = v[:i]
					}
					out = append(out, KeyValue{kv.Key, v})
				}
				return out, true
			})}
			p, err := Login(context.Background(), c, baseConfig())
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				var le *Error
				if !errors.As(err, &le) || !strings.Contains(err.Error(), "iqn.2026-11.test:tgt") {
					t.Fatalf("error does not name the target: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.check(p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTargetOffersAndUnknownKeys: keys the target offers first get our reply in the next PDU;
// unknown keys get NotUnderstood; the target may take several rounds.
func TestTargetOffersAndUnknownKeys(t *testing.T) {
	round := 0
	c := &scriptConn{t: t}
	c.respond = target(func(ours []KeyValue) ([]KeyValue, bool) {
		round++
		switch round {
		case 1:
			return []KeyValue{{"HeaderDigest", "None"}, {"DataDigest", "None"}, {"MaxRecvDataSegmentLength", "65536"},
				{"X-com.example.Vendor", "1"}, {"OFMarker", "No"}}, false
		case 2:
			// The target offers keys we did not (in a real exchange it would do so in round 1).
			if v, _ := get(ours, "X-com.example.Vendor"); v != "NotUnderstood" {
				t.Errorf("unknown key answered %q", v)
			}
			if v, _ := get(ours, "OFMarker"); v != "No" {
				t.Errorf("OFMarker answered %q", v)
			}
			return []KeyValue{{"iSCSIProtocolLevel", "2"}}, false
		case 3:
			if v, _ := get(ours, "iSCSIProtocolLevel"); v != "1" {
				t.Errorf("iSCSIProtocolLevel answered %q", v)
			}
			return nil, true
		}
		t.Fatalf("round %d", round)
		return nil, false
	})
	p, err := Login(context.Background(), c, baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	if p.TargetMaxRecvDataSegmentLength != 65536 || round != 3 {
		t.Fatalf("MRDSL %d after %d rounds", p.TargetMaxRecvDataSegmentLength, round)
	}
	// Our first operational PDU offered every RFC 7143 §13 key.
	offered := c.reqs[1]
	for _, k := range offerOrder {
		if _, ok := get(offered, k); !ok {
			t.Errorf("key %s not offered", k)
		}
	}
}

// TestLoginContinuation: a response split with the C bit is reassembled (we send empty requests
// to get the rest, §11.13.2); a long request is split into C-bit PDUs of at most 8192 bytes.
func TestLoginContinuation(t *testing.T) {
	long := strings.Repeat("x", 5000) // two of these exceed one 8192-byte login PDU
	c := &scriptConn{t: t}
	var opReqs int
	var pendingText []byte
	c.respond = func(req *pdu.BHS, kvs []KeyValue, raw []byte) []wire {
		csg, nsg := req.LoginStages()
		if csg == pdu.StageSecurity {
			full := EncodeText(nil, []KeyValue{{"AuthMethod", "None"}, {"TargetAlias", "alias"}})
			if len(c.reqs) == 1 {
				var b1, b2 pdu.BHS
				pdu.EncodeLoginResponse(&b1, false, true, 0, 0, 7, req.ISID(), 0, req.ITT(), pdu.TargetHeader{}, 0, 0)
				pdu.EncodeLoginResponse(&b2, true, false, 0, nsg, len(full)-7, req.ISID(), 0, req.ITT(), pdu.TargetHeader{}, 0, 0)
				c.queue = append(c.queue, wire{b1, full[:7]})
				_ = b2
				pendingText = full[7:]
				return nil
			}
			// The empty continuation request.
			if len(raw) != 0 || req.Continue() {
				t.Errorf("continuation request with %d bytes", len(raw))
			}
			var b pdu.BHS
			pdu.EncodeLoginResponse(&b, true, false, 0, 1, len(pendingText), req.ISID(), 0, req.ITT(), pdu.TargetHeader{}, 0, 0)
			return []wire{{b, pendingText}}
		}
		opReqs++
		if len(raw) > 8192 {
			t.Errorf("login PDU of %d bytes", len(raw))
		}
		if req.Continue() {
			return []wire{resp(req, false, false, 1, 0, nil, 0, 0)}
		}
		return []wire{resp(req, true, false, 1, 3, nil, 0, 0)}
	}
	cfg := baseConfig()
	cfg.InitiatorAlias = "a"
	cfg.Hook = &testHook{extra: []KeyValue{{"X-test-long1", long}, {"X-test-long2", long}}}
	p, err := Login(context.Background(), c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.TargetAlias != "alias" || opReqs != 2 {
		t.Fatalf("alias %q, %d operational PDUs", p.TargetAlias, opReqs)
	}
}

type testHook struct {
	extra    []KeyValue
	accepted map[string]string
	finished bool
}

func (h *testHook) Propose(p *Proposal) []KeyValue {
	p.HeaderDigest, p.DataDigest = DigestNone, DigestNone
	return h.extra
}

func (h *testHook) Accept(key, value string) (string, bool, error) {
	if !strings.HasPrefix(key, "X-test") && key != "RDMAExtensions" && key != "TargetRecvDataSegmentLength" {
		return "", false, nil
	}
	if h.accepted == nil {
		h.accepted = map[string]string{}
	}
	h.accepted[key] = value
	return "", true, nil
}

func (h *testHook) Finish(p *Params) error {
	h.finished = true
	p.Extra = h.accepted
	if p.Extra["RDMAExtensions"] == "No" {
		return errors.New("target refused RDMAExtensions")
	}
	return nil
}

// TestHook: a transport adds keys, sees the target's answers and can veto the login.
func TestHook(t *testing.T) {
	for _, rdma := range []string{"Yes", "No"} {
		c := &scriptConn{t: t, respond: target(func(ours []KeyValue) ([]KeyValue, bool) {
			if v, _ := get(ours, "HeaderDigest"); v != "None" {
				t.Errorf("hook did not turn digests off: %q", v)
			}
			return []KeyValue{{"RDMAExtensions", rdma}, {"TargetRecvDataSegmentLength", "262144"}}, true
		})}
		h := &testHook{extra: []KeyValue{{"RDMAExtensions", "Yes"}, {"InitiatorRecvDataSegmentLength", "262144"}}}
		cfg := baseConfig()
		cfg.Hook = h
		p, err := Login(context.Background(), c, cfg)
		if rdma == "No" {
			if !errors.Is(err, ErrNegotiation) {
				t.Fatalf("veto: %v", err)
			}
			continue
		}
		if err != nil || !h.finished || p.Extra["TargetRecvDataSegmentLength"] != "262144" {
			t.Fatalf("hook: %v %+v", err, p)
		}
		if v, _ := get(c.reqs[1], "InitiatorRecvDataSegmentLength"); v != "262144" {
			t.Fatalf("extra key not offered")
		}
	}
}

func TestLoginStatusErrors(t *testing.T) {
	tests := []struct {
		class, detail uint8
		kind          error
		text          string
	}{
		{2, 1, ErrAuthFailed, "authentication failed"},
		{2, 2, ErrAuthorization, "authorization failure"},
		{2, 3, ErrTargetNotFound, "target not found"},
		{2, 4, ErrTargetRemoved, "target removed"},
		{2, 7, ErrRejected, "missing parameter"},
		{3, 1, ErrTargetUnavailable, "service unavailable"},
	}
	for _, tt := range tests {
		c := &scriptConn{t: t, respond: func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			return []wire{resp(req, false, false, 0, 0, nil, tt.class, tt.detail)}
		}}
		_, err := Login(context.Background(), c, baseConfig())
		var le *Error
		if !errors.Is(err, tt.kind) || !errors.As(err, &le) || le.Class != tt.class || le.Detail != tt.detail ||
			!strings.Contains(err.Error(), tt.text) || !strings.Contains(err.Error(), "iqn.2026-11.test:tgt") ||
			!strings.Contains(err.Error(), fmt.Sprintf("status class %d detail %d", tt.class, tt.detail)) {
			t.Errorf("class %d detail %d: %v", tt.class, tt.detail, err)
		}
	}
	// Redirection.
	c := &scriptConn{t: t, respond: func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
		return []wire{resp(req, false, false, 0, 0, []KeyValue{{"TargetAddress", "[2001:db8::1]:3261,3"}}, 1, 2)}
	}}
	_, err := Login(context.Background(), c, baseConfig())
	var re *RedirectError
	if !errors.As(err, &re) || re.Address != "[2001:db8::1]:3261" || re.TPGT != 3 || !re.Permanent {
		t.Fatalf("redirect: %v", err)
	}
}

func TestProtocolViolations(t *testing.T) {
	tests := map[string]func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire{
		"wrong ITT": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			w := resp(req, true, false, 0, 1, nil, 0, 0)
			w.bhs[16] ^= 1
			return []wire{w}
		},
		"wrong ISID": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			w := resp(req, true, false, 0, 1, nil, 0, 0)
			w.bhs[9] ^= 1
			return []wire{w}
		},
		"AuthMethod not offered": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			return []wire{resp(req, false, false, 0, 1, []KeyValue{{"AuthMethod", "SRP"}}, 0, 0)}
		},
		"skips to full feature from security": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			return []wire{resp(req, true, false, 0, 3, []KeyValue{{"AuthMethod", "None"}}, 0, 0)}
		},
		"key twice": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			return []wire{resp(req, true, false, 0, 1, []KeyValue{{"AuthMethod", "None"}, {"AuthMethod", "None"}}, 0, 0)}
		},
		"never transits": func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			return []wire{resp(req, false, false, 0, 0, []KeyValue{{"AuthMethod", "None"}}, 0, 0)}
		},
	}
	for name, respond := range tests {
		t.Run(name, func(t *testing.T) {
			c := &scriptConn{t: t, respond: respond}
			_, err := Login(context.Background(), c, baseConfig())
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestParseTargetAddress(t *testing.T) {
	tests := []struct {
		in   string
		addr string
		tpgt uint16
		ok   bool
	}{
		{"10.0.0.1", "10.0.0.1:3260", 0, true},
		{"10.0.0.1:3261,2", "10.0.0.1:3261", 2, true},
		{"host.example,7", "host.example:3260", 7, true},
		{"[fe80::1]", "[fe80::1]:3260", 0, true},
		{"[fe80::1]:99,1", "[fe80::1]:99", 1, true},
		{"", "", 0, false},
		{":3260", "", 0, false},
		{"[fe80::1", "", 0, false},
		{"1.2.3.4:0", "", 0, false},
		{"1.2.3.4,x", "", 0, false},
		{"[::1]x", "", 0, false},
	}
	for _, tt := range tests {
		addr, tpgt, err := ParseTargetAddress(tt.in)
		if (err == nil) != tt.ok || addr != tt.addr || tpgt != tt.tpgt {
			t.Errorf("ParseTargetAddress(%q) = %q %d %v", tt.in, addr, tpgt, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	c := &scriptConn{t: t}
	for name, cfg := range map[string]*Config{
		"no initiator":  {TargetName: "x"},
		"no target":     {InitiatorName: "x"},
		"same secrets":  {InitiatorName: "x", TargetName: "y", CHAP: &CHAP{User: "u", Secret: "s", TargetSecret: "s"}},
		"bad proposal":  {InitiatorName: "x", TargetName: "y", Proposal: Proposal{MaxRecvDataSegmentLength: 100}},
		"ERL requested": {InitiatorName: "x", TargetName: "y", Proposal: func() Proposal { p := DefaultProposal(); p.ErrorRecoveryLevel = 1; return p }()},
	} {
		c.respond = target(func([]KeyValue) ([]KeyValue, bool) { return nil, true })
		if _, err := Login(context.Background(), c, cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
