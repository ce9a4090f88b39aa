//go:build vm

package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These run inside the guest (make test-vm) and check the helpers other packages' VM tests use.

func TestRequireInGuest(t *testing.T) {
	Require(t)
	if fi, err := os.Stat(filepath.Join(GuestDir(t), "lio-target.sh")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("guest helper lio-target.sh not executable in %s: %v", GuestDir(t), err)
	}
}

func TestLoadModules(t *testing.T) {
	Require(t)
	kv := LoadModules(t, "nbd", "ublk", "brd")
	for key, kind := range map[string]os.FileMode{"NBD_DEV": os.ModeDevice, "BRD_DEV": os.ModeDevice, "UBLK_CONTROL": os.ModeCharDevice} {
		fi, err := os.Stat(kv[key])
		if err != nil {
			t.Fatalf("%s=%q: %v", key, kv[key], err)
		}
		if fi.Mode()&kind == 0 {
			t.Fatalf("%s=%s has mode %v, want a device", key, kv[key], fi.Mode())
		}
	}
}

func TestRXEUpIsActiveAndIdempotent(t *testing.T) {
	Require(t)
	a := RXEUp(t)
	b := RXEUp(t) // a second call reuses the device
	if a != b {
		t.Fatalf("second RXEUp = %+v, first %+v", b, a)
	}
	state, err := os.ReadFile(filepath.Join("/sys/class/infiniband", a.Dev, "ports/1/state"))
	if err != nil || !bytes.Contains(state, []byte("ACTIVE")) {
		t.Fatalf("%s port state %q, %v", a.Dev, state, err)
	}
}

// A fileio LUN with 4 KiB blocks: the portal accepts TCP connections, configfs shows the block
// size and the backing file has the size asked for; teardown removes the target.
func TestLIOFileTargetAndTeardown(t *testing.T) {
	Require(t)
	tg := StartLIO(t, LIOOptions{
		IQN: "iqn.2003-01.org.linux-iscsi.iserblk-vm:vmtest-file", File: true,
		SizeMiB: 8, BlockSize: 4096, Port: 3263,
	})
	if tg.BlockSize != 4096 || tg.SizeBytes != 8<<20 || !tg.ISER || tg.RDMADev == "" {
		t.Fatalf("target %+v: want 4096-byte blocks, 8 MiB, iSER on an RDMA device", tg)
	}
	if fi, err := os.Stat(tg.File); err != nil || fi.Size() != tg.SizeBytes {
		t.Fatalf("backing file %s: %v (size %v)", tg.File, err, fi)
	}
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(context.Background(), "tcp", tg.Portal)
	if err != nil {
		t.Fatalf("dial portal %s: %v", tg.Portal, err)
	}
	c.Close()
	if got := tg.URL("iser"); got != "iser://"+tg.Portal+"/"+tg.IQN+"/0" {
		t.Fatalf("URL = %s", got)
	}
	tg.Teardown(t)
	if _, err := os.Stat("/sys/kernel/config/target/iscsi/" + tg.IQN); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target still in configfs after teardown: %v", err)
	}
	if _, err := net.DialTimeout("tcp", tg.Portal, 5*time.Second); err == nil {
		t.Fatalf("portal %s still accepts connections after teardown", tg.Portal)
	}
}

// The ACL path: a listed initiator logs in (open-iscsi over iSER), an unlisted one is refused.
func TestLIOACLWithOpenISCSI(t *testing.T) {
	Require(t)
	const allowed = "iqn.2026-01.org.iserblk:vmtest-allowed"
	tg := StartLIO(t, LIOOptions{
		IQN: "iqn.2003-01.org.linux-iscsi.iserblk-vm:vmtest-acl", SizeMiB: 16, Port: 3264,
		ACLs: []string{allowed},
	})
	sess, err := OpenISCSILogin(t, LoginOptions{Portal: tg.Portal, IQN: tg.IQN, Transport: "iser", Initiator: allowed})
	if err != nil {
		t.Fatalf("allowed initiator: %v", err)
	}
	if sess.Transport != "iser" || !strings.HasPrefix(sess.Dev, "/dev/sd") {
		t.Fatalf("session %+v", sess)
	}
	// LIO refuses the stranger (iscsi_target_nego.c logs that it "is not authorized to access"
	// the TPG). Over iSER the refusal may not reach the initiator, which then reports that its
	// login request got no answer: that counts only with LIO's own word that it refused.
	// The stranger's name is new in every run, so LIO's line about it can only be this login's.
	stranger := fmt.Sprintf("iqn.2026-01.org.iserblk:vmtest-stranger-%d", time.Now().UnixNano())
	_, err = OpenISCSILogin(t, LoginOptions{Portal: tg.Portal, IQN: tg.IQN, Transport: "iser", Initiator: stranger})
	switch {
	case errors.Is(err, ErrLoginRefused):
	case errors.Is(err, ErrLoginUnanswered) && kernelLogHas(t, "iSCSI Initiator Node: "+stranger+" is not authorized"):
		t.Logf("the refusal did not reach the initiator over iSER; LIO logged it: %v", err)
	default:
		t.Fatalf("unlisted initiator: err %v, want a refusal (or no answer and LIO's word that it refused)", err)
	}
}

// kernelLogHas reports whether a line of the kernel log contains s.
func kernelLogHas(t *testing.T, s string) bool {
	t.Helper()
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		t.Fatalf("dmesg: %v", err)
	}
	return strings.Contains(string(out), s)
}

// Demo mode (no ACLs) with CHAP and mutual CHAP set on the TPG, and a write-protected LUN: a
// wrong secret is refused, the right ones log in, and the kernel sees a read-only disk.
func TestLIODemoModeCHAPAndWriteProtect(t *testing.T) {
	Require(t)
	chap := &Credentials{User: "vmtest-user", Secret: "vmtest-secret-1"}
	mutual := &Credentials{User: "vmtest-target", Secret: "vmtest-secret-2"}
	tg := StartLIO(t, LIOOptions{
		IQN: "iqn.2003-01.org.linux-iscsi.iserblk-vm:vmtest-tpgauth", SizeMiB: 8, Port: 3265,
		NoISER: true, CHAP: chap, MutualCHAP: mutual, WriteProtect: true,
	})
	if tg.ISER || tg.RDMADev != "" {
		t.Fatalf("NoISER target reports iSER: %+v", tg)
	}
	_, err := OpenISCSILogin(t, LoginOptions{Portal: tg.Portal, IQN: tg.IQN,
		CHAP: &Credentials{User: chap.User, Secret: "wrong-secret-00"}, MutualCHAP: mutual})
	if !errors.Is(err, ErrLoginRefused) {
		t.Fatalf("wrong CHAP secret: err %v, want ErrLoginRefused", err)
	}
	sess, err := OpenISCSILogin(t, LoginOptions{Portal: tg.Portal, IQN: tg.IQN, CHAP: chap, MutualCHAP: mutual})
	if err != nil {
		t.Fatalf("right CHAP secrets: %v", err)
	}
	ro, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(sess.Dev), "ro"))
	if err != nil || strings.TrimSpace(string(ro)) != "1" {
		t.Fatalf("%s read-only flag %q, %v; want 1 for a write-protected LUN", sess.Dev, ro, err)
	}
}
