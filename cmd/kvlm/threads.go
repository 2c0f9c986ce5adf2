package main

import "github.com/kvlm/kvlm/tensor"

func threads() int { return tensor.Threads }
