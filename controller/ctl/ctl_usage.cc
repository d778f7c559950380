// CtlUsage, CtlUsageHint and CheckCtlArgs (ctl_service.h): the usage text of batonctl's
// commands, printed by `batonctl --help` (and with no command), the hint printed after a usage
// error, and the check of each command's arguments.
#include "controller/core/drill_kind.h"
#include "controller/ctl/ctl_service.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {

const char* CtlUsage() {
  return R"(usage: batonctl [--json] [--socket PATH | --config FILE] [--timeout-ms N] COMMAND [ARGS]
       batonctl --version

commands:
  status                 pair, roles, pids, epochs, versions, pool use, weights, transitions
  promote                graceful switch-over: drain the primary, promote the standby
  drain                  take the pair out of service (the primary finishes its requests)
  resume                 undo drain: the draining primary serves on, or a stopped pair
                         starts again
  drill kill|hang|error  kill -9 the primary, freeze its cgroup (else SIGSTOP its group), or make it
                         report an error
  upgrade [--steps 10,50,100] [--step-ms N] [--min-requests N] -- CMD ARGS...
                         canary upgrade to a new engine command (same placeholders as
                         engine.command; or --engine-cmd "CMD"): it takes the standby's
                         place, serves a growing share, and is promoted or rolled back
  rollback [--steps ...] [--step-ms N] [--min-requests N]
                         roll the canary back; with no upgrade running, upgrade back to
                         the command the last promoted upgrade replaced (by a canary)
  timeline               the last hand-over (failover, switch-over, upgrade or first
                         promotion), phase by phase (--json: the earlier ones too)
  fleet status           every node of the fleet ([fleet]): its pair, versions, load, rollout
  fleet upgrade [--batch N | --fraction F] [--keep-upgraded] [--wait]
        [--steps ...] [--step-ms N] [--min-requests N] -- CMD ARGS...
                         roll a new engine command across the fleet's nodes, N (or
                         ceil(F x nodes)) at a time, each through its canary; a rollback on
                         any node stops it and rolls back the nodes already upgraded (unless
                         --keep-upgraded); --wait follows it until it settles
  fleet rollout          the fleet-wide upgrade: its state and every node's
  fleet pause|resume|abort
                         hold the rollout, go on, or stop it (canaries in flight roll back)
  controller restart     the controller exits and hands the engines, the weights and the pool
                         to the next one (started by systemd or `make serve`): an upgrade of
                         Baton itself, without an outage

options:
  --json                 print one JSON object as the last line
  --socket PATH          controller socket (default $BATON_RUNTIME_DIR/controller.sock,
                         or /tmp/baton-<uid>/controller.sock)
  --config FILE          the controller's config: its controller.runtime_dir's socket
                         (/etc/baton/controller.toml under systemd: /run/baton)
  --timeout-ms N         how long to wait for the controller (default 10000)
exit status: 0 done, 1 refused (the reason is printed), 2 bad usage
)";
}

const char* CtlUsageHint() { return "run 'batonctl --help' for the commands and their options"; }

namespace {

Status Unexpected(const std::string& what, const std::string& arg, bool further = true) {
  return InvalidArgument(what + " takes no " + (further ? "further " : "") +
                         "arguments: unexpected argument '" + arg + "'");
}

}  // namespace

Status CheckCtlArgs(const std::string& command, const std::vector<std::string>& args) {
  if (command == "drill") {
    if (args.empty()) return InvalidArgument("drill needs one of: kill, hang, error");
    BATON_RETURN_IF_ERROR(ParseDrillKind(args[0]).status());
    if (args.size() > 1) return Unexpected("drill " + args[0], args[1]);
    return OkStatus();
  }
  if (command == "upgrade") return ParseUpgradeArgs(args).status();
  if (command == "rollback") return ParseRollbackArgs(args).status();
  if (command == "controller") {
    if (args.empty()) return InvalidArgument("controller needs: restart");
    if (args[0] != "restart") {
      return InvalidArgument("unknown controller command '" + args[0] + "' (restart)");
    }
    if (args.size() > 1) return Unexpected("controller restart", args[1]);
    return OkStatus();
  }
  if (command == "status" || command == "promote" || command == "drain" || command == "resume" ||
      command == "timeline") {
    if (!args.empty()) return Unexpected(command, args[0], /*further=*/false);
    return OkStatus();
  }
  return InvalidArgument("unknown command '" + command + "'");
}

}  // namespace baton
