//go:build e2e

package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

const e2eInitiator = "iqn.2026-11.io.iser-blk:e2e-initiator"

func dialTGT(t *testing.T, tg *tgtd.Target, prop login.Proposal, chap *login.CHAP) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Dial(ctx, Config{
		Portal: tg.Portal, InitiatorName: e2eInitiator, TargetName: tg.Name, CHAP: chap,
		Proposal: prop, Logger: zaptest.NewLogger(t).Named("session"),
	})
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	clearUnitAttention(t, s)
	return s
}

// clearUnitAttention sends TEST UNIT READY until the LUN stops reporting the UNIT ATTENTION a
// new I_T nexus starts with (SPC-5 §5.14: power on, reset, or bus device reset occurred).
func clearUnitAttention(t *testing.T, s *Session) {
	t.Helper()
	var cmd scsi.Command
	var resp scsi.Response
	cmd = scsi.Command{LUN: scsi.EncodeLUN(1), CDBLen: 6, Dir: scsi.DirNone, Attr: scsi.AttrSimple}
	for i := 0; i < 4; i++ {
		if err := s.Execute(context.Background(), &cmd, &resp); err != nil {
			t.Fatalf("TEST UNIT READY: %v", err)
		}
		if resp.Status == scsi.StatusGood {
			return
		}
		if resp.Status != scsi.StatusCheckCondition || resp.SenseLen < 3 || resp.Sense[2]&0x0f != 0x06 {
			t.Fatalf("TEST UNIT READY: status %v sense % x", resp.Status, resp.Sense[:resp.SenseLen])
		}
	}
	t.Fatalf("TEST UNIT READY keeps reporting UNIT ATTENTION")
}

type extent struct{ off, n int64 }

// mixedExtents splits [0,total) into extents of 4 KiB..4 MiB (multiples of 4 KiB, a third of
// them small, a third around the 256 KiB burst sizes, a third large).
func mixedExtents(rng *rand.Rand, total int64) []extent {
	var ex []extent
	for off := int64(0); off < total; {
		var n int64
		switch rng.IntN(3) {
		case 0:
			n = int64(1+rng.IntN(16)) * 4096 // 4..64 KiB
		case 1:
			n = int64(48+rng.IntN(32)) * 4096 // ~192..320 KiB: crosses FirstBurst/MaxBurst
		default:
			n = int64(256+rng.IntN(769)) * 4096 // 1..4 MiB
		}
		n = min(n, total-off)
		ex = append(ex, extent{off, n})
		off += n
	}
	rng.Shuffle(len(ex), func(i, j int) { ex[i], ex[j] = ex[j], ex[i] })
	return ex
}

// runParallel executes one command per extent with `depth` in flight.
func runParallel(t *testing.T, s *Session, ex []extent, depth int, write bool, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := make(chan extent)
	errs := make(chan error, depth)
	var wg sync.WaitGroup
	for w := 0; w < depth; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cmd scsi.Command
			var resp scsi.Response
			for e := range work {
				rw16(&cmd, write, e.off, data[e.off:e.off+e.n])
				if err := s.Execute(ctx, &cmd, &resp); err != nil {
					errs <- fmt.Errorf("extent [%d,+%d): %w", e.off, e.n, err)
					cancel()
					return
				}
				if resp.Status != scsi.StatusGood || resp.Residual != 0 {
					errs <- fmt.Errorf("extent [%d,+%d): status %v residual %d sense % x", e.off, e.n,
						resp.Status, resp.Residual, resp.Sense[:resp.SenseLen])
					cancel()
					return
				}
			}
		}()
	}
feed:
	for _, e := range ex {
		select {
		case work <- e:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func writeReadVerify(t *testing.T, s *Session, total int64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	data := make([]byte, total)
	cr := rand.NewChaCha8([32]byte{byte(seed)})
	_, _ = cr.Read(data)
	ex := mixedExtents(rng, total)
	start := time.Now()
	runParallel(t, s, ex, 64, true, data)
	wrote := time.Since(start)
	got := make([]byte, total)
	start = time.Now()
	runParallel(t, s, ex, 64, false, got)
	read := time.Since(start)
	if !bytes.Equal(data, got) {
		for i := range data {
			if data[i] != got[i] {
				t.Fatalf("read back differs from what was written, first at byte %d", i)
			}
		}
	}
	t.Logf("%d MiB in %d commands of 4 KiB..4 MiB, 64 in flight: write %v, read %v; %v",
		total>>20, len(ex), wrote.Round(time.Millisecond), read.Round(time.Millisecond), fmtParams(s.Params()))
}

// TestE2EReadWrite256MiB is acceptance item 2: 256 MiB of random data, 64 commands in flight,
// mixed sizes, read back byte-exact, against tgtd with its default keys (InitialR2T=Yes,
// ImmediateData=Yes, 8 KiB segments, 256 KiB bursts).
func TestE2EReadWrite256MiB(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 256 << 20})
	s := dialTGT(t, tg, login.DefaultProposal(), nil)
	writeReadVerify(t, s, 256<<20, 1)
	// Cross-check a slice of the backing file directly.
	b, err := tg.ReadBacking(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	var cmd scsi.Command
	var resp scsi.Response
	rw16(&cmd, false, 0, got)
	if err := s.Execute(context.Background(), &cmd, &resp); err != nil || !bytes.Equal(b, got) {
		t.Fatalf("backing file and READ disagree (err %v)", err)
	}
}

// TestE2EKeyCombinations repeats the write/read check for ImmediateData × InitialR2T and for
// both digest settings, with larger segments so R2T sequences span several Data-Out PDUs.
func TestE2EKeyCombinations(t *testing.T) {
	const size = 96 << 20
	for _, digest := range []string{"None", "CRC32C"} {
		for _, imm := range []string{"Yes", "No"} {
			for _, r2t := range []string{"Yes", "No"} {
				name := fmt.Sprintf("Digest=%s/ImmediateData=%s/InitialR2T=%s", digest, imm, r2t)
				t.Run(name, func(t *testing.T) {
					tg := tgtd.Start(t, tgtd.Options{Size: size, Params: map[string]string{
						"ImmediateData": imm, "InitialR2T": r2t,
						"HeaderDigest": digest, "DataDigest": digest,
						"MaxRecvDataSegmentLength": "65536", "MaxBurstLength": "262144", "FirstBurstLength": "131072",
					}})
					prop := login.DefaultProposal()
					prop.ImmediateData, prop.InitialR2T = true, false
					if digest == "CRC32C" {
						prop.HeaderDigest, prop.DataDigest = login.DigestCRC32C, login.DigestCRC32C
					}
					s := dialTGT(t, tg, prop, nil)
					p := s.Params()
					if p.ImmediateData != (imm == "Yes") || p.InitialR2T != (r2t == "Yes") ||
						p.HeaderDigest != (digest == "CRC32C") || p.DataDigest != (digest == "CRC32C") {
						t.Fatalf("negotiated %v, target configured %s", fmtParams(p), name)
					}
					total := int64(size)
					if digest == "CRC32C" {
						total = 64 << 20
					}
					writeReadVerify(t, s, total, uint64(len(name)))
				})
			}
		}
	}
}

func TestE2ECHAP(t *testing.T) {
	in := &tgtd.Account{User: "e2e-user", Password: "e2e-secret-123"}
	out := &tgtd.Account{User: "e2e-target", Password: "e2e-target-secret-456"}
	tg := tgtd.Start(t, tgtd.Options{Size: 8 << 20, CHAP: in, MutualCHAP: out})

	t.Run("one-way", func(t *testing.T) {
		s := dialTGT(t, tg, login.DefaultProposal(), &login.CHAP{User: in.User, Secret: in.Password})
		ping(t, s)
	})
	t.Run("mutual", func(t *testing.T) {
		s := dialTGT(t, tg, login.DefaultProposal(), &login.CHAP{User: in.User, Secret: in.Password,
			TargetUser: out.User, TargetSecret: out.Password})
		ping(t, s)
	})
	t.Run("wrong-secret", func(t *testing.T) {
		start := time.Now()
		err := loginErr(t, tg.Portal, tg.Name, &login.CHAP{User: in.User, Secret: "not-the-secret"})
		if time.Since(start) > 5*time.Second {
			t.Fatalf("wrong secret took %v to fail", time.Since(start))
		}
		if !errors.Is(err, login.ErrAuthFailed) || !strings.Contains(err.Error(), tg.Name) ||
			!strings.Contains(err.Error(), "authentication failed") {
			t.Fatalf("wrong secret: %v", err)
		}
		if strings.Contains(err.Error(), "not-the-secret") {
			t.Fatalf("error leaks the secret: %v", err)
		}
	})
	t.Run("wrong-mutual-secret", func(t *testing.T) {
		err := loginErr(t, tg.Portal, tg.Name, &login.CHAP{User: in.User, Secret: in.Password,
			TargetUser: out.User, TargetSecret: "wrong-target-secret"})
		if !errors.Is(err, login.ErrAuthFailed) || !strings.Contains(err.Error(), tg.Name) {
			t.Fatalf("wrong mutual secret: %v", err)
		}
	})
	t.Run("no-credentials", func(t *testing.T) {
		err := loginErr(t, tg.Portal, tg.Name, nil)
		if !errors.Is(err, login.ErrAuthFailed) {
			t.Fatalf("no credentials against a CHAP target: %v", err)
		}
	})
}

func TestE2ELoginErrors(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 8 << 20})
	t.Run("wrong-iqn", func(t *testing.T) {
		err := loginErr(t, tg.Portal, tg.Name+"-nope", nil)
		if !errors.Is(err, login.ErrTargetNotFound) || !strings.Contains(err.Error(), "target not found") {
			t.Fatalf("wrong IQN: %v", err)
		}
	})
	t.Run("closed-port", func(t *testing.T) {
		err := loginErr(t, tgtd.ClosedPort(t), tg.Name, nil)
		if !errors.Is(err, login.ErrPortalUnreachable) || !strings.Contains(err.Error(), "portal unreachable") {
			t.Fatalf("closed port: %v", err)
		}
	})
	t.Run("relogin-after-connection-loss", func(t *testing.T) {
		s := dialTGT(t, tg, login.DefaultProposal(), nil)
		c := s.cur.Load()
		c.tc.Close() // the network goes away
		<-s.Done()
		var cmd scsi.Command
		var resp scsi.Response
		rw16(&cmd, false, 0, make([]byte, 4096))
		if err := s.Execute(context.Background(), &cmd, &resp); !errors.Is(err, block.ErrIO) {
			t.Fatalf("command on a dead connection: %v", err)
		}
		if err := s.Login(context.Background()); err != nil {
			t.Fatalf("re-login: %v", err)
		}
		if err := s.Execute(context.Background(), &cmd, &resp); err != nil {
			t.Fatalf("command after re-login: %v", err)
		}
		if resp.Status == scsi.StatusCheckCondition { // UNIT ATTENTION after the nexus loss
			if err := s.Execute(context.Background(), &cmd, &resp); err != nil {
				t.Fatalf("command after re-login: %v", err)
			}
		}
		if resp.Status != scsi.StatusGood {
			t.Fatalf("command after re-login: status %v", resp.Status)
		}
	})
}

func TestE2EDiscoveryAndPing(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 8 << 20})
	s := dialTGT(t, tg, login.DefaultProposal(), nil)
	ping(t, s)
}

func ping(t *testing.T, s *Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx, []byte("iser-blk ping")); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

func loginErr(t *testing.T, portal, target string, chap *login.CHAP) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Dial(ctx, Config{Portal: portal, InitiatorName: e2eInitiator, TargetName: target, CHAP: chap,
		Logger: zaptest.NewLogger(t)})
	if err == nil {
		s.Close()
		t.Fatalf("login to %s at %s succeeded", target, portal)
	}
	t.Logf("error as the user sees it: %v", err)
	return err
}

func fmtParams(p login.Params) string { return p.String() }

// TestE2ECancelInFlight cancels writes in flight against tgtd: callers get ctx errors at once,
// the session sends ABORT TASK for what the target still holds, every slot comes back (all
// MaxTasks slots are used again afterwards) and the data path keeps working.
func TestE2ECancelInFlight(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 64 << 20, Params: map[string]string{"ImmediateData": "No"}})
	ctxLogin, cancelLogin := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelLogin()
	s, err := Dial(ctxLogin, Config{Portal: tg.Portal, InitiatorName: e2eInitiator, TargetName: tg.Name,
		MaxTasks: 16, Logger: zaptest.NewLogger(t).Named("session")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	clearUnitAttention(t, s)
	data := make([]byte, 64<<20)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 16)
	started := make(chan struct{}, 16)
	for i := 0; i < 16; i++ {
		go func(i int) {
			var cmd scsi.Command
			var resp scsi.Response
			rw16(&cmd, true, int64(i)*4<<20, data[i*4<<20:(i+1)*4<<20])
			started <- struct{}{}
			errs <- s.Execute(ctx, &cmd, &resp)
		}(i)
	}
	for i := 0; i < 16; i++ {
		<-started
	}
	cancel()
	cancelled := 0
	for i := 0; i < 16; i++ {
		select {
		case err := <-errs:
			if errors.Is(err, context.Canceled) {
				cancelled++
			} else if err != nil {
				t.Fatalf("cancelled write: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a cancelled write did not return within 5 s")
		}
	}
	t.Logf("%d of 16 writes were cancelled in flight", cancelled)
	// Every slot must come back: 16 concurrent reads need all 16.
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var cmd scsi.Command
			var resp scsi.Response
			rw16(&cmd, false, int64(i)*4096, make([]byte, 4096))
			if err := s.Execute(rctx, &cmd, &resp); err != nil || resp.Status != scsi.StatusGood {
				t.Errorf("read after cancellation: %v %v", err, resp.Status)
			}
		}(i)
	}
	wg.Wait()
	if !s.Connected() {
		t.Fatalf("connection lost: %v", s.Err())
	}
}
