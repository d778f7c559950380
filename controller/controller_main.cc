// baton-controller: the node-local daemon. See controller/controller.h and
// docs/operations.md. Exit status: 0 after SIGINT/SIGTERM, 1 when it cannot start, 2 on a
// bad config or flag.
#include <signal.h>

#include <boost/asio/signal_set.hpp>
#include <cstdio>

#include "base/io/fd_limit.h"
#include "base/log.h"
#include "controller/config.h"
#include "controller/controller.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/metrics_server.h"

namespace baton {
namespace {

int Run(int argc, char** argv) {
  ControllerConfig config;
  Status parsed = ParseControllerFlags(argc, argv, &config);
  if (parsed.code() == StatusCode::kNotFound && parsed.message() == "help") {
    std::fputs(ControllerUsage(), stdout);
    return 0;
  }
  if (parsed.ok()) parsed = FinishConfig(&config);
  if (!parsed.ok()) {
    std::fprintf(stderr, "baton-controller: %s\n\n%s", parsed.message().c_str(), ControllerUsage());
    return 2;
  }
  LogLevel level;
  if (!ParseLogLevel(config.log_level, &level)) {
    std::fprintf(stderr, "baton-controller: controller.log_level: unknown level '%s'\n",
                 config.log_level.c_str());
    return 2;
  }
  if (std::getenv("BATON_LOG_LEVEL") == nullptr) SetLogLevel(level);
  ::signal(SIGPIPE, SIG_IGN);  // engines reset it before exec
  RaiseFdLimit();              // the CUDA backend holds one fd per adopted device memory chunk

  boost::asio::io_context io;
  Result<std::unique_ptr<Controller>> controller = Controller::Create(io, config, RealClock::Get());
  if (!controller.ok()) {
    BATON_LOG(ERROR, "controller") << "cannot start: " << controller.status().ToString();
    return 1;
  }
  Controller* c = controller->get();
  std::unique_ptr<MetricsServer> metrics;
  if (config.metrics_port != 0) {
    auto started = MetricsServer::Start(io, config.metrics_host, config.metrics_port,
                                        [c] { return MetricsText(c->Snapshot()); });
    if (!started.ok()) {
      BATON_LOG(ERROR, "controller") << "cannot start: " << started.status().ToString();
      return 1;
    }
    metrics = std::move(started).value();
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    BATON_LOG(INFO, "controller") << "signal " << sig << ": shutting down";
    metrics.reset();
    c->Shutdown([&io] { io.stop(); });
  });
  c->Start();
  io.run();
  BATON_LOG(INFO, "controller") << "stopped";
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
