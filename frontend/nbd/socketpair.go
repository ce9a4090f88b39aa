package nbd

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// socketPair returns a connected pair of unix stream sockets: the server's end as a net.Conn (so
// the Go netpoller, deadlines and writev work on it) and the other end as an *os.File whose
// descriptor is handed to the kernel (NBD_ATTR_SOCKETS / NBD_SET_SOCK). The caller closes both;
// the kernel holds its own reference once it has taken the descriptor.
func socketPair() (net.Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("nbd: socketpair: %w", err)
	}
	local := os.NewFile(uintptr(fds[0]), "nbd-server")
	remote := os.NewFile(uintptr(fds[1]), "nbd-kernel")
	nc, err := net.FileConn(local) // dups the descriptor
	local.Close()
	if err != nil {
		remote.Close()
		return nil, nil, fmt.Errorf("nbd: socketpair: %w", err)
	}
	return nc, remote, nil
}
