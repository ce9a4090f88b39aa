package statefile

import (
	"encoding/json"
	"testing"

	"github.com/iser-blk/iser-blk/internal/modes"
)

// FuzzDecode: a state file is bytes from disk that anyone with access to the run directory may
// have written; Decode must never panic, and what it accepts must be a valid State that
// round-trips.
func FuzzDecode(f *testing.F) {
	good, _ := json.Marshal(Fresh("gw", modes.Ublk, 1, lun, modes.WriteBack, 9))
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Decode(data)
		if err != nil {
			return
		}
		if s.validate() != nil || s.Version != Version {
			t.Fatalf("accepted invalid state %+v", s)
		}
		again, _ := json.Marshal(s)
		if _, err := Decode(again); err != nil {
			t.Fatalf("re-encoded state rejected: %v", err)
		}
	})
}
