package session

import (
	"encoding/binary"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// rw16 builds READ(16)/WRITE(16) (SBC-4 §5.16, §5.40) for 512-byte blocks on LUN 1.
func rw16(cmd *scsi.Command, write bool, off int64, buf []byte) {
	*cmd = scsi.Command{LUN: scsi.EncodeLUN(1), CDBLen: 16, Data: buf, Attr: scsi.AttrSimple}
	cmd.CDB[0] = 0x88
	cmd.Dir = scsi.DirRead
	if write {
		cmd.CDB[0] = 0x8a
		cmd.Dir = scsi.DirWrite
	}
	binary.BigEndian.PutUint64(cmd.CDB[2:10], uint64(off/512))
	binary.BigEndian.PutUint32(cmd.CDB[10:14], uint32(len(buf)/512))
}

// tur builds TEST UNIT READY.
func tur() *scsi.Command {
	return &scsi.Command{LUN: scsi.EncodeLUN(1), CDBLen: 6, Dir: scsi.DirNone, Attr: scsi.AttrSimple}
}
