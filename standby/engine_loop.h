// EngineLoop: the reference engine's compute thread. It owns a Generator over one LlamaModel
// and one PagedKvCache and runs continuous batching: between steps it admits the requests
// submitted since the last step (and drops cancelled ones), then runs one batched step, and
// hands each generated token to the sink of its request.
//
// ModelMemory is where the weights and the KV block memory come from, so that the
// standalone engine and the engine under a controller share the loop. LocalModelMemory is
// the standalone one: it reads the safetensors files with plain buffered read(2) calls into
// malloc'd memory, as a typical engine does at a cold start, and allocates its own KV blocks.
//
// Threads: Submit and Cancel are called from any thread (the HTTP thread); sinks run on the
// compute thread and must not block (the HTTP side posts the event to its own thread). The
// model, the cache and the metrics must outlive the loop; Stop() (or the destructor) joins
// the thread after failing every request still pending with an Unavailable error.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "standby/engine_metrics.h"
#include "standby/model/generator.h"
#include "standby/model/llama_config.h"
#include "standby/model/llama_model.h"
#include "standby/model/paged_kv.h"
#include "standby/model/weight_table.h"

namespace baton {

class ModelMemory {
 public:
  virtual ~ModelMemory() = default;
  virtual const LlamaConfig& config() const = 0;
  // The tensors, valid for the life of this object.
  virtual const WeightTable& weights() const = 0;
  // The layout of `model`'s KV blocks in this memory.
  virtual Result<KvLayout> KvLayoutFor(const LlamaModel& model) const = 0;
  // Gives `cache` (made with KvLayoutFor's layout) every KV block this memory holds.
  virtual Status AddKvBlocks(PagedKvCache* cache) = 0;
};

struct LocalKvOptions {
  int blocks = 1024;
  int block_tokens = 16;
};

class LocalModelMemory final : public ModelMemory {
 public:
  struct Stats {
    uint64_t bytes_read = 0;
    size_t files = 0;
    size_t tensors = 0;
  };

  // Reads config.json and every safetensors file of `dir` into process memory.
  static Result<std::unique_ptr<LocalModelMemory>> Load(const std::string& dir, LocalKvOptions kv);
  ~LocalModelMemory() override;

  const LlamaConfig& config() const override { return config_; }
  const WeightTable& weights() const override { return weights_; }
  Result<KvLayout> KvLayoutFor(const LlamaModel& model) const override;
  Status AddKvBlocks(PagedKvCache* cache) override;
  const Stats& stats() const { return stats_; }
  size_t kv_bytes() const { return kv_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

  LocalModelMemory() = default;
  Status ReadShard(const std::string& path, uint64_t offset, uint64_t size, Buffer* out);

  LlamaConfig config_;
  LocalKvOptions kv_options_;
  std::vector<Buffer> shards_;  // each shard's data section
  WeightTable weights_;
  Buffer kv_;
  size_t kv_bytes_ = 0;
  Stats stats_;
};

// What the loop hands a request's sink: a token, or the request's end with an error.
struct EngineEvent {
  TokenEvent token;  // token.finish == kError when `error` is set
  Status error;
};

// Optional hooks, called on the compute thread.
struct EngineLoopHooks {
  // Checked before every step; once it fails, every request is failed with its error and
  // the loop refuses new ones (the engine lost the right to write its KV blocks).
  std::function<Status()> guard;
  // A compute step failed.
  std::function<void(const Status&)> on_step_error;
  // Called between steps, and at least once a second while idle (expiry of kept KV).
  std::function<void()> between_steps;
  // The loop's progress: steps finished so far and requests submitted and not finished
  // (pending()). Called once the submitted requests are applied, before each step (so a first
  // step that takes long is seen with its work pending), and after each step.
  std::function<void(uint64_t steps_done, uint32_t work_pending)> on_progress;
};

class EngineLoop {
 public:
  using Sink = std::function<void(const EngineEvent&)>;

  EngineLoop(LlamaModel* model, PagedKvCache* cache, GeneratorOptions options,
             EngineMetrics* metrics, const Clock& clock, EngineLoopHooks hooks = {});
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Paces decoding: a step starts at least `interval` (on the loop's clock) after the
  // previous one, so each stream gets at most one token per interval, as from a model far
  // larger than the one loaded; commands are still applied in between. Zero (the default)
  // steps as fast as the model computes. Call before Start().
  void SetStepInterval(Duration interval) { step_interval_ = interval; }
  void Start();
  void Stop();

  // Queues a generation (request.id is assigned here) and returns its id. A request the
  // Generator refuses ends with one error event; after Stop() that event is delivered at
  // once, on the caller's thread. Thread-safe.
  uint64_t Submit(GenerationRequest request, Sink sink);
  // Drops the request; its sink gets no further event. Thread-safe.
  void Cancel(uint64_t id);
  // Runs `fn` on the compute thread between two steps (to change the cache's blocks).
  // False when the loop has stopped and `fn` will not run. Thread-safe.
  bool RunOnLoop(std::function<void()> fn);
  // Hands every keyed request (one the router sent) over to the next engine: the Generator
  // parks the running sequences (GeneratorOptions::kv_hooks keeps their KV) and each such
  // request ends with an Unavailable error, which the router replays. Blocks until done; returns
  // how many requests ended (0 when the loop has stopped). Thread-safe; not from the compute
  // thread.
  size_t HandOver();
  // Requests submitted and not yet finished. Thread-safe.
  size_t pending() const { return pending_.load(); }

 private:
  struct Command {
    enum class Kind { kSubmit, kCancel, kRun } kind = Kind::kSubmit;
    GenerationRequest request;  // request.id names the target of a cancel too
    Sink sink;
    std::function<void()> fn;  // kRun
  };

  void Run();
  bool WaitForWork(std::vector<Command>* commands);
  void Apply(std::vector<Command>* commands);
  void StepOnce();
  void Pace(TimePoint step_start);
  void OnToken(const TokenEvent& event);
  void FailPending(const Status& status);
  void ReportProgress();
  void Fail(Command* c, const Status& status);
  bool Push(Command* c);

  LlamaModel* model_;
  PagedKvCache* cache_;
  EngineMetrics* metrics_;
  const Clock& clock_;
  EngineLoopHooks hooks_;
  std::unique_ptr<Generator> generator_;
  std::atomic<size_t> pending_{0};

  Mutex mu_;
  CondVar cv_;
  std::vector<Command> inbox_ BATON_GUARDED_BY(mu_);
  uint64_t next_id_ BATON_GUARDED_BY(mu_) = 1;
  bool stop_ BATON_GUARDED_BY(mu_) = false;
  std::thread thread_;

  // Compute thread only.
  Duration step_interval_{0};
  std::unordered_map<uint64_t, Sink> sinks_;
  int finished_in_step_ = 0;
  uint64_t steps_done_ = 0;
  Status refusal_;  // set once the guard failed
};

}  // namespace baton
