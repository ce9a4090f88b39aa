package rdma

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
)

func TestHeaderRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		h    Header
		wire []byte
	}{
		{"control only", Header{Flags: OpcodeControl},
			append([]byte{0x10, 0, 0, 0}, make([]byte, 24)...)},
		{"write", Header{Flags: OpcodeControl | FlagWSV, WriteSTag: 0x11223344, WriteVA: 0x0102030405060708},
			[]byte{0x18, 0, 0, 0, 0x11, 0x22, 0x33, 0x44, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"read", Header{Flags: OpcodeControl | FlagRSV, ReadSTag: 0xaabbccdd, ReadVA: 0x7f0000001000},
			[]byte{0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0x7f, 0, 0, 0, 0x10, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := make([]byte, HeaderLen)
			c.h.Encode(b)
			if !bytes.Equal(b, c.wire) {
				t.Fatalf("encoded % x\nwant    % x", b, c.wire)
			}
			got, err := decodeHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.h {
				t.Fatalf("decoded %+v, want %+v", got, c.h)
			}
		})
	}
}

func TestDecodeHeaderRejects(t *testing.T) {
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"short", make([]byte, 27), "27 bytes"},
		{"empty", nil, "0 bytes"},
		{"hello", append([]byte{OpcodeHello}, make([]byte, 27)...), "Hello"},
		{"hello reply", append([]byte{OpcodeHelloReply}, make([]byte, 27)...), "Hello"},
		{"zero opcode", make([]byte, 28), "unknown iSER opcode"},
		{"opcode 0xf", append([]byte{0xf0}, make([]byte, 27)...), "unknown iSER opcode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeHeader(c.b)
			if !errors.Is(err, ErrMalformedHeader) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want ErrMalformedHeader mentioning %q", err, c.want)
			}
		})
	}
}

func TestCMPrivateData(t *testing.T) {
	// Linux ib_iser: ISER_ZBVA_NOT_SUP (0x80) | ISER_SEND_W_INV_NOT_SUP (0x40), 3 reserved bytes.
	if got := CMPrivateData(); !bytes.Equal(got, []byte{0xc0, 0, 0, 0}) {
		t.Fatalf("CM private data % x", got)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	b := make([]byte, HeaderLen)
	(&Header{Flags: OpcodeControl | FlagRSV, ReadSTag: 7, ReadVA: 1 << 40}).Encode(b)
	f.Add(b)
	f.Add([]byte{0x10})
	f.Add(append([]byte{0x20}, make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := decodeHeader(in)
		if err != nil {
			return
		}
		out := make([]byte, HeaderLen)
		h.Encode(out)
		// reserved bytes are dropped; everything else round-trips
		in2 := append([]byte(nil), in[:HeaderLen]...)
		in2[1], in2[2], in2[3] = 0, 0, 0
		if !bytes.Equal(out, in2) {
			t.Fatalf("round trip: % x -> %+v -> % x", in[:HeaderLen], h, out)
		}
	})
}

func TestLoginHookPropose(t *testing.T) {
	h := newLoginHook(8192, 8192, 8)
	p := login.DefaultProposal()
	p.HeaderDigest, p.DataDigest = login.DigestCRC32C, login.DigestPreferCRC32C
	p.MaxBurstLength = 16 << 20
	kvs := h.Propose(&p)
	if p.HeaderDigest != login.DigestNone || p.DataDigest != login.DigestNone {
		t.Errorf("digests not turned off: %v %v", p.HeaderDigest, p.DataDigest)
	}
	if !p.InitialR2T || p.MaxRecvDataSegmentLength != 8192 || p.MaxBurstLength != 1<<24-1 {
		t.Errorf("proposal %+v", p)
	}
	want := []login.KeyValue{{Key: "RDMAExtensions", Value: "Yes"}, {Key: "InitiatorRecvDataSegmentLength", Value: "8192"},
		{Key: "TargetRecvDataSegmentLength", Value: "8192"}, {Key: "MaxOutstandingUnexpectedPDUs", Value: "8"}}
	if len(kvs) != len(want) {
		t.Fatalf("keys %v", kvs)
	}
	for i := range want {
		if kvs[i] != want[i] {
			t.Errorf("key %d: %v, want %v", i, kvs[i], want[i])
		}
	}
}

func TestLoginHookNegotiation(t *testing.T) {
	type kv struct{ k, v string }
	cases := []struct {
		name      string
		answers   []kv
		acceptErr string // error from Accept
		finishErr string // error from Finish
		irdsl     string
		trdsl     string
		mou       string
	}{
		{name: "LIO", answers: []kv{{"RDMAExtensions", "Yes"}, {"InitiatorRecvDataSegmentLength", "262144"},
			{"TargetRecvDataSegmentLength", "8192"}, {"MaxOutstandingUnexpectedPDUs", "NotUnderstood"}},
			irdsl: "8192", trdsl: "8192", mou: "0"},
		{name: "tgt smaller", answers: []kv{{"RDMAExtensions", "Yes"}, {"InitiatorRecvDataSegmentLength", "4096"},
			{"TargetRecvDataSegmentLength", "2048"}, {"MaxOutstandingUnexpectedPDUs", "4"}},
			irdsl: "4096", trdsl: "2048", mou: "4"},
		{name: "unlimited unexpected", answers: []kv{{"RDMAExtensions", "Yes"}, {"MaxOutstandingUnexpectedPDUs", "0"}},
			irdsl: "8192", trdsl: "8192", mou: "8"},
		{name: "no iSER", answers: []kv{{"RDMAExtensions", "No"}}, acceptErr: "does not speak iSER"},
		{name: "RDMAExtensions not understood", answers: []kv{{"RDMAExtensions", "NotUnderstood"}}, acceptErr: "does not speak iSER"},
		{name: "never answered", answers: nil, finishErr: "did not accept RDMAExtensions"},
		{name: "bad length", answers: []kv{{"RDMAExtensions", "Yes"}, {"TargetRecvDataSegmentLength", "100"}}, acceptErr: "512..16777215"},
		{name: "garbage length", answers: []kv{{"RDMAExtensions", "Yes"}, {"InitiatorRecvDataSegmentLength", "lots"}}, acceptErr: "not a length"},
		{name: "garbage unexpected", answers: []kv{{"RDMAExtensions", "Yes"}, {"MaxOutstandingUnexpectedPDUs", "-1"}}, acceptErr: "not a number"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newLoginHook(8192, 8192, 8)
			var err error
			for _, a := range c.answers {
				var handled bool
				_, handled, err = h.Accept(a.k, a.v)
				if !handled {
					t.Fatalf("key %s not handled", a.k)
				}
				if err != nil {
					break
				}
			}
			if c.acceptErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.acceptErr) {
					t.Fatalf("Accept error %v, want %q", err, c.acceptErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p := login.Defaults()
			p.TargetName = "iqn.x"
			err = h.Finish(&p)
			if c.finishErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.finishErr) {
					t.Fatalf("Finish error %v, want %q", err, c.finishErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Extra["InitiatorRecvDataSegmentLength"] != c.irdsl || p.Extra["TargetRecvDataSegmentLength"] != c.trdsl ||
				p.Extra["MaxOutstandingUnexpectedPDUs"] != c.mou {
				t.Fatalf("extra %v, want IRDSL %s TRDSL %s MOU %s", p.Extra, c.irdsl, c.trdsl, c.mou)
			}
			if want := c.irdsl; want != "" && p.MaxRecvDataSegmentLength != atou(want) {
				t.Errorf("MaxRecvDataSegmentLength %d, want %s", p.MaxRecvDataSegmentLength, want)
			}
			if want := c.trdsl; want != "" && p.TargetMaxRecvDataSegmentLength != atou(want) {
				t.Errorf("TargetMaxRecvDataSegmentLength %d, want %s", p.TargetMaxRecvDataSegmentLength, want)
			}
		})
	}
}

func TestLoginHookIgnoresOtherKeys(t *testing.T) {
	h := newLoginHook(8192, 8192, 8)
	if _, handled, err := h.Accept("X-com.example.Foo", "1"); handled || err != nil {
		t.Fatalf("unknown key handled=%v err=%v", handled, err)
	}
}

func TestLoginHookDigestsRefused(t *testing.T) {
	h := newLoginHook(8192, 8192, 8)
	h.Accept("RDMAExtensions", "Yes")
	p := login.Defaults()
	p.TargetName = "iqn.x"
	p.HeaderDigest = true
	if err := h.Finish(&p); err == nil || !strings.Contains(err.Error(), "digests") {
		t.Fatalf("Finish with digests: %v", err)
	}
}

func atou(s string) uint32 {
	var n uint32
	for _, c := range s {
		n = n*10 + uint32(c-'0')
	}
	return n
}

func TestLoginHookTgtCmdSNWindow(t *testing.T) {
	cases := []struct{ exp, max, wantExp uint32 }{
		{exp: 2, max: 1, wantExp: 1},                   // tgt's iSER login answer after a login with CmdSN 1
		{exp: 1, max: 64, wantExp: 1},                  // LIO: ExpCmdSN = the login's CmdSN, open window
		{exp: 5, max: 5, wantExp: 5},                   // window of one
		{exp: 0, max: 0xffffffff, wantExp: 0xffffffff}, // wrap-around form of the same quirk
	}
	for _, c := range cases {
		h := newLoginHook(8192, 8192, 8)
		h.Accept("RDMAExtensions", "Yes")
		p := login.Defaults()
		p.TargetName = "iqn.x"
		p.ExpCmdSN, p.MaxCmdSN = c.exp, c.max
		if err := h.Finish(&p); err != nil {
			t.Fatal(err)
		}
		if p.ExpCmdSN != c.wantExp {
			t.Errorf("ExpCmdSN %d MaxCmdSN %d: first CmdSN %d, want %d", c.exp, c.max, p.ExpCmdSN, c.wantExp)
		}
	}
}

// FuzzLoginHookAccept feeds target answers to the iSER keys: no panic, and whatever is accepted
// keeps the negotiated segment lengths within what our descriptors hold.
func FuzzLoginHookAccept(f *testing.F) {
	f.Add("RDMAExtensions", "Yes", "TargetRecvDataSegmentLength", "4096")
	f.Add("InitiatorRecvDataSegmentLength", "262144", "MaxOutstandingUnexpectedPDUs", "0")
	f.Add("MaxOutstandingUnexpectedPDUs", "NotUnderstood", "TargetRecvDataSegmentLength", "0x2000")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		h := newLoginHook(8192, 8192, 8)
		h.Accept("RDMAExtensions", "Yes")
		h.Accept(k1, v1)
		h.Accept(k2, v2)
		p := login.Defaults()
		p.TargetName = "iqn.x"
		if err := h.Finish(&p); err != nil {
			return
		}
		if p.MaxRecvDataSegmentLength < 512 || p.MaxRecvDataSegmentLength > 8192 ||
			p.TargetMaxRecvDataSegmentLength < 512 || p.TargetMaxRecvDataSegmentLength > 8192 {
			t.Fatalf("negotiated IRDSL %d TRDSL %d outside 512..8192", p.MaxRecvDataSegmentLength, p.TargetMaxRecvDataSegmentLength)
		}
	})
}
