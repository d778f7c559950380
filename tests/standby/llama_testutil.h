// Test helpers for the compute core: a synthetic Llama model held in memory (values from
// baton-mkmodel's generator, stored in F32, F16 or BF16, optionally at odd addresses) with
// its WeightTable, and the fp32 values each stored weight stands for.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "standby/kernels/half.h"
#include "standby/mkmodel/model_layout.h"
#include "standby/mkmodel/model_presets.h"
#include "standby/model/llama_config.h"
#include "standby/model/weight_table.h"

namespace baton {

struct TestModel {
  LlamaConfig config;
  WeightTable table;
  std::map<std::string, std::vector<float>> values;  // what each stored tensor holds, as floats
  std::vector<std::pair<std::string, TensorView>> views;  // what `table` holds, in order
  std::vector<std::unique_ptr<std::vector<uint8_t>>> storage;

  const std::vector<float>& at(const std::string& name) const { return values.at(name); }
};

// `misalign` shifts every tensor's bytes by one byte off their natural alignment.
inline std::unique_ptr<TestModel> MakeTestModel(const ModelSpec& spec, bool misalign = false) {
  auto model = std::make_unique<TestModel>();
  Result<LlamaConfig> config = ParseLlamaConfig(ConfigJson(spec));
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  model->config = *config;
  Result<ModelLayout> layout = PlanModel(spec);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  for (const PlannedTensor& t : layout->tensors) {
    std::vector<float> f(t.element_count);
    GenerateTensorValues(t, 0, f.size(), f.data());
    const size_t elem = ModelDTypeSize(spec.dtype);
    const size_t offset = misalign ? 1 : 0;
    auto bytes = std::make_unique<std::vector<uint8_t>>(offset + f.size() * elem);
    uint8_t* dst = bytes->data() + offset;
    if (spec.dtype == DType::kF32) {
      std::memcpy(dst, f.data(), f.size() * 4);
    } else {
      std::vector<uint16_t> half(f.size());
      if (spec.dtype == DType::kF16) {
        FloatsToHalf(f.data(), half.data(), f.size());
        HalfsToFloat(half.data(), f.data(), f.size());
      } else {
        FloatsToBFloat16(f.data(), half.data(), f.size());
        BFloat16sToFloat(half.data(), f.data(), f.size());
      }
      std::memcpy(dst, half.data(), half.size() * 2);
    }
    const TensorView view{spec.dtype, t.shape, dst, f.size() * elem};
    model->views.emplace_back(t.name, view);
    Status s = model->table.Add(t.name, view);
    EXPECT_TRUE(s.ok()) << s.ToString();
    model->values[t.name] = std::move(f);
    model->storage.push_back(std::move(bytes));
  }
  return model;
}

inline ModelSpec TinySpec(DType dtype = DType::kF32) {
  ModelSpec spec = PresetSpec("tiny", dtype);
  spec.seed = 7;
  return spec;
}

}  // namespace baton
