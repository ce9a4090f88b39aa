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
	ErrTimeout      = errors.New("request timed out")       // EIO (see Errno); also a context deadline
	ErrCanceled     = errors.New("request canceled")        // EIO (see Errno): the caller's context was canceled
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

// ContextError returns err, the error of a context that is done (ctx.Err(), or an error wrapping
// it), as an error a Device may return: it satisfies errors.Is with ErrTimeout for
// context.DeadlineExceeded and ErrCanceled otherwise, and still with the context error itself. A
// Device that gives up on a request because its context is done returns this, not the bare
// context error, so that every error it returns names a sentinel.
func ContextError(err error) error {
	if err == nil {
		return nil
	}
	return &contextError{cause: err}
}

type contextError struct{ cause error }

func (e *contextError) Error() string { return e.cause.Error() }
func (e *contextError) Unwrap() error { return e.cause }

// Is names the sentinel class: a deadline is a timeout, anything else a cancellation.
func (e *contextError) Is(target error) bool {
	if errors.Is(e.cause, context.DeadlineExceeded) {
		return target == ErrTimeout
	}
	return target == ErrCanceled
}

// Errno maps an error from a Device to the errno a kernel or NBD client should see. nil maps to 0.
//
// Only errnos that change what the client does are passed on; everything else is EIO. In
// particular a request cut short by a timeout (ErrTimeout) or a canceled context (ErrCanceled)
// failed, and the client must see exactly that: EIO. Neither ETIMEDOUT nor ECANCELED would tell a
// client more: the NBD protocol has no such values (its errors are EPERM, EIO, ENOMEM, EINVAL,
// ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN; others must be sent as EIO), the kernel's
// errno_to_blk_status (ublk) turns ECANCELED into BLK_STS_IOERR anyway and ETIMEDOUT into
// BLK_STS_TIMEOUT, which a filesystem handles like any I/O error but which surfaces to a program
// reading the block device as an ETIMEDOUT that read(2) is not documented to return. The gateway's
// log keeps the cause.
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
	default: // ErrIO, ErrMedium, ErrTimeout, ErrCanceled, ErrNoPath, and anything unnamed
		return syscall.EIO
	}
}
