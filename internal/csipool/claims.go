package csipool

// The claims file: which volume holds which LUN of the pool, and which LUNs returned by
// DeleteVolume are still being erased. It is the controller's only memory across restarts, so it
// is written the way internal/statefile writes a gateway's state (temp file, fsync, rename, fsync
// of the directory: a crash leaves the old file or the new one), and read strictly: a file that
// is not exactly a claims file of a version this controller knows is an error, and the
// controller does not start on it (guessing would hand a claimed, or unerased, LUN out again).
//
// Versions: 1 has only "claims"; 2 (written since erasing was built) adds "erasing". A version 1
// file is read as one with nothing mid-erase (its controller erased nothing) and written back as
// version 2 at start, so an older controller refuses the file rather than hand out a LUN it
// does not know is mid-erase.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"time"

	"github.com/iser-blk/iser-blk/internal/atomicfile"
)

// ClaimsVersion is the format WriteClaims writes; DecodeClaims reads it and
// claimsVersionNoErase, and rejects any other.
const ClaimsVersion = 2

// claimsVersionNoErase is the format before the erasing list.
const claimsVersionNoErase = 1

// ErrClaimsCorrupt is wrapped by every error of a claims file that is not one.
var ErrClaimsCorrupt = errors.New("claims file is corrupt")

// maxClaimsBytes bounds DecodeClaims: a claim is a few hundred bytes.
const maxClaimsBytes = 32 << 20

// maxNameBytes is CSI's bound on a name (the spec's 128 bytes for string fields).
const maxNameBytes = 128

// Claim is one volume: a LUN of the pool held under a CreateVolume name.
type Claim struct {
	ID      string            `json:"id"`      // volume ID, NewVolumeID's form
	Name    string            `json:"name"`    // CreateVolume's name (idempotency)
	LUN     string            `json:"lun"`     // LUN.Key
	Size    int64             `json:"size"`    // bytes, as probed when claimed
	Context map[string]string `json:"context"` // the volume context handed out
	Created time.Time         `json:"created"`
}

// Erasing is a LUN whose volume was deleted and whose blocks are not known to be zeroes yet: it
// is handed out to no one until the erase succeeded and the entry is gone from the file.
type Erasing struct {
	LUN      string    `json:"lun"`       // LUN.Key
	Size     int64     `json:"size"`      // bytes, the deleted claim's
	VolumeID string    `json:"volume_id"` // the deleted volume (logs; IDs are never reused)
	Deleted  time.Time `json:"deleted"`   // when DeleteVolume returned it
}

// ClaimsState is what the claims file holds: the volumes, and the LUNs mid-erase.
type ClaimsState struct {
	Claims  []Claim
	Erasing []Erasing
}

// claimsFile is the file's JSON.
type claimsFile struct {
	Version int       `json:"version"`
	Claims  []Claim   `json:"claims"`
	Erasing []Erasing `json:"erasing"`
}

// idPrefix starts every volume ID this package makes.
const idPrefix = "pool-"

// NewVolumeID returns a fresh volume ID: "pool-" and 32 random hex digits. Random, not derived
// from the LUN or the name, so that an ID never comes back for another volume.
func NewVolumeID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return idPrefix + hex.EncodeToString(b[:]), nil
}

// validID reports whether id has NewVolumeID's form.
func validID(id string) bool {
	if len(id) != len(idPrefix)+32 || id[:len(idPrefix)] != idPrefix {
		return false
	}
	for _, c := range id[len(idPrefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ReadClaims loads the claims file at path. A missing file wraps fs.ErrNotExist (the caller
// decides whether that means an empty pool); anything else that is not a claims file wraps
// ErrClaimsCorrupt.
func ReadClaims(path string) (ClaimsState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ClaimsState{}, fmt.Errorf("claims file: %w", err)
	}
	st, err := DecodeClaims(data)
	if err != nil {
		return ClaimsState{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// DecodeClaims parses a claims file's bytes: one JSON object of a known version, no unknown
// field, nothing after it, and claims and erasing LUNs that are each valid and together
// consistent (no ID, name or LUN twice: a LUN held twice, or held and mid-erase, is exactly what
// the file exists to prevent). The slices of what it returns are never nil.
func DecodeClaims(data []byte) (ClaimsState, error) {
	if len(data) > maxClaimsBytes {
		return ClaimsState{}, fmt.Errorf("%w: %d bytes, at most %d", ErrClaimsCorrupt, len(data), maxClaimsBytes)
	}
	var f claimsFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return ClaimsState{}, fmt.Errorf("%w: %v", ErrClaimsCorrupt, err)
	}
	if dec.More() {
		return ClaimsState{}, fmt.Errorf("%w: data after the claims", ErrClaimsCorrupt)
	}
	switch {
	case f.Version != ClaimsVersion && f.Version != claimsVersionNoErase:
		return ClaimsState{}, fmt.Errorf("%w: version %d (this controller reads %d and %d)",
			ErrClaimsCorrupt, f.Version, claimsVersionNoErase, ClaimsVersion)
	case f.Version == claimsVersionNoErase && len(f.Erasing) > 0:
		return ClaimsState{}, fmt.Errorf("%w: version %d has no erasing LUNs", ErrClaimsCorrupt, f.Version)
	}
	ids, names, luns := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, c := range f.Claims {
		if err := c.validate(); err != nil {
			return ClaimsState{}, fmt.Errorf("%w: claim %d: %v", ErrClaimsCorrupt, i, err)
		}
		switch {
		case ids[c.ID]:
			return ClaimsState{}, fmt.Errorf("%w: volume ID %s twice", ErrClaimsCorrupt, c.ID)
		case names[c.Name]:
			return ClaimsState{}, fmt.Errorf("%w: volume name %q twice", ErrClaimsCorrupt, c.Name)
		case luns[c.LUN]:
			return ClaimsState{}, fmt.Errorf("%w: LUN %s claimed twice", ErrClaimsCorrupt, c.LUN)
		}
		ids[c.ID], names[c.Name], luns[c.LUN] = true, true, true
	}
	for i, e := range f.Erasing {
		if err := e.validate(); err != nil {
			return ClaimsState{}, fmt.Errorf("%w: erasing LUN %d: %v", ErrClaimsCorrupt, i, err)
		}
		switch {
		case ids[e.VolumeID]:
			return ClaimsState{}, fmt.Errorf("%w: volume ID %s twice", ErrClaimsCorrupt, e.VolumeID)
		case luns[e.LUN]:
			return ClaimsState{}, fmt.Errorf("%w: LUN %s both claimed and erasing, or erasing twice", ErrClaimsCorrupt, e.LUN)
		}
		ids[e.VolumeID], luns[e.LUN] = true, true
	}
	st := ClaimsState{Claims: f.Claims, Erasing: f.Erasing}
	if st.Claims == nil {
		st.Claims = []Claim{}
	}
	if st.Erasing == nil {
		st.Erasing = []Erasing{}
	}
	return st, nil
}

// validate checks one erasing entry on its own.
func (e Erasing) validate() error {
	switch {
	case !validID(e.VolumeID):
		return fmt.Errorf("volume ID %.80q is not one this controller makes", e.VolumeID)
	case e.LUN == "" || len(e.LUN) > maxLineBytes:
		return fmt.Errorf("LUN of %d bytes", len(e.LUN))
	case e.Size <= 0:
		return fmt.Errorf("size %d", e.Size)
	}
	if _, err := e.Deleted.MarshalText(); err != nil {
		return fmt.Errorf("deletion time: %v", err)
	}
	return nil
}

// validate checks one claim on its own.
func (c Claim) validate() error {
	switch {
	case !validID(c.ID):
		return fmt.Errorf("volume ID %.80q is not one this controller makes", c.ID)
	case c.Name == "" || len(c.Name) > maxNameBytes:
		return fmt.Errorf("volume name of %d bytes (want 1 to %d)", len(c.Name), maxNameBytes)
	case c.LUN == "":
		return errors.New("no LUN")
	case c.Size <= 0:
		return fmt.Errorf("size %d", c.Size)
	}
	if _, err := c.Created.MarshalText(); err != nil {
		return fmt.Errorf("creation time: %v", err) // it could not be written back
	}
	vc, err := ParseVolumeContext(c.Context)
	if err != nil {
		return err
	}
	if key, err := parseLine(c.Context[ContextTarget]); err != nil || key.Key != c.LUN {
		return fmt.Errorf("the context's target is not LUN %s", c.LUN)
	}
	if c.Context[ContextTransport] != vc.Transport {
		return fmt.Errorf("the context has no transport %s", vc.Transport)
	}
	return nil
}

// WriteClaims replaces the claims file at path with st, in ClaimsVersion (claims sorted by ID,
// erasing LUNs by LUN, so the file changes only where an entry did) atomically: temp file in the
// same directory, fsync, rename, fsync of the directory.
func WriteClaims(path string, st ClaimsState) error {
	data, err := json.MarshalIndent(st.file(), "", "  ")
	if err != nil {
		return fmt.Errorf("claims file: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n')); err != nil { // 0600: it names every LUN
		return fmt.Errorf("claims file: %w", err)
	}
	return nil
}

// file is st as WriteClaims encodes it.
func (st ClaimsState) file() claimsFile {
	claims := append([]Claim{}, st.Claims...)
	sort.Slice(claims, func(i, j int) bool { return claims[i].ID < claims[j].ID })
	erasing := append([]Erasing{}, st.Erasing...)
	sort.Slice(erasing, func(i, j int) bool { return erasing[i].LUN < erasing[j].LUN })
	return claimsFile{Version: ClaimsVersion, Claims: claims, Erasing: erasing}
}

// loadClaims is ReadClaims with a missing file read as no claims: the first start of a
// controller.
func loadClaims(path string) (ClaimsState, error) {
	st, err := ReadClaims(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ClaimsState{Claims: []Claim{}, Erasing: []Erasing{}}, nil
	}
	return st, err
}
