// Command scripted writes a scripted model (internal/scripted) for the
// openai client test: the spec as JSON on stdin, the chat template read
// from a file.
//
//	go run ./test/openai/scripted -o model.gguf < spec.json
//
// spec.json: {"template_file": "chat/testdata/templates/X.jinja", "after":
// "\n", "script": ["…", "!CONTROL"], "specials": ["<|im_end|>", …], "eos":
// "<|im_end|>"}.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/kvlm/kvlm/internal/scripted"
)

func main() {
	out := flag.String("o", "", "output GGUF")
	flag.Parse()
	var spec struct {
		TemplateFile string   `json:"template_file"`
		After        string   `json:"after"`
		Script       []string `json:"script"`
		Specials     []string `json:"specials"`
		EOS          string   `json:"eos"`
	}
	d := json.NewDecoder(os.Stdin)
	d.DisallowUnknownFields()
	if err := d.Decode(&spec); err != nil || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: scripted -o FILE < spec.json:", err)
		os.Exit(2)
	}
	tmpl, err := os.ReadFile(spec.TemplateFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = scripted.Write(*out, scripted.Spec{Template: string(tmpl), After: spec.After, Script: spec.Script, Specials: spec.Specials, EOS: spec.EOS})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
