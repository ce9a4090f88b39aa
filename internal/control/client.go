package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/status"
)

// ErrUnknownGateway means no running gateway has the name (or serves the device) asked for;
// `iser-blk detach` and `status` exit 4 on it.
var ErrUnknownGateway = errors.New("no running gateway by that name")

// Client talks to one gateway. Each request uses its own connection.
type Client struct {
	Name   string
	socket string
}

// Dial finds the gateway nameOrDevice in runDir: a name, or a device or socket path (anything
// with a '/'), matched against each running gateway's frontend path. It returns
// ErrUnknownGateway (wrapped) if none is running; a stale socket counts as none.
func Dial(ctx context.Context, runDir, nameOrDevice string) (*Client, error) {
	if strings.Contains(nameOrDevice, "/") {
		return dialByPath(ctx, runDir, nameOrDevice)
	}
	if err := ValidateName(nameOrDevice); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownGateway, err)
	}
	// A stale socket is found out by the first request (connection refused: ErrUnknownGateway);
	// List removes it. Dial does not probe the lock, which would race a starting gateway.
	if _, err := os.Stat(SocketPath(runDir, nameOrDevice)); err != nil {
		return nil, fmt.Errorf("%w: %q in %s", ErrUnknownGateway, nameOrDevice, runDir)
	}
	return &Client{Name: nameOrDevice, socket: SocketPath(runDir, nameOrDevice)}, nil
}

func dialByPath(ctx context.Context, runDir, path string) (*Client, error) {
	want := canonicalPath(path)
	entries, err := List(ctx, runDir, listProbeTimeout)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Err == nil && canonicalPath(e.Status.Gateway.FrontendPath) == want {
			return &Client{Name: e.Name, socket: SocketPath(runDir, e.Name)}, nil
		}
	}
	return nil, fmt.Errorf("%w: none serves %s", ErrUnknownGateway, path)
}

func canonicalPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

// Status asks for the gateway's status.
func (c *Client) Status(ctx context.Context) (status.Status, error) {
	var st status.Status
	err := c.roundTrip(ctx, Request{Op: OpStatus}, func(r Reply) error {
		if r.Type != ReplyStatus || r.Status == nil {
			return fmt.Errorf("control: unexpected %q reply to status", r.Type)
		}
		st = *r.Status
		return nil
	}, nil)
	return st, err
}

// DetachOptions are a detach request's parameters.
type DetachOptions struct {
	Force   bool
	Timeout time.Duration // 0: no bound on drain and write-back
}

// Detach asks the gateway to detach and exit, calling progress (if non-nil) for every progress
// line, and returns once the gateway process is gone (or ctx ends). A refusal or failure is an
// *Error: the gateway then keeps running.
func (c *Client) Detach(ctx context.Context, opts DetachOptions, progress func(Progress)) (DetachResult, error) {
	return c.untilExit(ctx, Request{Op: OpDetach, Force: opts.Force, TimeoutMS: opts.Timeout.Milliseconds()}, progress)
}

// untilExit is done and then waits for the gateway's process to be gone (or ctx to end).
func (c *Client) untilExit(ctx context.Context, req Request, progress func(Progress)) (DetachResult, error) {
	res, err := c.done(ctx, req, progress)
	if err != nil {
		return res, err
	}
	if res.PID > 0 && res.PID != os.Getpid() {
		err = waitExit(ctx, res.PID)
	}
	return res, err
}

// done sends req and returns the result of its "done" reply.
func (c *Client) done(ctx context.Context, req Request, progress func(Progress)) (DetachResult, error) {
	var res DetachResult
	err := c.roundTrip(ctx, req, func(r Reply) error {
		if r.Type != ReplyDone || r.Result == nil {
			return fmt.Errorf("control: unexpected %q reply to %s", r.Type, req.Op)
		}
		res = *r.Result
		return nil
	}, progress)
	return res, err
}

// roundTrip sends req and reads replies until a final one, handing it to final.
func (c *Client) roundTrip(ctx context.Context, req Request, final func(Reply) error, progress func(Progress)) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w: %q (%v)", ErrUnknownGateway, c.Name, err)
		}
		return fmt.Errorf("control: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req.Version = ProtocolVersion
	line, err := encodeLine(req)
	if err != nil {
		return err
	}
	if _, err := conn.Write(line); err != nil {
		return c.ctxErr(ctx, fmt.Errorf("control: send: %w", err))
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), maxReplyBytes)
	for sc.Scan() {
		var r Reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("control: malformed reply: %w", err)
		}
		switch {
		case r.Version != ProtocolVersion:
			return fmt.Errorf("control: reply version %d, want %d", r.Version, ProtocolVersion)
		case r.Type == ReplyError && r.Error != nil:
			return r.Error
		case r.Type == ReplyProgress:
			if progress != nil && r.Progress != nil {
				progress(*r.Progress)
			}
		default:
			return final(r)
		}
	}
	if err := sc.Err(); err != nil {
		return c.ctxErr(ctx, fmt.Errorf("control: read reply: %w", err))
	}
	return c.ctxErr(ctx, fmt.Errorf("control: gateway %q closed the connection without a reply", c.Name))
}

func (c *Client) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// waitExit returns when process pid has exited, using a pidfd so there is no polling.
func waitExit(ctx context.Context, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wait for gateway PID %d: %w", pid, err)
	}
	defer unix.Close(fd)
	for {
		timeout := -1
		if dl, ok := ctx.Deadline(); ok {
			timeout = max(int(time.Until(dl).Milliseconds()), 0)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("wait for gateway PID %d: %w", pid, err)
		case n == 0:
			return fmt.Errorf("gateway PID %d still running: %w", pid, context.DeadlineExceeded)
		}
		return nil
	}
}

// ExitCode maps a detach or status error to the CLI's exit code: 0 ok, 4 unknown name,
// 1 anything else (refused, failed, timeout).
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUnknownGateway):
		return 4
	}
	return 1
}
