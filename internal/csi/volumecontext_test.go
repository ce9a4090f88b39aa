package csi

import (
	"reflect"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/modes"
)

const (
	testTarget = "iscsi://192.0.2.10/iqn.2001-04.com.example:disk1/1"
	// testTargetNorm is testTarget as ParseVolumeContext normalises it: with the port.
	testTargetNorm = "iscsi://192.0.2.10:3260/iqn.2001-04.com.example:disk1/1"
)

// TestParseVolumeContext: the accepted spellings and what they give.
func TestParseVolumeContext(t *testing.T) {
	for _, tt := range []struct {
		vc   map[string]string
		want Volume
	}{
		{map[string]string{KeyTargets: testTarget}, Volume{Targets: []string{testTargetNorm}}},
		{map[string]string{KeyTargets: "iscsi://192.0.2.10/iqn.2001-04.com.example:disk1, iscsi://192.0.2.11:3261/iqn.2001-04.com.example:disk1/", KeyLUN: "1",
			KeyTransport: "iscsi", KeyFrontend: "nbd", KeyCache: "off"},
			Volume{Targets: []string{testTargetNorm, "iscsi://192.0.2.11:3261/iqn.2001-04.com.example:disk1/1"}, Frontend: modes.NBD, Cache: modes.Off}},
		{map[string]string{KeyTargets: "iser://[fd00::1]/iqn.2001-04.com.example:disk1/3", KeyTransport: "iser", KeyFrontend: "ublk", KeyCache: "writethrough",
			"csi.storage.k8s.io/pod.name": "db-0", "storage.kubernetes.io/csiProvisionerIdentity": "x"},
			Volume{Targets: []string{"iser://[fd00::1]:3260/iqn.2001-04.com.example:disk1/3"}, Frontend: modes.Ublk, Cache: modes.WriteThrough}},
		{map[string]string{KeyTargets: testTarget, KeyCache: "writeback", KeyCacheDevSize: "4GiB"},
			Volume{Targets: []string{testTargetNorm}, CacheDevSize: 4 << 30}},
	} {
		got, err := ParseVolumeContext(tt.vc)
		if err != nil {
			t.Errorf("%v: %v", tt.vc, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%v:\n got %+v\nwant %+v", tt.vc, got, tt.want)
		}
	}
}

// TestParseVolumeContextStrict: each mistake is refused with a message that names the key.
func TestParseVolumeContextStrict(t *testing.T) {
	const iqn = "iscsi://192.0.2.10/iqn.2001-04.com.example:disk1"
	for _, tt := range []struct {
		vc   map[string]string
		want string
	}{
		{map[string]string{}, KeyTargets},
		{map[string]string{KeyTargets: " "}, KeyTargets},
		{map[string]string{KeyTargets: testTarget, "targetPortal": "192.0.2.10"}, `"targetPortal"`},
		{map[string]string{KeyTargets: testTarget, "Cache": "off"}, `"Cache"`},
		{map[string]string{KeyTargets: iqn}, "LUN"},                                 // no LUN anywhere
		{map[string]string{KeyTargets: testTarget, KeyLUN: "1"}, KeyLUN},            // the LUN twice
		{map[string]string{KeyTargets: iqn, KeyLUN: "16384"}, KeyLUN},               // out of range
		{map[string]string{KeyTargets: iqn, KeyLUN: "one"}, KeyLUN},                 // not a number
		{map[string]string{KeyTargets: testTarget + ",", KeyCache: "off"}, "empty"}, // a trailing comma
		{map[string]string{KeyTargets: testTarget + "," + testTarget}, "twice"},
		{map[string]string{KeyTargets: testTarget + ",iscsi://192.0.2.11/iqn.2001-04.com.example:disk2/1"}, "same"},
		{map[string]string{KeyTargets: testTarget + ",iscsi://192.0.2.11/iqn.2001-04.com.example:disk1/2"}, "same"},
		{map[string]string{KeyTargets: testTarget + ",iser://192.0.2.11/iqn.2001-04.com.example:disk1/1"}, "same"},
		{map[string]string{KeyTargets: testTarget, KeyTransport: "iser"}, KeyTransport},
		{map[string]string{KeyTargets: testTarget, KeyTransport: "tcp"}, KeyTransport},
		{map[string]string{KeyTargets: "iscsi://alice@192.0.2.10/iqn.2001-04.com.example:disk1/1"}, SecretCHAPUser},
		{map[string]string{KeyTargets: "http://192.0.2.10/iqn.2001-04.com.example:disk1/1"}, "scheme"},
		{map[string]string{KeyTargets: testTarget, KeyFrontend: "nbd-socket"}, KeyFrontend},
		{map[string]string{KeyTargets: testTarget, KeyCache: "fast"}, KeyCache},
		{map[string]string{KeyTargets: testTarget, KeyCache: ""}, KeyCache},
		{map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "big"}, KeyCacheDevSize},
		{map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "1MiB"}, KeyCacheDevSize}, // below the minimum
		{map[string]string{KeyTargets: testTarget, KeyCacheDevSize: "1GiB", KeyCache: "off"}, "write-back"},
	} {
		_, err := ParseVolumeContext(tt.vc)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one naming %q", tt.vc, err, tt.want)
		}
	}
}

// TestParseSecrets: the CHAP keys, and the half-given or unknown ones refused without showing
// a value.
func TestParseSecrets(t *testing.T) {
	got, err := ParseSecrets(map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "pw1", SecretTargetUser: "tgt", SecretTargetSecret: "pw2"})
	if err != nil || got != (CHAP{User: "alice", Secret: "pw1", TargetUser: "tgt", TargetSecret: "pw2"}) {
		t.Errorf("full CHAP: %+v %v", got, err)
	}
	if got, err := ParseSecrets(nil); err != nil || got != (CHAP{}) {
		t.Errorf("no secret: %+v %v", got, err)
	}
	for _, s := range []map[string]string{
		{"password": "pw-secret"},
		{SecretCHAPSecret: "pw-secret"},
		{SecretCHAPUser: "alice"},
		{SecretCHAPUser: "alice", SecretCHAPSecret: "pw-secret", SecretTargetUser: "tgt"},
		{SecretCHAPUser: "alice", SecretCHAPSecret: "pw-secret\nsecond line"},
	} {
		_, err := ParseSecrets(s)
		if err == nil {
			t.Errorf("%v accepted", s)
		} else if strings.Contains(err.Error(), "pw-secret") {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
}
