package uring

import (
	"testing"
	"unsafe"
)

// TestABILayout pins every shared structure to the size and field offsets of
// include/uapi/linux/io_uring.h (x86-64 and arm64 agree: natural alignment, no packing surprises
// except buf_index, which is at its natural offset anyway).
func TestABILayout(t *testing.T) {
	var sqe SQE
	var cqe CQE
	var p Params
	var so sqringOffsets
	var co cqringOffsets
	cases := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(io_uring_sqe)", unsafe.Sizeof(sqe), 64},
		{"sqe.opcode", unsafe.Offsetof(sqe.Opcode), 0},
		{"sqe.flags", unsafe.Offsetof(sqe.Flags), 1},
		{"sqe.ioprio", unsafe.Offsetof(sqe.IOPrio), 2},
		{"sqe.fd", unsafe.Offsetof(sqe.Fd), 4},
		{"sqe.off/cmd_op", unsafe.Offsetof(sqe.Off), 8},
		{"sqe.addr", unsafe.Offsetof(sqe.Addr), 16},
		{"sqe.len", unsafe.Offsetof(sqe.Len), 24},
		{"sqe.rw_flags", unsafe.Offsetof(sqe.OpFlags), 28},
		{"sqe.user_data", unsafe.Offsetof(sqe.UserData), 32},
		{"sqe.buf_index", unsafe.Offsetof(sqe.BufIndex), 40},
		{"sqe.personality", unsafe.Offsetof(sqe.Personality), 42},
		{"sqe.splice_fd_in", unsafe.Offsetof(sqe.SpliceFdIn), 44},
		{"sqe.addr3/cmd", unsafe.Offsetof(sqe.Addr3), cmdOffset},
		{"sqe128 cmd area", cmdOffset + CmdSize, 128},
		{"sizeof(io_uring_cqe)", unsafe.Sizeof(cqe), 16},
		{"cqe.res", unsafe.Offsetof(cqe.Res), 8},
		{"cqe.flags", unsafe.Offsetof(cqe.Flags), 12},
		{"sizeof(io_sqring_offsets)", unsafe.Sizeof(so), 40},
		{"sq_off.array", unsafe.Offsetof(so.Array), 24},
		{"sq_off.user_addr", unsafe.Offsetof(so.UserAddr), 32},
		{"sizeof(io_cqring_offsets)", unsafe.Sizeof(co), 40},
		{"cq_off.cqes", unsafe.Offsetof(co.CQEs), 20},
		{"sizeof(io_uring_params)", unsafe.Sizeof(p), 120},
		{"params.features", unsafe.Offsetof(p.Features), 20},
		{"params.wq_fd", unsafe.Offsetof(p.WQFd), 24},
		{"params.sq_off", unsafe.Offsetof(p.SQOff), 40},
		{"params.cq_off", unsafe.Offsetof(p.CQOff), 80},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s = %d, kernel header says %d", c.name, c.got, c.want)
		}
	}
}

func TestSetCmdOp(t *testing.T) {
	var sqe SQE
	sqe.SetCmdOp(0xc0207504)
	b := (*[64]byte)(unsafe.Pointer(&sqe))
	got := *(*uint32)(unsafe.Pointer(&b[8]))
	if got != 0xc0207504 {
		t.Fatalf("cmd_op at offset 8 = %#x", got)
	}
	if pad := *(*uint32)(unsafe.Pointer(&b[12])); pad != 0 {
		t.Fatalf("__pad1 = %#x, want 0", pad)
	}
}
