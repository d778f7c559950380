// Micro benchmarks of per-call hot paths, with the project's own classes:
//   - a control message (Heartbeat; a RouteTable of 3 entries) encoded into a frame
//     (cereal payload + header + CRC32C), and a frame fed to a connection's FrameDecoder and
//     decoded back, as the channel does; one item is one message;
//   - the router on a streamed completion: the stream of a 64-token /v1/completions answer as
//     the reference engine writes it (standby/openai/completions_api.h: a first event with the 200
//     prompt token ids, one event per token with its id, finish_reason on the last, a usage event,
//     [DONE]);
//     - SseSplitter fed that stream in reads of 64 bytes (an event split across reads) and of
//       1460 bytes (one TCP segment, several events); one item is one event;
//     - StreamReplay taking the first attempt's events (parsing each, learning its token ids)
//       after the attempt body is built; one item is one event;
//     - StreamReplay building the body of a replay on token ids after 32 tokens were sent
//       (prompt ids + ids sent, max_tokens reduced, same seed); one item is one body;
//   - PoolLedger Grant of 16 blocks and Return of what was granted, on a 4096-block pool whose
//     free space is cut into holes by earlier leases; one item is one grant + return;
//   - PoolMapping::ReadHeaders of the 64-byte headers of 32,768 pool blocks of 2 MiB (4 KiB
//     pages), as an engine promoted over a dead primary's quarantined blocks reads them, on 1
//     thread and on as many as the CPUs (at most 8); one item is one block;
//   - SafetensorsIndex::ParseHeader of a Llama-style header of 300 tensors (BF16, with
//     __metadata__); one item is one tensor;
//   - an engine spawned into its cgroup (micro_bench_spawn.cc).
// Run by perf/micro_bench, which prints the results as one JSON line.
#include <benchmark/benchmark.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "controller/core/pool_ledger.h"
#include "controller/epoch_journal.h"
#include "proto/messages.h"
#include "proto/transport/shared_memory.h"
#include "proto/wire/frame.h"
#include "router/stream/sse_splitter.h"
#include "router/stream/stream_replay.h"
#include "standby/openai/completions_api.h"
#include "standby/sdk/pool_mapping.h"
#include "weightcache/safetensors/safetensors_index.h"

namespace baton {
namespace {

// ---- proto frames ---------------------------------------------------------------------------

template <typename T>
T SampleMessage();

template <>
proto::Heartbeat SampleMessage<proto::Heartbeat>() {
  proto::Heartbeat m;
  m.epoch = 7;
  m.seq = 123'456;
  return m;
}

proto::RouteEntry Route(uint64_t engine_id, proto::EngineRole role, const char* address, bool ready,
                        uint32_t weight, const char* version) {
  proto::RouteEntry e;
  e.engine_id = engine_id;
  e.role = role;
  e.http_address = address;
  e.ready = ready;
  e.weight = weight;
  e.engine_version = version;
  return e;
}

// A canary upgrade in progress: primary, canary at 10 %, standby.
template <>
proto::RouteTable SampleMessage<proto::RouteTable>() {
  proto::RouteTable m;
  m.version = 42;
  m.epoch = 7;
  m.pair_state = "canary";
  m.entries = {
      Route(1, proto::EngineRole::kPrimary, "127.0.0.1:8101", true, 90, "refengine-1.4.2"),
      Route(3, proto::EngineRole::kCanary, "127.0.0.1:8103", true, 10, "refengine-1.5.0"),
      Route(2, proto::EngineRole::kStandby, "127.0.0.1:8102", false, 0, "refengine-1.4.2")};
  return m;
}

template <typename T>
Result<std::string> EncodeMessageFrame(const T& msg) {
  Result<std::string> payload = proto::Encode(msg);
  if (!payload.ok()) return payload.status();
  return proto::EncodeFrame(static_cast<uint16_t>(T::kType), *payload);
}

template <typename T>
void BM_FrameEncode(benchmark::State& state) {
  const T msg = SampleMessage<T>();
  size_t frame_bytes = 0;
  for (auto _ : state) {
    Result<std::string> frame = EncodeMessageFrame(msg);
    if (!frame.ok()) {
      state.SkipWithError(frame.status().ToString().c_str());
      break;
    }
    frame_bytes = frame->size();
    benchmark::DoNotOptimize(frame->data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(frame_bytes));
}
BENCHMARK_TEMPLATE(BM_FrameEncode, proto::Heartbeat);
BENCHMARK_TEMPLATE(BM_FrameEncode, proto::RouteTable);

template <typename T>
void BM_FrameDecode(benchmark::State& state) {
  Result<std::string> frame = EncodeMessageFrame(SampleMessage<T>());
  if (!frame.ok()) {
    state.SkipWithError(frame.status().ToString().c_str());
    return;
  }
  proto::FrameDecoderOptions options;
  options.is_known_type = proto::IsKnownMsgType;
  proto::FrameDecoder decoder(options);  // one connection's decoder, fed frame after frame
  for (auto _ : state) {
    decoder.Feed(*frame);
    Result<std::optional<proto::Frame>> next = decoder.Next();
    if (!next.ok() || !next->has_value()) {
      state.SkipWithError(next.ok() ? "no frame decoded" : next.status().ToString().c_str());
      break;
    }
    Result<T> msg = proto::Decode<T>((*next)->payload);
    if (!msg.ok()) {
      state.SkipWithError(msg.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(*msg);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(frame->size()));
}
BENCHMARK_TEMPLATE(BM_FrameDecode, proto::Heartbeat);
BENCHMARK_TEMPLATE(BM_FrameDecode, proto::RouteTable);

// ---- router: SSE stream ---------------------------------------------------------------------

constexpr int kPromptTokens = 200;
constexpr int kCompletionTokens = 64;

const char kRequestBody[] =
    R"({"model":"tiny","prompt":"Summarize the incident report below in three sentences.",)"
    R"("max_tokens":64,"temperature":0.8,"seed":42,"stream":true,)"
    R"("stream_options":{"include_usage":true}})";

// The engine's SSE stream answering kRequestBody.
std::string CompletionStream() {
  CompletionHeader header;
  header.id = "cmpl-5f1c2a9e8b7d4c3a";
  header.created = 1'735'689'600;
  header.model = "tiny";
  header.seed = 42;
  std::vector<int32_t> prompt;
  for (int i = 0; i < kPromptTokens; ++i) prompt.push_back(100 + (i * 37) % 3000);
  static const char* const kWords[] = {" the", " engine",  " was",    " restarted", " and",
                                       " no",  " request", " failed", "."};
  std::string stream;
  for (int i = 0; i < kCompletionTokens; ++i) {
    const bool last = i + 1 == kCompletionTokens;
    const std::vector<int32_t> ids = {static_cast<int32_t>(200 + (i * 53) % 3000)};
    stream += SseEvent(CompletionChunk(header, kWords[i % std::size(kWords)], last ? "length" : "",
                                       ids, i == 0 ? &prompt : nullptr));
  }
  CompletionUsage usage;
  usage.prompt_tokens = kPromptTokens;
  usage.completion_tokens = kCompletionTokens;
  stream += SseEvent(UsageChunk(header, usage));
  stream += SseDone();
  return stream;
}

std::vector<std::string> Events(const std::string& stream) {
  SseSplitter splitter;
  std::vector<std::string> events;
  splitter.Feed(stream, &events);
  return events;
}

void BM_SseSplitterFeed(benchmark::State& state) {
  const std::string stream = CompletionStream();
  const size_t expected = Events(stream).size();
  const auto read_bytes = static_cast<size_t>(state.range(0));
  std::vector<std::string> events;
  for (auto _ : state) {
    SseSplitter splitter;
    events.clear();
    for (size_t pos = 0; pos < stream.size(); pos += read_bytes) {
      splitter.Feed(std::string_view(stream).substr(pos, read_bytes), &events);
    }
    if (events.size() != expected || splitter.pending() != 0) {
      state.SkipWithError("the stream was not split into its events");
      break;
    }
    benchmark::DoNotOptimize(events.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(expected));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(stream.size()));
}
BENCHMARK(BM_SseSplitterFeed)->Arg(64)->Arg(1460);

void BM_StreamReplayRecord(benchmark::State& state) {
  const std::vector<std::string> events = Events(CompletionStream());
  const std::string body = kRequestBody;
  for (auto _ : state) {
    StreamReplay replay("/v1/completions", body);
    replay.BeginAttempt();
    benchmark::DoNotOptimize(replay.AttemptBody());
    for (const std::string& event : events) {
      StreamReplay::Outcome outcome = replay.OnEvent(event);
      benchmark::DoNotOptimize(outcome.to_client.data());
    }
    if (replay.tokens_sent() != kCompletionTokens || !replay.ids_known()) {
      state.SkipWithError("the stream's token ids were not recorded");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(events.size()));
}
BENCHMARK(BM_StreamReplayRecord);

void BM_StreamReplayReplayBody(benchmark::State& state) {
  const std::vector<std::string> events = Events(CompletionStream());
  StreamReplay replay("/v1/completions", kRequestBody);
  replay.BeginAttempt();
  for (int i = 0; i < kCompletionTokens / 2; ++i) replay.OnEvent(events[i]);
  if (!replay.CanContinue()) {
    state.SkipWithError("the interrupted stream cannot be replayed");
    return;
  }
  replay.BeginAttempt();  // the engine failed after 32 tokens: the next attempt is a replay
  if (replay.AttemptBody().find("\"baton_resume_tokens\":32") == std::string::npos) {
    state.SkipWithError("the replay body does not resume after 32 tokens");
    return;
  }
  for (auto _ : state) {
    std::string body = replay.AttemptBody();
    benchmark::DoNotOptimize(body.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_StreamReplayReplayBody);

// ---- pool ledger ----------------------------------------------------------------------------

// Epochs in memory: the ledger's bookkeeping without the journal's fsync.
class MemoryEpochs final : public EpochStore {
 public:
  uint64_t current() const override { return current_; }
  Result<uint64_t> Advance() override { return ++current_; }

 private:
  uint64_t current_ = 0;
};

void BM_PoolLedgerGrantReturn(benchmark::State& state) {
  constexpr uint32_t kBlocks = 4096;
  constexpr EngineId kPrimary = 1;
  const auto blocks = static_cast<uint32_t>(state.range(0));
  MemoryEpochs epochs;
  PoolLedger ledger(kBlocks, epochs);
  const uint64_t epoch = *epochs.Advance();
  Status status = ledger.AddStandby(kPrimary);
  if (status.ok()) status = ledger.Promote(kPrimary, epoch);
  // 64 leases of 32 blocks, every other one returned: 32 holes before the free tail.
  std::vector<Extent> leased;
  for (int i = 0; status.ok() && i < 64; ++i) {
    Result<std::vector<Extent>> granted = ledger.Grant(kPrimary, 32, epoch);
    if (!granted.ok()) status = granted.status();
    if (status.ok()) leased.insert(leased.end(), granted->begin(), granted->end());
  }
  for (size_t i = 1; status.ok() && i < leased.size(); i += 2) {
    status = ledger.Return(kPrimary, leased[i], epoch);
  }
  if (!status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    Result<std::vector<Extent>> granted = ledger.Grant(kPrimary, blocks, epoch);
    if (!granted.ok()) {
      state.SkipWithError(granted.status().ToString().c_str());
      break;
    }
    for (const Extent& extent : *granted) {
      status = ledger.Return(kPrimary, extent, epoch);
      if (!status.ok()) break;
    }
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PoolLedgerGrantReturn)->Arg(16);

// ---- quarantined headers --------------------------------------------------------------------

void BM_PoolReadHeaders(benchmark::State& state) {
  constexpr uint32_t kBlocks = 32'768;
  constexpr uint64_t kBlockBytes = 2 << 20;
  Result<SharedMemory> memory = SharedMemory::Create(
      {.name = "baton-bench-pool", .size = kBlocks * kBlockBytes, .try_huge_pages = false});
  Result<PoolMapping> pool = Unavailable("no pool file");
  if (memory.ok()) {
    // Each header's page is there, as in a pool whose blocks were written.
    for (uint32_t b = 0; b < kBlocks; ++b) {
      (void)::pwrite(memory->fd(), &b, sizeof(b), static_cast<off_t>(b * kBlockBytes));
    }
    Result<UniqueFd> fd = memory->Dup();
    pool = fd.ok() ? PoolMapping::Reserve(std::move(fd).value(),
                                          {.block_count = kBlocks,
                                           .block_bytes = kBlockBytes,
                                           .reserve_bytes = kBlocks * kBlockBytes,
                                           .huge_pages = false})
                   : Result<PoolMapping>(fd.status());
  }
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return;
  }
  if (state.range(1) != 0) {  // through the header view, its pages faulted in beforehand
    Status view = memory->Seal(Sealing::kFixedSize);
    if (view.ok()) view = pool->MapHeaderView();
    if (!view.ok()) {
      state.SkipWithError(view.ToString().c_str());
      return;
    }
    pool->PrefaultHeaderView(0, kBlocks);
  }
  const std::vector<BlockRun> runs = {{.first = 0, .count = kBlocks}};
  const auto threads = static_cast<unsigned>(state.range(0));
  std::vector<uint8_t> out;
  for (auto _ : state) {
    out.clear();
    const std::vector<Status> read = pool->ReadHeaders(runs, 64, threads, &out);
    if (!read[0].ok()) {
      state.SkipWithError(read[0].ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kBlocks);
}
// With pread (second argument 0) and from the header view (1), on 1 thread and on as many
// as the engine SDK would use here (the CPUs this process may run on, at most 8).
void PoolReadHeadersArgs(benchmark::internal::Benchmark* b) {
  cpu_set_t cpus;
  const int n = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  for (int view : {0, 1}) {
    b->Args({1, view});
    if (std::clamp(n, 1, 8) > 1) b->Args({std::clamp(n, 1, 8), view});
  }
}
BENCHMARK(BM_PoolReadHeaders)
    ->Apply(PoolReadHeadersArgs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- safetensors header ---------------------------------------------------------------------

struct SafetensorsHeader {
  std::string json;
  uint64_t file_size = 0;
  size_t tensors = 0;
};

// A Llama-style checkpoint's header in file order: embeddings, 33 layers of 9 tensors, the
// final norm and the LM head (300 tensors), BF16, back to back from offset 0.
SafetensorsHeader LlamaHeader() {
  constexpr int64_t kHidden = 1024, kKv = 256, kIntermediate = 2816, kVocab = 32000;
  constexpr int kLayers = 33;
  nlohmann::ordered_json root;
  root["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  size_t tensors = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    uint64_t bytes = 2;
    for (int64_t d : shape) bytes *= static_cast<uint64_t>(d);
    root[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    ++tensors;
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden});
    add(p + "self_attn.q_proj.weight", {kHidden, kHidden});
    add(p + "self_attn.k_proj.weight", {kKv, kHidden});
    add(p + "self_attn.v_proj.weight", {kKv, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kHidden});
    add(p + "post_attention_layernorm.weight", {kHidden});
    add(p + "mlp.gate_proj.weight", {kIntermediate, kHidden});
    add(p + "mlp.up_proj.weight", {kIntermediate, kHidden});
    add(p + "mlp.down_proj.weight", {kHidden, kIntermediate});
  }
  add("model.norm.weight", {kHidden});
  add("lm_head.weight", {kVocab, kHidden});
  SafetensorsHeader h;
  h.json = root.dump();
  h.file_size = 8 + h.json.size() + offset;
  h.tensors = tensors;
  return h;
}

void BM_SafetensorsParseHeader(benchmark::State& state) {
  const SafetensorsHeader header = LlamaHeader();
  for (auto _ : state) {
    Result<SafetensorsIndex> index =
        SafetensorsIndex::ParseHeader("model.safetensors", header.json, header.file_size);
    if (!index.ok() || index->tensors().size() != header.tensors) {
      state.SkipWithError(index.ok() ? "wrong tensor count" : index.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(index->tensors().data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(header.tensors));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(header.json.size()));
  state.counters["tensors"] = static_cast<double>(header.tensors);
}
BENCHMARK(BM_SafetensorsParseHeader);

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  baton::SetLogLevel(baton::LogLevel::kWarn);  // set-up steps log at info
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
