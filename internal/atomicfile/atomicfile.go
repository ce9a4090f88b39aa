// Package atomicfile replaces a file so that a reader, or the file system after a crash, sees
// either the old contents or the new, never a mix: the state files (internal/statefile), the CSI
// plugin's volume records (internal/csi) and the pool's claims (internal/csipool) are written
// through it.
//
// Invariant: once Write returns nil the new contents and the rename are on stable storage (the
// file and its directory were fsynced); the file is 0600, since every caller's file names
// devices, LUNs or secrets' locations. On an error the old file is untouched and no temporary
// file is left.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data: a temporary file in the same directory, written, made 0600,
// fsynced and renamed over path, then the directory fsynced so that the rename is durable.
func Write(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if err := writeSync(tmp, data); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// writeSync writes data to f, makes it 0600, fsyncs and closes it.
func writeSync(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir fsyncs dir, making a rename in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%s: fsync: %w", dir, err)
	}
	return nil
}
