package iser

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/login"
	"github.com/iser-blk/iser-blk/backend/iser/rdma"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/session"
	"github.com/iser-blk/iser-blk/backend/iser/transport"
)

// ErrTransportUnavailable is returned by Open when the URL's transport is not built in (iser://
// in a binary built without RDMA support).
var ErrTransportUnavailable = errors.New("transport not available")

// maxSessions bounds Options.Sessions: more sessions than this only add login time.
const maxSessions = 32

// Open connects to the LUN named by url (iscsi://[user@]host[:port]/IQN/LUN or iser://...),
// logs in opts.Sessions sessions, probes the LUN and returns the Device. Login errors keep their
// login sentinels (login.ErrAuthFailed, login.ErrTargetNotFound, login.ErrPortalUnreachable...)
// so a caller can tell them apart; a missing LUN is ErrLUNNotFound.
func Open(ctx context.Context, url string, opts Options) (*Device, error) {
	t, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	// The session logger names target and portal itself; the device's adds the LUN.
	sessionLog := opts.logger()
	log := sessionLog.With(zap.String("target", t.IQN), zap.String("portal", t.Portal()), zap.Uint16("lun", t.LUN))
	opts.Logger = log
	dialer, err := transport.Lookup(t.Transport)
	if err != nil {
		if t.Transport == "iser" {
			return nil, fmt.Errorf("iser: built without RDMA support (no iser transport): %w", ErrTransportUnavailable)
		}
		return nil, fmt.Errorf("iser: %w: %w", ErrTransportUnavailable, err)
	}
	if opts.InitiatorName == "" {
		return nil, fmt.Errorf("iser: no initiator name: %w", login.ErrConfig)
	}
	chap := opts.CHAP
	if t.User != "" {
		c := login.CHAP{User: t.User}
		if chap != nil {
			c = *chap
			c.User = t.User
		}
		chap = &c
	}
	if chap != nil && (chap.User == "" || chap.Secret == "") {
		return nil, fmt.Errorf("iser: CHAP needs both a user name and a secret: %w", login.ErrConfig)
	}
	n := opts.Sessions
	if n <= 0 {
		n = 1
	}
	if n > maxSessions {
		return nil, fmt.Errorf("iser: %d sessions requested, at most %d: %w", n, maxSessions, login.ErrConfig)
	}
	cfg := session.Config{
		Portal:        t.Portal(),
		Transport:     dialer,
		InitiatorName: opts.InitiatorName,
		TargetName:    t.IQN,
		CHAP:          chap,
		LoginTimeout:  opts.LoginTimeout,
		Logger:        sessionLog,
	}
	if opts.Proposal != nil {
		cfg.Proposal = *opts.Proposal
	}

	// Log the sessions in concurrently; the first failure wins and the rest are closed.
	sessions := make([]*session.Session, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sessions[i], errs[i] = session.Dial(ctx, cfg)
		}()
	}
	wg.Wait()
	closeAll := func() error {
		var cerrs []error
		for _, s := range sessions {
			if s != nil {
				if err := s.Close(); err != nil {
					cerrs = append(cerrs, err)
				}
			}
		}
		return errors.Join(cerrs...)
	}
	for _, err := range errs {
		if err != nil {
			closeAll()
			if noRDMA(t.Transport, err) {
				return nil, fmt.Errorf("%w: %w", ErrTransportUnavailable, err)
			}
			return nil, err
		}
	}
	log.Debug("logged in", zap.Int("sessions", n))

	execs := make([]scsi.Executor, n)
	for i, s := range sessions {
		execs[i] = s
	}
	d, err := NewDevice(ctx, execs, t.LUN, opts, closeAll)
	if err != nil {
		closeAll()
		return nil, err
	}
	d.info.URL = t.String()
	return d, nil
}

// noRDMA reports a dial failure that means "this machine cannot do iSER": a build without
// rdma-core, or no RDMA device (rdma_create_event_channel fails with ENODEV).
func noRDMA(scheme string, err error) bool {
	return errors.Is(err, rdma.ErrNoRDMA) || (scheme == "iser" && errors.Is(err, syscall.ENODEV))
}
