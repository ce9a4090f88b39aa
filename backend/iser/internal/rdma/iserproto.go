package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
)

// iSER wire format (RFC 7145 §9.2; Linux include/scsi/iser.h struct iser_ctrl): every iSCSI
// control-type PDU sent as an RDMA Send is preceded by a 28-byte iSER header.
//
//	byte 0      flags: opcode in the high nibble (0x1 iSCSI control-type, 0x2 Hello, 0x3 HelloReply),
//	            WSV 0x08 (Write STag valid), RSV 0x04 (Read STag valid)
//	bytes 1-3   reserved
//	bytes 4-7   Write STag: the initiator's buffer the target RDMA-Reads (SCSI write data)
//	bytes 8-15  Write Base Offset: its virtual address (no ZBVA: a real address)
//	bytes 16-19 Read STag: the initiator's buffer the target RDMA-Writes (SCSI read data)
//	bytes 20-27 Read Base Offset
const HeaderLen = 28

// iSER header flag bits.
const (
	OpcodeControl    = 0x10 // iSCSI control-type PDU follows
	OpcodeHello      = 0x20 // iSER Hello (not used by Linux stacks, RFC 7145 §9.3)
	OpcodeHelloReply = 0x30
	opcodeMask       = 0xf0
	FlagWSV          = 0x08
	FlagRSV          = 0x04
)

// CM private data flags (RFC 7145 §9.1 "iSER CM REQ Message Format"; Linux struct iser_cm_hdr).
const (
	CMZBVANotSupported       = 0x80 // we send real virtual addresses, not zero-based offsets
	CMSendWInvNotSupported   = 0x40 // the target must not use Send with Invalidate
	CMPrivateDataLen         = 4
	defaultRecvDataSegLength = 8192 // RFC 7145 §6.4-6.5 default for both RecvDataSegmentLength keys
)

// Header is a decoded iSER header.
type Header struct {
	Flags     uint8
	WriteSTag uint32
	WriteVA   uint64
	ReadSTag  uint32
	ReadVA    uint64
}

// ErrMalformedHeader is returned for an iSER header we cannot accept.
var ErrMalformedHeader = errors.New("iser: malformed header")

// Encode writes the header into b[:HeaderLen].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderLen-1]
	b[0], b[1], b[2], b[3] = h.Flags, 0, 0, 0
	binary.BigEndian.PutUint32(b[4:], h.WriteSTag)
	binary.BigEndian.PutUint64(b[8:], h.WriteVA)
	binary.BigEndian.PutUint32(b[16:], h.ReadSTag)
	binary.BigEndian.PutUint64(b[20:], h.ReadVA)
}

// decodeHeader parses the iSER header of a received Send. Only iSCSI control-type PDUs are
// accepted: Hello/HelloReply are not part of the Linux-compatible CM private-data handshake. STags a
// target might set are ignored: an initiator never RDMA-accesses target memory.
func decodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: %d bytes, need %d", ErrMalformedHeader, len(b), HeaderLen)
	}
	h := Header{
		Flags:     b[0],
		WriteSTag: binary.BigEndian.Uint32(b[4:]),
		WriteVA:   binary.BigEndian.Uint64(b[8:]),
		ReadSTag:  binary.BigEndian.Uint32(b[16:]),
		ReadVA:    binary.BigEndian.Uint64(b[20:]),
	}
	switch h.Flags & opcodeMask {
	case OpcodeControl:
	case OpcodeHello, OpcodeHelloReply:
		return h, fmt.Errorf("%w: iSER Hello/HelloReply (flags %#02x) not supported", ErrMalformedHeader, h.Flags)
	default:
		return h, fmt.Errorf("%w: unknown iSER opcode (flags %#02x)", ErrMalformedHeader, h.Flags)
	}
	return h, nil
}

// CMPrivateData is the iSER CM REQ private data a Linux initiator sends: no zero-based virtual
// addresses, no Send with Invalidate (we advertise whole pool-region keys, which must never be
// invalidated remotely).
func CMPrivateData() []byte {
	return []byte{CMZBVANotSupported | CMSendWInvNotSupported, 0, 0, 0}
}

// Login keys of RFC 7145 §6.
const (
	keyRDMAExtensions     = "RDMAExtensions"
	keyInitiatorRecvDSL   = "InitiatorRecvDataSegmentLength"
	keyTargetRecvDSL      = "TargetRecvDataSegmentLength"
	keyMaxOutstandingUnex = "MaxOutstandingUnexpectedPDUs"
)

// loginHook negotiates the iSER keys (RFC 7145 §6) for the iSCSI login package.
//
//   - RDMAExtensions=Yes (§6.3) is offered in the first operational request; a target that does not
//     answer Yes is not an iSER portal and the login fails.
//   - InitiatorRecvDataSegmentLength (§6.5) and TargetRecvDataSegmentLength (§6.4) have the result
//     function Minimum: we offer the sizes our receive descriptors and the target's documented
//     receive buffers hold (8192), and the answer can only shrink them.
//   - MaxOutstandingUnexpectedPDUs (§6.6, Minimum, 0 = no limit) declares how many unsolicited
//     PDUs (NOP-In, Async) we have receive descriptors for beyond the command window. LIO does not
//     know the key and answers NotUnderstood; that leaves it at its default.
//   - Digests are turned off: RDMA has its own CRC (§6.1: digests are not used with iSER).
//   - InitialR2T=Yes: data beyond immediate data is fetched by the target's RDMA Read, which is one
//     operation instead of many 8 KiB unsolicited Data-Out Sends.
type loginHook struct {
	irdsl, trdsl, unexpected uint32 // offered

	rdmaExt                          bool
	finalIRDSL, finalTRDSL, finalMOU uint32
}

func newLoginHook(irdsl, trdsl, unexpected uint32) *loginHook {
	return &loginHook{irdsl: irdsl, trdsl: trdsl, unexpected: unexpected,
		finalIRDSL: irdsl, finalTRDSL: trdsl, finalMOU: unexpected}
}

func (h *loginHook) Propose(p *login.Proposal) []login.KeyValue {
	p.HeaderDigest, p.DataDigest = login.DigestNone, login.DigestNone
	p.InitialR2T = true
	p.MaxRecvDataSegmentLength = h.irdsl
	if p.MaxBurstLength > 1<<24-1 {
		p.MaxBurstLength = 1<<24 - 1 // RFC 7143 §13.13 upper bound
	}
	if p.FirstBurstLength > p.MaxBurstLength {
		p.FirstBurstLength = p.MaxBurstLength
	}
	return []login.KeyValue{
		{Key: keyRDMAExtensions, Value: "Yes"},
		{Key: keyInitiatorRecvDSL, Value: strconv.FormatUint(uint64(h.irdsl), 10)},
		{Key: keyTargetRecvDSL, Value: strconv.FormatUint(uint64(h.trdsl), 10)},
		{Key: keyMaxOutstandingUnex, Value: strconv.FormatUint(uint64(h.unexpected), 10)},
	}
}

func isNegotiationFailure(v string) bool {
	return v == "NotUnderstood" || v == "Irrelevant" || v == "Reject"
}

func parseSegLen(key, v string) (uint32, error) {
	n, err := strconv.ParseUint(v, 0, 32)
	if err != nil || n < 512 || n > 1<<24-1 {
		return 0, fmt.Errorf("%s=%q: not a length in 512..16777215", key, v)
	}
	return uint32(n), nil
}

func (h *loginHook) Accept(key, v string) (reply string, handled bool, err error) {
	switch key {
	case keyRDMAExtensions:
		if v == "Yes" {
			h.rdmaExt = true
			return "", true, nil
		}
		return "", true, fmt.Errorf("target answered RDMAExtensions=%s: the portal does not speak iSER", v)
	case keyInitiatorRecvDSL, keyTargetRecvDSL:
		if isNegotiationFailure(v) {
			return "", true, nil // keeps the default, which is what we offered
		}
		n, err := parseSegLen(key, v)
		if err != nil {
			return "", true, err
		}
		if key == keyInitiatorRecvDSL {
			h.finalIRDSL = min(h.irdsl, n)
		} else {
			h.finalTRDSL = min(h.trdsl, n)
		}
		return "", true, nil
	case keyMaxOutstandingUnex:
		if isNegotiationFailure(v) {
			h.finalMOU = 0
			return "", true, nil
		}
		n, err := strconv.ParseUint(v, 0, 32)
		if err != nil {
			return "", true, fmt.Errorf("%s=%q: not a number", key, v)
		}
		switch {
		case n == 0:
			h.finalMOU = h.unexpected
		case h.unexpected == 0:
			h.finalMOU = uint32(n)
		default:
			h.finalMOU = min(h.unexpected, uint32(n))
		}
		return "", true, nil
	}
	return "", false, nil
}

func (h *loginHook) Finish(p *login.Params) error {
	if p.TargetName == "" {
		return nil // discovery: RDMAExtensions is irrelevant there
	}
	if !h.rdmaExt {
		return errors.New("target did not accept RDMAExtensions=Yes: the portal does not speak iSER")
	}
	if p.HeaderDigest || p.DataDigest {
		return errors.New("target negotiated iSCSI digests, which iSER does not use")
	}
	p.MaxRecvDataSegmentLength = h.finalIRDSL
	p.TargetMaxRecvDataSegmentLength = h.finalTRDSL
	// tgt's iSER login path (fujita/tgt usr/iscsi/iser_text.c, iser_login_exec) creates the
	// session expecting the login's CmdSN as the first command's, then answers the final login
	// with ExpCmdSN = that CmdSN + 1 and MaxCmdSN = that CmdSN: a closed window that no response
	// would ever reopen. The first full-feature command must carry the login's CmdSN anyway
	// (RFC 7143 §11.12.6: login requests are immediate and consume no CmdSN), which is MaxCmdSN
	// here; a target that really closed its window at login would have nothing to offer either.
	if p.MaxCmdSN == p.ExpCmdSN-1 {
		p.ExpCmdSN = p.MaxCmdSN
	}
	if p.Extra == nil {
		p.Extra = map[string]string{}
	}
	p.Extra[keyRDMAExtensions] = "Yes"
	p.Extra[keyInitiatorRecvDSL] = strconv.FormatUint(uint64(h.finalIRDSL), 10)
	p.Extra[keyTargetRecvDSL] = strconv.FormatUint(uint64(h.finalTRDSL), 10)
	p.Extra[keyMaxOutstandingUnex] = strconv.FormatUint(uint64(h.finalMOU), 10)
	return nil
}
