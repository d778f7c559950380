#include "standby/model/weight_table.h"

#include "weightcache/weight_cache.h"

namespace baton {

Status WeightTable::Add(std::string name, TensorView view) {
  if (view.data == nullptr) return InvalidArgument("tensor '" + name + "': null data pointer");
  if (!IsValidDType(static_cast<uint8_t>(view.dtype))) {
    return InvalidArgument("tensor '" + name + "': unknown dtype");
  }
  unsigned __int128 bytes = DTypeSize(view.dtype);
  for (int64_t d : view.shape) {
    if (d < 0) return InvalidArgument("tensor '" + name + "': negative dimension");
    bytes *= static_cast<uint64_t>(d);
    if (bytes > view.size) break;
  }
  if (bytes > view.size) {
    return InvalidArgument("tensor '" + name + "': " + std::to_string(view.size) +
                           " bytes do not hold its shape in " + std::string(DTypeName(view.dtype)));
  }
  auto [it, inserted] = tensors_.emplace(std::move(name), std::move(view));
  if (!inserted) return InvalidArgument("tensor '" + it->first + "' added twice");
  return OkStatus();
}

const TensorView* WeightTable::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<WeightTable> WeightTable::FromCache(const WeightCache& cache) {
  WeightTable table;
  for (const CachedTensor& t : cache.tensors()) {
    BATON_RETURN_IF_ERROR(table.Add(t.name, {t.dtype, t.shape, cache.TensorData(t), t.size}));
  }
  return table;
}

}  // namespace baton
