package csi

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestRecords: a record reads back as saved, lists by name, refuses a corrupt or foreign file,
// and goes with its secrets; the directory is 0700.
func TestRecords(t *testing.T) {
	rs := RecordsIn(filepath.Join(t.TempDir(), "run"))
	if names, err := rs.Names(); err != nil || len(names) != 0 {
		t.Errorf("names before any record: %q %v", names, err)
	}
	r := Record{VolumeID: "vol-1", Name: GatewayName("vol-1"), Targets: []string{testTargetNorm}, Block: true,
		StagingPath: "/staging", Device: "/dev/ublkb0", SizeBytes: 1 << 30, CHAPUser: "alice"}
	if err := rs.Save(r); err != nil {
		t.Fatal(err)
	}
	if err := rs.SaveSecret(r.Name, SecretCHAPSecret, "pw"); err != nil {
		t.Fatal(err)
	}
	got, ok, err := rs.Load(r.Name)
	r.Version = recordVersion
	if err != nil || !ok || !reflect.DeepEqual(got, r) {
		t.Errorf("load: %+v %v %v, want %+v", got, ok, err, r)
	}
	if names, err := rs.Names(); err != nil || !reflect.DeepEqual(names, []string{r.Name}) {
		t.Errorf("names %q %v", names, err)
	}
	if fi, err := os.Stat(rs.Dir); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o700 {
		t.Errorf("records directory mode %v, want 0700", fi.Mode().Perm())
	}
	if err := os.WriteFile(rs.path("csi-bad"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.Load("csi-bad"); err == nil {
		t.Error("a corrupt record loads")
	}
	if err := os.WriteFile(rs.path("csi-other"), []byte(`{"version":1,"name":"csi-else"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.Load("csi-other"); err == nil {
		t.Error("a record under another name loads")
	}
	if err := os.WriteFile(rs.LogFile(r.Name), []byte("gateway output\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rs.Remove(r.Name); err != nil {
		t.Fatal(err)
	}
	if err := rs.Remove(r.Name); err != nil {
		t.Errorf("second remove: %v", err)
	}
	for _, p := range []string{rs.path(r.Name), rs.SecretFile(r.Name, SecretCHAPSecret), rs.LogFile(r.Name)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survives the remove: %v", p, err)
		}
	}
}
