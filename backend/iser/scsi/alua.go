package scsi

// Asymmetric logical unit access (ALUA, SPC-5 §5.16): a logical unit reachable through several
// target port groups, each in an access state. INQUIRY's TPGS field says whether the LU does
// ALUA; VPD page 0x83's target port group designator names the group of the port a command
// came through; REPORT TARGET PORT GROUPS (SPC-5 §6.36) lists each group's state.

import (
	"encoding/binary"
	"fmt"
)

// SAReportTargetPortGroups is the MAINTENANCE IN service action of REPORT TARGET PORT GROUPS.
const SAReportTargetPortGroups = 0x0A

// ALUAState is a target port group's asymmetric access state (SPC-5 table 165).
type ALUAState uint8

// Access states.
const (
	ALUAOptimized     ALUAState = 0x0
	ALUANonOptimized  ALUAState = 0x1
	ALUAStandby       ALUAState = 0x2
	ALUAUnavailable   ALUAState = 0x3
	ALUAOffline       ALUAState = 0xE
	ALUATransitioning ALUAState = 0xF
)

func (s ALUAState) String() string {
	switch s {
	case ALUAOptimized:
		return "active/optimized"
	case ALUANonOptimized:
		return "active/non-optimized"
	case ALUAStandby:
		return "standby"
	case ALUAUnavailable:
		return "unavailable"
	case ALUAOffline:
		return "offline"
	case ALUATransitioning:
		return "transitioning"
	}
	return fmt.Sprintf("reserved(0x%x)", uint8(s))
}

// Active reports a state in which READ and WRITE are served.
func (s ALUAState) Active() bool { return s == ALUAOptimized || s == ALUANonOptimized }

// TargetPortGroup is one descriptor of REPORT TARGET PORT GROUPS.
type TargetPortGroup struct {
	Preferred bool // PREF: the preferred group for this LU
	State     ALUAState
	ID        uint16
	Ports     []uint16 // relative target port identifiers
}

// ReportTargetPortGroups builds REPORT TARGET PORT GROUPS (SPC-5 §6.36, length-only format).
func (c *Command) ReportTargetPortGroups(buf []byte) {
	c.start(OpMaintenanceIn, 12, DirRead, buf)
	c.CDB[1] = SAReportTargetPortGroups
	binary.BigEndian.PutUint32(c.CDB[6:10], uint32(len(buf)))
}

// maxTPGs bounds the descriptors decoded from one answer (a lying target could claim more).
const maxTPGs = 256

// ParseReportTargetPortGroups decodes the length-only parameter data of REPORT TARGET PORT
// GROUPS. A descriptor running past the data (a short allocation or a lying length) ends the list.
func ParseReportTargetPortGroups(b []byte) ([]TargetPortGroup, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("REPORT TARGET PORT GROUPS: %w (%d bytes)", ErrShortData, len(b))
	}
	n := int(binary.BigEndian.Uint32(b[0:4]))
	p := b[4:]
	if n < len(p) {
		p = p[:n]
	}
	var out []TargetPortGroup
	for len(p) >= 8 && len(out) < maxTPGs {
		ports := int(p[7])
		if 8+4*ports > len(p) {
			break
		}
		g := TargetPortGroup{
			Preferred: p[0]&0x80 != 0,
			State:     ALUAState(p[0] & 0x0F),
			ID:        binary.BigEndian.Uint16(p[2:4]),
		}
		for i := range ports {
			d := p[8+4*i:]
			g.Ports = append(g.Ports, binary.BigEndian.Uint16(d[2:4]))
		}
		out = append(out, g)
		p = p[8+4*ports:]
	}
	return out, nil
}

// PortGroup returns the target port group designator of VPD page 0x83 (type 5, association
// target port): the group of the port the INQUIRY came through.
func PortGroup(ds []Designator) (uint16, bool) {
	for _, d := range ds {
		if d.Type == DesigTPG && d.Association == AssocPort && len(d.Value) >= 4 {
			return binary.BigEndian.Uint16(d.Value[2:4]), true
		}
	}
	return 0, false
}
