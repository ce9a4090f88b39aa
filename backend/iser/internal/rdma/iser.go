//go:build cgo && linux && !nordma

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/pool"
)

func init() { transport.Register("iser", Dialer{}) }

// Options tune an iSER connection. The zero value is what Linux initiators do.
type Options struct {
	// QueueDepth is the number of SCSI commands the connection keeps in flight (default 128, what
	// LIO isert sizes its queues for). Receive descriptors: QueueDepth + Unexpected + 4.
	QueueDepth int
	// Unexpected is how many unsolicited target PDUs (NOP-In, Async Message, Reject) we keep
	// receive descriptors for beyond the command window; offered as MaxOutstandingUnexpectedPDUs.
	Unexpected int
	// MaxTransfer caps one SCSI command's data (default 512 KiB: tgt's iSER buffers are 512 KiB and
	// larger commands fail there; LIO isert defaults to the same since Linux 5.14).
	MaxTransfer int
	// Pool supplies registered memory. nil: the pool given to SetPool, else a private pool.
	Pool *pool.Pool
	// AckTimeout is the RDMA local ACK timeout exponent of both ends of the connection (see
	// Config.AckTimeout); 0 keeps rdma_cm's default (17, 0.54 s on RoCE). Soft-RoCE on an
	// overloaded or emulated host retransmits spuriously at 0.54 s (20, ~4.3 s, stops that); on
	// a lossy fabric a longer timeout makes every lost packet cost that long.
	AckTimeout uint8
}

// DefaultMaxTransfer is the largest SCSI command an iSER connection sends unless told otherwise.
const DefaultMaxTransfer = 512 << 10

var (
	// liveMu guards live and orders SetPool against DialISER (lock order: liveMu, defaultPoolMu).
	liveMu        sync.Mutex
	live          = map[*ISERConn]struct{}{}
	defaultPoolMu sync.Mutex
	defaultPool   *pool.Pool
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

// Dialer is the "iser" transport of the transport registry.
type Dialer struct{ Options Options }

// DefaultPort implements transport.Dialer (iSER uses the iSCSI port, RFC 7145 §5.1).
func (Dialer) DefaultPort() int { return 3260 }

// Dial implements transport.Dialer.
func (d Dialer) Dial(ctx context.Context, portal string, opts transport.DialOptions) (transport.Conn, error) {
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	return DialISER(ctx, portal, d.Options)
}

// wr_id layout: kind in the top byte, slot index below.
const (
	wrRecv = 1 << 56
	wrSend = 2 << 56
	wrMask = 1<<56 - 1
)

// Descriptor layout: iSER header + BHS + room for the largest AHS + the data segment.
const (
	ahsRoom    = pdu.MaxAHSLength
	headerRoom = HeaderLen + pdu.BHSLen + ahsRoom
)

type rxItem struct {
	slot int32
	n    uint32
}

// bounced is a task whose buffer was not registered pool memory.
type bounced struct {
	orig   []byte
	bounce []byte
	dir    scsi.Direction
}

// ISERConn is a transport.Conn over an RDMA RC queue pair (RFC 7145). See the package comment.
type ISERConn struct {
	c      *Conn
	remote string
	opts   Options
	pool   *pool.Pool
	reg    *registrar                   // the pool bounces come from
	regs   atomic.Pointer[[]*registrar] // every pool registered with this connection (reg first)
	hook   *loginHook

	// control descriptors: one mmap, one MR (local access only)
	mem       []byte
	mr        *MR
	recvSize  int
	nrecv     int
	sendSize  int
	nsend     int
	sendFree  chan int32
	rxq       chan rxItem
	dead      chan struct{}
	deadOnce  sync.Once
	deadErr   error
	closeOnce sync.Once

	deadline   atomic.Int64 // unix nanos; 0 = none
	pendingErr atomic.Pointer[error]

	// memMu keeps Close from unmapping the descriptors while the reader or a sender touches them.
	memMu sync.RWMutex
	ahs   [pdu.MaxAHSLength]byte

	// reader state (one goroutine)
	cur     int32
	dataOff int
	dataLen int
	repost  []RecvWR
	maxRecv atomic.Int32
	maxSend atomic.Int32
	started atomic.Bool

	// Send batching: senders queue work requests; one poster goroutine (parked on kick when
	// idle) posts everything queued as one chain, so that under load one ibv_post_send (one
	// doorbell, on rxe one system call) carries many PDUs while the order of the queue (the
	// session's CmdSN order) is kept.
	sq        *sendQueue
	sqKick    chan struct{}
	posterOut chan struct{}
	// posterStarted is set before the poster goroutine starts (Dial) and read by Close.
	posterStarted bool

	bmu     sync.Mutex
	bounces map[uint32]*bounced

	// Bounces counts commands whose buffer had to be copied through a pool buffer.
	Bounces atomic.Int64
}

// Stats of an iSER connection.
type ISERStats struct {
	Bounces         int64
	MRRegistrations int64 // process-wide ibv_reg_mr count
}

// Stats returns the connection's counters.
func (ic *ISERConn) Stats() ISERStats {
	return ISERStats{Bounces: ic.Bounces.Load(), MRRegistrations: Stats().MRRegistrations}
}

// DialISER connects to portal ("host[:port]") and prepares the connection for login.
func DialISER(ctx context.Context, portal string, o Options) (_ *ISERConn, err error) {
	if o.QueueDepth <= 0 {
		o.QueueDepth = 128
	}
	if o.Unexpected <= 0 {
		o.Unexpected = 8
	}
	if o.MaxTransfer <= 0 {
		o.MaxTransfer = DefaultMaxTransfer
	}
	host, portStr, err := net.SplitHostPort(transport.JoinHostPort(portal, 3260))
	if err != nil {
		return nil, fmt.Errorf("iser: portal %q: %w", portal, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("iser: portal %q: bad port", portal)
	}
	p, err := poolFor(&o)
	if err != nil {
		return nil, err
	}
	reg, err := registrarFor(p)
	if err != nil {
		return nil, err
	}
	ic := &ISERConn{
		remote: net.JoinHostPort(host, portStr), opts: o, pool: p, reg: reg,
		hook: newLoginHook(defaultRecvDataSegLength, defaultRecvDataSegLength, uint32(o.Unexpected)),
		cur:  -1, dead: make(chan struct{}), bounces: map[uint32]*bounced{},
	}
	ic.maxRecv.Store(defaultRecvDataSegLength)
	ic.maxSend.Store(defaultRecvDataSegLength)
	// Receive descriptors: one per command in flight (its SCSI Response), the unexpected PDUs,
	// and a few for login/text/logout/TMF responses. Sized for the IRDSL we offer; the result
	// function is Minimum, so the negotiated value can only be smaller.
	ic.nrecv = o.QueueDepth + o.Unexpected + 4
	ic.recvSize = headerRoom + defaultRecvDataSegLength
	ic.nsend = o.QueueDepth + 16
	ic.sendSize = headerRoom + defaultRecvDataSegLength
	ic.sendFree = make(chan int32, ic.nsend)
	ic.sq = newSendQueue(ic.nsend)
	ic.sqKick = make(chan struct{}, 1)
	ic.posterOut = make(chan struct{})
	ic.rxq = make(chan rxItem, ic.nrecv)
	ic.repost = make([]RecvWR, 0, ic.nrecv)
	for i := range ic.nsend {
		ic.sendFree <- int32(i)
	}
	defer func() {
		if err != nil {
			ic.Close()
		}
	}()
	if ic.mem, err = AllocMem(ic.nrecv*ic.recvSize + ic.nsend*ic.sendSize); err != nil {
		return nil, err
	}
	ic.c, err = Dial(ctx, host, port, Config{
		SendDepth:    ic.nsend,
		RecvDepth:    ic.nrecv,
		SendSGE:      2,
		PrivateData:  CMPrivateData(),
		OnCompletion: ic.onCompletion,
		OnDisconnect: ic.onDisconnect,
		AckTimeout:   o.AckTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("iser: connect to %s: %w", ic.remote, err)
	}
	if ic.mr, err = ic.c.Register(ic.mem, AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("iser: register descriptors: %w", err)
	}
	if err = reg.attach(ic.c); err != nil {
		return nil, err
	}
	regs := []*registrar{reg}
	ic.regs.Store(&regs)
	// join the live set, picking up a pool SetPool installed since poolFor looked
	liveMu.Lock()
	defaultPoolMu.Lock()
	dp := defaultPool
	defaultPoolMu.Unlock()
	if dp != nil {
		err = ic.addPool(dp)
	}
	if err == nil {
		live[ic] = struct{}{}
	}
	liveMu.Unlock()
	if err != nil {
		return nil, err
	}
	for i := range ic.nrecv {
		ic.repost = append(ic.repost, RecvWR{ID: wrRecv | uint64(i), SGE: ic.mr.SGE(ic.recvBuf(int32(i)))})
	}
	if err = ic.c.PostRecv(ic.repost...); err != nil {
		return nil, fmt.Errorf("iser: post receives: %w", err)
	}
	ic.repost = ic.repost[:0]
	ic.posterStarted = true
	go ic.poster()
	return ic, nil
}

func (ic *ISERConn) recvBuf(i int32) []byte {
	off := int(i) * ic.recvSize
	return ic.mem[off : off+ic.recvSize : off+ic.recvSize]
}

func (ic *ISERConn) sendBuf(i int32) []byte {
	off := ic.nrecv*ic.recvSize + int(i)*ic.sendSize
	return ic.mem[off : off+ic.sendSize : off+ic.sendSize]
}

// fail records the first connection error and wakes every waiter.
func (ic *ISERConn) fail(err error) {
	ic.deadOnce.Do(func() {
		ic.deadErr = err
		close(ic.dead)
	})
}

func (ic *ISERConn) err() error {
	<-ic.dead
	if !ic.started.Load() && errors.Is(ic.deadErr, ErrDisconnected) {
		// LIO drops an iSER connection for an unknown target name or a refused initiator,
		// sometimes before its login reject reaches us.
		return fmt.Errorf("%w (the target closed the connection during login: unknown target name, or initiator not allowed?)", ic.deadErr)
	}
	return ic.deadErr
}

// onDisconnect runs when the CM reports the peer gone. librdmacm has moved the QP to the error
// state, so every posted receive completes with a flush error after any PDU that arrived before
// the disconnect: failing on the first flush (below) lets the reader see those PDUs first (a
// login reject followed by a disconnect must surface as the reject). The timer covers a queue
// with nothing posted.
func (ic *ISERConn) onDisconnect(err error) {
	err = fmt.Errorf("iser: %s: %w", ic.remote, err)
	ic.pendingErr.CompareAndSwap(nil, &err)
	time.AfterFunc(2*time.Second, func() { ic.fail(err) })
}

// onCompletion runs on the CQ poller goroutine.
func (ic *ISERConn) onCompletion(batch []Completion) {
	for i := range batch {
		wc := &batch[i]
		slot := int32(wc.ID & wrMask)
		switch wc.ID &^ wrMask {
		case wrRecv:
			if !wc.OK() {
				if pe := ic.pendingErr.Load(); pe != nil && wc.Flushed() {
					ic.fail(*pe)
				} else {
					ic.fail(fmt.Errorf("iser: receive from %s: %w", ic.remote, &CompletionError{Op: wc.Op, Status: wc.Status, VendorErr: wc.VendorErr}))
				}
				continue
			}
			ic.rxq <- rxItem{slot: slot, n: wc.ByteLen} // never blocks: one entry per descriptor
		case wrSend:
			ic.sendFree <- slot
			if !wc.OK() {
				ic.fail(fmt.Errorf("iser: send to %s: %w", ic.remote, &CompletionError{Op: wc.Op, Status: wc.Status, VendorErr: wc.VendorErr}))
			}
		}
	}
}

func (ic *ISERConn) deadlineChan() (<-chan time.Time, func()) {
	d := ic.deadline.Load()
	if d == 0 {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(time.Unix(0, d)))
	return t.C, func() { t.Stop() }
}

// errTimeout satisfies os.ErrDeadlineExceeded like a net.Conn's deadline error.
var errTimeout = fmt.Errorf("iser: %w", os.ErrDeadlineExceeded)

// ReadHeader implements transport.Conn.
func (ic *ISERConn) ReadHeader(bhs *pdu.BHS) ([]byte, error) {
	if ic.cur >= 0 {
		ic.repost = append(ic.repost, RecvWR{ID: wrRecv | uint64(ic.cur), SGE: ic.mr.SGE(ic.recvBuf(ic.cur))})
		ic.cur = -1
	}
	var it rxItem
	select {
	case it = <-ic.rxq:
	default:
		// Nothing waiting: hand the consumed descriptors back before parking.
		if err := ic.flushReposts(); err != nil {
			return nil, err
		}
		tc, stop := ic.deadlineChan()
		select {
		case it = <-ic.rxq:
		case <-ic.dead:
			stop()
			// PDUs that arrived before the failure are queued before it is reported.
			select {
			case it = <-ic.rxq:
			default:
				return nil, ic.err()
			}
		case <-tc:
			stop()
			return nil, errTimeout
		}
		stop()
	}
	if len(ic.repost) >= 16 {
		if err := ic.flushReposts(); err != nil {
			return nil, err
		}
	}
	ic.cur = it.slot
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return nil, ErrClosed
	}
	b := ic.recvBuf(it.slot)
	n := int(it.n)
	if n > len(b) {
		return nil, fmt.Errorf("iser: receive of %d bytes in a %d-byte descriptor", n, len(b))
	}
	b = b[:n]
	if _, err := DecodeHeader(b); err != nil {
		return nil, err
	}
	if n < HeaderLen+pdu.BHSLen {
		return nil, fmt.Errorf("%w: %d-byte Send holds no iSCSI header", ErrMalformedHeader, n)
	}
	copy(bhs[:], b[HeaderLen:HeaderLen+pdu.BHSLen])
	if err := bhs.Validate(int(ic.maxRecv.Load())); err != nil {
		return nil, fmt.Errorf("iser: %w", err)
	}
	ahsLen := bhs.TotalAHSLength()
	dsl := bhs.DataSegmentLength()
	ic.dataOff = HeaderLen + pdu.BHSLen + ahsLen
	ic.dataLen = dsl
	if ic.dataOff+dsl > n {
		return nil, fmt.Errorf("iser: %v PDU declares %d AHS + %d data bytes but the Send carried %d",
			bhs.Opcode(), ahsLen, dsl, n-HeaderLen-pdu.BHSLen)
	}
	if bhs.Opcode() == pdu.OpSCSIResponse {
		ic.unbounce(bhs)
	}
	var ahs []byte
	if ahsLen > 0 {
		ahs = ic.ahs[:copy(ic.ahs[:], b[HeaderLen+pdu.BHSLen:ic.dataOff])]
	}
	return ahs, nil
}

func (ic *ISERConn) flushReposts() error {
	if len(ic.repost) == 0 {
		return nil
	}
	err := ic.c.PostRecv(ic.repost...)
	ic.repost = ic.repost[:0]
	if err != nil {
		ic.fail(fmt.Errorf("iser: repost receives: %w", err))
		return ic.err()
	}
	return nil
}

// ReadData implements transport.Conn.
func (ic *ISERConn) ReadData(dst []byte) error {
	if ic.cur < 0 || len(dst) != ic.dataLen {
		return fmt.Errorf("iser: ReadData of %d bytes, the PDU carries %d", len(dst), ic.dataLen)
	}
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return ErrClosed
	}
	copy(dst, ic.recvBuf(ic.cur)[ic.dataOff:ic.dataOff+ic.dataLen])
	ic.dataLen = 0
	return nil
}

// DiscardData implements transport.Conn.
func (ic *ISERConn) DiscardData() error {
	ic.dataLen = 0
	return nil
}

// acquireSend takes a free send descriptor, waiting for a send completion if all are in flight.
func (ic *ISERConn) acquireSend() (int32, error) {
	select {
	case s := <-ic.sendFree:
		return s, nil
	default:
	}
	tc, stop := ic.deadlineChan()
	defer stop()
	select {
	case s := <-ic.sendFree:
		return s, nil
	case <-ic.dead:
		return -1, ic.err()
	case <-tc:
		return -1, errTimeout
	}
}

// send builds the descriptor (iSER header, BHS, AHS, data) and posts it. data travels as a second
// SGE straight from registered pool memory when it lies there, else it is copied into the
// descriptor (login, text, NOP payloads).
func (ic *ISERConn) send(h *Header, bhs *pdu.BHS, ahs, data []byte) error {
	select {
	case <-ic.dead:
		return ic.err()
	default:
	}
	if len(ahs) > ahsRoom || len(ahs)%4 != 0 {
		return fmt.Errorf("iser: AHS of %d bytes", len(ahs))
	}
	if limit := int(ic.maxSend.Load()); len(data) > limit && ic.started.Load() {
		return fmt.Errorf("iser: %d-byte data segment exceeds TargetRecvDataSegmentLength %d", len(data), limit)
	}
	slot, err := ic.acquireSend()
	if err != nil {
		return err
	}
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return ErrClosed
	}
	b := ic.sendBuf(slot)
	h.Encode(b)
	copy(b[HeaderLen:], bhs[:])
	n := HeaderLen + pdu.BHSLen
	n += copy(b[n:], ahs)
	w := SendWR{ID: wrSend | uint64(slot), Op: OpSend, Signaled: true, NSGE: 1}
	if len(data) > 0 {
		if lkey, _, ok := ic.keysFor(data); ok {
			w.NSGE = 2
			w.SGE[1] = SGE{Addr: AddrOf(data), Len: uint32(len(data)), LKey: lkey}
		} else if n+len(data) <= len(b) {
			n += copy(b[n:], data)
		} else {
			ic.sendFree <- slot
			return fmt.Errorf("iser: %d-byte data segment does not fit a %d-byte descriptor", len(data), len(b)-n)
		}
	}
	w.SGE[0] = ic.mr.SGE(b[:n])
	ic.sq.push(w) // never grows the buffers: at most one entry per send slot
	select {
	case ic.sqKick <- struct{}{}:
	default: // the poster is already due to run
	}
	return nil
}

// poster posts queued sends in batches until the connection fails or closes.
func (ic *ISERConn) poster() {
	defer close(ic.posterOut)
	for {
		select {
		case <-ic.sqKick:
		case <-ic.dead:
			return
		}
		batch := ic.sq.take()
		if batch == nil {
			continue // an earlier round took what this kick announced
		}
		if err := ic.c.PostSend(batch...); err != nil {
			for _, w := range batch {
				ic.sendFree <- int32(w.ID & wrMask)
			}
			ic.fail(fmt.Errorf("iser: post %d sends: %w", len(batch), err))
			return
		}
		ic.sq.done(batch)
	}
}

// WritePDU implements transport.Conn.
func (ic *ISERConn) WritePDU(bhs *pdu.BHS, ahs, data []byte) error {
	h := Header{Flags: OpcodeControl}
	return ic.send(&h, bhs, ahs, data)
}

// WriteCommand implements transport.Conn: the SCSI Command goes out with the task buffer's STag
// and address, so the target RDMA-Reads write data (WSV) or RDMA-Writes read data (RSV) straight
// from/into it. A buffer that is not registered pool memory is bounced through a pool buffer.
func (ic *ISERConn) WriteCommand(bhs *pdu.BHS, ahs []byte, t *transport.Task) error {
	h := Header{Flags: OpcodeControl}
	buf := t.Buf
	if len(buf) > ic.opts.MaxTransfer {
		return fmt.Errorf("iser: %d-byte command exceeds the %d-byte iSER transfer limit", len(buf), ic.opts.MaxTransfer)
	}
	if len(buf) == 0 || t.Dir == scsi.DirNone {
		return ic.send(&h, bhs, ahs, nil)
	}
	_, rkey, ok := ic.keysFor(buf)
	if !ok {
		b, err := ic.bounce(t)
		if err != nil {
			return err
		}
		buf = b
		if _, rkey, ok = ic.keysFor(buf); !ok {
			ic.dropBounce(t.ITT)
			return fmt.Errorf("iser: bounce buffer is not registered: %w", errNotRegistered)
		}
	}
	var imm []byte
	switch t.Dir {
	case scsi.DirWrite:
		if t.Immediate > 0 {
			imm = buf[:t.Immediate]
		}
		if t.Unsolicited < len(buf) {
			h.Flags |= FlagWSV
			h.WriteSTag = rkey
			h.WriteVA = AddrOf(buf) + uint64(t.Unsolicited)
		}
	case scsi.DirRead:
		h.Flags |= FlagRSV
		h.ReadSTag = rkey
		h.ReadVA = AddrOf(buf)
	}
	if err := ic.send(&h, bhs, ahs, imm); err != nil {
		ic.dropBounce(t.ITT)
		return err
	}
	return nil
}

// bounce copies a task's foreign buffer into a pool buffer (writes) or prepares one to receive
// (reads), remembering it by ITT.
func (ic *ISERConn) bounce(t *transport.Task) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := ic.pool.Get(ctx, len(t.Buf))
	if err != nil {
		return nil, fmt.Errorf("iser: bounce buffer for a %d-byte command: %w", len(t.Buf), err)
	}
	if t.Dir == scsi.DirWrite {
		copy(b, t.Buf)
	}
	ic.bmu.Lock()
	ic.bounces[t.ITT] = &bounced{orig: t.Buf, bounce: b, dir: t.Dir}
	ic.bmu.Unlock()
	ic.Bounces.Add(1)
	return b, nil
}

// unbounce copies a bounced read's data back when its SCSI Response arrives: the target's RDMA
// Writes were placed before the Send that carries the response (RC ordering).
func (ic *ISERConn) unbounce(bhs *pdu.BHS) {
	ic.bmu.Lock()
	bt := ic.bounces[bhs.ITT()]
	ic.bmu.Unlock()
	if bt == nil || bt.dir != scsi.DirRead {
		return
	}
	n := len(bt.orig)
	if bhs.Flags()&pdu.FlagUnderflow != 0 {
		if r := int(bhs.ResidualCount()); r < n {
			n -= r
		} else {
			n = 0
		}
	}
	copy(bt.orig[:n], bt.bounce[:n])
}

func (ic *ISERConn) dropBounce(itt uint32) {
	ic.bmu.Lock()
	bt := ic.bounces[itt]
	delete(ic.bounces, itt)
	ic.bmu.Unlock()
	if bt != nil {
		ic.pool.Put(bt.bounce)
	}
}

// TaskDone implements transport.Conn. Registered pool buffers need nothing (their keys live as
// long as the region); a bounce buffer goes back to the pool.
func (ic *ISERConn) TaskDone(itt uint32) {
	ic.bmu.Lock()
	_, ok := ic.bounces[itt]
	ic.bmu.Unlock()
	if ok {
		ic.dropBounce(itt)
	}
}

// LoginHook implements transport.Conn.
func (ic *ISERConn) LoginHook() login.Hook { return ic.hook }

// Start implements transport.Conn.
func (ic *ISERConn) Start(p *login.Params) error {
	if p.MaxRecvDataSegmentLength > defaultRecvDataSegLength {
		return fmt.Errorf("iser: negotiated InitiatorRecvDataSegmentLength %d exceeds our %d-byte receive descriptors",
			p.MaxRecvDataSegmentLength, defaultRecvDataSegLength)
	}
	if p.MaxRecvDataSegmentLength > 0 {
		ic.maxRecv.Store(int32(p.MaxRecvDataSegmentLength))
	}
	if p.TargetMaxRecvDataSegmentLength > 0 {
		ic.maxSend.Store(int32(min(p.TargetMaxRecvDataSegmentLength, defaultRecvDataSegLength)))
	}
	ic.started.Store(true)
	return nil
}

// MovesData implements transport.Conn: the target moves SCSI data by RDMA.
func (ic *ISERConn) MovesData() bool { return true }

// MaxTransferLength is the largest SCSI command data length this connection sends; the device
// layer caps its requests to it (iSER has no negotiation for it).
func (ic *ISERConn) MaxTransferLength() int { return ic.opts.MaxTransfer }

// SetDeadline implements transport.Conn.
func (ic *ISERConn) SetDeadline(t time.Time) error {
	if t.IsZero() {
		ic.deadline.Store(0)
	} else {
		ic.deadline.Store(t.UnixNano())
	}
	return nil
}

// RemoteAddr implements transport.Conn.
func (ic *ISERConn) RemoteAddr() string { return "iser://" + ic.remote }

// Close implements transport.Conn: disconnect, destroy the QP (after which the device touches no
// memory of ours), release descriptors and return bounce buffers.
func (ic *ISERConn) Close() error {
	var err error
	ic.closeOnce.Do(func() {
		ic.fail(ErrClosed)
		if ic.posterStarted {
			<-ic.posterOut // it leaves once dead is closed; ibv_post_send never blocks
		}
		if ic.c != nil {
			liveMu.Lock()
			delete(live, ic)
			liveMu.Unlock()
			if regs := ic.regs.Load(); regs != nil {
				for _, r := range *regs {
					r.detach(ic.c)
				}
			} else {
				ic.reg.detach(ic.c)
			}
			err = ic.c.Close()
		}
		ic.memMu.Lock()
		if ic.mem != nil {
			if e := FreeMem(ic.mem); e != nil && err == nil {
				err = e
			}
			ic.mem = nil
		}
		ic.memMu.Unlock()
		ic.bmu.Lock()
		for itt, bt := range ic.bounces {
			ic.pool.Put(bt.bounce)
			delete(ic.bounces, itt)
		}
		ic.bmu.Unlock()
	})
	return err
}

var _ transport.Conn = (*ISERConn)(nil)
