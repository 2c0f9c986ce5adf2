// Command kvlm runs Llama-family models on the CPU with a KV cache built for
// compression: generate text, measure perplexity and speed, inspect and
// convert model files.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit status. Errors are
// printed as one line on stderr.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "kvlm: %v\n", oneLine(err))
		return 1
	}
	return 0
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "kvlm",
		Short:         "An LLM inference engine whose heart is the KV cache",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	var profPath string
	var profFile *os.File
	root.PersistentFlags().StringVar(&profPath, "cpuprofile", "", "write a CPU profile of the command to this file (go tool pprof)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if profPath == "" {
			return nil
		}
		f, err := os.Create(profPath)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		profFile = f
		return nil
	}
	root.PersistentPostRunE = func(*cobra.Command, []string) error {
		if profFile == nil {
			return nil
		}
		pprof.StopCPUProfile()
		return profFile.Close()
	}
	root.AddCommand(newGenerate(), newPPL(), newBench(), newInspect(), newConvert())
	root.AddCommand(newKVCalc())
	root.AddCommand(newGenModel())
	root.AddCommand(newPull(), newList(), newTokenize())
	root.AddCommand(newEval())
	root.AddCommand(newServe(), newChat())
	root.AddCommand(newQuestions())
	root.CompletionOptions.DisableDefaultCmd = true
	return root
}

func oneLine(err error) string {
	s := err.Error()
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' || s[i] == '\r' {
			out = append(out, ' ')
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}
