// Package login implements the iSCSI login phase (RFC 7143 §6, §11.12-13, §12, §13): the text
// key=value codec, the security stage (AuthMethod None or CHAP/MD5, one-way or mutual), operational
// negotiation of every RFC 7143 §13 key, login redirection and typed errors.
//
// Invariants:
//   - Login owns the connection until it returns; the caller (the session) handles dialing,
//     following a *RedirectError a bounded number of times, and cancellation (it closes the Conn).
//   - Secrets never appear in errors or logs.
//   - The result, Params, starts from the RFC defaults (Defaults) and changes only by a completed
//     negotiation; a transport adds and consumes its own keys through a Hook.
package login

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// Conn is what login needs from a transport connection (transport.Conn satisfies it).
type Conn interface {
	WritePDU(bhs *pdu.BHS, ahs, data []byte) error
	ReadHeader(bhs *pdu.BHS) ([]byte, error)
	ReadData(dst []byte) error
	DiscardData() error
	RemoteAddr() string
}

// Hook lets a transport negotiate its own keys (iSER: RDMAExtensions, InitiatorRecvDataSegmentLength,
// TargetRecvDataSegmentLength, MaxOutstandingUnexpectedPDUs; RFC 7145 §6).
type Hook interface {
	// Propose may change the standard proposal (e.g. iSER turns digests off) and returns extra keys
	// to offer in the operational stage.
	Propose(p *Proposal) []KeyValue
	// Accept sees every key from the target the login package does not know (answers to the
	// extra keys, or target offers). reply, if not empty, is sent back for that key. handled=false
	// makes login answer NotUnderstood.
	Accept(key, value string) (reply string, handled bool, err error)
	// Finish sees the final parameters; it may record extra results in p.Extra or reject the login.
	// It may also rewrite the segment limits the session uses: with RDMAExtensions=Yes (RFC 7145
	// §6.3) MaxRecvDataSegmentLength is replaced by InitiatorRecvDataSegmentLength (store it in
	// p.MaxRecvDataSegmentLength) and TargetRecvDataSegmentLength (store it in
	// p.TargetMaxRecvDataSegmentLength), and digests must be off.
	Finish(p *Params) error
}

// Digest is a digest preference for HeaderDigest/DataDigest (RFC 7143 §13.1).
type Digest uint8

const (
	DigestNone         Digest = iota // offer None only
	DigestCRC32C                     // require CRC32C
	DigestPreferCRC32C               // offer CRC32C,None
	DigestPreferNone                 // offer None,CRC32C
)

func (d Digest) offer() string {
	switch d {
	case DigestCRC32C:
		return "CRC32C"
	case DigestPreferCRC32C:
		return "CRC32C,None"
	case DigestPreferNone:
		return "None,CRC32C"
	}
	return "None"
}

func (d Digest) accepts(v string) bool {
	switch v {
	case "None":
		return d != DigestCRC32C
	case "CRC32C":
		return d != DigestNone
	}
	return false
}

// Proposal is what we offer in operational negotiation (RFC 7143 §13).
type Proposal struct {
	HeaderDigest, DataDigest Digest
	MaxConnections           uint32
	InitialR2T               bool
	ImmediateData            bool
	MaxRecvDataSegmentLength uint32 // what we declare: the largest segment we accept
	MaxBurstLength           uint32
	FirstBurstLength         uint32
	DefaultTime2Wait         uint32 // seconds
	DefaultTime2Retain       uint32 // seconds
	MaxOutstandingR2T        uint32
	DataPDUInOrder           bool
	DataSequenceInOrder      bool
	ErrorRecoveryLevel       uint8
}

// DefaultProposal asks for what makes a fast ERL-0 initiator: large segments and bursts, immediate
// and unsolicited data, several outstanding R2Ts, no digests.
func DefaultProposal() Proposal {
	return Proposal{
		MaxConnections:           1,
		InitialR2T:               false,
		ImmediateData:            true,
		MaxRecvDataSegmentLength: 256 << 10,
		MaxBurstLength:           16<<20 - 1024, // the 24-bit maximum rounded down to 1 KiB
		FirstBurstLength:         256 << 10,
		DefaultTime2Wait:         2,
		DefaultTime2Retain:       0,
		MaxOutstandingR2T:        8,
		DataPDUInOrder:           true,
		DataSequenceInOrder:      true,
		ErrorRecoveryLevel:       0,
	}
}

// Config describes one login attempt.
type Config struct {
	InitiatorName  string // IQN or EUI (required)
	InitiatorAlias string
	TargetName     string // required unless Discovery
	Discovery      bool   // SessionType=Discovery (§13.21)
	ISID           uint64 // 48-bit; the session keeps it across reinstatements
	TSIH           uint16 // 0 for a new session or reinstatement (§4.4.3)
	CID            uint16
	ITT            uint32 // the login task tag
	CmdSN          uint32 // initial CmdSN
	ExpStatSN      uint32 // for a new connection of an existing session; 0 otherwise
	CHAP           *CHAP  // nil: AuthMethod=None
	Proposal       Proposal
	Hook           Hook
	Logger         *zap.Logger
}

// maxLoginSegment is the data segment size during login (§13.12: MaxRecvDataSegmentLength
// defaults to 8192 until the full-feature phase).
const maxLoginSegment = 8192

// maxLoginRounds bounds request/response rounds so a target cannot keep us negotiating forever.
const maxLoginRounds = 32

type loginState struct {
	ctx    context.Context
	cfg    *Config
	c      Conn
	log    *zap.Logger
	params Params

	haveStatSN bool
	expStatSN  uint32
	rounds     int

	pending map[string]string // keys we offered → offered value, awaiting a response
	done    map[string]bool   // keys already negotiated
	replies []KeyValue        // answers to target offers, sent in the next PDU

	rx []byte // accumulated response text
}

// Login runs the login phase on c (RFC 7143 §6.3) and returns the negotiated parameters. A
// redirection returns *RedirectError; a target refusal returns *Error naming the target.
func Login(ctx context.Context, c Conn, cfg *Config) (*Params, error) {
	if cfg.InitiatorName == "" {
		return nil, fmt.Errorf("%w: no initiator name", ErrConfig)
	}
	if !cfg.Discovery && cfg.TargetName == "" {
		return nil, fmt.Errorf("%w: no target name for a normal session", ErrConfig)
	}
	if cfg.CHAP != nil && cfg.CHAP.Mutual() && cfg.CHAP.TargetSecret == cfg.CHAP.Secret {
		// RFC 7143 §12.1.3: the same secret must not authenticate both directions.
		return nil, fmt.Errorf("%w: the mutual CHAP secret must differ from the initiator's secret", ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &loginState{
		ctx: ctx, cfg: cfg, c: c, log: log,
		params:  Defaults(),
		pending: map[string]string{},
		done:    map[string]bool{},
	}
	s.params.ISID, s.params.CID, s.params.TargetName = cfg.ISID, cfg.CID, cfg.TargetName
	s.expStatSN = cfg.ExpStatSN
	s.haveStatSN = cfg.ExpStatSN != 0
	if err := s.security(); err != nil {
		return nil, s.wrap(err)
	}
	if err := s.operational(); err != nil {
		return nil, s.wrap(err)
	}
	return &s.params, nil
}

// wrap turns a plain error into a *Error that names the target (typed errors pass through).
func (s *loginState) wrap(err error) error {
	var le *Error
	var re *RedirectError
	if errors.As(err, &le) || errors.As(err, &re) {
		return err
	}
	if ctxErr := s.ctx.Err(); ctxErr != nil {
		return fmt.Errorf("iSCSI login to %s at %s: %w", s.target(), s.c.RemoteAddr(), ctxErr)
	}
	kind := ErrProtocol
	switch {
	case errors.Is(err, ErrNegotiation):
		kind = ErrNegotiation
	case errors.Is(err, ErrAuthFailed):
		kind = ErrAuthFailed
	case errors.Is(err, ErrConfig):
		kind = ErrConfig
	}
	return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: kind, Err: err}
}

func (s *loginState) target() string {
	if s.cfg.TargetName == "" {
		return "discovery session"
	}
	return s.cfg.TargetName
}

// ParseTargetAddress parses a TargetAddress value "domainname[:port][,tpgt]" (§13.8) where the
// domain name may be an IPv6 literal in brackets. The port defaults to 3260.
func ParseTargetAddress(v string) (addr string, tpgt uint16, err error) {
	if v == "" {
		return "", 0, fmt.Errorf("%w: empty TargetAddress", ErrProtocol)
	}
	hostport := v
	if i := strings.LastIndexByte(v, ','); i >= 0 && !strings.Contains(v[i:], "]") {
		n, perr := strconv.ParseUint(v[i+1:], 10, 16)
		if perr != nil {
			return "", 0, fmt.Errorf("%w: TargetAddress %q: bad portal group tag", ErrProtocol, truncate(v))
		}
		hostport, tpgt = v[:i], uint16(n)
	}
	host, port := hostport, "3260"
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return "", 0, fmt.Errorf("%w: TargetAddress %q: unterminated IPv6 literal", ErrProtocol, truncate(v))
		}
		host = hostport[1:end]
		if rest := hostport[end+1:]; rest != "" {
			if rest[0] != ':' {
				return "", 0, fmt.Errorf("%w: TargetAddress %q", ErrProtocol, truncate(v))
			}
			port = rest[1:]
		}
		host = "[" + host + "]"
	} else if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		host, port = hostport[:i], hostport[i+1:]
	}
	if host == "" || host == "[]" {
		return "", 0, fmt.Errorf("%w: TargetAddress %q has no host", ErrProtocol, truncate(v))
	}
	if p, perr := strconv.ParseUint(port, 10, 16); perr != nil || p == 0 {
		return "", 0, fmt.Errorf("%w: TargetAddress %q: bad port", ErrProtocol, truncate(v))
	}
	return host + ":" + port, tpgt, nil
}

const (
	kindAnd     keyKind = iota // boolean, result AND (§6.2.2)
	kindOr                     // boolean, result OR
	kindMin                    // numeric, result minimum (§6.2.1)
	kindMax                    // numeric, result maximum
	kindDigest                 // list of digest names
	kindDeclare                // declarative: each side states its own value
)
