//go:build vm

// Package systemd_test runs the shipped unit iser-blk@.service, installed by `make install`,
// under a real systemd (252, the host's) as PID 1 in the QEMU guest. It needs that guest:
// `VM_INIT=systemd test/vm/run.sh go-test ./test/vm/systemd` (make test-vm runs it as its own
// part, tier vm-systemd); under the ordinary guest (bash as PID 1) every test fails.
//
// Every gateway runs as the unit iser-blk@NAME against an LIO target over iSCSI/TCP in the
// guest, configured through /etc/iser-blk/NAME.conf exactly as an operator would; the tests
// drive it with systemctl and read it back with systemctl show, journalctl and iser-blk status.
// TestDeb installs the Debian package instead (dpkg -i, then -r and -P), after a make uninstall
// if an earlier test had installed.
// The TestCSILauncher* tests (csi_vm_test.go) run the CSI plugin itself in a transient service
// and kill that service's whole cgroup, as a container runtime does, to show where its
// gateways live (--launcher).
package systemd_test
