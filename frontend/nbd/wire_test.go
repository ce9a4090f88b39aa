package nbd

import (
	"testing"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Our wire constants against github.com/pojntfx/go-nbd's, an independent transcription of the
// same spec: a typo in either shows up here rather than as a client that cannot connect.
func TestWireConstantsMatchGoNBD(t *testing.T) {
	cases := []struct {
		name       string
		ours, them uint64
	}{
		{"NBDMAGIC", magicNBD, protocol.NEGOTIATION_MAGIC_OLDSTYLE},
		{"IHAVEOPT", magicOption, protocol.NEGOTIATION_MAGIC_OPTION},
		{"option reply magic", magicOptReply, protocol.NEGOTIATION_MAGIC_REPLY},
		{"FIXED_NEWSTYLE", flagFixedNewstyle, uint64(protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE)},
		{"OPT_ABORT", optAbort, uint64(protocol.NEGOTIATION_ID_OPTION_ABORT)},
		{"OPT_LIST", optList, uint64(protocol.NEGOTIATION_ID_OPTION_LIST)},
		{"OPT_INFO", optInfo, uint64(protocol.NEGOTIATION_ID_OPTION_INFO)},
		{"OPT_GO", optGo, uint64(protocol.NEGOTIATION_ID_OPTION_GO)},
		{"REP_ACK", repAck, uint64(protocol.NEGOTIATION_TYPE_REPLY_ACK)},
		{"REP_SERVER", repServer, uint64(protocol.NEGOTIATION_TYPE_REPLY_SERVER)},
		{"REP_INFO", repInfo, uint64(protocol.NEGOTIATION_TYPE_REPLY_INFO)},
		{"REP_ERR_UNSUP", repErrUnsup, uint64(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED)},
		{"REP_ERR_UNKNOWN", repErrUnknown, uint64(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN)},
		{"INFO_EXPORT", infoExport, uint64(protocol.NEGOTIATION_TYPE_INFO_EXPORT)},
		{"INFO_NAME", infoName, uint64(protocol.NEGOTIATION_TYPE_INFO_NAME)},
		{"INFO_DESCRIPTION", infoDescription, uint64(protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION)},
		{"INFO_BLOCK_SIZE", infoBlockSize, uint64(protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE)},
		{"FLAG_HAS_FLAGS", flagHasFlags, uint64(protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS)},
		{"FLAG_CAN_MULTI_CONN", FlagCanMultiConn, uint64(protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN)},
		{"REQUEST_MAGIC", magicRequest, uint64(protocol.TRANSMISSION_MAGIC_REQUEST)},
		{"SIMPLE_REPLY_MAGIC", magicSimple, uint64(protocol.TRANSMISSION_MAGIC_REPLY)},
		{"CMD_READ", cmdRead, uint64(protocol.TRANSMISSION_TYPE_REQUEST_READ)},
		{"CMD_WRITE", cmdWrite, uint64(protocol.TRANSMISSION_TYPE_REQUEST_WRITE)},
		{"CMD_DISC", cmdDisc, uint64(protocol.TRANSMISSION_TYPE_REQUEST_DISC)},
		{"EPERM", eperm, uint64(protocol.TRANSMISSION_ERROR_EPERM)},
		{"EINVAL", einval, uint64(protocol.TRANSMISSION_ERROR_EINVAL)},
	}
	for _, c := range cases {
		if c.ours != c.them {
			t.Errorf("%s: ours 0x%x, go-nbd 0x%x", c.name, c.ours, c.them)
		}
	}
}
