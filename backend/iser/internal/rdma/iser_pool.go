//go:build cgo && linux && !nordma

package rdma

// The registered buffer pool of iSER connections: SetPool registers its regions with every live
// and later connection, so buffers from it reach the target without a copy (RFC 7145: the
// target RDMA-reads and -writes them by their STag).

import (
	"errors"
	"fmt"

	"github.com/iser-blk/iser-blk/pool"
)

// SetPool makes p the pool whose buffers iSER connections hand to the target without a copy: its
// regions are registered with every live iSER connection now and with every later one, and new
// connections bounce foreign buffers through it when Options.Pool is nil. A frontend or cache
// calls it with the pool its buffers come from, before or after the device is opened. SetPool(nil)
// only stops later connections from using the previous pool. The error is a failed registration.
func SetPool(p *pool.Pool) error {
	liveMu.Lock()
	defer liveMu.Unlock()
	defaultPoolMu.Lock()
	defaultPool = p
	defaultPoolMu.Unlock()
	if p == nil {
		return nil
	}
	var errs []error
	for ic := range live {
		if err := ic.addPool(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addPool registers p's regions with this connection (once; no-op if already done).
func (ic *ISERConn) addPool(p *pool.Pool) error {
	r, err := registrarFor(p)
	if err != nil {
		return err
	}
	old := *ic.regs.Load()
	for _, have := range old {
		if have == r {
			return nil
		}
	}
	if err := r.attach(ic.c); err != nil {
		return err
	}
	n := append(append(make([]*registrar, 0, len(old)+1), old...), r)
	ic.regs.Store(&n)
	return nil
}

// keysFor finds b's keys in any pool registered with this connection; no allocation.
func (ic *ISERConn) keysFor(b []byte) (lkey, rkey uint32, ok bool) {
	for _, r := range *ic.regs.Load() {
		if lkey, rkey, ok = r.keysFor(ic.c, b); ok {
			return
		}
	}
	return 0, 0, false
}

func poolFor(o *Options) (*pool.Pool, error) {
	if o.Pool != nil {
		return o.Pool, nil
	}
	defaultPoolMu.Lock()
	defer defaultPoolMu.Unlock()
	if defaultPool == nil {
		// Lazily mapped: only the regions bounces actually touch are mapped and registered.
		p, err := pool.New(pool.Config{MaxBytes: 256 << 20, MaxClass: 4 << 20})
		if err != nil {
			return nil, fmt.Errorf("iser: private buffer pool: %w", err)
		}
		defaultPool = p
	}
	return defaultPool, nil
}
