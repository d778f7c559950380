#include "standby/engine_metrics.h"

#include "base/build_info.h"
#include "base/text/metric_number.h"

namespace baton {
namespace {

void Header(const char* name, const char* type, const char* help, std::string* out) {
  *out += std::string("# HELP ") + name + " " + help + "\n";
  *out += std::string("# TYPE ") + name + " " + type + "\n";
}

void Scalar(const char* name, const char* type, const char* help, double value, std::string* out) {
  Header(name, type, help, out);
  *out += std::string(name) + " " + MetricNumber(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++buckets_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    cumulative += buckets_[i];
    const std::string le = i < bounds_.size() ? MetricNumber(bounds_[i]) : "+Inf";
    *out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum " + MetricNumber(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

EngineMetrics::EngineMetrics()
    : batch_size_({1, 2, 4, 8, 16, 32, 64, 128, 256}),
      step_seconds_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      ttft_seconds_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}) {}

void EngineMetrics::CountResponse(int http_status) {
  MutexLock lock(mu_);
  ++responses_[http_status];
}

void EngineMetrics::AddPromptTokens(int64_t n) {
  MutexLock lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}

void EngineMetrics::AddGeneratedTokens(int64_t n) {
  MutexLock lock(mu_);
  generated_tokens_ += static_cast<uint64_t>(n);
}

void EngineMetrics::ObserveStep(int batch_size, double seconds) {
  MutexLock lock(mu_);
  batch_size_.Observe(batch_size);
  step_seconds_.Observe(seconds);
}

void EngineMetrics::ObserveTimeToFirstToken(double seconds) {
  MutexLock lock(mu_);
  ttft_seconds_.Observe(seconds);
}

void EngineMetrics::SetQueue(int64_t running, int64_t waiting) {
  MutexLock lock(mu_);
  running_ = running;
  waiting_ = waiting;
}

void EngineMetrics::SetServing(bool serving) {
  MutexLock lock(mu_);
  serving_ = serving;
}

void EngineMetrics::AddKvAdoption(uint32_t adopted,
                                  const std::map<std::string, uint32_t>& dropped) {
  MutexLock lock(mu_);
  kv_.adopted += adopted;
  for (const auto& [reason, n] : dropped) kv_.dropped[reason] += n;
}

void EngineMetrics::AddKvContinued(int64_t tokens_not_recomputed) {
  MutexLock lock(mu_);
  ++kv_.continued;
  kv_.tokens_not_recomputed += static_cast<uint64_t>(tokens_not_recomputed);
}

void EngineMetrics::CountKvKeptFreed(const std::string& reason) {
  MutexLock lock(mu_);
  ++kv_.kept_freed[reason];
}

void EngineMetrics::SetKvKept(size_t sequences) {
  MutexLock lock(mu_);
  kv_.kept = sequences;
}

void EngineMetrics::AddKvHandedOver(uint32_t sequences) {
  MutexLock lock(mu_);
  kv_.handed_over += sequences;
}

EngineMetrics::KvCounters EngineMetrics::kv() const {
  MutexLock lock(mu_);
  return kv_;
}

void EngineMetrics::RenderKv(std::string* out) const {
  Scalar("baton_engine_kv_adopted_sequences_total", "counter",
         "Sequences adopted from the blocks of the engine this one replaced.",
         static_cast<double>(kv_.adopted), out);
  Header("baton_engine_kv_dropped_sequences_total", "counter",
         "Inherited sequences not adopted, by reason (their requests are prefilled again).", out);
  for (const auto& [reason, n] : kv_.dropped) {
    *out += "baton_engine_kv_dropped_sequences_total{reason=\"" + reason + "\"} " +
            std::to_string(n) + "\n";
  }
  Scalar("baton_engine_kv_continued_requests_total", "counter",
         "Requests that continued from kept KV instead of a full prefill.",
         static_cast<double>(kv_.continued), out);
  Scalar("baton_engine_kv_tokens_not_recomputed_total", "counter",
         "Tokens whose K and V were taken from kept KV instead of prefilled again.",
         static_cast<double>(kv_.tokens_not_recomputed), out);
  Header("baton_engine_kv_kept_freed_total", "counter",
         "Kept sequences freed unclaimed, by reason (expired, evicted, mismatch, replaced).", out);
  for (const auto& [reason, n] : kv_.kept_freed) {
    *out +=
        "baton_engine_kv_kept_freed_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  }
  Scalar("baton_engine_kv_kept_sequences", "gauge",
         "Sequences whose KV is kept for their request to come back.",
         static_cast<double>(kv_.kept), out);
  Scalar("baton_engine_kv_handed_over_sequences_total", "counter",
         "Running sequences handed over to the next primary by a switch-over.",
         static_cast<double>(kv_.handed_over), out);
}

std::string EngineMetrics::Render() const {
  MutexLock lock(mu_);
  std::string out;
  Header("baton_engine_http_responses_total", "counter", "HTTP responses sent, by status code.",
         &out);
  for (const auto& [code, n] : responses_) {
    out += "baton_engine_http_responses_total{code=\"" + std::to_string(code) + "\"} " +
           std::to_string(n) + "\n";
  }
  Scalar("baton_engine_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         static_cast<double>(prompt_tokens_), &out);
  Scalar("baton_engine_generated_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(generated_tokens_), &out);
  Scalar("baton_engine_running_requests", "gauge", "Requests in the running batch.",
         static_cast<double>(running_), &out);
  Scalar("baton_engine_waiting_requests", "gauge", "Requests waiting for admission.",
         static_cast<double>(waiting_), &out);
  Scalar("baton_engine_serving", "gauge", "1 while the engine serves, 0 while it stands by.",
         serving_ ? 1 : 0, &out);
  Header("baton_engine_batch_size", "histogram", "Sequences in each compute step.", &out);
  batch_size_.Render("baton_engine_batch_size", &out);
  Header("baton_engine_step_seconds", "histogram", "Duration of each compute step.", &out);
  step_seconds_.Render("baton_engine_step_seconds", &out);
  Header("baton_engine_time_to_first_token_seconds", "histogram",
         "Time from a request's arrival to its first generated token.", &out);
  ttft_seconds_.Render("baton_engine_time_to_first_token_seconds", &out);
  RenderKv(&out);
  out += ProcessInfoMetrics("baton-refengine");
  return out;
}

}  // namespace baton
