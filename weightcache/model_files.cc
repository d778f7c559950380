#include "weightcache/model_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "base/io/unique_fd.h"
#include "weightcache/safetensors/json_events.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kSuffix = ".safetensors";
constexpr uint64_t kMaxIndexSize = 100'000'000;
constexpr int kMaxJsonDepth = 16;

struct ParseStop {
  Status status;
};

std::string JoinPath(const std::string& dir, std::string_view name) {
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += name;
  return path;
}

// True when `path` names something (symlinks followed), false when it does not exist.
Result<bool> Exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoStatus(path + ": stat", errno);
}

Status ReadIndexFile(const std::string& path, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return ErrnoStatus(path + ": open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(path + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxIndexSize) {
    return SafetensorsFileError(path,
                                "index of " + std::to_string(st.st_size) +
                                    " bytes exceeds the limit of " + std::to_string(kMaxIndexSize),
                                "index-json");
  }
  out->assign(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = ::pread(fd.get(), out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(path + ": read", errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return OkStatus();
}

// Parses the index JSON, refusing a key repeated within one object (nlohmann would keep the
// last silently) and nesting deeper than kMaxJsonDepth.
Status ParseIndexJson(const std::string& file, const std::string& text, Json* out) {
  struct OpenObject {
    std::unordered_set<std::string> keys;
    std::string last;
  };
  std::vector<OpenObject> objects;  // by depth
  auto at = [&](size_t d) -> OpenObject& {
    if (objects.size() <= d) objects.resize(d + 1);
    return objects[d];
  };
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      if (depth >= kMaxJsonDepth) {
        throw ParseStop{SafetensorsFileError(file, "JSON is nested too deep", "index-json")};
      }
      if (event == Json::parse_event_t::object_start) at(static_cast<size_t>(depth)) = {};
    } else if (event == Json::parse_event_t::key) {
      // A key is reported at the depth of the object holding it plus one.
      const size_t d = depth > 0 ? static_cast<size_t>(depth - 1) : 0;
      OpenObject& object = at(d);
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!object.keys.insert(key).second) {
        if (d == 1 && objects[0].last == "weight_map") {
          throw ParseStop{
              SafetensorsTensorError(file, key, "mapped twice in weight_map", "duplicate-key")};
        }
        std::string where = d == 0 ? "the index" : "'" + PrintableName(objects[d - 1].last) + "'";
        throw ParseStop{SafetensorsFileError(
            file, "key '" + PrintableName(key) + "' appears twice in " + where, "duplicate-key")};
      }
      object.last = key;
    }
    return true;
  };
  try {
    *out = ParseJsonWithEvents(text, on_event);
  } catch (const ParseStop& stop) {
    return stop.status;
  } catch (const std::exception& e) {
    return SafetensorsFileError(file, "index is not valid JSON: " + PrintableName(e.what(), 300),
                                "index-json");
  }
  return OkStatus();
}

// A shard name is a plain file name inside the model directory.
bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string::npos;
}

// tensor -> shard file name, from the index at `path`.
Status ReadWeightMap(const std::string& path, std::map<std::string, std::string>* weight_map) {
  std::string text;
  BATON_RETURN_IF_ERROR(ReadIndexFile(path, &text));
  Json root;
  BATON_RETURN_IF_ERROR(ParseIndexJson(path, text, &root));
  if (!root.is_object()) {
    return SafetensorsFileError(path, "index is not a JSON object", "index-weight-map");
  }
  auto it = root.find("weight_map");
  if (it == root.end() || !it->is_object()) {
    return SafetensorsFileError(path, "index has no \"weight_map\" object", "index-weight-map");
  }
  auto meta = root.find("metadata");
  if (meta != root.end() && !meta->is_object()) {
    return SafetensorsFileError(path, "\"metadata\" is not an object", "index-weight-map");
  }
  for (const auto& [tensor, file] : it->items()) {
    if (!file.is_string()) {
      return SafetensorsTensorError(path, tensor, "weight_map value is not a file name string",
                                    "index-weight-map");
    }
    const auto& name = file.get_ref<const std::string&>();
    if (!IsPlainName(name)) {
      return SafetensorsTensorError(
          path, tensor,
          "weight_map names '" + PrintableName(name) +
              "', which is not a plain file name inside the model directory",
          "shard-name");
    }
    weight_map->emplace(tensor, name);
  }
  return OkStatus();
}

// Every *.safetensors file of `dir`, sorted by name.
Result<std::vector<std::string>> ListShards(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= kSuffix.size() ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      continue;
    }
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) names.push_back(name);
  }
  if (ec) return Status(StatusCode::kIoError, dir + ": listing: " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

ModelFiles::ModelFiles(const ModelFiles& other)
    : dir_(other.dir_), index_path_(other.index_path_), shards_(other.shards_) {
  Reindex(other);
}

ModelFiles& ModelFiles::operator=(const ModelFiles& other) {
  if (this != &other) {
    dir_ = other.dir_;
    index_path_ = other.index_path_;
    shards_ = other.shards_;
    locations_.clear();
    Reindex(other);
  }
  return *this;
}

void ModelFiles::Reindex(const ModelFiles& other) {
  for (const auto& [name, loc] : other.locations_) {
    const auto offset = loc.tensor - other.shards_[loc.shard].tensors().data();
    locations_.emplace(name, Location{loc.shard, &shards_[loc.shard].tensors()[offset]});
  }
}

Result<ModelFiles> ModelFiles::Open(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(dir + ": stat", errno);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(dir + ": not a directory");
  ModelFiles m;
  m.dir_ = dir;

  BATON_ASSIGN_OR_RETURN(bool single, Exists(JoinPath(dir, kSingleFile)));
  BATON_ASSIGN_OR_RETURN(bool indexed, Exists(JoinPath(dir, kIndexFile)));
  if (indexed && !single) {
    BATON_RETURN_IF_ERROR(m.OpenIndexed(JoinPath(dir, kIndexFile)));
    return m;
  }
  if (single) {
    BATON_RETURN_IF_ERROR(m.AddShard(std::string(kSingleFile)));
  } else {
    BATON_ASSIGN_OR_RETURN(std::vector<std::string> names, ListShards(dir));
    if (names.empty()) {
      return NotFound(dir + ": no model.safetensors, model.safetensors.index.json or " +
                      "*.safetensors file");
    }
    for (const std::string& name : names) BATON_RETURN_IF_ERROR(m.AddShard(name));
  }
  BATON_RETURN_IF_ERROR(m.BuildLocations());
  return m;
}

Status ModelFiles::AddShard(const std::string& name) {
  BATON_ASSIGN_OR_RETURN(SafetensorsIndex index, SafetensorsIndex::ParseFile(JoinPath(dir_, name)));
  shards_.push_back(std::move(index));
  return OkStatus();
}

Status ModelFiles::OpenIndexed(const std::string& index_path) {
  std::map<std::string, std::string> weight_map;
  BATON_RETURN_IF_ERROR(ReadWeightMap(index_path, &weight_map));
  index_path_ = index_path;
  // Each shard file once, in name order, with the first tensor mapped to it for messages.
  std::map<std::string, std::string> first_tensor;
  for (const auto& [tensor, file] : weight_map) first_tensor.emplace(file, tensor);
  for (const auto& [file, tensor] : first_tensor) {
    Status s = AddShard(file);
    if (s.ok()) continue;
    if (s.code() == StatusCode::kInvalidArgument) return s;
    return Status(s.code(), index_path + ": tensor '" + PrintableName(tensor) +
                                "': weight_map names shard '" + PrintableName(file) +
                                "', which cannot be read: " + s.message() + " (rule: shard-file)");
  }
  BATON_RETURN_IF_ERROR(BuildLocations());
  for (const auto& [tensor, file] : weight_map) {
    const Location* loc = Find(tensor);
    if (loc == nullptr) {
      return SafetensorsTensorError(
          index_path, tensor,
          "weight_map names shard '" + PrintableName(file) + "', which does not hold it",
          "tensor-in-named-shard");
    }
    const std::string& holder = shards_[loc->shard].path();
    if (holder != JoinPath(dir_, file)) {
      return SafetensorsTensorError(
          index_path, tensor,
          "weight_map names shard '" + PrintableName(file) + "' but the tensor is in " + holder,
          "tensor-in-named-shard");
    }
  }
  for (const SafetensorsIndex& shard : shards_) {
    for (const TensorInfo& t : shard.tensors()) {
      if (weight_map.count(t.name) == 0) {
        return SafetensorsTensorError(index_path, t.name,
                                      "is in " + shard.path() + " but weight_map does not list it",
                                      "tensor-unmapped");
      }
    }
  }
  return OkStatus();
}

Status ModelFiles::BuildLocations() {
  locations_.clear();
  for (size_t i = 0; i < shards_.size(); ++i) {
    for (const TensorInfo& t : shards_[i].tensors()) {
      auto [it, inserted] = locations_.emplace(t.name, Location{i, &t});
      if (!inserted) {
        return SafetensorsTensorError(shards_[i].path(), t.name,
                                      "also in " + shards_[it->second.shard].path(),
                                      "tensor-in-two-shards");
      }
    }
  }
  return OkStatus();
}

uint64_t ModelFiles::total_file_bytes() const {
  uint64_t total = 0;
  for (const SafetensorsIndex& s : shards_) total += s.file_size();
  return total;
}

uint64_t ModelFiles::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const SafetensorsIndex& s : shards_)
    for (const TensorInfo& t : s.tensors()) total += t.size();
  return total;
}

const ModelFiles::Location* ModelFiles::Find(const std::string& name) const {
  auto it = locations_.find(name);
  return it == locations_.end() ? nullptr : &it->second;
}

}  // namespace baton
