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
	"github.com/iser-blk/iser-blk/internal/status"
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
	// ID asks ADD_DEV for /dev/ublkbID (at most MaxID); nil lets the driver pick the lowest
	// free number. A number in use is ErrIDTaken.
	ID *uint32
	// MaxIO caps the request size in bytes (default 512 KiB, and never above the device's
	// MaxTransfer or the driver's 32 MiB). Queues × Depth buffers of this size are allocated.
	MaxIO int
	// Pool supplies per-tag buffers; nil maps anonymous memory.
	Pool BufferPool
	// ControlPath is the control device (default /dev/ublk-control).
	ControlPath string
	// DrainTimeout bounds how long Shutdown or Detach lets in-flight requests run before
	// cancelling their context so they fail and the kernel's STOP_DEV can finish (default 30 s).
	// A read or write the ring thread started on the device (submit.go) does not look at that
	// context: it ends by its response or by the backend's own command timeout.
	DrainTimeout time.Duration
	// Recovery decides what the driver does with the device when this process dies (see
	// recovery.go); the zero value removes it, as before.
	Recovery RecoveryMode
	// OnCreated, if set, runs once ADD_DEV has given the device its id and before the disk can
	// take a request (the caller records its state there); an error tears the device down.
	OnCreated func(id uint32) error
	Logger    *zap.Logger
	// Counters, when set, counts every request per operation for status and metrics
	// (counters.go); nil counts nothing.
	Counters *status.IOCounters
	// NoRingPath hands every request to its tag's worker, as before issue 37: the ring thread
	// neither serves cache hits nor starts reads and writes on the device (submit.go). For
	// tests of the fallback and for A/B measurements.
	NoRingPath bool
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
	// counters is Options.Counters (nil: off).
	counters *status.IOCounters
	ring     ringPath // what the ring thread may serve without a worker (submit.go)
	queues   []*queue
	pool     BufferPool
	bufs     [][]byte // pool buffers to return
	anon     [][]byte // anonymous mappings to unmap

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
// /dev/ublkbN exists. The caller must call Shutdown or Detach (neither closes dev).
//
// The steps: settle the configuration (and check the parameters) before anything exists in the
// kernel; open the control device; ADD_DEV; SET_PARAMS; start every queue and wait until each
// has a FETCH_REQ parked for every tag; START_DEV, which adds the disk. A failure after ADD_DEV
// tears down whatever exists, so nothing is left in the kernel.
func Start(ctx context.Context, dev block.Device, opts Options) (s *Server, err error) {
	s, cfg, feat, err := newServer(ctx, dev, opts)
	if err != nil {
		return nil, err
	}
	cfg.flags = recoveryFlags(opts.Recovery, feat, cfg.log)
	if err := s.addDev(cfg); err != nil {
		s.ctrl.Close()
		s.ioCancel()
		return nil, err
	}
	started := false
	defer func() {
		if err != nil {
			s.teardown(started)
		}
	}()
	if err := s.setParams(cfg.maxIO); err != nil {
		return nil, err
	}
	if opts.OnCreated != nil {
		if err := opts.OnCreated(s.info.DevID); err != nil {
			return nil, err
		}
	}
	if err := s.startQueues(ctx); err != nil {
		return nil, err
	}
	if started, err = s.startDisk(); err != nil {
		return nil, err
	}
	s.logStarted()
	return s, nil
}

// newServer settles the configuration and opens the control device: the first steps of Start
// and Recover. It also returns the driver's feature bits.
func newServer(ctx context.Context, dev block.Device, opts Options) (*Server, startConfig, uint64, error) {
	cfg, err := configure(dev, opts)
	if err != nil {
		return nil, cfg, 0, err
	}
	ctrl, feat, err := openControl(opts.ControlPath)
	if err != nil {
		return nil, cfg, 0, err
	}
	s := &Server{dev: dev, lim: cfg.lim, log: cfg.log, drain: cfg.drain, ctrl: ctrl, charFd: -1,
		pool: opts.Pool, failed: make(chan struct{}), counters: opts.Counters,
		ring: newRingPath(dev, opts.NoRingPath)}
	s.ioCtx, s.ioCancel = context.WithCancel(context.WithoutCancel(ctx))
	return s, cfg, feat, nil
}

// startConfig is what Start derives from the Device and Options before it touches the kernel.
type startConfig struct {
	queues, depth int
	maxIO         int // the largest request, before ADD_DEV may lower it
	lim           block.Limits
	drain         time.Duration
	flags         uint64 // UBLK_F_USER_RECOVERY* asked for at ADD_DEV
	id            uint32 // the device number asked for at ADD_DEV (^0: any)
	log           *zap.Logger
}

// configure applies the Options' defaults and checks the result, including the block
// parameters, so that a bad configuration fails before a device exists.
func configure(dev block.Device, opts Options) (startConfig, error) {
	c := startConfig{queues: opts.Queues, depth: opts.Depth, drain: opts.DrainTimeout, log: opts.Logger}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.queues <= 0 {
		c.queues = DefaultQueues()
	}
	if c.depth <= 0 {
		c.depth = DefaultDepth
	}
	if c.drain <= 0 {
		c.drain = 30 * time.Second
	}
	if opts.ID != nil && *opts.ID > MaxID {
		return c, fmt.Errorf("ublk: device id %d is above the driver's %d: %w", *opts.ID, MaxID, ErrBadOptions)
	}
	c.id = ^uint32(0) // the driver picks
	if opts.ID != nil {
		c.id = *opts.ID
	}
	if c.queues > maxQueues || c.depth > maxQueueDepth {
		return c, fmt.Errorf("ublk: %d queues × depth %d exceeds the driver's %d × %d: %w", c.queues, c.depth, maxQueues, maxQueueDepth, ErrBadOptions)
	}
	c.lim = dev.Limits()
	if c.lim.LogicalBlockSize == 0 {
		c.lim.LogicalBlockSize = uint32(dev.BlockSize())
	}
	c.maxIO = maxIOFor(c.lim, opts.MaxIO)
	if c.maxIO == 0 && opts.MaxIO > 0 && maxIOFor(c.lim, 0) > 0 {
		// Rounded down to nothing by the page or the logical block; the LUN alone would do.
		return c, fmt.Errorf("ublk: a request size of %d bytes is below one page and one logical block (%d): %w",
			opts.MaxIO, c.lim.LogicalBlockSize, ErrBadOptions)
	}
	if mc, ok := opts.Pool.(interface{ MaxClass() int }); ok && mc.MaxClass() < c.maxIO {
		c.maxIO = maxIOFor(c.lim, mc.MaxClass()) // every tag's buffer must be one pool buffer
	}
	if _, err := buildParams(dev.Size(), c.lim, c.maxIO); err != nil {
		return c, err
	}
	return c, nil
}

// openControl opens the control device and checks that the driver takes ioctl-encoded commands,
// the only kind this package sends. It returns the driver's feature bits.
func openControl(path string) (*Control, uint64, error) {
	ctrl, err := OpenControl(path)
	if err != nil {
		return nil, 0, err
	}
	feat, err := ctrl.Features()
	if err != nil {
		ctrl.Close()
		return nil, 0, fmt.Errorf("ublk: %w (kernel older than 6.5?)", err)
	}
	if feat&FeatCmdIoctlEncode == 0 {
		ctrl.Close()
		return nil, 0, fmt.Errorf("%w: the driver lacks ioctl-encoded commands (features %#x)", ErrNoKernel, feat)
	}
	return ctrl, feat, nil
}

// addDev creates the device (ADD_DEV); on success s.info holds what the driver granted and the
// loggers name the device.
func (s *Server) addDev(cfg startConfig) error {
	// Without USER_RECOVERY (RecoveryNone), if this process dies the driver fails outstanding
	// and new I/O and removes the disk rather than queueing I/O for a server that may never come
	// back; with it the device waits for RunRecover (recovery.go).
	s.info = DevInfo{
		NrHWQueues:    uint16(cfg.queues),
		QueueDepth:    uint16(cfg.depth),
		MaxIOBufBytes: uint32(cfg.maxIO),
		DevID:         cfg.id,
		Flags:         FeatCmdIoctlEncode | cfg.flags,
	}
	if err := s.ctrl.AddDev(&s.info); err != nil {
		if errors.Is(err, unix.EEXIST) && cfg.id != ^uint32(0) {
			return fmt.Errorf("%w: /dev/ublkb%d exists already (%v)", ErrIDTaken, cfg.id, err)
		}
		return err
	}
	s.nameDevice()
	return nil
}

// nameDevice makes the loggers name the device.
func (s *Server) nameDevice() {
	s.log = s.log.With(zap.Uint32("ublk", s.info.DevID))
	s.reqLog = s.log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 10, 100)
	}))
}

// setParams settles the request size (ADD_DEV may have granted less than asked) and sends the
// block parameters (SET_PARAMS).
func (s *Server) setParams(maxIO int) error {
	s.maxIO = min(maxIO, int(s.info.MaxIOBufBytes))
	params, err := buildParams(s.dev.Size(), s.lim, s.maxIO)
	if err != nil {
		return err
	}
	return s.ctrl.SetParams(s.info.DevID, &params)
}

// startQueues opens /dev/ublkcN and starts every queue, each with its tags' buffers; it returns
// once every queue has a FETCH_REQ parked for every tag (or one of them failed), and from then
// on reports a queue that ends on its own through Failed.
func (s *Server) startQueues(ctx context.Context) error {
	var err error
	if s.charFd, err = openRetry(fmt.Sprintf("/dev/ublkc%d", s.info.DevID)); err != nil {
		return err
	}
	n, d := int(s.info.NrHWQueues), int(s.info.QueueDepth)
	ready := make(chan error, n)
	for qi := 0; qi < n; qi++ {
		bufs, err := s.allocBuffers(ctx, d, s.maxIO)
		if err != nil {
			return err
		}
		q, err := newQueue(s, uint16(qi), d, bufs)
		if err != nil {
			return err
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
		return err
	}
	for _, q := range s.queues {
		go s.watch(q)
	}
	return nil
}

// startDisk adds the disk (START_DEV) and checks that the device is live. started reports
// whether START_DEV succeeded, which decides how a failure is torn down.
func (s *Server) startDisk() (started bool, err error) {
	if err := s.ctrl.StartDev(s.info.DevID, os.Getpid()); err != nil {
		return false, err
	}
	info, err := s.ctrl.DevInfo(s.info.DevID)
	if err != nil {
		return true, err
	}
	if info.State != devStateLive {
		return true, fmt.Errorf("ublk: device %d is %s after START_DEV", s.info.DevID, info.StateName())
	}
	return true, nil
}

func (s *Server) logStarted() {
	lim := s.lim
	s.log.Info("ublk device started", zap.String("dev", s.BlockPath()),
		zap.Int("queues", int(s.info.NrHWQueues)), zap.Int("depth", int(s.info.QueueDepth)),
		zap.String("max_io", humanize.IBytes(uint64(s.maxIO))),
		zap.String("size", humanize.IBytes(uint64(s.dev.Size()))),
		zap.Bool("volatile_cache", lim.VolatileCache), zap.Bool("fua", lim.CanFUA),
		zap.Bool("discard", lim.CanDiscard), zap.Bool("write_zeroes", lim.CanWriteZeroes),
		zap.Bool("read_only", lim.ReadOnly))
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
// driver aborted the device); Err then says why. Shutdown or Detach must still be called.
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
