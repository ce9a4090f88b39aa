//go:build vm

package ublk

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// attachCLI runs `iser-blk attach` with args, waits for the device path, and returns it with a
// stop function (SIGTERM, wait for exit 0).
func attachCLI(t *testing.T, args ...string) (string, func()) {
	t.Helper()
	bin := cliAttach()
	if bin == "" {
		t.Fatal("this test needs $ISERBLK_BIN with attach --ublk (test/vm/run.sh go-test builds it)")
	}
	g := vmtest.StartGateway(t, exec.Command(bin, append([]string{"attach"}, args...)...),
		vmtest.GatewayOptions{Announce: 90 * time.Second})
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		g.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.Exited:
			if g.Err != nil {
				t.Errorf("attach %v: exit after SIGTERM: %v\n%s", args, g.Err, g.Stderr)
			}
		case <-time.After(2 * time.Minute):
			g.Stop()
			t.Errorf("attach %v did not exit after SIGTERM", args)
		}
	}
	t.Cleanup(stop)
	return g.Device, stop
}

type perf struct{ randIOPS, seqMBps float64 }

func measure(t *testing.T, path string) perf {
	t.Helper()
	// 3 s a job: under TCG the ratio is a smoke figure, not a measurement (make bench-vm measures
	// the frontends side by side); what the test needs is each frontend serving both patterns.
	common := []string{"--filename=" + path, "--ioengine=libaio", "--direct=1", "--runtime=3", "--time_based", "--size=128M"}
	r := fio(t, append([]string{"--name=rand4k", "--rw=randread", "--bs=4k", "--iodepth=32"}, common...)...)
	s := fio(t, append([]string{"--name=seq1m", "--rw=read", "--bs=1M", "--iodepth=4"}, common...)...)
	var p perf
	for _, j := range r.Jobs {
		p.randIOPS += j.Read.IOPS
	}
	for _, j := range s.Jobs {
		p.seqMBps += j.Read.IOPS // 1 MiB per I/O
	}
	return p
}

// TestVMCompareNBD is issue acceptance 5: ublk and the kernel NBD frontend, side by side in one
// guest against the same LIO LUN over iSCSI/TCP (4 KiB random read QD32, 1 MiB sequential read).
// TCG numbers are a smoke figure for the ratio, not absolute speed; make bench-vm (vm-iser.sh)
// is where the two frontends are measured.
func TestVMCompareNBD(t *testing.T) {
	requireUblk(t)
	vmtest.LoadModules(t, "nbd")
	var report []string
	for _, c := range []struct{ name, url string }{
		{"lio-tcp", lioTarget(t)},
		{"memdev", "mem://256MiB"}, // no network: the frontends' own cost
	} {
		dev, stop := attachCLI(t, "--ublk", "--target", c.url, "--queues", "2", "--depth", "64")
		// Prime the LUN so reads return data the target actually holds.
		fio(t, "--name=fill", "--filename="+dev, "--ioengine=libaio", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=4", "--size=128M")
		u := measure(t, dev)
		stop()
		dev, stop = attachCLI(t, "--nbd", "auto", "--target", c.url, "--connections", "2")
		if c.name == "memdev" {
			fio(t, "--name=fill", "--filename="+dev, "--ioengine=libaio", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=4", "--size=128M")
		}
		n := measure(t, dev)
		stop()
		if u.randIOPS <= 0 || n.randIOPS <= 0 || u.seqMBps <= 0 || n.seqMBps <= 0 {
			t.Fatalf("%s: a measurement is empty: ublk %+v nbd %+v", c.name, u, n)
		}
		line := fmt.Sprintf("%s: 4 KiB randread QD32 ublk %.0f IOPS, nbd %.0f IOPS (ratio %.2f); 1 MiB seq read QD4 ublk %.1f MiB/s, nbd %.1f MiB/s (ratio %.2f)",
			c.name, u.randIOPS, n.randIOPS, u.randIOPS/n.randIOPS, u.seqMBps, n.seqMBps, u.seqMBps/n.seqMBps)
		t.Log(line)
		report = append(report, line)
	}
	if res := os.Getenv(vmtest.EnvResults); res != "" {
		_ = os.WriteFile(res+"/ublk-vs-nbd.txt", []byte(strings.Join(report, "\n")+"\n"), 0o644)
	}
}
