// Package session is an iSCSI initiator session (RFC 7143) over one connection: login with
// redirection, the full-feature phase with many commands in flight, and logout. It implements
// scsi.Executor, so the SCSI layer above it never sees iSCSI.
//
// Design and invariants:
//   - One reader goroutine per connection decodes every PDU the target sends and routes it by
//     Initiator Task Tag to a slot of a fixed-size task table (no allocation per command).
//   - Each Execute call runs its own task: it waits for a free slot, for the CmdSN window
//     (RFC 7143 §4.2.2.1, serial arithmetic per RFC 1982), sends the command and its immediate /
//     unsolicited data, then sends the Data-Out sequences the target solicits with R2T (§11.8)
//     from its own goroutine, so the reader never blocks on a write.
//   - Submit starts a command without a goroutine of its own when nothing would make it wait
//     (free slot, open window, no Data-Out to send): its PDU joins the send queue and the reader
//     hands the response to the caller's Completer (submit.go). A frontend serving many requests
//     from one goroutine so needs no goroutine per command; Kick writes what it queued in one batch.
//   - SubmitToPipe is Submit for a read whose data the reader splices from the socket into the
//     caller's pipe (transport.PipeReader), for callers that splice it on into another socket.
//   - Sends are serialised by one mutex; commands are sent in CmdSN order.
//   - A task's slot (its ITT) is reused only when the target is done with it: after its final
//     response, or when the connection is gone. A caller whose context ends gets ctx.Err()
//     promptly; its task is marked abandoned, the reader stops writing into the caller's buffers
//     (it discards later data) and reaps the slot when the response arrives.
//   - Any protocol violation, digest error or transport error is a connection error at
//     ErrorRecoveryLevel 0 (§7.1.4.1): the connection is closed and every outstanding task fails
//     with a *ConnError that matches block.ErrIO. The Session can then Login again with the same
//     ISID and TSIH 0, which reinstates the session on the target (§6.3.5).
package session

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// Config configures a Session.
type Config struct {
	// Portal is "host:port" (port defaults to the transport's, 3260).
	Portal string
	// Transport dials connections; nil means iSCSI/TCP.
	Transport   transport.Dialer
	DialOptions transport.DialOptions

	InitiatorName  string // required
	InitiatorAlias string
	TargetName     string // required unless Discovery
	Discovery      bool   // a SendTargets discovery session (§4.3)
	CHAP           *login.CHAP
	// Proposal is the operational negotiation offer; zero value means login.DefaultProposal().
	Proposal login.Proposal
	// ISID is the 48-bit initiator session ID; 0 picks a random one of type "random" (§11.12.5).
	ISID uint64

	// MaxTasks is the size of the task table: the most SCSI commands in flight (default 128).
	// A few more slots are kept for control tasks (pings, logout, ABORT TASK).
	MaxTasks int
	// MaxRedirects bounds login redirections (default 4).
	MaxRedirects int
	// LoginTimeout bounds one login attempt including the dial (default 15 s).
	LoginTimeout time.Duration
	Logger       *zap.Logger

	// LendPages lets the transport send a large write's data by reference instead of copying it
	// (lend.go). Only for a session no other session of the same initiator shares a LUN with:
	// see lend.go for why.
	LendPages bool
}

// ErrNotLoggedIn is returned (inside a *ConnError) when a session has no live connection.
var ErrNotLoggedIn = errors.New("iSCSI session is not logged in")

// ErrSessionClosed is returned by a Session after Close.
var ErrSessionClosed = errors.New("iSCSI session is closed")

// ConnError is a task failure caused by the connection (lost, closed, or broken by a protocol
// violation). It matches block.ErrIO; the task may be retried on a new login.
type ConnError struct {
	Target, Portal string
	Err            error
}

func (e *ConnError) Error() string {
	return fmt.Sprintf("iSCSI connection to %s at %s: %v", e.Target, e.Portal, e.Err)
}

// Unwrap returns the cause.
func (e *ConnError) Unwrap() error { return e.Err }

// Is makes a ConnError match block.ErrIO.
func (e *ConnError) Is(target error) bool { return target == block.ErrIO }

// ProtocolError is a violation of RFC 7143 by the target; it is a connection error.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "iSCSI protocol violation by the target: " + e.Msg }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// TaskError is a task-level failure the target reported without closing the connection: a
// Reject of the task's PDU (§11.17) or a non-zero iSCSI Response (§11.4.3). It matches block.ErrIO.
type TaskError struct {
	Reason string
	Err    error // an underlying cause, e.g. ErrTaskAborted (may be nil)
}

func (e *TaskError) Error() string { return "iSCSI task failed: " + e.Reason }

// Unwrap returns the cause, if any.
func (e *TaskError) Unwrap() error { return e.Err }

// Is makes a TaskError match block.ErrIO.
func (e *TaskError) Is(target error) bool { return target == block.ErrIO }

// Session is an iSCSI session. It is safe for concurrent use.
type Session struct {
	cfg  Config
	log  *zap.Logger
	isid uint64

	mu     sync.Mutex // guards portal, closed, login sequencing
	portal string
	closed bool
	cur    atomic.Pointer[conn]
}

// New validates cfg and returns a Session that is not yet logged in.
func New(cfg Config) (*Session, error) {
	if cfg.InitiatorName == "" {
		return nil, fmt.Errorf("session: %w: no initiator name", login.ErrConfig)
	}
	if !cfg.Discovery && cfg.TargetName == "" {
		return nil, fmt.Errorf("session: %w: no target name", login.ErrConfig)
	}
	if cfg.Transport == nil {
		cfg.Transport = transport.TCP{}
	}
	if cfg.MaxTasks <= 0 {
		cfg.MaxTasks = 128
	}
	if cfg.MaxTasks > maxTasks-controlSlots {
		return nil, fmt.Errorf("session: %w: MaxTasks %d above %d", login.ErrConfig, cfg.MaxTasks, maxTasks-controlSlots)
	}
	if cfg.MaxRedirects <= 0 {
		cfg.MaxRedirects = 4
	}
	if cfg.LoginTimeout <= 0 {
		cfg.LoginTimeout = 15 * time.Second
	}
	if cfg.Proposal.MaxRecvDataSegmentLength == 0 {
		cfg.Proposal = login.DefaultProposal()
	}
	if cfg.Proposal.MaxOutstandingR2T > maxOutstandingR2T {
		// Each task queues at most MaxOutstandingR2T R2Ts for its goroutine; bound the queue.
		return nil, fmt.Errorf("session: %w: MaxOutstandingR2T %d above %d", login.ErrConfig,
			cfg.Proposal.MaxOutstandingR2T, maxOutstandingR2T)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	isid := cfg.ISID
	if isid == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("session: random ISID: %w", err)
		}
		// §11.12.5: T=0b10 (random): the top two bits of the 48-bit ISID are 10.
		isid = binary.BigEndian.Uint64(b[:])&0x3fffffffffff | 0x800000000000
	}
	s := &Session{cfg: cfg, isid: isid, portal: transport.JoinHostPort(cfg.Portal, cfg.Transport.DefaultPort())}
	target := cfg.TargetName
	if cfg.Discovery {
		target = "discovery"
	}
	s.log = log.With(zap.String("target", target), zap.String("isid", fmt.Sprintf("%012x", isid)))
	return s, nil
}

// Dial creates a Session and logs in.
func Dial(ctx context.Context, cfg Config) (*Session, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Login(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// ISID returns the session's initiator session ID (constant for the Session's life).
func (s *Session) ISID() uint64 { return s.isid }

// Params returns the negotiated parameters of the current connection (zero if not logged in).
func (s *Session) Params() login.Params {
	if c := s.cur.Load(); c != nil {
		return c.params
	}
	return login.Params{}
}

// Connected reports whether the session has a live connection.
func (s *Session) Connected() bool {
	c := s.cur.Load()
	return c != nil && !c.dead()
}

// Done returns a channel closed when the current connection ends (nil if not logged in). A
// recovery loop waits on it and calls Login again.
func (s *Session) Done() <-chan struct{} {
	if c := s.cur.Load(); c != nil {
		return c.done
	}
	return nil
}

// Err returns why the current connection ended (nil while it is alive).
func (s *Session) Err() error {
	if c := s.cur.Load(); c != nil && c.dead() {
		return c.err
	}
	return nil
}

// Drop ends the current connection at once with cause (no Logout: the connection is presumed
// unusable, e.g. a keepalive NOP-Out went unanswered or a command timed out). Every outstanding
// task fails with a *ConnError wrapping cause, and Login may then reinstate the session. It does
// nothing when there is no connection.
func (s *Session) Drop(cause error) {
	if c := s.cur.Load(); c != nil {
		c.shutdown(cause)
	}
}

// Login logs in (again). With a live connection it does nothing. After a connection loss it
// logs in with the same ISID and TSIH 0, which makes the target reinstate the session (§6.3.5).
// Redirections (status class 1) are followed up to Config.MaxRedirects times.
func (s *Session) Login(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	if c := s.cur.Load(); c != nil && !c.dead() {
		return nil
	}
	portal, old := s.portal, s.cur.Load()
	for redirects := 0; ; redirects++ {
		c, err := s.loginOnce(ctx, portal)
		var re *login.RedirectError
		if errors.As(err, &re) {
			if redirects >= s.cfg.MaxRedirects {
				return &login.Error{Target: s.cfg.TargetName, Portal: portal, Kind: login.ErrTooManyRedirects,
					Reason: fmt.Sprintf("last redirected to %s", re.Address)}
			}
			s.log.Info("iSCSI login redirected", zap.String("from", portal), zap.String("to", re.Address),
				zap.Bool("permanent", re.Permanent))
			if re.Permanent {
				s.portal = re.Address
			}
			portal = re.Address
			continue
		}
		if err != nil {
			return err
		}
		// Lending needs this login to reinstate the last one (lend.go): not across a redirect,
		// which may lead to another portal group, where the same ISID makes a new session.
		c.lends = c.lends && redirects == 0 && (old == nil || old.params.TargetPortalGroupTag == c.params.TargetPortalGroupTag)
		s.cur.Store(c)
		c.start()
		s.log.Info("iSCSI login succeeded", zap.String("portal", portal), zap.Uint16("tsih", c.params.TSIH),
			zap.Stringer("params", &c.params))
		return nil
	}
}

func (s *Session) loginOnce(ctx context.Context, portal string) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LoginTimeout)
	defer cancel()
	tc, err := s.cfg.Transport.Dial(ctx, portal, s.cfg.DialOptions)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("iSCSI login to %s at %s: %w", s.cfg.TargetName, portal, ctx.Err())
		}
		return nil, &login.Error{Target: s.cfg.TargetName, Portal: portal, Kind: login.ErrPortalUnreachable, Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = tc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { tc.Close() })
	lc := &login.Config{
		InitiatorName: s.cfg.InitiatorName, InitiatorAlias: s.cfg.InitiatorAlias,
		TargetName: s.cfg.TargetName, Discovery: s.cfg.Discovery,
		ISID: s.isid, TSIH: 0, CID: 0, ITT: 0, CmdSN: 1,
		CHAP: s.cfg.CHAP, Proposal: s.cfg.Proposal, Hook: tc.LoginHook(), Logger: s.log,
	}
	params, err := login.Login(ctx, tc, lc)
	if !stop() && err == nil {
		err = ctx.Err() // the context ended just after login and closed the connection
	}
	if err != nil {
		tc.Close()
		return nil, s.loginFailure(ctx, portal, err)
	}
	_ = tc.SetDeadline(time.Time{})
	if err := tc.Start(params); err != nil {
		tc.Close()
		return nil, &login.Error{Target: s.cfg.TargetName, Portal: portal, Kind: login.ErrNegotiation, Err: err}
	}
	return newConn(s, tc, portal, params), nil
}

// loginFailure tells a target's decision (status class, redirection, failed authentication or
// negotiation) from a login cut short by the login timeout or the caller's context, whose
// symptoms (closed connection, i/o timeout) would otherwise read as protocol violations.
func (s *Session) loginFailure(ctx context.Context, portal string, err error) error {
	var re *login.RedirectError
	if errors.As(err, &re) {
		return err
	}
	var le *login.Error
	if errors.As(err, &le) && le.Kind != login.ErrProtocol {
		return err
	}
	cause := ctx.Err()
	var ne net.Error
	if cause == nil && errors.As(err, &ne) && ne.Timeout() {
		cause = context.DeadlineExceeded
	}
	if errors.Is(cause, context.Canceled) {
		return fmt.Errorf("iSCSI login to %s at %s cancelled: %w", s.cfg.TargetName, portal, cause)
	}
	if cause != nil {
		return fmt.Errorf("iSCSI login to %s at %s: no complete answer in time (login timeout %v): %w",
			s.cfg.TargetName, portal, s.cfg.LoginTimeout, cause)
	}
	return err
}

// Execute implements scsi.Executor: it runs one SCSI command and fills resp.
func (s *Session) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	c := s.cur.Load()
	if c == nil {
		return &ConnError{Target: s.cfg.TargetName, Portal: s.portal, Err: ErrNotLoggedIn}
	}
	if s.cfg.Discovery {
		return fmt.Errorf("session: %w: SCSI commands on a discovery session", block.ErrInvalid)
	}
	return c.execute(ctx, cmd, resp)
}

// Ping sends a NOP-Out ping (§11.18) carrying payload (at most the target's
// MaxRecvDataSegmentLength) and waits for the target's NOP-In echo. Used for keepalive.
func (s *Session) Ping(ctx context.Context, payload []byte) error {
	c := s.cur.Load()
	if c == nil {
		return &ConnError{Target: s.cfg.TargetName, Portal: s.portal, Err: ErrNotLoggedIn}
	}
	return c.ping(ctx, payload)
}

// Text runs a Text negotiation (§11.10) in the full-feature phase and returns the target's keys,
// following C-bit continuations (§6.2). Keys may repeat in the answer (SendTargets).
func (s *Session) Text(ctx context.Context, kvs []login.KeyValue) ([]login.KeyValue, error) {
	c := s.cur.Load()
	if c == nil {
		return nil, &ConnError{Target: s.cfg.TargetName, Portal: s.portal, Err: ErrNotLoggedIn}
	}
	return c.text(ctx, kvs)
}

// Logout closes the session gracefully (§11.14, reason "close the session") and the connection.
// Callers drain their own in-flight commands first; any still outstanding fail with a ConnError.
func (s *Session) Logout(ctx context.Context) error {
	c := s.cur.Load()
	if c == nil || c.dead() {
		return nil
	}
	err := c.logout(ctx)
	c.shutdown(fmt.Errorf("logged out: %w", ErrSessionClosed))
	return err
}

// Close logs out (bounded by 5 s) and releases the session. Further calls fail.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.Logout(ctx)
	if c := s.cur.Load(); c != nil {
		c.shutdown(ErrSessionClosed)
		<-c.readerDone
	}
	return err
}
