// baton-mkmodel: writes a deterministic synthetic Llama-style model (config.json and
// safetensors shards) for tests, demos and load benchmarks.
//
//   baton-mkmodel --out DIR --preset tiny|small|1g|4g [--seed S] [--shards N]
//                 [--dtype f32|f16|bf16] [--threads T] [--sync] [--reuse] [--json]
//
// Exit status: 0 written (or reused), 1 failed, 2 bad usage.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/build_info.h"
#include "standby/mkmodel/model_writer.h"

namespace {

constexpr char kUsage[] =
    "usage: baton-mkmodel --out DIR [--preset tiny|small|1g|4g] [--seed S] [--shards N]\n"
    "                     [--dtype f32|f16|bf16] [--threads T] [--sync] [--reuse] [--json]\n"
    "  --preset   model size (default tiny); small ~256 MiB, 1g/4g ~1/4 GiB in the dtype\n"
    "  --seed     value seed (default 0); the same seed writes byte-identical files\n"
    "  --shards   number of safetensors files (default 1; >1 adds the index json)\n"
    "  --dtype    element type (default f32)\n"
    "  --threads  generator threads (default 2)\n"
    "  --sync     fsync the files before exiting\n"
    "  --reuse    keep DIR's model when it already matches (config, headers, sizes)\n"
    "  --json     print a JSON summary as the last line\n";

struct Flags {
  std::string out;
  std::string preset = "tiny";
  std::string dtype = "f32";
  uint64_t seed = 0;
  int shards = 1;
  int threads = 2;
  bool sync = false;
  bool reuse = false;
  bool json = false;
};

// With --json anywhere on the line, an error is also the last line of stdout, as batonctl's.
bool JsonWanted(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) return true;
  }
  return false;
}

void PrintJsonError(const std::string& error) {
  std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", error}}
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                          .c_str());
}

int Usage(const std::string& error, bool json) {
  if (!error.empty()) std::fprintf(stderr, "baton-mkmodel: %s\n", error.c_str());
  std::fputs(kUsage, stderr);
  if (json) PrintJsonError(error);
  return 2;
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Returns an error message, or empty on success.
std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string_view* v) {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string_view v;
    if (arg == "--sync") {
      f->sync = true;
    } else if (arg == "--reuse") {
      f->reuse = true;
    } else if (arg == "--json") {
      f->json = true;
    } else if (arg == "--out" || arg == "--preset" || arg == "--dtype" || arg == "--seed" ||
               arg == "--shards" || arg == "--threads") {
      // A flag is no value: "--out --json" would write a folder named "--json".
      if (!value(&v) || v.rfind("--", 0) == 0) return std::string(arg) + " needs a value";
      if (arg == "--out") f->out = v;
      if (arg == "--preset") f->preset = v;
      if (arg == "--dtype") f->dtype = v;
      if (arg == "--seed" && !ParseNumber(v, &f->seed))
        return "--seed: not a number: " + std::string(v);
      if (arg == "--shards" && (!ParseNumber(v, &f->shards) || f->shards < 1)) {
        return "--shards: not a positive number: " + std::string(v);
      }
      if (arg == "--threads" &&
          (!ParseNumber(v, &f->threads) || f->threads < 1 || f->threads > 64)) {
        return "--threads: not a number in [1, 64]: " + std::string(v);
      }
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  if (f->out.empty()) return "--out DIR is required";
  return "";
}

void PrintSummary(const baton::ModelSpec& spec, const baton::ModelSummary& s, bool json) {
  std::printf("%s %s: preset %s, %s, %d layers, hidden %d, seed %llu\n",
              s.reused ? "reused" : "wrote", s.dir.c_str(), spec.preset.c_str(),
              std::string(baton::TorchDTypeName(spec.dtype)).c_str(), spec.num_hidden_layers,
              spec.hidden_size, static_cast<unsigned long long>(spec.seed));
  for (const std::string& f : s.files) std::printf("  %s\n", f.c_str());
  const double gbps = s.seconds > 0 ? static_cast<double>(s.file_bytes) / s.seconds / 1e9 : 0;
  std::printf("%zu files, %zu tensors, %llu tensor bytes, %llu file bytes, %.2f s (%.2f GB/s)\n",
              s.files.size(), s.tensor_count, static_cast<unsigned long long>(s.tensor_bytes),
              static_cast<unsigned long long>(s.file_bytes), s.seconds, gbps);
  if (!json) return;
  nlohmann::json j = {{"dir", s.dir},
                      {"preset", spec.preset},
                      {"dtype", baton::TorchDTypeName(spec.dtype)},
                      {"seed", spec.seed},
                      {"layers", spec.num_hidden_layers},
                      {"files", s.files},
                      {"tensors", s.tensor_count},
                      {"tensor_bytes", s.tensor_bytes},
                      {"bytes", s.file_bytes},
                      {"write_s", s.seconds},
                      {"write_gbps", gbps},
                      {"reused", s.reused}};
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (baton::WantsVersion(argc, argv)) {
    std::printf("%s\n", baton::VersionLine("baton-mkmodel").c_str());
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  const bool json = JsonWanted(argc, argv);
  if (std::string error = ParseFlags(argc, argv, &flags); !error.empty()) {
    return Usage(error, json);
  }
  baton::Result<baton::DType> dtype = baton::ParseModelDType(flags.dtype);
  if (!dtype.ok()) return Usage(dtype.status().message(), json);
  baton::Result<baton::ModelSpec> spec = baton::ParsePreset(flags.preset, *dtype);
  if (!spec.ok()) return Usage(spec.status().message(), json);
  spec->seed = flags.seed;
  spec->shards = flags.shards;
  if (baton::Status valid = baton::ValidateSpec(*spec); !valid.ok()) {
    return Usage(valid.message(), json);
  }
  baton::WriteOptions options;
  options.threads = flags.threads;
  options.sync = flags.sync;
  options.reuse = flags.reuse;
  baton::Result<baton::ModelSummary> summary = baton::WriteModel(*spec, flags.out, options);
  if (!summary.ok()) {
    std::fprintf(stderr, "baton-mkmodel: %s\n", summary.status().ToString().c_str());
    if (json) PrintJsonError(summary.status().ToString());
    return 1;
  }
  PrintSummary(*spec, *summary, flags.json);
  return 0;
}
