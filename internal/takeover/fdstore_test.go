package takeover

import (
	"errors"
	"os"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// fakeFDStore is a descriptor store that passed given at start; Remove calls are recorded.
type fakeFDStore struct {
	given     map[string][]*os.File
	removed   []string
	removeErr error
}

func (s *fakeFDStore) Take() map[string][]*os.File {
	g := s.given
	s.given = nil
	return g
}

func (s *fakeFDStore) Remove(name string) error {
	s.removed = append(s.removed, name)
	return s.removeErr
}

func openFiles(t *testing.T, n int) []*os.File {
	t.Helper()
	var fs []*os.File
	for range n {
		f, err := os.CreateTemp(t.TempDir(), "stored")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fs = append(fs, f)
	}
	return fs
}

func closed(f *os.File) bool { return errors.Is(f.Close(), os.ErrClosed) }

// The sockets the predecessor left for its device under its own name go to Reattach; an entry
// from another process (stale) or for another device is closed; every entry is removed from the
// store before Reattach runs (a rejected socket must die for the kernel to take new ones), even
// when a removal fails; none is left open when AttachNBD returns.
func TestAttachNBDTakesThePredecessorsStoredSockets(t *testing.T) {
	tk, srv, _ := nbdSuccessor(t, t.TempDir(), statefile.State{DevID: 3, CacheMode: modes.WriteBack, PID: 41}, modes.WriteBack)
	mine, stale, other := openFiles(t, 2), openFiles(t, 1), openFiles(t, 1)
	store := &fakeFDStore{removeErr: errors.New("sd_notify: no socket"), given: map[string][]*os.File{
		nbd.StoredSocketsName(3, 41): mine, nbd.StoredSocketsName(3, 40): stale, nbd.StoredSocketsName(5, 41): other}}
	tk.fdStore = store
	k := &fakeNBD{}
	kern := k.kernel()
	var got []*os.File
	var removedBefore []string
	reattach := kern.Reattach
	kern.Reattach = func(s *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
		got, removedBefore = opts.Stored, slices.Clone(store.removed)
		return reattach(s, opts)
	}
	if _, err := tk.AttachNBD(kern, srv, nbd.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != mine[0] || got[1] != mine[1] {
		t.Fatalf("Reattach was given %v, want the predecessor's two sockets", got)
	}
	slices.Sort(removedBefore)
	if want := []string{"nbd3-pid40", "nbd3-pid41", "nbd5-pid41"}; !slices.Equal(removedBefore, want) {
		t.Fatalf("removed from the store before Reattach: %q, want %q", removedBefore, want)
	}
	if !closed(stale[0]) || !closed(other[0]) {
		t.Fatal("an entry that is not the predecessor's for this device stays open")
	}
	if !closed(mine[0]) || !closed(mine[1]) {
		t.Fatal("what Reattach was given stays open after AttachNBD (this fake Reattach closes nothing)")
	}
}

// A fresh device (no predecessor) takes nothing from the store and closes what is there.
func TestAttachNBDWithoutPredecessorClosesStored(t *testing.T) {
	dev := memDevice(t, 1<<20)
	tk := mustPrepare(t, t.TempDir(), "gw", modes.NBD, modes.WriteBack, dev)
	leftover := openFiles(t, 1)
	store := &fakeFDStore{given: map[string][]*os.File{"nbd0-pid9": leftover}}
	tk.fdStore = store
	k := &fakeNBD{}
	kern := k.kernel()
	var got []*os.File
	attach := kern.Attach
	kern.Attach = func(s *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
		got = opts.Stored
		return attach(s, opts)
	}
	srv, err := nbd.NewServer(tk.Serving(dev), nbd.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if _, err := tk.AttachNBD(kern, srv, nbd.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if got != nil || !closed(leftover[0]) || !slices.Equal(store.removed, []string{"nbd0-pid9"}) {
		t.Fatalf("Attach given %v, leftover closed %v, removed %q; want nothing given, closed, removed", got, closed(leftover[0]), store.removed)
	}
}
