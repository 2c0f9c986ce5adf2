package kvstore

import (
	"bytes"
	"errors"
	"testing"
)

func testEntry() (Header, []byte, []byte) {
	h := Header{Kind: KindBlock, NS: NewNamespace("model A|f32/f32|16"), Hash: 0x1234567890abcdef, Parent: 0xfedcba0987654321,
		Tokens: []int32{1, 403, 9, 511, 0, 7}}
	payload := make([]byte, 40)
	for i := range payload {
		payload[i] = byte(3*i + 1)
	}
	buf := AppendHeader(nil, h, len(payload))
	buf = append(buf, payload...)
	return h, payload, Seal(buf)
}

// TestEntryRoundTrip: an entry opens to its payload, and its size is
// EntrySize.
func TestEntryRoundTrip(t *testing.T) {
	h, payload, buf := testEntry()
	if len(buf) != EntrySize(len(h.Tokens), len(payload)) {
		t.Fatalf("entry of %d bytes, EntrySize says %d", len(buf), EntrySize(len(h.Tokens), len(payload)))
	}
	got, err := Open(buf, h, len(payload))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("payload %v, want %v", got, payload)
	}
}

// TestEntryEveryFlippedByte: flipping any bit of any byte of an entry is
// refused (the checksum covers the header and the payload, and itself).
func TestEntryEveryFlippedByte(t *testing.T) {
	h, payload, buf := testEntry()
	for i := range buf {
		for _, bit := range []byte{0x01, 0x80} {
			b := bytes.Clone(buf)
			b[i] ^= bit
			if _, err := Open(b, h, len(payload)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d bit %#x flipped: %v, want ErrCorrupt", i, bit, err)
			}
		}
	}
}

// TestEntryRefused: an intact entry that is not the one asked for (another
// namespace, block, parent, tokens, payload size; truncated or extended)
// is refused, each with its reason.
func TestEntryRefused(t *testing.T) {
	h, payload, buf := testEntry()
	other := func(f func(*Header)) Header {
		o := h
		o.Tokens = append([]int32(nil), h.Tokens...)
		f(&o)
		return o
	}
	reseal := func(b []byte) []byte { return Seal(bytes.Clone(b[:len(b)-8])) }
	cases := []struct {
		name    string
		buf     []byte
		want    Header
		payload int
		reason  string
	}{
		{"another namespace", buf, other(func(o *Header) { o.NS = NewNamespace("model B|f32/f32|16") }), len(payload), "another namespace"},
		{"another block hash", buf, other(func(o *Header) { o.Hash++ }), len(payload), "another block hash"},
		{"another parent", buf, other(func(o *Header) { o.Parent = 0 }), len(payload), "another parent hash"},
		{"another token", buf, other(func(o *Header) { o.Tokens[3] = 510 }), len(payload), "token 3 is 511, want 510"},
		{"another kind", buf, other(func(o *Header) { o.Kind = 2 }), len(payload), "kind 1, want 2"},
		{"fewer tokens", buf, other(func(o *Header) { o.Tokens = o.Tokens[:5] }), len(payload) + 4, "6 tokens, want 5"},
		{"another payload size", buf, h, len(payload) - 8, "bytes, want"},
		{"truncated", buf[:len(buf)-1], h, len(payload), "bytes, want"},
		{"extended", append(bytes.Clone(buf), 0), h, len(payload), "bytes, want"},
		{"empty", nil, h, len(payload), "0 bytes"},
		{"another version, resealed", reseal(func() []byte { b := bytes.Clone(buf); b[4] = 9; return b }()), h, len(payload), "format version 9"},
		{"no magic, resealed", reseal(func() []byte { b := bytes.Clone(buf); b[0] = 'X'; return b }()), h, len(payload), "no magic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Open(c.buf, c.want, c.payload)
			if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(c.reason)) {
				t.Fatalf("%v, want ErrCorrupt saying %q", err, c.reason)
			}
		})
	}
}

// TestKey: the key holds the namespace and the hash, so entries of two
// namespaces never share a key.
func TestKey(t *testing.T) {
	a, b := NewNamespace("a"), NewNamespace("b")
	if Key(a, 5) == Key(b, 5) || Key(a, 5) == Key(a, 6) {
		t.Fatalf("keys collide: %s %s %s", Key(a, 5), Key(b, 5), Key(a, 6))
	}
	if k := Key(a, 0xabc); k != "kvlm:"+a.String()+":abc" {
		t.Fatalf("key %s", k)
	}
}
