package csi

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/iser-blk/iser-blk/internal/control"
)

// errf is a gRPC status error: every error the services return is one, with a CSI code.
func errf(c codes.Code, format string, a ...any) error { return status.Errorf(c, format, a...) }

// invalid is InvalidArgument for a request that fails validation.
func invalid(err error) error { return status.Error(codes.InvalidArgument, err.Error()) }

// internalf is Internal, except that a call whose context ended says so (DeadlineExceeded or
// Canceled): the CO then knows its own deadline cut the call short and retries.
func internalf(ctx context.Context, format string, a ...any) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, format, a...)
	case errors.Is(ctx.Err(), context.Canceled):
		return status.Errorf(codes.Canceled, format, a...)
	}
	return status.Errorf(codes.Internal, format, a...)
}

// detachErr maps a gateway's detach refusal to a code: a held device (mounted or open
// elsewhere) is FailedPrecondition, a gateway busy with another detach, restart or stop is
// Aborted (the CO retries), anything else Internal.
func detachErr(ctx context.Context, name string, err error) error {
	var ce *control.Error
	if errors.As(err, &ce) {
		switch ce.Code {
		case control.CodeRefused:
			return errf(codes.FailedPrecondition, "gateway %s refused to detach: %s", name, ce.Message)
		case control.CodeBusy:
			return errf(codes.Aborted, "gateway %s is busy: %s", name, ce.Message)
		}
	}
	return internalf(ctx, "detach gateway %s: %v", name, err)
}
