package scsi

import (
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

// fixedSense builds fixed-format sense data.
func fixedSense(key SenseKey, asc, ascq uint8, info uint32, valid bool) []byte {
	b := make([]byte, 18)
	b[0] = 0x70
	if valid {
		b[0] |= 0x80
	}
	b[2] = byte(key)
	b[3], b[4], b[5], b[6] = byte(info>>24), byte(info>>16), byte(info>>8), byte(info)
	b[7] = 10
	b[12], b[13] = asc, ascq
	return b
}

// descSense builds descriptor-format sense with an information descriptor.
func descSense(key SenseKey, asc, ascq uint8, info uint64) []byte {
	b := []byte{0x72, byte(key), asc, ascq, 0, 0, 0, 12,
		0x00, 0x0A, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range 8 {
		b[12+i] = byte(info >> (56 - 8*i))
	}
	return b
}

func TestParseSense(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    Sense
		wantErr bool
	}{
		{"fixed medium error with LBA", fixedSense(KeyMediumError, 0x11, 0x00, 0x1234, true),
			Sense{ResponseCode: 0x70, Key: KeyMediumError, ASC: 0x11, InfoValid: true, Info: 0x1234}, false},
		{"fixed info not valid", fixedSense(KeyIllegalRequest, 0x24, 0, 99, false),
			Sense{ResponseCode: 0x70, Key: KeyIllegalRequest, ASC: 0x24, Info: 99}, false},
		{"fixed deferred", append([]byte{0x71, 0, 0x03, 0, 0, 0, 0, 6}, make([]byte, 10)...),
			Sense{ResponseCode: 0x71, Deferred: true, Key: KeyMediumError}, false},
		{"fixed truncated after key", []byte{0x70, 0, 0x06},
			Sense{ResponseCode: 0x70, Key: KeyUnitAttention}, false},
		{"fixed additional length cuts ASC", []byte{0x70, 0, 0x05, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0x24, 0x00},
			Sense{ResponseCode: 0x70, Key: KeyIllegalRequest}, false},
		{"fixed SKSV", []byte{0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0xC0, 0, 2},
			Sense{ResponseCode: 0x70, Key: KeyIllegalRequest, ASC: 0x24, SKSValid: true, SenseKeySpecific: [3]byte{0x40, 0, 2}}, false},
		{"descriptor with information", descSense(KeyMediumError, 0x11, 0x04, 1<<40),
			Sense{ResponseCode: 0x72, Key: KeyMediumError, ASC: 0x11, ASCQ: 0x04, InfoValid: true, Info: 1 << 40}, false},
		{"descriptor header only", []byte{0x72, 0x07, 0x27, 0x07},
			Sense{ResponseCode: 0x72, Key: KeyDataProtect, ASC: 0x27, ASCQ: 0x07}, false},
		{"descriptor deferred truncated descriptor", []byte{0x73, 0x02, 0x04, 0x01, 0, 0, 0, 12, 0x00, 0x0A, 0x80, 0},
			Sense{ResponseCode: 0x73, Deferred: true, Key: KeyNotReady, ASC: 4, ASCQ: 1}, false},
		{"descriptor sense key specific", []byte{0x72, 0x05, 0x24, 0, 0, 0, 0, 8, 0x02, 0x06, 0, 0, 0xC0, 0, 0x01, 0},
			Sense{ResponseCode: 0x72, Key: KeyIllegalRequest, ASC: 0x24, SKSValid: true, SenseKeySpecific: [3]byte{0x40, 0, 1}}, false},
		{"empty", nil, Sense{}, true},
		{"unknown code", []byte{0x7F, 0, 0}, Sense{ResponseCode: 0x7F}, true},
		{"fixed too short", []byte{0x70, 0}, Sense{ResponseCode: 0x70}, true},
		{"descriptor too short", []byte{0x72}, Sense{ResponseCode: 0x72}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSense(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestSenseErrorSentinels(t *testing.T) {
	tests := []struct {
		key       SenseKey
		asc, ascq uint8
		want      error
	}{
		{KeyDataProtect, 0x27, 0x00, block.ErrReadOnly},
		{KeyDataProtect, 0x27, 0x02, block.ErrReadOnly},
		{KeyDataProtect, 0x27, 0x07, block.ErrNoSpace},
		{KeyIllegalRequest, 0x21, 0x00, block.ErrInvalid},
		{KeyIllegalRequest, 0x24, 0x00, block.ErrInvalid},
		{KeyIllegalRequest, 0x26, 0x00, block.ErrInvalid},
		{KeyIllegalRequest, 0x1A, 0x00, block.ErrInvalid},
		{KeyIllegalRequest, 0x20, 0x00, block.ErrNotSupported},
		{KeyIllegalRequest, 0x25, 0x00, block.ErrIO},
		{KeyMediumError, 0x11, 0x00, block.ErrMedium},
		{KeyHardwareError, 0x44, 0x00, block.ErrIO},
		{KeyAbortedCommand, 0x47, 0x00, block.ErrIO},
		{KeyNotReady, 0x3A, 0x00, block.ErrIO},
		{KeyUnitAttention, 0x29, 0x00, block.ErrIO},
	}
	all := []error{block.ErrIO, block.ErrInvalid, block.ErrReadOnly, block.ErrNoSpace, block.ErrNotSupported,
		block.ErrMedium, block.ErrTimeout, block.ErrClosed, block.ErrNoPath}
	for _, tt := range tests {
		for _, format := range []string{"fixed", "descriptor"} {
			var resp Response
			resp.Status = StatusCheckCondition
			var s []byte
			if format == "fixed" {
				s = fixedSense(tt.key, tt.asc, tt.ascq, 0, false)
			} else {
				s = descSense(tt.key, tt.asc, tt.ascq, 0)
			}
			resp.SenseLen = uint8(copy(resp.Sense[:], s))
			cmd := &Command{}
			cmd.Write16(1, 1, false, nil)
			err := CheckCommand(cmd, &resp)
			var se *SenseError
			if !errors.As(err, &se) {
				t.Fatalf("%s %v: not a SenseError: %v", format, tt, err)
			}
			matched := 0
			for _, s := range all {
				if errors.Is(err, s) {
					matched++
					if s != tt.want {
						t.Errorf("%s %s %02x/%02x matches %v, want %v", format, tt.key, tt.asc, tt.ascq, s, tt.want)
					}
				}
			}
			if matched != 1 {
				t.Errorf("%s %s %02x/%02x matches %d sentinels", format, tt.key, tt.asc, tt.ascq, matched)
			}
			if !strings.Contains(err.Error(), "WRITE(16)") || !strings.Contains(err.Error(), tt.key.String()) {
				t.Errorf("error %q does not name the command and key", err)
			}
		}
	}
}

func TestCheckStatus(t *testing.T) {
	tests := []struct {
		status Status
		sense  []byte
		ok     bool
		isIO   bool
	}{
		{StatusGood, nil, true, false},
		{StatusConditionMet, nil, true, false},
		{StatusBusy, nil, false, true},
		{StatusTaskSetFull, nil, false, true},
		{StatusReservationConflict, nil, false, true},
		{StatusTaskAborted, nil, false, true},
		{StatusCheckCondition, nil, false, true}, // no sense data
		{StatusCheckCondition, []byte{0x7E}, false, true},
	}
	for _, tt := range tests {
		var resp Response
		resp.Status = tt.status
		resp.SenseLen = uint8(copy(resp.Sense[:], tt.sense))
		err := CheckStatus(&resp)
		if (err == nil) != tt.ok {
			t.Errorf("status %s: err = %v", tt.status, err)
		}
		if tt.isIO && !errors.Is(err, block.ErrIO) {
			t.Errorf("status %s: %v is not ErrIO", tt.status, err)
		}
	}
}

func TestCheckStatusGoodAllocatesNothing(t *testing.T) {
	var resp Response
	cmd := &Command{}
	cmd.Read16(0, 1, false, make([]byte, 512))
	allocs := testing.AllocsPerRun(100, func() {
		if CheckCommand(cmd, &resp) != nil || CheckStatus(&resp) != nil || Classify(&resp) != RetryNo {
			t.Fatal("GOOD is not success")
		}
	})
	if allocs != 0 {
		t.Fatalf("GOOD path allocates %v times", allocs)
	}
}
