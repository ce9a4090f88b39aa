package block

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
)

type sized struct{ size int64 }

func (s sized) Size() int64                                                { return s.size }
func (s sized) BlockSize() int                                             { return 512 }
func (s sized) Limits() Limits                                             { return Limits{LogicalBlockSize: 512} }
func (s sized) ReadAt(context.Context, []byte, int64) error                { return nil }
func (s sized) WriteAt(context.Context, []byte, int64, WriteFlags) error   { return nil }
func (s sized) Flush(context.Context) error                                { return nil }
func (s sized) Discard(context.Context, int64, int64) error                { return nil }
func (s sized) WriteZeroes(context.Context, int64, int64, ZeroFlags) error { return nil }
func (s sized) Close() error                                               { return nil }

func TestCheckRange(t *testing.T) {
	d := sized{size: 1 << 20}
	cases := []struct {
		name     string
		off, len int64
		ok       bool
	}{
		{"whole device", 0, 1 << 20, true},
		{"last block", 1<<20 - 512, 512, true},
		{"empty at end", 1 << 20, 0, true},
		{"one past the end", 1<<20 - 512, 1024, false},
		{"offset past the end", 1<<20 + 512, 512, false},
		{"misaligned offset", 100, 512, false},
		{"misaligned length", 0, 100, false},
		{"negative offset", -512, 512, false},
		{"negative length", 0, -512, false},
		{"overflowing sum", 512, 1<<63 - 1 - 511, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckRange(d, c.off, c.len)
			if c.ok && err != nil {
				t.Fatalf("CheckRange(%d, %d) = %v, want nil", c.off, c.len, err)
			}
			if !c.ok {
				if err == nil {
					t.Fatalf("CheckRange(%d, %d) = nil, want an error", c.off, c.len)
				}
				if !errors.Is(err, ErrInvalid) || Errno(err) != syscall.EINVAL {
					t.Fatalf("CheckRange error %v does not map to EINVAL", err)
				}
			}
		})
	}
}

func TestErrno(t *testing.T) {
	cases := []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{ErrIO, syscall.EIO},
		{fmt.Errorf("write at 4096: %w", ErrReadOnly), syscall.EROFS},
		{fmt.Errorf("unmap: %w", ErrNoSpace), syscall.ENOSPC},
		{ErrNotSupported, syscall.EOPNOTSUPP},
		{ErrMedium, syscall.EIO},
		{ErrNoPath, syscall.EIO},
		{ErrTimeout, syscall.EIO},
		{ErrCanceled, syscall.EIO},
		{ErrClosed, syscall.ESHUTDOWN},
		{context.Canceled, syscall.EIO},
		{ContextError(context.Canceled), syscall.EIO},
		{ContextError(context.DeadlineExceeded), syscall.EIO},
		{errors.New("something unexpected"), syscall.EIO},
	}
	for _, c := range cases {
		if got := Errno(c.err); got != c.want {
			t.Errorf("Errno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestContextError(t *testing.T) {
	if ContextError(nil) != nil {
		t.Fatal("ContextError(nil) is not nil")
	}
	canceled := ContextError(fmt.Errorf("waiting: %w", context.Canceled))
	if !errors.Is(canceled, ErrCanceled) || errors.Is(canceled, ErrTimeout) || !errors.Is(canceled, context.Canceled) {
		t.Errorf("canceled: %v does not match exactly ErrCanceled and context.Canceled", canceled)
	}
	deadline := ContextError(context.DeadlineExceeded)
	if !errors.Is(deadline, ErrTimeout) || errors.Is(deadline, ErrCanceled) || !errors.Is(deadline, context.DeadlineExceeded) {
		t.Errorf("deadline: %v does not match exactly ErrTimeout and context.DeadlineExceeded", deadline)
	}
}
