package ublk

import (
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// serve performs one request on the Device and returns the driver's result: the byte count for
// READ/WRITE (the driver requeues the remainder of a short count, so a success must be whole),
// 0 for FLUSH/DISCARD/WRITE_ZEROES, or a negative errno (block.Errno), which the driver turns into
// a block status. It runs on the tag's worker goroutine.
func (s *Server) serve(t *tag) int32 {
	op := uint8(t.opFlags & 0xff)
	off := int64(t.startSector) << sectorShift
	n := int64(t.nrSectors) << sectorShift
	var err error
	switch op {
	case opRead, opWrite:
		if n > int64(len(t.buf)) || n == 0 {
			s.reqLog.Warn("ublk request larger than its buffer", zap.Uint8("op", op), zap.Int64("len", n), zap.Int("buf", len(t.buf)))
			return -int32(unix.EINVAL)
		}
		if op == opRead {
			err = s.dev.ReadAt(s.ioCtx, t.buf[:n], off)
		} else {
			var f block.WriteFlags
			if t.opFlags&ioFFUA != 0 {
				f |= block.FUA
			}
			err = s.dev.WriteAt(s.ioCtx, t.buf[:n], off, f)
		}
	case opFlush:
		err = s.dev.Flush(s.ioCtx)
	case opDiscard:
		err = s.dev.Discard(s.ioCtx, off, n)
	case opWriteZeroes:
		var f block.ZeroFlags
		if t.opFlags&ioFNoUnmap != 0 {
			f |= block.NoHole
		}
		if t.opFlags&ioFFUA != 0 {
			f |= block.ZeroFUA
		}
		err = s.dev.WriteZeroes(s.ioCtx, off, n, f)
	default:
		return -int32(unix.EOPNOTSUPP)
	}
	if err != nil {
		s.reqLog.Warn("ublk request failed", zap.String("op", opName(op)), zap.Int64("off", off), zap.Int64("len", n), zap.Error(err))
		return -int32(block.Errno(err))
	}
	if op != opRead && op != opWrite {
		return 0
	}
	return int32(n)
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
