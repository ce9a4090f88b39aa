//go:build cgo && linux && !nordma

package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// Available: this build has the iSER transport (cgo and rdma-core). Whether the host has an RDMA
// device is another matter, which a dial finds out (ErrNoDevice).
const Available = true

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
	reclaim   *sendReclaim // which sends are signalled; the descriptors in flight
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

	// Send batching: senders queue work requests and the one whose push finds no post in
	// progress posts everything queued as one chain (sendq.go), so that one ibv_post_send (one
	// doorbell, on rxe one system call) carries a batch of PDUs, with no goroutine wake-up,
	// while the order of the queue (the session's CmdSN order) is kept.
	sq *sendQueue

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
	o.setDefaults()
	host, port, err := splitPortal(portal)
	if err != nil {
		return nil, err
	}
	p, err := poolFor(&o)
	if err != nil {
		return nil, err
	}
	reg, err := registrarFor(p)
	if err != nil {
		return nil, err
	}
	ic := newISERConn(net.JoinHostPort(host, strconv.Itoa(port)), o, p, reg)
	defer func() {
		if err != nil {
			ic.Close()
		}
	}()
	if err = ic.connect(ctx, host, port); err != nil {
		return nil, err
	}
	if err = ic.joinLive(); err != nil {
		return nil, err
	}
	if err = ic.postInitialRecvs(); err != nil {
		return nil, err
	}
	return ic, nil
}

// setDefaults fills the options left zero.
func (o *Options) setDefaults() {
	if o.QueueDepth <= 0 {
		o.QueueDepth = 128
	}
	if o.Unexpected <= 0 {
		o.Unexpected = 8
	}
	if o.MaxTransfer <= 0 {
		o.MaxTransfer = DefaultMaxTransfer
	}
}

// splitPortal splits host[:port] (port 3260 when absent).
func splitPortal(portal string) (host string, port int, err error) {
	host, portStr, err := net.SplitHostPort(transport.JoinHostPort(portal, 3260))
	if err != nil {
		return "", 0, fmt.Errorf("iser: portal %q: %w", portal, err)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("iser: portal %q: bad port", portal)
	}
	return host, port, nil
}

// newISERConn is a connection to remote, not yet connected, with its descriptor counts and
// queues sized from o.
func newISERConn(remote string, o Options, p *pool.Pool, reg *registrar) *ISERConn {
	ic := &ISERConn{
		remote: remote, opts: o, pool: p, reg: reg,
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
	ic.reclaim = newSendReclaim(ic.nsend)
	ic.rxq = make(chan rxItem, ic.nrecv)
	ic.repost = make([]RecvWR, 0, ic.nrecv)
	for i := range ic.nsend {
		ic.sendFree <- int32(i)
	}
	return ic
}

// connect allocates and registers the descriptors, connects the queue pair (rdma-cm, with the
// iSER private data) and attaches the pool's registrar to it.
func (ic *ISERConn) connect(ctx context.Context, host string, port int) (err error) {
	if ic.mem, err = allocMem(ic.nrecv*ic.recvSize + ic.nsend*ic.sendSize); err != nil {
		return err
	}
	ic.c, err = Dial(ctx, host, port, Config{
		SendDepth:    ic.nsend,
		RecvDepth:    ic.nrecv,
		SendSGE:      2,
		PrivateData:  CMPrivateData(),
		OnCompletion: ic.onCompletion,
		OnDisconnect: ic.onDisconnect,
		AckTimeout:   ic.opts.AckTimeout,
	})
	if err != nil {
		return fmt.Errorf("iser: connect to %s: %w", ic.remote, err)
	}
	if ic.mr, err = ic.c.Register(ic.mem, AccessLocalWrite); err != nil {
		return fmt.Errorf("iser: register descriptors: %w", err)
	}
	if err = ic.reg.attach(ic.c); err != nil {
		return err
	}
	regs := []*registrar{ic.reg}
	ic.regs.Store(&regs)
	return nil
}

// joinLive adds ic to the live set SetPool registers with, picking up a pool SetPool installed
// since poolFor looked (lock order: liveMu, defaultPoolMu).
func (ic *ISERConn) joinLive() (err error) {
	liveMu.Lock()
	defer liveMu.Unlock()
	defaultPoolMu.Lock()
	dp := defaultPool
	defaultPoolMu.Unlock()
	if dp != nil {
		err = ic.addPool(dp)
	}
	if err == nil {
		live[ic] = struct{}{}
	}
	return err
}

// postInitialRecvs posts every receive descriptor.
func (ic *ISERConn) postInitialRecvs() error {
	for i := range ic.nrecv {
		ic.repost = append(ic.repost, RecvWR{ID: wrRecv | uint64(i), SGE: ic.mr.SGE(ic.recvBuf(int32(i)))})
	}
	if err := ic.c.PostRecv(ic.repost...); err != nil {
		return fmt.Errorf("iser: post receives: %w", err)
	}
	ic.repost = ic.repost[:0]
	return nil
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
		ic.fail(ErrClosed) // a poster mid-post is serialised with the QP's end by Conn.Close
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
			if e := freeMem(ic.mem); e != nil && err == nil {
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
