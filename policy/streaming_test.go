package policy

import "testing"

// TestStreamingDefault: streaming without a window or a budget is a
// 512-token cache, sinks 4 and window 508 (sinks given: the window is the
// rest); the other window methods still need one.
func TestStreamingDefault(t *testing.T) {
	cases := []struct {
		cfg                   Config
		budget, sinks, window int
	}{
		{Config{Method: "streaming"}, 512, 4, 508},
		{Config{Method: "streaming", Sinks: 8}, 512, 8, 504},
		{Config{Method: "streaming", Window: 60}, 64, 4, 60},
		{Config{Method: "streaming", Budget: 100}, 100, 4, 96},
	}
	for _, c := range cases {
		n, err := c.cfg.Normalize()
		if err != nil {
			t.Errorf("%+v: %v", c.cfg, err)
			continue
		}
		if n.Budget != c.budget || n.Sinks != c.sinks || n.Window != c.window || n.Positions != PosReindex || n.Every != 1 {
			t.Errorf("%+v: budget %d sinks %d window %d positions %v every %d, want %d %d %d reindex 1",
				c.cfg, n.Budget, n.Sinks, n.Window, n.Positions, n.Every, c.budget, c.sinks, c.window)
		}
		if b, ok := n.StreamBound(); !ok || b != c.budget+1 {
			t.Errorf("%+v: stream bound %d %v", c.cfg, b, ok)
		}
	}
	if _, err := (Config{Method: "streaming", Sinks: 512}).Normalize(); err == nil {
		t.Error("sinks 512 with the default budget: no error")
	}
	for _, m := range []string{"window", "lminfinite"} {
		if _, err := (Config{Method: m}).Normalize(); err == nil {
			t.Errorf("%s without a window: no error", m)
		}
	}
}
