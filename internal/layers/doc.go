// Package layers holds no code: its test reads the module's imports and
// fails on an arrow the architecture does not allow (the layer order and
// its named exceptions are data in layers_test.go), and checks that the
// packages table and the layer diagram of docs/ARCHITECTURE.md say the
// same as the code.
package layers
