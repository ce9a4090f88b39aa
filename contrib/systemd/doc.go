// Package systemd holds the systemd unit iser-blk@NAME.service and its example configuration
// NAME.conf; it has no code, only a test that checks the unit with systemd's own verifier
// (systemd-analyze is installed on the dev hosts and in CI, so its absence fails the test
// rather than skipping it).
//
// Invariants the unit keeps: READY=1 (Type=notify) only once the device or socket takes I/O;
// stop is `iser-blk detach NAME`, which writes back every dirty byte before the gateway exits;
// secrets reach the gateway through the root-only EnvironmentFile, never through argv; the
// instance name is the gateway's name (list, status, detach).
package systemd
