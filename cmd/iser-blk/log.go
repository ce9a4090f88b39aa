package main

import (
	"os"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/logging"
)

// newLogger returns the process logger (internal/logging: console or ISERBLK_LOG_JSON=1, with
// journald priorities when stderr is the journal). Secrets are never passed to it.
func newLogger(debug bool) *zap.Logger {
	return logging.New(logging.FromEnv(debug), os.Stderr)
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
