// Command mkdeb builds iser-blk's Debian package with nFPM (github.com/goreleaser/nfpm/v2) as a
// library: the metadata and maintainer scripts from nfpm.yaml, the files from a root that
// `make install` staged (DESTDIR, PREFIX=/usr), each with its staged mode, owned by root, and
// every file under /etc a conffile. `make deb` runs it (mk/deb.mk):
//
//	mkdeb -config packaging/nfpm.yaml -root bin/deb-root -version 0.9.0 -o dist/iser-blk_0.9.0_amd64.deb
//
// The package is reproducible: every time in it (files, control, changelog) is
// $SOURCE_DATE_EPOCH, which make deb sets to the commit's time. It lives in its own module
// (packaging/go.mod) so that nFPM's dependencies stay out of iser-blk's go.mod.
package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

func main() {
	config := flag.String("config", "packaging/nfpm.yaml", "nFPM configuration (metadata, scripts, extra contents)")
	root := flag.String("root", "", "the staged package root (make install DESTDIR=...)")
	version := flag.String("version", "", "the package version (the VERSION file)")
	out := flag.String("o", "", "the .deb to write")
	flag.Parse()
	if *root == "" || *version == "" || *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: mkdeb -config FILE -root DIR -version V -o FILE.deb")
		os.Exit(2)
	}
	if err := run(*config, *root, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
}

func run(configPath, root, version, out string) error {
	mtime, err := sourceDate()
	if err != nil {
		return err
	}
	// nfpm.yaml's relative paths (scripts, copyright) are relative to the file, as with nfpm's CLI
	configPath, err = filepath.Abs(configPath)
	if err != nil {
		return err
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return err
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	cfg, err := nfpm.ParseFileWithEnvMapping(configPath, func(k string) string {
		if k == "VERSION" {
			return version
		}
		return ""
	})
	if err != nil {
		return err
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return err
	}
	staged, err := contents(root, mtime)
	if err != nil {
		return err
	}
	if len(staged) == 0 {
		return fmt.Errorf("%s holds no files: stage it with make install DESTDIR=%s first", root, root)
	}
	tmp, err := os.MkdirTemp("", "mkdeb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	log, err := changelog(tmp, info, mtime)
	if err != nil {
		return err
	}
	info.Contents = append(append(info.Contents, staged...), log)
	for _, c := range info.Contents {
		if c.FileInfo == nil {
			c.FileInfo = &files.ContentFileInfo{}
		}
		c.FileInfo.MTime = mtime
	}
	info.MTime = mtime
	info.Target = out
	info = nfpm.WithDefaults(info)
	// configPath's directory: where nfpm.yaml's relative sources are
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	if err := os.Chdir(filepath.Dir(configPath)); err != nil {
		return err
	}
	defer os.Chdir(wd)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return err
	}
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	if err := pkg.Package(info, f); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}

// sourceDate is $SOURCE_DATE_EPOCH, which must be set: a package stamped with the build's own
// time would differ between two builds of the same commit.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Time{}, errors.New("SOURCE_DATE_EPOCH is not set (make deb sets it to the commit's time)")
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// contents lists the staged root: every regular file with its mode, every directory whose mode
// is not 0755 (the others are created as parents), files under /etc as conffiles. Anything else
// (a symbolic link, a device) is an error: make install stages none.
func contents(root string, mtime time.Time) (files.Contents, error) {
	var cs files.Contents
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		dst := "/" + filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		switch {
		case mode.IsDir():
			if mode.Perm() != 0o755 {
				cs = append(cs, &files.Content{Destination: dst, Type: files.TypeDir,
					FileInfo: &files.ContentFileInfo{Mode: mode.Perm(), MTime: mtime}})
			}
		case mode.IsRegular():
			typ := files.TypeFile
			if strings.HasPrefix(dst, "/etc/") {
				typ = files.TypeConfig
			}
			cs = append(cs, &files.Content{Source: p, Destination: dst, Type: typ,
				FileInfo: &files.ContentFileInfo{Mode: mode.Perm(), MTime: mtime}})
		default:
			return fmt.Errorf("%s: %v is neither a file nor a directory", p, mode.Type())
		}
		return nil
	})
	return cs, err
}

// changelog writes the package's changelog in Debian's format, one entry for this version (the
// release notes are CHANGELOG.md, shipped beside it), gzipped without a name or time:
// /usr/share/doc/iser-blk/changelog.gz, the name Debian gives a native package's changelog.
// (nFPM's own changelog support names it changelog.Debian.gz, a non-native package's.)
func changelog(dir string, info *nfpm.Info, mtime time.Time) (*files.Content, error) {
	text := fmt.Sprintf("%s (%s) unstable; urgency=medium\n\n"+
		"  * Release %s; the changes are in /usr/share/doc/%s/CHANGELOG.md.\n\n"+
		" -- %s  %s\n", info.Name, info.Version, info.Version, info.Name, info.Maintainer,
		mtime.Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(zw, text); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "changelog.gz")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return &files.Content{Source: p, Destination: "/usr/share/doc/" + info.Name + "/changelog.gz", Type: files.TypeFile,
		FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}}, nil
}
