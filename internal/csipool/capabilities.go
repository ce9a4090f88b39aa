package csipool

// Which volume capabilities a pool volume has. One LUN is served on a node by one gateway with
// its own cache, so it may be used on one node at a time: two nodes' write-back caches over one
// LUN would each hand out stale blocks and overwrite the other's writes. Both access types work:
// the node hands the block device over as is, or makes a filesystem on it (the plugin image has
// mkfs for ext2/3/4 and xfs).

import (
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// fsTypes are the filesystems a mount volume may ask for ("" is the node's default).
var fsTypes = map[string]bool{"": true, "ext2": true, "ext3": true, "ext4": true, "xfs": true}

// checkCapabilities returns nil when every capability of caps is one a pool volume has; else an
// error saying which is not. A missing field is an error too (the caller maps it to
// InvalidArgument or to an unconfirmed validation).
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return errors.New("no volume capabilities")
	}
	for i, c := range caps {
		if err := checkCapability(c); err != nil {
			return fmt.Errorf("volume capability %d: %w", i, err)
		}
	}
	return nil
}

func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errors.New("empty")
	}
	switch {
	case c.GetBlock() != nil:
	case c.GetMount() != nil:
		if fs := c.GetMount().GetFsType(); !fsTypes[fs] {
			return fmt.Errorf("filesystem %q not supported (want ext4, xfs, ext3 or ext2)", fs)
		}
	default:
		return errors.New("no access type (block or mount)")
	}
	if c.GetAccessMode() == nil {
		return errors.New("no access mode")
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		return nil
	default:
		return fmt.Errorf("access mode %s not supported: a LUN is served on one node at a time (SINGLE_NODE_WRITER or SINGLE_NODE_READER_ONLY)", m)
	}
}
