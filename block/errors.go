package block

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. Every error a Device returns satisfies errors.Is with exactly one of these (a
// typed error such as a decoded SCSI sense carries an Is method that names its class), so that
// each frontend maps it to its own wire code through Errno.
var (
	ErrIO           = errors.New("i/o error")               // EIO: anything else that failed
	ErrInvalid      = errors.New("invalid request")         // EINVAL: misaligned, out of range, bad field
	ErrReadOnly     = errors.New("device is read-only")     // EROFS (NBD: EPERM)
	ErrNoSpace      = errors.New("no space left on device") // ENOSPC: thin pool exhausted
	ErrNotSupported = errors.New("operation not supported") // EOPNOTSUPP
	ErrMedium       = errors.New("medium error")            // EIO, but the data at that LBA is lost
	ErrTimeout      = errors.New("request timed out")       // ETIMEDOUT, surfaced as EIO to clients
	ErrClosed       = errors.New("device is closed")        // ESHUTDOWN
	ErrNoPath       = errors.New("no path to the target")   // EIO after the replacement timeout
)

// RangeError reports a request outside the device or not aligned to its block size.
type RangeError struct {
	Off, Len, Size int64
	Reason         string
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("request [%d, +%d) on a %d-byte device: %s", e.Off, e.Len, e.Size, e.Reason)
}

// Is makes a RangeError match ErrInvalid.
func (e *RangeError) Is(target error) bool { return target == ErrInvalid }

// Errno maps an error from a Device to the errno a kernel or NBD client should see. nil maps to 0.
// Context cancellation maps to EIO for a request that was cut short (a client must never read
// success into it), except that ECANCELED is kept distinguishable for logging.
func Errno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, ErrReadOnly):
		return syscall.EROFS
	case errors.Is(err, ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, ErrNotSupported):
		return syscall.EOPNOTSUPP
	case errors.Is(err, ErrClosed):
		return syscall.ESHUTDOWN
	case errors.Is(err, ErrTimeout):
		return syscall.ETIMEDOUT
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.ECANCELED
	default:
		return syscall.EIO
	}
}
