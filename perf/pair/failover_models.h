// The two generated models of perf/failover: "small" is baton-mkmodel's small preset
// (float32, ~256 MiB); "large" is the 4g preset's shape (hidden 2048, 32 heads, 4 KV heads)
// in bfloat16 with as many layers as make ~2 GiB. Both: seed 1, two shards. Written once
// and reused while the directory matches. Thread: the caller's.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "standby/mkmodel/model_writer.h"

namespace baton::perf {

// Writes model `which` ("small" or "large") into `dir`, or keeps it when it already matches.
Result<ModelSummary> EnsureFailoverModel(std::string_view which, const std::string& dir);

}  // namespace baton::perf
