package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// GenMan writes one man page per command of root's tree into dir (created if need be):
// PROGRAM.SECTION and PROGRAM-COMMAND.SECTION, without cobra's "auto generated" line. The date is
// $SOURCE_DATE_EPOCH's when set (reproducible builds).
func GenMan(root *cobra.Command, dir string, header *doc.GenManHeader) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.DisableAutoGenTag = true
	if err := doc.GenManTree(root, header, dir); err != nil {
		return fmt.Errorf("writing man pages into %s: %w", dir, err)
	}
	return nil
}
