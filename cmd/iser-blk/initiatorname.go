package main

import (
	"bufio"
	"os"
	"strings"
)

// openISCSIInitiatorNameFile is open-iscsi's initiator name file. Reading it makes the default
// name the one this host already logs in with, so existing target ACLs match.
const openISCSIInitiatorNameFile = "/etc/iscsi/initiatorname.iscsi"

// defaultInitiatorName is --initiator-name's default: the InitiatorName= of open-iscsi's file
// when there is one, as iscsid reads it, else a name derived from the host name. Either way it
// is stable per host, so target ACLs keep matching across runs.
func defaultInitiatorName() string {
	if name := initiatorNameFromFile(openISCSIInitiatorNameFile); name != "" {
		return name
	}
	return hostInitiatorName()
}

// initiatorNameFromFile returns the value of the first InitiatorName= line of path (lines
// starting with # are comments, blanks around the name are dropped), or "" when the file is
// missing, unreadable or names none.
func initiatorNameFromFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if v, ok := strings.CutPrefix(line, "InitiatorName="); ok {
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
	}
	return ""
}

// hostInitiatorName is an IQN derived from the host name (lower case, anything but letters,
// digits, '-' and '.' replaced by '-').
func hostInitiatorName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	var b strings.Builder
	for _, c := range strings.ToLower(h) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	return "iqn.2025-01.io.iser-blk:" + b.String()
}
