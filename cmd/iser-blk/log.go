package main

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger returns the process logger: structured, to stderr, console encoding for people on a
// terminal and JSON when ISERBLK_LOG_JSON=1. Secrets are never passed to it.
func newLogger(debug bool) *zap.Logger {
	level := zapcore.InfoLevel
	if debug {
		level = zapcore.DebugLevel
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if os.Getenv("ISERBLK_LOG_JSON") == "1" {
		enc = zapcore.NewJSONEncoder(encCfg)
	} else {
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(os.Stderr), level))
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
