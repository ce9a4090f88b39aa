//go:build vm

// Package csivm runs the CSI plugin, the real `iser-blk csi` binary ($ISERBLK_BIN), in the QEMU
// guest (test/vm/run.sh go-test ./test/vm/csi): node and pool controller in one process, driven
// over its gRPC unix socket, staging real ublk and nbd devices over LIO targets reached over
// iSCSI/TCP and over iSER on soft-RoCE (issue 38).
//
//   - TestVMSanity runs csi-sanity v5.6.0 twice against the plugin, a filesystem run (iSER, nbd)
//     and a block run (iSCSI, ublk), each in a child process of the test binary (Ginkgo runs one
//     suite per process). Specs of capabilities the plugin does not advertise are deselected by
//     name (sanityDeselect, each with its reason); every selected spec must pass: a spec that
//     skips itself at run time fails the test.
//   - TestVMPluginKill9MidIO kills the plugin with SIGKILL while fio writes and verifies a
//     published ext4 volume, starts it again, and requires the I/O to finish without an error
//     on the same device, served by the same gateway, under the same mounts; NodeUnpublish and
//     NodeUnstage then leave no device, session, mount, gateway or state file.
//   - TestVMHealerRestartsGateway does the same but kills the volume's gateway too (write-through
//     cache): the restarted plugin's healer starts a new gateway, which takes the waiting device
//     over, and fio goes on without an error.
//
// Invariants: every test starts its own targets, plugin and directories and removes them when it
// ends, so the tests run in any order in one guest; what a failed test leaves is detached in its
// cleanup before its targets go (a target torn down under a live session would wedge the next
// test's).
package csivm
