//go:build cgo && linux && !nordma

package rdma

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
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Config sizes a connection's queues and says how its events are delivered.
type Config struct {
	SendDepth int // send-queue work requests (default 128)
	RecvDepth int // receive-queue work requests (default 128)
	SendSGE   int // SGEs per send work request (1 or 2; default 2)
	// ResponderResources is how many RDMA Reads the peer may have in flight against us (an iSER
	// initiator is the responder for the target's RDMA Reads of write data). 0: the device maximum.
	ResponderResources int
	// InitiatorDepth is how many RDMA Reads we may have in flight (iSER initiators issue none).
	InitiatorDepth int
	// PrivateData is sent with the connect request or the accept (at most 56 bytes for RC).
	PrivateData []byte
	// OnCompletion receives each batch of work completions, on the connection's poller goroutine.
	// The slice is reused after the call returns. It must not block for long nor call Close.
	OnCompletion func(batch []Completion)
	// OnDisconnect is called once, from the CM event goroutine, when the peer disconnects or the
	// device goes away. It must not call Close (it may signal another goroutine to).
	OnDisconnect func(err error)
	// ResolveTimeout bounds address and route resolution (default 2 s).
	ResolveTimeout time.Duration
	// AckTimeout is the local ACK timeout exponent for Dial: a sender retransmits what was not
	// acknowledged within 4.096 µs × 2^AckTimeout. 0 leaves rdma_cm's default (17 on RoCE,
	// 0.54 s). rdma_cm also announces it to the peer as the RoCE packet lifetime, so the
	// accepting side's queue pair gets the same timeout (TestAckTimeoutReachesPeer).
	AckTimeout uint8
}

func (c *Config) defaults() {
	if c.SendDepth <= 0 {
		c.SendDepth = 128
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 128
	}
	if c.SendSGE <= 0 || c.SendSGE > 2 {
		c.SendSGE = 2
	}
	if c.ResolveTimeout <= 0 {
		c.ResolveTimeout = 2 * time.Second
	}
}

// Counters are process-wide resource counters: live objects (for leak checks) and registration
// totals (to prove that memory is registered per region, not per I/O).
type Counters struct {
	LiveConns, LiveQPs, LiveCQs, LivePDs, LiveMRs int64
	MRRegistrations                               int64 // ibv_reg_mr calls that succeeded, ever
	// SendPosts and SendWRs count ibv_post_send calls and the work requests they carried: their
	// ratio is the send batching factor. RecvPosts and RecvWRs are the same for ibv_post_recv.
	SendPosts, SendWRs int64
	RecvPosts, RecvWRs int64
	// Completions counts work completions polled from the CQs; CQEvents counts completion-channel
	// events taken, i.e. the times a CQ poller parked and was woken by the device. Per I/O,
	// Completions says how many work requests reported (receives, signalled sends, and anything
	// that failed) and CQEvents how often the poller slept and woke.
	Completions, CQEvents int64
	// Connections counts connections ever established (Dial or Accept).
	Connections int64
	// CQEventsMissed counts completions the poller found by its safety re-poll with no
	// completion event queued for them (see cqSafetyPoll): each one would have stalled the
	// connection.
	CQEventsMissed int64
}

var counters struct {
	conns, qps, cqs, pds, mrs, regs atomic.Int64
	sendPosts, sendWRs, established atomic.Int64
	recvPosts, recvWRs              atomic.Int64
	completions, cqEvents           atomic.Int64
	cqEventsMissed                  atomic.Int64
}

// Stats returns a snapshot of the process-wide counters.
func Stats() Counters {
	return Counters{
		LiveConns: counters.conns.Load(), LiveQPs: counters.qps.Load(), LiveCQs: counters.cqs.Load(),
		LivePDs: counters.pds.Load(), LiveMRs: counters.mrs.Load(), MRRegistrations: counters.regs.Load(),
		SendPosts: counters.sendPosts.Load(), SendWRs: counters.sendWRs.Load(),
		RecvPosts: counters.recvPosts.Load(), RecvWRs: counters.recvWRs.Load(),
		Completions: counters.completions.Load(), CQEvents: counters.cqEvents.Load(),
		Connections: counters.established.Load(), CQEventsMissed: counters.cqEventsMissed.Load(),
	}
}

// Conn is one reliable-connected queue pair set up through rdma_cm, with its own protection
// domain, completion queue and completion channel.
type Conn struct {
	cfg  Config
	ec   *eventChannel
	id   *C.struct_rdma_cm_id
	pd   *C.struct_ibv_pd
	cch  *C.struct_ibv_comp_channel
	cpfd *pollFD
	cq   *C.struct_ibv_cq
	qp   bool

	// C scratch arrays: work requests are marshalled here, completions copied out here.
	sendMu      sync.Mutex
	sendScratch *C.struct_isb_send
	recvMu      sync.Mutex
	recvScratch *C.struct_isb_recv
	wcScratch   *C.struct_isb_wc

	mrMu sync.Mutex
	mrs  map[*MR]struct{}

	// PeerPrivateData is what the peer sent with its connect request or accept.
	PeerPrivateData []byte
	// PeerResponderResources and PeerInitiatorDepth come from the peer's connection parameters.
	PeerResponderResources, PeerInitiatorDepth int

	// lastPost (unix nanos of the last PostSend) and idleParked (the poller is parked without a
	// safety timer) let a send re-arm the poller's safety re-poll; see cqSafetyPoll.
	lastPost   atomic.Int64
	idleParked atomic.Bool
	// dropNextCQEvent makes the poller discard the next completion event unseen (tests only:
	// it reproduces a lost event, which the safety re-poll must recover from).
	dropNextCQEvent atomic.Bool

	closing      atomic.Bool
	disconnected atomic.Bool
	pollDone     chan struct{}
	cmDone       chan struct{}
	closeOnce    sync.Once
	closeErr     error
}

func resolveIP(ctx context.Context, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolve %q: %w", host, err)
	}
	if len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("resolve %q: no addresses", host)
	}
	return addrs[0].Unmap(), nil
}

func ipBytes(a netip.Addr) ([16]byte, int) {
	var b [16]byte
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return b, 4
	}
	return a.As16(), 16
}

// Dial connects to host:port over rdma_cm (RDMA_PS_TCP), creating the queue pair.
func Dial(ctx context.Context, host string, port int, cfg Config) (_ *Conn, err error) {
	cfg.defaults()
	ip, err := resolveIP(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("rdma dial: %w: %w", ErrUnreachable, err)
	}
	c := &Conn{cfg: cfg, mrs: map[*MR]struct{}{}}
	defer func() {
		if err != nil {
			c.destroy()
		}
	}()
	if c.ec, err = newEventChannel(); err != nil {
		return nil, err
	}
	var id *C.struct_rdma_cm_id
	if r, errno := C.rdma_create_id(c.ec.ch, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("rdma_create_id: %w", errno)
	}
	c.id = id
	if cfg.AckTimeout > 0 {
		if r := C.isb_set_ack_timeout(c.id, C.uint8_t(cfg.AckTimeout)); r < 0 {
			return nil, fmt.Errorf("rdma_set_option(ACK_TIMEOUT %d): %w", cfg.AckTimeout, syscall.Errno(-r))
		}
	}
	ipb, iplen := ipBytes(ip)
	tmo := C.int(cfg.ResolveTimeout.Milliseconds())
	if r := C.isb_resolve_addr(c.id, (*C.uint8_t)(unsafe.Pointer(&ipb[0])), C.int(iplen), C.int(port), tmo); r < 0 {
		return nil, &CMError{Step: "resolve address " + netip.AddrPortFrom(ip, uint16(port)).String(),
			Event: "rdma_resolve_addr: " + syscall.Errno(-r).Error(), Status: int(r), Kind: ErrUnreachable}
	}
	if err = c.expect(ctx, "resolve address "+ip.String(), C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return nil, err
	}
	if r, errno := C.rdma_resolve_route(c.id, tmo); r != 0 {
		return nil, &CMError{Step: "resolve route", Event: "rdma_resolve_route: " + errno.Error(), Kind: ErrUnreachable}
	}
	if err = c.expect(ctx, "resolve route", C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return nil, err
	}
	if err = c.setupQP(); err != nil {
		return nil, err
	}
	if err = c.connect(false); err != nil {
		return nil, err
	}
	ev, err := c.expectEvent(ctx, "connect to "+netip.AddrPortFrom(ip, uint16(port)).String(), C.RDMA_CM_EVENT_ESTABLISHED)
	if err != nil {
		return nil, err
	}
	c.PeerPrivateData, c.PeerResponderResources, c.PeerInitiatorDepth = ev.private, ev.respRes, ev.initDep
	c.start()
	return c, nil
}

func (c *Conn) expect(ctx context.Context, step string, want int) error {
	_, err := c.expectEvent(ctx, step, want)
	return err
}

func (c *Conn) expectEvent(ctx context.Context, step string, want int) (cmEvent, error) {
	ev, err := c.ec.next(ctx)
	if err != nil {
		return ev, fmt.Errorf("rdma_cm %s: %w", step, err)
	}
	if ev.typ == want {
		return ev, nil
	}
	kind := ErrUnreachable
	switch ev.typ {
	case C.RDMA_CM_EVENT_REJECTED:
		kind = ErrRefused
	case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		kind = ErrDisconnected
	}
	return ev, &CMError{Step: step, Event: cmEventName(ev.typ), Status: ev.status, Kind: kind}
}

// setupQP creates the PD, completion channel, CQ and RC QP on the cm_id's device.
func (c *Conn) setupQP() error {
	verbs := c.id.verbs
	if verbs == nil {
		return errors.New("rdma: cm_id has no device after route resolution")
	}
	pd, err := C.ibv_alloc_pd(verbs)
	if pd == nil {
		return fmt.Errorf("ibv_alloc_pd: %w", err)
	}
	c.pd = pd
	counters.pds.Add(1)
	cch, err := C.ibv_create_comp_channel(verbs)
	if cch == nil {
		return fmt.Errorf("ibv_create_comp_channel: %w", err)
	}
	c.cch = cch
	if c.cpfd, err = newPollFD(cch.fd, "completion channel"); err != nil {
		return err
	}
	cqe := c.cfg.SendDepth + c.cfg.RecvDepth
	cq, err := C.ibv_create_cq(verbs, C.int(cqe), nil, cch, 0)
	if cq == nil {
		return fmt.Errorf("ibv_create_cq(%d): %w", cqe, err)
	}
	c.cq = cq
	counters.cqs.Add(1)
	if r := C.ibv_req_notify_cq(cq, 0); r != 0 {
		return fmt.Errorf("ibv_req_notify_cq: %w", syscall.Errno(r))
	}
	if r := C.isb_create_qp(c.id, pd, cq, C.int(c.cfg.SendDepth), C.int(c.cfg.RecvDepth), C.int(c.cfg.SendSGE), 1); r < 0 {
		return fmt.Errorf("rdma_create_qp (send %d, recv %d): %w", c.cfg.SendDepth, c.cfg.RecvDepth, syscall.Errno(-r))
	}
	c.qp = true
	counters.qps.Add(1)
	c.sendScratch = (*C.struct_isb_send)(C.calloc(C.ISB_MAX_BATCH, C.size_t(unsafe.Sizeof(C.struct_isb_send{}))))
	c.recvScratch = (*C.struct_isb_recv)(C.calloc(C.ISB_MAX_BATCH, C.size_t(unsafe.Sizeof(C.struct_isb_recv{}))))
	c.wcScratch = (*C.struct_isb_wc)(C.calloc(C.ISB_MAX_BATCH, C.size_t(unsafe.Sizeof(C.struct_isb_wc{}))))
	return nil
}

func (c *Conn) connect(accept bool) error {
	resp, init := c.cfg.ResponderResources, c.cfg.InitiatorDepth
	var devInit C.int
	devResp := int(C.isb_max_qp_rd_atom(c.id.verbs, &devInit))
	if devResp > 0 && (resp <= 0 || resp > devResp) {
		resp = devResp
	}
	if init > int(devInit) {
		init = int(devInit)
	}
	if resp > 255 {
		resp = 255
	}
	var pd unsafe.Pointer
	if len(c.cfg.PrivateData) > 0 {
		pd = unsafe.Pointer(&c.cfg.PrivateData[0])
	}
	a := C.int(0)
	step := "rdma_connect"
	if accept {
		a, step = 1, "rdma_accept"
	}
	if r := C.isb_connect(c.id, pd, C.int(len(c.cfg.PrivateData)), C.int(resp), C.int(init), a); r < 0 {
		return fmt.Errorf("%s: %w", step, syscall.Errno(-r))
	}
	return nil
}

// start launches the completion poller and the CM event watcher.
func (c *Conn) start() {
	counters.conns.Add(1)
	counters.established.Add(1)
	c.pollDone = make(chan struct{})
	c.cmDone = make(chan struct{})
	go c.pollLoop()
	go c.cmLoop()
}

// Safety re-poll. A completion event can be lost outside our control: the kernel drops it when
// its GFP_ATOMIC allocation of the event entry fails (ib_uverbs_comp_handler), and generating it
// has already disarmed the CQ, so no later completion would raise another one and the
// connection would wait forever with its responses sitting in the CQ. While the connection is
// busy (a completion or a send within cqBusyWindow), the poller therefore parks for at most
// cqSafetyPoll and then polls anyway; once it has been idle that long it parks without a timer
// (no wake-ups at idle), and the next PostSend arms the timer again.
const (
	cqSafetyPoll = time.Second
	cqBusyWindow = 30 * time.Second
)

// fail reports the loss of the connection once.
func (c *Conn) fail(err error) {
	if c.disconnected.Swap(true) {
		return
	}
	if c.cfg.OnDisconnect != nil && !c.closing.Load() {
		c.cfg.OnDisconnect(err)
	}
}

// PostSend posts work requests as one chain per 64 (ISB_MAX_BATCH). Safe for concurrent use.
func (c *Conn) PostSend(wrs ...SendWR) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.closing.Load() {
		return ErrClosed
	}
	s := unsafe.Slice(c.sendScratch, C.ISB_MAX_BATCH)
	for len(wrs) > 0 {
		n := min(len(wrs), C.ISB_MAX_BATCH)
		for i := 0; i < n; i++ {
			w := &wrs[i]
			d := &s[i]
			d.wr_id = C.uint64_t(w.ID)
			d.remote_addr = C.uint64_t(w.RemoteAddr)
			d.rkey = C.uint32_t(w.RKey)
			d.signaled = 0
			if w.Signaled {
				d.signaled = 1
			}
			switch w.Op {
			case OpRDMAWrite:
				d.opcode = C.IBV_WR_RDMA_WRITE
			case OpRDMARead:
				d.opcode = C.IBV_WR_RDMA_READ
			default:
				d.opcode = C.IBV_WR_SEND
			}
			d.nsge = C.uint32_t(w.NSGE)
			for j := 0; j < w.NSGE && j < 2; j++ {
				d.sge[j] = C.struct_isb_sge{addr: C.uint64_t(w.SGE[j].Addr), length: C.uint32_t(w.SGE[j].Len), lkey: C.uint32_t(w.SGE[j].LKey)}
			}
		}
		if r := C.isb_post_send(c.id.qp, c.sendScratch, C.int(n)); r < 0 {
			return fmt.Errorf("ibv_post_send (%d work requests): %w", n, syscall.Errno(-r))
		}
		counters.sendPosts.Add(1)
		counters.sendWRs.Add(int64(n))
		wrs = wrs[n:]
	}
	c.lastPost.Store(time.Now().UnixNano())
	if c.idleParked.Load() && c.idleParked.CompareAndSwap(true, false) {
		// the poller parked without a timer: its completions are expected now
		c.cpfd.f.SetReadDeadline(time.Now().Add(cqSafetyPoll))
	}
	return nil
}

// PostRecv posts receive work requests, chained. Safe for concurrent use.
func (c *Conn) PostRecv(wrs ...RecvWR) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if c.closing.Load() {
		return ErrClosed
	}
	s := unsafe.Slice(c.recvScratch, C.ISB_MAX_BATCH)
	for len(wrs) > 0 {
		n := min(len(wrs), C.ISB_MAX_BATCH)
		for i := 0; i < n; i++ {
			s[i] = C.struct_isb_recv{wr_id: C.uint64_t(wrs[i].ID), sge: C.struct_isb_sge{
				addr: C.uint64_t(wrs[i].SGE.Addr), length: C.uint32_t(wrs[i].SGE.Len), lkey: C.uint32_t(wrs[i].SGE.LKey)}}
		}
		if r := C.isb_post_recv(c.id.qp, c.recvScratch, C.int(n)); r < 0 {
			return fmt.Errorf("ibv_post_recv (%d work requests): %w", n, syscall.Errno(-r))
		}
		counters.recvPosts.Add(1)
		counters.recvWRs.Add(int64(n))
		wrs = wrs[n:]
	}
	return nil
}

// AckTimeout returns the queue pair's local ACK timeout exponent (ibv_query_qp).
func (c *Conn) AckTimeout() (int, error) {
	if !c.qp {
		return 0, ErrClosed
	}
	r := int(C.isb_qp_timeout(c.id.qp))
	if r < 0 {
		return 0, fmt.Errorf("ibv_query_qp: %w", syscall.Errno(-r))
	}
	return r, nil
}

// Disconnected reports whether the peer went away (or a CM error ended the connection).
func (c *Conn) Disconnected() bool { return c.disconnected.Load() }

// Close disconnects, stops the poller and the event watcher, and releases every C resource.
// The queue pair is destroyed before Close returns, so the device touches no registered memory
// afterwards. Idempotent.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		// Serialise with posters and registrations: after this nothing new reaches the QP.
		c.sendMu.Lock()
		c.recvMu.Lock()
		if c.qp {
			C.rdma_disconnect(c.id) // moves the QP to the error state; pending WRs flush
		}
		c.recvMu.Unlock()
		c.sendMu.Unlock()
		c.closeErr = c.destroy()
	})
	return c.closeErr
}

// destroy releases resources in dependency order; it copes with a partially built Conn.
func (c *Conn) destroy() error {
	c.closing.Store(true)
	if c.pollDone != nil {
		c.cpfd.close() // wakes the poller
		<-c.pollDone
	}
	if c.cmDone != nil {
		c.ec.pfd.close() // wakes the CM watcher
		<-c.cmDone
	}
	var errs []error
	if c.qp {
		C.rdma_destroy_qp(c.id)
		c.qp = false
		counters.qps.Add(-1)
	}
	if c.cq != nil {
		if r := C.ibv_destroy_cq(c.cq); r != 0 {
			errs = append(errs, fmt.Errorf("ibv_destroy_cq: %w", syscall.Errno(r)))
		}
		c.cq = nil
		counters.cqs.Add(-1)
	}
	c.cpfd.close()
	if c.cch != nil {
		if r := C.ibv_destroy_comp_channel(c.cch); r != 0 {
			errs = append(errs, fmt.Errorf("ibv_destroy_comp_channel: %w", syscall.Errno(r)))
		}
		c.cch = nil
	}
	c.mrMu.Lock()
	for m := range c.mrs {
		if err := m.deregLocked(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.pd != nil {
		if r := C.ibv_dealloc_pd(c.pd); r != 0 {
			errs = append(errs, fmt.Errorf("ibv_dealloc_pd: %w", syscall.Errno(r)))
		}
		c.pd = nil
		counters.pds.Add(-1)
	}
	c.mrMu.Unlock()
	if c.id != nil {
		C.rdma_destroy_id(c.id)
		c.id = nil
	}
	c.ec.close()
	c.ec = nil
	for _, p := range []unsafe.Pointer{unsafe.Pointer(c.sendScratch), unsafe.Pointer(c.recvScratch), unsafe.Pointer(c.wcScratch)} {
		if p != nil {
			C.free(p)
		}
	}
	c.sendScratch, c.recvScratch, c.wcScratch = nil, nil, nil
	if c.pollDone != nil {
		counters.conns.Add(-1)
	}
	return errors.Join(errs...)
}
