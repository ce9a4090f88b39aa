package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/iser-blk/iser-blk/block"
)

// Wire constants of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md, "Values"). They are
// defined here, untyped so they fit every field width, because github.com/pojntfx/go-nbd's
// protocol package lacks most of the transmission-phase values (FLUSH, TRIM, WRITE_ZEROES, CACHE,
// structured replies); every value it does have is checked against ours in wire_test.go.
const (
	magicNBD        = 0x4e42444d41474943 // "NBDMAGIC" (INIT_PASSWD)
	magicOption     = 0x49484156454F5054 // "IHAVEOPT"
	magicOptReply   = 0x3e889045565a9    // option reply magic
	magicRequest    = 0x25609513         // NBD_REQUEST_MAGIC
	magicSimple     = 0x67446698         // NBD_SIMPLE_REPLY_MAGIC
	magicStructured = 0x668e33ef         // NBD_STRUCTURED_REPLY_MAGIC
)

// Handshake flags (server) and client flags ("Handshake flags", "Client flags").
const (
	flagFixedNewstyle  = 1 << 0
	flagNoZeroes       = 1 << 1
	cflagFixedNewstyle = 1 << 0
	cflagNoZeroes      = 1 << 1
)

// Transmission flags ("Transmission flags").
const (
	flagHasFlags        = 1 << 0
	flagReadOnly        = 1 << 1
	flagSendFlush       = 1 << 2
	flagSendFUA         = 1 << 3
	flagRotational      = 1 << 4
	flagSendTrim        = 1 << 5
	flagSendWriteZeroes = 1 << 6
	flagSendDF          = 1 << 7
	FlagCanMultiConn    = 1 << 8
	flagSendResize      = 1 << 9
	flagSendCache       = 1 << 10
	flagSendFastZero    = 1 << 11
)

// Options ("Option types").
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optPeekExport      = 4
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
	optListMetaContext = 9
	optSetMetaContext  = 10
	optExtendedHeaders = 11
)

// Option replies ("Option reply types"); errors have bit 31 set.
const (
	repAck           = 1
	repServer        = 2
	repInfo          = 3
	repErrUnsup      = 1<<31 + 1
	repErrPolicy     = 1<<31 + 2
	repErrInvalid    = 1<<31 + 3
	repErrPlatform   = 1<<31 + 4
	repErrTLSReqd    = 1<<31 + 5
	repErrUnknown    = 1<<31 + 6
	repErrShutdown   = 1<<31 + 7
	repErrBlockSzReq = 1<<31 + 8
	repErrTooBig     = 1<<31 + 9
)

// Information types of NBD_REP_INFO (NBD_OPT_INFO / NBD_OPT_GO).
const (
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3
)

// Commands ("Request types").
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdBlockStatus = 7
	cmdResize      = 8
)

// Command flags ("Command flags").
const (
	cmdFlagFUA      = 1 << 0
	cmdFlagNoHole   = 1 << 1
	cmdFlagDF       = 1 << 2
	cmdFlagReqOne   = 1 << 3
	cmdFlagFastZero = 1 << 4
)

// Structured reply flags and chunk types ("Structured reply flags", "Structured reply types").
const (
	replyFlagDone        = 1 << 0
	replyTypeNone        = 0
	replyTypeOffsetData  = 1
	replyTypeError       = 1<<15 + 1
	replyTypeErrorOffset = 1<<15 + 2
)

// Error values ("Error values"). Only these may appear on the wire.
const (
	eperm     = 1
	eio       = 5
	enomem    = 12
	einval    = 22
	enospc    = 28
	eoverflow = 75
	enotsup   = 95
	eshutdown = 108
)

// Sizes of fixed wire structures.
const (
	requestHeaderLen  = 28 // magic, flags, type, handle, offset, length
	simpleReplyLen    = 16 // magic, error, handle
	structuredHdrLen  = 20 // magic, flags, type, handle, length
	optionHeaderLen   = 16 // magic, option, length
	optReplyHeaderLen = 20 // magic, option, type, length
)

// MaxPayload is the largest READ/WRITE this server accepts and advertises (2^25 bytes). The spec
// ("Block size constraints") says lengths below 2^25 SHOULD NOT be treated as a denial of service
// and that the maximum SHOULD be at least 2^25 when the export is that large; the Linux client
// sends requests up to 32 MiB (max_hw_sectors 65536).
const MaxPayload = 1 << 25

// maxOptionLen bounds the data of one handshake option. The largest legitimate one is NBD_OPT_GO
// with a 4096-byte name and a list of info requests; anything far larger is a denial of service
// and ends the connection.
const maxOptionLen = 64 << 10

// maxStringLen is the spec's hard limit on names ("Conventions": strings MUST be no longer than
// 4096 bytes).
const maxStringLen = 4096

// header is one decoded transmission-phase request header ("Request message").
type header struct {
	Flags  uint16
	Type   uint16
	Handle uint64
	Offset uint64
	Length uint32
}

// errBadMagic reports a request header without NBD_REQUEST_MAGIC: the stream is out of sync and
// the connection must end.
var errBadMagic = errors.New("nbd: bad request magic")

// parseRequest decodes a request header. A wrong magic is the only error: every other field is
// validated against the export by validate.
func parseRequest(b *[requestHeaderLen]byte) (header, error) {
	if m := binary.BigEndian.Uint32(b[0:4]); m != magicRequest {
		return header{}, fmt.Errorf("%w %#08x", errBadMagic, m)
	}
	return header{
		Flags:  binary.BigEndian.Uint16(b[4:6]),
		Type:   binary.BigEndian.Uint16(b[6:8]),
		Handle: binary.BigEndian.Uint64(b[8:16]),
		Offset: binary.BigEndian.Uint64(b[16:24]),
		Length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

// putRequest encodes a request header (used by tests and the fuzz corpus).
func putRequest(b []byte, r header) {
	binary.BigEndian.PutUint32(b[0:4], magicRequest)
	binary.BigEndian.PutUint16(b[4:6], r.Flags)
	binary.BigEndian.PutUint16(b[6:8], r.Type)
	binary.BigEndian.PutUint64(b[8:16], r.Handle)
	binary.BigEndian.PutUint64(b[16:24], r.Offset)
	binary.BigEndian.PutUint32(b[24:28], r.Length)
}

// export is what validation needs to know about the negotiated export.
type export struct {
	size       uint64
	minBlock   uint32
	tflags     uint16 // transmission flags sent to the client
	structured bool
}

// verdict is the outcome of validating a request header.
type verdict int

const (
	verdictOK         verdict = iota
	verdictReply              // answer with errno, the connection continues (payload, if any, consumed)
	verdictDisconnect         // the request cannot be answered without risking the stream: hard disconnect
)

// allowedFlags lists the command flags valid for each command under the negotiated flags
// ("Command flags": FUA is valid on every command once SEND_FUA is negotiated; NO_HOLE and
// FAST_ZERO only on WRITE_ZEROES; DF only on READ with structured replies).
func (e *export) allowedFlags(cmd uint16) uint16 {
	var f uint16
	if e.tflags&flagSendFUA != 0 {
		f |= cmdFlagFUA
	}
	switch cmd {
	case cmdRead:
		if e.structured && e.tflags&flagSendDF != 0 {
			f |= cmdFlagDF
		}
	case cmdWriteZeroes:
		f |= cmdFlagNoHole
		if e.tflags&flagSendFastZero != 0 {
			f |= cmdFlagFastZero
		}
	}
	return f
}

// hasPayload reports whether a request of this type carries length bytes of data after its header.
func hasPayload(r *header) bool { return r.Type == cmdWrite }

// validate checks a request against the export. It returns the NBD error to reply with, and
// whether the connection must end instead. Its rules follow proto.md "Error values" and "Block size
// constraints": unknown commands and flags -> EINVAL; writes on a read-only export -> EPERM; a
// write past the end -> ENOSPC, any other request past the end or misaligned -> EINVAL; READ over
// the maximum -> EINVAL (EOVERFLOW with DF); a WRITE payload over the maximum is a denial of
// service, so the connection ends rather than buffering it.
func (e *export) validate(r *header) (verdict, uint32) {
	switch r.Type {
	case cmdRead, cmdWrite, cmdFlush, cmdTrim, cmdCache, cmdWriteZeroes:
	default:
		return verdictReply, einval
	}
	if r.Type == cmdWrite && r.Length > MaxPayload {
		return verdictDisconnect, einval
	}
	if r.Flags&^e.allowedFlags(r.Type) != 0 {
		return verdictReply, einval
	}
	ro := e.tflags&flagReadOnly != 0
	switch r.Type {
	case cmdFlush:
		return verdictOK, 0 // offset and length are reserved; tolerate garbage in them
	case cmdWrite, cmdTrim, cmdWriteZeroes:
		if ro {
			return verdictReply, eperm
		}
	}
	switch r.Type {
	case cmdTrim:
		if e.tflags&flagSendTrim == 0 {
			return verdictReply, einval
		}
	case cmdWriteZeroes:
		if e.tflags&flagSendWriteZeroes == 0 {
			return verdictReply, einval
		}
	}
	if r.Length == 0 {
		return verdictReply, einval
	}
	if r.Type == cmdRead && r.Length > MaxPayload {
		if r.Flags&cmdFlagDF != 0 {
			return verdictReply, eoverflow
		}
		return verdictReply, einval
	}
	if r.Type == cmdCache && r.Length > MaxPayload {
		return verdictReply, einval
	}
	bs := uint64(e.minBlock)
	if bs > 1 && (r.Offset%bs != 0 || uint64(r.Length)%bs != 0) {
		return verdictReply, einval
	}
	if r.Offset > e.size || uint64(r.Length) > e.size-r.Offset {
		if r.Type == cmdWrite || r.Type == cmdWriteZeroes {
			return verdictReply, enospc
		}
		return verdictReply, einval
	}
	return verdictOK, 0
}

// wireErrno maps a Device error to an NBD error value (block.Errno, then narrowed to the values
// proto.md allows; EROFS becomes EPERM as the spec asks for writes on a read-only export).
func wireErrno(err error) uint32 {
	switch block.Errno(err) {
	case 0:
		return 0
	case syscall.EINVAL:
		return einval
	case syscall.EROFS, syscall.EPERM:
		return eperm
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		return enospc
	case syscall.EOPNOTSUPP:
		return enotsup
	case syscall.ESHUTDOWN:
		return eshutdown
	case syscall.EOVERFLOW:
		return eoverflow
	default:
		return eio
	}
}

// errnoText is the human-readable message sent in structured error chunks. Static strings keep
// the error path free of allocations.
func errnoText(e uint32) string {
	switch e {
	case eperm:
		return "operation not permitted (read-only export)"
	case eio:
		return "input/output error"
	case enomem:
		return "out of memory"
	case einval:
		return "invalid request"
	case enospc:
		return "no space left on device"
	case eoverflow:
		return "request too large"
	case enotsup:
		return "operation not supported"
	case eshutdown:
		return "server is shutting down"
	default:
		return "error"
	}
}

// goRequest is the decoded data of NBD_OPT_INFO / NBD_OPT_GO: the export name and the
// information types the client asked for.
type goRequest struct {
	name  string
	infos []uint16
}

var errOptionInvalid = errors.New("nbd: malformed option data")

// parseGoRequest decodes NBD_OPT_INFO/NBD_OPT_GO data: 32-bit name length, name, 16-bit count,
// count 16-bit information types (proto.md, "NBD_OPT_INFO").
func parseGoRequest(data []byte) (goRequest, error) {
	if len(data) < 6 {
		return goRequest{}, errOptionInvalid
	}
	nl := binary.BigEndian.Uint32(data[0:4])
	if nl > maxStringLen || uint64(nl)+6 > uint64(len(data)) {
		return goRequest{}, errOptionInvalid
	}
	name := string(data[4 : 4+nl])
	rest := data[4+nl:]
	n := int(binary.BigEndian.Uint16(rest[0:2]))
	rest = rest[2:]
	if len(rest) != 2*n {
		return goRequest{}, errOptionInvalid
	}
	infos := make([]uint16, n)
	for i := range infos {
		infos[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return goRequest{name: name, infos: infos}, nil
}
