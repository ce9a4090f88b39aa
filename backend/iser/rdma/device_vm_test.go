//go:build vm && cgo && linux && !nordma

package rdma_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/rdma"
	"github.com/iser-blk/iser-blk/pool"
)

const devInitiator = "iqn.2026-11.io.iser-blk:rdma-device-test"

func envURL(t *testing.T, name string) string {
	t.Helper()
	u := os.Getenv(name)
	if u == "" {
		t.Fatalf("%s not set: run inside the QEMU guest with an iSER target (make test-vm)", name)
	}
	return u
}

// ourRes counts rdma objects of kind that belong to this process's threads.
func ourRes(t *testing.T, kind string) int {
	t.Helper()
	out, err := exec.Command("rdma", "res", "show", kind).CombinedOutput()
	if err != nil {
		t.Fatalf("rdma res show %s: %v\n%s", kind, err, out)
	}
	tids, _ := os.ReadDir("/proc/self/task")
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		for _, tid := range tids {
			if strings.Contains(line+" ", " pid "+tid.Name()+" ") {
				n++
				break
			}
		}
	}
	return n
}

// TestDeviceInfoISERMatchesTCP opens the same LUN over iser:// and iscsi:// and compares what
// `iser-blk info` prints (the probed Info), apart from the URL and the per-command cap that iSER
// adds (RFC 7145 has no key for it; see rdma.DefaultMaxTransfer).
func TestDeviceInfoISERMatchesTCP(t *testing.T) {
	iserURL, tcpURL := envURL(t, "ISER_URL"), envURL(t, "ISCSI_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	di, err := iser.Open(ctx, iserURL, iser.Options{InitiatorName: devInitiator})
	if err != nil {
		t.Fatalf("open %s: %v", iserURL, err)
	}
	ii := di.Info()
	if err := di.Close(); err != nil {
		t.Fatalf("close iSER device: %v", err)
	}
	dt, err := iser.Open(ctx, tcpURL, iser.Options{InitiatorName: devInitiator})
	if err != nil {
		t.Fatalf("open %s: %v", tcpURL, err)
	}
	ti := dt.Info()
	dt.Close()
	t.Logf("iSER: %+v", ii)
	t.Logf("TCP:  %+v", ti)
	if ii.MaxTransfer > rdma.DefaultMaxTransfer {
		t.Errorf("iSER max transfer %d above the iSER cap %d", ii.MaxTransfer, rdma.DefaultMaxTransfer)
	}
	ii.URL, ti.URL = "", ""
	ii.MaxTransfer, ti.MaxTransfer = 0, 0
	if ii.OptimalTransfer > rdma.DefaultMaxTransfer || ti.OptimalTransfer > rdma.DefaultMaxTransfer {
		ii.OptimalTransfer, ti.OptimalTransfer = 0, 0 // capped by MaxTransfer on the iSER side
	}
	if !reflect.DeepEqual(ii, ti) {
		t.Fatalf("Info differs between iSER and TCP:\niser %+v\ntcp  %+v", ii, ti)
	}
}

// TestDeviceRandomIO writes 256 MiB (ISER_IO_MIB) of random data in random-sized requests of
// 4 KiB to 4 MiB, 64 in flight, from pool buffers, reads it back with a different random split
// and compares byte for byte. Memory registrations must not grow with the number of requests.
func TestDeviceRandomIO(t *testing.T) {
	url := envURL(t, "ISER_URL")
	total := int64(256 << 20)
	if v := os.Getenv("ISER_IO_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		total = int64(n) << 20
	}
	const inflight = 64
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p, err := pool.New(pool.Config{MaxBytes: 320 << 20, MaxClass: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rdma.SetPool(p)
	defer rdma.SetPool(nil)
	before := rdma.Stats()

	d, err := iser.Open(ctx, url, iser.Options{InitiatorName: devInitiator})
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	if d.Size() < total {
		d.Close()
		t.Fatalf("LUN of %d bytes is smaller than the %d-byte test", d.Size(), total)
	}
	t.Logf("device: %d bytes, block %d, max transfer %d", d.Size(), d.BlockSize(), d.Limits().MaxTransfer)

	ref := make([]byte, total)
	rng := rand.New(rand.NewChaCha8([32]byte{1, 2, 3}))
	for i := 0; i < len(ref); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			ref[i+j] = byte(v >> (8 * j))
		}
	}
	split := func(seed uint64) [][2]int64 {
		r := rand.New(rand.NewPCG(seed, seed))
		var ch [][2]int64
		for off := int64(0); off < total; {
			n := int64(1+r.IntN(1024)) * 4096 // 4 KiB .. 4 MiB
			n = min(n, total-off)
			ch = append(ch, [2]int64{off, n})
			off += n
		}
		r.Shuffle(len(ch), func(i, j int) { ch[i], ch[j] = ch[j], ch[i] })
		return ch
	}
	run := func(name string, chunks [][2]int64, write bool) {
		start := time.Now()
		work := make(chan [2]int64)
		errs := make(chan error, inflight)
		var wg sync.WaitGroup
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range work {
					off, n := c[0], c[1]
					buf, err := p.Get(ctx, int(n))
					if err != nil {
						errs <- err
						return
					}
					if write {
						copy(buf, ref[off:off+n])
						err = d.WriteAt(ctx, buf, off, 0)
					} else {
						clear(buf)
						err = d.ReadAt(ctx, buf, off)
						if err == nil && !bytes.Equal(buf, ref[off:off+n]) {
							err = fmt.Errorf("read [%d,+%d) differs from what was written", off, n)
						}
					}
					p.Put(buf)
					if err != nil {
						errs <- fmt.Errorf("%s [%d,+%d): %w", name, off, n, err)
						return
					}
				}
			}()
		}
	feed:
		for _, c := range chunks {
			select {
			case work <- c:
			case err := <-errs:
				close(work)
				wg.Wait()
				d.Close()
				t.Fatal(err)
				break feed
			}
		}
		close(work)
		wg.Wait()
		select {
		case err := <-errs:
			d.Close()
			t.Fatal(err)
		default:
		}
		el := time.Since(start)
		t.Logf("%s: %d requests, %d MiB in %v (%.1f MB/s)", name, len(chunks), total>>20, el.Round(time.Millisecond),
			float64(total)/el.Seconds()/1e6)
	}
	wchunks, rchunks := split(7), split(11)
	run("write", wchunks, true)
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	run("read+verify", rchunks, false)

	mid := rdma.Stats()
	st := p.Stats()
	regs := mid.MRRegistrations - before.MRRegistrations
	t.Logf("MR registrations during the run: %d (pool regions %d, sessions 1); requests %d; pool gets %d",
		regs, st.Regions, len(wchunks)+len(rchunks), st.Gets)
	// one registration per pool region per connection plus the connection's descriptor MR,
	// however many requests ran
	if regs != int64(st.Regions)+1 {
		t.Fatalf("%d registrations for %d pool regions: memory is not registered once per region", regs, st.Regions)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	after := rdma.Stats()
	if after.LiveQPs != before.LiveQPs || after.LiveCQs != before.LiveCQs || after.LiveMRs != before.LiveMRs ||
		after.LivePDs != before.LivePDs {
		t.Fatalf("leak after close: before %+v after %+v", before, after)
	}
	for _, kind := range []string{"qp", "cq", "mr", "pd"} {
		if n := ourRes(t, kind); n != 0 {
			out, _ := exec.Command("rdma", "res", "show", kind).CombinedOutput()
			t.Errorf("after close, rdma res show %s lists %d of ours:\n%s", kind, n, out)
		}
	}
}
