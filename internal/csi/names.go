package csi

import (
	"crypto/sha256"
	"encoding/hex"
)

// DriverName is the plugin's name in GetPluginInfo: the CSIDriver object's name and the
// StorageClass's provisioner. A CO keys volumes by it, so it never changes.
const DriverName = "csi.iser-blk.io"

// namePrefix marks the gateways this plugin started, so an operator's `iser-blk list` tells them
// from hand-made ones and the healer leaves those alone.
const namePrefix = "csi-"

// GatewayName is the gateway name of the volume volumeID: "csi-" and the first 16 hex digits of
// the SHA-256 of the id. It is a valid control.ValidateName name for every id (a CSI volume id is
// any string up to 128 bytes, slashes included), it is the same on every call and after a
// plugin restart, and 64 bits make a collision between the volumes of one node negligible.
func GatewayName(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return namePrefix + hex.EncodeToString(sum[:8])
}
