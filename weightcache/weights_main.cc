// baton-weights: load, inspect, hash and verify a model's weights with the weight cache.
//
//   baton-weights load DIR [--numa N] [--gpu-pci ID] [--queue-depth Q] [--chunk-mib C]
//                          [--no-direct] [--no-uring] [--no-huge-pages] [--max-huge-pages N]
//                          [--no-lock] [--json]
//   baton-weights inspect FILE_OR_DIR [--json]
//   baton-weights hash DIR [load flags] [--json]     writes DIR/baton-integrity.json
//   baton-weights verify DIR [load flags] [--json]   checks the cache against it
//   baton-weights adopt DIR [load flags] [--json]    loads, then adopts the arena as a
//                                                    restarted controller would, and times it
//
// Exit status: 0 ok, 1 refused or failed (the reason on stderr), 2 bad usage. With --json
// the last line of standard output is one JSON object.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/build_info.h"
#include "base/clock.h"
#include "base/log.h"
#include "weightcache/integrity.h"
#include "weightcache/model_files.h"
#include "weightcache/safetensors/safetensors_index.h"
#include "weightcache/weight_cache.h"

namespace baton {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: baton-weights COMMAND ARGS\n"
    "  load DIR [--numa N] [--gpu-pci ID] [--queue-depth Q] [--chunk-mib C]\n"
    "           [--no-direct] [--no-uring] [--no-huge-pages] [--max-huge-pages N]\n"
    "           [--no-lock] [--json]\n"
    "  inspect FILE_OR_DIR [--json]\n"
    "  hash DIR [load flags] [--json]     write DIR/baton-integrity.json\n"
    "  verify DIR [load flags] [--json]   check the weights against it\n"
    "  adopt DIR [load flags] [--json]    load, then time adopting the arena (as a restarted\n"
    "                                     controller would) and check the adopted bytes\n"
    "exit: 0 ok, 1 refused or failed, 2 bad usage\n";

struct Args {
  std::string command;
  std::string path;
  bool json = false;
  WeightCacheOptions options;
};

// With --json, an error is also the last line of stdout (as batonctl's).
void PrintJsonError(const std::string& message) {
  std::cout << nlohmann::json{{"ok", false}, {"error", message}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
}

int Usage(const std::string& problem, bool json) {
  std::cerr << "baton-weights: " << problem << "\n" << kUsage;
  if (json) PrintJsonError(problem);
  return kExitUsage;
}

template <typename T>
std::optional<T> ParseNumber(const std::string& text) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

// Parses argv into `args`; returns an empty string or the usage problem.
std::string ParseArgs(int argc, char** argv, Args* args) {
  if (argc < 2) return "missing command";
  args->command = argv[1];
  const bool loads = args->command == "load" || args->command == "hash" ||
                     args->command == "verify" || args->command == "adopt";
  if (!loads && args->command != "inspect") return "unknown command '" + args->command + "'";
  LoadOptions& load = args->options.load;
  ArenaOptions& arena = args->options.arena;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (a == "--json") {
      args->json = true;
    } else if (!a.empty() && a[0] != '-') {
      if (!args->path.empty()) return "unexpected argument '" + a + "'";
      args->path = a;
    } else if (!loads) {
      return "unknown flag '" + a + "' for " + args->command;
    } else if (a == "--no-direct") {
      load.direct = false;
    } else if (a == "--no-uring") {
      load.use_uring = false;
    } else if (a == "--no-huge-pages") {
      arena.huge_pages = false;
    } else if (a == "--no-lock") {
      arena.lock = false;
    } else if (a == "--gpu-pci") {
      auto v = value();
      if (!v) return "--gpu-pci needs a PCI bus id";
      arena.gpu_pci_bus_id = *v;
    } else if (a == "--max-huge-pages") {
      auto v = value();
      auto n = v ? ParseNumber<uint32_t>(*v) : std::nullopt;
      if (!n) return "--max-huge-pages needs a non-negative integer";
      arena.max_huge_pages = *n;
    } else if (a == "--numa" || a == "--queue-depth" || a == "--chunk-mib") {
      auto v = value();
      auto n = v ? ParseNumber<unsigned>(*v) : std::nullopt;
      if (!n) return a + " needs a non-negative integer";
      if (a == "--numa") arena.numa_node = static_cast<int>(*n);
      if (a == "--queue-depth") {
        if (*n == 0 || *n > 4096) return "--queue-depth must be between 1 and 4096";
        load.queue_depth = *n;
      }
      if (a == "--chunk-mib") {
        if (*n == 0 || *n > 1024) return "--chunk-mib must be between 1 and 1024";
        load.chunk_size = static_cast<uint64_t>(*n) << 20;
      }
    } else {
      return "unknown flag '" + a + "'";
    }
  }
  if (args->path.empty()) return args->command + " needs a path";
  return "";
}

// Draws a progress bar on stderr, at most every 100 ms; the rate counts from the first call.
class ProgressBar {
 public:
  void Update(uint64_t done, uint64_t total) {
    const TimePoint now = RealClock::Get().Now();
    if (!started_) {
      started_ = true;
      start_ = now;
    }
    if (done < total && MillisBetween(last_, now) < 100) return;
    last_ = now;
    const double frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const double secs = MillisBetween(start_, now) / 1000.0;
    const int filled = static_cast<int>(frac * 40);
    std::fprintf(stderr, "\r[%-40s] %5.1f%% %.2f GB %.2f GB/s", std::string(filled, '#').c_str(),
                 frac * 100, static_cast<double>(done) / 1e9,
                 secs > 0 ? static_cast<double>(done) / secs / 1e9 : 0.0);
    if (done >= total) std::fputc('\n', stderr);
  }

 private:
  bool started_ = false;
  TimePoint start_{};
  TimePoint last_{};
};

Json LoadJson(const WeightCache& cache) {
  const PinnedArena& a = cache.arena();
  const LoadStats& s = cache.load_stats();
  Json j;
  j["dir"] = cache.dir();
  j["tensors"] = cache.tensors().size();
  j["tensor_bytes"] = cache.tensor_bytes();
  j["arena_bytes"] = a.size();
  j["read_bytes"] = s.bytes;
  j["huge_pages"] = a.huge_pages();
  j["arena_huge_bytes"] = a.huge_bytes();
  j["arena_small_bytes"] = a.small_bytes();
  j["numa_node"] = a.numa_node();
  j["numa_source"] = a.numa_source();
  j["numa_bound"] = a.numa_bound();
  j["locked"] = a.locked();
  j["method"] = s.method;
  j["load_s"] = s.seconds;
  j["load_gbps"] = s.gbps;
  Json warnings = Json::array();
  for (const std::string& w : a.warnings()) warnings.push_back(w);
  if (!s.fallback_reason.empty()) warnings.push_back(s.fallback_reason);
  j["warnings"] = warnings;
  return j;
}

void PrintLoad(const Json& j) {
  std::printf("model        %s\n", j["dir"].get<std::string>().c_str());
  std::printf("tensors      %zu (%llu bytes)\n", j["tensors"].get<size_t>(),
              static_cast<unsigned long long>(j["tensor_bytes"].get<uint64_t>()));
  std::printf(
      "arena        %llu bytes (%llu on 2 MiB pages, %llu on 4 KiB pages), NUMA node %d "
      "(%s%s), locked %s\n",
      static_cast<unsigned long long>(j["arena_bytes"].get<uint64_t>()),
      static_cast<unsigned long long>(j["arena_huge_bytes"].get<uint64_t>()),
      static_cast<unsigned long long>(j["arena_small_bytes"].get<uint64_t>()),
      j["numa_node"].get<int>(), j["numa_source"].get<std::string>().c_str(),
      j["numa_bound"].get<bool>() ? ", bound" : ", not bound",
      j["locked"].get<bool>() ? "yes" : "no");
  std::printf("read         %llu bytes in %.3f s, %.2f GB/s, %s\n",
              static_cast<unsigned long long>(j["read_bytes"].get<uint64_t>()),
              j["load_s"].get<double>(), j["load_gbps"].get<double>(),
              j["method"].get<std::string>().c_str());
  std::printf("total        %.3f s including arena set-up\n", j["total_s"].get<double>());
  for (const auto& w : j["warnings"])
    std::printf("warning      %s\n", w.get<std::string>().c_str());
}

Result<WeightCache> LoadCache(Args& args) {
  ProgressBar bar;
  if (::isatty(STDERR_FILENO)) {
    args.options.load.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  }
  return WeightCache::Load(args.path, args.options);
}

// The error on stderr and, with --json, as the last line of stdout.
void PrintError(const std::string& message, bool json) {
  std::cerr << "baton-weights: " << message << "\n";
  if (json) PrintJsonError(message);
}

int Fail(const Status& status, bool json) {
  PrintError(status.ToString(), json);
  return kExitFailed;
}

int RunLoad(Args& args) {
  const TimePoint start = RealClock::Get().Now();
  auto cache = LoadCache(args);
  if (!cache.ok()) return Fail(cache.status(), args.json);
  Json j = LoadJson(*cache);
  // Arena creation (page faults, mbind, mlock) plus the read.
  j["total_s"] = MillisBetween(start, RealClock::Get().Now()) / 1000.0;
  if (args.json) {
    std::cout << j.dump() << std::endl;
  } else {
    PrintLoad(j);
  }
  return kExitOk;
}

Json ShardJson(const SafetensorsIndex& index) {
  Json j;
  j["path"] = index.path();
  j["file_size"] = index.file_size();
  j["header_size"] = index.header_size();
  j["data_offset"] = index.data_offset();
  j["metadata"] = index.metadata();
  Json tensors = Json::array();
  for (const TensorInfo& t : index.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"shape", t.shape},
                       {"data_offsets", {t.begin, t.end}},
                       {"file_offset", index.data_offset() + t.begin},
                       {"bytes", t.size()}});
  }
  j["tensors"] = tensors;
  return j;
}

void PrintShard(const Json& shard) {
  std::printf("%s: %llu bytes, header %llu bytes, data at %llu\n",
              shard["path"].get<std::string>().c_str(),
              static_cast<unsigned long long>(shard["file_size"].get<uint64_t>()),
              static_cast<unsigned long long>(shard["header_size"].get<uint64_t>()),
              static_cast<unsigned long long>(shard["data_offset"].get<uint64_t>()));
  for (const auto& [k, v] : shard["metadata"].items()) {
    std::printf("  metadata %s = %s\n", k.c_str(), v.get<std::string>().c_str());
  }
  for (const auto& t : shard["tensors"]) {
    std::printf("  %-48s %-6s %-20s [%llu, %llu)\n", t["name"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(), t["shape"].dump().c_str(),
                static_cast<unsigned long long>(t["data_offsets"][0].get<uint64_t>()),
                static_cast<unsigned long long>(t["data_offsets"][1].get<uint64_t>()));
  }
}

int RunInspect(const Args& args) {
  struct stat st {};
  if (::stat(args.path.c_str(), &st) != 0) {  // gone, a link loop, no permission: as it is
    return Fail(errno == ENOENT ? NotFound(args.path + " does not exist")
                                : ErrnoStatus(args.path + ": stat", errno),
                args.json);
  }
  Json out;
  Json shards = Json::array();
  uint64_t count = 0;
  uint64_t bytes = 0;
  auto add = [&](const SafetensorsIndex& index) {
    shards.push_back(ShardJson(index));
    count += index.tensors().size();
    for (const TensorInfo& t : index.tensors()) bytes += t.size();
  };
  if (S_ISDIR(st.st_mode)) {
    auto files = ModelFiles::Open(args.path);
    if (!files.ok()) return Fail(files.status(), args.json);
    for (const SafetensorsIndex& index : files->shards()) add(index);
  } else {
    auto index = SafetensorsIndex::ParseFile(args.path);
    if (!index.ok()) return Fail(index.status(), args.json);
    add(*index);
  }
  out["path"] = args.path;
  out["files"] = shards;
  out["tensors"] = count;
  out["tensor_bytes"] = bytes;
  if (args.json) {
    std::cout << out.dump() << std::endl;
    return kExitOk;
  }
  for (const auto& shard : shards) PrintShard(shard);
  std::printf("%llu tensors, %llu bytes\n", static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(bytes));
  return kExitOk;
}

int RunHash(Args& args) {
  auto cache = LoadCache(args);
  if (!cache.ok()) return Fail(cache.status(), args.json);
  IntegrityManifest manifest = HashTensors(*cache);
  if (Status s = WriteManifest(args.path, manifest); !s.ok()) return Fail(s, args.json);
  const std::string path = args.path + "/" + kIntegrityManifestName;
  if (args.json) {
    std::cout << Json{{"manifest", path}, {"tensors", manifest.tensors.size()}}.dump() << std::endl;
  } else {
    std::printf("wrote %s: %zu tensors (%s)\n", path.c_str(), manifest.tensors.size(),
                kIntegrityAlgorithm);
  }
  return kExitOk;
}

int RunVerify(Args& args) {
  auto expected = ReadManifest(args.path);
  if (!expected.ok()) return Fail(expected.status(), args.json);
  auto cache = LoadCache(args);
  if (!cache.ok()) return Fail(cache.status(), args.json);
  const IntegrityReport report = Verify(*cache, *expected);
  if (args.json) {
    std::cout << Json{{"ok", report.ok()},
                      {"checked", report.checked},
                      {"mismatched", report.mismatched},
                      {"missing", report.missing},
                      {"unexpected", report.unexpected}}
                     .dump()
              << std::endl;
  } else {
    std::printf("%s\n", report.Summary().c_str());
  }
  if (!report.ok() && !args.json) std::cerr << "baton-weights: verify failed\n";
  return report.ok() ? kExitOk : kExitFailed;
}

double MillisSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

// What a restarted controller does with what baton-keeper held for it: the manifest's JSON
// and dups of the arena's memfds, the loading cache gone.
int RunAdopt(Args& args) {
  auto loaded = LoadCache(args);
  if (!loaded.ok()) return Fail(loaded.status(), args.json);
  std::optional<WeightCache> cache(std::move(loaded).value());
  const IntegrityManifest hashes = HashTensors(*cache);
  const std::string text = EncodeWeightManifest(cache->Manifest(1));
  auto fds = cache->arena().DupFds();
  if (!fds.ok()) return Fail(fds.status(), args.json);
  Json j = LoadJson(*cache);
  cache.reset();  // the loading controller is gone; the dup keeps the memory

  const TimePoint start = RealClock::Get().Now();
  auto manifest = DecodeWeightManifest(text, "the manifest");
  if (!manifest.ok()) return Fail(manifest.status(), args.json);
  const double decode_ms = MillisSince(start);
  auto memory = ImportArenaFds(std::move(fds).value());
  if (!memory.ok()) return Fail(memory.status(), args.json);
  const TimePoint adopt_start = RealClock::Get().Now();
  auto adopted = WeightCache::Adopt(std::move(memory).value(), *manifest,
                                    {.model_dir = args.path, .lock = args.options.arena.lock});
  if (!adopted.ok()) return Fail(adopted.status(), args.json);
  const double adopt_ms = MillisSince(adopt_start);
  adopted->arena().AwaitLock();
  const double locked_ms = MillisSince(adopt_start);
  const TimePoint verify_start = RealClock::Get().Now();
  const IntegrityReport report = Verify(*adopted, hashes);
  j["manifest_bytes"] = text.size();
  j["decode_ms"] = decode_ms;
  j["adopt_ms"] = adopt_ms;
  j["adopt_read_bytes"] = adopted->load_stats().bytes;
  j["adopt_locked"] = adopted->arena().locked();
  j["adopt_locked_ms"] = locked_ms;  // from the start of Adopt until the background mlock ended
  j["verify_s"] = MillisSince(verify_start) / 1000.0;
  j["verified"] = report.ok();
  j["adopt_warnings"] = adopted->arena().warnings();
  if (args.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::printf(
        "adopted      %zu tensors, %llu bytes in %.3f ms (manifest %zu bytes, decoded "
        "in %.3f ms); mlock done %.1f ms after: %s\n",
        adopted->tensors().size(), static_cast<unsigned long long>(adopted->arena().size()),
        adopt_ms, text.size(), decode_ms, locked_ms,
        adopted->arena().locked() ? "locked" : "not locked");
    std::printf("verified     %s\n", report.Summary().c_str());
  }
  return report.ok() ? kExitOk : kExitFailed;
}

int Main(int argc, char** argv) {
  if (std::getenv("BATON_LOG_LEVEL") == nullptr) SetLogLevel(LogLevel::kError);
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "help")) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (WantsVersion(argc, argv)) {
    std::cout << VersionLine("baton-weights") << "\n";
    return kExitOk;
  }
  Args args;
  if (std::string problem = ParseArgs(argc, argv, &args); !problem.empty()) {
    bool json = false;
    for (int i = 1; i < argc; ++i) json = json || std::string(argv[i]) == "--json";
    return Usage(problem, json);
  }
  if (args.command == "load") return RunLoad(args);
  if (args.command == "inspect") return RunInspect(args);
  if (args.command == "hash") return RunHash(args);
  if (args.command == "adopt") return RunAdopt(args);
  return RunVerify(args);
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
