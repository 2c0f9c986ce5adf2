package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/hub"
	"github.com/spf13/cobra"
)

type listEntry struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Bytes   int64  `json:"bytes"`
	Arch    string `json:"arch,omitempty"`
	Model   string `json:"model,omitempty"` // general.name
	Partial bool   `json:"partial,omitempty"`
}

func newList() *cobra.Command {
	var dir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List the models in the model directory",
		Long: "List the models in the model directory ($KVLM_MODELS, default kvlm/models under the user cache\n" +
			"directory), with partial downloads. Every command that takes a model (-m, inspect's MODEL) accepts\n" +
			"the NAME shown here.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if dir == "" {
				if dir, err = hub.Dir(); err != nil {
					return err
				}
			}
			entries, err := hub.List(dir)
			if err != nil {
				return err
			}
			out := make([]listEntry, 0, len(entries))
			for _, e := range entries {
				le := listEntry{Name: e.Rel, Path: e.Path, Bytes: e.Size, Partial: e.Partial}
				if !e.Partial {
					le.Arch, le.Model = ggufNames(e.Path)
				}
				out = append(out, le)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			if len(out) == 0 {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "no models in %s (get one with kvlm pull hf://OWNER/REPO/FILE.gguf)\n", dir)
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tARCH\tMODEL")
			for _, e := range out {
				arch := e.Arch
				if e.Partial {
					arch = "(partial download)"
				} else if arch == "" {
					arch = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Name, hub.HumanBytes(e.Bytes), arch, e.Model)
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "model directory (default $KVLM_MODELS or the user cache directory)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// ggufNames reads general.architecture and general.name ("" when the file
// is not a readable GGUF).
func ggufNames(path string) (arch, name string) {
	f, err := gguf.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	arch, _ = f.String("general.architecture")
	name, _ = f.String("general.name")
	return arch, name
}
