// Package control is the gateway side and the client side of a running gateway's control
// socket (docs/operations.md, "Control socket"). It knows nothing of NBD, ublk or iSCSI: the
// gateway registers a Handler (status from a status.Registry, detach through its lifecycle) and
// the package owns the rest — the run directory, the name claim, the socket, the protocol.
//
// Invariants:
//   - One running gateway per name per run directory: the name is claimed with flock(2) on
//     NAME.lock before anything else exists, so the kernel releases it when the holder dies,
//     however it dies. A socket or lock file left by a killed gateway is stale by construction
//     (its lock is free) and is replaced, never an obstacle.
//   - Only root talks to a gateway: the run directory is 0700, the socket 0600, and the server
//     checks the peer's SO_PEERCRED uid on every connection.
//   - Bad requests get an error reply and change nothing; the server keeps serving. Handlers
//     run on the connection's goroutine, never on the data path.
package control
