#include "perf/pair/failover_models.h"

#include <cmath>

#include "standby/mkmodel/model_presets.h"

namespace baton::perf {
namespace {

constexpr uint64_t kLargeBytes = 2ull << 30;
constexpr uint64_t kSeed = 1;
constexpr int kShards = 2;

// The 4g shape in bfloat16 with its layer count sized for kLargeBytes.
ModelSpec LargeSpec() {
  ModelSpec spec = PresetSpec("4g", DType::kBF16);
  spec.preset = "custom";
  spec.num_hidden_layers = 1;
  const uint64_t one = spec.parameter_count();
  spec.num_hidden_layers = 2;
  const uint64_t per_layer = spec.parameter_count() - one;
  const double elements = static_cast<double>(kLargeBytes) / ModelDTypeSize(DType::kBF16);
  const double layers = (elements - static_cast<double>(one - per_layer)) / per_layer;
  spec.num_hidden_layers = std::max(1, static_cast<int>(std::lround(layers)));
  return spec;
}

}  // namespace

Result<ModelSummary> EnsureFailoverModel(std::string_view which, const std::string& dir) {
  ModelSpec spec;
  if (which == "small") {
    BATON_ASSIGN_OR_RETURN(spec, ParsePreset("small", DType::kF32));
  } else if (which == "large") {
    spec = LargeSpec();
    BATON_RETURN_IF_ERROR(ValidateSpec(spec));
  } else {
    return InvalidArgument("unknown failover model '" + std::string(which) +
                           "' (known: small, large)");
  }
  spec.seed = kSeed;
  spec.shards = kShards;
  WriteOptions options;
  options.reuse = true;
  return WriteModel(spec, dir, options);
}

}  // namespace baton::perf
