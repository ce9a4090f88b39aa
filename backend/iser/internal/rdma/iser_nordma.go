//go:build !cgo || !linux || nordma

package rdma

import (
	"context"

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

func init() { transport.Register("iser", noRDMADialer{}) }

// Available: this build has no iSER transport; backend/iser refuses iser:// targets before any
// network I/O (ErrRDMANotBuilt), and a dial that still gets here fails with ErrNoRDMA.
const Available = false

// noRDMADialer keeps iser:// URLs recognised in a build without rdma-core, failing every dial
// with ErrNoRDMA instead of "unknown scheme".
type noRDMADialer struct{}

func (noRDMADialer) DefaultPort() int { return 3260 }

func (noRDMADialer) Dial(context.Context, string, transport.DialOptions) (transport.Conn, error) {
	return nil, ErrNoRDMA
}
