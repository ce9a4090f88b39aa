package iser

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/discovery"
	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// maxSessions bounds Options.Sessions: more sessions than this only add login time.
const maxSessions = 32

// Open connects to the LUN named by url (iscsi://[user@]host[:port]/IQN/LUN or iser://...),
// logs in opts.Sessions sessions, probes the LUN and returns the Device. Login errors keep their
// sentinels (ErrAuthFailed, ErrTargetNotFound, ErrPortalUnreachable...)
// so a caller can tell them apart; a missing LUN is ErrLUNNotFound.
func Open(ctx context.Context, url string, opts Options) (*Device, error) {
	t, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	// The session logger names target and portal itself; the device's adds the LUN.
	sessionLog := opts.logger()
	// Paths name their portal themselves (there may be several).
	log := sessionLog.With(zap.String("target", t.IQN), zap.Uint16("lun", t.LUN))
	opts.Logger = log
	dialer, err := transport.Lookup(t.Transport)
	if err != nil {
		// Only a scheme ParseURL accepts gets here, and both are always registered (iser:// by a
		// stub without RDMA support, whose dial fails with ErrNoRDMA): defensive.
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
	// Every portal (the URL's and the alternates, same IQN and LUN) gets n sessions.
	portals := []Target{t}
	alternates := opts.AlternateTargets
	if opts.PortalsFromDiscovery {
		found, err := discoverPortals(ctx, t, dialer, opts, chap, sessionLog)
		if err != nil {
			return nil, err
		}
		for _, u := range found {
			if !slices.Contains(alternates, u) {
				alternates = append(alternates, u)
			}
		}
	}
	for _, alt := range alternates {
		at, err := ParseURL(alt)
		if err != nil {
			return nil, err
		}
		if at.IQN != t.IQN || at.LUN != t.LUN || at.Transport != t.Transport {
			return nil, fmt.Errorf("iser: alternate target %s is not %s LUN %d over %s: %w", at, t.IQN, t.LUN, t.Transport, ErrBadURL)
		}
		if slices.ContainsFunc(portals, func(p Target) bool { return p.Portal() == at.Portal() }) {
			if opts.PortalsFromDiscovery {
				continue // discovered and also given: once is enough
			}
			return nil, fmt.Errorf("iser: portal %s given twice: %w", at.Portal(), ErrBadURL)
		}
		portals = append(portals, at)
	}
	total := n * len(portals)
	cfgs := make([]session.Config, total)
	names := make([]string, total)
	for i := range total {
		pt := portals[i/n]
		cfgs[i] = session.Config{
			Portal:        pt.Portal(),
			Transport:     dialer,
			InitiatorName: opts.InitiatorName,
			TargetName:    t.IQN,
			CHAP:          chap,
			LoginTimeout:  opts.LoginTimeout,
			Logger:        sessionLog,
		}
		if opts.proposal != nil {
			cfgs[i].Proposal = *opts.proposal
		}
		names[i] = pt.Portal()
	}
	opts.pathNames = names

	// Log the sessions in concurrently; the first failure wins and the rest are closed.
	sessions := make([]*session.Session, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := session.New(cfgs[i])
			if err == nil {
				sessions[i] = s
				err = s.Login(ctx)
			}
			errs[i] = err
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
	// With several portals, one that is unreachable at start is only a path that is down: its
	// maintainer keeps trying to log in. Any other failure (authentication, no such target,
	// negotiation) is a configuration problem and fails Open, as does having no path at all.
	loggedIn := 0
	var firstErr error
	for i, err := range errs {
		if err == nil {
			loggedIn++
			continue
		}
		if len(portals) > 1 && errors.Is(err, login.ErrPortalUnreachable) && sessions[i] != nil {
			log.Warn("path down at start; will keep logging in", zap.String("portal", names[i]), zap.Error(err))
			continue
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil && loggedIn == 0 {
		firstErr = errs[0]
	}
	if firstErr != nil {
		closeAll()
		if noRDMA(t.Transport, firstErr) {
			return nil, fmt.Errorf("%w: %w", ErrTransportUnavailable, firstErr)
		}
		return nil, firstErr
	}
	log.Debug("logged in", zap.Int("sessions", total), zap.Int("portals", len(portals)))

	execs := make([]scsi.Executor, total)
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

// discoverPortals runs SendTargets on t's portal and returns URLs of t's LUN on every other
// portal listed for t's IQN.
func discoverPortals(ctx context.Context, t Target, dialer transport.Dialer, opts Options, chap *login.CHAP, log *zap.Logger) ([]string, error) {
	targets, err := discovery.SendTargets(ctx, discovery.Config{
		Portal: t.Portal(), Transport: dialer, InitiatorName: opts.InitiatorName, CHAP: chap,
		LoginTimeout: opts.LoginTimeout, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("iser: discovering the portals of %s: %w", t.IQN, err)
	}
	var out []string
	for _, dt := range targets {
		if dt.Name != t.IQN {
			continue
		}
		for _, p := range dt.Portals {
			host, port, err := net.SplitHostPort(p.Address)
			if err != nil {
				log.Warn("discovery: ignoring a malformed portal", zap.String("portal", p.Address), zap.Error(err))
				continue
			}
			alt := t
			alt.Host = host
			if alt.Port, err = strconv.Atoi(port); err != nil || alt.Port <= 0 || alt.Port > 65535 {
				log.Warn("discovery: ignoring a malformed portal", zap.String("portal", p.Address))
				continue
			}
			if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
				continue // "listening on every address" names no portal
			}
			if alt.Portal() != t.Portal() {
				out = append(out, alt.String())
			}
		}
	}
	log.Info("discovered portals", zap.String("target", t.IQN), zap.Strings("others", out))
	return out, nil
}

// noRDMA reports a dial failure that means "this machine cannot do iSER": a build without
// rdma-core, or no RDMA device (rdma_create_event_channel fails with ENODEV).
func noRDMA(scheme string, err error) bool {
	return errors.Is(err, rdma.ErrNoRDMA) || (scheme == "iser" && errors.Is(err, syscall.ENODEV))
}
