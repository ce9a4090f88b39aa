package csipool

// The claims file: which volume holds which LUN of the pool. It is the controller's only memory
// across restarts, so it is written the way internal/statefile writes a gateway's state (temp
// file, fsync, rename, fsync of the directory: a crash leaves the old file or the new one), and
// read strictly: a file that is not exactly a claims file of this version is an error, and the
// controller does not start on it (guessing would hand a claimed LUN out again).

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

// ClaimsVersion is the format of the claims file; DecodeClaims rejects any other.
const ClaimsVersion = 1

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

// claimsFile is the file's JSON.
type claimsFile struct {
	Version int     `json:"version"`
	Claims  []Claim `json:"claims"`
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
func ReadClaims(path string) ([]Claim, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("claims file: %w", err)
	}
	claims, err := DecodeClaims(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return claims, nil
}

// DecodeClaims parses a claims file's bytes: one JSON object of this version, no unknown field,
// nothing after it, and claims that are each valid and together consistent (no ID, name or LUN
// twice: a LUN held twice is exactly what the file exists to prevent).
func DecodeClaims(data []byte) ([]Claim, error) {
	if len(data) > maxClaimsBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrClaimsCorrupt, len(data), maxClaimsBytes)
	}
	var f claimsFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrClaimsCorrupt, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the claims", ErrClaimsCorrupt)
	}
	if f.Version != ClaimsVersion {
		return nil, fmt.Errorf("%w: version %d (this controller reads %d)", ErrClaimsCorrupt, f.Version, ClaimsVersion)
	}
	ids, names, luns := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, c := range f.Claims {
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("%w: claim %d: %v", ErrClaimsCorrupt, i, err)
		}
		switch {
		case ids[c.ID]:
			return nil, fmt.Errorf("%w: volume ID %s twice", ErrClaimsCorrupt, c.ID)
		case names[c.Name]:
			return nil, fmt.Errorf("%w: volume name %q twice", ErrClaimsCorrupt, c.Name)
		case luns[c.LUN]:
			return nil, fmt.Errorf("%w: LUN %s claimed twice", ErrClaimsCorrupt, c.LUN)
		}
		ids[c.ID], names[c.Name], luns[c.LUN] = true, true, true
	}
	if f.Claims == nil {
		f.Claims = []Claim{}
	}
	return f.Claims, nil
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

// WriteClaims replaces the claims file at path with claims (sorted by ID, so the file changes
// only where a claim did) atomically: temp file in the same directory, fsync, rename, fsync of
// the directory.
func WriteClaims(path string, claims []Claim) error {
	sorted := append([]Claim(nil), claims...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	if sorted == nil {
		sorted = []Claim{}
	}
	data, err := json.MarshalIndent(claimsFile{Version: ClaimsVersion, Claims: sorted}, "", "  ")
	if err != nil {
		return fmt.Errorf("claims file: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n')); err != nil { // 0600: it names every LUN
		return fmt.Errorf("claims file: %w", err)
	}
	return nil
}

// loadClaims is ReadClaims with a missing file read as no claims: the first start of a
// controller.
func loadClaims(path string) ([]Claim, error) {
	claims, err := ReadClaims(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []Claim{}, nil
	}
	return claims, err
}
