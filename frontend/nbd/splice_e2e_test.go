//go:build e2e

package nbd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// TestSplicedReadsFromTGTD: with the cache off, 1 MiB READs through `iser-blk serve` in front of a
// real tgtd are spliced (iSCSI socket -> pipe -> NBD socket; the gateway logs how many per
// connection) and return exactly the LUN's bytes, which the test wrote into the backing file.
func TestSplicedReadsFromTGTD(t *testing.T) {
	const size = 64 << 20
	tg := tgtd.Start(t, tgtd.Options{Size: size, Params: map[string]string{
		"MaxRecvDataSegmentLength": "262144", "MaxXmitDataSegmentLength": "262144",
		"MaxBurstLength": "1048576", "FirstBurstLength": "262144",
	}})
	data := make([]byte, size)
	rand.Read(data)
	f, err := os.OpenFile(tg.BackingFile, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	srv := gateway.Start(t, fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN), "--cache", "off", "--splice", "--debug")
	for _, requests := range []int{1, 8} {
		out := filepath.Join(t.TempDir(), "out")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "nbdcopy", "--no-extents", "--connections=1",
			"--request-size=1048576", "--requests="+strconv.Itoa(requests), srv.URI, out)
		msg, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("nbdcopy: %v\n%s", err, msg)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			i := 0
			for i < len(got) && i < len(data) && got[i] == data[i] {
				i++
			}
			t.Fatalf("requests=%d: %d bytes read, first difference at byte %d of %d", requests, len(got), i, len(data))
		}
	}
	srv.Stop(t)
	spliced := 0
	for _, m := range regexp.MustCompile(`"spliced_reads":\s*(\d+)`).FindAllStringSubmatch(srv.Log(), -1) {
		n, _ := strconv.Atoi(m[1])
		spliced += n
	}
	retried := strings.Count(srv.Log(), "spliced read retried through ReadAt")
	t.Logf("%d READs spliced, %d of them served again through ReadAt", spliced, retried)
	if spliced < size>>20 {
		t.Fatalf("%d READs were spliced, want at least the %d of one copy; log:\n%s", spliced, size>>20, srv.Log())
	}
}
