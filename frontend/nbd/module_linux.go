package nbd

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// LoadModule makes sure the kernel has the nbd driver (Documentation/admin-guide/blockdev/nbd.rst),
// loading it with `modprobe nbd` when /sys/module/nbd is absent, as frontend/ublk does for
// ublk_drv. Attach calls it before it logs in, so a host without nbd costs no session: the error
// wraps ErrNoKernelNBD and says what modprobe said.
func LoadModule() error { return loadModule("/sys/module/nbd", "modprobe") }

func loadModule(sysModule, modprobe string) error {
	if _, err := os.Stat(sysModule); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("nbd: %w", err)
	}
	out, err := exec.Command(modprobe, "nbd").CombinedOutput()
	if _, serr := os.Stat(sysModule); serr == nil {
		return nil
	}
	why := strings.TrimSpace(string(out))
	if why == "" && err != nil {
		why = err.Error()
	}
	return fmt.Errorf("%w: `modprobe nbd` failed (%s); use --ublk, or install the kernel's nbd module", ErrNoKernelNBD, why)
}
