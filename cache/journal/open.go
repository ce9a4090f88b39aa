package journal

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

// ErrForeign is wrapped by Open's refusal of a cache device that holds something other than this
// LUN's cache: another LUN's cache, or data that is no cache at all. Options.Format overrides it.
var ErrForeign = errors.New("journal: the cache device is not this LUN's")

// Open makes a Journal of the cache device m in front of be, the LUN identified by id. A device
// that holds no cache superblock and is blank (zeros) is formatted; one that holds this LUN's
// cache is recovered: its log is scanned from the checkpoint and whatever was written to it
// before the last completed flush is served again and written back. Anything else is refused
// with ErrForeign unless opt.Format is set. On success the Journal owns m and be.
func Open(m Media, be block.Device, id Identity, opt Options) (*Journal, error) {
	opt = opt.withDefaults()
	bs := int64(be.BlockSize())
	if bs < 512 || bs > HeaderSize || HeaderSize%bs != 0 {
		return nil, fmt.Errorf("journal: block size %d is not supported (512 to %d bytes)", bs, HeaderSize)
	}
	id.Size, id.BlockSize = be.Size(), int(bs)
	if m.Size() < MinSize {
		return nil, fmt.Errorf("journal: the cache device holds %s; at least %s is needed",
			humanize.IBytes(uint64(m.Size())), humanize.IBytes(MinSize))
	}
	u := unitFor(be.Size(), bs)
	j := &Journal{be: be, m: m, log: opt.Log, opt: opt, bs: bs, u: u, hdrU: uint64(HeaderSize / u),
		kick: make(chan struct{}, 1), drain: make(chan struct{}, 1), stop: make(chan struct{}),
		hdrBuf: make([]byte, HeaderSize), wrapBuf: make([]byte, HeaderSize), cleanHdr: make([]byte, HeaderSize)}
	j.n = min(uint64(m.Size()-LogStart)/uint64(u), 1<<32-1)
	j.mergeBuf, j.zeroes = make([]byte, u), make([]byte, u)
	j.lim, j.beLim = be.Limits(), be.Limits()
	j.lim.VolatileCache, j.lim.CanFlush, j.lim.CanFUA = true, true, true
	if j.lim.ReadOnly {
		return nil, errors.New("journal: a read-only LUN needs no write-back cache device")
	}
	sup, err := j.readSuper(id)
	if err != nil {
		return nil, err
	}
	if sup != nil && sup.LogUnits > j.n {
		// A device that shrank, or a superblock whose fields are wrong under a good checksum:
		// the index would be sized by the superblock's claim (up to 2^40 units).
		return nil, fmt.Errorf("%w: its superblock describes a log of %d blocks of %d bytes, more than the device holds; give --cache-dev-format to drop it",
			ErrForeign, sup.LogUnits, bs)
	}
	if sup == nil {
		if sup, err = j.format(id); err != nil {
			return nil, err
		}
	}
	if int64(sup.Unit) != j.u {
		return nil, fmt.Errorf("%w: its log has units of %d bytes, this LUN needs %d", ErrForeign, sup.Unit, j.u)
	}
	j.super = *sup
	j.inst = sup.Instance
	j.n = sup.LogUnits
	j.idx = newIndex(j.n)
	j.tail, j.tailSeq = sup.TailPos, sup.TailSeq
	start := time.Now()
	batches, err := j.recover()
	if err != nil {
		return nil, err
	}
	if j.head != j.tail { // recovered data waits CleanAfter like any, then goes to the target
		j.dirtySince = time.Now()
	}
	if err := j.reopen(id); err != nil {
		return nil, err
	}
	j.log.Info("cache device ready",
		zap.String("log", humanize.IBytes(j.n*uint64(u))),
		zap.String("index memory", humanize.IBytes(uint64(memoryFor(j.n)))),
		zap.Int("batches recovered", batches),
		zap.String("recovered", humanize.IBytes(uint64(j.idx.live)*uint64(u))),
		zap.Duration("scan", time.Since(start)))
	j.wg.Add(1)
	go j.cleaner()
	return j, nil
}

// unitFor is the ring unit for a LUN of size bytes in blocks of bs: 4 KiB (an eighth of the
// index a 512-byte unit would need; file systems write whole 4 KiB blocks), or bs when the LUN
// does not end on a 4 KiB boundary. Writes of part of a unit are merged with its current
// contents (append.go).
func unitFor(size, bs int64) int64 {
	if size%HeaderSize == 0 {
		return HeaderSize
	}
	return bs
}

func (o Options) withDefaults() Options {
	if o.WriteAround == 0 {
		o.WriteAround = DefaultWriteAround
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.RoundBytes <= 0 {
		o.RoundBytes = DefaultRoundBytes
	}
	if o.CleanAfter <= 0 {
		o.CleanAfter = DefaultCleanAfter
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// readSuper returns the newest valid superblock when it is this LUN's, nil when the device is to
// be formatted, or the refusal.
func (j *Journal) readSuper(id Identity) (*Super, error) {
	buf := make([]byte, LogStart)
	if _, err := j.m.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("journal: reading the superblock: %w", err)
	}
	var best *Super
	var corrupt error
	present, zeroCopy := false, false
	for c := range 2 {
		cp := buf[c*SuperSize : (c+1)*SuperSize]
		zeroCopy = zeroCopy || bytes.Equal(cp, make([]byte, SuperSize))
		s, err := UnmarshalSuper(cp)
		switch {
		case errors.Is(err, errNotSuper):
		case err != nil:
			present, corrupt = true, err
		default:
			present = true
			if best == nil || s.Seq > best.Seq {
				best = s
			}
		}
	}
	switch {
	case j.opt.Format:
		if best != nil {
			j.log.Warn("formatting the cache device at --cache-dev-format: the log it held is dropped",
				zap.String("was for", best.ID.URL), zap.Uint64("log seq", best.TailSeq))
		}
		return nil, nil
	case best != nil:
		if why := sameLUN(best.ID, id); why != "" {
			return nil, fmt.Errorf("%w: it holds the cache of %s (%s); give --cache-dev-format to drop it", ErrForeign, best.ID.URL, why)
		}
		return best, nil
	case present && zeroCopy:
		// One copy ours but torn, the other never written: only a first format cut short leaves
		// that (it writes both copies before anything else, and later superblock writes replace
		// one valid copy at a time), so nothing was ever acknowledged through this device.
		j.log.Warn("formatting the cache device again: its first format was cut short", zap.NamedError("torn superblock", corrupt))
		return nil, nil
	case present:
		return nil, fmt.Errorf("%w: both superblock copies are corrupt (%v); give --cache-dev-format to drop what it held", ErrForeign, corrupt)
	case !bytes.Equal(buf, make([]byte, len(buf))):
		return nil, fmt.Errorf("%w: it holds data but no iser-blk cache; give --cache-dev-format to overwrite it", ErrForeign)
	}
	return nil, nil
}

// sameLUN says why the LUN a superblock names is not id, or "". Both the URL (the caller makes
// it portal-free: target name and LUN number) and the WWN, when both have one, must match: a WWN
// alone is not enough, as some targets (tgtd) derive it from the target and LUN numbers, the same
// on every host. A LUN that grew keeps its cache.
func sameLUN(had, id Identity) string {
	switch {
	case had.URL != id.URL:
		return "this LUN is " + id.URL
	case had.WWN != "" && id.WWN != "" && had.WWN != id.WWN:
		return fmt.Sprintf("WWN %s, this LUN's is %s", had.WWN, id.WWN)
	case had.BlockSize != id.BlockSize:
		return fmt.Sprintf("block size %d, this LUN's is %d", had.BlockSize, id.BlockSize)
	case had.Size > id.Size:
		return fmt.Sprintf("a LUN of %d bytes, this one has %d", had.Size, id.Size)
	}
	return ""
}

// format writes a new, empty cache.
func (j *Journal) format(id Identity) (*Super, error) {
	s := &Super{ID: id, Unit: int(j.u), LogUnits: j.n, TailSeq: 1, SeqFloor: 1, Formatted: time.Now().Unix()}
	if _, err := rand.Read(s.Instance[:]); err != nil {
		return nil, err
	}
	// Both copies valid, the second newer, so that the first superblock write replaces the first.
	for c := range 2 {
		s.Seq = uint64(c)
		b, err := MarshalSuper(s)
		if err != nil {
			return nil, err
		}
		if err := j.m.WriteVAt([][]byte{b}, int64(c*SuperSize)); err != nil {
			return nil, err
		}
	}
	if err := j.m.Sync(); err != nil {
		return nil, err
	}
	j.log.Info("formatted the cache device", zap.String("for", id.URL),
		zap.String("log", humanize.IBytes(j.n*uint64(j.u))))
	return s, nil
}

// reopen records, before anything is written, that this run's batches number from seq on: past
// any batch a crash may have left beyond the point where recovery stopped (at most one per unit
// of the ring after the last one recovered), and past the floor the previous run recorded, so
// that a second crash cannot revive batches of the first.
func (j *Journal) reopen(id Identity) error {
	j.seq = max(j.prevSeq, j.super.SeqFloor) + j.n + 1
	s := j.super
	s.SeqFloor = j.seq
	s.ID.Size = id.Size   // a LUN that grew
	if j.tail == j.head { // an empty log: the next batch is the checkpoint's
		j.tailSeq, s.TailSeq = j.seq, j.seq
	}
	return j.writeSuper(&s)
}

// writeSuper writes s as the next superblock copy and makes it durable. Only one writer at a
// time: Open, then the cleaner.
func (j *Journal) writeSuper(s *Super) error {
	s.Seq = j.super.Seq + 1
	b, err := MarshalSuper(s)
	if err != nil {
		return err
	}
	if err := j.m.WriteVAt([][]byte{b}, int64(s.Seq%2)*SuperSize); err != nil {
		return err
	}
	if err := j.m.Sync(); err != nil {
		return err
	}
	j.super = *s
	return nil
}

// OpenPath is Open on the file or block device at path (OpenFile: created with newSize bytes
// when it does not exist or is empty). On failure nothing stays open but be.
func OpenPath(path string, newSize int64, be block.Device, id Identity, opt Options) (*Journal, error) {
	log := opt.Log
	if log == nil {
		log = zap.NewNop()
	}
	m, err := openFile(path, newSize, log)
	if err != nil {
		return nil, err
	}
	opt.Path = path
	j, err := Open(m, be, id, opt)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("cache device %s: %w", path, err)
	}
	return j, nil
}

// IndexMemory is the RAM the index of a cache device of size bytes takes for a LUN of lunSize
// bytes in blocks of blockSize (see index).
func IndexMemory(size, lunSize int64, blockSize int) int64 {
	units := min(uint64(max(size-LogStart, 0))/uint64(unitFor(lunSize, int64(blockSize))), 1<<32-1)
	if units == 0 {
		return 0
	}
	return memoryFor(units)
}
