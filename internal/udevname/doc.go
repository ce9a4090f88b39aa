// Package udevname answers udev's question about a block device: which gateway serves it, so
// that contrib/udev/60-iser-blk.rules can give it the stable link /dev/iser-blk/NAME. The
// gateway's name is the only thing about a device that survives a restart, a reboot or the
// kernel handing out another number, which is why links carry it.
//
// A device names its gateway in one of two places, both written before the kernel announces it:
//   - kernel NBD: the backend identifier attach --name configures (/sys/block/nbdN/backend,
//     "iser-blk:NAME:TARGET", BackendID);
//   - ublk: the state file attach --name keeps in the run directory (internal/statefile), written
//     after ADD_DEV and before START_DEV adds /dev/ublkbN.
//
// Gateways without --name get no link: their name is the kernel's device name already.
//
// Everything read here is untrusted (sysfs strings other programs may have set, files in the
// run directory): a name is used only when control.ValidateName accepts it, so a link never
// holds a space, a slash or a leading dot, and nothing read can make the lookup hang.
package udevname
