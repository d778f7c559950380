// EngineMetrics: the reference engine's Prometheus metrics, rendered in the text exposition
// format for `GET /metrics`.
//
// Counters of HTTP responses by status code, prompt and generated tokens; gauges of running
// and waiting requests and of whether the engine serves; histograms of the batch size and
// duration of each compute step and of the time to first token; counters of KV-warm failover
// (sequences adopted, dropped by reason, continued, tokens not recomputed, kept KV freed by
// reason, sequences handed over) and a gauge of the sequences kept for a request to return. The
// compute thread and the HTTP thread both update it; every method is thread-safe (one mutex, held
// briefly).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/mutex.h"

namespace baton {

// A cumulative histogram with fixed upper bounds. Thread-compatible.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends the _bucket, _sum and _count lines of `name`.
  void Render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // per bound, not cumulative; one more for +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class EngineMetrics {
 public:
  EngineMetrics();

  void CountResponse(int http_status);
  void AddPromptTokens(int64_t n);
  void AddGeneratedTokens(int64_t n);
  void ObserveStep(int batch_size, double seconds);
  void ObserveTimeToFirstToken(double seconds);
  void SetQueue(int64_t running, int64_t waiting);
  void SetServing(bool serving);
  // KV-warm failover (standby/kv/kv_handoff.h).
  void AddKvAdoption(uint32_t adopted, const std::map<std::string, uint32_t>& dropped);
  void AddKvContinued(int64_t tokens_not_recomputed);
  void CountKvKeptFreed(const std::string& reason);
  void SetKvKept(size_t sequences);
  void AddKvHandedOver(uint32_t sequences);

  struct KvCounters {
    uint64_t adopted = 0;
    std::map<std::string, uint64_t> dropped;  // by reason
    uint64_t continued = 0;
    uint64_t tokens_not_recomputed = 0;
    std::map<std::string, uint64_t> kept_freed;  // by reason
    uint64_t kept = 0;
    uint64_t handed_over = 0;
  };
  KvCounters kv() const;

  std::string Render() const;

 private:
  void RenderKv(std::string* out) const BATON_REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<int, uint64_t> responses_ BATON_GUARDED_BY(mu_);  // by HTTP status
  uint64_t prompt_tokens_ BATON_GUARDED_BY(mu_) = 0;
  uint64_t generated_tokens_ BATON_GUARDED_BY(mu_) = 0;
  int64_t running_ BATON_GUARDED_BY(mu_) = 0;
  int64_t waiting_ BATON_GUARDED_BY(mu_) = 0;
  bool serving_ BATON_GUARDED_BY(mu_) = false;
  Histogram batch_size_ BATON_GUARDED_BY(mu_);
  Histogram step_seconds_ BATON_GUARDED_BY(mu_);
  Histogram ttft_seconds_ BATON_GUARDED_BY(mu_);
  KvCounters kv_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
