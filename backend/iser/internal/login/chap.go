package login

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// CHAP (RFC 1994) as used by iSCSI (RFC 7143 §12.1.3), with MD5 (CHAP_A=5) only.
//
// Exchange, initiator side:
//
//	I→T AuthMethod=CHAP,...      T→I AuthMethod=CHAP
//	I→T CHAP_A=5                 T→I CHAP_A=5 CHAP_I=<id> CHAP_C=<challenge>
//	I→T CHAP_N=<user> CHAP_R=MD5(id‖secret‖challenge) [CHAP_I=<id'> CHAP_C=<challenge'>]
//	                             T→I [CHAP_N=<target user> CHAP_R=MD5(id'‖target secret‖challenge')]

// CHAPAlgMD5 is the CHAP_A value for MD5 (RFC 1994, IANA PPP authentication algorithms).
const CHAPAlgMD5 = 5

// CHAP holds CHAP credentials. Secrets never appear in logs or errors.
type CHAP struct {
	User   string // CHAP_N we send
	Secret string // the secret the target knows for User
	// TargetUser and TargetSecret, when TargetSecret is set, make the authentication mutual:
	// the target must prove it knows TargetSecret (and, if TargetUser is set, name itself so).
	TargetUser   string
	TargetSecret string
}

// Mutual reports whether the target must authenticate too.
func (c *CHAP) Mutual() bool { return c != nil && c.TargetSecret != "" }

// String never prints the secrets.
func (c CHAP) String() string {
	return fmt.Sprintf("CHAP{user=%q mutual=%v}", c.User, c.TargetSecret != "")
}

// GoString never prints the secrets either.
func (c CHAP) GoString() string { return c.String() }

// ErrCHAP is wrapped by CHAP value decoding errors.
var ErrCHAP = errors.New("malformed CHAP value")

// maxCHAPBinary bounds challenge/response length; RFC 7143 §12.1.3 lets a challenge be as long as
// a text value allows; 1024 bytes is far above what any target uses.
const maxCHAPBinary = 1024

// decodeCHAPBinary decodes a CHAP binary value: "0x"/"0X" + hex or "0b"/"0B" + base64 (RFC 7143
// §6.1 binary-value encodings). It never panics.
func decodeCHAPBinary(s string) ([]byte, error) {
	if len(s) < 3 {
		return nil, fmt.Errorf("%w: %q is too short", ErrCHAP, truncate(s))
	}
	prefix, body := strings.ToLower(s[:2]), s[2:]
	var b []byte
	var err error
	switch prefix {
	case "0x":
		if len(body)%2 == 1 { // RFC 7143 §6.1: an odd number of hex digits has an implied leading 0
			body = "0" + body
		}
		b, err = hex.DecodeString(body)
	case "0b":
		b, err = base64.StdEncoding.DecodeString(body)
	default:
		return nil, fmt.Errorf("%w: %q is neither 0x-hex nor 0b-base64", ErrCHAP, truncate(s))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCHAP, err)
	}
	if len(b) == 0 || len(b) > maxCHAPBinary {
		return nil, fmt.Errorf("%w: %d-byte value", ErrCHAP, len(b))
	}
	return b, nil
}

// decodeCHAPIdentifier decodes CHAP_I: a number 0..255 (decimal, or 0x-hex).
func decodeCHAPIdentifier(s string) (byte, error) {
	base := 10
	body := s
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		base, body = 16, s[2:]
	}
	n, err := strconv.ParseUint(body, base, 8)
	if err != nil {
		return 0, fmt.Errorf("%w: CHAP_I %q: not a number in 0..255", ErrCHAP, truncate(s))
	}
	return byte(n), nil
}

// chapResponse computes MD5(id ‖ secret ‖ challenge) (RFC 1994 §4.1).
func chapResponse(id byte, secret string, challenge []byte) [md5.Size]byte {
	h := md5.New()
	h.Write([]byte{id})
	h.Write([]byte(secret))
	h.Write(challenge)
	var out [md5.Size]byte
	h.Sum(out[:0])
	return out
}

// encodeCHAPBinary encodes b as 0x-hex.
func encodeCHAPBinary(b []byte) string { return "0x" + hex.EncodeToString(b) }

// CHAPChallenge is what the target sent in its challenge message.
type CHAPChallenge struct {
	Alg       int
	ID        byte
	Challenge []byte
}

// parseCHAPChallenge extracts CHAP_A, CHAP_I and CHAP_C from the target's keys. It never panics.
func parseCHAPChallenge(kvs []KeyValue) (CHAPChallenge, error) {
	var c CHAPChallenge
	var haveA, haveI, haveC bool
	for _, kv := range kvs {
		switch kv.Key {
		case "CHAP_A":
			n, err := strconv.Atoi(kv.Value)
			if err != nil {
				return c, fmt.Errorf("%w: CHAP_A %q", ErrCHAP, truncate(kv.Value))
			}
			c.Alg, haveA = n, true
		case "CHAP_I":
			id, err := decodeCHAPIdentifier(kv.Value)
			if err != nil {
				return c, err
			}
			c.ID, haveI = id, true
		case "CHAP_C":
			b, err := decodeCHAPBinary(kv.Value)
			if err != nil {
				return c, fmt.Errorf("CHAP_C: %w", err)
			}
			c.Challenge, haveC = b, true
		}
	}
	switch {
	case !haveA:
		return c, fmt.Errorf("%w: target sent no CHAP_A", ErrCHAP)
	case c.Alg != CHAPAlgMD5:
		return c, fmt.Errorf("%w: target chose CHAP_A=%d, we offered only MD5 (5)", ErrCHAP, c.Alg)
	case !haveI || !haveC:
		return c, fmt.Errorf("%w: target sent no CHAP_I/CHAP_C", ErrCHAP)
	}
	return c, nil
}

// CHAPTargetResponse is the target's answer to our challenge (mutual CHAP).
type CHAPTargetResponse struct {
	Name     string
	Response []byte
}

// parseCHAPTargetResponse extracts CHAP_N and CHAP_R. It never panics.
func parseCHAPTargetResponse(kvs []KeyValue) (CHAPTargetResponse, error) {
	var r CHAPTargetResponse
	var haveN, haveR bool
	for _, kv := range kvs {
		switch kv.Key {
		case "CHAP_N":
			r.Name, haveN = kv.Value, true
		case "CHAP_R":
			b, err := decodeCHAPBinary(kv.Value)
			if err != nil {
				return r, fmt.Errorf("CHAP_R: %w", err)
			}
			r.Response, haveR = b, true
		}
	}
	if !haveN || !haveR {
		return r, fmt.Errorf("%w: target did not answer our challenge (CHAP_N/CHAP_R missing)", ErrCHAP)
	}
	return r, nil
}

// verifyCHAP checks a target's response in constant time.
func verifyCHAP(id byte, secret string, challenge, response []byte) bool {
	want := chapResponse(id, secret, challenge)
	return subtle.ConstantTimeCompare(want[:], response) == 1
}

// Our recent challenges: a target that sends one of them back as its own challenge is trying a
// reflection attack (RFC 7143 §12.1.3: the responder must check that the originator does not reuse
// its challenge), and we refuse it.
var recentChallenges struct {
	sync.Mutex
	ring [64][16]byte
	next int
}

func newChallenge() ([]byte, byte, error) {
	var b [17]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, 0, err
	}
	recentChallenges.Lock()
	recentChallenges.ring[recentChallenges.next%len(recentChallenges.ring)] = [16]byte(b[:16])
	recentChallenges.next++
	recentChallenges.Unlock()
	return b[:16], b[16], nil
}

func isOurChallenge(c []byte) bool {
	if len(c) != 16 {
		return false
	}
	recentChallenges.Lock()
	defer recentChallenges.Unlock()
	for i := 0; i < min(recentChallenges.next, len(recentChallenges.ring)); i++ {
		if subtle.ConstantTimeCompare(recentChallenges.ring[i][:], c) == 1 {
			return true
		}
	}
	return false
}
