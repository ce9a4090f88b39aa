package rawio

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyRawSyscalls guards the reason this package exists: its reads, writes and splices must
// not enter the scheduler's syscall state (see the package comment), which every wrapper in
// syscall and x/sys/unix does (syscall.Syscall, unix.Read, unix.Writev, unix.Splice, ...). The
// bytes-and-errors tests would all still pass on such a wrapper, so this one reads the source:
// every system call the package makes goes through RawSyscall or RawSyscall6. unix.Poll and
// unix.IoctlGetInt are allowed: they run only after an EAGAIN, to tell a full or dry pipe from
// a socket that is not ready, never on the path of an I/O that succeeds.
func TestOnlyRawSyscalls(t *testing.T) {
	allowed := map[string]bool{
		"RawSyscall": true, "RawSyscall6": true, // the point
		"Poll": true, "IoctlGetInt": true, // EAGAIN paths only (see above)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	raw := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || (pkg.Name != "unix" && pkg.Name != "syscall") {
				return true
			}
			if !allowed[sel.Sel.Name] {
				t.Errorf("%s: %s.%s enters the syscall state; use unix.RawSyscall", fset.Position(call.Pos()), pkg.Name, sel.Sel.Name)
			}
			if strings.HasPrefix(sel.Sel.Name, "RawSyscall") {
				raw++
			}
			return true
		})
	}
	if raw < 4 { // read, writev, write, splice
		t.Fatalf("found %d RawSyscall calls, want at least 4 (read, writev, write, splice): is this test reading the package?", raw)
	}
}
