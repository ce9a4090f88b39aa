package modes

import (
	"encoding/json"
	"testing"
)

func TestCacheText(t *testing.T) {
	for _, c := range []Cache{WriteBack, WriteThrough, Off} {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back Cache
		if err := json.Unmarshal(b, &back); err != nil || back != c {
			t.Fatalf("%v → %s → %v, %v", c, b, back, err)
		}
		if p, err := ParseCache(c.String()); err != nil || p != c {
			t.Fatalf("ParseCache(%q) = %v, %v", c, p, err)
		}
	}
	for _, bad := range []string{`"wb"`, `""`, `"WriteBack"`, `7`} {
		var c Cache
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("%s decoded as %v: a file is not a flag", bad, c)
		}
	}
	if _, err := json.Marshal(Cache(9)); err == nil {
		t.Error("an unnamed mode marshalled")
	}
	for in, want := range map[string]Cache{"wb": WriteBack, "": WriteBack, "WT": WriteThrough, "none": Off} {
		if got, err := ParseCache(in); err != nil || got != want {
			t.Errorf("ParseCache(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseCache("fast"); err == nil {
		t.Error("ParseCache accepted fast")
	}
}

func TestFrontendKernelDevice(t *testing.T) {
	if !NBD.KernelDevice() || !Ublk.KernelDevice() || NBDSocket.KernelDevice() || Frontend("scsi").KernelDevice() {
		t.Fatal("KernelDevice is wrong")
	}
}
