package csipool

// The pool file: the LUNs the controller may hand out, one per line. Its bytes come from a
// ConfigMap or a file an operator edits, so the decoder is strict: anything it does not
// understand is an error naming the line, never a LUN skipped in silence (a silently skipped LUN
// is capacity that vanished; a misread one is a volume on the wrong disk).
//
//	# comment; blank lines are ignored
//	iscsi://192.0.2.10/iqn.2001-04.com.example:pool/1
//	iscsi://192.0.2.10/iqn.2001-04.com.example:pool/2,iscsi://192.0.2.11/iqn.2001-04.com.example:pool/2
//	iser://alice@192.0.2.12:3260/iqn.2001-04.com.example:fast/1   # CHAP user alice
//
// A line is one LUN: its target URL (docs/cli.md, "Naming a LUN"), then, comma-separated, the
// same LUN on other portals (multipath). Everything from `#` to the end of the line is a comment
// (a target URL never holds `#`: backend/iser.ParseURL refuses fragments).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/iser-blk/iser-blk/backend/iser"
)

// ErrPool is wrapped by every pool file error.
var ErrPool = errors.New("pool file")

// Bounds on what ParsePool reads: a pool of thousands of LUNs is a few hundred KiB.
const (
	maxPoolBytes    = 4 << 20
	maxLineBytes    = 8 << 10
	maxPortalsOfLUN = 16
)

// LUN is one line of the pool file.
type LUN struct {
	// Key identifies the LUN whatever portals reach it: IQN/LUN. Claims refer to LUNs by Key, so
	// adding or removing a portal in the pool file keeps a claim.
	Key string
	// URLs are the target URLs as written (first the line's first), canonicalised by
	// iser.Target.String.
	URLs []string
	// Transport is "iscsi" or "iser", the scheme every URL of the line shares.
	Transport string
	// Line is the line of the pool file, for messages.
	Line int
}

// Target is the volume context's target value: the URLs comma-separated.
func (l LUN) Target() string { return strings.Join(l.URLs, ",") }

// ReadPool reads and parses the pool file at path.
func ReadPool(path string) ([]LUN, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPool, err)
	}
	luns, err := ParsePool(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return luns, nil
}

// ParsePool parses a pool file's bytes. It fails on the first malformed line (naming it), on a
// LUN listed twice (naming both lines) and on a pool without LUNs.
func ParsePool(data []byte) ([]LUN, error) {
	if len(data) > maxPoolBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrPool, len(data), maxPoolBytes)
	}
	var luns []LUN
	seen := map[string]int{} // Key → line
	for n, raw := range bytes.Split(data, []byte("\n")) {
		line := n + 1
		if len(raw) > maxLineBytes {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrPool, line, maxLineBytes)
		}
		text := string(raw)
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		lun, err := parseLine(text)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrPool, line, err)
		}
		if first, dup := seen[lun.Key]; dup {
			return nil, fmt.Errorf("%w: line %d: LUN %s is already on line %d", ErrPool, line, lun.Key, first)
		}
		seen[lun.Key] = line
		lun.Line = line
		luns = append(luns, lun)
	}
	if len(luns) == 0 {
		return nil, fmt.Errorf("%w: no LUNs (one target URL per line)", ErrPool)
	}
	return luns, nil
}

// parseLine parses one LUN: URLs separated by commas, all naming the same transport, IQN, LUN
// and CHAP user, each on another portal.
func parseLine(text string) (LUN, error) {
	fields := strings.Split(text, ",")
	if len(fields) > maxPortalsOfLUN {
		return LUN{}, fmt.Errorf("%d portals, at most %d", len(fields), maxPortalsOfLUN)
	}
	var lun LUN
	var first iser.Target
	portals := map[string]bool{}
	for i, f := range fields {
		f = strings.TrimSpace(f)
		if f == "" {
			return LUN{}, errors.New("empty URL between commas")
		}
		if strings.ContainsAny(f, " \t") {
			return LUN{}, fmt.Errorf("%q: URLs are separated by commas, not spaces", iser.RedactURL(f))
		}
		t, err := iser.ParseURL(f)
		if err != nil {
			return LUN{}, err
		}
		if i == 0 {
			first = t
			lun.Key = fmt.Sprintf("%s/%d", t.IQN, t.LUN)
			lun.Transport = t.Transport
		} else if t.Transport != first.Transport || t.IQN != first.IQN || t.LUN != first.LUN || t.User != first.User {
			return LUN{}, fmt.Errorf("%s is not the LUN of %s on another portal (every URL of a line names the same scheme, user, IQN and LUN)",
				t, first)
		}
		if strings.ContainsAny(t.String(), ", \t#") {
			// Only a user name (percent-encoded in the URL) can bring these in; written back,
			// the line would not read the same.
			return LUN{}, fmt.Errorf("user name %q: a pool file's user names hold no comma, space or #", t.User)
		}
		if portals[t.Portal()] {
			return LUN{}, fmt.Errorf("portal %s given twice", t.Portal())
		}
		portals[t.Portal()] = true
		lun.URLs = append(lun.URLs, t.String())
	}
	return lun, nil
}
