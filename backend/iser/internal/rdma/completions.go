//go:build cgo && linux && !nordma

package rdma

// The completion queue poller and the rdma-cm event loop of a Conn.

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
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// pollLoop drains the CQ in batches and parks on the completion channel when it is empty.
func (c *Conn) pollLoop() {
	defer close(c.pollDone)
	batch := make([]Completion, C.ISB_MAX_BATCH)
	armed := true // setupQP armed it
	lastBusy := time.Now()
	lost := false // a test made us drop the last event (dropNextCQEvent): wait again without polling
	for {
		if !lost {
			n := int(C.isb_poll_cq(c.cq, c.wcScratch, C.ISB_MAX_BATCH))
			if n < 0 {
				c.fail(fmt.Errorf("ibv_poll_cq: %d", n))
				return
			}
			if n > 0 {
				c.deliver(batch, n)
				lastBusy = time.Now()
				// Let whoever the completions woke (the iSER reader: runnext on this P) run
				// before this goroutine polls again and arms the CQ: on rxe the arming is a
				// system call, and it would sit between the response and its reader. Measured
				// at one P, the gateway's default on small hosts (docs/bench/findings-20261206-
				// session30-sched-trace.md: QD1 p50 -12 %, QD32 IOPS +11-14 % over iSER); with
				// more Ps the yield may also hand the poller to an idle P's thread.
				runtime.Gosched()
				continue
			}
			if !armed {
				// Arm, then poll once more: a completion that arrived between the empty poll and
				// the arming would raise no event.
				if r := C.ibv_req_notify_cq(c.cq, 0); r != 0 {
					c.fail(fmt.Errorf("ibv_req_notify_cq: %w", syscall.Errno(r)))
					return
				}
				armed = true
				continue
			}
		}
		lost = false
		var park bool
		if lastBusy, park = c.prepareWait(lastBusy); !park {
			continue
		}
		r, err := c.waitCQEvent()
		if c.closing.Load() {
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if c.safetyPoll(batch) {
				lastBusy = time.Now()
				armed = false
			}
			continue
		}
		if err != nil {
			return // closed
		}
		if r < 0 {
			c.fail(fmt.Errorf("ibv_get_cq_event: %w", syscall.Errno(-r)))
			return
		}
		counters.cqEvents.Add(1)
		if c.dropNextCQEvent.Load() && c.dropNextCQEvent.CompareAndSwap(true, false) {
			lost = true // as if the kernel had never queued it: the CQ is disarmed, nobody polls
			continue
		}
		armed = false
	}
}

// deliver hands the first n work completions of the scratch array to OnCompletion.
func (c *Conn) deliver(batch []Completion, n int) {
	counters.completions.Add(int64(n))
	wcs := unsafe.Slice(c.wcScratch, n)
	for i := range wcs {
		w := &wcs[i]
		batch[i] = Completion{ID: uint64(w.wr_id), Status: int(w.status), Op: compOp(w.opcode),
			ByteLen: uint32(w.byte_len), VendorErr: uint32(w.vendor_err)}
	}
	if c.cfg.OnCompletion != nil {
		c.cfg.OnCompletion(batch[:n])
	}
}

// prepareWait sets how long the poller may park on the completion channel: cqSafetyPoll while
// the connection was busy within cqBusyWindow, else without a timer (idle). It returns the
// updated time of last activity, and false when a send raced with parking (poll again).
func (c *Conn) prepareWait(lastBusy time.Time) (time.Time, bool) {
	if sent := c.lastPost.Load(); sent > lastBusy.UnixNano() {
		lastBusy = time.Unix(0, sent)
	}
	if time.Since(lastBusy) < cqBusyWindow {
		c.cpfd.f.SetReadDeadline(time.Now().Add(cqSafetyPoll))
		return lastBusy, true
	}
	c.cpfd.f.SetReadDeadline(time.Time{})
	c.idleParked.Store(true)
	if c.lastPost.Load() > lastBusy.UnixNano() { // a send raced with parking
		c.idleParked.Store(false)
		return lastBusy, false
	}
	return lastBusy, true
}

// waitCQEvent parks until the completion channel has an event (r: isb_get_cq_event's result)
// or the deadline prepareWait set passes (os.ErrDeadlineExceeded).
func (c *Conn) waitCQEvent() (C.int, error) {
	var r C.int
	err := c.cpfd.wait(func() bool {
		r = C.isb_get_cq_event(c.cch)
		return r != 0
	})
	c.idleParked.Store(false)
	return r, err
}

// safetyPoll polls after a wait timed out; it reports whether it delivered completions. Those
// arrived with the CQ armed and no event: either the event is about to be queued (it follows the
// completion by microseconds) or it was lost. Only the latter is counted. Either way the CQ may
// be disarmed now: the caller arms it again after draining.
func (c *Conn) safetyPoll(batch []Completion) bool {
	n := int(C.isb_poll_cq(c.cq, c.wcScratch, C.ISB_MAX_BATCH))
	if n <= 0 {
		return false // nothing waiting (or a poll error, which the next poll reports)
	}
	// Counted before delivering, so that whoever sees these completions also sees the count.
	if C.isb_get_cq_event(c.cch) == 0 {
		counters.cqEventsMissed.Add(1)
	}
	c.deliver(batch, n)
	return true
}

func compOp(op C.uint32_t) CompletionOp {
	switch op {
	case C.IBV_WC_SEND:
		return CompSend
	case C.IBV_WC_RDMA_WRITE:
		return CompRDMAWrite
	case C.IBV_WC_RDMA_READ:
		return CompRDMARead
	case C.IBV_WC_RECV:
		return CompRecv
	}
	return CompOther
}

// cmLoop watches for the peer's disconnect and device removal.
func (c *Conn) cmLoop() {
	defer close(c.cmDone)
	for {
		ev, err := c.ec.next(context.Background())
		if err != nil {
			if !c.closing.Load() {
				c.fail(fmt.Errorf("rdma_cm events: %w", err))
			}
			return
		}
		switch ev.typ {
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			c.fail(&CMError{Step: "connection", Event: cmEventName(ev.typ), Status: ev.status, Kind: ErrDisconnected})
			if c.closing.Load() {
				return
			}
		case C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
		}
	}
}
