//go:build cgo && linux && !nordma

package rdma

// Memory registration: a registered region (MR) and its keys for the work requests.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <stdlib.h>
#include "cverbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// MR is a memory region registered with a connection's protection domain.
type MR struct {
	c    *Conn
	mr   *C.struct_ibv_mr
	Addr uint64
	Len  int
	LKey uint32
	RKey uint32
}

// Register registers b, which must not be Go-heap memory (use mmap), with the given access.
func (c *Conn) Register(b []byte, access Access) (*MR, error) {
	if len(b) == 0 {
		return nil, errors.New("rdma: register an empty buffer")
	}
	var flags C.int
	if access&AccessLocalWrite != 0 {
		flags |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if access&AccessRemoteWrite != 0 {
		flags |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if access&AccessRemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	c.mrMu.Lock()
	defer c.mrMu.Unlock()
	if c.pd == nil || c.closing.Load() {
		return nil, ErrClosed
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	var e C.int
	mr := C.isb_reg_mr(c.pd, C.uint64_t(addr), C.size_t(len(b)), flags, &e)
	if mr == nil {
		return nil, fmt.Errorf("ibv_reg_mr(%d bytes): %w", len(b), syscall.Errno(e))
	}
	counters.mrs.Add(1)
	counters.regs.Add(1)
	m := &MR{c: c, mr: mr, Addr: addr, Len: len(b), LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}
	c.mrs[m] = struct{}{}
	return m, nil
}

// Deregister releases the region. Idempotent.
func (m *MR) Deregister() error {
	c := m.c
	c.mrMu.Lock()
	defer c.mrMu.Unlock()
	return m.deregLocked()
}

func (m *MR) deregLocked() error {
	if m.mr == nil {
		return nil
	}
	delete(m.c.mrs, m)
	r := C.ibv_dereg_mr(m.mr)
	m.mr = nil
	counters.mrs.Add(-1)
	if r != 0 {
		return fmt.Errorf("ibv_dereg_mr: %w", syscall.Errno(r))
	}
	return nil
}

// SGE returns the scatter/gather element for b, which must lie inside the region.
func (m *MR) SGE(b []byte) SGE {
	return SGE{Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), Len: uint32(len(b)), LKey: m.LKey}
}

// Contains reports whether b lies inside the region.
func (m *MR) Contains(b []byte) bool {
	a := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	return a >= m.Addr && a+uint64(len(b)) <= m.Addr+uint64(m.Len)
}

// addrOf returns the virtual address of b's first byte (what an iSER header carries when ZBVA is
// not used).
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
