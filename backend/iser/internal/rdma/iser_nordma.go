//go:build !cgo || !linux || nordma

package rdma

import (
	"context"

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

func init() { transport.Register("iser", noRDMADialer{}) }

// noRDMADialer keeps iser:// URLs recognised in a build without rdma-core, failing every dial
// with ErrNoRDMA instead of "unknown scheme".
type noRDMADialer struct{}

func (noRDMADialer) DefaultPort() int { return 3260 }

func (noRDMADialer) Dial(context.Context, string, transport.DialOptions) (transport.Conn, error) {
	return nil, ErrNoRDMA
}
