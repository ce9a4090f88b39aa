package discovery

import (
	"errors"
	"reflect"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []Target
		err  error
	}{
		{
			name: "two targets, several portals",
			text: "TargetName=iqn.b\x00TargetAddress=10.0.0.1:3260,1\x00TargetAddress=[fe80::1]:3261,2\x00" +
				"TargetName=iqn.a\x00TargetAddress=host.example\x00",
			want: []Target{
				{Name: "iqn.a", Portals: []Portal{{Address: "host.example:3260"}}},
				{Name: "iqn.b", Portals: []Portal{{Address: "10.0.0.1:3260", TPGT: 1}, {Address: "[fe80::1]:3261", TPGT: 2}}},
			},
		},
		{name: "target without address", text: "TargetName=iqn.x\x00", want: []Target{{Name: "iqn.x"}}},
		{name: "empty", text: "", want: nil},
		{name: "address first", text: "TargetAddress=1.2.3.4\x00", err: login.ErrProtocol},
		{name: "bad port", text: "TargetName=iqn.x\x00TargetAddress=1.2.3.4:99999,1\x00", err: login.ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvs, err := login.DecodeTextMulti([]byte(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(kvs)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
