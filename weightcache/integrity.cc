#include "weightcache/integrity.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/io/unique_fd.h"
#include "weightcache/weight_manifest.h"

namespace baton {
namespace {

std::string ManifestPath(const std::string& dir) { return dir + "/" + kIntegrityManifestName; }

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

Status WriteAll(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("write " + path, errno);
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

std::string IntegrityReport::Summary() const {
  if (ok()) return "ok: " + std::to_string(checked) + " tensors match";
  std::string out;
  auto add = [&out](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out += (out.empty() ? "" : "; ") + std::to_string(names.size()) + " " + what + ": " +
           JoinNames(names);
  };
  add("mismatched", mismatched);
  add("missing from the cache", missing);
  add("not in the manifest", unexpected);
  return out;
}

std::string HashToHex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

Result<uint64_t> HexToHash(std::string_view hex) {
  if (hex.size() != 16)
    return InvalidArgument("hash '" + std::string(hex) + "' is not 16 hex digits");
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return InvalidArgument("hash '" + std::string(hex) + "' is not 16 hex digits");
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

IntegrityManifest HashTensors(const WeightCache& cache, unsigned threads) {
  const auto& tensors = cache.tensors();
  std::vector<uint64_t> hashes(tensors.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < tensors.size(); i = next++) {
      hashes[i] = XXH3_64bits(cache.TensorData(tensors[i]), tensors[i].size);
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(1, tensors.size())));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  IntegrityManifest m;
  for (size_t i = 0; i < tensors.size(); ++i) m.tensors[tensors[i].name] = hashes[i];
  return m;
}

std::string ManifestToJson(const IntegrityManifest& manifest) {
  nlohmann::ordered_json j;
  j["algorithm"] = manifest.algorithm;
  j["tensors"] = nlohmann::ordered_json::object();
  for (const auto& [name, hash] : manifest.tensors) j["tensors"][name] = HashToHex(hash);
  return j.dump(1) + "\n";
}

Result<IntegrityManifest> ManifestFromJson(std::string_view name, std::string_view json) {
  const std::string where(name);
  BATON_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJsonStrict(std::string(json), where));
  if (!j.is_object()) return InvalidArgument(where + ": not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "algorithm" && key != "tensors") {
      return InvalidArgument(where + ": field '" + key +
                             "' is not a field of the integrity manifest (it has \"algorithm\" "
                             "and \"tensors\")");
    }
  }
  auto alg = j.find("algorithm");
  if (alg == j.end() || !alg->is_string()) {
    return InvalidArgument(where + ": \"algorithm\" missing or not a string");
  }
  if (alg->get<std::string>() != kIntegrityAlgorithm) {
    return InvalidArgument(where + ": algorithm '" + alg->get<std::string>() +
                           "' is not supported (want " + kIntegrityAlgorithm + ")");
  }
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_object()) {
    return InvalidArgument(where + ": \"tensors\" missing or not an object");
  }
  IntegrityManifest m;
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    if (!it->is_string())
      return InvalidArgument(where + ": tensor '" + it.key() + "': hash is not a string");
    auto hash = HexToHash(it->get<std::string>());
    if (!hash.ok()) return hash.status().WithContext(where + ": tensor '" + it.key() + "'");
    m.tensors[it.key()] = *hash;
  }
  return m;
}

Status WriteManifest(const std::string& dir, const IntegrityManifest& manifest) {
  const std::string path = ManifestPath(dir);
  const std::string tmp = path + ".tmp";
  Status written = [&]() -> Status {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) return ErrnoStatus("create " + tmp, errno);
    BATON_RETURN_IF_ERROR(WriteAll(fd.get(), ManifestToJson(manifest), tmp));
    if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + tmp, errno);
    fd.Reset();
    if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename to " + path, errno);
    return OkStatus();
  }();
  if (!written.ok()) {
    ::unlink(tmp.c_str());  // on every failure: nothing half-done is left beside the model
    return written;
  }
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd) ::fsync(dfd.get());
  return OkStatus();
}

Result<IntegrityManifest> ReadManifest(const std::string& dir) {
  const std::string path = ManifestPath(dir);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFound(path + " does not exist (create it with `baton-weights hash " + dir + "`)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ManifestFromJson(path, ss.str());
}

IntegrityReport CompareManifests(const IntegrityManifest& expected,
                                 const IntegrityManifest& actual) {
  IntegrityReport r;
  for (const auto& [name, hash] : expected.tensors) {
    auto it = actual.tensors.find(name);
    if (it == actual.tensors.end()) {
      r.missing.push_back(name);
      continue;
    }
    ++r.checked;
    if (it->second != hash) r.mismatched.push_back(name);
  }
  for (const auto& [name, hash] : actual.tensors) {
    if (expected.tensors.count(name) == 0) r.unexpected.push_back(name);
  }
  return r;
}

IntegrityReport Verify(const WeightCache& cache, const IntegrityManifest& expected,
                       unsigned threads) {
  return CompareManifests(expected, HashTensors(cache, threads));
}

}  // namespace baton
