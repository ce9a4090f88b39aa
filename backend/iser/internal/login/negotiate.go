package login

// Operational parameter negotiation (RFC 7143 §6, §13): the keys we offer, how each answer or
// offer from the target is checked and applied, and the final check of the negotiated Params.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// Key semantics (RFC 7143 §13).
type keyKind uint8

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
		text = appendPair(text, key, v)
		if def.kind == kindDeclare {
			s.applyDeclared(key, v, true)
		} else {
			s.pending[key] = v
		}
	}
	for _, kv := range extra {
		text = appendPair(text, kv.Key, kv.Value)
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
