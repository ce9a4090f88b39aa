// Package udev holds 60-iser-blk.rules, the udev rule that links /dev/iser-blk/NAME to the disk
// of the gateway named NAME (the name comes from the hidden `iser-blk udev-name`, whose lookup is
// internal/udevname). It has no code, only a test that the rule and the helper agree; the VM
// tier runs the rule under a real udev (test/vm/systemd, TestUdevLinks).
package udev
