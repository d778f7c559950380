#include "standby/engine_loop.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <future>

#include "base/io/unique_fd.h"
#include "base/log.h"
#include "weightcache/model_files.h"

namespace baton {
namespace {

constexpr size_t kReadChunk = 4u << 20;  // bytes per read(2)
constexpr size_t kAlignment = 64;

void* AlignedAlloc(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  return std::aligned_alloc(kAlignment, rounded);
}

}  // namespace

void LocalModelMemory::FreeDeleter::operator()(void* p) const { std::free(p); }

LocalModelMemory::~LocalModelMemory() = default;

Result<std::unique_ptr<LocalModelMemory>> LocalModelMemory::Load(const std::string& dir,
                                                                 LocalKvOptions kv) {
  std::unique_ptr<LocalModelMemory> m(new LocalModelMemory());
  m->kv_options_ = kv;
  BATON_ASSIGN_OR_RETURN(m->config_, LoadLlamaConfig(dir));
  BATON_ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(dir));
  for (const SafetensorsIndex& shard : files.shards()) {
    Buffer data;
    BATON_RETURN_IF_ERROR(
        m->ReadShard(shard.path(), shard.data_offset(), shard.data_size(), &data));
    for (const TensorInfo& t : shard.tensors()) {
      BATON_RETURN_IF_ERROR(
          m->weights_.Add(t.name, {t.dtype, t.shape, data.get() + t.begin, t.size()}));
    }
    m->stats_.tensors += shard.tensors().size();
    m->shards_.push_back(std::move(data));
  }
  m->stats_.files = files.shards().size();
  return m;
}

// Reads `size` bytes at `offset` of `path` into a new buffer, with plain read(2) calls.
Status LocalModelMemory::ReadShard(const std::string& path, uint64_t offset, uint64_t size,
                                   Buffer* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(path + ": open", errno);
  if (::lseek(fd.get(), static_cast<off_t>(offset), SEEK_SET) < 0) {
    return ErrnoStatus(path + ": lseek", errno);
  }
  Buffer buffer(static_cast<uint8_t*>(AlignedAlloc(size)));
  if (!buffer) return ResourceExhausted(path + ": cannot allocate " + std::to_string(size));
  uint64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadChunk, size - done));
    const ssize_t n = ::read(fd.get(), buffer.get() + done, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(path + ": read", errno);
    if (n == 0) return DataLoss(path + ": file ended " + std::to_string(size - done) + " early");
    done += static_cast<uint64_t>(n);
  }
  stats_.bytes_read += done;
  *out = std::move(buffer);
  return OkStatus();
}

Result<KvLayout> LocalModelMemory::KvLayoutFor(const LlamaModel& model) const {
  KvLayout layout = model.MakeKvLayout(kv_options_.block_tokens);
  BATON_RETURN_IF_ERROR(layout.Validate());
  return layout;
}

Status LocalModelMemory::AddKvBlocks(PagedKvCache* cache) {
  if (kv_) return FailedPrecondition("kv blocks were already handed out");
  if (kv_options_.blocks < 1) return InvalidArgument("kv blocks must be at least 1");
  const size_t stride = cache->layout().block_bytes();
  const size_t count = static_cast<size_t>(kv_options_.blocks);
  kv_.reset(static_cast<uint8_t*>(AlignedAlloc(stride * count)));
  if (!kv_) {
    return ResourceExhausted("cannot allocate " + std::to_string(count) + " kv blocks of " +
                             std::to_string(stride) + " bytes");
  }
  kv_bytes_ = stride * count;
  return cache->AddRegion(0, kv_.get(), stride, count);
}

EngineLoop::EngineLoop(LlamaModel* model, PagedKvCache* cache, GeneratorOptions options,
                       EngineMetrics* metrics, const Clock& clock, EngineLoopHooks hooks)
    : model_(model), cache_(cache), metrics_(metrics), clock_(clock), hooks_(std::move(hooks)) {
  generator_ = std::make_unique<Generator>(model_, cache_, options,
                                           [this](const TokenEvent& e) { OnToken(e); });
}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Start() {
  MutexLock lock(mu_);
  if (thread_.joinable() || stop_) return;
  thread_ = std::thread([this] { Run(); });
}

void EngineLoop::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

// Queues `c`; false (and `c` untouched) once stopped.
bool EngineLoop::Push(Command* c) {
  {
    MutexLock lock(mu_);
    if (stop_) return false;
    inbox_.push_back(std::move(*c));
  }
  cv_.NotifyOne();
  return true;
}

uint64_t EngineLoop::Submit(GenerationRequest request, Sink sink) {
  uint64_t id;
  {
    MutexLock lock(mu_);
    id = next_id_++;
  }
  request.id = id;
  ++pending_;
  Command c{Command::Kind::kSubmit, std::move(request), std::move(sink), {}};
  if (!Push(&c)) {
    --pending_;
    c.sink({{id, -1, 0, 0, FinishReason::kError}, Unavailable("the engine is shutting down")});
  }
  return id;
}

void EngineLoop::Cancel(uint64_t id) {
  Command c;
  c.kind = Command::Kind::kCancel;
  c.request.id = id;
  (void)Push(&c);
}

bool EngineLoop::RunOnLoop(std::function<void()> fn) {
  Command c;
  c.kind = Command::Kind::kRun;
  c.fn = std::move(fn);
  return Push(&c);
}

size_t EngineLoop::HandOver() {
  auto done = std::make_shared<std::promise<size_t>>();
  std::future<size_t> count = done->get_future();
  if (!RunOnLoop([this, done] {
        const std::vector<uint64_t> ids = generator_->HandOver();
        const Status handed = Unavailable("handed over to the next primary");
        for (uint64_t id : ids) {
          auto it = sinks_.find(id);
          if (it == sinks_.end()) continue;
          --pending_;
          it->second({{id, -1, 0, 0, FinishReason::kError}, handed});
          sinks_.erase(it);
        }
        metrics_->SetQueue(0, 0);
        done->set_value(ids.size());
      })) {
    return 0;
  }
  return count.get();
}

void EngineLoop::Run() {
  BATON_LOG(INFO, "engine") << "compute thread started";
  std::vector<Command> commands;
  while (WaitForWork(&commands)) {
    Apply(&commands);
    if (hooks_.between_steps) hooks_.between_steps();
    ReportProgress();
    if (!generator_->idle()) {
      const TimePoint start = clock_.Now();
      StepOnce();
      ++steps_done_;
      ReportProgress();
      Pace(start);
    } else {  // cancellations emptied the batch: the gauges say so before the loop sleeps
      metrics_->SetQueue(0, static_cast<int64_t>(generator_->waiting()));
    }
  }
  Apply(&commands);  // requests that came with the stop are failed below
  FailPending(Unavailable("the engine is shutting down"));
  BATON_LOG(INFO, "engine") << "compute thread stopped";
}

// Takes the inbox; blocks while there is nothing to do. False once stopping.
bool EngineLoop::WaitForWork(std::vector<Command>* commands) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!stop_ && inbox_.empty() && generator_->idle()) {
    if (!hooks_.between_steps) {
      cv_.Wait(mu_);
    } else if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
      break;
    }
  }
  commands->clear();
  commands->swap(inbox_);
  return !stop_;
}

void EngineLoop::Fail(Command* c, const Status& status) {
  --pending_;
  c->sink({{c->request.id, -1, 0, 0, FinishReason::kError}, status});
}

void EngineLoop::Apply(std::vector<Command>* commands) {
  for (Command& c : *commands) {
    const uint64_t id = c.request.id;
    if (c.kind == Command::Kind::kRun) {
      c.fn();
    } else if (c.kind == Command::Kind::kCancel) {
      if (generator_->Cancel(id)) {
        BATON_LOG(DEBUG, "engine") << "request " << id << " cancelled";
      }
      if (sinks_.erase(id) > 0) --pending_;
    } else if (!refusal_.ok()) {
      Fail(&c, refusal_);
    } else {
      const int64_t prompt = static_cast<int64_t>(c.request.prompt.size());
      Status s = generator_->Add(std::move(c.request));
      if (s.code() == StatusCode::kResourceExhausted) {
        s = InvalidArgument(s.message());  // it would never fit: no use retrying
      }
      if (!s.ok()) {
        BATON_LOG(WARN, "engine") << "request " << id << " refused: " << s.ToString();
        c.request.id = id;
        Fail(&c, s);
        continue;
      }
      metrics_->AddPromptTokens(prompt);
      sinks_[id] = std::move(c.sink);
    }
  }
  commands->clear();
}

void EngineLoop::StepOnce() {
  if (hooks_.guard) {
    Status s = hooks_.guard();
    if (!s.ok()) {
      BATON_LOG(ERROR, "engine") << "no longer allowed to compute: " << s.ToString();
      refusal_ = Unavailable("the engine was fenced: " + s.message());
      return FailPending(refusal_);
    }
  }
  finished_in_step_ = 0;
  const TimePoint start = clock_.Now();
  Result<int> r = generator_->Step();
  const double seconds = MillisBetween(start, clock_.Now()) / 1000.0;
  if (!r.ok()) {
    BATON_LOG(ERROR, "engine") << "step failed: " << r.status().ToString();
    if (hooks_.on_step_error) hooks_.on_step_error(r.status());
  }
  const int batch = static_cast<int>(generator_->running()) + finished_in_step_;
  if (batch > 0) metrics_->ObserveStep(batch, seconds);
  metrics_->SetQueue(static_cast<int64_t>(generator_->running()),
                     static_cast<int64_t>(generator_->waiting()));
}

// Until step_interval_ after `step_start` on clock_ (polled, so a FakeClock drives it too),
// applying the commands that arrive meanwhile; returns early when stopping.
void EngineLoop::Pace(TimePoint step_start) {
  if (step_interval_ <= Duration::zero()) return;
  constexpr auto kPoll = std::chrono::milliseconds(1);
  const TimePoint due = step_start + step_interval_;
  std::vector<Command> commands;
  while (clock_.Now() < due) {
    {
      MutexLock lock(mu_);
      if (stop_) return;
      if (inbox_.empty()) cv_.WaitFor(mu_, kPoll);
      commands.swap(inbox_);
    }
    Apply(&commands);
  }
}

void EngineLoop::OnToken(const TokenEvent& event) {
  auto it = sinks_.find(event.request_id);
  if (it == sinks_.end()) return;
  EngineEvent out{event, OkStatus()};
  if (event.finish == FinishReason::kError) {
    out.error = Internal("the compute step failed");
  } else {
    metrics_->AddGeneratedTokens(1);
  }
  it->second(out);
  if (event.finish != FinishReason::kNone) {
    ++finished_in_step_;
    --pending_;
    sinks_.erase(it);
  }
}

void EngineLoop::ReportProgress() {
  if (!hooks_.on_progress) return;
  hooks_.on_progress(steps_done_,
                     static_cast<uint32_t>(std::min<size_t>(pending_.load(), UINT32_MAX)));
}

void EngineLoop::FailPending(const Status& status) {
  for (auto& [id, sink] : sinks_) {
    generator_->Cancel(id);
    --pending_;
    sink({{id, -1, 0, 0, FinishReason::kError}, status});
  }
  sinks_.clear();
  metrics_->SetQueue(0, 0);
}

}  // namespace baton
