package journal

import (
	"fmt"
	"io"
	"sync"
)

// memMedia is a Media in memory that remembers what a crash may keep: every write since the last
// Sync is logged, so that a test can rebuild the device as of any point (crash consistency).
type memMedia struct {
	mu      sync.Mutex
	cur     []byte    // what reads see (the page cache)
	durable []byte    // what survives a power cut
	unsync  []mWrite  // writes since the last Sync, in order
	all     []mRecord // every write and sync, when recording
	record  bool
	failW   error // writes fail with it when set
	failS   error // syncs fail with it when set
	closed  bool
}

type mWrite struct {
	off  int64
	data []byte
}

// mRecord is one write (data != nil) or one Sync (data == nil) in the recording.
type mRecord struct {
	off  int64
	data []byte
}

func newMemMedia(size int64) *memMedia {
	return &memMedia{cur: make([]byte, size), durable: make([]byte, size)}
}

func (m *memMedia) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off >= int64(len(m.cur)) {
		return 0, io.EOF
	}
	n := copy(p, m.cur[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memMedia) WriteVAt(bufs [][]byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("memmedia: closed")
	}
	if m.failW != nil {
		return m.failW
	}
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	if off < 0 || off+int64(len(all)) > int64(len(m.cur)) {
		return fmt.Errorf("memmedia: write at %d+%d past %d", off, len(all), len(m.cur))
	}
	copy(m.cur[off:], all)
	m.unsync = append(m.unsync, mWrite{off, all})
	if m.record {
		m.all = append(m.all, mRecord{off, all})
	}
	return nil
}

func (m *memMedia) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failS != nil {
		return m.failS
	}
	for _, w := range m.unsync {
		copy(m.durable[w.off:], w.data)
	}
	m.unsync = m.unsync[:0]
	if m.record {
		m.all = append(m.all, mRecord{})
	}
	return nil
}

func (m *memMedia) Size() int64 { return int64(len(m.cur)) }

func (m *memMedia) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// reopened is the device after the process died (kill -9): the page cache keeps every write.
func (m *memMedia) reopened() *memMedia {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := newMemMedia(int64(len(m.cur)))
	copy(c.cur, m.cur)
	copy(c.durable, m.cur)
	return c
}

// powerCut is the device after a power cut: what was synced, plus the writes since the last sync
// for which keep says so, each kept whole or torn after torn bytes (torn < 0: whole).
func (m *memMedia) powerCut(keep func(i int) (bool, int)) *memMedia {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := newMemMedia(int64(len(m.cur)))
	copy(c.cur, m.durable)
	for i, w := range m.unsync {
		ok, torn := keep(i)
		if !ok {
			continue
		}
		d := w.data
		if torn >= 0 && torn < len(d) {
			d = d[:torn]
		}
		copy(c.cur[w.off:], d)
	}
	copy(c.durable, c.cur)
	return c
}
