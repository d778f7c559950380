// baton-keeper in a thread of the test, and its client: memory kept across "controllers"
// (connections), handed back as the same memory, and let go on request. With baton-keeper
// processes: one started when none answers, one that never answers killed after its grace and
// replaced, one that answers late within its grace kept and used, one that serves another
// controller program replaced, a stranger left alone.
#include "controller/keeper/memory_keeper.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/process/proc_table.h"
#include "controller/keeper/keeper_client.h"
#include "proto/hello.h"
#include "proto/transport/shared_memory.h"
#include "tests/support/silent_listener.h"

namespace baton {
namespace {

class MemoryKeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-keeper-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/keeper.sock";
    Result<MemoryKeeper> keeper =
        MemoryKeeper::Bind({.socket_path = socket_, .controllers = {ProcessProgram(::getpid())}});
    ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
    thread_ =
        std::thread([k = std::make_shared<MemoryKeeper>(std::move(keeper).value())] { k->Run(); });
  }
  void TearDown() override {
    if (thread_.joinable()) {
      Result<KeeperClient> c = KeeperClient::Connect(socket_, "", "");
      if (c.ok()) (void)c->Release("");
      thread_.join();
    }
    std::string cmd = "rm -rf " + dir_;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  std::string dir_;
  std::string socket_;
  std::thread thread_;
};

// Ends the detached baton-keeper a test started at `socket` when the test stops before it
// released it (a failed ASSERT): the keeper would outlive the test. Dismiss() once released.
class KeeperStopper {
 public:
  explicit KeeperStopper(std::string socket) : socket_(std::move(socket)) {}
  KeeperStopper(const KeeperStopper&) = delete;
  KeeperStopper& operator=(const KeeperStopper&) = delete;
  ~KeeperStopper() {
    if (dismissed_) return;
    Result<KeeperClient> c = KeeperClient::Connect(socket_, "", "");
    if (!c.ok()) return;
    const Result<pid_t> pid = c->KeeperPid();
    if (!c->Release("").ok() && pid.ok()) ::kill(*pid, SIGKILL);
  }
  void Dismiss() { dismissed_ = true; }

 private:
  const std::string socket_;
  bool dismissed_ = false;
};

// `baton-keeper --socket socket --controller PROGRAM` run as a child of the test (its output
// to `log`), PROGRAM being `controller` or else this test's own, so that how it ended can be
// read: killed when the test stops before it was reaped.
class KeeperChild {
 public:
  KeeperChild(const std::string& binary, const std::string& socket, const std::string& log,
              const std::string& controller = ProcessProgram(::getpid()),
              const std::string& more_controllers = "") {
    const char* argv[] = {binary.c_str(), "--socket",         socket.c_str(),
                          "--controller", controller.c_str(), nullptr};
    const std::string more = "BATON_KEEPER_CONTROLLERS=" + more_controllers;
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    if (!more_controllers.empty()) envp.push_back(const_cast<char*>(more.c_str()));
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {  // system calls only: the test has threads
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execve(binary.c_str(), const_cast<char* const*>(argv), envp.data());
      ::_exit(127);
    }
  }
  KeeperChild(const KeeperChild&) = delete;
  KeeperChild& operator=(const KeeperChild&) = delete;
  ~KeeperChild() {
    if (pid_ > 0) (void)testing_support::ReapWithin(pid_, std::chrono::milliseconds(0));
  }
  pid_t pid() const { return pid_; }
  // Its wait status once it exited within `within`; -1 (and killed) otherwise.
  int Reap(std::chrono::milliseconds within) {
    const int status = testing_support::ReapWithin(pid_, within);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST_F(MemoryKeeperTest, KeepsMemoryAcrossControllersAndHandsBackTheSameMemory) {
  Result<SharedMemory> memory =
      SharedMemory::Create({.name = "kept", .size = 8192, .try_huge_pages = false});
  ASSERT_TRUE(memory.ok());
  Result<Mapping> map = memory->Map(Protection::kReadWrite);
  ASSERT_TRUE(map.ok());
  std::memcpy(map->data(), "weights!", 8);
  const ino_t inode = Inode(memory->fd());
  {
    Result<KeeperClient> first = KeeperClient::Connect(socket_, "", "");
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE(first->Keep("weights", "{\"generation\": 7}", {memory->fd()}).ok());
  }
  memory = Unavailable("the controller that made it is gone");
  *map = Mapping();
  Result<KeeperClient> next = KeeperClient::Connect(socket_, "", "");
  ASSERT_TRUE(next.ok());
  Result<std::optional<KeptItem>> item = next->Fetch("weights");
  ASSERT_TRUE(item.ok()) << item.status().ToString();
  ASSERT_TRUE(item->has_value());
  EXPECT_EQ((*item)->manifest, "{\"generation\": 7}");
  ASSERT_EQ((*item)->fds.size(), 1u);
  EXPECT_EQ(Inode((*item)->fds[0].get()), inode) << "the same memfd, not a copy";
  Result<SharedMemory> back = SharedMemory::Import(std::move((*item)->fds[0]));
  ASSERT_TRUE(back.ok());
  Result<Mapping> again = back->Map(Protection::kReadOnly);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(again->data(), "weights!", 8), 0) << "its contents outlived the maker";
  Result<std::optional<KeptItem>> none = next->Fetch("pool");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(next->Release("weights").ok());
  Result<std::optional<KeptItem>> gone = next->Fetch("weights");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

// The CUDA backend's device memory: a manifest without fds, and more items than a frame
// carries fds (one part of 16 chunk fds each).
TEST_F(MemoryKeeperTest, KeepsManifestsWithoutFdsAndManyParts) {
  Result<KeeperClient> c = KeeperClient::Connect(socket_, "", "");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Keep("device", "{\"generation\": 3}", {}).ok());
  Result<SharedMemory> memory =
      SharedMemory::Create({.name = "chunk", .size = 4096, .try_huge_pages = false});
  ASSERT_TRUE(memory.ok());
  const std::vector<int> fds(16, memory->fd());
  constexpr int kParts = 40;
  for (int k = 0; k < kParts; ++k) {
    ASSERT_TRUE(c->Keep("device.pool." + std::to_string(k), "{}", fds).ok()) << k;
  }
  c = Unavailable("the controller is gone");  // the keeper serves one connection at a time
  Result<KeeperClient> next = KeeperClient::Connect(socket_, "", "");
  ASSERT_TRUE(next.ok());
  Result<std::optional<KeptItem>> manifest = next->Fetch("device");
  ASSERT_TRUE(manifest.ok() && manifest->has_value());
  EXPECT_EQ((*manifest)->manifest, "{\"generation\": 3}");
  EXPECT_TRUE((*manifest)->fds.empty());
  Result<std::optional<KeptItem>> last = next->Fetch("device.pool." + std::to_string(kParts - 1));
  ASSERT_TRUE(last.ok() && last->has_value());
  ASSERT_EQ((*last)->fds.size(), 16u);
  EXPECT_EQ(Inode((*last)->fds[15].get()), Inode(memory->fd()));
  Result<bool> forgot = next->Forget("device.pool.0");
  ASSERT_TRUE(forgot.ok());
  EXPECT_TRUE(*forgot);
  forgot = next->Forget("device.pool.0");
  ASSERT_TRUE(forgot.ok());
  EXPECT_FALSE(*forgot) << "nothing is kept there any more";
  EXPECT_FALSE(next->Forget("").ok()) << "\"\" would end the keeper";
}

TEST_F(MemoryKeeperTest, ServesTheControllerOnly) {
  boost::asio::io_context io;
  Result<proto::Channel> c = proto::Connect(io, socket_);
  ASSERT_TRUE(c.ok());
  Result<proto::HelloAck> ack =
      proto::ClientHello(*c, {.peer_name = "x", .role = proto::PeerRole::kEngine});
  ASSERT_FALSE(ack.ok());
  EXPECT_NE(ack.status().message().find("serves the controller only"), std::string::npos);
  // The keeper goes on serving.
  Result<KeeperClient> controller = KeeperClient::Connect(socket_, "", "");
  ASSERT_TRUE(controller.ok()) << controller.status().ToString();
  EXPECT_TRUE(controller->Fetch("weights").ok());
}

TEST_F(MemoryKeeperTest, AKeeperServesSomeProgram) {
  Result<MemoryKeeper> keeper =
      MemoryKeeper::Bind({.socket_path = dir_ + "/none.sock", .controllers = {}});
  ASSERT_FALSE(keeper.ok());
  EXPECT_EQ(keeper.status().code(), StatusCode::kInvalidArgument);
}

// BATON_KEEPER_CONTROLLERS adds programs the keeper serves; a path in it that is not absolute,
// like a --controller that is not, is bad usage (exit 2).
TEST_F(MemoryKeeperTest, TheEnvironmentAddsProgramsAndRelativeOnesAreBadUsage) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  const std::string log = dir_ + "/keeper.log";
  KeeperChild keeper(binary, other, log, "/opt/baton/bin/baton-controller",
                     "/opt/tool:" + ProcessProgram(::getpid()));
  ASSERT_GT(keeper.pid(), 0);
  KeeperStopper stopper(other);
  Result<KeeperClient> served = Unavailable("not connected");
  for (int i = 0; i < 3000 && !served.ok(); ++i) {
    served = KeeperClient::Connect(other, "", "");
    if (!served.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  ASSERT_TRUE(served->Release("").ok());
  EXPECT_EQ(keeper.Reap(std::chrono::milliseconds(10000)), 0);
  stopper.Dismiss();
  KeeperChild relative_env(binary, dir_ + "/a.sock", log, "/opt/baton/bin/baton-controller",
                           "bin/tool");
  EXPECT_EQ(relative_env.Reap(std::chrono::milliseconds(10000)), 2 << 8);
  KeeperChild relative_flag(binary, dir_ + "/b.sock", log, "baton-controller");
  EXPECT_EQ(relative_flag.Reap(std::chrono::milliseconds(10000)), 2 << 8);
  EXPECT_NE(ReadFile(log).find("BATON_KEEPER_CONTROLLERS: want absolute paths"), std::string::npos)
      << ReadFile(log);
}

// A keeper that serves another controller program (the install moved since it started)
// refuses the controller, and the refusal names both programs; the controller, which can start
// keepers, kills it (what it kept cannot be had) and starts its own, which serves it.
TEST_F(MemoryKeeperTest, AKeeperOfAnotherProgramIsKilledAndReplacedByTheController) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  const std::string log = dir_ + "/keeper.log";
  KeeperChild keeper(binary, other, log, "/opt/baton/bin/baton-controller");
  ASSERT_GT(keeper.pid(), 0);
  KeeperStopper stopper(other);
  Result<KeeperClient> refused = Unavailable("not connected");
  for (int i = 0; i < 3000 && refused.status().code() != StatusCode::kFailedPrecondition; ++i) {
    refused = KeeperClient::Connect(other, "", "");
    if (!refused.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << "without a binary it is only reported";
  EXPECT_NE(refused.status().message().find(
                "serves the controller (/opt/baton/bin/baton-controller) only; pid " +
                std::to_string(::getpid()) + " runs " + ProcessProgram(::getpid())),
            std::string::npos)
      << refused.status().message();
  const pid_t refusing = keeper.pid();
  Result<KeeperClient> started =
      KeeperClient::Connect(other, binary, log, std::chrono::seconds(30));
  const int status = keeper.Reap(std::chrono::milliseconds(10000));
  EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Result<pid_t> pid = started->KeeperPid();
  ASSERT_TRUE(pid.ok());
  EXPECT_NE(*pid, refusing);
  EXPECT_NE(ReadFile(log).find("refused a connection: baton-keeper serves the controller ("),
            std::string::npos)
      << ReadFile(log);
  ASSERT_TRUE(started->Release("").ok());
  stopper.Dismiss();
}

TEST_F(MemoryKeeperTest, ReleasingEverythingEndsTheKeeper) {
  Result<KeeperClient> c = KeeperClient::Connect(socket_, "", "");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Release("").ok());
  thread_.join();
  EXPECT_FALSE(KeeperClient::Connect(socket_, "", "").ok()) << "nobody listens any more";
}

TEST_F(MemoryKeeperTest, ANewControllerStartsTheKeeperWhenNoneAnswers) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  KeeperStopper stopper(other);
  // A freshly exec'd keeper on a loaded machine may take more than the default 3 s to answer.
  Result<KeeperClient> started =
      KeeperClient::Connect(other, binary, dir_ + "/keeper.log", std::chrono::seconds(30));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_TRUE(started->Keep("pool", "{}", {}).ok());
  ASSERT_TRUE(started->Release("").ok());
  stopper.Dismiss();
}

// A baton-keeper that runs but never answers (deadlocked) is killed once its grace has passed
// and a new keeper started in its place, which answers.
TEST_F(MemoryKeeperTest, AKeeperThatRunsButNeverAnswersIsKilledAndReplaced) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  const pid_t silent = testing_support::StartSilentListener(other, "baton-keeper");
  ASSERT_GT(silent, 0);
  KeeperStopper stopper(other);
  Result<KeeperClient> started =
      KeeperClient::Connect(other, binary, dir_ + "/keeper.log", std::chrono::seconds(30),
                            std::chrono::milliseconds(100));
  const int status = testing_support::ReapWithin(silent, std::chrono::seconds(10));
  EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Result<pid_t> pid = started->KeeperPid();
  ASSERT_TRUE(pid.ok());
  EXPECT_NE(*pid, silent);
  ASSERT_TRUE(started->Keep("pool", "{}", {}).ok());
  ASSERT_TRUE(started->Release("").ok());
  stopper.Dismiss();
}

// A baton-keeper that runs but is busy with the connection of the controller before (it
// serves one at a time) answers the next controller only once that connection closes: after
// the first try went unanswered, within the grace. It is not killed, and its answer is used:
// the memory it kept is handed back.
TEST_F(MemoryKeeperTest, AKeeperThatAnswersLateWithinItsGraceIsKeptAndUsed) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  const std::string log = dir_ + "/keeper.log";
  KeeperChild keeper(binary, other, log);
  ASSERT_GT(keeper.pid(), 0);
  KeeperStopper stopper(other);  // a keeper started in its place, were it killed
  Result<KeeperClient> busy = Unavailable("not connected");
  for (int i = 0; i < 3000 && !busy.ok(); ++i) {
    busy = KeeperClient::Connect(other, "", "");
    if (!busy.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  ASSERT_TRUE(busy->Keep("weights", "{\"generation\": 7}", {}).ok());
  std::atomic<bool> asking = false;
  Result<KeeperClient> late = Unavailable("not connected");
  std::thread next([&] {
    asking = true;
    late = KeeperClient::Connect(other, binary, log, std::chrono::seconds(30),
                                 std::chrono::seconds(30));
  });
  while (!asking) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Once the first try's Hello timeout (a second) has passed, with room for a thread that a
  // loaded host starts late, the busy connection closes (within the 30 s grace).
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  busy = Unavailable("the controller before is gone");
  next.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  Result<pid_t> pid = late->KeeperPid();
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(*pid, keeper.pid()) << "the keeper that answered late, not a new one";
  Result<std::optional<KeptItem>> item = late->Fetch("weights");
  ASSERT_TRUE(item.ok()) << item.status().ToString();
  ASSERT_TRUE(item->has_value()) << "what it kept is handed back";
  EXPECT_EQ((*item)->manifest, "{\"generation\": 7}");
  EXPECT_NE(ReadFile(log).find("refused a connection"), std::string::npos)
      << "the first try, closed unanswered, was asked again:\n"
      << ReadFile(log);
  ASSERT_TRUE(late->Release("").ok());
  const int status = keeper.Reap(std::chrono::milliseconds(10000));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "it exited when told to, never killed: " << status;
  stopper.Dismiss();
}

// Only a baton-keeper is killed: another process that listens at the socket and does not
// answer is left running, and no keeper can be had.
TEST_F(MemoryKeeperTest, AProcessThatIsNotAKeeperIsNeverKilled) {
  const std::string other = dir_ + "/other.sock";
  const std::string binary = std::string(BATON_BIN_DIR) + "/baton-keeper";
  const pid_t stranger = testing_support::StartSilentListener(other, "not-a-keeper");
  ASSERT_GT(stranger, 0);
  Result<KeeperClient> started =
      KeeperClient::Connect(other, binary, dir_ + "/keeper.log", std::chrono::milliseconds(200),
                            std::chrono::milliseconds(100));
  EXPECT_FALSE(started.ok());
  int status = 0;
  EXPECT_EQ(::waitpid(stranger, &status, WNOHANG), 0) << "the stranger still runs";
  ASSERT_EQ(::kill(stranger, SIGKILL), 0);
  ASSERT_EQ(::waitpid(stranger, &status, 0), stranger);
}

}  // namespace
}  // namespace baton
