// baton-keeper: keeps the controller's memory alive while no controller runs
// (controller/keeper/memory_keeper.h). Started by the controller, detached from it.
//   baton-keeper --socket PATH [--controller PROGRAM]... [--empty-exit-s N]
//   baton-keeper --version
// --controller names a program whose processes it serves (the controller that starts it names
// its own); without one, baton-controller beside baton-keeper. In the environment (the
// controller's, which starts it): BATON_KEEPER_CONTROLLERS, more such programs separated by
// ':' (a diagnostic tool of the operator's); BATON_KEEPER_IDLE_TIMEOUT_MS, how long a
// connection may stay idle before the keeper closes it (default 10000).
// Exit status: 0 when told to release everything or when idle and empty, 1 when it cannot
// bind, 2 on bad usage.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/build_info.h"
#include "base/io/fd_limit.h"
#include "base/io/self_exe.h"
#include "base/log.h"
#include "controller/keeper/memory_keeper.h"

namespace {

// Adds the ':'-separated programs of BATON_KEEPER_CONTROLLERS to `out`; false on one that is
// not an absolute path.
bool AddControllersFromEnvironment(std::vector<std::string>* out) {
  const char* list = std::getenv("BATON_KEEPER_CONTROLLERS");
  if (list == nullptr) return true;
  std::string rest = list;
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string path = rest.substr(0, colon);
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    if (path.empty()) continue;
    if (path.front() != '/') return false;
    out->push_back(path);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  baton::KeeperOptions options;
  if (baton::WantsVersion(argc, argv)) {
    std::printf("%s\n", baton::VersionLine("baton-keeper").c_str());
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      options.socket_path = argv[++i];
    } else if (a == "--controller" && i + 1 < argc && argv[i + 1][0] == '/') {
      options.controllers.push_back(argv[++i]);
    } else if (a == "--empty-exit-s" && i + 1 < argc) {
      options.empty_exit = std::chrono::seconds(std::strtoll(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr,
                   "usage: baton-keeper --socket PATH [--controller /PROGRAM]... "
                   "[--empty-exit-s N]\n");
      return 2;
    }
  }
  if (const char* idle = std::getenv("BATON_KEEPER_IDLE_TIMEOUT_MS"); idle != nullptr) {
    const long long ms = std::strtoll(idle, nullptr, 10);
    if (ms <= 0) {
      std::fprintf(stderr, "baton-keeper: BATON_KEEPER_IDLE_TIMEOUT_MS: want milliseconds > 0\n");
      return 2;
    }
    options.idle_timeout = std::chrono::milliseconds(ms);
  }
  if (options.controllers.empty()) {
    const std::string dir = baton::SelfExeDir();
    if (!dir.empty()) options.controllers.push_back(dir + "/baton-controller");
  }
  if (!AddControllersFromEnvironment(&options.controllers)) {
    std::fprintf(stderr, "baton-keeper: BATON_KEEPER_CONTROLLERS: want absolute paths\n");
    return 2;
  }
  if (options.socket_path.empty()) {
    std::fprintf(stderr, "baton-keeper: --socket is required\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  baton::RaiseFdLimit();      // one fd per kept device memory chunk
  ::signal(SIGINT, SIG_IGN);  // a Ctrl-C meant for the controller's terminal is not for it
  baton::Result<baton::MemoryKeeper> keeper = baton::MemoryKeeper::Bind(options);
  if (!keeper.ok()) {
    BATON_LOG(ERROR, "keeper") << "cannot start: " << keeper.status().ToString();
    return 1;
  }
  keeper->Run();
  return 0;
}
