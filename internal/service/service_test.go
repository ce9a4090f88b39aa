package service

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/sdnotify/sdnotifytest"
	"github.com/iser-blk/iser-blk/internal/status"
)

// TestOneSourceOfTruth wires every part as serve/attach will: the numbers status reports over
// the control socket equal the ones /metrics reports, READY=1 follows the lifecycle, and a
// detach streams progress, tells systemd it is stopping, and ends the service.
func TestOneSourceOfTruth(t *testing.T) {
	receive := sdnotifytest.Listen(t).Receive
	runDir := filepath.Join(t.TempDir(), "run")
	var io status.IOCounters
	var svc *Service
	svc, err := Start(Options{
		RunDir:        runDir,
		Identity:      status.Identity{Name: "nbd0", Device: "nbd0", FrontendKind: "nbd", FrontendPath: "/dev/nbd0", CacheMode: modes.Off},
		MetricsListen: "127.0.0.1:0",
		Detach: func(ctx context.Context, req control.Request) (control.DetachResult, error) {
			lm := svc.Lifecycle
			_ = lm.CommitTo(lifecycle.Draining, "detach")
			_ = lm.To(lifecycle.Flushing, "")
			lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: 0, WrittenBackBytes: 8192})
			_ = lm.To(lifecycle.Stopped, "")
			return control.DetachResult{PID: os.Getpid(), WrittenBackBytes: 8192}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.SetIO(&io)
	for i := 0; i < 7; i++ {
		io.Begin()
		io.End(status.OpRead, 4096, time.Now(), nil)
	}
	io.Begin()
	io.End(status.OpWrite, 512, time.Now(), nil)

	if err := svc.Lifecycle.To(lifecycle.Ready, ""); err != nil {
		t.Fatal(err)
	}
	if got := receive(); !strings.Contains(got, "READY=1") {
		t.Fatalf("sd_notify after ready: %q", got)
	}

	c, err := control.Dial(t.Context(), runDir, "nbd0")
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	scraped := scrapeCounters(t, svc.MetricsAddr())
	for _, op := range st.IO.Ops {
		if want := float64(op.Requests); scraped["requests_total/"+op.Op] != want {
			t.Errorf("%s: metrics %v requests, status %v", op.Op, scraped["requests_total/"+op.Op], want)
		}
	}
	if st.IO.Ops[status.OpRead].Requests != 7 || scraped["read_bytes_total/"] != 7*4096 || scraped["written_bytes_total/"] != 512 {
		t.Fatalf("status %+v, metrics %v", st.IO.Ops[:2], scraped)
	}

	var states []string
	res, err := c.Detach(t.Context(), control.DetachOptions{}, func(p control.Progress) { states = append(states, p.State) })
	if err != nil || res.WrittenBackBytes != 8192 {
		t.Fatalf("detach: %+v %v", res, err)
	}
	<-svc.Detached()
	if got := receive(); !strings.Contains(got, "STOPPING=1") {
		t.Fatalf("sd_notify at draining: %q", got)
	}
	_ = receive() // STATUS=flushing
	if got := receive(); !strings.Contains(got, "EXTEND_TIMEOUT_USEC=") {
		t.Fatalf("sd_notify during the flush: %q", got)
	}
	if strings.Join(states, ",") != "draining,flushing,flushing,stopped" {
		t.Fatalf("progress states %v", states)
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(control.SocketPath(runDir, "nbd0")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Close: %v", err)
	}
}

// scrapeCounters returns iser_blk_ counter values by "name-without-prefix/op".
func scrapeCounters(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		short, ok := strings.CutPrefix(name, "iser_blk_")
		if !ok {
			continue
		}
		for _, m := range mf.Metric {
			if m.Counter == nil {
				continue
			}
			op := ""
			for _, lp := range m.Label {
				if lp.GetName() == "op" {
					op = lp.GetValue()
				}
			}
			out[short+"/"+op] = m.Counter.GetValue()
		}
	}
	return out
}

func TestSecondGatewayWithTheNameIsRefused(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	t.Setenv("NOTIFY_SOCKET", "")
	first, err := Start(Options{RunDir: runDir, Identity: status.Identity{Name: "gw"}})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = Start(Options{RunDir: runDir, Identity: status.Identity{Name: "gw"}, MetricsListen: "127.0.0.1:0"})
	var inUse *control.NameInUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second Start: %v", err)
	}
}

func TestFailedStartLeavesNothingBehind(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	t.Setenv("NOTIFY_SOCKET", "")
	_, err := Start(Options{RunDir: runDir, Identity: status.Identity{Name: "gw"}, MetricsListen: "256.0.0.1:bad"})
	if err == nil {
		t.Fatal("Start with a bad metrics address succeeded")
	}
	ents, _ := os.ReadDir(runDir)
	if len(ents) != 0 {
		t.Fatalf("run dir after a failed start: %v", ents)
	}
	again, err := Start(Options{RunDir: runDir, Identity: status.Identity{Name: "gw"}})
	if err != nil {
		t.Fatalf("name not free after a failed start: %v", err)
	}
	again.Close()
}
