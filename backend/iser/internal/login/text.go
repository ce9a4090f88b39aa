package login

import (
	"errors"
	"fmt"
	"strings"
)

// Text keys travel as key=value pairs, each terminated by a NUL byte, in the data segment of Login
// and Text PDUs (RFC 7143 §6.1). A pair may span PDUs when the C bit is set (§6.2); callers
// accumulate the segments of a sequence and decode once.

// Limits from RFC 7143 §6.1: key names up to 63 bytes, values up to 255 bytes except where a key
// says otherwise (CHAP binary values and SendTargets records may be longer, up to 8192).
const (
	maxKeyLen   = 63
	maxValueLen = 8192
	// MaxTextLen bounds an accumulated multi-PDU text sequence we accept (a lying target must not
	// make us buffer without limit).
	MaxTextLen = 1 << 20
)

// ErrText is wrapped by every text-decoding error.
var ErrText = errors.New("malformed iSCSI text")

// KeyValue is one key=value pair.
type KeyValue struct {
	Key, Value string
}

// appendPair appends "key=value\x00" to dst.
func appendPair(dst []byte, key, value string) []byte {
	dst = append(dst, key...)
	dst = append(dst, '=')
	dst = append(dst, value...)
	return append(dst, 0)
}

// EncodeText encodes pairs in order.
func EncodeText(dst []byte, kvs []KeyValue) []byte {
	for _, kv := range kvs {
		dst = appendPair(dst, kv.Key, kv.Value)
	}
	return dst
}

// DecodeText parses a complete text segment (all PDUs of a sequence concatenated). Trailing
// padding NULs are tolerated. Keys must be valid names (§6.1: letters, digits, '.', '-', '+', '@',
// '_', ':' ... we accept any printable ASCII except '='), must not be empty and must not repeat
// (§6.2: a key sent twice is a protocol error). It never panics.
func DecodeText(data []byte) ([]KeyValue, error) {
	var kvs []KeyValue
	seen := map[string]bool{}
	for len(data) > 0 {
		i := indexByte(data, 0)
		var pair []byte
		if i < 0 {
			return nil, fmt.Errorf("%w: key=value pair without NUL terminator", ErrText)
		}
		pair, data = data[:i], data[i+1:]
		if len(pair) == 0 {
			// Only padding may follow: every remaining byte must be NUL.
			for _, c := range data {
				if c != 0 {
					return nil, fmt.Errorf("%w: empty key=value pair", ErrText)
				}
			}
			break
		}
		eq := indexByte(pair, '=')
		if eq < 0 {
			return nil, fmt.Errorf("%w: %q has no '='", ErrText, truncate(string(pair)))
		}
		key, value := string(pair[:eq]), string(pair[eq+1:])
		if err := checkKey(key); err != nil {
			return nil, err
		}
		if len(value) > maxValueLen {
			return nil, fmt.Errorf("%w: value of %s is %d bytes long", ErrText, key, len(value))
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: key %s sent twice", ErrText, key)
		}
		seen[key] = true
		kvs = append(kvs, KeyValue{Key: key, Value: value})
	}
	return kvs, nil
}

// DecodeTextMulti parses a text segment in which a key may repeat (SendTargets responses, §6.2
// exception: TargetName and TargetAddress repeat once per target/portal).
func DecodeTextMulti(data []byte) ([]KeyValue, error) {
	var kvs []KeyValue
	for _, pair := range strings.Split(strings.TrimRight(string(data), "\x00"), "\x00") {
		if pair == "" {
			if len(data) == 0 {
				break
			}
			return nil, fmt.Errorf("%w: empty key=value pair", ErrText)
		}
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q has no '='", ErrText, truncate(pair))
		}
		if err := checkKey(key); err != nil {
			return nil, err
		}
		kvs = append(kvs, KeyValue{Key: key, Value: value})
	}
	return kvs, nil
}

func checkKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return fmt.Errorf("%w: key name of %d bytes", ErrText, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: key name %q contains byte 0x%02x", ErrText, truncate(key), c)
		}
	}
	return nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Special values (RFC 7143 §6.2, §6.2.1).
const (
	valueNotUnderstood = "NotUnderstood"
	valueIrrelevant    = "Irrelevant"
	valueReject        = "Reject"
)
