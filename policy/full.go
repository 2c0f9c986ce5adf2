package policy

// full keeps every token: no scorer, no schedule.
func init() {
	Register(Method{Name: "full", Order: 0, Doc: "keep every token", Unused: map[string]string{
		"budget": "method full keeps every token; it takes no budget", "ratio": "method full keeps every token; it takes no budget"}, PrefixTail: anyTail})
}
