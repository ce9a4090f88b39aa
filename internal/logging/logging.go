// Package logging builds the process logger of iser-blk: zap, to stderr, console encoding for
// people on a terminal and JSON when ISERBLK_LOG_JSON=1. When stderr is connected to the systemd
// journal (systemd.exec(5): JOURNAL_STREAM holds the "device:inode" of that stream), every line
// starts with sd-daemon(3)'s "<N>" priority prefix, so that `journalctl -p err` finds the errors:
// debug 7, info 6, warning 4, error 3, and DPanic, Panic and Fatal 2 (crit). Anywhere else the
// output is unchanged.
package logging

import (
	"bytes"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// Options select the logger New builds.
type Options struct {
	Debug   bool // log at debug level (default: info)
	JSON    bool // JSON encoding instead of the console's
	Journal bool // prefix each line with its journald priority "<N>"
}

// FromEnv reads the options from the environment: ISERBLK_LOG_JSON=1 for JSON, JOURNAL_STREAM
// naming stderr for the journal prefixes.
func FromEnv(debug bool) Options {
	return Options{
		Debug:   debug,
		JSON:    os.Getenv("ISERBLK_LOG_JSON") == "1",
		Journal: IsJournalStream(os.Stderr, os.Getenv("JOURNAL_STREAM")),
	}
}

// New returns a logger that writes to w as o says. Secrets are never passed to it.
func New(o Options, w zapcore.WriteSyncer) *zap.Logger {
	level := zapcore.InfoLevel
	if o.Debug {
		level = zapcore.DebugLevel
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if o.JSON {
		enc = zapcore.NewJSONEncoder(encCfg)
	} else {
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	}
	if o.Journal {
		enc = journalEncoder{enc}
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(w), level))
}

// IsJournalStream reports whether f is the stream JOURNAL_STREAM (its value in env) names: the
// variable is inherited by children whose stderr may go elsewhere, so the value alone says
// nothing; the device and inode must be f's own.
func IsJournalStream(f *os.File, env string) bool {
	devStr, inoStr, ok := strings.Cut(env, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(devStr, 10, 64)
	ino, err2 := strconv.ParseUint(inoStr, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && uint64(st.Ino) == ino
}

// Priority is the syslog priority journald files a zap level under (sd-daemon(3)).
func Priority(l zapcore.Level) byte {
	switch {
	case l <= zapcore.DebugLevel:
		return 7
	case l == zapcore.InfoLevel:
		return 6
	case l == zapcore.WarnLevel:
		return 4
	case l == zapcore.ErrorLevel:
		return 3
	default: // DPanic, Panic, Fatal
		return 2
	}
}

// prefixed holds journalEncoder's output buffers; zap's writer frees each back here.
var prefixed = buffer.NewPool()

// journalEncoder wraps an encoder and starts each line of an entry with the entry's "<N>", the
// lines after the first too (a multi-line error must not land at journald's default priority).
// Both buffers come from pools: no allocation beyond the wrapped encoder's.
type journalEncoder struct{ zapcore.Encoder }

func (e journalEncoder) Clone() zapcore.Encoder { return journalEncoder{e.Encoder.Clone()} }

func (e journalEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	in, err := e.Encoder.EncodeEntry(ent, fields)
	if err != nil {
		return nil, err
	}
	defer in.Free()
	out := prefixed.Get()
	p := Priority(ent.Level)
	b := in.Bytes()
	for len(b) > 0 {
		out.AppendByte('<')
		out.AppendByte('0' + p)
		out.AppendByte('>')
		i := bytes.IndexByte(b, '\n') + 1 // the newline ends this line
		if i == 0 {
			i = len(b) // a last line without one
		}
		_, _ = out.Write(b[:i])
		b = b[i:]
	}
	return out, nil
}

// Process is the process logger: New with FromEnv's options, to stderr.
func Process(debug bool) *zap.Logger { return New(FromEnv(debug), os.Stderr) }

// Command is the logger of a one-shot command (info, discover): Process at warning level and
// above unless debug, so that the command's output is not buried in session chatter.
func Command(debug bool) *zap.Logger {
	if debug {
		return Process(true)
	}
	return Process(false).WithOptions(zap.IncreaseLevel(zap.WarnLevel))
}
