// Package csi is iser-blk's Container Storage Interface plugin (CSI spec v1.13), node side:
// the Identity service, the Node service (STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS,
// GET_VOLUME_HEALTH; Block and Filesystem volumes, ext4 and xfs) and the gRPC server on a unix
// socket that `iser-blk csi` runs. A Controller service (the LUN pool) is optional and comes from
// outside (Options.Controller); with it the plugin advertises CONTROLLER_SERVICE.
//
// Design, and why:
//
//   - One gateway process per staged volume, started as `iser-blk attach --name NAME ...` in a
//     session and process group of its own (Setsid), its output in a log file beside its
//     control socket (Gateways, ExecGateways). The data plane is never inside the plugin:
//     a kill -9 of the plugin, or its upgrade, does not touch a byte of I/O. The plugin talks to
//     the gateways only through their control sockets (internal/control), as an operator would.
//   - Where a gateway lives is its Launcher's (launch.go): LaunchSystemdScope moves it, right
//     after its start, into a transient scope unit of the host's systemd, out of the plugin
//     container's cgroup, which a container runtime kills whole when it stops the container;
//     LaunchProcess leaves it in the plugin's cgroup. Either way it stays the plugin's child in
//     the plugin's namespaces, and nothing waits for it with wait(2) but the goroutine that
//     reaps it: readiness and exit are read from its control socket and a pidfd
//     (control.Client.Detach), which work as well for a gateway a previous plugin started.
//   - The gateway's name is derived from the volume id (GatewayName: "csi-" and 16 hex digits of
//     its SHA-256), so every call for a volume finds the same gateway without a lookup, NodeStage
//     is idempotent by construction and a restarted plugin maps gateways back to volumes.
//   - What a NodeStage was asked for is recorded in RUNDIR/csi/NAME.volume.json (records.go),
//     written atomically before the gateway starts; the CHAP secrets go to 0600 files beside it,
//     because a gateway takes secrets only from files or its environment (internal/chapcreds),
//     never argv, and a gateway restarted by the healer needs them again when the kubelet is not
//     calling. The run directory is root's and 0700 (control.EnsureRunDir), on a hostPath, and a
//     tmpfs (/run): records, like devices, do not outlive a reboot.
//   - The healer (Node.Heal) runs at start: every recorded volume whose gateway is not running but
//     whose kernel device still waits (the gateway's state file exists) gets its gateway started
//     again with the same name, and the takeover machinery (internal/takeover) resumes the device
//     — or fences it when acknowledged writes may be lost. A fenced, failed or degraded gateway is
//     reported by NodeGetVolumeHealth with status.Check's reason. (CSI v1.13 has no
//     VOLUME_CONDITION any more: NodeGetVolumeStats' VolumeCondition became GET_VOLUME_HEALTH.)
//   - Mounting goes through Mounter (mount.go: mount(8), umount, blkid, mkfs), so the node's logic
//     is tested with a fake. Formatting follows SafeFormatAndMount: a device is formatted only
//     when blkid finds neither a filesystem nor a partition table on it.
//
// Invariants:
//   - Every Node call is idempotent: a repeated NodeStage, NodePublish, NodeUnpublish or
//     NodeUnstage with the same arguments succeeds and changes nothing; NodeUnstage of a volume
//     that is not staged succeeds. Calls for one volume are serialised; a call that finds another
//     one running for its volume answers Aborted (the CO retries), never waits unbounded.
//   - Requests are validated strictly before anything happens: an unknown volume-context or
//     secret key, a missing field or a contradiction is InvalidArgument, and nothing is started.
//   - Secrets never reach argv, a log line or an error message: the log interceptor logs the
//     method, the volume id and the outcome, never a request.
//   - Every error returned is a gRPC status with a CSI-documented code.
package csi
