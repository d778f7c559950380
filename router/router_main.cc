// baton-router: the OpenAI-compatible HTTP front door. Runs until SIGINT or SIGTERM, then
// drains (docs/router.md, Stopping): /health says draining, no new connection is taken after
// --drain-delay-ms, and the requests in flight finish (or are replayed as usual) within
// --drain-timeout-ms; a second signal stops it at once. SIGHUP reads the engine key file
// again (--engine-key-file).
// Exit status: 0 after a signal (and for --help, --version and a good --check-config), 1 when
// it cannot start, 2 on a bad flag or config file.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "base/build_info.h"
#include "base/io/fd_limit.h"
#include "base/io/sd_notify.h"
#include "base/log.h"
#include "router/router.h"

namespace {

constexpr char kUsage[] =
    "usage: baton-router [--config FILE] [--listen HOST:PORT] [--controller SOCKET]\n"
    "                    [--backend HOST:PORT] [--api-key KEY] [--engine-key-file FILE]\n"
    "                    [--max-body-bytes N]\n"
    "                    [--connect-timeout-ms N] [--first-byte-timeout-ms N]\n"
    "                    [--stream-idle-timeout-ms N] [--stall-timeout-ms N] [--threads N]\n"
    "                    [--max-queue N] [--max-queue-wait-ms N] [--ramp-steps 30,60,100]\n"
    "                    [--ramp-duration-ms N] [--migration-limit N] [--max-connections N]\n"
    "                    [--max-header-bytes N] [--request-timeout-ms N]\n"
    "                    [--client-idle-timeout-ms N] [--shadow-every N]\n"
    "                    [--engine-retention-ms N]\n"
    "                    [--drain-delay-ms N] [--drain-timeout-ms N]\n"
    "                    [--etcd HOST:PORT,... [--etcd-prefix /baton/] [--etcd-timeout-ms N]\n"
    "                     [--etcd-ca-file FILE] [--etcd-cert-file FILE --etcd-key-file FILE]\n"
    "                     [--fleet-poll-ms N] [--fleet-suspect-ms N]\n"
    "                     [--fleet-router-name NAME]]\n"
    "       baton-router --check-config [--config FILE] [flags]\n"
    "       baton-router --version\n";

// Waits up to `for_ms` for one of `signals`; true when one came.
bool SignalWithin(const sigset_t& signals, std::chrono::milliseconds for_ms) {
  const timespec ts{.tv_sec = static_cast<time_t>(for_ms.count() / 1000),
                    .tv_nsec = static_cast<long>(for_ms.count() % 1000) * 1'000'000};
  return sigtimedwait(&signals, nullptr, &ts) > 0;
}

// After the first signal: drains, unless a second signal says to stop now.
void Drain(baton::Router& router, const baton::RouterOptions& options, const sigset_t& signals) {
  using Clock = std::chrono::steady_clock;
  constexpr std::chrono::milliseconds kPoll{10};
  router.BeginDrain();
  const auto stop_accepting = Clock::now() + options.drain_delay;
  while (Clock::now() < stop_accepting) {
    if (SignalWithin(signals, kPoll)) {
      BATON_LOG(WARN, "router") << "second signal: stopping without waiting";
      return;
    }
  }
  router.StopAccepting();
  const auto deadline = Clock::now() + options.drain_timeout;
  for (int polls = 1; !router.Idle(); ++polls) {
    if (polls % 10 == 0) router.CloseIdle();  // connections that went idle meanwhile
    if (Clock::now() >= deadline) {
      BATON_LOG(WARN, "router") << "drain timed out after " << options.drain_timeout.count()
                                << " ms with " << router.connections()
                                << " client connections open: stopping";
      return;
    }
    if (SignalWithin(signals, kPoll)) {
      BATON_LOG(WARN, "router") << "second signal: stopping with " << router.connections()
                                << " client connections open";
      return;
    }
  }
  BATON_LOG(INFO, "router") << "drained: no client connection left";
}

// Lifts the soft fd limit to the hard one; warns when `max_connections` clients, each with an
// engine connection of its own, would still run out of fds before the 503 past the limit
// (accepts and engine connections would fail instead).
void WarnOfFdLimit(size_t max_connections) {
  const uint64_t fds = baton::RaiseFdLimit();
  const uint64_t needed = 2 * uint64_t{max_connections} + 256;  // + pools, etcd, logs
  if (fds >= needed) return;
  BATON_LOG(WARN, "router") << "max_connections " << max_connections << " needs about " << needed
                            << " file descriptors, and RLIMIT_NOFILE allows " << fds
                            << ": past about " << (fds > 256 ? (fds - 256) / 2 : 0)
                            << " clients, accepts fail before the 503 (raise LimitNOFILE or "
                               "ulimit -n, or lower max_connections)";
}

}  // namespace

int main(int argc, char** argv) {
  if (baton::WantsVersion(argc, argv)) {
    std::printf("%s\n", baton::VersionLine("baton-router").c_str());
    return 0;
  }
  std::vector<std::string> args;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--check-config") {
      check_only = true;
    } else {
      args.push_back(a);
    }
  }
  baton::Result<baton::RouterOptions> options = baton::ParseRouterFlags(args);
  if (!options.ok()) {
    std::fprintf(stderr, "baton-router: %s\n%s", options.status().message().c_str(),
                 check_only ? "" : kUsage);
    return 2;
  }
  if (check_only) {
    const baton::RouterOptions& o = *options;
    std::string routes = "the controller at " + o.controller_socket;
    if (!o.etcd.empty()) {
      routes = "the fleet in etcd (" + std::to_string(o.etcd.size()) + " members) under " +
               o.etcd_prefix;
    } else if (!o.backend.empty()) {
      routes = "the static backend " + o.backend;
    }
    std::printf("baton-router: the configuration is valid\n  listen %s:%u\n  routes from %s\n",
                o.listen_host.c_str(), o.listen_port, routes.c_str());
    return 0;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGPIPE);
  sigset_t blocked = signals;
  sigaddset(&blocked, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);                      // before any thread starts
  baton::SdNotifier notifier = baton::SdNotifier::FromEnvironment();  // before any thread too

  WarnOfFdLimit(options->max_connections);
  const baton::RouterOptions drain_options = *options;
  baton::Router router(std::move(*options));
  if (baton::Status st = router.Start(); !st.ok()) {
    std::fprintf(stderr, "baton-router: %s\n", st.ToString().c_str());
    return 1;
  }
  BATON_LOG(INFO, "router") << baton::VersionLine("baton-router");
  router.StartServiceWatchdog(std::move(notifier));
  sigdelset(&signals, SIGPIPE);
  sigset_t waited = signals;  // the stop signals, and SIGHUP: the engine key file again
  sigaddset(&waited, SIGHUP);
  int sig = 0;
  while (sigwait(&waited, &sig) == 0 && sig == SIGHUP) (void)router.ReloadEngineKey();
  BATON_LOG(INFO, "router") << "signal " << sig << ": draining, then stopping";
  Drain(router, drain_options, signals);
  router.Stop();
  BATON_LOG(INFO, "router") << "stopped";
  return 0;
}
