package main

// Exit codes, documented in the README. Scripts may rely on them.
const (
	exitOK          = 0 // success
	exitFailure     = 1 // any other failure (I/O error, flush failed, ...)
	exitUsage       = 2 // bad flags or arguments
	exitAuth        = 3 // CHAP authentication failed
	exitNotFound    = 4 // target or LUN not found
	exitUnreachable = 5 // portal unreachable (refused, no route, timeout)
	exitNoKernel    = 6 // the kernel lacks what the command needs (nbd, ublk, RDMA)
)
