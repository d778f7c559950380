#include "standby/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace baton {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int Argmax(const float* logits, int vocab) {
  int best = 0;
  bool found = false;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > logits[best]) best = i;
    found = true;
  }
  return best;
}

// Unnormalized probabilities exp((logit - max) / temperature), NaN as 0.
std::vector<double> Weights(const float* logits, int vocab, double temperature, int best) {
  std::vector<double> w(vocab);
  const double max = logits[best];
  for (int i = 0; i < vocab; ++i) {
    w[i] = std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - max) / temperature);
  }
  return w;
}

// Token ids of the nucleus: most likely first (ties by id), until their mass reaches top_p.
std::vector<int> Nucleus(const std::vector<double>& w, double total, double top_p) {
  std::vector<int> order(w.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  double mass = 0;
  size_t keep = 0;
  while (keep < order.size()) {
    mass += w[order[keep++]];
    if (mass >= top_p * total) break;
  }
  order.resize(std::max<size_t>(keep, 1));
  return order;
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return InvalidArgument("temperature must be a finite number >= 0, got " +
                           std::to_string(p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  return OkStatus();
}

double SampleUniform(uint64_t seed, uint64_t position) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (position * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int SampleToken(const float* logits, int vocab, const SamplingParams& params, uint64_t position) {
  if (vocab <= 0) return 0;
  const int best = Argmax(logits, vocab);
  if (!(params.temperature > 0) || !std::isfinite(logits[best]) || !(params.top_p > 0)) return best;
  const std::vector<double> w = Weights(logits, vocab, params.temperature, best);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int> kept;
  if (params.top_p < 1) {
    kept = Nucleus(w, total, params.top_p);
  } else {
    kept.resize(vocab);
    std::iota(kept.begin(), kept.end(), 0);
  }
  double kept_mass = 0;
  for (int id : kept) kept_mass += w[id];
  const double target = SampleUniform(params.seed, position) * kept_mass;
  double cumulative = 0;
  for (int id : kept) {
    cumulative += w[id];
    if (target < cumulative) return id;
  }
  // Rounding can leave target at the very top: take the last token with any mass.
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
    if (w[*it] > 0) return *it;
  }
  return best;
}

}  // namespace baton
