// The chaos tests' engine misbehaving over the raw protocol instead of the SDK (the rogue
// modes of test_engine_helper_main.cc: bad-frame, stale-epoch, foreign-return, foreign-lease,
// wrong-id, huge-register, bad-address, tamper-memory, mute, thread-dies,
// report-then-thread-dies; command-controller and lend-token, rogue_commands.h). Header-only
// test support.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "base/log.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "proto/transport/liveness_page.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/chaos/rogue_commands.h"

namespace baton::testing {

inline void KeepBeating(proto::Channel& channel) {
  uint64_t seq = 0;
  while (channel.is_open()) {
    if (!channel.Send(proto::Heartbeat{.epoch = 0, .seq = ++seq}).ok()) return;
    Result<proto::ReceivedMessage> msg = channel.Receive(std::chrono::milliseconds(50));
    if (!msg.ok() && msg.status().code() != StatusCode::kDeadlineExceeded) return;
    if (msg.ok() && msg->type == proto::MsgType::kStop) return;
  }
}

// One line per attempt on the memory the controller shares; true if every one was refused.
inline bool TamperWith(const proto::ReceivedMessage& ack, std::string* report) {
  if (ack.fds.size() < 2) return *report = "RegisterAck without two fds\n", false;
  const int arena = ack.fds[0].get();
  const int pool = ack.fds[1].get();
  bool all_refused = true;
  // `err`: 0 when the call succeeded, its errno otherwise.
  auto attempt = [&](const char* what, int err) {
    all_refused = all_refused && err != 0;
    *report +=
        std::string(what) +
        (err == 0 ? ": succeeded\n" : ": refused (" + std::string(std::strerror(err)) + ")\n");
  };
  auto call = [](bool ok) { return ok ? 0 : errno; };
  attempt("ftruncate pool to 0", call(::ftruncate(pool, 0) == 0));
  attempt("ftruncate arena to 0", call(::ftruncate(arena, 0) == 0));
  struct stat st {};
  ::fstat(pool, &st);
  attempt("grow pool", call(::ftruncate(pool, st.st_size + (4 << 20)) == 0));
  void* w = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, arena, 0);
  attempt("map arena writable", call(w != MAP_FAILED));
  if (w != MAP_FAILED) ::munmap(w, 4096);
  const char byte = 1;
  attempt("pwrite arena", call(::pwrite(arena, &byte, 1, 0) == 1));
  attempt("punch a hole in the arena",
          call(::fallocate(arena, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0));
  attempt("seal the pool read-only", call(::fcntl(pool, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0));
  return all_refused;
}

inline void WriteTamperReport(const std::string& violations_dir, uint64_t id,
                              const std::string& report, bool refused) {
  if (violations_dir.empty()) return;
  std::ofstream(violations_dir + "/../tamper-" + std::to_string(id) + ".txt") << report;
  if (!refused) {
    std::ofstream(violations_dir + "/violation-" + std::to_string(id) + ".txt")
        << "a peer changed shared memory it may only read:\n"
        << report;
  }
}

// Sends StandbyReady with a liveness page whose holding thread then ends without releasing
// it, while the process lives on, connected and beating: the controller must take that for
// the process's death at once, without waiting for the connection's end. `report_first`: an
// ErrorReport goes just before the thread ends, and must be heard before the death.
inline int ThreadDies(proto::Channel& channel, bool report_first) {
  Result<proto::LivenessPage> page = proto::LivenessPage::Create();
  if (!page.ok()) return 3;
  std::atomic<int> step{0};
  std::thread holder([&] {
    if (!page->Hold().ok()) return;
    step.store(1);
    while (step.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });  // ends holding the mutex
  while (step.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int fds[1] = {page->fd()};
  (void)channel.Send(proto::StandbyReady{}, fds);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (report_first) {
    (void)channel.Send(proto::ErrorReport{.epoch = 0, .code = 13, .message = "last words"});
  }
  step.store(2);
  holder.join();
  KeepBeating(channel);
  return 2;
}

inline int RunRogue(const std::string& mode, const std::string& violations_dir,
                    const EngineLaunchInfo& info) {
  BATON_LOG(WARN, "test-engine") << "engine " << info.engine_id << " misbehaves: " << mode;
  if (mode == "lend-token") LendToken(violations_dir, info);
  boost::asio::io_context io;
  Result<proto::Channel> channel = proto::Connect(io, info.socket_path);
  if (!channel.ok()) return 1;
  proto::ClientHelloOptions hello{
      .peer_name = "rogue", .role = proto::PeerRole::kEngine, .launch_token = info.launch_token};
  if (!proto::ClientHello(*channel, hello).ok()) return 1;
  const uint64_t id = mode == "wrong-id" ? info.engine_id + 1000 : info.engine_id;
  proto::Register reg{.engine_id = id, .engine_version = "rogue", .http_address = ""};
  if (mode == "huge-register") reg.engine_version = "rogue" + std::string(600'000, 'v');
  if (mode == "bad-address") reg.http_address = "127.0.0.1:99999";
  (void)channel->Send(reg);
  Result<proto::ReceivedMessage> ack = channel->Receive(std::chrono::seconds(10));
  if (!ack.ok() || ack->type != proto::MsgType::kRegisterAck) {
    KeepBeating(*channel);
    return 2;
  }
  if (mode == "thread-dies" || mode == "report-then-thread-dies") {
    return ThreadDies(*channel, mode == "report-then-thread-dies");
  }
  (void)channel->Send(proto::StandbyReady{});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (mode == "bad-frame") {
    const char garbage[] = "this is not a Baton frame at all";
    ssize_t unused = ::send(channel->native_handle(), garbage, sizeof(garbage), MSG_NOSIGNAL);
    (void)unused;
  } else if (mode == "stale-epoch") {
    (void)channel->Send(proto::Heartbeat{.epoch = 999'999, .seq = 1});
  } else if (mode == "foreign-return") {
    (void)channel->Send(proto::ReturnExtents{.epoch = 0, .extents = {{0, 1}}});
  } else if (mode == "foreign-lease") {
    (void)channel->Send(proto::LeaseRequest{.epoch = 0, .blocks = 4});
  } else if (mode == "tamper-memory") {
    std::string report;
    const bool refused = TamperWith(*ack, &report);
    BATON_LOG(WARN, "test-engine") << "tampering:\n" << report;
    WriteTamperReport(violations_dir, info.engine_id, report, refused);
  } else if (mode == "command-controller") {
    CommandController(violations_dir, info);
  }
  KeepBeating(*channel);
  return 2;
}

}  // namespace baton::testing
