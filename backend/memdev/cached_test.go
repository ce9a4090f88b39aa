package memdev

import (
	"bytes"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

var (
	_ block.CachedReader = (*Device)(nil)
	_ block.CachedWriter = (*Device)(nil)
)

func TestCachedPaths(t *testing.T) {
	d, err := New(2<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xa5}, 8192)
	if !d.WriteCached(data, chunkSize-4096) { // across two chunks
		t.Fatal("WriteCached declined a valid write")
	}
	got := make([]byte, len(data))
	if !d.ReadCached(got, chunkSize-4096) || !bytes.Equal(got, data) {
		t.Fatal("ReadCached did not return what WriteCached stored")
	}
	if s := d.Stats(); s.Writes != 1 || s.Reads != 1 {
		t.Fatalf("stats %+v, want one read and one write", s)
	}
	// What ReadAt / WriteAt would refuse is declined, for them to report.
	if d.ReadCached(got, 2<<20) || d.WriteCached(data, 2<<20-512) || d.ReadCached(got[:100], 0) {
		t.Fatal("an out-of-range or misaligned request was taken")
	}
	ro, err := New(1<<20, Options{Limits: &block.Limits{ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	if ro.WriteCached(data, 0) {
		t.Fatal("a read-only device took a cached write")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if d.ReadCached(got, 0) || d.WriteCached(data, 0) {
		t.Fatal("a closed device took a request")
	}
}
