package csi

import (
	"fmt"
	"slices"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// capability is a checked VolumeCapability.
type capability struct {
	block    bool
	fsType   string   // mount: as asked ("" = whatever the device holds, else ext4)
	flags    []string // mount: mount options
	readOnly bool     // the access mode allows no writer
}

// parseCapability checks c: exactly one access type, a supported filesystem, and a
// single-node access mode. A volume is served through one node's gateway and its cache, so two
// nodes writing would each trust a cache the other bypasses: the multi-node modes are refused.
func parseCapability(c *csipb.VolumeCapability) (capability, error) {
	if c == nil {
		return capability{}, fmt.Errorf("volume capability is required")
	}
	var cp capability
	switch am := c.GetAccessMode().GetMode(); am {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		cp.readOnly = true
	case csipb.VolumeCapability_AccessMode_UNKNOWN:
		return capability{}, fmt.Errorf("volume capability: an access mode is required")
	default:
		return capability{}, fmt.Errorf("access mode %s is not supported: a volume is served by one node (its gateway caches)", am)
	}
	switch {
	case c.GetBlock() != nil && c.GetMount() == nil:
		cp.block = true
	case c.GetMount() != nil && c.GetBlock() == nil:
		m := c.GetMount()
		cp.fsType = m.GetFsType()
		if cp.fsType != "" && !slices.Contains(SupportedFSTypes, cp.fsType) {
			return capability{}, fmt.Errorf("filesystem %q is not supported (%s)", cp.fsType, strings.Join(SupportedFSTypes, ", "))
		}
		for _, f := range m.GetMountFlags() {
			if f == "" || strings.ContainsAny(f, ", \t\n") {
				return capability{}, fmt.Errorf("mount flag %q: one option per flag, no commas or spaces", f)
			}
		}
		cp.flags = m.GetMountFlags()
		if m.GetVolumeMountGroup() != "" {
			return capability{}, fmt.Errorf("volume_mount_group is not supported (the plugin does not advertise VOLUME_MOUNT_GROUP)")
		}
	default:
		return capability{}, fmt.Errorf("volume capability: give exactly one of block and mount")
	}
	return cp, nil
}
