#include "weightcache/weight_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>

#include "tests/weightcache/sharded_model_testutil.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using cachetest::MakeTensor;
using cachetest::TempDir;
using cachetest::TestTensor;
using cachetest::WriteSafetensors;
using cachetest::WriteShardedModel;

void ExpectHolds(const WeightCache& cache, const std::vector<TestTensor>& tensors) {
  ASSERT_EQ(cache.tensors().size(), tensors.size());
  uint64_t bytes = 0;
  for (const TestTensor& t : tensors) {
    const CachedTensor* c = cache.Find(t.name);
    ASSERT_NE(c, nullptr) << t.name;
    EXPECT_EQ(c->shape, t.shape) << t.name;
    EXPECT_EQ(DTypeName(c->dtype), t.dtype) << t.name;
    ASSERT_EQ(c->size, t.bytes.size()) << t.name;
    ASSERT_LE(c->offset + c->size, cache.arena().size()) << t.name;
    EXPECT_EQ(std::memcmp(cache.TensorData(*c), t.bytes.data(), c->size), 0) << t.name;
    bytes += c->size;
  }
  EXPECT_EQ(cache.tensor_bytes(), bytes);
  EXPECT_EQ(cache.Find("no.such.tensor"), nullptr);
  for (size_t i = 1; i < cache.tensors().size(); ++i) {
    EXPECT_LT(cache.tensors()[i - 1].name, cache.tensors()[i].name);
  }
}

class WeightCacheModeTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(WeightCacheModeTest, LoadsAShardedModelByteForByte) {
  TempDir dir;
  const std::vector<TestTensor> tensors = WriteShardedModel(dir.path());
  WeightCacheOptions options;
  options.load.use_uring = std::get<0>(GetParam());
  options.load.direct = std::get<1>(GetParam());
  options.arena.huge_pages = std::get<2>(GetParam());
  options.load.chunk_size = 8192;
  options.load.queue_depth = 4;
  auto cache = WeightCache::Load(dir.path(), options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ExpectHolds(*cache, tensors);
  EXPECT_EQ(cache->dir(), dir.path());
  if (!std::get<2>(GetParam())) {
    EXPECT_FALSE(cache->arena().huge_pages());
  } else if (!cache->arena().huge_pages()) {
    EXPECT_FALSE(cache->arena().warnings().empty());  // none reserved on this machine
  }
  EXPECT_EQ(cache->load_stats().method.rfind(options.load.use_uring ? "io_uring" : "pread", 0), 0u);
  // Every shard's whole file (but the page below its data) was read.
  uint64_t file_bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".safetensors") file_bytes += entry.file_size();
  }
  EXPECT_LE(cache->load_stats().bytes, file_bytes);
  EXPECT_GT(cache->load_stats().bytes, cache->tensor_bytes());
}

INSTANTIATE_TEST_SUITE_P(Modes, WeightCacheModeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

TEST(WeightCacheTest, SharesTheArenaReadOnlyWithAnotherProcess) {
  TempDir dir;
  const std::vector<TestTensor> tensors = WriteShardedModel(dir.path());
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_TRUE(cache->arena().sealed_read_only());
  for (const std::string& w : cache->arena().warnings()) {
    EXPECT_EQ(w.find("seal"), std::string::npos) << w;
  }
  auto fd = cache->arena().memory().Dup();
  ASSERT_TRUE(fd.ok());
  const int raw = fd->get();
  const CachedTensor* t = cache->Find("layers.0.scale");
  ASSERT_NE(t, nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child sees only the fd number and the table entry, as an engine would.
    auto shm = SharedMemory::Import(UniqueFd(::dup(raw)));
    if (!shm.ok()) ::_exit(10);
    auto view = shm->Map(Protection::kReadOnly);
    if (!view.ok()) ::_exit(11);
    if (shm->Map(Protection::kReadWrite).ok()) ::_exit(13);  // sealed read-only
    const std::string& want = tensors[4].bytes;
    ::_exit(std::memcmp(view->data() + t->offset, want.data(), want.size()) == 0 ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(WeightCacheTest, LaysDataOutSoDirectReadsNeedNoCopy) {
  TempDir dir;
  WriteShardedModel(dir.path());
  auto files = ModelFiles::Open(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok());
  for (const SafetensorsIndex& shard : files->shards()) {
    for (const TensorInfo& info : shard.tensors()) {
      const CachedTensor* t = cache->Find(info.name);
      ASSERT_NE(t, nullptr);
      // Same position within its page as in the file.
      EXPECT_EQ(t->offset % 4096, (shard.data_offset() + info.begin) % 4096) << info.name;
    }
  }
}

TEST(WeightCacheTest, LoadsASingleFileModel) {
  TempDir dir;
  std::vector<TestTensor> tensors = {MakeTensor("w", "F32", {3, 1000}, 4, 11),
                                     MakeTensor("b", "I8", {5}, 1, 12)};
  WriteSafetensors(dir.path() + "/model.safetensors", tensors, "z");
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ExpectHolds(*cache, tensors);
}

// Truncated while its chunks are read (the loader sees it end early) or between validation and
// the loader's open (the load comes up short of the validated size): refused either way.
TEST(WeightCacheTest, RefusesAShardTruncatedWhileItLoads) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  WriteSafetensors(path, {MakeTensor("w", "F32", {3, 100000}, 4, 11)}, "z");
  WeightCacheOptions options;
  options.load.chunk_size = 4096;
  options.load.queue_depth = 1;
  options.load.progress = [&, done = false](uint64_t, uint64_t) mutable {
    if (done) return;
    done = true;
    ASSERT_EQ(::truncate(path.c_str(), 8192), 0);
  };
  auto cache = WeightCache::Load(dir.path(), options);
  ASSERT_FALSE(cache.ok()) << "a short shard loaded with zeros for its tail";
  EXPECT_EQ(cache.status().code(), StatusCode::kDataLoss) << cache.status().ToString();
}

TEST(WeightCacheTest, RefusesMissingAndMalformedModels) {
  TempDir dir;
  auto none = WeightCache::Load(dir.path() + "/absent", {});
  EXPECT_FALSE(none.ok());
  std::ofstream(dir.path() + "/model.safetensors", std::ios::binary) << std::string(8, '\xff');
  auto bad = WeightCache::Load(dir.path(), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors"), std::string::npos)
      << bad.status().message();
}

constexpr char kShard2[] = "model-00002-of-00003.safetensors";

// What a controller leaves with baton-keeper: the manifest (through its JSON) and a dup of
// the arena's memfd.
struct Kept {
  WeightManifest manifest;
  SharedMemory memory;
};

Kept Keep(const WeightCache& cache) {
  auto manifest = DecodeWeightManifest(EncodeWeightManifest(cache.Manifest(77)), "kept");
  EXPECT_TRUE(manifest.ok()) << manifest.status().ToString();
  auto fd = cache.arena().memory().Dup();
  EXPECT_TRUE(fd.ok());
  auto memory = SharedMemory::Import(std::move(fd).value());
  EXPECT_TRUE(memory.ok());
  return Kept{std::move(manifest).value(), std::move(memory).value()};
}

// Overwrites `path` in place with garbage and puts its mtime back: size, mtime, inode and
// device are what they were, the bytes are not.
void ScrambleKeepingIdentity(const std::string& path) {
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const std::string garbage(static_cast<size_t>(st.st_size), '\x5a');
  UniqueFd fd(::open(path.c_str(), O_WRONLY));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::pwrite(fd.get(), garbage.data(), garbage.size(), 0),
            static_cast<ssize_t>(garbage.size()));
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::futimens(fd.get(), times), 0);
  std::ifstream in(path, std::ios::binary);
  ASSERT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), garbage);
}

// The names of the files in `dir` that were opened or read while `fn` ran (inotify).
std::vector<std::string> FilesTouchedDuring(const std::string& dir,
                                            const std::function<void()>& fn) {
  UniqueFd in(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  EXPECT_TRUE(in.valid());
  EXPECT_GE(::inotify_add_watch(in.get(), dir.c_str(), IN_OPEN | IN_ACCESS), 0);
  fn();
  std::vector<std::string> names;
  alignas(inotify_event) char buf[4096];
  ssize_t n;
  while ((n = ::read(in.get(), buf, sizeof(buf))) > 0) {
    for (char* p = buf; p < buf + n;
         p += sizeof(inotify_event) + reinterpret_cast<inotify_event*>(p)->len) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      if (e->len > 0) names.push_back(e->name);  // unnamed: the directory itself (readdir)
    }
  }
  return names;
}

class WeightCacheAdoptTest : public ::testing::TestWithParam<bool> {};

TEST_P(WeightCacheAdoptTest, AdoptsTheSameTableAndBytesWithoutReadingAFile) {
  TempDir dir;
  const std::vector<TestTensor> tensors = WriteShardedModel(dir.path());
  WeightCacheOptions options;
  options.arena.huge_pages = GetParam();
  auto load = WeightCache::Load(dir.path(), options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  std::optional<WeightCache> loaded(std::move(load).value());
  const std::vector<CachedTensor> table = loaded->tensors();
  const bool huge = loaded->arena().huge_pages();
  Kept kept = Keep(*loaded);
  loaded.reset();  // the old controller is gone; the dup keeps the memory
  for (const auto& e : fs::directory_iterator(dir.path())) ScrambleKeepingIdentity(e.path());
  ASSERT_FALSE(WeightCache::Load(dir.path(), {}).ok()) << "the files still hold a model";

  std::optional<Result<WeightCache>> result;
  const std::vector<std::string> touched = FilesTouchedDuring(dir.path(), [&] {
    result.emplace(WeightCache::Adopt(std::move(kept.memory), kept.manifest, {dir.path()}));
  });
  EXPECT_TRUE(touched.empty()) << ::testing::PrintToString(touched);
  EXPECT_FALSE(FilesTouchedDuring(dir.path(), [&] { (void)ModelFiles::Open(dir.path()); }).empty())
      << "inotify saw nothing of an open";
  Result<WeightCache>& adopted = *result;
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_EQ(adopted->tensors(), table);
  ExpectHolds(*adopted, tensors);  // the original bytes, not the garbage now in the files
  EXPECT_EQ(adopted->load_stats().bytes, 0u);
  EXPECT_EQ(adopted->load_stats().method, "adopted");
  EXPECT_TRUE(adopted->arena().adopted());
  EXPECT_TRUE(adopted->arena().sealed_read_only());
  EXPECT_EQ(adopted->arena().huge_pages(), huge);
  adopted->arena().AwaitLock();
  const std::vector<std::string> warnings = adopted->arena().warnings();
  EXPECT_TRUE(adopted->arena().locked() ||
              (!warnings.empty() && warnings.back().find("ulimit -l") != std::string::npos));

  // The adopted cache can be kept again, and adopted again.
  Kept again = Keep(*adopted);
  EXPECT_EQ(again.manifest.files, kept.manifest.files);
  auto twice = WeightCache::Adopt(std::move(again.memory), again.manifest, {dir.path(), false});
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  ExpectHolds(*twice, tensors);
}

INSTANTIATE_TEST_SUITE_P(HugePages, WeightCacheAdoptTest, ::testing::Bool());

// Refusals of Adopt over a small normal-page arena, one fresh load each.
class WeightCacheAdoptRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteShardedModel(dir_.path());
    WeightCacheOptions options;
    options.arena.huge_pages = false;
    auto cache = WeightCache::Load(dir_.path(), options);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    kept_ = Keep(*cache);
  }
  void ExpectRefused(const std::string& mention, const std::string& model_dir = "") {
    auto r = WeightCache::Adopt(std::move(kept_.memory), kept_.manifest,
                                {model_dir.empty() ? dir_.path() : model_dir});
    ASSERT_FALSE(r.ok()) << "adopted, wanted a refusal naming " << mention;
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find(mention), std::string::npos) << r.status().message();
  }
  SharedMemory Memfd(size_t size, bool seal) {
    auto shm = SharedMemory::Create({"other", size, false});
    EXPECT_TRUE(shm.ok());
    if (seal) {
      EXPECT_TRUE(shm->Seal(Sealing::kReadOnly).ok());
    }
    return std::move(shm).value();
  }
  TempDir dir_;
  Kept kept_;
};

TEST_F(WeightCacheAdoptRefusalTest, AShardWithANewMtime) {
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir_.path() + "/" + kShard2).c_str(), times, 0), 0);
  ExpectRefused(std::string(kShard2) + " changed since the arena was loaded (mtime_ns ");
}

// check_files = false: a changed directory is no refusal (the controller serves the kept
// weights when changed files do not load), an arena whose load did not finish still is.
TEST_F(WeightCacheAdoptRefusalTest, WithoutTheFileChecksOnlyACompleteManifestIsAdopted) {
  WeightManifest incomplete = kept_.manifest;
  incomplete.complete = false;
  auto refused = WeightCache::Adopt(std::move(kept_.memory), incomplete,
                                    {.model_dir = dir_.path(), .check_files = false});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not complete"), std::string::npos);
}

TEST_F(WeightCacheAdoptRefusalTest, WithoutTheFileChecksAChangedDirectoryIsAdopted) {
  std::ofstream(dir_.path() + "/" + kShard2, std::ios::app) << "more";
  auto adopted = WeightCache::Adopt(std::move(kept_.memory), kept_.manifest,
                                    {.model_dir = dir_.path(), .check_files = false});
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_EQ(adopted->tensors().size(), kept_.manifest.tensors.size());
}

TEST_F(WeightCacheAdoptRefusalTest, ARewrittenShard) {
  std::ofstream(dir_.path() + "/" + kShard2, std::ios::app) << "more";
  ExpectRefused(std::string(kShard2) + " changed since the arena was loaded (size ");
}

TEST_F(WeightCacheAdoptRefusalTest, AnAddedShard) {
  WriteSafetensors(dir_.path() + "/extra.safetensors", {MakeTensor("x", "F32", {2}, 4, 9)}, "");
  ExpectRefused("extra.safetensors was added to " + dir_.path());
}

TEST_F(WeightCacheAdoptRefusalTest, AnotherModelDirectory) {
  TempDir other;
  WriteShardedModel(other.path());
  ExpectRefused("is not the one the arena was loaded from", other.path());
}

TEST_F(WeightCacheAdoptRefusalTest, AMemfdOfAnotherSize) {
  kept_.memory = Memfd(kept_.manifest.arena_size + 4096, true);
  ExpectRefused("the memfd holds " + std::to_string(kept_.manifest.arena_size + 4096) +
                " bytes, the record says " + std::to_string(kept_.manifest.arena_size));
}

TEST_F(WeightCacheAdoptRefusalTest, AnUnsealedMemfdWhereTheManifestSaysSealed) {
  ASSERT_TRUE(kept_.manifest.sealed_read_only);
  kept_.memory = Memfd(kept_.manifest.arena_size, false);
  ExpectRefused("lacks the seals F_SEAL_FUTURE_WRITE, F_SEAL_SHRINK, F_SEAL_GROW");
}

TEST_F(WeightCacheAdoptRefusalTest, AnotherMemfdOfTheSameKind) {
  kept_.memory = Memfd(kept_.manifest.arena_size, true);
  ExpectRefused("the memfd is another object than the recorded one");
}

TEST_F(WeightCacheAdoptRefusalTest, AnIncompleteManifestOrNoModelDirectory) {
  auto none = WeightCache::Adopt(Memfd(4096, true), kept_.manifest, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  kept_.manifest.complete = false;
  ExpectRefused("not complete");
}

TEST(WeightCacheTest, RefusesAShardWhoseMtimeChangesWhileItLoads) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  WriteSafetensors(path, {MakeTensor("w", "F32", {3, 100000}, 4, 11)}, "z");
  WeightCacheOptions options;
  options.load.chunk_size = 4096;
  options.load.queue_depth = 1;
  options.load.progress = [&, done = false](uint64_t, uint64_t) mutable {
    if (std::exchange(done, true)) return;
    const struct timespec times[2] = {{0, UTIME_OMIT}, {1000, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  };
  auto cache = WeightCache::Load(dir.path(), options);
  ASSERT_FALSE(cache.ok()) << "a shard touched during its load was kept";
  EXPECT_EQ(cache.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(cache.status().message().find("model.safetensors changed while the model was loaded "
                                          "(mtime_ns "),
            std::string::npos)
      << cache.status().message();
}

}  // namespace
}  // namespace baton
