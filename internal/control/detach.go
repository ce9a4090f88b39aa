package control

import (
	"context"
	"errors"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// detach runs the handler's Detach and streams the lifecycle to the client meanwhile: every
// state change, and write-back progress (coalesced: a slow client sees the latest, never
// blocks the flush). The final reply is written after the detach lock is released, so a
// client that reads a refusal can retry at once.
func (s *Server) detach(w *replyWriter, req Request) bool {
	s.mu.Lock()
	if s.closed { // Close may be waiting on answering already: no Add after that
		s.mu.Unlock()
		return w.error(&Error{Code: CodeBusy, Message: "the gateway is stopping"})
	}
	s.answering.Add(1)
	s.mu.Unlock()
	defer s.answering.Done()
	res, err := s.runDetach(w, req)
	if err != nil {
		s.opts.Log.Warn("control: detach did not complete", zap.Error(err))
		if errors.Is(err, context.DeadlineExceeded) {
			return w.error(&Error{Code: CodeTimeout, Message: err.Error()})
		}
		return w.error(err)
	}
	ok := w.write(Reply{Type: ReplyDone, Result: &res})
	s.detachOK.Do(func() { close(s.detached) })
	return ok
}

// runDetach calls the handler, one detach at a time, with progress streamed to w.
func (s *Server) runDetach(w *replyWriter, req Request) (DetachResult, error) {
	var res DetachResult
	_, err := s.exclusive(w, req, func(ctx context.Context) (err error) {
		res, err = s.handler.Detach(ctx, req)
		return err
	})
	return res, err
}

// exclusive runs op under req's timeout with the lifecycle streamed to w as progress lines; one
// detach, restart or stop runs at a time (a second one is answered "busy"). written is the most
// write-back the lifecycle reported meanwhile, whether or not a slow client saw that line.
func (s *Server) exclusive(w *replyWriter, req Request, op func(ctx context.Context) error) (written uint64, err error) {
	if !s.detachMu.TryLock() {
		return 0, &Error{Code: CodeBusy, Message: "a detach, restart or stop is already running; try again once it has ended"}
	}
	defer s.detachMu.Unlock()
	ctx := context.Background()
	if t := req.Timeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	stream := newProgressStream(w)
	go stream.run()
	unsubscribe := func() {}
	if s.opts.Lifecycle != nil {
		unsubscribe = s.opts.Lifecycle.Subscribe(stream)
	}
	err = op(ctx)
	unsubscribe()
	stream.stop()
	return stream.written, err
}

// progressStream is a lifecycle.Observer that hands lines to a writer goroutine through a
// bounded queue; when the queue is full a flush-progress line is dropped (the next one
// supersedes it) while state changes wait for room (the writer's deadline bounds the wait).
type progressStream struct {
	w     *replyWriter
	queue chan Progress
	done  chan struct{}

	mu      sync.Mutex // guards state, closed, written and sending on queue
	state   string
	closed  bool
	written uint64 // the most written-back bytes reported, dropped lines included
}

func newProgressStream(w *replyWriter) *progressStream {
	return &progressStream{w: w, queue: make(chan Progress, progressQueue), done: make(chan struct{})}
}

func (p *progressStream) StateChanged(t lifecycle.Transition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.state = string(t.To)
	p.queue <- Progress{State: string(t.To), Reason: t.Reason}
}

func (p *progressStream) FlushProgressed(fp lifecycle.FlushProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.written = max(p.written, fp.WrittenBackBytes)
	state := p.state
	if state == "" {
		state = string(lifecycle.Flushing)
	}
	select {
	case p.queue <- Progress{State: state, DirtyBytes: fp.DirtyBytes, WrittenBackBytes: fp.WrittenBackBytes}:
	default:
	}
}

func (p *progressStream) run() {
	defer close(p.done)
	for pr := range p.queue {
		p.w.write(Reply{Type: ReplyProgress, Progress: &pr})
	}
}

// stop ends the stream once every queued line is written. An observer call racing with it
// either queued its line before (and it is written) or sees closed and drops it.
func (p *progressStream) stop() {
	p.mu.Lock()
	p.closed = true
	close(p.queue)
	p.mu.Unlock()
	<-p.done
}
