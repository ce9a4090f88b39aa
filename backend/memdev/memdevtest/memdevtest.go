// Package memdevtest gives tests an in-memory block.Device (backend/memdev) that is closed when
// the test ends, so that each test package does not grow its own copy of the helper.
package memdevtest

import (
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
)

// New is a size-byte memdev with default options, closed by t.Cleanup.
func New(t testing.TB, size int64) *memdev.Device {
	t.Helper()
	d, err := memdev.New(size, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
