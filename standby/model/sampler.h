// SampleToken: picks the next token from a row of logits as a pure function of
// (logits, sampling parameters, seed, position).
//
// temperature == 0 is greedy (the highest logit, the lowest id on a tie). Otherwise the
// logits are divided by the temperature and soft-maxed; with top_p < 1 only the smallest set
// of most likely tokens whose probability reaches top_p is kept (ordered by probability,
// ties by id). One uniform number u in [0, 1) comes from a counter-based generator keyed by
// (seed, position) alone, where position is the absolute index in the sequence of the token
// being chosen; u picks the token by walking the kept set's cumulative probability. There
// is no hidden state, so a request replayed as prompt + the tokens it already produced, with
// the same seed, continues exactly as the uninterrupted run did. Thread-safe.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace baton {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
};

// Refuses a negative or non-finite temperature and top_p outside (0, 1].
Status ValidateSamplingParams(const SamplingParams& params);

// The uniform number in [0, 1) for (seed, position).
double SampleUniform(uint64_t seed, uint64_t position);

// The chosen token id in [0, vocab). NaN logits are never chosen (unless all are NaN,
// which yields 0); an infinite top logit is chosen as in greedy. Parameters out of range are
// clamped (temperature < 0 acts as 0, top_p at or below 0 keeps only the most likely token).
int SampleToken(const float* logits, int vocab, const SamplingParams& params, uint64_t position);

}  // namespace baton
