package ublk

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

func TestRecoveryFlags(t *testing.T) {
	all := uint64(FeatUserRecovery | FeatUserRecoveryReissue | FeatUserRecoveryFailIO)
	k612 := uint64(FeatUserRecovery | FeatUserRecoveryReissue) // Debian's 6.12: no FAIL_IO
	for _, c := range []struct {
		mode RecoveryMode
		feat uint64
		want uint64
	}{
		{RecoveryNone, all, 0},
		{RecoveryReissue, all, FeatUserRecovery | FeatUserRecoveryReissue},
		{RecoveryFailIO, all, FeatUserRecovery | FeatUserRecoveryFailIO},
		{RecoveryFailIO, k612, FeatUserRecovery | FeatUserRecoveryReissue},
		{RecoveryReissue, FeatUserRecovery, FeatUserRecovery},
		{RecoveryReissue, 0, 0},
	} {
		if got := recoveryFlags(c.mode, c.feat, zap.NewNop()); got != c.want {
			t.Errorf("mode %d features %#x: flags %#x, want %#x", c.mode, c.feat, got, c.want)
		}
	}
}

func TestCheckGeometry(t *testing.T) {
	var p Params
	p.Basic.DevSectors = 2048
	p.Basic.LogicalBSShift = 9
	if err := checkGeometry(p, 1<<20, block.Limits{LogicalBlockSize: 512}); err != nil {
		t.Fatal(err)
	}
	if err := checkGeometry(p, 2<<20, block.Limits{LogicalBlockSize: 512}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("size mismatch: %v", err)
	}
	if err := checkGeometry(p, 1<<20, block.Limits{LogicalBlockSize: 4096}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("block size mismatch: %v", err)
	}
}

func TestPidAlive(t *testing.T) {
	if !pidAlive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	if pidAlive(0) || pidAlive(-1) {
		t.Fatal("non-positive pid is alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if pidAlive(pid) {
		t.Fatal("reaped child is alive")
	}
}

// classPool is a BufferPool whose largest buffer is max bytes.
type classPool struct {
	BufferPool
	max int
}

func (p classPool) MaxClass() int { return p.max }

// A recovered device keeps its request size, so a pool whose buffers are smaller is refused
// (Start lowers the size to the pool's instead).
func TestRecoverChecksThePoolClass(t *testing.T) {
	if err := checkPoolClass(classPool{max: 256 << 10}, 512<<10); !errors.Is(err, ErrMismatch) {
		t.Fatalf("pool of 256 KiB buffers for 512 KiB requests: %v, want ErrMismatch", err)
	}
	if err := checkPoolClass(classPool{max: 1 << 20}, 512<<10); err != nil {
		t.Fatalf("pool of 1 MiB buffers for 512 KiB requests: %v", err)
	}
	if err := checkPoolClass(nil, 512<<10); err != nil {
		t.Fatalf("anonymous buffers: %v", err)
	}
}
