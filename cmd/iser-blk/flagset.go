package main

// The flag groups of iser-blk's help and its usage errors; the conventions themselves (groups,
// help, exit 2, the single-dash normaliser, completion, man pages) are internal/cli's.

import (
	"fmt"

	"github.com/iser-blk/iser-blk/internal/cli"
)

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// Flag groups: each command's help lists its flags under these headings, in the order the
// command adds them. A flag in no group is listed under groupGeneral (--debug, --help).
const (
	groupTarget      = "Target"
	groupReliability = "Reliability (docs/reliability.md)"
	groupNBD         = "Frontend: kernel NBD (--nbd)"
	groupUblk        = "Frontend: ublk (--ublk)"
	groupExport      = "Device and NBD export"
	groupServer      = "NBD server"
	groupTLS         = "TLS (docs/cli.md)"
	groupCache       = "Cache"
	groupService     = "Service (docs/operations.md)"
	groupOutput      = "Output"
	groupGeneral     = cli.General
)

// usageFooter ends the help of the root.
const usageFooter = "\nRun 'iser-blk help COMMAND' or 'iser-blk COMMAND --help' for a command's flags;\n" +
	"'man iser-blk-COMMAND' once the man pages are installed (make man).\n"
