package control

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeRequest: any bytes decode to a valid request or an *Error with a known code, never
// a panic; an accepted request re-encodes and decodes to itself.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"op":"status"}`,
		`{"version":1,"op":"detach","force":true,"timeout_ms":30000}`,
		`{"version":1,"op":"restart"}`,
		`{"version":2,"op":"status"}`,
		`{"version":1,"op":"status"} {}`,
		`{"version":1e400}`,
		`[]`, `null`, ``, `{"op":null}`,
	} {
		f.Add([]byte(s))
	}
	codes := map[string]bool{CodeBadRequest: true, CodeTooLarge: true, CodeUnsupportedVersion: true, CodeUnknownOp: true}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := DecodeRequest(line)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || !codes[ce.Code] {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		if req.Version != ProtocolVersion || req.TimeoutMS < 0 {
			t.Fatalf("accepted %+v", req)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeRequest(b)
		if err != nil || again != req {
			t.Fatalf("re-decode of %s: %+v %v", b, again, err)
		}
	})
}
