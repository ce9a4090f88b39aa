package login

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// chapTarget scripts a target that requires CHAP: it challenges with (7, challenge) and, if the
// initiator challenges back, answers as targetUser with targetSecret.
type chapTarget struct {
	t            *testing.T
	alg          string
	challenge    []byte
	wantResponse string
	targetUser   string
	targetSecret string
	gotCHAPC     []byte
	gotCHAPI     byte
}

func (ct *chapTarget) respond(req *pdu.BHS, kvs []KeyValue, _ []byte) []wire {
	csg, _ := req.LoginStages()
	if csg == pdu.StageOperational {
		return []wire{resp(req, true, false, 1, 3, nil, 0, 0)}
	}
	if _, ok := get(kvs, "AuthMethod"); ok {
		return []wire{resp(req, false, false, 0, 0, []KeyValue{{"AuthMethod", "CHAP"}}, 0, 0)}
	}
	if a, ok := get(kvs, "CHAP_A"); ok {
		if a != "5" {
			ct.t.Errorf("CHAP_A offered %q", a)
		}
		return []wire{resp(req, false, false, 0, 0, []KeyValue{{"CHAP_A", ct.alg}, {"CHAP_I", "7"},
			{"CHAP_C", encodeCHAPBinary(ct.challenge)}}, 0, 0)}
	}
	r, _ := get(kvs, "CHAP_R")
	if r != ct.wantResponse {
		return []wire{resp(req, false, false, 0, 0, nil, 2, 1)}
	}
	var out []KeyValue
	if c, ok := get(kvs, "CHAP_C"); ok {
		ct.gotCHAPC, _ = decodeCHAPBinary(c)
		i, _ := get(kvs, "CHAP_I")
		id, _ := decodeCHAPIdentifier(i)
		ct.gotCHAPI = id
		sum := chapResponse(id, ct.targetSecret, ct.gotCHAPC)
		out = []KeyValue{{"CHAP_N", ct.targetUser}, {"CHAP_R", encodeCHAPBinary(sum[:])}}
	}
	return []wire{resp(req, true, false, 0, 1, out, 0, 0)}
}

func chapTargetFor(t *testing.T) *chapTarget {
	ch, _ := hex.DecodeString("00112233445566778899aabbccddeeff")
	return &chapTarget{t: t, alg: "5", challenge: ch,
		wantResponse: "0x9a06649fbd2531132957d994aafb45f2", // MD5(0x07 ‖ "secret-1234" ‖ challenge), computed independently
		targetUser:   "tgt", targetSecret: "target-secret-99"}
}

func TestCHAP(t *testing.T) {
	tests := []struct {
		name   string
		chap   *CHAP
		tweak  func(ct *chapTarget)
		err    error
		reason string
	}{
		{name: "one-way", chap: &CHAP{User: "u", Secret: "secret-1234"}},
		{name: "mutual", chap: &CHAP{User: "u", Secret: "secret-1234", TargetUser: "tgt", TargetSecret: "target-secret-99"}},
		{name: "mutual without target user check", chap: &CHAP{User: "u", Secret: "secret-1234", TargetSecret: "target-secret-99"}},
		{name: "wrong secret", chap: &CHAP{User: "u", Secret: "wrong"}, err: ErrAuthFailed, reason: "authentication failure"},
		{name: "target fails mutual", chap: &CHAP{User: "u", Secret: "secret-1234", TargetSecret: "other-secret"},
			err: ErrAuthFailed, reason: "does not match"},
		{name: "target names itself wrongly", chap: &CHAP{User: "u", Secret: "secret-1234", TargetUser: "someone", TargetSecret: "target-secret-99"},
			err: ErrAuthFailed, reason: "authenticated as"},
		{name: "no credentials", chap: nil, err: ErrAuthFailed, reason: "requires CHAP"},
		{name: "unsupported algorithm", chap: &CHAP{User: "u", Secret: "secret-1234"}, tweak: func(ct *chapTarget) { ct.alg = "7" }, err: ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := chapTargetFor(t)
			if tt.tweak != nil {
				tt.tweak(ct)
			}
			c := &scriptConn{t: t, respond: ct.respond}
			cfg := baseConfig()
			cfg.CHAP = tt.chap
			_, err := Login(context.Background(), c, cfg)
			if tt.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				auth, _ := get(c.reqs[0], "AuthMethod")
				if tt.chap.Mutual() != (auth == "CHAP") {
					t.Fatalf("AuthMethod offered %q", auth)
				}
				return
			}
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.reason) || !strings.Contains(err.Error(), "iqn.2026-11.test:tgt") {
				t.Fatalf("err = %v, want %v mentioning %q", err, tt.err, tt.reason)
			}
			if tt.chap != nil && (strings.Contains(err.Error(), tt.chap.Secret) || (tt.chap.TargetSecret != "" && strings.Contains(err.Error(), tt.chap.TargetSecret))) {
				t.Fatalf("error leaks a secret: %v", err)
			}
		})
	}
}

// TestCHAPReflection: a target that offers, as its own challenge, a challenge we sent it earlier
// is refused (RFC 7143 §12.1.3).
func TestCHAPReflection(t *testing.T) {
	ct := chapTargetFor(t)
	c := &scriptConn{t: t, respond: ct.respond}
	cfg := baseConfig()
	cfg.CHAP = &CHAP{User: "u", Secret: "secret-1234", TargetSecret: "target-secret-99"}
	if _, err := Login(context.Background(), c, cfg); err != nil {
		t.Fatal(err)
	}
	if len(ct.gotCHAPC) == 0 {
		t.Fatal("no challenge from the initiator")
	}
	ours := ct.gotCHAPC
	ct2 := chapTargetFor(t)
	ct2.challenge = ours
	c2 := &scriptConn{t: t, respond: ct2.respond}
	_, err := Login(context.Background(), c2, cfg)
	if !errors.Is(err, ErrAuthFailed) || !strings.Contains(err.Error(), "reflection") {
		t.Fatalf("reflected challenge: %v", err)
	}
	// Mutual CHAP with a target that refuses to authenticate (AuthMethod=None) fails.
	c3 := &scriptConn{t: t, respond: target(func([]KeyValue) ([]KeyValue, bool) { return nil, true })}
	if _, err := Login(context.Background(), c3, cfg); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("mutual CHAP against AuthMethod=None: %v", err)
	}
}

func TestCHAPValues(t *testing.T) {
	for in, want := range map[string]string{
		"0x0a0B": "0a0b", "0X1": "01", "0bAQID": "010203", "0BAQID": "010203",
	} {
		b, err := decodeCHAPBinary(in)
		if err != nil || hex.EncodeToString(b) != want {
			t.Errorf("decodeCHAPBinary(%q) = %x, %v", in, b, err)
		}
	}
	for _, bad := range []string{"", "0x", "12", "0xzz", "0b!!", "0c00"} {
		if _, err := decodeCHAPBinary(bad); !errors.Is(err, ErrCHAP) {
			t.Errorf("decodeCHAPBinary(%q) = %v", bad, err)
		}
	}
	for in, want := range map[string]byte{"0": 0, "255": 255, "0x1f": 31} {
		if id, err := decodeCHAPIdentifier(in); err != nil || id != want {
			t.Errorf("decodeCHAPIdentifier(%q) = %d %v", in, id, err)
		}
	}
	for _, bad := range []string{"256", "-1", "x", ""} {
		if _, err := decodeCHAPIdentifier(bad); err == nil {
			t.Errorf("decodeCHAPIdentifier(%q) accepted", bad)
		}
	}
	if s := (CHAP{User: "u", Secret: "topsecret", TargetSecret: "alsosecret"}).String(); strings.Contains(s, "secret\"") || strings.Contains(s, "topsecret") {
		t.Fatalf("CHAP.String leaks: %s", s)
	}
}
