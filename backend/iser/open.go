package iser

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

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
	if err := checkBuiltIn(t.Transport, RedactURL(url)); err != nil {
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
	chap, n, err := loginSettings(t, opts)
	if err != nil {
		return nil, err
	}
	portals, err := portalsOf(ctx, t, dialer, opts, chap, sessionLog)
	if err != nil {
		return nil, err
	}
	cfgs, names := sessionConfigs(t, portals, n, dialer, opts, chap, sessionLog)
	opts.pathNames = names
	sessions, errs := loginAll(ctx, cfgs)
	closeAll := func() error { return closeSessions(sessions) }
	if err := loginOutcome(errs, sessions, len(portals) > 1, names, log); err != nil {
		closeAll()
		if noRDMA(err) {
			return nil, fmt.Errorf("%w: %w", ErrTransportUnavailable, err)
		}
		return nil, err
	}
	log.Debug("logged in", zap.Int("sessions", len(sessions)), zap.Int("portals", len(portals)))

	execs := make([]scsi.Executor, len(sessions))
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

// loginSettings checks what every session logs in with: the initiator name, the CHAP
// credentials (the URL's user overrides Options.CHAP's) and the number of sessions per portal.
func loginSettings(t Target, opts Options) (chap *login.CHAP, sessions int, err error) {
	if opts.InitiatorName == "" {
		return nil, 0, fmt.Errorf("iser: no initiator name: %w", login.ErrConfig)
	}
	chap = opts.CHAP
	if t.User != "" {
		c := login.CHAP{User: t.User}
		if chap != nil {
			c = *chap
			c.User = t.User
		}
		chap = &c
	}
	if chap != nil && (chap.User == "" || chap.Secret == "") {
		return nil, 0, fmt.Errorf("iser: CHAP needs both a user name and a secret: %w", login.ErrConfig)
	}
	n := opts.Sessions
	if n <= 0 {
		n = 1
	}
	if n > maxSessions {
		return nil, 0, fmt.Errorf("iser: %d sessions requested, at most %d: %w", n, maxSessions, login.ErrConfig)
	}
	return chap, n, nil
}

// portalsOf is every portal of t's IQN and LUN: the URL's, the alternates and, with
// PortalsFromDiscovery, those SendTargets lists. A portal given twice is an error, unless it was
// (also) discovered.
func portalsOf(ctx context.Context, t Target, dialer transport.Dialer, opts Options, chap *login.CHAP, sessionLog *zap.Logger) ([]Target, error) {
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
	return portals, nil
}

// sessionConfigs is the configuration of n sessions to every portal, and each one's portal name.
func sessionConfigs(t Target, portals []Target, n int, dialer transport.Dialer, opts Options, chap *login.CHAP, sessionLog *zap.Logger) ([]session.Config, []string) {
	total := n * len(portals)
	cfgs := make([]session.Config, total)
	names := make([]string, total)
	lend := lendPolicy(total, opts)
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
			LendPages:     lend,
		}
		if opts.proposal != nil {
			cfgs[i].Proposal = *opts.proposal
		}
		names[i] = pt.Portal()
	}
	return cfgs, names
}

// loginAll creates and logs in a session per configuration, concurrently. sessions[i] is nil
// only when creating it failed; errs[i] is its creation or login error.
func loginAll(ctx context.Context, cfgs []session.Config) (sessions []*session.Session, errs []error) {
	sessions = make([]*session.Session, len(cfgs))
	errs = make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i := range cfgs {
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
	return sessions, errs
}

// closeSessions closes every session that was created.
func closeSessions(sessions []*session.Session) error {
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

// loginOutcome is the error that fails Open, or nil. With several portals, one that is
// unreachable at start is only a path that is down: its maintainer keeps trying to log in. Any
// other failure (authentication, no such target, negotiation) is a configuration problem and
// fails Open (the first one wins), as does having no path at all.
func loginOutcome(errs []error, sessions []*session.Session, multiPortal bool, names []string, log *zap.Logger) error {
	loggedIn := 0
	var firstErr error
	for i, err := range errs {
		if err == nil {
			loggedIn++
			continue
		}
		if multiPortal && errors.Is(err, login.ErrPortalUnreachable) && sessions[i] != nil {
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
	return firstErr
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
// rdma-core, or no RDMA device.
func noRDMA(err error) bool {
	return errors.Is(err, rdma.ErrNoRDMA) || errors.Is(err, rdma.ErrNoDevice)
}

// lendPolicy says whether sessions may send write data by reference (session.Config.LendPages):
// only when the device has one session, so that a command failed by a lost connection is
// re-issued on that same session, which the target reinstates first (see the session's
// lend.go), and not with --copy-writes.
func lendPolicy(sessions int, opts Options) bool {
	return sessions == 1 && !opts.CopyWrites
}
