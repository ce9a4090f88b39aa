package csi

import (
	"strings"
	"testing"
)

// TestMountedIn: mount points are found in mountinfo, escapes included, and only whole paths.
func TestMountedIn(t *testing.T) {
	const table = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
100 22 259:0 / /var/lib/kubelet/plugins/staging\040dir rw - ext4 /dev/ublkb0 rw
101 22 259:0 / /var/lib/kubelet/pods/p/volumes/v/mount rw - ext4 /dev/ublkb0 rw
`
	for path, want := range map[string]bool{
		"/var/lib/kubelet/plugins/staging dir":        true,
		"/var/lib/kubelet/pods/p/volumes/v/mount/":    true,
		"/var/lib/kubelet/pods/p/volumes/v":           false,
		"/var/lib/kubelet/plugins/staging\\040dir":    false,
		"/var/lib/kubelet/pods/p/volumes/v/mount/sub": false,
	} {
		got, err := mountedIn(strings.NewReader(table), path)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", path, got, err, want)
		}
	}
}

// TestExecArgs: the attach command line for each frontend choice, with the secrets as files.
func TestExecArgs(t *testing.T) {
	spec := GatewaySpec{Name: "csi-0123456789abcdef", Targets: []string{testTarget, "iscsi://192.0.2.11/iqn.2001-04.com.example:disk1/1"}}
	for _, tt := range []struct {
		frontend string
		ublk     bool
		want     string
	}{
		{"", true, "--ublk"},
		{"", false, "--nbd auto"},
		{"nbd", true, "--nbd auto"},
		{"ublk", false, "--ublk"},
	} {
		spec.Frontend = FrontendAuto
		if tt.frontend != "" {
			v, err := ParseVolumeContext(map[string]string{KeyTargets: testTarget, KeyFrontend: tt.frontend})
			if err != nil {
				t.Fatal(err)
			}
			spec.Frontend = v.Frontend
		}
		g := &ExecGateways{RunDir: "/run/iser-blk", HasUblk: func() bool { return tt.ublk }}
		args := strings.Join(g.Args(spec), " ")
		want := "attach --name csi-0123456789abcdef --run-dir /run/iser-blk --cache writeback " + tt.want +
			" --target " + testTarget + " --target iscsi://192.0.2.11/iqn.2001-04.com.example:disk1/1"
		if args != want {
			t.Errorf("frontend %q, ublk %v:\n got %s\nwant %s", tt.frontend, tt.ublk, args, want)
		}
	}
}

// TestExecEnv: the gateway's environment has the run directory and no CHAP secret of the
// plugin's own environment.
func TestExecEnv(t *testing.T) {
	t.Setenv("ISERBLK_CHAP_SECRET", "leak")
	t.Setenv("ISERBLK_CHAP_SECRET_MUTUAL", "leak")
	t.Setenv("ISERBLK_RUN_DIR", "/elsewhere")
	env := strings.Join((&ExecGateways{RunDir: "/run/x"}).env(), "\n")
	if strings.Contains(env, "leak") || strings.Contains(env, "/elsewhere") || !strings.Contains(env, "ISERBLK_RUN_DIR=/run/x") {
		t.Errorf("gateway environment:\n%s", env)
	}
}
