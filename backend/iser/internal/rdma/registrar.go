//go:build cgo && linux && !nordma

package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/iser-blk/iser-blk/pool"
)

// poolAccess is what every pool region is registered with. The target RDMA-Writes the data of
// our reads into pool buffers (REMOTE_WRITE, which verbs only allow together with LOCAL_WRITE)
// and RDMA-Reads the data of our writes out of them (REMOTE_READ). See docs/iser.md for what this
// exposes and why it is per region rather than per I/O.
const poolAccess = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite

// keyEntry is one connection's registration of one region.
type keyEntry struct {
	conn *Conn
	mr   *MR
}

// regionKeys is the handle stored with a pool region: the registrations of that region with
// every attached connection. Replaced copy-on-write so that Lookup takes no lock.
type regionKeys struct {
	region  pool.Region
	entries atomic.Pointer[[]keyEntry]
}

func (rk *regionKeys) bytes() []byte { return unsafe.Slice((*byte)(rk.region.Base), rk.region.Len) }

// registrar registers one pool's regions with every connection attached to it: once per region
// per connection (at attach, or when the pool maps a new region), never per I/O. The pool allows
// one hook, so one registrar per pool fans out to all connections.
type registrar struct {
	p       *pool.Pool
	mu      sync.Mutex
	regions []*regionKeys
	conns   map[*Conn]bool
}

var (
	registrarsMu sync.Mutex
	registrars   = map[*pool.Pool]*registrar{}
)

// registrarFor returns the pool's registrar, installing the pool hook on first use.
func registrarFor(p *pool.Pool) (*registrar, error) {
	registrarsMu.Lock()
	defer registrarsMu.Unlock()
	if r, ok := registrars[p]; ok {
		return r, nil
	}
	r := &registrar{p: p, conns: map[*Conn]bool{}}
	if err := p.OnRegion(r.onRegion); err != nil {
		return nil, fmt.Errorf("iser: install the pool registration hook: %w", err)
	}
	registrars[p] = r
	return r, nil
}

// onRegion is the pool hook: register the new region with every attached connection.
func (r *registrar) onRegion(reg pool.Region) (any, error) {
	rk := &regionKeys{region: reg}
	empty := []keyEntry{}
	rk.entries.Store(&empty)
	r.mu.Lock()
	defer r.mu.Unlock()
	var entries []keyEntry
	for c := range r.conns {
		mr, err := c.Register(rk.bytes(), poolAccess)
		if err != nil {
			for _, e := range entries {
				e.mr.Deregister()
			}
			return nil, fmt.Errorf("iser: register pool region %d (%d bytes): %w", reg.Index, reg.Len, err)
		}
		entries = append(entries, keyEntry{c, mr})
	}
	rk.entries.Store(&entries)
	r.regions = append(r.regions, rk)
	return rk, nil
}

// attach registers every known region with c.
func (r *registrar) attach(c *Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []*regionKeys
	for _, rk := range r.regions {
		mr, err := c.Register(rk.bytes(), poolAccess)
		if err != nil {
			for _, d := range done {
				d.remove(c)
			}
			return fmt.Errorf("iser: register pool region %d (%d bytes): %w", rk.region.Index, rk.region.Len, err)
		}
		rk.add(keyEntry{c, mr})
		done = append(done, rk)
	}
	r.conns[c] = true
	return nil
}

// detach forgets c's registrations (the MRs themselves are released by c.Close).
func (r *registrar) detach(c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
	for _, rk := range r.regions {
		rk.remove(c)
	}
}

func (rk *regionKeys) add(e keyEntry) {
	old := *rk.entries.Load()
	n := make([]keyEntry, 0, len(old)+1)
	n = append(append(n, old...), e)
	rk.entries.Store(&n)
}

func (rk *regionKeys) remove(c *Conn) {
	old := *rk.entries.Load()
	n := make([]keyEntry, 0, len(old))
	for _, e := range old {
		if e.conn != c {
			n = append(n, e)
		}
	}
	rk.entries.Store(&n)
}

// errNotRegistered: the buffer is not pool memory registered with this connection.
var errNotRegistered = errors.New("iser: buffer is not registered pool memory")

// keysFor returns c's lkey and rkey for b, if b lies in a pool region registered with c. It
// allocates nothing.
func (r *registrar) keysFor(c *Conn, b []byte) (lkey, rkey uint32, ok bool) {
	if r == nil || len(b) == 0 {
		return 0, 0, false
	}
	reg, h, off, found := r.p.Lookup(b)
	if !found || off+len(b) > reg.Len {
		return 0, 0, false
	}
	rk, _ := h.(*regionKeys)
	if rk == nil {
		return 0, 0, false
	}
	for _, e := range *rk.entries.Load() {
		if e.conn == c {
			return e.mr.LKey, e.mr.RKey, true
		}
	}
	return 0, 0, false
}
