package statefile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/iser-blk/iser-blk/internal/atomicfile"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// Version is the format of the file this package writes. Read rejects any other.
const Version = 1

// Errors of Read and CheckIdentity. Missing files wrap fs.ErrNotExist.
var (
	ErrCorrupt = errors.New("state file is corrupt")
	ErrVersion = errors.New("state file has an unknown version")
	ErrForeign = errors.New("state file belongs to another LUN")
)

// Identity names the LUN behind a device: a successor serving another LUN under the same name
// would hand a mounted filesystem somebody else's blocks.
type Identity struct {
	Target    string `json:"target"`              // IQN (or mem:// URL), never credentials
	LUN       uint64 `json:"lun"`                 // LUN number
	DeviceID  string `json:"device_id,omitempty"` // VPD page 0x83 designator, when the target gives one
	Size      int64  `json:"size"`                // bytes
	BlockSize int    `json:"block_size"`          // logical block size in bytes
}

// State is the content of NAME.json.
type State struct {
	Version   int            `json:"version"`
	Name      string         `json:"name"`
	Kind      modes.Frontend `json:"kind"`   // modes.Ublk or modes.NBD
	DevID     int            `json:"dev_id"` // N of /dev/ublkbN or /dev/nbdN
	LUN       Identity       `json:"lun"`
	CacheMode modes.Cache    `json:"cache_mode"`
	Dirty     bool           `json:"dirty"` // the write-back cache may hold acknowledged writes
	// CacheDev is the cache device (--cache-dev, an absolute path) whose log holds this device's
	// written data until it is written back: a successor must use the same one.
	CacheDev string    `json:"cache_dev,omitempty"`
	PID      int       `json:"pid"` // the gateway that wrote the file
	Updated  time.Time `json:"updated"`
}

// Path is NAME's state file in dir.
func Path(dir, name string) string { return filepath.Join(dir, name+".json") }

// Write replaces path with s atomically: the bytes go to a temporary file in the same directory,
// which is fsynced and renamed over path; the directory is then fsynced so the rename itself is
// durable. Readers see the old file or the new one, never a mix.
func Write(path string, s State) error {
	s.Version = Version
	if s.Updated.IsZero() {
		s.Updated = time.Now().UTC()
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n')); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// Read loads path. A missing file wraps fs.ErrNotExist; bytes that are not a State wrap
// ErrCorrupt; another format version wraps ErrVersion.
func Read(path string) (State, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return State{}, fmt.Errorf("state file: %w", err)
	}
	s, err := Decode(data)
	if err != nil {
		return State{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// maxFileBytes bounds what Decode accepts: a State is a few hundred bytes.
const maxFileBytes = 64 << 10

// Decode parses a state file's bytes and checks that they describe a usable State.
func Decode(data []byte) (State, error) {
	if len(data) > maxFileBytes {
		return State{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(data))
	}
	var s State
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return State{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if s.Version != Version {
		return State{}, fmt.Errorf("%w: %d (this gateway reads %d)", ErrVersion, s.Version, Version)
	}
	// The cache mode's zero value is write-back: a file without the field must not pass for one.
	var present struct {
		CacheMode *json.RawMessage `json:"cache_mode"`
	}
	if json.Unmarshal(data, &present) != nil || present.CacheMode == nil {
		return State{}, fmt.Errorf("%w: no cache mode", ErrCorrupt)
	}
	return s, s.validate()
}

func (s State) validate() error {
	switch {
	case !s.Kind.KernelDevice():
		return fmt.Errorf("%w: device kind %q", ErrCorrupt, s.Kind)
	case s.DevID < 0:
		return fmt.Errorf("%w: device id %d", ErrCorrupt, s.DevID)
	case s.CacheMode != modes.Off && s.CacheMode != modes.WriteThrough && s.CacheMode != modes.WriteBack:
		return fmt.Errorf("%w: cache mode %v", ErrCorrupt, s.CacheMode)
	case s.LUN.Size <= 0 || s.LUN.BlockSize <= 0:
		return fmt.Errorf("%w: LUN size %d, block size %d", ErrCorrupt, s.LUN.Size, s.LUN.BlockSize)
	}
	return nil
}

// Remove deletes path; a missing file is not an error.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}
