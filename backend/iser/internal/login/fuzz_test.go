package login

import (
	"bytes"
	"context"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// FuzzDecodeText: never panics; accepted text re-encodes to the same pairs.
func FuzzDecodeText(f *testing.F) {
	f.Add([]byte("HeaderDigest=None\x00MaxRecvDataSegmentLength=8192\x00"))
	f.Add([]byte("A=1\x00\x00\x00"))
	f.Add([]byte("TargetName=iqn.x\x00TargetAddress=[::1]:3260,1\x00"))
	f.Add([]byte("=\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		kvs, err := DecodeText(data)
		if err == nil {
			again, err := DecodeText(EncodeText(nil, kvs))
			if err != nil || len(again) != len(kvs) {
				t.Fatalf("re-encoded text does not decode: %v", err)
			}
		}
		multi, err := DecodeTextMulti(data)
		if err == nil {
			for _, kv := range multi {
				if kv.Key == "" || bytes.IndexByte([]byte(kv.Key), '=') >= 0 {
					t.Fatalf("bad key %q", kv.Key)
				}
			}
		}
		_, _, _ = ParseTargetAddress(string(data))
	})
}

// FuzzCHAP: CHAP message parsing never panics and never accepts what it cannot use.
func FuzzCHAP(f *testing.F) {
	f.Add([]byte("CHAP_A=5\x00CHAP_I=7\x00CHAP_C=0x00112233\x00"))
	f.Add([]byte("CHAP_N=tgt\x00CHAP_R=0b9a06649fbd2531132957d994aafb45f2\x00"))
	f.Add([]byte("CHAP_A=5\x00CHAP_I=0x1ff\x00CHAP_C=0bAAAA\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		kvs, err := DecodeTextMulti(data)
		if err != nil {
			return
		}
		if ch, err := parseCHAPChallenge(kvs); err == nil {
			if ch.Alg != CHAPAlgMD5 || len(ch.Challenge) == 0 || len(ch.Challenge) > maxCHAPBinary {
				t.Fatalf("accepted challenge %+v", ch)
			}
			_ = chapResponse(ch.ID, "s", ch.Challenge)
		}
		if r, err := parseCHAPTargetResponse(kvs); err == nil {
			_ = verifyCHAP(1, "s", []byte{1}, r.Response)
		}
		for _, kv := range kvs {
			_, _ = decodeCHAPBinary(kv.Value)
			_, _ = decodeCHAPIdentifier(kv.Value)
		}
	})
}

// FuzzLoginResponses drives a whole login against arbitrary target answers: no panic, and
// either a login or an error.
func FuzzLoginResponses(f *testing.F) {
	f.Add([]byte("AuthMethod=None\x00"), []byte("HeaderDigest=None\x00MaxRecvDataSegmentLength=4096\x00"), uint8(0x87), uint8(0x87))
	f.Add([]byte("AuthMethod=CHAP\x00"), []byte("MaxBurstLength=1\x00"), uint8(0x81), uint8(0x07))
	f.Fuzz(func(t *testing.T, sec, op []byte, secFlags, opFlags uint8) {
		c := &scriptConn{t: t}
		c.respond = func(req *pdu.BHS, _ []KeyValue, _ []byte) []wire {
			csg, _ := req.LoginStages()
			text, flags := sec, secFlags
			if csg == pdu.StageOperational {
				text, flags = op, opFlags
			}
			var b pdu.BHS
			pdu.EncodeLoginResponse(&b, false, false, 0, 0, len(text), req.ISID(), 1, req.ITT(), pdu.TargetHeader{}, 0, 0)
			b[1] = flags
			return []wire{{b, text}}
		}
		cfg := baseConfig()
		cfg.CHAP = &CHAP{User: "u", Secret: "s"}
		_, _ = Login(context.Background(), c, cfg)
	})
}
