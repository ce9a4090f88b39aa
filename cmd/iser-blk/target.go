package main

// Shared target handling for every subcommand that talks to a target (discover, info, serve,
// attach): initiator name, CHAP credentials, session count, logging, flag parsing with
// interspersed positional arguments, and the mapping from errors to exit codes.
//
// CHAP secrets never come from argv (visible in ps and shell history) nor from the URL: they are
// read from a file (--chap-secret-file, --target-secret-file) or the environment
// (ISERBLK_CHAP_SECRET, ISERBLK_CHAP_SECRET_MUTUAL), and never logged.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
)

// Environment variables holding CHAP secrets.
const (
	envCHAPSecret       = "ISERBLK_CHAP_SECRET"
	envCHAPSecretMutual = "ISERBLK_CHAP_SECRET_MUTUAL"
)

// targetFlags are the flags every target-facing subcommand shares.
type targetFlags struct {
	initiatorName    string
	chapUser         string
	chapSecretFile   string
	targetUser       string
	targetSecretFile string
	sessions         int
	loginTimeout     time.Duration
	debug            bool
	recovery         iser.Recovery
	discoverPortals  bool
}

// register adds the shared flags to fs. withSessions adds --sessions (not for discover).
func (tf *targetFlags) register(fs *flag.FlagSet, withSessions bool) {
	fs.StringVar(&tf.initiatorName, "initiator-name", defaultInitiatorName(), "our iSCSI initiator name (IQN)")
	fs.StringVar(&tf.chapUser, "chap-user", "", "CHAP user name (also settable as user@ in the URL)")
	fs.StringVar(&tf.chapSecretFile, "chap-secret-file", "", "file holding the CHAP secret (default: $"+envCHAPSecret+")")
	fs.StringVar(&tf.targetUser, "target-user", "", "mutual CHAP: the user name the target must present (optional)")
	fs.StringVar(&tf.targetSecretFile, "target-secret-file", "", "mutual CHAP: file holding the target's secret (default: $"+envCHAPSecretMutual+")")
	fs.DurationVar(&tf.loginTimeout, "login-timeout", 15*time.Second, "bound on connecting and logging in")
	fs.BoolVar(&tf.debug, "debug", false, "debug logging")
	if withSessions {
		fs.IntVar(&tf.sessions, "sessions", 1, "number of iSCSI sessions to the target (1-32)")
		// Reliability (open-iscsi's defaults): keepalive, stuck commands, how long I/O waits
		// for a lost session.
		def := iser.DefaultRecovery()
		tf.recovery = def
		fs.DurationVar(&tf.recovery.NOPInterval, "noop-interval", def.NOPInterval, "NOP-Out ping on a connection idle this long (0: no keepalive)")
		fs.DurationVar(&tf.recovery.NOPTimeout, "noop-timeout", def.NOPTimeout, "a ping unanswered this long drops the connection")
		fs.DurationVar(&tf.recovery.CommandTimeout, "command-timeout", def.CommandTimeout, "commands outstanding with none completing this long drop the connection; they are re-issued (0: never)")
		fs.BoolVar(&tf.discoverPortals, "portals-from-discovery", false, "ask the target's portal for its other portals (SendTargets) and use them all (multipath)")
		fs.DurationVar(&tf.recovery.ReplacementTimeout, "replacement-timeout", def.ReplacementTimeout, "how long I/O waits for a lost session before failing with EIO (0: at once; negative: forever); reconnecting goes on")
	}
}

// defaultInitiatorName is stable per host, so target ACLs keep matching across runs.
func defaultInitiatorName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	var b strings.Builder
	for _, c := range strings.ToLower(h) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	return "iqn.2025-01.io.iser-blk:" + b.String()
}

// commandLogger is the logger of a one-shot command (info, discover): warnings and errors only,
// unless --debug, so that the command's output is not buried in session chatter.
func commandLogger(debug bool) *zap.Logger {
	log := newLogger(debug)
	if debug {
		return log
	}
	return log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
}

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// readSecret reads a secret from path, or from the environment variable env when path is "".
// A trailing newline (editors add one) is dropped. ok is false when neither is set.
func readSecret(path, env string) (secret string, ok bool, err error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false, usagef("reading secret file: %v", err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
		if secret == "" {
			return "", false, usagef("secret file %s is empty", path)
		}
		return secret, true, nil
	}
	if v, set := os.LookupEnv(env); set && v != "" {
		return v, true, nil
	}
	return "", false, nil
}

// chap builds the CHAP credentials: nil when no user is named (by flag or URL).
func (tf *targetFlags) chap(urlUser string) (*iser.CHAP, error) {
	user := tf.chapUser
	if urlUser != "" {
		if user != "" && user != urlUser {
			return nil, usagef("--chap-user %q and the URL's user %q disagree", user, urlUser)
		}
		user = urlUser
	}
	if user == "" {
		if tf.chapSecretFile != "" || tf.targetSecretFile != "" || tf.targetUser != "" {
			return nil, usagef("CHAP secrets given but no CHAP user (--chap-user or user@ in the URL)")
		}
		return nil, nil
	}
	secret, ok, err := readSecret(tf.chapSecretFile, envCHAPSecret)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, usagef("CHAP user %q needs a secret: --chap-secret-file or $%s", user, envCHAPSecret)
	}
	c := &iser.CHAP{User: user, Secret: secret}
	mutual, ok, err := readSecret(tf.targetSecretFile, envCHAPSecretMutual)
	if err != nil {
		return nil, err
	}
	if ok {
		c.TargetUser, c.TargetSecret = tf.targetUser, mutual
	} else if tf.targetUser != "" {
		return nil, usagef("--target-user needs the target's secret: --target-secret-file or $%s", envCHAPSecretMutual)
	}
	return c, nil
}

// options builds iser.Options for url's user.
func (tf *targetFlags) options(urlUser string, log *zap.Logger) (iser.Options, error) {
	chap, err := tf.chap(urlUser)
	if err != nil {
		return iser.Options{}, err
	}
	if tf.initiatorName == "" {
		return iser.Options{}, usagef("--initiator-name must not be empty")
	}
	if tf.sessions < 0 || tf.sessions > 32 {
		return iser.Options{}, usagef("--sessions must be 1..32")
	}
	if tf.recovery.NOPInterval < 0 || tf.recovery.NOPTimeout < 0 || tf.recovery.CommandTimeout < 0 {
		return iser.Options{}, usagef("--noop-interval, --noop-timeout and --command-timeout must not be negative")
	}
	if tf.recovery.NOPInterval > 0 && tf.recovery.NOPTimeout == 0 {
		return iser.Options{}, usagef("--noop-timeout must be positive when --noop-interval is")
	}
	opts := iser.Options{
		InitiatorName: tf.initiatorName,
		CHAP:          chap,
		Sessions:      tf.sessions,
		LoginTimeout:  tf.loginTimeout,
		Logger:        log,

		PortalsFromDiscovery: tf.discoverPortals,
	}
	if tf.recovery != (iser.Recovery{}) {
		rec := tf.recovery
		opts.Recovery = &rec
	}
	return opts, nil
}

// newFlagSet returns a flag set whose --help prints the synopsis, description and flags.
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := os.Stderr
		fmt.Fprintf(w, "usage: iser-blk %s %s\n\n%s\n\nflags:\n", name, synopsis, description)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseArgs parses flags that may appear before, between or after positional arguments and
// returns the positional ones. It returns flag.ErrHelp for -h/--help.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseOrExit handles parseArgs' outcome for a subcommand: help exits 0, a usage error prints
// the message and the usage and exits 2. done is false when the command should go on.
func parseOrExit(fs *flag.FlagSet, args []string, nPos int) (pos []string, code int, done bool) {
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return nil, exitOK, true
	}
	if err == nil && len(pos) != nPos {
		err = usagef("expected %d argument(s), got %d", nPos, len(pos))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "iser-blk %s: %v\n\n", fs.Name(), err)
		fs.Usage()
		return nil, exitUsage, true
	}
	return pos, 0, false
}

// exitCode maps an error to the documented exit codes (exitcodes.go).
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.Is(err, iser.ErrBadURL), errors.Is(err, iser.ErrLoginConfig):
		return exitUsage
	case errors.Is(err, iser.ErrAuthFailed), errors.Is(err, iser.ErrAuthorization):
		return exitAuth
	case errors.Is(err, iser.ErrTargetNotFound), errors.Is(err, iser.ErrTargetRemoved), errors.Is(err, iser.ErrLUNNotFound):
		return exitNotFound
	case errors.Is(err, iser.ErrTransportUnavailable), errors.Is(err, iser.ErrNoRDMA), errors.Is(err, syscall.ENODEV):
		// A build without rdma-core, or no RDMA device: checked before "unreachable", which
		// the login layer also reports for these dial failures.
		return exitNoKernel
	case errors.Is(err, iser.ErrPortalUnreachable):
		return exitUnreachable
	}
	return exitFailure
}

// fail prints err for the user and returns its exit code.
func fail(name string, err error) int {
	fmt.Fprintf(os.Stderr, "iser-blk %s: %v\n", name, err)
	return exitCode(err)
}
