// Package kvstore is kvlm's shared KV tier: full prefix blocks, written by
// one replica and read by the others, in a key-value store (Redis).
//
// Store is what the engine needs of it (get many, put many, each bounded
// by a context); Redis is the implementation over go-redis. Entries
// (entry.go) carry a header that repeats their key's namespace, the
// block's tokens and its parent's hash, and a checksum, so that a bad
// entry is a miss and never a wrong answer. Writer (writer.go) queues
// writes in a bounded queue drained in the background, so that a slow
// store never slows the scheduler: when the queue is full, writes are
// dropped and counted. docs/KVSTORE.md describes the format, the
// namespace, sizing, eviction and the failure modes.
package kvstore

import "context"

// Store is a shared key-value tier.
type Store interface {
	// Get returns the values of keys, in order; a missing key's is nil.
	// An error (the store down, ctx's deadline) means nothing was read.
	Get(ctx context.Context, keys []string) ([][]byte, error)
	// Put stores vals[i] under keys[i], with no expiry (the store evicts).
	Put(ctx context.Context, keys []string, vals [][]byte) error
	// Close releases the connections.
	Close() error
}
