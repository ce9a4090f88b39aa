// Package vmtest is what the project's VM-tier tests (build tag vm) use to run inside the QEMU
// guest that test/vm/run.sh boots: Require fails a test that is not running in the guest, and thin
// wrappers start the guest helper scripts (test/vm/guest: soft-RoCE, an LIO or tgt target, module
// loading, open-iscsi) and return what they print as typed values, tearing down what they set up
// when the test ends. StartGateway runs a gateway process (`iser-blk attach`) until its device
// serves, and stops it when the test ends.
//
// Invariants: a vm-tagged test never skips (outside the guest it fails with a message saying how
// to run it); the helpers talk to the scripts only through arguments and KEY=VALUE lines on stdout
// (ParseKV); every resource a helper creates is removed by t.Cleanup, in reverse order.
//
// Only ParseKV builds without the vm tag, so that its unit and fuzz tests run in plain `go test`.
package vmtest
