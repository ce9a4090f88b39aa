package journal

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Media is the cache device's storage. Writes become durable at Sync; a crash may keep any
// subset of the writes since the last Sync, each of them possibly torn.
type Media interface {
	io.ReaderAt
	// WriteVAt writes the buffers one after the other at off, with one system call where it can.
	WriteVAt(bufs [][]byte, off int64) error
	// Sync makes every completed write durable (fdatasync).
	Sync() error
	// Size is the usable size in bytes.
	Size() int64
	Close() error
}

// fileMedia is a regular file or a block device.
type fileMedia struct {
	f    *os.File
	size int64
}

// OpenFile opens the cache device at path. A path that does not exist, or a regular file that is
// empty, is created (or grown) to newSize bytes with its blocks allocated, so that a full file
// system shows at attach, not as a failed write later; newSize 0 then is an error. Such a new file
// is then written with zeros (zeroFill).
func OpenFile(path string, newSize int64) (Media, error) {
	return openFile(path, newSize, zap.NewNop())
}

func openFile(path string, newSize int64, log *zap.Logger) (Media, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache device: %w", err)
	}
	// One process at a time: two journals on one log would overwrite each other's batches.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("cache device %s is in use by another process", path)
		}
		return nil, fmt.Errorf("cache device %s: lock: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cache device: %w", err)
	}
	size := st.Size()
	if st.Mode().IsRegular() && size == 0 {
		if newSize <= 0 {
			f.Close()
			return nil, fmt.Errorf("cache device %s is empty: give its size (--cache-dev-size)", path)
		}
		if err := unix.Fallocate(int(f.Fd()), 0, 0, newSize); err != nil {
			f.Close()
			return nil, fmt.Errorf("cache device %s: allocating %d bytes: %w", path, newSize, err)
		}
		if err := zeroFill(f, newSize, log); err != nil {
			f.Close()
			return nil, fmt.Errorf("cache device %s: writing zeros: %w", path, err)
		}
		size = newSize
	} else if !st.Mode().IsRegular() {
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return nil, fmt.Errorf("cache device %s: size: %w", path, err)
		}
	}
	return &fileMedia{f: f, size: size}, nil
}

// zeroFill writes zeros over a new file of size bytes and syncs them. fallocate leaves its blocks
// "unwritten" (ext4, xfs): the first write to each then converts its extent, a journal commit that
// the next fdatasync waits for. The log writes every block of the ring once before it wraps, so
// for a whole lap every FLUSH paid that commit: 281 µs instead of 128 µs per fdatasync on the
// bench host's ext4 (docs/cache-dev.md). Written zeros make the extents written once, here, as a
// database zero-fills its write-ahead log for the same reason. A fill cut short leaves zeros or
// unwritten blocks, both read as zeros: the device is then blank and formatted as usual.
func zeroFill(f *os.File, size int64, log *zap.Logger) error {
	t0 := time.Now()
	log.Info("writing zeros over the new cache device file once, so that a flush costs one data sync",
		zap.String("size", humanize.IBytes(uint64(size))))
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return err
		}
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return err
	}
	log.Info("cache device file written", zap.Duration("took", time.Since(t0)))
	return nil
}

func (m *fileMedia) ReadAt(p []byte, off int64) (int, error) { return m.f.ReadAt(p, off) }

func (m *fileMedia) WriteVAt(bufs [][]byte, off int64) error {
	want := 0
	for _, b := range bufs {
		want += len(b)
	}
	n, err := unix.Pwritev(int(m.f.Fd()), bufs, off)
	if err == nil && n < want {
		// A short write to a file: finish it with plain writes.
		for _, b := range bufs {
			if n >= len(b) {
				n -= len(b)
				off += int64(len(b))
				continue
			}
			if _, err = m.f.WriteAt(b[n:], off+int64(n)); err != nil {
				break
			}
			off += int64(len(b))
			n = 0
		}
	}
	if err != nil {
		return fmt.Errorf("cache device: write: %w", err)
	}
	return nil
}

func (m *fileMedia) Sync() error {
	if err := unix.Fdatasync(int(m.f.Fd())); err != nil {
		return fmt.Errorf("cache device: fdatasync: %w", err)
	}
	return nil
}

func (m *fileMedia) Size() int64  { return m.size }
func (m *fileMedia) Close() error { return m.f.Close() }
