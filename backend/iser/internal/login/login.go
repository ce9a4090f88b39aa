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
	"time"

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

// response is one complete (possibly multi-PDU) Login Response.
type response struct {
	transit  bool
	csg, nsg uint8
	kvs      []KeyValue
}

func (r *response) get(key string) (string, bool) {
	for _, kv := range r.kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// exchange sends text in one or more Login Requests (C bit, §11.12.2) and returns the target's
// complete response (collecting C-bit continuations, §11.13.2).
func (s *loginState) exchange(csg, nsg uint8, transit bool, text []byte) (*response, error) {
	for {
		if s.rounds++; s.rounds > maxLoginRounds {
			return nil, fmt.Errorf("%w: more than %d login rounds", ErrProtocol, maxLoginRounds)
		}
		chunk, more := text, false
		if len(chunk) > maxLoginSegment {
			chunk, more = text[:maxLoginSegment], true
		}
		text = text[len(chunk):]
		if err := s.send(csg, nsg, transit && !more, more, chunk); err != nil {
			return nil, err
		}
		r, err := s.receive()
		if err != nil {
			return nil, err
		}
		if !more {
			return r, nil
		}
		if len(r.kvs) != 0 {
			return nil, fmt.Errorf("%w: target answered a continued login request with keys", ErrProtocol)
		}
	}
}

func (s *loginState) send(csg, nsg uint8, transit, cont bool, data []byte) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	req := pdu.LoginRequest{
		Transit: transit, Continue: cont, CSG: csg, NSG: nsg,
		DataSegmentLength: len(data),
		ISID:              s.cfg.ISID, TSIH: s.cfg.TSIH, ITT: s.cfg.ITT, CID: s.cfg.CID,
		CmdSN: s.cfg.CmdSN, ExpStatSN: s.expStatSN,
	}
	var bhs pdu.BHS
	req.Encode(&bhs)
	if err := s.c.WritePDU(&bhs, nil, data); err != nil {
		return fmt.Errorf("sending login request: %w", err)
	}
	return nil
}

// receive reads Login Responses until one without the C bit, answering each continued one with
// an empty request (§11.13.2), and returns the whole text decoded.
func (s *loginState) receive() (*response, error) {
	s.rx = s.rx[:0]
	for {
		var bhs pdu.BHS
		if _, err := s.c.ReadHeader(&bhs); err != nil {
			return nil, fmt.Errorf("reading login response: %w", err)
		}
		if bhs.Opcode() != pdu.OpLoginResp {
			if err := s.c.DiscardData(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: got %v during login", ErrProtocol, bhs.Opcode())
		}
		n := bhs.DataSegmentLength()
		if len(s.rx)+n > MaxTextLen {
			return nil, fmt.Errorf("%w: login response text exceeds %d bytes", ErrProtocol, MaxTextLen)
		}
		start := len(s.rx)
		s.rx = append(s.rx, make([]byte, n)...)
		if n > 0 {
			if err := s.c.ReadData(s.rx[start:]); err != nil {
				return nil, fmt.Errorf("reading login response data: %w", err)
			}
		}
		if bhs.ITT() != s.cfg.ITT {
			return nil, fmt.Errorf("%w: login response for ITT 0x%x, ours is 0x%x", ErrProtocol, bhs.ITT(), s.cfg.ITT)
		}
		class, detail := bhs.LoginStatus()
		if class != 0 {
			return nil, s.statusError(class, detail)
		}
		if bhs.VersionActive() != 0 {
			return nil, fmt.Errorf("%w: target chose protocol version %d", ErrProtocol, bhs.VersionActive())
		}
		if bhs.ISID() != s.cfg.ISID {
			return nil, fmt.Errorf("%w: login response ISID 0x%x differs from ours 0x%x", ErrProtocol, bhs.ISID(), s.cfg.ISID)
		}
		// §11.13.4: StatSN of the first response is the connection's initial StatSN.
		s.expStatSN, s.haveStatSN = bhs.StatSN()+1, true
		s.params.StatSN, s.params.ExpCmdSN, s.params.MaxCmdSN = bhs.StatSN(), bhs.ExpCmdSN(), bhs.MaxCmdSN()
		s.params.TSIH = bhs.TSIH()
		if bhs.Continue() {
			// Bound continuations too: a target may not keep us asking for more forever.
			if s.rounds++; s.rounds > maxLoginRounds {
				return nil, fmt.Errorf("%w: more than %d login rounds", ErrProtocol, maxLoginRounds)
			}
			csg, nsg := bhs.LoginStages()
			if err := s.send(csg, nsg, false, false, nil); err != nil {
				return nil, err
			}
			continue
		}
		kvs, err := DecodeText(s.rx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		csg, nsg := bhs.LoginStages()
		return &response{transit: bhs.Transit(), csg: csg, nsg: nsg, kvs: kvs}, nil
	}
}

func (s *loginState) statusError(class, detail uint8) error {
	if class == 1 {
		addr, tpgt, err := ParseTargetAddress(string(keyFromText(s.rx, "TargetAddress")))
		if err != nil {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Class: class, Detail: detail,
				Kind: ErrProtocol, Reason: "redirection without a usable TargetAddress", Err: err}
		}
		return &RedirectError{Target: s.cfg.TargetName, From: s.c.RemoteAddr(), Address: addr, TPGT: tpgt, Permanent: detail == 2}
	}
	return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Class: class, Detail: detail, Kind: kindFor(class, detail)}
}

func keyFromText(text []byte, key string) []byte {
	kvs, err := DecodeTextMulti(text)
	if err != nil {
		return nil
	}
	for _, kv := range kvs {
		if kv.Key == key {
			return []byte(kv.Value)
		}
	}
	return nil
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

// security runs the security stage (§6.3.2, §12).
func (s *loginState) security() error {
	var text []byte
	text = AppendPair(text, "InitiatorName", s.cfg.InitiatorName)
	if s.cfg.InitiatorAlias != "" {
		text = AppendPair(text, "InitiatorAlias", s.cfg.InitiatorAlias)
	}
	if s.cfg.Discovery {
		text = AppendPair(text, "SessionType", "Discovery")
	} else {
		text = AppendPair(text, "SessionType", "Normal")
		text = AppendPair(text, "TargetName", s.cfg.TargetName)
	}
	auth := "None"
	switch {
	case s.cfg.CHAP.Mutual():
		auth = "CHAP" // the target must authenticate: never let it pick None
	case s.cfg.CHAP != nil:
		auth = "CHAP,None"
	}
	text = AppendPair(text, "AuthMethod", auth)
	r, err := s.exchange(pdu.StageSecurity, pdu.StageOperational, true, text)
	if err != nil {
		return err
	}
	s.declaratives(r)
	method, ok := r.get("AuthMethod")
	if !ok {
		method = "None" // a target may omit it when it does not authenticate
	}
	switch method {
	case "None":
		if s.cfg.CHAP.Mutual() {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
				Reason: "target refused to authenticate itself (mutual CHAP required)"}
		}
		for !r.transit {
			if r, err = s.exchange(pdu.StageSecurity, pdu.StageOperational, true, nil); err != nil {
				return err
			}
		}
		return s.checkTransit(r, pdu.StageOperational)
	case "CHAP":
		if s.cfg.CHAP == nil {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
				Reason: "target requires CHAP but no credentials were given"}
		}
		return s.chap()
	default:
		return fmt.Errorf("%w: target chose AuthMethod=%q, which we did not offer", ErrProtocol, truncate(method))
	}
}

func (s *loginState) checkTransit(r *response, want uint8) error {
	if !r.transit {
		return fmt.Errorf("%w: target did not transit", ErrProtocol)
	}
	if r.nsg != want {
		return fmt.Errorf("%w: target transits to stage %d, we asked for %d", ErrProtocol, r.nsg, want)
	}
	return nil
}

func (s *loginState) chap() error {
	c := s.cfg.CHAP
	r, err := s.exchange(pdu.StageSecurity, pdu.StageOperational, false, AppendPair(nil, "CHAP_A", strconv.Itoa(CHAPAlgMD5)))
	if err != nil {
		return err
	}
	ch, err := ParseCHAPChallenge(r.kvs)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if isOurChallenge(ch.Challenge) {
		return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
			Reason: "target sent one of our own CHAP challenges back (reflection attack)"}
	}
	resp := CHAPResponse(ch.ID, c.Secret, ch.Challenge)
	var text []byte
	text = AppendPair(text, "CHAP_N", c.User)
	text = AppendPair(text, "CHAP_R", EncodeCHAPBinary(resp[:]))
	var ourChallenge []byte
	var ourID byte
	if c.Mutual() {
		for {
			if ourChallenge, ourID, err = newChallenge(); err != nil {
				return fmt.Errorf("generating CHAP challenge: %w", err)
			}
			// Never reuse the target's challenge for the other direction (§12.1.3).
			if string(ourChallenge) != string(ch.Challenge) {
				break
			}
		}
		text = AppendPair(text, "CHAP_I", strconv.Itoa(int(ourID)))
		text = AppendPair(text, "CHAP_C", EncodeCHAPBinary(ourChallenge))
	}
	r, err = s.exchange(pdu.StageSecurity, pdu.StageOperational, true, text)
	if err != nil {
		return err
	}
	s.declaratives(r)
	if c.Mutual() {
		tr, err := ParseCHAPTargetResponse(r.kvs)
		if err != nil {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed, Err: err}
		}
		if c.TargetUser != "" && tr.Name != c.TargetUser {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
				Reason: fmt.Sprintf("target authenticated as %q, expected %q", truncate(tr.Name), c.TargetUser)}
		}
		if !VerifyCHAP(ourID, c.TargetSecret, ourChallenge, tr.Response) {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
				Reason: "target's CHAP response does not match the mutual secret"}
		}
	}
	for !r.transit {
		if r, err = s.exchange(pdu.StageSecurity, pdu.StageOperational, true, nil); err != nil {
			return err
		}
	}
	return s.checkTransit(r, pdu.StageOperational)
}

// declaratives records what the target declares in any login response.
func (s *loginState) declaratives(r *response) {
	for _, kv := range r.kvs {
		switch kv.Key {
		case "TargetAlias":
			s.params.TargetAlias = kv.Value
		case "TargetPortalGroupTag":
			if n, err := strconv.ParseUint(kv.Value, 10, 16); err == nil {
				s.params.TargetPortalGroupTag = uint16(n)
			}
		}
	}
}

// Key semantics (RFC 7143 §13).
type keyKind uint8

const (
	kindAnd     keyKind = iota // boolean, result AND (§6.2.2)
	kindOr                     // boolean, result OR
	kindMin                    // numeric, result minimum (§6.2.1)
	kindMax                    // numeric, result maximum
	kindDigest                 // list of digest names
	kindDeclare                // declarative: each side states its own value
)

type keyDef struct {
	kind      keyKind
	lo, hi    uint64
	normalOny bool // irrelevant in discovery sessions (LO keys about data transfer)
}

var keyDefs = map[string]keyDef{
	"HeaderDigest":             {kind: kindDigest},
	"DataDigest":               {kind: kindDigest},
	"MaxConnections":           {kind: kindMin, lo: 1, hi: 65535, normalOny: true},
	"InitialR2T":               {kind: kindOr, normalOny: true},
	"ImmediateData":            {kind: kindAnd, normalOny: true},
	"MaxRecvDataSegmentLength": {kind: kindDeclare, lo: 512, hi: 1<<24 - 1},
	"MaxBurstLength":           {kind: kindMin, lo: 512, hi: 1<<24 - 1, normalOny: true},
	"FirstBurstLength":         {kind: kindMin, lo: 512, hi: 1<<24 - 1, normalOny: true},
	"DefaultTime2Wait":         {kind: kindMax, lo: 0, hi: 3600},
	"DefaultTime2Retain":       {kind: kindMin, lo: 0, hi: 3600},
	"MaxOutstandingR2T":        {kind: kindMin, lo: 1, hi: 65535, normalOny: true},
	"DataPDUInOrder":           {kind: kindOr, normalOny: true},
	"DataSequenceInOrder":      {kind: kindOr, normalOny: true},
	"ErrorRecoveryLevel":       {kind: kindMin, lo: 0, hi: 2},
	"iSCSIProtocolLevel":       {kind: kindMin, lo: 0, hi: 31},
}

// ourValue is our preference for a key, as a string in the key's syntax.
func (s *loginState) ourValue(key string, p *Proposal) string {
	switch key {
	case "HeaderDigest":
		return p.HeaderDigest.offer()
	case "DataDigest":
		return p.DataDigest.offer()
	case "MaxConnections":
		return u(p.MaxConnections)
	case "InitialR2T":
		return yn(p.InitialR2T)
	case "ImmediateData":
		return yn(p.ImmediateData)
	case "MaxRecvDataSegmentLength":
		return u(p.MaxRecvDataSegmentLength)
	case "MaxBurstLength":
		return u(p.MaxBurstLength)
	case "FirstBurstLength":
		return u(p.FirstBurstLength)
	case "DefaultTime2Wait":
		return u(p.DefaultTime2Wait)
	case "DefaultTime2Retain":
		return u(p.DefaultTime2Retain)
	case "MaxOutstandingR2T":
		return u(p.MaxOutstandingR2T)
	case "DataPDUInOrder":
		return yn(p.DataPDUInOrder)
	case "DataSequenceInOrder":
		return yn(p.DataSequenceInOrder)
	case "ErrorRecoveryLevel":
		return u(uint32(p.ErrorRecoveryLevel))
	case "iSCSIProtocolLevel":
		return "1" // RFC 7143 (§13.24)
	}
	return ""
}

func u(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// offerOrder is the order in which we offer keys.
var offerOrder = []string{
	"HeaderDigest", "DataDigest", "MaxConnections", "InitialR2T", "ImmediateData",
	"MaxRecvDataSegmentLength", "MaxBurstLength", "FirstBurstLength", "DefaultTime2Wait",
	"DefaultTime2Retain", "MaxOutstandingR2T", "DataPDUInOrder", "DataSequenceInOrder",
	"ErrorRecoveryLevel",
}

// operational runs the operational negotiation stage (§6.3.3, §13).
func (s *loginState) operational() error {
	p := s.cfg.Proposal
	if p.MaxRecvDataSegmentLength == 0 {
		p = DefaultProposal()
	}
	var extra []KeyValue
	if s.cfg.Hook != nil {
		extra = s.cfg.Hook.Propose(&p)
	}
	if err := validateProposal(&p); err != nil {
		return err
	}
	s.cfg.Proposal = p
	var text []byte
	for _, key := range offerOrder {
		def := keyDefs[key]
		if s.cfg.Discovery && def.normalOny {
			continue
		}
		v := s.ourValue(key, &p)
		text = AppendPair(text, key, v)
		if def.kind == kindDeclare {
			s.applyDeclared(key, v, true)
		} else {
			s.pending[key] = v
		}
	}
	for _, kv := range extra {
		text = AppendPair(text, kv.Key, kv.Value)
	}
	r, err := s.exchange(pdu.StageOperational, pdu.StageFullFeature, true, text)
	if err != nil {
		return err
	}
	for {
		s.declaratives(r)
		if err := s.process(r.kvs, &p); err != nil {
			return err
		}
		if r.transit && len(s.replies) == 0 {
			if err := s.checkTransit(r, pdu.StageFullFeature); err != nil {
				return err
			}
			break
		}
		text = EncodeText(nil, s.replies)
		s.replies = s.replies[:0]
		if r, err = s.exchange(pdu.StageOperational, pdu.StageFullFeature, true, text); err != nil {
			return err
		}
	}
	// Keys the target never answered keep their defaults (§6.2: a key not answered was not
	// negotiated).
	for key := range s.pending {
		s.log.Debug("iSCSI key not answered by the target; using the default", zap.String("key", key))
	}
	return s.finish()
}

func validateProposal(p *Proposal) error {
	switch {
	case p.MaxRecvDataSegmentLength < 512 || p.MaxRecvDataSegmentLength > pdu.MaxDataSegmentLength:
		return fmt.Errorf("%w: MaxRecvDataSegmentLength %d outside 512..16777215", ErrConfig, p.MaxRecvDataSegmentLength)
	case p.MaxBurstLength < 512 || p.MaxBurstLength > pdu.MaxDataSegmentLength:
		return fmt.Errorf("%w: MaxBurstLength %d outside 512..16777215", ErrConfig, p.MaxBurstLength)
	case p.FirstBurstLength < 512 || p.FirstBurstLength > p.MaxBurstLength:
		return fmt.Errorf("%w: FirstBurstLength %d outside 512..MaxBurstLength", ErrConfig, p.FirstBurstLength)
	case p.MaxOutstandingR2T < 1 || p.MaxConnections < 1:
		return fmt.Errorf("%w: MaxOutstandingR2T and MaxConnections must be at least 1", ErrConfig)
	case p.ErrorRecoveryLevel != 0:
		return fmt.Errorf("%w: only ErrorRecoveryLevel=0 is implemented", ErrConfig)
	case p.DefaultTime2Wait > 3600 || p.DefaultTime2Retain > 3600:
		return fmt.Errorf("%w: DefaultTime2Wait/Retain above 3600", ErrConfig)
	}
	return nil
}

// process handles one response's keys: answers to our offers, target offers (queued replies),
// declaratives and keys for the transport hook.
func (s *loginState) process(kvs []KeyValue, p *Proposal) error {
	for _, kv := range kvs {
		key, v := kv.Key, kv.Value
		switch key {
		case "TargetAlias", "TargetPortalGroupTag", "TargetAddress", "TargetName",
			"AuthMethod", "CHAP_A", "CHAP_I", "CHAP_C", "CHAP_N", "CHAP_R":
			continue // declaratives handled elsewhere or security leftovers
		case "OFMarker", "IFMarker": // obsolete in RFC 7143 (§13.26): decline markers
			s.replies = append(s.replies, KeyValue{key, "No"})
			continue
		case "OFMarkInt", "IFMarkInt":
			s.replies = append(s.replies, KeyValue{key, valueIrrelevant})
			continue
		}
		def, known := keyDefs[key]
		if !known {
			if err := s.hookKey(key, v); err != nil {
				return err
			}
			continue
		}
		if def.kind == kindDeclare {
			if err := s.applyDeclared(key, v, false); err != nil {
				return err
			}
			continue
		}
		if offered, ok := s.pending[key]; ok {
			delete(s.pending, key)
			s.done[key] = true
			if err := s.applyAnswer(key, def, offered, v); err != nil {
				return err
			}
			continue
		}
		if s.done[key] {
			return fmt.Errorf("%w: target renegotiated %s", ErrProtocol, key)
		}
		s.done[key] = true
		reply, err := s.answerOffer(key, def, v, p)
		if err != nil {
			return err
		}
		s.replies = append(s.replies, KeyValue{key, reply})
	}
	return nil
}

func (s *loginState) hookKey(key, v string) error {
	if s.cfg.Hook != nil {
		reply, handled, err := s.cfg.Hook.Accept(key, v)
		if err != nil {
			return fmt.Errorf("%w: %s=%s: %w", ErrNegotiation, key, truncate(v), err)
		}
		if handled {
			if reply != "" {
				s.replies = append(s.replies, KeyValue{key, reply})
			}
			return nil
		}
	}
	if v == valueNotUnderstood || v == valueIrrelevant || v == valueReject {
		return nil // an answer to nothing we care about
	}
	s.log.Debug("iSCSI key not understood", zap.String("key", key))
	s.replies = append(s.replies, KeyValue{key, valueNotUnderstood})
	return nil
}

func parseBool(key, v string) (bool, error) {
	switch v {
	case "Yes":
		return true, nil
	case "No":
		return false, nil
	}
	return false, fmt.Errorf("%w: %s=%q is not Yes or No", ErrNegotiation, key, truncate(v))
}

func parseNum(key, v string, def keyDef) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil && strings.HasPrefix(v, "0x") {
		n, err = strconv.ParseUint(v[2:], 16, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not a number", ErrNegotiation, key, truncate(v))
	}
	if n < def.lo || n > def.hi {
		return 0, fmt.Errorf("%w: %s=%d outside %d..%d", ErrNegotiation, key, n, def.lo, def.hi)
	}
	return n, nil
}

// applyAnswer applies the target's answer to a key we offered (§6.2).
func (s *loginState) applyAnswer(key string, def keyDef, offered, v string) error {
	switch v {
	case valueNotUnderstood, valueReject, valueIrrelevant:
		// The key keeps its default (§6.2). A required CRC32C digest cannot fall back to None.
		if def.kind == kindDigest && offered == "CRC32C" {
			return fmt.Errorf("%w: %s=CRC32C required but the target answered %s", ErrNegotiation, key, v)
		}
		s.log.Debug("iSCSI key keeps its default", zap.String("key", key), zap.String("answer", v))
		return nil
	}
	switch def.kind {
	case kindDigest:
		if !strings.Contains(","+offered+",", ","+v+",") {
			return fmt.Errorf("%w: %s=%q is not among our offer %q", ErrNegotiation, key, truncate(v), offered)
		}
		s.set(key, v == "CRC32C", 0)
	case kindAnd, kindOr:
		theirs, err := parseBool(key, v)
		if err != nil {
			return err
		}
		ours := offered == "Yes"
		res := ours && theirs
		if def.kind == kindOr {
			res = ours || theirs
		}
		s.set(key, res, 0)
	case kindMin, kindMax:
		theirs, err := parseNum(key, v, def)
		if err != nil {
			return err
		}
		ours, _ := strconv.ParseUint(offered, 10, 64)
		res := min(ours, theirs)
		if def.kind == kindMax {
			res = max(ours, theirs)
		}
		s.set(key, false, res)
	}
	return nil
}

// answerOffer computes our reply to a key the target offered first (§6.2).
func (s *loginState) answerOffer(key string, def keyDef, v string, p *Proposal) (string, error) {
	if s.cfg.Discovery && def.normalOny {
		return valueIrrelevant, nil
	}
	if v == valueNotUnderstood || v == valueIrrelevant || v == valueReject {
		return "", fmt.Errorf("%w: target sent %s=%s without our offer", ErrProtocol, key, v)
	}
	ours := s.ourValue(key, p)
	switch def.kind {
	case kindDigest:
		var want Digest
		if key == "HeaderDigest" {
			want = p.HeaderDigest
		} else {
			want = p.DataDigest
		}
		for _, choice := range strings.Split(v, ",") {
			if want.accepts(choice) {
				s.set(key, choice == "CRC32C", 0)
				return choice, nil
			}
		}
		return "", fmt.Errorf("%w: target offered %s=%q, we need %q", ErrNegotiation, key, truncate(v), want.offer())
	case kindAnd, kindOr:
		theirs, err := parseBool(key, v)
		if err != nil {
			return valueReject, nil
		}
		res := ours == "Yes" && theirs
		if def.kind == kindOr {
			res = ours == "Yes" || theirs
		}
		s.set(key, res, 0)
		return yn(res), nil
	default: // kindMin, kindMax
		theirs, err := parseNum(key, v, def)
		if err != nil {
			return valueReject, nil
		}
		o, _ := strconv.ParseUint(ours, 10, 64)
		res := min(o, theirs)
		if def.kind == kindMax {
			res = max(o, theirs)
		}
		s.set(key, false, res)
		return strconv.FormatUint(res, 10), nil
	}
}

// applyDeclared records a declarative key: ours (what we send) or the target's.
func (s *loginState) applyDeclared(key, v string, ours bool) error {
	n, err := parseNum(key, v, keyDefs[key])
	if err != nil {
		return err
	}
	if key == "MaxRecvDataSegmentLength" {
		if ours {
			s.params.MaxRecvDataSegmentLength = uint32(n)
		} else {
			s.params.TargetMaxRecvDataSegmentLength = uint32(n)
		}
	}
	return nil
}

func (s *loginState) set(key string, b bool, n uint64) {
	p := &s.params
	switch key {
	case "HeaderDigest":
		p.HeaderDigest = b
	case "DataDigest":
		p.DataDigest = b
	case "MaxConnections":
		p.MaxConnections = uint32(n)
	case "InitialR2T":
		p.InitialR2T = b
	case "ImmediateData":
		p.ImmediateData = b
	case "MaxBurstLength":
		p.MaxBurstLength = uint32(n)
	case "FirstBurstLength":
		p.FirstBurstLength = uint32(n)
	case "DefaultTime2Wait":
		p.DefaultTime2Wait = time.Duration(n) * time.Second
	case "DefaultTime2Retain":
		p.DefaultTime2Retain = time.Duration(n) * time.Second
	case "MaxOutstandingR2T":
		p.MaxOutstandingR2T = uint32(n)
	case "DataPDUInOrder":
		p.DataPDUInOrder = b
	case "DataSequenceInOrder":
		p.DataSequenceInOrder = b
	case "ErrorRecoveryLevel":
		p.ErrorRecoveryLevel = uint8(n)
	}
}

func (s *loginState) finish() error {
	p := &s.params
	if p.ErrorRecoveryLevel != 0 {
		return fmt.Errorf("%w: ErrorRecoveryLevel=%d, only 0 is implemented", ErrNegotiation, p.ErrorRecoveryLevel)
	}
	if p.FirstBurstLength > p.MaxBurstLength {
		// §13.14: FirstBurstLength must not exceed MaxBurstLength; clamp a sloppy target.
		s.log.Warn("target negotiated FirstBurstLength above MaxBurstLength; clamping",
			zap.Uint32("first_burst", p.FirstBurstLength), zap.Uint32("max_burst", p.MaxBurstLength))
		p.FirstBurstLength = p.MaxBurstLength
	}
	if !s.cfg.Discovery && p.TSIH == 0 {
		return fmt.Errorf("%w: target assigned TSIH 0 at the end of a normal login", ErrProtocol)
	}
	if s.cfg.Hook != nil {
		if err := s.cfg.Hook.Finish(p); err != nil {
			return fmt.Errorf("%w: %w", ErrNegotiation, err)
		}
	}
	s.log.Debug("iSCSI login negotiated", zap.Stringer("params", p))
	return nil
}
