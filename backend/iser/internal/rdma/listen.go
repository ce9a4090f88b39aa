//go:build cgo && linux && !nordma

package rdma

/*
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"
)

// Listener accepts RDMA connections (used by tests that play the target, and by anything that
// needs a passive side). Each accepted Conn gets its own event channel (rdma_migrate_id).
type Listener struct {
	ec   *eventChannel
	id   *C.struct_rdma_cm_id
	Port int
	mu   sync.Mutex
}

// Listen binds host:port (port 0 picks one) and listens.
func Listen(ctx context.Context, host string, port int) (_ *Listener, err error) {
	ip, err := resolveIP(ctx, host)
	if err != nil {
		return nil, err
	}
	l := &Listener{}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.ec, err = newEventChannel(); err != nil {
		return nil, err
	}
	var id *C.struct_rdma_cm_id
	if r, errno := C.rdma_create_id(l.ec.ch, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("rdma_create_id: %w", errno)
	}
	l.id = id
	ipb, iplen := ipBytes(ip)
	if r := C.isb_bind_listen(l.id, (*C.uint8_t)(unsafe.Pointer(&ipb[0])), C.int(iplen), C.int(port), 16); r < 0 {
		return nil, fmt.Errorf("rdma listen on %s: %w", netip.AddrPortFrom(ip, uint16(port)), syscall.Errno(-r))
	}
	l.Port = int(C.isb_local_port(l.id))
	return l, nil
}

// Accept waits for a connect request, sets up its queue pair with cfg and accepts it. accept
// decides from the peer's private data whether to take the connection; if it returns an error,
// the request is rejected (with rejectData) and Accept returns that error.
func (l *Listener) Accept(ctx context.Context, cfg Config, accept func(peerPrivate []byte) (rejectData []byte, err error)) (_ *Conn, err error) {
	cfg.defaults()
	l.mu.Lock()
	defer l.mu.Unlock()
	var ev cmEvent
	for {
		if ev, err = l.ec.next(ctx); err != nil {
			return nil, fmt.Errorf("rdma accept: %w", err)
		}
		if ev.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
			break
		}
	}
	c := &Conn{cfg: cfg, mrs: map[*MR]struct{}{}, id: ev.id, PeerPrivateData: ev.private,
		PeerResponderResources: ev.respRes, PeerInitiatorDepth: ev.initDep}
	defer func() {
		if err != nil {
			c.destroy()
		}
	}()
	if accept != nil {
		if rej, aerr := accept(ev.private); aerr != nil {
			var p unsafe.Pointer
			if len(rej) > 0 {
				p = unsafe.Pointer(&rej[0])
			}
			C.rdma_reject(c.id, p, C.uint8_t(len(rej)))
			return nil, aerr
		}
	}
	if c.ec, err = newEventChannel(); err != nil {
		return nil, err
	}
	if r, errno := C.rdma_migrate_id(c.id, c.ec.ch); r != 0 {
		return nil, fmt.Errorf("rdma_migrate_id: %w", errno)
	}
	if err = c.setupQP(); err != nil {
		return nil, err
	}
	if err = c.connect(true); err != nil {
		return nil, err
	}
	if err = c.expect(ctx, "accept", C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		return nil, err
	}
	c.start()
	return c, nil
}

// Close stops listening and releases the listener's resources.
func (l *Listener) Close() error {
	if l.ec != nil {
		l.ec.pfd.close() // wakes a waiting Accept
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != nil {
		C.rdma_destroy_id(l.id)
		l.id = nil
	}
	if l.ec != nil {
		l.ec.close()
		l.ec = nil
	}
	return nil
}
