package main

import (
	"errors"

	"github.com/kvlm/kvlm/hub"
)

// resolveModel is the one resolver of every command's -m (and inspect's
// MODEL): a path that exists wins; otherwise a name in the model directory
// as kvlm list shows it (or hf://OWNER/REPO[@REV]/FILE, OWNER/REPO/FILE, a
// unique file name); an unknown name is an error that says how to find
// models (hub.Resolve).
func resolveModel(name string) (string, error) {
	if name == "" {
		return "", errors.New("no model given: use -m MODEL")
	}
	return hub.Resolve(name)
}
