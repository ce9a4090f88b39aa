package ublk

import (
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// request is a fetched request as serving it needs it, decoded from the tag's copy of the
// descriptor (ublk_cmd.h struct ublksrv_io_desc: the operation in op_flags' low 8 bits, the
// UBLK_IO_F_* flags above it, offset and length in 512-byte sectors).
type request struct {
	op    uint8
	flags uint32
	off   int64
	len   int64
}

func (t *tag) request() request {
	return request{op: uint8(t.opFlags & 0xff), flags: t.opFlags,
		off: int64(t.startSector) << sectorShift, len: int64(t.nrSectors) << sectorShift}
}

// transfers reports whether r moves data through the tag's buffer (READ, WRITE).
func (r request) transfers() bool { return r.op == opRead || r.op == opWrite }

// writeFlags is r's FUA as the Device takes it.
func (r request) writeFlags() block.WriteFlags {
	if r.flags&ioFFUA != 0 {
		return block.FUA
	}
	return 0
}

// serve performs one request on the Device and returns the driver's result (Server.result). It
// runs on the tag's worker goroutine.
func (s *Server) serve(t *tag) int32 {
	r := t.request()
	var err error
	switch r.op {
	case opRead, opWrite:
		if r.len > int64(len(t.buf)) || r.len == 0 {
			s.reqLog.Warn("ublk request larger than its buffer", zap.Uint8("op", r.op), zap.Int64("len", r.len), zap.Int("buf", len(t.buf)))
			return -int32(unix.EINVAL)
		}
		if r.op == opRead {
			err = s.dev.ReadAt(s.ioCtx, t.buf[:r.len], r.off)
		} else {
			err = s.dev.WriteAt(s.ioCtx, t.buf[:r.len], r.off, r.writeFlags())
		}
	case opFlush:
		err = s.dev.Flush(s.ioCtx)
	case opDiscard:
		err = s.dev.Discard(s.ioCtx, r.off, r.len)
	case opWriteZeroes:
		var f block.ZeroFlags
		if r.flags&ioFNoUnmap != 0 {
			f |= block.NoHole
		}
		if r.flags&ioFFUA != 0 {
			f |= block.ZeroFUA
		}
		err = s.dev.WriteZeroes(s.ioCtx, r.off, r.len, f)
	default:
		return -int32(unix.EOPNOTSUPP)
	}
	return s.result(r, err)
}

// result is what the driver is told of r, which ended with err: the byte count for READ/WRITE
// (the driver requeues the remainder of a short count, so a success must be whole), 0 for the
// others, or a negative errno (block.Errno), which the driver turns into a block status. A
// failure is logged.
func (s *Server) result(r request, err error) int32 {
	switch {
	case err != nil:
		s.reqLog.Warn("ublk request failed", zap.String("op", opName(r.op)), zap.Int64("off", r.off), zap.Int64("len", r.len), zap.Error(err))
		return -int32(block.Errno(err))
	case r.transfers():
		return int32(r.len)
	}
	return 0
}

func opName(op uint8) string {
	switch op {
	case opRead:
		return "read"
	case opWrite:
		return "write"
	case opFlush:
		return "flush"
	case opDiscard:
		return "discard"
	case opWriteSame:
		return "write_same"
	case opWriteZeroes:
		return "write_zeroes"
	}
	return "unknown"
}
