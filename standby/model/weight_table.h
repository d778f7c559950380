// WeightTable: the model's tensors as the compute core sees them: name -> {dtype, shape,
// pointer to the bytes}. The bytes are used in place; the table owns none of them.
//
// Two producers fill it: FromCache() for a WeightCache loaded in this process, and the
// engine, which adds one entry per row of the controller's tensor table over its read-only
// mapping of the cache arena. Whoever builds the table keeps the memory mapped for as long
// as the table (and any LlamaModel built from it) is used. Thread-compatible; const methods
// may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

class WeightCache;

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t size = 0;  // bytes available at data
};

class WeightTable {
 public:
  // Refuses a duplicate name, a null pointer, a negative dimension, or a byte size that
  // does not hold shape x dtype.
  Status Add(std::string name, TensorView view);
  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  size_t size() const { return tensors_.size(); }

  // Every tensor of `cache`; the cache must outlive the table.
  static Result<WeightTable> FromCache(const WeightCache& cache);

 private:
  std::map<std::string, TensorView, std::less<>> tensors_;
};

}  // namespace baton
