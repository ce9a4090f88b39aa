package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
)

// listProbeTimeout bounds each gateway's status answer in List.
const listProbeTimeout = 2 * time.Second

// Entry is one running gateway as List found it.
type Entry struct {
	Name   string
	Status status.Status // valid when Err is nil
	Err    error         // the name is held, but the gateway did not answer in time
}

// List returns the gateways running under runDir, by name. A name whose lock is free belongs to
// a dead gateway: its files are removed and it is left out. perGateway bounds each status query
// (0: 2 s). A missing run directory means no gateways.
func List(ctx context.Context, runDir string, perGateway time.Duration) ([]Entry, error) {
	if perGateway <= 0 {
		perGateway = listProbeTimeout
	}
	names, err := namesIn(runDir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, name := range names {
		qctx, cancel := context.WithTimeout(ctx, perGateway)
		st, err := (&Client{Name: name, socket: SocketPath(runDir, name)}).Status(qctx)
		cancel()
		// Only a gateway that does not answer is probed: taking a live gateway's lock, even
		// for a moment, could make a starting gateway's claim fail.
		if errors.Is(err, ErrUnknownGateway) && probeStale(runDir, name) {
			continue
		}
		out = append(out, Entry{Name: name, Status: st, Err: err})
	}
	return out, ctx.Err()
}

// namesIn lists the gateway names with a .sock or .lock file in dir, sorted.
func namesIn(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		for _, ext := range []string{".sock", ".lock"} {
			if base, ok := strings.CutSuffix(n, ext); ok && ValidateName(base) == nil {
				seen[base] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}
