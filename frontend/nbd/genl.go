package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// A small generic-netlink codec (linux/netlink.h, linux/genetlink.h): just enough to resolve a
// family id through nlctrl and to send the nbd family's commands (linux/nbd-netlink.h). Netlink
// integers are in host byte order; iser-blk builds for little-endian Linux only where it attaches.

const (
	nlmsgHdrLen  = 16 // len u32, type u16, flags u16, seq u32, pid u32
	genlHdrLen   = 4  // cmd u8, version u8, reserved u16
	nlaHdrLen    = 4  // len u16, type u16
	nlaFNested   = 1 << 15
	nlaTypeMask  = 0x3fff
	nlmsgError   = 2
	nlmsgDone    = 3
	nlmFRequest  = 1
	nlmFAck      = 4
	genlIDCtrl   = 0x10
	ctrlCmdGetFa = 3
	ctrlAttrID   = 1 // u16
	ctrlAttrName = 2 // NUL-terminated string
)

// nbd generic netlink family (include/uapi/linux/nbd-netlink.h).
const (
	nbdGenlName    = "nbd"
	nbdGenlVersion = 1

	nbdCmdConnect     = 1
	nbdCmdDisconnect  = 2
	nbdCmdReconfigure = 3 // new sockets for a configured device whose connections died

	nbdAttrIndex           = 1  // u32
	nbdAttrSizeBytes       = 2  // u64
	nbdAttrBlockSizeBytes  = 3  // u64
	nbdAttrTimeout         = 4  // u64, seconds
	nbdAttrServerFlags     = 5  // u64
	nbdAttrSockets         = 7  // nested: NBD_SOCK_ITEM { NBD_SOCK_FD }
	nbdAttrDeadConnTimeout = 8  // u64, seconds
	nbdAttrBackendID       = 10 // string

	nbdSockItem = 1
	nbdSockFD   = 1 // u32
)

// attrEncoder appends netlink attributes to a message buffer.
type attrEncoder struct{ b []byte }

func align4(n int) int { return (n + 3) &^ 3 }

func (e *attrEncoder) put(typ uint16, payload []byte) {
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(nlaHdrLen+len(payload)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	e.b = append(e.b, h[:]...)
	e.b = append(e.b, payload...)
	for len(e.b)%4 != 0 {
		e.b = append(e.b, 0)
	}
}

func (e *attrEncoder) u32(typ uint16, v uint32) {
	var p [4]byte
	binary.NativeEndian.PutUint32(p[:], v)
	e.put(typ, p[:])
}

func (e *attrEncoder) u64(typ uint16, v uint64) {
	var p [8]byte
	binary.NativeEndian.PutUint64(p[:], v)
	e.put(typ, p[:])
}

func (e *attrEncoder) str(typ uint16, s string) { e.put(typ, append([]byte(s), 0)) }

// nested appends an attribute whose payload is built by fn.
func (e *attrEncoder) nested(typ uint16, fn func(*attrEncoder)) {
	var inner attrEncoder
	fn(&inner)
	e.put(typ|nlaFNested, inner.b)
}

// genlMessage builds one generic netlink request.
func genlMessage(family uint16, flags uint16, seq uint32, cmd, version uint8, attrs []byte) []byte {
	n := nlmsgHdrLen + genlHdrLen + len(attrs)
	b := make([]byte, n)
	binary.NativeEndian.PutUint32(b[0:], uint32(n))
	binary.NativeEndian.PutUint16(b[4:], family)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b[16] = cmd
	b[17] = version
	copy(b[20:], attrs)
	return b
}

// nlMessage is one decoded netlink message.
type nlMessage struct {
	typ, flags uint16
	seq        uint32
	payload    []byte // after the netlink header
}

var errNetlinkShort = errors.New("nbd: truncated netlink message")

// parseMessages splits a datagram into netlink messages. It never reads outside b.
func parseMessages(b []byte) ([]nlMessage, error) {
	var out []nlMessage
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return out, errNetlinkShort
		}
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return out, errNetlinkShort
		}
		out = append(out, nlMessage{
			typ:     binary.NativeEndian.Uint16(b[4:]),
			flags:   binary.NativeEndian.Uint16(b[6:]),
			seq:     binary.NativeEndian.Uint32(b[8:]),
			payload: b[nlmsgHdrLen:l],
		})
		next := align4(l)
		if next >= len(b) {
			break
		}
		b = b[next:]
	}
	return out, nil
}

// nlError decodes the payload of an NLMSG_ERROR message: 0 is an acknowledgement.
func nlError(payload []byte) (syscall.Errno, error) {
	if len(payload) < 4 {
		return 0, errNetlinkShort
	}
	code := int32(binary.NativeEndian.Uint32(payload))
	if code > 0 {
		return 0, fmt.Errorf("nbd: netlink error code %d", code)
	}
	return syscall.Errno(-code), nil
}

// attribute is one decoded netlink attribute.
type attribute struct {
	typ     uint16 // without the NESTED / BYTEORDER bits
	payload []byte
}

// parseAttrs decodes a run of netlink attributes. It rejects lengths that do not fit and never
// reads outside b.
func parseAttrs(b []byte) ([]attribute, error) {
	var out []attribute
	for len(b) > 0 {
		if len(b) < nlaHdrLen {
			return out, errNetlinkShort
		}
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < nlaHdrLen || l > len(b) {
			return out, errNetlinkShort
		}
		out = append(out, attribute{typ: binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask, payload: b[nlaHdrLen:l]})
		next := align4(l)
		if next >= len(b) {
			break
		}
		b = b[next:]
	}
	return out, nil
}

func (a attribute) u16() (uint16, bool) {
	if len(a.payload) < 2 {
		return 0, false
	}
	return binary.NativeEndian.Uint16(a.payload), true
}

func (a attribute) u32() (uint32, bool) {
	if len(a.payload) < 4 {
		return 0, false
	}
	return binary.NativeEndian.Uint32(a.payload), true
}

// genlAttrs returns the attributes of a generic netlink message payload (after its genl header).
func genlAttrs(payload []byte) (cmd uint8, attrs []attribute, err error) {
	if len(payload) < genlHdrLen {
		return 0, nil, errNetlinkShort
	}
	attrs, err = parseAttrs(payload[genlHdrLen:])
	return payload[0], attrs, err
}
