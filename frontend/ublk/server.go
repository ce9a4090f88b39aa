package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// BufferPool supplies the per-tag data buffers. pool.Pool satisfies it; with an RDMA transport
// its buffers are registered memory, so the driver's copy lands where the NIC reads and writes.
type BufferPool interface {
	Get(ctx context.Context, n int) ([]byte, error)
	Put(b []byte)
}

// Options configure a Server. Zero values mean the defaults.
type Options struct {
	Queues int // hardware queues (default: CPUs, at most 4; the driver clamps to the CPU count)
	Depth  int // requests in flight per queue (default 64, at most 4096)
	// MaxIO caps the request size in bytes (default 512 KiB, and never above the device's
	// MaxTransfer or the driver's 32 MiB). Queues × Depth buffers of this size are allocated.
	MaxIO int
	// Pool supplies per-tag buffers; nil maps anonymous memory.
	Pool BufferPool
	// ControlPath is the control device (default /dev/ublk-control).
	ControlPath string
	// DrainTimeout bounds how long Shutdown lets in-flight requests run before cancelling their
	// context so they fail and the kernel's STOP_DEV can finish (default 30 s).
	DrainTimeout time.Duration
	Logger       *zap.Logger
}

// Server exports a block.Device as /dev/ublkbN.
type Server struct {
	dev    block.Device
	lim    block.Limits
	log    *zap.Logger
	reqLog *zap.Logger // per-request failures, sampled so a dead backend cannot flood the log
	drain  time.Duration
	ctrl   *Control
	info   DevInfo
	maxIO  int
	charFd int
	queues []*queue
	pool   BufferPool
	bufs   [][]byte // pool buffers to return
	anon   [][]byte // anonymous mappings to unmap

	ioCtx    context.Context // requests run under it; cancelled only when the server is torn down
	ioCancel context.CancelFunc

	failed   chan struct{} // closed when a queue ended on its own
	failOnce sync.Once
	failErr  error

	stopping     atomic.Bool // set before STOP_DEV: queues ending from now on are expected
	shutdownOnce sync.Once
	shutdownErr  error
}

// Start creates a ublk device for dev, starts its queues and the disk, and returns once
// /dev/ublkbN exists. The caller must call Shutdown (which does not close dev).
func Start(ctx context.Context, dev block.Device, opts Options) (s *Server, err error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	queues := opts.Queues
	if queues <= 0 {
		queues = DefaultQueues()
	}
	depth := opts.Depth
	if depth <= 0 {
		depth = DefaultDepth
	}
	if queues > maxQueues || depth > maxQueueDepth {
		return nil, fmt.Errorf("ublk: %d queues × depth %d exceeds the driver's %d × %d: %w", queues, depth, maxQueues, maxQueueDepth, block.ErrInvalid)
	}
	lim := dev.Limits()
	if lim.LogicalBlockSize == 0 {
		lim.LogicalBlockSize = uint32(dev.BlockSize())
	}
	maxIO := maxIOFor(lim, opts.MaxIO)
	if mc, ok := opts.Pool.(interface{ MaxClass() int }); ok && mc.MaxClass() < maxIO {
		maxIO = maxIOFor(lim, mc.MaxClass()) // every tag's buffer must be one pool buffer
	}
	// Check the parameters before anything exists in the kernel.
	if _, err := buildParams(dev.Size(), lim, maxIO); err != nil {
		return nil, err
	}

	ctrl, err := OpenControl(opts.ControlPath)
	if err != nil {
		return nil, err
	}
	feat, err := ctrl.Features()
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("ublk: %w (kernel older than 6.5?)", err)
	}
	if feat&FeatCmdIoctlEncode == 0 {
		ctrl.Close()
		return nil, fmt.Errorf("%w: the driver lacks ioctl-encoded commands (features %#x)", ErrNoKernel, feat)
	}

	s = &Server{dev: dev, lim: lim, log: log, ctrl: ctrl, charFd: -1, pool: opts.Pool, failed: make(chan struct{})}
	s.ioCtx, s.ioCancel = context.WithCancel(context.WithoutCancel(ctx))
	// No USER_RECOVERY: if this process dies the driver fails outstanding and new I/O and
	// removes the disk rather than queueing I/O for a server that may never come back.
	s.info = DevInfo{
		NrHWQueues:    uint16(queues),
		QueueDepth:    uint16(depth),
		MaxIOBufBytes: uint32(maxIO),
		DevID:         ^uint32(0),
		Flags:         FeatCmdIoctlEncode,
	}
	if err := ctrl.AddDev(&s.info); err != nil {
		ctrl.Close()
		s.ioCancel()
		return nil, err
	}
	s.log = log.With(zap.Uint32("ublk", s.info.DevID))
	s.reqLog = s.log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
	}))
	s.drain = opts.DrainTimeout
	if s.drain <= 0 {
		s.drain = 30 * time.Second
	}
	started := false
	defer func() {
		if err != nil {
			s.teardown(started)
		}
	}()
	if int(s.info.MaxIOBufBytes) < maxIO {
		maxIO = int(s.info.MaxIOBufBytes)
	}
	s.maxIO = maxIO
	params, err := buildParams(dev.Size(), lim, maxIO)
	if err != nil {
		return nil, err
	}
	if err := ctrl.SetParams(s.info.DevID, &params); err != nil {
		return nil, err
	}
	if s.charFd, err = openRetry(fmt.Sprintf("/dev/ublkc%d", s.info.DevID)); err != nil {
		return nil, err
	}
	n, d := int(s.info.NrHWQueues), int(s.info.QueueDepth)
	ready := make(chan error, n)
	for qi := 0; qi < n; qi++ {
		bufs, err := s.allocBuffers(ctx, d, maxIO)
		if err != nil {
			return nil, err
		}
		q, err := newQueue(s, uint16(qi), d, bufs)
		if err != nil {
			return nil, err
		}
		s.queues = append(s.queues, q)
		q.start(ready)
	}
	for range s.queues {
		if e := <-ready; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return nil, err
	}
	for _, q := range s.queues {
		go s.watch(q)
	}
	if err := ctrl.StartDev(s.info.DevID, os.Getpid()); err != nil {
		return nil, err
	}
	started = true
	if info, err := ctrl.DevInfo(s.info.DevID); err != nil {
		return nil, err
	} else if info.State != devStateLive {
		return nil, fmt.Errorf("ublk: device %d is %s after START_DEV", s.info.DevID, info.StateName())
	}
	s.log.Info("ublk device started", zap.String("dev", s.BlockPath()),
		zap.Int("queues", n), zap.Int("depth", d),
		zap.String("max_io", humanize.IBytes(uint64(maxIO))),
		zap.String("size", humanize.IBytes(uint64(dev.Size()))),
		zap.Bool("volatile_cache", lim.VolatileCache), zap.Bool("fua", lim.CanFUA),
		zap.Bool("discard", lim.CanDiscard), zap.Bool("write_zeroes", lim.CanWriteZeroes),
		zap.Bool("read_only", lim.ReadOnly))
	return s, nil
}

// openRetry opens a device node that udev (if any) may still be creating.
func openRetry(path string) (int, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.ENOENT) || time.Now().After(deadline) {
			return -1, fmt.Errorf("open %s: %w", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) allocBuffers(ctx context.Context, depth, size int) ([][]byte, error) {
	bufs := make([][]byte, depth)
	if s.pool != nil {
		for i := range bufs {
			b, err := s.pool.Get(ctx, size)
			if err != nil {
				return nil, fmt.Errorf("ublk: buffer %d of %s from the pool: %w", i, humanize.IBytes(uint64(size)), err)
			}
			s.bufs = append(s.bufs, b)
			bufs[i] = b[:size]
		}
		return bufs, nil
	}
	m, err := unix.Mmap(-1, 0, depth*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("ublk: map %d buffers of %s: %w", depth, humanize.IBytes(uint64(size)), err)
	}
	s.anon = append(s.anon, m)
	for i := range bufs {
		bufs[i] = m[i*size : (i+1)*size : (i+1)*size]
	}
	return bufs, nil
}

// watch reports a queue that ends while the server is not shutting down.
func (s *Server) watch(q *queue) {
	<-q.exited
	if s.stopping.Load() {
		return // STOP_DEV aborts every parked FETCH: the queue ending is expected
	}
	err := q.err
	if err == nil {
		err = errQueueAborted
	}
	s.fail(fmt.Errorf("ublk queue %d ended: %w", q.id, err))
}

func (s *Server) fail(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		s.log.Error("ublk server failed", zap.Error(err))
		close(s.failed)
	})
}

// DevID is the ublk device number N.
func (s *Server) DevID() uint32 { return s.info.DevID }

// BlockPath is the block device node, /dev/ublkbN.
func (s *Server) BlockPath() string { return fmt.Sprintf("/dev/ublkb%d", s.info.DevID) }

// Info is what the driver granted at ADD_DEV (queues, depth, buffer size, flags).
func (s *Server) Info() DevInfo { return s.info }

// Failed is closed when the server stopped serving on its own (a queue's ring failed or the
// driver aborted the device); Err then says why. Shutdown must still be called.
func (s *Server) Failed() <-chan struct{} { return s.failed }

// Err is the reason Failed was closed, or nil.
func (s *Server) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

// Shutdown removes the device cleanly: STOP_DEV (the kernel fails new I/O and waits for the
// requests in flight, which the queues keep serving), Flush of the Device so every acknowledged
// write is durable, then the queues stop, /dev/ublkcN is closed and DEL_DEV removes the device.
// It does not close the Device. It is idempotent; later calls return the first result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(ctx) })
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	var errs []error
	t0 := time.Now()
	s.stopping.Store(true)
	// STOP_DEV waits for every request in flight; a backend request that never returns would
	// hold it forever, so after the drain timeout the requests' context is cancelled.
	stuck := time.AfterFunc(s.drain, func() {
		s.log.Warn("ublk requests still in flight after the drain timeout; cancelling them", zap.Duration("drain_timeout", s.drain))
		s.ioCancel()
	})
	if err := s.ctrl.StopDev(s.info.DevID); err != nil {
		errs = append(errs, err)
	}
	stuck.Stop()
	s.log.Info("ublk disk removed, in-flight requests drained", zap.Duration("took", time.Since(t0)))
	if err := s.dev.Flush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("ublk: final flush: %w", err))
	}
	s.teardown(true)
	return errors.Join(errs...)
}

// teardown stops the queues, releases the character device, deletes the device and frees the
// buffers. With stopped false the disk was never started (Start failed).
func (s *Server) teardown(stopped bool) {
	s.stopping.Store(true)
	for _, q := range s.queues {
		q.stop()
	}
	for _, q := range s.queues {
		<-q.exited
		unix.Close(q.efd)
		if q.err != nil && !errors.Is(q.err, errQueueAborted) {
			s.log.Warn("ublk queue ended with an error", zap.Uint16("queue", q.id), zap.Error(q.err))
		}
	}
	if s.charFd >= 0 {
		unix.Close(s.charFd)
		s.charFd = -1
	}
	if !stopped {
		// START_DEV may have got as far as adding the disk.
		_ = s.ctrl.StopDev(s.info.DevID)
	}
	if err := s.ctrl.DelDev(s.info.DevID); err != nil {
		s.log.Warn("ublk DEL_DEV failed", zap.Error(err))
	} else {
		s.log.Info("ublk device deleted")
	}
	s.ctrl.Close()
	s.ioCancel()
	for _, b := range s.bufs {
		s.pool.Put(b)
	}
	s.bufs = nil
	for _, m := range s.anon {
		unix.Munmap(m)
	}
	s.anon = nil
}
