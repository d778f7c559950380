// baton-router: the OpenAI-compatible HTTP front door. Runs until SIGINT or SIGTERM.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "base/log.h"
#include "router/router.h"

namespace {

constexpr char kUsage[] =
    "usage: baton-router [--config FILE] [--listen HOST:PORT] [--controller SOCKET]\n"
    "                    [--backend HOST:PORT] [--api-key KEY] [--max-body-bytes N]\n"
    "                    [--connect-timeout-ms N] [--first-byte-timeout-ms N]\n"
    "                    [--stream-idle-timeout-ms N] [--threads N]\n"
    "                    [--max-queue N] [--max-queue-wait-ms N] [--ramp-steps 30,60,100]\n"
    "                    [--ramp-duration-ms N] [--migration-limit N] [--max-connections N]\n"
    "                    [--max-header-bytes N] [--request-timeout-ms N]\n"
    "                    [--client-idle-timeout-ms N] [--shadow-every N]\n"
    "                    [--etcd HOST:PORT,... [--etcd-prefix /baton/] [--etcd-timeout-ms N]\n"
    "                     [--etcd-ca-file FILE] [--etcd-cert-file FILE --etcd-key-file FILE]\n"
    "                     [--fleet-poll-ms N] [--fleet-suspect-ms N]\n"
    "                     [--fleet-router-name NAME]]\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  baton::Result<baton::RouterOptions> options = baton::ParseRouterFlags(args);
  if (!options.ok()) {
    std::fprintf(stderr, "baton-router: %s\n%s", options.status().message().c_str(), kUsage);
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts

  baton::Router router(std::move(*options));
  if (baton::Status st = router.Start(); !st.ok()) {
    std::fprintf(stderr, "baton-router: %s\n", st.ToString().c_str());
    return 1;
  }
  sigdelset(&signals, SIGPIPE);
  int sig = 0;
  sigwait(&signals, &sig);
  BATON_LOG(INFO, "router") << "signal " << sig << ", stopping";
  router.Stop();
  return 0;
}
