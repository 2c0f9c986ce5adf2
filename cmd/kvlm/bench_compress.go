package main

import (
	"fmt"
	"io"
)

// benchCompression is a compressed run (--kv-policy, or a KV codec against
// --vs-kv-type) and the full cache it is compared with, measured in turns
// in each of the --reps rounds: the compressed run, the full cache (codec
// --vs-kv-type, no policy) after the same prompt, and the full cache
// after a --weights-ctx-token prompt. Times are medians over the rounds.
type benchCompression struct {
	Policy string `json:"kv_policy"` // the normalized --kv-policy configuration
	KVType string `json:"kv_type"`   // the compressed run's codecs, K/V

	PrefillMS float64 `json:"prefill_ms"` // the prompt's forward pass, the compression step excluded
	// CompressMS is the policy's one compression step after the prompt;
	// CompressMSPerToken is it amortised over the --gen tokens.
	CompressMS         float64 `json:"compress_ms"`
	CompressMSPerToken float64 `json:"compress_ms_per_token"`
	DecodeTokS         float64 `json:"decode_tok_s"`
	DecodePolicyMS     float64 `json:"decode_policy_ms"` // of the decode, the policy's Before calls, summed over the --gen steps
	// KV bytes of the compressed run: after the prompt ran its layers
	// (before the compression step), after the compression step, after
	// the last decode step, and the mean a decode step read.
	KVBytesPrefill    int64   `json:"kv_bytes_prefill"`
	KVBytesCompressed int64   `json:"kv_bytes_compressed"`
	KVBytesEnd        int64   `json:"kv_bytes_end"`
	KVBytesDecodeMean float64 `json:"kv_bytes_decode_mean"`
	KeptPerLayer      []int   `json:"kept_per_layer,omitempty"`

	Prediction benchPrediction `json:"prediction"`
}

// benchPrediction predicts the compressed run's decode speed from the
// bytes its cache keeps: a step's time is t0 + τ·b, b the cache bytes it
// reads, t0 and τ fitted through two measurements of the full cache (the
// line through them): decode after a --weights-ctx-token prompt (almost
// only the weights: WeightsMSPerToken is t0, the step with no cache) and
// decode after the --prompt (KVNSPerByte is τ).
type benchPrediction struct {
	FullKVType               string  `json:"full_kv_type"`
	FullDecodeTokS           float64 `json:"full_decode_tok_s"`
	FullKVBytesDecodeMean    float64 `json:"full_kv_bytes_decode_mean"`
	FullPrefillMS            float64 `json:"full_prefill_ms"`
	WeightsCtx               int     `json:"weights_ctx"`
	WeightsDecodeTokS        float64 `json:"weights_decode_tok_s"`
	WeightsKVBytesDecodeMean float64 `json:"weights_kv_bytes_decode_mean"`

	// FitOK is false when the fit has no meaning: τ ≤ 0 or t0 ≤ 0 (the
	// full cache no slower after the prompt than after --weights-ctx, as
	// on a machine whose load changed between the runs).
	FitOK             bool    `json:"fit_ok"`
	WeightsMSPerToken float64 `json:"weights_ms_per_token"` // t0
	KVNSPerByte       float64 `json:"kv_ns_per_byte"`       // τ
	FullKVShare       float64 `json:"full_kv_share"`        // τ·b of the full cache over its step time

	BytesRatio          float64 `json:"bytes_ratio"`            // the full cache's mean decode bytes over the compressed run's
	PredictedMSPerToken float64 `json:"predicted_ms_per_token"` // t0 + τ·b of the compressed run
	MeasuredMSPerToken  float64 `json:"measured_ms_per_token"`
	PredictedSpeedup    float64 `json:"predicted_speedup"` // the full cache's step time over the predicted one
	MeasuredSpeedup     float64 `json:"measured_speedup"`  // over the measured one
	// GainFraction is (measured − 1)/(predicted − 1): the share of the
	// predicted gain reached (0 when none is predicted).
	GainFraction float64 `json:"gain_fraction"`
	// SpeedupWithCompress counts the compression step too, amortised over
	// the --gen tokens: the full cache's step time over the compressed
	// run's plus CompressMSPerToken.
	SpeedupWithCompress float64 `json:"speedup_with_compress"`
}

// benchRounds are the runs of the --reps rounds: the run of the flags
// (compressed when a policy is set) and, when compression is measured,
// the full cache after the prompt and after --weights-ctx tokens.
type benchRounds struct {
	run, full, weights []benchOneRun
}

func msOf(runs []benchOneRun, f func(benchOneRun) float64) float64 {
	var x []float64
	for _, r := range runs {
		x = append(x, f(r))
	}
	return median(x)
}

// perToken is a run's decode time per token, in ms.
func perToken(gen int) func(benchOneRun) float64 {
	return func(r benchOneRun) float64 { return ms(r.decode) / float64(gen) }
}

// compression builds the comparison of the rounds (see benchCompression).
func (rr *benchRounds) compression(policyName, kvType, fullType string, gen, weightsCtx int) (*benchCompression, error) {
	last := rr.run[len(rr.run)-1]
	c := &benchCompression{Policy: policyName, KVType: kvType,
		PrefillMS:      msOf(rr.run, func(r benchOneRun) float64 { return ms(r.prefill) }),
		CompressMS:     msOf(rr.run, func(r benchOneRun) float64 { return ms(r.compress) }),
		DecodePolicyMS: msOf(rr.run, func(r benchOneRun) float64 { return ms(r.before) }),
		KVBytesPrefill: last.bytesPrefill, KVBytesCompressed: last.bytesCompressed, KVBytesEnd: last.bytesEnd,
		KVBytesDecodeMean: last.bytesDecodeMean, KeptPerLayer: last.kept,
	}
	c.CompressMSPerToken = c.CompressMS / float64(gen)
	tc := msOf(rr.run, perToken(gen))
	c.DecodeTokS = 1e3 / tc
	full, w := rr.full[len(rr.full)-1], rr.weights[len(rr.weights)-1]
	tf, tw := msOf(rr.full, perToken(gen)), msOf(rr.weights, perToken(gen))
	p := &c.Prediction
	*p = benchPrediction{FullKVType: fullType, FullDecodeTokS: 1e3 / tf, FullKVBytesDecodeMean: full.bytesDecodeMean,
		FullPrefillMS: msOf(rr.full, func(r benchOneRun) float64 { return ms(r.prefill) }),
		WeightsCtx:    weightsCtx, WeightsDecodeTokS: 1e3 / tw, WeightsKVBytesDecodeMean: w.bytesDecodeMean,
		MeasuredMSPerToken: tc}
	bf, bw, bc := full.bytesDecodeMean, w.bytesDecodeMean, last.bytesDecodeMean
	if bf <= bw {
		return nil, fmt.Errorf("the full cache after --prompt reads no more bytes (%.0f) than after --weights-ctx (%.0f): no KV time to fit", bf, bw)
	}
	tau := (tf - tw) / (bf - bw) // ms per byte
	t0 := tw - tau*bw
	p.KVNSPerByte, p.WeightsMSPerToken = tau*1e6, t0
	p.FitOK = tau > 0 && t0 > 0
	p.FullKVShare = tau * bf / tf
	if bc > 0 {
		p.BytesRatio = bf / bc
	}
	p.PredictedMSPerToken = t0 + tau*bc
	p.PredictedSpeedup, p.MeasuredSpeedup = tf/p.PredictedMSPerToken, tf/tc
	if p.PredictedSpeedup != 1 {
		p.GainFraction = (p.MeasuredSpeedup - 1) / (p.PredictedSpeedup - 1)
	}
	p.SpeedupWithCompress = tf / (tc + c.CompressMSPerToken)
	return c, nil
}

func printCompression(w io.Writer, c *benchCompression, promptN, gen int) {
	p := c.Prediction
	fmt.Fprintf(w, "compression      %s, KV %s: prefill %.1f ms, compression step %.1f ms (%.3f ms per generated token over %d), decode %.1f tok/s (policy's decode-time work %.1f ms)\n",
		c.Policy, c.KVType, c.PrefillMS, c.CompressMS, c.CompressMSPerToken, gen, c.DecodeTokS, c.DecodePolicyMS)
	fmt.Fprintf(w, "KV bytes         %s after the %d-token prompt, %s after compression, %s at the end (a decode step read %s on average)\n",
		human(c.KVBytesPrefill), promptN, human(c.KVBytesCompressed), human(c.KVBytesEnd), human(int64(c.KVBytesDecodeMean)))
	fmt.Fprintf(w, "full cache       %s: decode %.1f tok/s after the same prompt (a step read %s), %.1f tok/s after %d tokens (%s)\n",
		p.FullKVType, p.FullDecodeTokS, human(int64(p.FullKVBytesDecodeMean)), p.WeightsDecodeTokS, p.WeightsCtx, human(int64(p.WeightsKVBytesDecodeMean)))
	fmt.Fprintf(w, "step model       %.3f ms + %.3f ns per KV byte (the line through the two full-cache runs; the KV part is %.0f%% of the full cache's step)\n",
		p.WeightsMSPerToken, p.KVNSPerByte, 100*p.FullKVShare)
	if !p.FitOK {
		fmt.Fprintf(w, "step model       unusable: the KV time or the weights' time came out ≤ 0 (the load changed between the runs?): the prediction below means nothing\n")
	}
	fmt.Fprintf(w, "speed-up         predicted %.2f× from %.2f× fewer bytes, measured %.2f× (%.0f%% of the predicted gain); %.2f× with the compression step amortised\n",
		p.PredictedSpeedup, p.BytesRatio, p.MeasuredSpeedup, 100*p.GainFraction, p.SpeedupWithCompress)
}
