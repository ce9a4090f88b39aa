package login

// The security negotiation stage (RFC 7143 §6): AuthMethod and the CHAP exchange (§12.1.3).

import (
	"fmt"
	"strconv"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// security runs the security stage (§6.3.2, §12).
func (s *loginState) security() error {
	var text []byte
	text = appendPair(text, "InitiatorName", s.cfg.InitiatorName)
	if s.cfg.InitiatorAlias != "" {
		text = appendPair(text, "InitiatorAlias", s.cfg.InitiatorAlias)
	}
	if s.cfg.Discovery {
		text = appendPair(text, "SessionType", "Discovery")
	} else {
		text = appendPair(text, "SessionType", "Normal")
		text = appendPair(text, "TargetName", s.cfg.TargetName)
	}
	auth := "None"
	switch {
	case s.cfg.CHAP.Mutual():
		auth = "CHAP" // the target must authenticate: never let it pick None
	case s.cfg.CHAP != nil:
		auth = "CHAP,None"
	}
	text = appendPair(text, "AuthMethod", auth)
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
	r, err := s.exchange(pdu.StageSecurity, pdu.StageOperational, false, appendPair(nil, "CHAP_A", strconv.Itoa(CHAPAlgMD5)))
	if err != nil {
		return err
	}
	ch, err := parseCHAPChallenge(r.kvs)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if isOurChallenge(ch.Challenge) {
		return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
			Reason: "target sent one of our own CHAP challenges back (reflection attack)"}
	}
	resp := chapResponse(ch.ID, c.Secret, ch.Challenge)
	var text []byte
	text = appendPair(text, "CHAP_N", c.User)
	text = appendPair(text, "CHAP_R", encodeCHAPBinary(resp[:]))
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
		text = appendPair(text, "CHAP_I", strconv.Itoa(int(ourID)))
		text = appendPair(text, "CHAP_C", encodeCHAPBinary(ourChallenge))
	}
	r, err = s.exchange(pdu.StageSecurity, pdu.StageOperational, true, text)
	if err != nil {
		return err
	}
	s.declaratives(r)
	if c.Mutual() {
		tr, err := parseCHAPTargetResponse(r.kvs)
		if err != nil {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed, Err: err}
		}
		if c.TargetUser != "" && tr.Name != c.TargetUser {
			return &Error{Target: s.cfg.TargetName, Portal: s.c.RemoteAddr(), Kind: ErrAuthFailed,
				Reason: fmt.Sprintf("target authenticated as %q, expected %q", truncate(tr.Name), c.TargetUser)}
		}
		if !verifyCHAP(ourID, c.TargetSecret, ourChallenge, tr.Response) {
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
