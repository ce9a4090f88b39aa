package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// ParseKV reads the KEY=VALUE lines the guest helper scripts print on stdout. Blank lines are
// ignored; a key must be non-empty and made of A-Z, 0-9 and '_' and must not start with a digit;
// the value is everything after the first '=' (it may contain '=' and spaces, never a newline).
// A repeated key keeps the last value. Any other line is an error naming it, because a helper
// that prints something else on stdout has broken its contract.
func ParseKV(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || !validKey(key) {
			return nil, fmt.Errorf("line %d: want KEY=VALUE, got %q", n, line)
		}
		out[key] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading KEY=VALUE lines: %w", err)
	}
	return out, nil
}

func validKey(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}
