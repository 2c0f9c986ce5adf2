package server

import (
	"github.com/kvlm/kvlm/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// storeCollector exports the shared KV tier's counters
// (engine.Stats.Store; docs/KVSTORE.md), only when the engine has a store.
type storeCollector struct{ e *engine.Engine }

var (
	dStoreHit     = prometheus.NewDesc("kvlm_kv_store_hit_blocks_total", "Prompt blocks loaded from the shared KV tier instead of computed.", nil, nil)
	dStoreMiss    = prometheus.NewDesc("kvlm_kv_store_miss_blocks_total", "Prompt blocks looked up in the shared KV tier and computed instead (missing, corrupt or unreadable).", nil, nil)
	dStoreErrors  = prometheus.NewDesc("kvlm_kv_store_errors_total", "Shared KV tier operations that failed (the store down or past --kv-store-timeout), by operation: get (a lookup round trip), set (a write pipeline).", []string{"op"}, nil)
	dStoreCorrupt = prometheus.NewDesc("kvlm_kv_store_corrupt_total", "Shared KV tier entries refused: a bad checksum, header, length or tokens (recomputed).", nil, nil)
	dStoreWritten = prometheus.NewDesc("kvlm_kv_store_written_blocks_total", "Prefix blocks written to the shared KV tier.", nil, nil)
	dStoreDropped = prometheus.NewDesc("kvlm_kv_store_dropped_writes_total", "Prefix blocks not written to the shared KV tier: the write queue (--kv-store-queue) was full, or the write failed.", nil, nil)
	dStoreLoaded  = prometheus.NewDesc("kvlm_kv_store_loaded_bytes_total", "KV bytes loaded from the shared KV tier.", nil, nil)
	dStoreWrBytes = prometheus.NewDesc("kvlm_kv_store_written_bytes_total", "Entry bytes written to the shared KV tier.", nil, nil)
)

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dStoreHit, dStoreMiss, dStoreErrors, dStoreCorrupt, dStoreWritten, dStoreDropped, dStoreLoaded, dStoreWrBytes} {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.StoreStats()
	if !st.Enabled {
		return
	}
	ctr := func(d *prometheus.Desc, v int64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	ctr(dStoreHit, st.HitBlocks)
	ctr(dStoreMiss, st.MissBlocks)
	ctr(dStoreErrors, st.GetErrors, "get")
	ctr(dStoreErrors, st.SetErrors, "set")
	ctr(dStoreCorrupt, st.Corrupt)
	ctr(dStoreWritten, st.Written)
	ctr(dStoreDropped, st.Dropped)
	ctr(dStoreLoaded, st.LoadedBytes)
	ctr(dStoreWrBytes, st.WrittenBytes)
}
