package login

// One Login Request/Response exchange (RFC 7143 §11.12, §11.13): sending, receiving with
// continuation, and the status classes turned into errors.

import (
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

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
