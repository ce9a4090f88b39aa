//go:build cgo && linux && !nordma

package rdma

// The rdma-cm event channel and the fds the verbs layer parks on.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <stdlib.h>
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pollFD parks a non-blocking rdma-core file descriptor (CM event channel or completion channel)
// on Go's netpoller. The os.File holds a dup of the descriptor, so closing it (to wake a waiter)
// never closes the descriptor rdma-core owns; O_NONBLOCK is shared by both.
type pollFD struct {
	f  *os.File
	rc syscall.RawConn
}

func newPollFD(fd C.int, name string) (*pollFD, error) {
	if r := C.isb_set_nonblock(fd); r < 0 {
		return nil, fmt.Errorf("%s: set O_NONBLOCK: %w", name, syscall.Errno(-r))
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: dup: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &pollFD{f: f, rc: rc}, nil
}

// wait calls try until it reports done, parking on the netpoller in between. It returns an error
// when the deadline passes or the pollFD is closed.
func (p *pollFD) wait(try func() bool) error {
	return p.rc.Read(func(uintptr) bool { return try() })
}

func (p *pollFD) close() {
	if p != nil {
		p.f.Close()
	}
}

// cmEvent is a copied rdma_cm event.
type cmEvent struct {
	typ      int
	status   int
	id       *C.struct_rdma_cm_id
	private  []byte
	respRes  int
	initDep  int
	listenID *C.struct_rdma_cm_id
}

var cmEventNames = map[int]string{
	C.RDMA_CM_EVENT_ADDR_RESOLVED: "ADDR_RESOLVED", C.RDMA_CM_EVENT_ADDR_ERROR: "ADDR_ERROR",
	C.RDMA_CM_EVENT_ROUTE_RESOLVED: "ROUTE_RESOLVED", C.RDMA_CM_EVENT_ROUTE_ERROR: "ROUTE_ERROR",
	C.RDMA_CM_EVENT_CONNECT_REQUEST: "CONNECT_REQUEST", C.RDMA_CM_EVENT_CONNECT_RESPONSE: "CONNECT_RESPONSE",
	C.RDMA_CM_EVENT_CONNECT_ERROR: "CONNECT_ERROR", C.RDMA_CM_EVENT_UNREACHABLE: "UNREACHABLE",
	C.RDMA_CM_EVENT_REJECTED: "REJECTED", C.RDMA_CM_EVENT_ESTABLISHED: "ESTABLISHED",
	C.RDMA_CM_EVENT_DISCONNECTED: "DISCONNECTED", C.RDMA_CM_EVENT_DEVICE_REMOVAL: "DEVICE_REMOVAL",
	C.RDMA_CM_EVENT_TIMEWAIT_EXIT: "TIMEWAIT_EXIT", C.RDMA_CM_EVENT_ADDR_CHANGE: "ADDR_CHANGE",
}

func cmEventName(t int) string {
	if n, ok := cmEventNames[t]; ok {
		return n
	}
	return "event " + strconv.Itoa(t)
}

// eventChannel is an rdma_cm event channel on the netpoller.
type eventChannel struct {
	ch  *C.struct_rdma_event_channel
	pfd *pollFD
	ev  *C.struct_isb_cmev // C scratch for one event
}

func newEventChannel() (*eventChannel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		if errors.Is(err, syscall.ENODEV) {
			err = fmt.Errorf("%w: %w", ErrNoDevice, err)
		}
		return nil, fmt.Errorf("rdma_create_event_channel: %w (is rdma_ucm loaded and an RDMA device present?)", err)
	}
	pfd, err := newPollFD(ch.fd, "rdma_cm event channel")
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	ev := (*C.struct_isb_cmev)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_isb_cmev{}))))
	return &eventChannel{ch: ch, pfd: pfd, ev: ev}, nil
}

// next waits for the next CM event. The caller must not call next concurrently.
func (e *eventChannel) next(ctx context.Context) (cmEvent, error) {
	if dl, ok := ctx.Deadline(); ok {
		e.pfd.f.SetReadDeadline(dl)
		defer e.pfd.f.SetReadDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { e.pfd.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var r C.int
	err := e.pfd.wait(func() bool {
		r = C.isb_get_cm_event(e.ch, e.ev)
		return r != 0
	})
	if err != nil {
		if ctx.Err() != nil {
			return cmEvent{}, ctx.Err()
		}
		return cmEvent{}, err
	}
	if r < 0 {
		return cmEvent{}, fmt.Errorf("rdma_get_cm_event: %w", syscall.Errno(-r))
	}
	ev := cmEvent{
		typ: int(e.ev._type), status: int(e.ev.status), id: e.ev.id, listenID: e.ev.listen_id,
		respRes: int(e.ev.responder_resources), initDep: int(e.ev.initiator_depth),
	}
	if n := int(e.ev.pdlen); n > 0 {
		ev.private = C.GoBytes(unsafe.Pointer(&e.ev.pd[0]), C.int(n))
	}
	return ev, nil
}

// close destroys the channel; every cm_id on it must be gone. Closing the pollFD twice is harmless.
func (e *eventChannel) close() {
	if e == nil {
		return
	}
	e.pfd.close()
	C.rdma_destroy_event_channel(e.ch)
	C.free(unsafe.Pointer(e.ev))
}
