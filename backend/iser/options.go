package iser

import (
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// Options configure Open. Secrets travel only here, never in the URL.
type Options struct {
	// InitiatorName is our IQN (required by Open).
	InitiatorName string
	// CHAP credentials; nil for AuthMethod=None. The URL's user, when present, overrides
	// CHAP.User.
	CHAP *login.CHAP
	// Sessions is the number of sessions to open (default 1); commands are spread over them by
	// least outstanding commands.
	Sessions int
	// proposal overrides the operational keys offered at login (nil: login.DefaultProposal).
	proposal *login.Proposal
	// LoginTimeout bounds connecting and logging in, per session (default 15 s).
	LoginTimeout time.Duration
	// MaxTransfer caps the data of one SCSI command in bytes (0: the LUN's and transport's own
	// limits). Larger requests are split.
	MaxTransfer int64
	// ReadOnly opens the LUN read-only even when the target allows writes.
	ReadOnly bool
	// Retry bounds re-issuing commands after UNIT ATTENTION, BUSY, TASK SET FULL and ABORTED
	// COMMAND (nil: scsi defaults).
	Retry *scsi.RetryPolicy
	// Recovery configures keepalive, command timeout, reinstatement and the replacement timeout
	// for sessions (nil: DefaultRecovery).
	Recovery *Recovery
	// CopyWrites copies every write's data into the socket. By default a single session over
	// TCP sends large writes' data by reference instead (see lendPolicy in open.go).
	CopyWrites bool
	// AlternateTargets are URLs of the same target IQN and LUN on other portals (multipath):
	// Open logs Sessions sessions in to each, and I/O fails over between them.
	AlternateTargets []string
	// PortalsFromDiscovery asks the URL's portal for the target's portals (SendTargets, RFC
	// 7143 §4.3) and adds every other portal it lists, as if given in AlternateTargets.
	PortalsFromDiscovery bool
	// Logger receives structured logs (nil: none). Secrets are never logged.
	Logger *zap.Logger

	pathNames []string // set by Open: the portal of each executor, for logs and PathStats
}

func (o *Options) logger() *zap.Logger {
	if o.Logger == nil {
		return zap.NewNop()
	}
	return o.Logger
}
