package login

import (
	"errors"
	"reflect"
	"testing"
)

func TestDecodeText(t *testing.T) {
	tests := []struct {
		in   string
		want []KeyValue
		ok   bool
	}{
		{"", nil, true},
		{"A=1\x00", []KeyValue{{"A", "1"}}, true},
		{"A=1\x00B=\x00C=x=y\x00", []KeyValue{{"A", "1"}, {"B", ""}, {"C", "x=y"}}, true},
		{"A=1\x00\x00\x00", []KeyValue{{"A", "1"}}, true}, // padding
		{"A=1", nil, false},                // no NUL
		{"A\x00", nil, false},              // no '='
		{"=1\x00", nil, false},             // empty key
		{"A=1\x00A=2\x00", nil, false},     // repeated key
		{"A=1\x00\x00B=2\x00", nil, false}, // empty pair in the middle
		{"A B=1\x00", nil, false},          // bad key byte
	}
	for _, tt := range tests {
		got, err := DecodeText([]byte(tt.in))
		if (err == nil) != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("DecodeText(%q) = %v, %v", tt.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrText) {
			t.Errorf("DecodeText(%q) error %v does not wrap ErrText", tt.in, err)
		}
	}
	multi, err := DecodeTextMulti([]byte("TargetName=a\x00TargetAddress=1\x00TargetName=b\x00"))
	if err != nil || len(multi) != 3 {
		t.Fatalf("DecodeTextMulti = %v %v", multi, err)
	}
	kvs := []KeyValue{{"HeaderDigest", "CRC32C,None"}, {"X", ""}}
	back, err := DecodeText(EncodeText(nil, kvs))
	if err != nil || !reflect.DeepEqual(back, kvs) {
		t.Fatalf("round trip %v %v", back, err)
	}
}
