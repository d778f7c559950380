#include "weightcache/io/uring_loader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

uint64_t AlignUp(uint64_t v) { return (v + 4095) / 4096 * 4096; }

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "baton-loader-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An anonymous, page-aligned region filled with `fill`.
Mapping MakeRegion(size_t size, uint8_t fill) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  std::memset(p, fill, size);
  return Mapping(p, size);
}

bool DirectIoSupported(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// (use_uring, direct)
class UringLoaderModeTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  LoadOptions Options() const {
    LoadOptions o;
    o.use_uring = std::get<0>(GetParam());
    o.direct = std::get<1>(GetParam());
    o.clock = &clock_;
    return o;
  }
  std::string ExpectedMethod(const std::string& any_file) const {
    const bool direct = std::get<1>(GetParam()) && DirectIoSupported(any_file);
    return std::string(std::get<0>(GetParam()) ? "io_uring" : "pread") +
           (direct ? "+O_DIRECT" : "");
  }
  FakeClock clock_;
  TempDir dir_;
};

TEST_P(UringLoaderModeTest, OddSizedFilesMatchTheirBytesAndZeroPastEof) {
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, (1 << 20) + 123, (3 << 20) + 7};
  std::vector<std::string> contents;
  std::vector<ReadJob> jobs;
  uint64_t region_size = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    contents.push_back(RandomBytes(sizes[i], static_cast<uint32_t>(i)));
    // Ask for 8 KiB more than the file holds: those bytes must come back zero.
    jobs.push_back({dir_.Write("f" + std::to_string(i), contents[i]), 0, sizes[i] + 8192, nullptr});
    region_size += AlignUp(sizes[i] + 8192);
  }
  Mapping region = MakeRegion(region_size, 0xAA);
  uint64_t at = 0;
  for (ReadJob& job : jobs) {
    job.dest = region.data() + at;
    at += AlignUp(job.length);
  }
  uint64_t last_done = 0;
  uint64_t last_total = 0;
  LoadOptions options = Options();
  options.chunk_size = 64 << 10;
  options.queue_depth = 5;
  options.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
  };
  auto stats = UringLoader(options).Load(jobs, region.data(), region.size());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    total += sizes[i];
    ASSERT_EQ(std::memcmp(jobs[i].dest, contents[i].data(), sizes[i]), 0) << "file " << i;
    for (uint64_t b = sizes[i]; b < jobs[i].length; ++b) {
      ASSERT_EQ(jobs[i].dest[b], 0) << "file " << i << " byte " << b;
    }
  }
  EXPECT_EQ(stats->bytes, total);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(last_total, total);
  EXPECT_EQ(stats->method, ExpectedMethod(jobs[0].path));
  EXPECT_EQ(stats->seconds, 0.0);  // the fake clock did not move
}

TEST_P(UringLoaderModeTest, ReadsFromAPageOffsetAndStopsAtAnUnalignedLength) {
  const std::string bytes = RandomBytes(5 * 4096 + 300, 7);
  const std::string path = dir_.Write("partial", bytes);
  Mapping region = MakeRegion(8 * 4096, 0xAA);
  // From file offset 4096, 2 pages and 100 bytes: the last partial block is not at EOF.
  const uint64_t length = 2 * 4096 + 100;
  std::vector<ReadJob> jobs = {{path, 4096, length, region.data() + 4096}};
  auto stats = UringLoader(Options()).Load(jobs, region.data(), region.size());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->bytes, length);
  EXPECT_EQ(std::memcmp(region.data() + 4096, bytes.data() + 4096, length), 0);
  // Nothing outside the job was written.
  for (uint64_t b = 0; b < 4096; ++b) ASSERT_EQ(region.data()[b], 0xAA);
  for (uint64_t b = 4096 + length; b < region.size(); ++b) ASSERT_EQ(region.data()[b], 0xAA);
}

TEST_P(UringLoaderModeTest, ManySmallFilesInFlightTogether) {
  std::mt19937 rng(99);
  std::vector<std::string> contents;
  std::vector<ReadJob> jobs;
  uint64_t region_size = 0;
  for (int i = 0; i < 150; ++i) {
    contents.push_back(RandomBytes(rng() % 20000, static_cast<uint32_t>(100 + i)));
    jobs.push_back(
        {dir_.Write("s" + std::to_string(i), contents.back()), 0, contents.back().size(), nullptr});
    region_size += AlignUp(contents.back().size()) + 4096;
  }
  Mapping region = MakeRegion(region_size, 0xAA);
  uint64_t at = 0;
  for (ReadJob& job : jobs) {
    job.dest = region.data() + at;
    at += AlignUp(job.length) + 4096;
  }
  LoadOptions options = Options();
  options.chunk_size = 8192;
  options.queue_depth = 16;
  options.files_in_flight = 8;
  auto stats = UringLoader(options).Load(jobs, region.data(), region.size());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(std::memcmp(jobs[i].dest, contents[i].data(), contents[i].size()), 0) << i;
  }
}

TEST_P(UringLoaderModeTest, RequestsNeverStraddleARegisteredBuffer) {
  // Registered buffers of 64 KiB and 48 KiB requests starting 12 KiB into the region: most
  // requests would cross a buffer boundary if they were not split there, and a fixed read
  // that crosses its buffer fails with EFAULT.
  const std::string bytes = RandomBytes((1 << 20) + 333, 3);
  const std::string path = dir_.Write("straddle", bytes);
  Mapping region = MakeRegion(AlignUp(bytes.size()) + 3 * 4096, 0);
  std::vector<ReadJob> jobs = {{path, 0, bytes.size(), region.data() + 3 * 4096}};
  LoadOptions options = Options();
  options.max_registered_buffer = 64 << 10;
  options.chunk_size = 48 << 10;
  auto stats = UringLoader(options).Load(jobs, region.data(), region.size());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->fallback_reason, "");
  EXPECT_EQ(std::memcmp(region.data() + 3 * 4096, bytes.data(), bytes.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, UringLoaderModeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Uring" : "Pread") +
                                  (std::get<1>(info.param) ? "Direct" : "Buffered");
                         });

TEST(UringLoaderTest, RefusesBadJobs) {
  TempDir dir;
  const std::string path = dir.Write("f", RandomBytes(10000, 1));
  Mapping region = MakeRegion(4 * 4096, 0);
  UringLoader loader{LoadOptions{}};
  auto missing =
      loader.Load({{dir.path() + "/nope", 0, 10, region.data()}}, region.data(), region.size());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nope"), std::string::npos);
  auto odd_offset = loader.Load({{path, 100, 10, region.data()}}, region.data(), region.size());
  EXPECT_EQ(odd_offset.status().code(), StatusCode::kInvalidArgument);
  auto odd_dest = loader.Load({{path, 0, 10, region.data() + 8}}, region.data(), region.size());
  EXPECT_EQ(odd_dest.status().code(), StatusCode::kInvalidArgument);
  auto outside =
      loader.Load({{path, 0, 3 * 4096, region.data() + 2 * 4096}}, region.data(), region.size());
  EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
  auto dir_job = loader.Load({{dir.path(), 0, 10, region.data()}}, region.data(), region.size());
  EXPECT_EQ(dir_job.status().code(), StatusCode::kInvalidArgument);
  LoadOptions bad_chunk;
  bad_chunk.chunk_size = 1000;
  auto chunk = UringLoader(bad_chunk).Load({}, region.data(), region.size());
  EXPECT_EQ(chunk.status().code(), StatusCode::kInvalidArgument);
  LoadOptions bad_depth;
  bad_depth.queue_depth = 0;
  auto depth = UringLoader(bad_depth).Load({}, region.data(), region.size());
  EXPECT_EQ(depth.status().code(), StatusCode::kInvalidArgument);
}

TEST(UringLoaderTest, NoJobsIsAnEmptyLoad) {
  Mapping region = MakeRegion(4096, 0);
  auto stats = UringLoader(LoadOptions{}).Load({}, region.data(), region.size());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->bytes, 0u);
}

// Makes io_uring_setup fail with ENOSYS in this process, as a seccomp policy would.
bool DenyIoUring() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

TEST(UringLoaderTest, FallsBackToPreadWhenIoUringIsUnavailable) {
  TempDir dir;
  const std::string bytes = RandomBytes(300000, 5);
  const std::string path = dir.Write("f", bytes);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!DenyIoUring()) ::_exit(10);
    Mapping region = MakeRegion(AlignUp(bytes.size()), 0);
    auto stats = UringLoader(LoadOptions{})
                     .Load({{path, 0, bytes.size(), region.data()}}, region.data(), region.size());
    if (!stats.ok()) ::_exit(11);
    if (stats->method.rfind("pread", 0) != 0) ::_exit(12);
    if (stats->fallback_reason.find("io_uring unavailable") == std::string::npos) ::_exit(13);
    if (std::memcmp(region.data(), bytes.data(), bytes.size()) != 0) ::_exit(14);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: seccomp, 11: load failed, 12: method, "
                                       "13: reason, 14: bytes";
}

TEST(UringLoaderTest, ReadsUnregisteredWhenTheRegionCannotBeRegistered) {
  // Registered buffers count against RLIMIT_MEMLOCK for a process without CAP_IPC_LOCK.
  TempDir dir;
  const std::string bytes = RandomBytes(600000, 6);
  const std::string path = dir.Write("f", bytes);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) ::_exit(10);
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    struct rlimit lim {
      16 << 10, 16 << 10
    };
    if (::syscall(SYS_capset, &header, caps) != 0 || ::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
      ::_exit(10);
    }
    Mapping region = MakeRegion(AlignUp(bytes.size()), 0);
    auto stats = UringLoader(LoadOptions{})
                     .Load({{path, 0, bytes.size(), region.data()}}, region.data(), region.size());
    if (!stats.ok()) ::_exit(11);
    if (stats->method.rfind("io_uring", 0) != 0) ::_exit(12);
    if (stats->fallback_reason.find("cannot register") == std::string::npos) ::_exit(13);
    if (std::memcmp(region.data(), bytes.data(), bytes.size()) != 0) ::_exit(14);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setup, 11: load failed, 12: method, 13: reason, "
                                       "14: bytes";
}

}  // namespace
}  // namespace baton
