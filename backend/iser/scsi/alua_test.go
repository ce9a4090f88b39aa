package scsi

import (
	"reflect"
	"testing"
)

func TestParseReportTargetPortGroups(t *testing.T) {
	two := []byte{0, 0, 0, 24,
		0x80, 0x0F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1,
		0x01, 0x0F, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2}
	tests := []struct {
		name string
		in   []byte
		want []TargetPortGroup
		err  bool
	}{
		{"two groups", two, []TargetPortGroup{{true, ALUAOptimized, 1, []uint16{1}}, {false, ALUANonOptimized, 2, []uint16{2}}}, false},
		{"truncated second descriptor", two[:20], []TargetPortGroup{{true, ALUAOptimized, 1, []uint16{1}}}, false},
		{"length larger than data", append([]byte{0, 0, 1, 0}, two[4:16]...), []TargetPortGroup{{true, ALUAOptimized, 1, []uint16{1}}}, false},
		{"port count past the end", []byte{0, 0, 0, 8, 0x02, 0, 0, 9, 0, 0, 0, 200}, nil, false},
		{"short", []byte{0, 0}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseReportTargetPortGroups(tt.in)
			if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestPortGroupAndTPGS(t *testing.T) {
	ds := []Designator{{Type: DesigNAA, Association: AssocLU, Value: []byte{1}},
		{Type: DesigTPG, Association: AssocPort, Value: []byte{0, 0, 0, 7}}}
	if g, ok := PortGroup(ds); !ok || g != 7 {
		t.Fatalf("PortGroup = %d %v", g, ok)
	}
	if _, ok := PortGroup(ds[:1]); ok {
		t.Fatal("PortGroup without a TPG designator")
	}
	inq := make([]byte, 36)
	inq[4] = 31
	inq[5] = 0x10 // TPGS 01b: implicit ALUA
	q, err := ParseInquiry(inq)
	if err != nil || q.TPGS != 1 {
		t.Fatalf("TPGS = %d, %v", q.TPGS, err)
	}
	var c Command
	c.ReportTargetPortGroups(make([]byte, 64))
	if c.CDB[0] != OpMaintenanceIn || c.CDB[1] != SAReportTargetPortGroups || c.CDB[9] != 64 || c.Dir != DirRead {
		t.Fatalf("CDB % x", c.CDB[:c.CDBLen])
	}
}

func FuzzParseReportTargetPortGroups(f *testing.F) {
	f.Add([]byte{0, 0, 0, 12, 0x80, 0x0F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0E, 0, 0xff, 0xff, 0, 0, 0, 0xff})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		gs, err := ParseReportTargetPortGroups(b)
		if err != nil {
			return
		}
		total := 0
		for _, g := range gs {
			if g.State > 0xF {
				t.Fatalf("state %d", g.State)
			}
			total += 8 + 4*len(g.Ports)
		}
		if total > len(b)-4 || len(gs) > maxTPGs {
			t.Fatalf("decoded %d bytes of descriptors from %d bytes", total, len(b))
		}
	})
}
