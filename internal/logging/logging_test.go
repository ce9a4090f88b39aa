package logging

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// journalFile is a temporary file standing in for the journal's stream socket: its
// JOURNAL_STREAM value ("dev:ino") is set in the environment as systemd would.
func journalFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "journal"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	return f
}

func TestIsJournalStream(t *testing.T) {
	f := journalFile(t)
	env := os.Getenv("JOURNAL_STREAM")
	if !IsJournalStream(f, env) {
		t.Errorf("the file JOURNAL_STREAM=%s names is not recognised", env)
	}
	other, err := os.Create(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if IsJournalStream(other, env) {
		t.Error("a file that inherited JOURNAL_STREAM but is another inode counts as the journal")
	}
	for _, bad := range []string{"", "12", "a:b", "12:", ":34", "1:2:3"} {
		if IsJournalStream(f, bad) {
			t.Errorf("JOURNAL_STREAM=%q accepted", bad)
		}
	}
}

// TestJournalPrefixes: through a fake JOURNAL_STREAM, each level's lines carry sd-daemon(3)'s
// priority, every line of a multi-line entry too, in console and JSON encoding.
func TestJournalPrefixes(t *testing.T) {
	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", json), func(t *testing.T) {
			f := journalFile(t)
			o := Options{Debug: true, JSON: json, Journal: IsJournalStream(f, os.Getenv("JOURNAL_STREAM"))}
			if !o.Journal {
				t.Fatal("the fake journal stream is not recognised")
			}
			log := New(o, f).WithOptions(zap.AddStacktrace(zapcore.ErrorLevel))
			log.Debug("d")
			log.Info("i")
			log.Warn("w")
			log.Error("FINAL FLUSH FAILED", zap.Error(errors.New("boom")))
			log.DPanic("dp") // production logger: logged, no panic
			_ = log.Sync()
			out, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			want := map[string]string{"d": "<7>", "i": "<6>", "w": "<4>", "FINAL FLUSH FAILED": "<3>", "dp": "<2>"}
			seen := map[string]bool{}
			prev := ""
			for _, l := range lines {
				if len(l) < 3 || l[0] != '<' || l[2] != '>' {
					t.Fatalf("line without a priority prefix: %q\n%s", l, out)
				}
				msg, entry := message(l[3:], json)
				if !entry { // a stack trace line belongs to the entry above
					if !strings.HasPrefix(l, prev) {
						t.Errorf("continuation line %q has not its entry's priority %s", l, prev)
					}
					continue
				}
				prev = l[:3]
				if p, ok := want[msg]; !ok || p != prev {
					t.Errorf("%q logged as %q, want %s", msg, l, p)
				}
				seen[msg] = true
			}
			for msg := range want {
				if !seen[msg] {
					t.Errorf("%q not logged:\n%s", msg, out)
				}
			}
			if !json && len(lines) <= len(want) {
				t.Errorf("the error's stack trace was not logged on lines of its own:\n%s", out)
			}
		})
	}
}

// TestNoJournalUnchanged: without the journal, nothing is prefixed.
func TestNoJournalUnchanged(t *testing.T) {
	var plain, viaEnv bytes.Buffer
	New(Options{}, zapcore.AddSync(&plain)).Error("x")
	t.Setenv("JOURNAL_STREAM", "1:2") // some other stream's: stderr is not it
	New(FromEnv(false), zapcore.AddSync(&viaEnv)).Error("x")
	for _, out := range []string{plain.String(), viaEnv.String()} {
		if strings.HasPrefix(out, "<") || !strings.Contains(out, "ERROR\tx") {
			t.Errorf("plain output changed: %q", out)
		}
	}
}

func TestPriority(t *testing.T) {
	for l, p := range map[zapcore.Level]byte{zapcore.DebugLevel: 7, zapcore.InfoLevel: 6,
		zapcore.WarnLevel: 4, zapcore.ErrorLevel: 3, zapcore.DPanicLevel: 2, zapcore.PanicLevel: 2,
		zapcore.FatalLevel: 2} {
		if got := Priority(l); got != p {
			t.Errorf("Priority(%v) = %d, want %d", l, got, p)
		}
	}
}

// TestJournalNoAllocations: the prefixing adds no allocation to a log call.
func TestJournalNoAllocations(t *testing.T) {
	allocs := func(journal bool) float64 {
		log := New(Options{Journal: journal}, zapcore.AddSync(discard{}))
		return testing.AllocsPerRun(200, func() {
			log.Info("request", zap.Int64("offset", 4096), zap.String("op", "write"))
		})
	}
	plain, journal := allocs(false), allocs(true)
	if journal > plain+poolSlack {
		t.Errorf("a journal log call allocates %.1f times, a plain one %.1f", journal, plain)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// message returns the message of an entry's first line, and false for a continuation line.
func message(line string, json bool) (string, bool) {
	if json {
		_, rest, ok := strings.Cut(line, `"msg":"`)
		msg, _, _ := strings.Cut(rest, `"`)
		return msg, ok
	}
	f := strings.Split(line, "\t")
	if len(f) < 3 {
		return "", false
	}
	return f[2], true
}

// TestCommandLevels: a one-shot command logs warnings and up unless debug; the process logger
// logs info and up, or debug.
func TestCommandLevels(t *testing.T) {
	for _, tt := range []struct {
		log  *zap.Logger
		want zapcore.Level
	}{
		{Process(false), zapcore.InfoLevel},
		{Process(true), zapcore.DebugLevel},
		{Command(false), zapcore.WarnLevel},
		{Command(true), zapcore.DebugLevel},
	} {
		if got := zapcore.LevelOf(tt.log.Core()); got != tt.want {
			t.Errorf("level %v, want %v", got, tt.want)
		}
	}
}
