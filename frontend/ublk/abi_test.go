package ublk

import (
	"testing"
	"unsafe"
)

// TestABI pins sizes, offsets and ioctl numbers to include/uapi/linux/ublk_cmd.h (values computed
// from the header's _IOR/_IOWR macros and C layout rules).
func TestABI(t *testing.T) {
	var cc ctrlCmd
	var di DevInfo
	var d ioDesc
	var ic ioCmd
	var pb paramBasic
	var pd paramDiscard
	var p Params
	cases := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(ublksrv_ctrl_cmd)", unsafe.Sizeof(cc), sizeofCtrlCmd},
		{"ctrl_cmd.addr", unsafe.Offsetof(cc.Addr), 8},
		{"ctrl_cmd.data", unsafe.Offsetof(cc.Data), 16},
		{"ctrl_cmd.dev_path_len", unsafe.Offsetof(cc.DevPathLen), 24},
		{"sizeof(ublksrv_ctrl_dev_info)", unsafe.Sizeof(di), 64},
		{"dev_info.max_io_buf_bytes", unsafe.Offsetof(di.MaxIOBufBytes), 8},
		{"dev_info.dev_id", unsafe.Offsetof(di.DevID), 12},
		{"dev_info.ublksrv_pid", unsafe.Offsetof(di.UblksrvPID), 16},
		{"dev_info.flags", unsafe.Offsetof(di.Flags), 24},
		{"dev_info.owner_uid", unsafe.Offsetof(di.OwnerUID), 40},
		{"sizeof(ublksrv_io_desc)", unsafe.Sizeof(d), sizeofIODesc},
		{"io_desc.start_sector", unsafe.Offsetof(d.StartSector), 8},
		{"io_desc.addr", unsafe.Offsetof(d.Addr), 16},
		{"sizeof(ublksrv_io_cmd)", unsafe.Sizeof(ic), sizeofIOCmd},
		{"io_cmd.result", unsafe.Offsetof(ic.Result), 4},
		{"io_cmd.addr", unsafe.Offsetof(ic.Addr), 8},
		{"sizeof(ublk_param_basic)", unsafe.Sizeof(pb), 32},
		{"basic.max_sectors", unsafe.Offsetof(pb.MaxSectors), 8},
		{"basic.dev_sectors", unsafe.Offsetof(pb.DevSectors), 16},
		{"sizeof(ublk_param_discard)", unsafe.Sizeof(pd), 20},
		{"discard.max_discard_segments", unsafe.Offsetof(pd.MaxDiscardSegments), 16},
		{"params.basic", unsafe.Offsetof(p.Basic), 8},
		{"params.discard", unsafe.Offsetof(p.Discard), 40},
		{"params.devt", unsafe.Offsetof(p.Devt), 60},
		{"params.zoned", unsafe.Offsetof(p.Zoned), 76},
		{"sizeof(ublk_params) (6.12)", unsafe.Sizeof(p), 112},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s = %d, kernel header says %d", c.name, c.got, c.want)
		}
	}
	ops := []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", cmdGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", cmdAddDev, 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", cmdDelDev, 0xc0207505},
		{"UBLK_U_CMD_START_DEV", cmdStartDev, 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", cmdStopDev, 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", cmdSetParams, 0xc0207508},
		{"UBLK_U_CMD_GET_PARAMS", cmdGetParams, 0x80207509},
		{"UBLK_U_CMD_GET_FEATURES", cmdGetFeatures, 0x80207513},
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetch, 0xc0107521},
	}
	for _, o := range ops {
		if o.got != o.want {
			t.Errorf("%s = %#x, want %#x", o.name, o.got, o.want)
		}
	}
}
