package csi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/iser-blk/iser-blk/internal/atomicfile"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// recordVersion is the format of a volume record; a record of another version is refused.
const recordVersion = 1

// Record is what NodeStage was asked for and what it made, kept in RUNDIR/csi/NAME.volume.json
// from before the gateway starts until NodeUnstage has detached it: the healer restarts a
// gateway from it, NodeUnstage finds what to undo, and a repeated NodeStage compares with it.
// It holds no secret: those are in 0600 files beside it (Records.SecretFile).
type Record struct {
	Version     int            `json:"version"`
	VolumeID    string         `json:"volume_id"`
	Name        string         `json:"name"` // GatewayName(VolumeID)
	Targets     []string       `json:"targets"`
	Frontend    modes.Frontend `json:"frontend"` // as asked: FrontendAuto, ublk or nbd
	Cache       modes.Cache    `json:"cache"`
	CHAPUser    string         `json:"chap_user,omitempty"`
	TargetUser  string         `json:"target_user,omitempty"`
	MutualCHAP  bool           `json:"mutual_chap,omitempty"`
	Block       bool           `json:"block"` // a Block volume; else a filesystem mounted at StagingPath
	FSType      string         `json:"fs_type,omitempty"`
	MountFlags  []string       `json:"mount_flags,omitempty"`
	StagingPath string         `json:"staging_path"`
	Device      string         `json:"device,omitempty"` // the gateway's device once it serves
	// Served is the frontend the gateway serves through once it does (FrontendAuto resolved):
	// a gateway restarted later must ask for the same kind, or the takeover of the waiting
	// device is refused.
	Served    modes.Frontend `json:"served_frontend,omitempty"`
	SizeBytes int64          `json:"size_bytes,omitempty"`
	// CacheDev is the volume's cache device file (--cache-dev) and CacheDevSize its size; empty:
	// none. The path is kept, not derived again from the plugin's --cache-dev-dir: a gateway
	// restarted without its log would be refused (and must never serve without it).
	CacheDev     string `json:"cache_dev,omitempty"`
	CacheDevSize int64  `json:"cache_dev_size,omitempty"`
}

// sameVolume reports whether r and o ask for the same volume the same way (Device, Served and
// SizeBytes are what the stage made, not what it was asked).
func (r Record) sameVolume(o Record) bool {
	return r.VolumeID == o.VolumeID && strings.Join(r.Targets, ",") == strings.Join(o.Targets, ",") &&
		r.Frontend == o.Frontend && r.Cache == o.Cache && r.CHAPUser == o.CHAPUser &&
		r.TargetUser == o.TargetUser && r.MutualCHAP == o.MutualCHAP && r.Block == o.Block &&
		r.FSType == o.FSType && strings.Join(r.MountFlags, ",") == strings.Join(o.MountFlags, ",") &&
		r.CacheDevSize == o.CacheDevSize
}

// Records is the directory of volume records: RUNDIR/csi.
type Records struct{ Dir string }

// RecordsIn is the records directory of the run directory runDir.
func RecordsIn(runDir string) Records { return Records{Dir: filepath.Join(runDir, "csi")} }

const recordSuffix = ".volume.json"

func (rs Records) path(name string) string { return filepath.Join(rs.Dir, name+recordSuffix) }

// SecretFile is the file holding one of name's secrets (which: "chap-secret" or
// "target-secret"), mode 0600 in a 0700 directory.
func (rs Records) SecretFile(name, which string) string {
	return filepath.Join(rs.Dir, name+"."+which)
}

// LogFile is where a gateway started by the plugin writes its output.
func (rs Records) LogFile(name string) string { return filepath.Join(rs.Dir, name+".log") }

// ensure creates the directory, root's and 0700 like the run directory (control.EnsureRunDir).
func (rs Records) ensure() error { return control.EnsureRunDir(rs.Dir) }

// Load reads name's record; ok is false when there is none.
func (rs Records) Load(name string) (r Record, ok bool, err error) {
	b, err := os.ReadFile(rs.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("volume record: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, false, fmt.Errorf("volume record %s is corrupt: %w", rs.path(name), err)
	}
	if r.Version != recordVersion || r.Name != name {
		return Record{}, false, fmt.Errorf("volume record %s: version %d for %q, want version %d for %q", rs.path(name), r.Version, r.Name, recordVersion, name)
	}
	return r, true, nil
}

// Save replaces r's record atomically (temp file, fsync, rename, fsync of the directory): a
// crash leaves the old record or the new one.
func (rs Records) Save(r Record) error {
	if err := rs.ensure(); err != nil {
		return err
	}
	r.Version = recordVersion
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("volume record: %w", err)
	}
	return atomicfile.Write(rs.path(r.Name), append(b, '\n'))
}

// SaveSecret writes one secret of name's into its 0600 file, atomically.
func (rs Records) SaveSecret(name, which, secret string) error {
	if err := rs.ensure(); err != nil {
		return err
	}
	return atomicfile.Write(rs.SecretFile(name, which), []byte(secret+"\n"))
}

// Remove deletes name's record, its secrets and its gateway's log (the run directory is a tmpfs:
// a log kept per volume ever staged would fill it); what is missing already is no error.
func (rs Records) Remove(name string) error {
	var errs []error
	for _, p := range []string{rs.SecretFile(name, SecretCHAPSecret), rs.SecretFile(name, SecretTargetSecret), rs.LogFile(name), rs.path(name)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Names lists the gateway names that have a record, sorted.
func (rs Records) Names() ([]string, error) {
	ents, err := os.ReadDir(rs.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("volume records: %w", err)
	}
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), recordSuffix); ok && control.ValidateName(n) == nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}
