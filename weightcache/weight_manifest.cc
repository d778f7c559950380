#include "weightcache/weight_manifest.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/text/json_depth.h"
#include "weightcache/safetensors/json_events.h"
#include "weightcache/safetensors/safetensors_index.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

std::string GenerationHex(uint64_t generation) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, generation);
  return hex;
}

OrderedJson EncodeFiles(const std::vector<FileIdentity>& files) {
  OrderedJson out = OrderedJson::array();
  for (const FileIdentity& f : files) {
    out.push_back({{"name", f.name},
                   {"size", f.size},
                   {"mtime_ns", f.mtime_ns},
                   {"inode", f.inode},
                   {"device", f.device}});
  }
  return out;
}

OrderedJson EncodeTensors(const std::vector<CachedTensor>& tensors) {
  OrderedJson out = OrderedJson::array();
  for (const CachedTensor& t : tensors) {
    out.push_back({{"name", t.name},
                   {"dtype", std::string(DTypeName(t.dtype))},
                   {"shape", t.shape},
                   {"offset", t.offset},
                   {"size", t.size}});
  }
  return out;
}

// One JSON object being decoded; `path` names it in refusals ("", "arena", "tensors[3]").
class Fields {
 public:
  Fields(const Json& j, std::string path, const std::string& where)
      : j_(j), path_(std::move(path)), where_(where) {}

  std::string Name(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  Status Error(std::string_view key, const std::string& what) const {
    return InvalidArgument(where_ + ": field '" + Name(key) + "' " + what);
  }
  // The object has no key outside `known`.
  Status Known(std::initializer_list<std::string_view> known) const {
    for (const auto& [key, value] : j_.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return Error(PrintableName(key),
                     "is not a field of format " + std::to_string(WeightManifest::kFormat));
      }
    }
    return OkStatus();
  }
  bool Has(std::string_view key) const { return j_.find(key) != j_.end(); }
  Result<const Json*> Find(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Error(key, "is missing");
    return &*it;
  }
  Result<Fields> Object(std::string_view key) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_object()) return Error(key, "is not an object");
    return Fields(*v, Name(key), where_);
  }
  // Element `i` of the array `array`, found under `key`, as an object.
  Result<Fields> Item(std::string_view key, const Json& array, size_t i) const {
    const std::string name = std::string(key) + "[" + std::to_string(i) + "]";
    if (!array[i].is_object()) return Error(name, "is not an object");
    return Fields(array[i], Name(name), where_);
  }
  Result<const Json*> Array(std::string_view key) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_array()) return Error(key, "is not an array");
    return v;
  }
  Status Get(std::string_view key, uint64_t* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_number_unsigned()) return Error(key, "is not an integer in [0, 2^64)");
    *out = v->get<uint64_t>();
    return OkStatus();
  }
  Status Get(std::string_view key, int64_t* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    const bool fits = v->is_number_integer() &&
                      (!v->is_number_unsigned() ||
                       v->get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()});
    if (!fits) return Error(key, "is not a 64-bit signed integer");
    *out = v->get<int64_t>();
    return OkStatus();
  }
  Status Get(std::string_view key, int* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_number_unsigned() || v->get<uint64_t>() > uint64_t{INT32_MAX}) {
      return Error(key, "is not an integer in [0, 2^31)");
    }
    *out = static_cast<int>(v->get<uint64_t>());
    return OkStatus();
  }
  Status Get(std::string_view key, bool* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_boolean()) return Error(key, "is not true or false");
    *out = v->get<bool>();
    return OkStatus();
  }
  Status Get(std::string_view key, double* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0) {
      return Error(key, "is not a finite number >= 0");
    }
    *out = v->get<double>();
    return OkStatus();
  }
  Status Get(std::string_view key, std::string* out) const {
    BATON_ASSIGN_OR_RETURN(const Json* v, Find(key));
    if (!v->is_string()) return Error(key, "is not a string");
    *out = v->get<std::string>();
    return OkStatus();
  }

 private:
  const Json& j_;
  std::string path_;
  const std::string& where_;
};

Status DecodeGeneration(const Fields& top, uint64_t* out) {
  std::string hex;
  BATON_RETURN_IF_ERROR(top.Get("generation", &hex));
  const char* end = hex.data() + hex.size();
  auto [ptr, ec] = std::from_chars(hex.data(), end, *out, 16);
  if (hex.size() != 16 || ec != std::errc() || ptr != end) {
    return top.Error("generation", "is not 16 hex digits");
  }
  return OkStatus();
}

// A list of distinct plain file names, sorted.
Status CheckNames(const Fields& top, std::string_view key, std::vector<std::string> names) {
  for (const std::string& n : names) {
    if (!IsPlainFileName(n)) {
      return top.Error(key, "names '" + PrintableName(n) + "', not a plain file name");
    }
  }
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup != names.end()) return top.Error(key, "names '" + PrintableName(*dup) + "' twice");
  return OkStatus();
}

Status DecodeFiles(const Fields& top, WeightManifest* m) {
  BATON_ASSIGN_OR_RETURN(const Json* files, top.Array("files"));
  if (files->empty()) return top.Error("files", "is empty");
  std::vector<std::string> names;
  for (size_t i = 0; i < files->size(); ++i) {
    BATON_ASSIGN_OR_RETURN(const Fields f, top.Item("files", *files, i));
    FileIdentity id;
    BATON_RETURN_IF_ERROR(f.Known({"name", "size", "mtime_ns", "inode", "device"}));
    BATON_RETURN_IF_ERROR(f.Get("name", &id.name));
    BATON_RETURN_IF_ERROR(f.Get("size", &id.size));
    BATON_RETURN_IF_ERROR(f.Get("mtime_ns", &id.mtime_ns));
    BATON_RETURN_IF_ERROR(f.Get("inode", &id.inode));
    BATON_RETURN_IF_ERROR(f.Get("device", &id.device));
    names.push_back(id.name);
    m->files.push_back(std::move(id));
  }
  BATON_RETURN_IF_ERROR(CheckNames(top, "files", names));
  BATON_ASSIGN_OR_RETURN(const Json* entries, top.Array("dir_entries"));
  for (size_t i = 0; i < entries->size(); ++i) {
    if (!(*entries)[i].is_string()) {
      return top.Error("dir_entries[" + std::to_string(i) + "]", "is not a string");
    }
    m->dir_entries.push_back((*entries)[i].get<std::string>());
  }
  BATON_RETURN_IF_ERROR(CheckNames(top, "dir_entries", m->dir_entries));
  std::sort(m->dir_entries.begin(), m->dir_entries.end());
  return OkStatus();
}

// The split of a partial arena; a manifest without one describes an arena of one memfd.
Status DecodeParts(const Fields& a, WeightManifest* m) {
  if (!a.Has("first_size")) return OkStatus();
  BATON_RETURN_IF_ERROR(a.Get("first_size", &m->arena_first_size));
  if (m->arena_first_size == 0) return OkStatus();
  if (m->arena_first_size >= m->arena_size || m->arena_first_size % (2u << 20) != 0) {
    return a.Error("first_size", "is not a multiple of 2 MiB below the arena's size");
  }
  BATON_RETURN_IF_ERROR(a.Get("second_inode", &m->arena_second_inode));
  return a.Get("second_device", &m->arena_second_device);
}

Status DecodeArena(const Fields& top, WeightManifest* m) {
  BATON_ASSIGN_OR_RETURN(Fields a, top.Object("arena"));
  BATON_RETURN_IF_ERROR(
      a.Known({"size", "inode", "device", "huge_pages", "first_size", "second_inode",
               "second_device", "numa_node", "numa_bound", "numa_source", "sealed_read_only"}));
  BATON_RETURN_IF_ERROR(a.Get("size", &m->arena_size));
  if (m->arena_size == 0) return a.Error("size", "is 0");
  BATON_RETURN_IF_ERROR(DecodeParts(a, m));
  BATON_RETURN_IF_ERROR(a.Get("inode", &m->arena_inode));
  BATON_RETURN_IF_ERROR(a.Get("device", &m->arena_device));
  BATON_RETURN_IF_ERROR(a.Get("huge_pages", &m->huge_pages));
  BATON_RETURN_IF_ERROR(a.Get("numa_node", &m->numa_node));
  BATON_RETURN_IF_ERROR(a.Get("numa_bound", &m->numa_bound));
  BATON_RETURN_IF_ERROR(a.Get("numa_source", &m->numa_source));
  return a.Get("sealed_read_only", &m->sealed_read_only);
}

Status DecodeLoad(const Fields& top, WeightManifest* m) {
  BATON_ASSIGN_OR_RETURN(Fields l, top.Object("load"));
  BATON_RETURN_IF_ERROR(l.Known({"method", "fallback_reason", "bytes", "seconds", "gbps"}));
  BATON_RETURN_IF_ERROR(l.Get("method", &m->load.method));
  BATON_RETURN_IF_ERROR(l.Get("fallback_reason", &m->load.fallback_reason));
  BATON_RETURN_IF_ERROR(l.Get("bytes", &m->load.bytes));
  BATON_RETURN_IF_ERROR(l.Get("seconds", &m->load.seconds));
  return l.Get("gbps", &m->load.gbps);
}

// One tensor entry; its bytes must lie inside an arena of `arena_size` bytes.
Status DecodeTensor(const Fields& f, uint64_t arena_size, CachedTensor* t) {
  BATON_RETURN_IF_ERROR(f.Known({"name", "dtype", "shape", "offset", "size"}));
  BATON_RETURN_IF_ERROR(f.Get("name", &t->name));
  if (t->name.empty()) return f.Error("name", "is empty");
  std::string dtype;
  BATON_RETURN_IF_ERROR(f.Get("dtype", &dtype));
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed)
    return f.Error("dtype", "is '" + PrintableName(dtype) + "', not a safetensors dtype");
  t->dtype = *parsed;
  BATON_ASSIGN_OR_RETURN(const Json* shape, f.Array("shape"));
  uint64_t bytes = DTypeSize(t->dtype);
  for (const Json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return f.Error("shape", "holds something other than integers in [0, 2^63)");
    }
    t->shape.push_back(d.get<int64_t>());
    if (__builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes)) {
      return f.Error("shape", "holds more bytes than 64 bits count");
    }
  }
  BATON_RETURN_IF_ERROR(f.Get("offset", &t->offset));
  BATON_RETURN_IF_ERROR(f.Get("size", &t->size));
  if (t->size != bytes) {
    return f.Error("size", "is " + std::to_string(t->size) + " but the shape and dtype make " +
                               std::to_string(bytes));
  }
  if (t->offset > arena_size || t->size > arena_size - t->offset) {
    return f.Error("offset",
                   "puts the tensor outside the arena of " + std::to_string(arena_size) + " bytes");
  }
  return OkStatus();
}

Status DecodeTensors(const Fields& top, WeightManifest* m) {
  BATON_ASSIGN_OR_RETURN(const Json* tensors, top.Array("tensors"));
  m->tensors.reserve(tensors->size());
  for (size_t i = 0; i < tensors->size(); ++i) {
    BATON_ASSIGN_OR_RETURN(const Fields f, top.Item("tensors", *tensors, i));
    CachedTensor t;
    BATON_RETURN_IF_ERROR(DecodeTensor(f, m->arena_size, &t));
    m->tensors.push_back(std::move(t));
  }
  auto by_name = [](const CachedTensor& a, const CachedTensor& b) { return a.name < b.name; };
  std::sort(m->tensors.begin(), m->tensors.end(), by_name);
  auto dup = std::adjacent_find(
      m->tensors.begin(), m->tensors.end(),
      [](const CachedTensor& a, const CachedTensor& b) { return a.name == b.name; });
  if (dup != m->tensors.end()) {
    return top.Error("tensors", "names tensor '" + PrintableName(dup->name) + "' twice");
  }
  return OkStatus();
}

}  // namespace

Result<nlohmann::json> ParseJsonStrict(const std::string& text, const std::string& where) {
  struct Stop {
    std::string key;
  };
  std::vector<std::unordered_set<std::string>> keys;  // by depth of the holding object
  std::string last_key;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    const auto d = static_cast<size_t>(std::max(depth, 0));
    if (event == Json::parse_event_t::object_start) {
      if (keys.size() <= d) keys.resize(d + 1);
      keys[d].clear();
    } else if (event == Json::parse_event_t::key && d > 0 && d - 1 < keys.size()) {
      last_key = parsed.get<std::string>();
      if (!keys[d - 1].insert(last_key).second) throw Stop{last_key};
    }
    return true;
  };
  try {
    return ParseJsonWithEvents(text, on_event);
  } catch (const Stop& stop) {
    return InvalidArgument(where + ": field '" + PrintableName(stop.key) +
                           "' appears twice in one object");
  } catch (const std::exception& e) {
    return InvalidArgument(
        where + ": not valid JSON" +
        (last_key.empty() ? "" : " (after field '" + PrintableName(last_key) + "')") + ": " +
        PrintableName(e.what(), 300));
  }
}

std::string EncodeWeightManifest(const WeightManifest& m) {
  OrderedJson j;
  j["format"] = m.format;
  j["generation"] = GenerationHex(m.generation);
  j["complete"] = m.complete;
  j["model_dir"] = m.model_dir;
  j["canonical_model_dir"] = m.canonical_model_dir;
  j["files"] = EncodeFiles(m.files);
  j["dir_entries"] = m.dir_entries;
  j["arena"] = {{"size", m.arena_size},         {"inode", m.arena_inode},
                {"device", m.arena_device},     {"huge_pages", m.huge_pages},

                {"numa_node", m.numa_node},     {"numa_bound", m.numa_bound},
                {"numa_source", m.numa_source}, {"sealed_read_only", m.sealed_read_only}};
  if (m.arena_first_size != 0) {
    j["arena"]["first_size"] = m.arena_first_size;
    j["arena"]["second_inode"] = m.arena_second_inode;
    j["arena"]["second_device"] = m.arena_second_device;
  }
  j["load"] = {{"method", m.load.method},
               {"fallback_reason", m.load.fallback_reason},
               {"bytes", m.load.bytes},
               {"seconds", m.load.seconds},
               {"gbps", m.load.gbps}};
  j["tensors"] = EncodeTensors(m.tensors);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<WeightManifest> DecodeWeightManifest(const std::string& text, const std::string& where) {
  if (text.size() > kMaxWeightManifestBytes) {
    return InvalidArgument(where + ": " + std::to_string(text.size()) +
                           " bytes, more than a manifest may hold (" +
                           std::to_string(kMaxWeightManifestBytes) + ")");
  }
  if (JsonNestingDepth(text) > kMaxJsonDepth) {
    return InvalidArgument(where + ": nested deeper than " + std::to_string(kMaxJsonDepth));
  }
  BATON_ASSIGN_OR_RETURN(const Json root, ParseJsonStrict(text, where));
  if (!root.is_object()) return InvalidArgument(where + ": not a JSON object");
  const Fields top(root, "", where);
  WeightManifest m;
  BATON_RETURN_IF_ERROR(top.Get("format", &m.format));
  if (m.format != WeightManifest::kFormat) {
    return top.Error("format", "is " + std::to_string(m.format) + ", this build reads " +
                                   std::to_string(WeightManifest::kFormat));
  }
  BATON_RETURN_IF_ERROR(
      top.Known({"format", "generation", "complete", "model_dir", "canonical_model_dir", "files",
                 "dir_entries", "arena", "load", "tensors"}));
  BATON_RETURN_IF_ERROR(DecodeGeneration(top, &m.generation));
  BATON_RETURN_IF_ERROR(top.Get("complete", &m.complete));
  BATON_RETURN_IF_ERROR(top.Get("model_dir", &m.model_dir));
  if (m.model_dir.empty()) return top.Error("model_dir", "is empty");
  BATON_RETURN_IF_ERROR(top.Get("canonical_model_dir", &m.canonical_model_dir));
  if (m.canonical_model_dir.empty() || m.canonical_model_dir[0] != '/') {
    return top.Error("canonical_model_dir", "is not an absolute path");
  }
  BATON_RETURN_IF_ERROR(DecodeFiles(top, &m));
  BATON_RETURN_IF_ERROR(DecodeArena(top, &m));
  BATON_RETURN_IF_ERROR(DecodeLoad(top, &m));
  BATON_RETURN_IF_ERROR(DecodeTensors(top, &m));
  return m;
}

Status CheckManifestMatches(const WeightManifest& m, const std::string& model_dir) {
  if (!m.complete) {
    return FailedPrecondition("the arena's manifest is not complete: its load did not finish");
  }
  if (m.files.empty()) return FailedPrecondition("the arena's manifest lists no model file");
  Result<std::string> canonical = CanonicalPath(model_dir);
  if (!canonical.ok()) return FailedPrecondition("model directory " + canonical.status().message());
  if (*canonical != m.canonical_model_dir) {
    return FailedPrecondition("the model directory " + model_dir + " (" + *canonical +
                              ") is not the one the arena was loaded from (" +
                              m.canonical_model_dir + ")");
  }
  constexpr std::string_view kWhen = "since the arena was loaded";
  if (std::string why = FirstChangedFile(*canonical, m.files, kWhen); !why.empty()) {
    return FailedPrecondition(why);
  }
  Result<std::vector<std::string>> entries = ListModelEntries(*canonical);
  if (!entries.ok()) return FailedPrecondition(entries.status().message());
  if (std::string why = FirstChangedEntry(m.dir_entries, *entries, model_dir, kWhen);
      !why.empty()) {
    return FailedPrecondition(why);
  }
  return OkStatus();
}

}  // namespace baton
