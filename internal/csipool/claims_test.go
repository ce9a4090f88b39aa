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

// testErasing is LUN n of testClaim's pool, mid-erase after its volume's deletion.
func testErasing(t *testing.T, lun int) Erasing {
	t.Helper()
	c := testClaim(t, "x", lun)
	return Erasing{LUN: c.LUN, Size: c.Size, VolumeID: c.ID, Deleted: time.Date(2026, 12, 5, 2, 0, 0, 0, time.UTC)}
}

// TestClaimsVersion1Read: a file of the version before erasing (no "erasing" list) still reads,
// as claims with nothing mid-erase; one that lists erasing LUNs under version 1 is corrupt, and
// WriteClaims writes the current version.
func TestClaimsVersion1Read(t *testing.T) {
	c := testClaim(t, "a", 1)
	v1, _ := json.Marshal(map[string]any{"version": 1, "claims": []Claim{c}})
	st, err := DecodeClaims(v1)
	if err != nil || len(st.Claims) != 1 || !reflect.DeepEqual(st.Claims[0], c) || st.Erasing == nil || len(st.Erasing) != 0 {
		t.Fatalf("version 1: %+v, %v", st, err)
	}
	bad, _ := json.Marshal(map[string]any{"version": 1, "claims": []Claim{}, "erasing": []Erasing{testErasing(t, 2)}})
	if _, err := DecodeClaims(bad); !errors.Is(err, ErrClaimsCorrupt) || !strings.Contains(err.Error(), "version 1 has no erasing") {
		t.Fatalf("version 1 with erasing LUNs: %v", err)
	}
	path := filepath.Join(t.TempDir(), "claims.json")
	if err := WriteClaims(path, st); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil || f["version"] != float64(ClaimsVersion) || f["erasing"] == nil {
		t.Fatalf("written back: %s, %v; want version %d with an erasing list", data, err, ClaimsVersion)
	}
}

func TestClaimsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "claims.json")
	if got, err := loadClaims(path); err != nil || len(got.Claims) != 0 || len(got.Erasing) != 0 {
		t.Fatalf("a missing file: %v, %v; want no claims", got, err)
	}
	if _, err := ReadClaims(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadClaims of a missing file: %v", err)
	}
	claims := []Claim{testClaim(t, "b", 2), testClaim(t, "a", 1), testClaim(t, "c", 3)}
	erasing := []Erasing{testErasing(t, 5), testErasing(t, 4)}
	if err := WriteClaims(path, ClaimsState{Claims: claims, Erasing: erasing}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadClaims(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Erasing, []Erasing{erasing[1], erasing[0]}) {
		t.Errorf("erasing read back %+v, wrote %+v (sorted by LUN)", st.Erasing, erasing)
	}
	got := st.Claims
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
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("claims file mode %v, %v; want 0600", fi.Mode(), err)
	}
	// Rewriting to no claims leaves an empty list, and no temporary file behind.
	if err := WriteClaims(path, ClaimsState{}); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadClaims(path); err != nil || got.Claims == nil || len(got.Claims) != 0 || got.Erasing == nil || len(got.Erasing) != 0 {
		t.Fatalf("after writing none: %v, %v", got, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the claims file: %v", len(entries), entries)
	}
}

func TestWriteClaimsFailsWithoutDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone", "claims.json")
	if err := WriteClaims(path, ClaimsState{Claims: []Claim{testClaim(t, "a", 1)}}); err == nil {
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
	goodErasing := testErasing(t, 2)
	encErasing := func(mutate func(m map[string]any)) string {
		b, _ := json.Marshal(goodErasing)
		var e map[string]any
		json.Unmarshal(b, &e)
		mutate(e)
		f, _ := json.Marshal(map[string]any{"version": 2, "claims": []any{good}, "erasing": []any{e}})
		return string(f)
	}
	other := testClaim(t, "b", 2)
	sameID, sameName, sameLUN := other, other, other
	sameID.ID, sameName.Name, sameLUN.LUN, sameLUN.Context = good.ID, good.Name, good.LUN, good.Context
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "EOF"},
		{"not JSON", "claims", "invalid character"},
		{"null", "null", "version 0"},
		{"other version", `{"version":3,"claims":[]}`, "version 3"},
		{"version 1 erasing", `{"version":1,"claims":[],"erasing":[{}]}`, "version 1 has no erasing"},
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
		{"erasing bad ID", encErasing(func(m map[string]any) { m["volume_id"] = "pvc-1" }), "erasing LUN 0: volume ID"},
		{"erasing no LUN", encErasing(func(m map[string]any) { m["lun"] = "" }), "LUN of 0 bytes"},
		{"erasing zero size", encErasing(func(m map[string]any) { m["size"] = 0 }), "size 0"},
		{"erasing field unknown", encErasing(func(m map[string]any) { m["progress"] = 1 }), "unknown field"},
		{"erasing a claimed LUN", encErasing(func(m map[string]any) { m["lun"] = good.LUN }), "both claimed and erasing"},
		{"erasing a live volume", encErasing(func(m map[string]any) { m["volume_id"] = good.ID }), "volume ID"},
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
	e := Erasing{LUN: "iqn.a:b/2", Size: 1 << 30, VolumeID: idPrefix + strings.Repeat("cd", 16)}
	v1, _ := json.Marshal(claimsFile{Version: 1, Claims: []Claim{c}})
	v2, _ := json.Marshal(claimsFile{Version: 2, Claims: []Claim{c}, Erasing: []Erasing{e}})
	f.Add(v1)
	f.Add(v2)
	f.Add([]byte(`{"version":1,"claims":[]}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2,"claims":[],"erasing":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeClaims(data)
		if err != nil {
			if !errors.Is(err, ErrClaimsCorrupt) {
				t.Fatalf("error without ErrClaimsCorrupt: %v", err)
			}
			return
		}
		luns, ids := map[string]bool{}, map[string]bool{}
		for _, c := range st.Claims {
			if c.validate() != nil || luns[c.LUN] || ids[c.ID] {
				t.Fatalf("accepted an invalid claim %+v", c)
			}
			luns[c.LUN], ids[c.ID] = true, true
		}
		for _, e := range st.Erasing {
			if e.validate() != nil || luns[e.LUN] || ids[e.VolumeID] {
				t.Fatalf("accepted an invalid erasing LUN %+v (claimed, or erasing twice?)", e)
			}
			luns[e.LUN], ids[e.VolumeID] = true, true
		}
		// WriteClaims' encoding, without the disk (an fsync per input would starve the fuzzer).
		again, err := json.Marshal(st.file())
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeClaims(again)
		if err != nil || len(back.Claims) != len(st.Claims) || len(back.Erasing) != len(st.Erasing) {
			t.Fatalf("written back: %+v, %v; want %d claims and %d erasing", back, err, len(st.Claims), len(st.Erasing))
		}
	})
}
