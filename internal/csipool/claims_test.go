package csipool

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testClaim(t *testing.T, name string, lun int) Claim {
	t.Helper()
	id, err := NewVolumeID()
	if err != nil {
		t.Fatal(err)
	}
	key := "iqn.2001-04.com.example:pool/" + string(rune('0'+lun))
	return Claim{ID: id, Name: name, LUN: key, Size: int64(lun) << 30,
		Context: map[string]string{ContextTarget: "iscsi://192.0.2.10:3260/" + key, ContextTransport: "iscsi", ContextCache: "off"},
		Created: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)}
}

func TestClaimsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "claims.json")
	if got, err := loadClaims(path); err != nil || len(got) != 0 {
		t.Fatalf("a missing file: %v, %v; want no claims", got, err)
	}
	if _, err := ReadClaims(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadClaims of a missing file: %v", err)
	}
	claims := []Claim{testClaim(t, "b", 2), testClaim(t, "a", 1), testClaim(t, "c", 3)}
	if err := WriteClaims(path, claims); err != nil {
		t.Fatal(err)
	}
	got, err := ReadClaims(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(claims) {
		t.Fatalf("%d claims read back, want %d", len(got), len(claims))
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].ID >= got[i].ID {
			t.Fatalf("claims not sorted by ID: %s before %s", got[i-1].ID, got[i].ID)
		}
	}
	byName := map[string]Claim{}
	for _, c := range got {
		byName[c.Name] = c
	}
	for _, c := range claims {
		if !reflect.DeepEqual(byName[c.Name], c) {
			t.Errorf("read back %+v, wrote %+v", byName[c.Name], c)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("claims file mode %v, %v; want 0600", st.Mode(), err)
	}
	// Rewriting to no claims leaves an empty list, and no temporary file behind.
	if err := WriteClaims(path, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadClaims(path); err != nil || len(got) != 0 {
		t.Fatalf("after writing none: %v, %v", got, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the claims file: %v", len(entries), entries)
	}
}

func TestWriteClaimsFailsWithoutDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone", "claims.json")
	if err := WriteClaims(path, []Claim{testClaim(t, "a", 1)}); err == nil {
		t.Fatal("wrote into a directory that does not exist")
	}
}

func TestDecodeClaimsRejects(t *testing.T) {
	good := testClaim(t, "a", 1)
	enc := func(mutate func(m map[string]any)) string {
		b, _ := json.Marshal(good)
		var c map[string]any
		json.Unmarshal(b, &c)
		mutate(c)
		f, _ := json.Marshal(map[string]any{"version": 1, "claims": []any{c}})
		return string(f)
	}
	two := func(second Claim) string {
		f, _ := json.Marshal(claimsFile{Version: 1, Claims: []Claim{good, second}})
		return string(f)
	}
	other := testClaim(t, "b", 2)
	sameID, sameName, sameLUN := other, other, other
	sameID.ID, sameName.Name, sameLUN.LUN, sameLUN.Context = good.ID, good.Name, good.LUN, good.Context
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "EOF"},
		{"not JSON", "claims", "invalid character"},
		{"null", "null", "version 0"},
		{"other version", `{"version":2,"claims":[]}`, "version 2"},
		{"unknown field", `{"version":1,"claims":[],"extra":1}`, "unknown field"},
		{"trailing data", `{"version":1,"claims":[]} {}`, "data after"},
		{"bad ID", enc(func(m map[string]any) { m["id"] = "pvc-1" }), "volume ID"},
		{"no name", enc(func(m map[string]any) { m["name"] = "" }), "volume name"},
		{"long name", enc(func(m map[string]any) { m["name"] = strings.Repeat("n", maxNameBytes+1) }), "volume name"},
		{"no LUN", enc(func(m map[string]any) { m["lun"] = "" }), "no LUN"},
		{"zero size", enc(func(m map[string]any) { m["size"] = 0 }), "size 0"},
		{"no context", enc(func(m map[string]any) { delete(m, "context") }), "targets is missing"},
		{"context of another LUN", enc(func(m map[string]any) { m["lun"] = "iqn.x:y/9" }), "not LUN"},
		{"bad cache", enc(func(m map[string]any) { m["context"].(map[string]any)["cache"] = "fast" }), "cache"},
		{"no transport", enc(func(m map[string]any) { delete(m["context"].(map[string]any), "transport") }), "no transport"},
		{"claim field unknown", enc(func(m map[string]any) { m["owner"] = "x" }), "unknown field"},
		{"ID twice", two(sameID), "volume ID"},
		{"name twice", two(sameName), "volume name"},
		{"LUN claimed twice", two(sameLUN), "claimed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeClaims([]byte(tc.data))
			if err == nil {
				t.Fatalf("accepted %+v", got)
			}
			if !errors.Is(err, ErrClaimsCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want ErrClaimsCorrupt and %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeClaims: the claims file may be damaged by anything that writes the controller's
// volume; DecodeClaims must never panic, and what it accepts must be consistent claims that
// survive being encoded and decoded again.
func FuzzDecodeClaims(f *testing.F) {
	c := Claim{ID: idPrefix + strings.Repeat("ab", 16), Name: "pvc-1", LUN: "iqn.a:b/1", Size: 1 << 30,
		Context: map[string]string{ContextTarget: "iscsi://h:3260/iqn.a:b/1", ContextTransport: "iscsi", ContextFrontend: "ublk"}}
	good, _ := json.Marshal(claimsFile{Version: 1, Claims: []Claim{c}})
	f.Add(good)
	f.Add([]byte(`{"version":1,"claims":[]}`))
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		claims, err := DecodeClaims(data)
		if err != nil {
			if !errors.Is(err, ErrClaimsCorrupt) {
				t.Fatalf("error without ErrClaimsCorrupt: %v", err)
			}
			return
		}
		luns := map[string]bool{}
		for _, c := range claims {
			if c.validate() != nil || luns[c.LUN] {
				t.Fatalf("accepted an invalid claim %+v", c)
			}
			luns[c.LUN] = true
		}
		// WriteClaims' encoding, without the disk (an fsync per input would starve the fuzzer).
		again, err := json.Marshal(claimsFile{Version: ClaimsVersion, Claims: claims})
		if err != nil {
			t.Fatal(err)
		}
		if back, err := DecodeClaims(again); err != nil || len(back) != len(claims) {
			t.Fatalf("written back: %d claims, %v; want %d", len(back), err, len(claims))
		}
	})
}
