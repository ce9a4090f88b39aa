package main

// The flags every subcommand that talks to a target shares (discover, info, serve, attach) and
// how they become iser.Options: initiator name, CHAP credentials, session count, recovery.
// Opening the target with them is internal/stack's (stack.go builds its Config); groups and
// help are flagset.go's.
//
// CHAP secrets never come from argv nor from the URL (internal/chapcreds), and are never logged.

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/chapcreds"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/initiatorname"
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
	copyWrites       bool
}

// register adds the login flags to fs (the Target group). serving adds --sessions and
// --portals-from-discovery (serve and attach, not info and discover).
func (tf *targetFlags) register(fs *pflag.FlagSet, serving bool) {
	fs.StringVar(&tf.initiatorName, "initiator-name", "", "our iSCSI initiator name (IQN) (default: open-iscsi's /etc/iscsi/initiatorname.iscsi, else one generated once and kept in "+initiatorname.OwnFile+")")
	fs.StringVar(&tf.chapUser, "chap-user", "", "CHAP user name (also settable as user@ in the URL)")
	fs.StringVar(&tf.chapSecretFile, "chap-secret-file", "", "file holding the CHAP secret (default: $"+chapcreds.EnvSecret+")")
	fs.StringVar(&tf.targetUser, "target-user", "", "mutual CHAP: the user name the target must present (optional)")
	fs.StringVar(&tf.targetSecretFile, "target-secret-file", "", "mutual CHAP: file holding the target's secret (default: $"+chapcreds.EnvSecretMutual+")")
	fs.DurationVar(&tf.loginTimeout, "login-timeout", 15*time.Second, "bound on connecting and logging in")
	if serving {
		fs.IntVar(&tf.sessions, "sessions", 1, "number of iSCSI sessions to the target (1-32)")
		fs.BoolVar(&tf.discoverPortals, "portals-from-discovery", false, "ask the target's portal for its other portals (SendTargets) and use them all (multipath)")
		fs.BoolVar(&tf.copyWrites, "copy-writes", false, "copy every write's data into the iSCSI/TCP socket instead of sending large writes by reference")
	}
}

// registerReliability adds the Reliability group (open-iscsi's defaults): keepalive, stuck
// commands, how long I/O waits for a lost session.
func (tf *targetFlags) registerReliability(fs *pflag.FlagSet) {
	def := iser.DefaultRecovery()
	tf.recovery = def
	fs.DurationVar(&tf.recovery.NOPInterval, "noop-interval", def.NOPInterval, "NOP-Out ping on a connection idle this long (0: no keepalive)")
	fs.DurationVar(&tf.recovery.NOPTimeout, "noop-timeout", def.NOPTimeout, "a ping unanswered this long drops the connection")
	fs.DurationVar(&tf.recovery.CommandTimeout, "command-timeout", def.CommandTimeout, "commands outstanding with none completing this long: ABORT TASK, then LOGICAL UNIT RESET, then drop\n"+
		"the connection, one step per further timeout; ended commands are re-issued (0: never)")
	fs.DurationVar(&tf.recovery.ReplacementTimeout, "replacement-timeout", def.ReplacementTimeout, "how long I/O waits for a lost session before failing with EIO (0: at once; negative: forever); reconnecting goes on")
}

// registerDebug adds --debug (the General group).
func (tf *targetFlags) registerDebug(fs *pflag.FlagSet) {
	fs.BoolVar(&tf.debug, "debug", false, "debug logging")
}

// addTo adds the flags of a command that only logs in (info, discover) to cmd, in their groups.
func (tf *targetFlags) addTo(cmd *cobra.Command) {
	cli.Group(cmd, groupTarget, func(fs *pflag.FlagSet) { tf.register(fs, false) })
	tf.registerDebug(cmd.Flags())
	cli.CompleteFiles(cmd, "chap-secret-file", "target-secret-file")
}

// chap builds the CHAP credentials (internal/chapcreds): nil when no user is named (by flag or
// URL). Every error is a usage error.
func (tf *targetFlags) chap(urlUser string) (*iser.CHAP, error) {
	c, err := chapcreds.Load(chapcreds.Sources{User: tf.chapUser, URLUser: urlUser, SecretFile: tf.chapSecretFile,
		TargetUser: tf.targetUser, TargetSecretFile: tf.targetSecretFile})
	if err != nil {
		return nil, usagef("%v", err)
	}
	return c, nil
}

// initiatorNameOr is given, or when that is "" this host's initiator name (open-iscsi's, else
// one generated once and kept: initiatorname.Host), which it logs when it generated it.
func initiatorNameOr(given string, log *zap.Logger) (string, error) {
	if given != "" {
		return given, nil
	}
	name, generated, err := initiatorname.Host("/")
	if err != nil {
		return "", fmt.Errorf("no initiator name: %w; give --initiator-name", err)
	}
	if generated {
		log.Info("generated this host's initiator name", zap.String("initiator_name", name), zap.String("kept_in", initiatorname.OwnFile))
	}
	return name, nil
}

// options builds iser.Options for url's user.
func (tf *targetFlags) options(urlUser string, log *zap.Logger) (iser.Options, error) {
	chap, err := tf.chap(urlUser)
	if err != nil {
		return iser.Options{}, err
	}
	if tf.initiatorName, err = initiatorNameOr(tf.initiatorName, log); err != nil {
		return iser.Options{}, err
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
		CopyWrites:           tf.copyWrites,
	}
	if tf.recovery != (iser.Recovery{}) {
		rec := tf.recovery
		opts.Recovery = &rec
	}
	return opts, nil
}
