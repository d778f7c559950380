#include "controller/rollout/ctl_rollout.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <sstream>

#include "base/log.h"
#include "controller/engines/supervisor.h"
#include "controller/rollout/fleet_status.h"
#include "controller/rollout/rollout_rules.h"
#include "controller/upgrade/ctl_upgrade.h"
#include "fleet/fleet_records.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr int kCasTries = 5;

proto::CtlReply Reply(uint32_t code, std::string text, const json& j) {
  return proto::CtlReply{.exit_code = code,
                         .text = std::move(text),
                         .json = j.dump(-1, ' ', false, json::error_handler_t::replace)};
}

proto::CtlReply Refuse(const std::string& what, const Status& status) {
  const uint32_t code = status.code() == StatusCode::kInvalidArgument ? 2 : 1;
  return Reply(code, "refused: " + status.message(),
               {{"ok", false}, {"command", "fleet " + what}, {"error", status.message()}});
}

json RolloutReplyJson(const std::optional<Rollout>& r) {
  if (!r.has_value()) return {{"ok", true}, {"rollout", nullptr}, {"settled", true}};
  return {{"ok", true}, {"rollout", RolloutJson(*r)}, {"settled", RolloutSettled(*r)}};
}

// The rollout record and its revision (0: none). A record that does not parse is an error.
Result<std::pair<std::optional<Rollout>, int64_t>> ReadRollout(const FleetCtlContext& ctx) {
  BATON_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                         ctx.etcd->Get(FleetRolloutKey(ctx.prefix)));
  if (!kv.has_value()) return std::pair<std::optional<Rollout>, int64_t>(std::nullopt, 0);
  BATON_ASSIGN_OR_RETURN(Rollout r, ParseRolloutRecord(kv->value));
  return std::pair<std::optional<Rollout>, int64_t>(std::move(r), kv->mod_revision);
}

Result<double> ParseFraction(const std::string& text) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(v > 0) || v > 1) {
    return InvalidArgument("--fraction: a number in (0, 1], got '" + text + "'");
  }
  return v;
}

Result<uint32_t> ParseBatch(const std::string& text) {
  uint32_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v == 0) {
    return InvalidArgument("--batch: a number of nodes, at least 1, got '" + text + "'");
  }
  return v;
}

proto::CtlReply Show(const FleetCtlContext& ctx) {
  Result<std::pair<std::optional<Rollout>, int64_t>> read = ReadRollout(ctx);
  if (!read.ok()) return Refuse("rollout", read.status());
  const std::optional<Rollout>& r = read->first;
  return Reply(0, r.has_value() ? RolloutText(*r) : "no rollout", RolloutReplyJson(r));
}

proto::CtlReply Start(const FleetCtlContext& ctx, const std::vector<std::string>& args) {
  Result<FleetUpgradeArgs> parsed = ParseFleetUpgradeArgs(args);
  if (!parsed.ok()) return Refuse("upgrade", parsed.status());
  if (ctx.check_command) {
    // Resolved here, on the node batonctl asked: the nodes are meant to be alike.
    if (Status s = ctx.check_command(parsed->request.command); !s.ok()) {
      return Refuse("upgrade", s);
    }
  }
  Result<EtcdRange> listed = ctx.etcd->GetPrefix(FleetNodesPrefix(ctx.prefix));
  if (!listed.ok()) return Refuse("upgrade", listed.status());
  std::vector<std::string> nodes;
  for (const EtcdKeyValue& kv : listed->kvs) {
    Result<std::string> node = ListedFleetNode(FleetNodesPrefix(ctx.prefix), kv.key, kv.value);
    if (node.ok()) {
      nodes.push_back(std::move(*node));
    } else {
      BATON_LOG(WARN, "fleet") << "fleet upgrade: left out " << node.status().message();
    }
  }
  std::sort(nodes.begin(), nodes.end());
  if (nodes.empty()) {
    return Refuse("upgrade",
                  FailedPrecondition("no node is listed under " + FleetNodesPrefix(ctx.prefix)));
  }
  Result<std::pair<std::optional<Rollout>, int64_t>> read = ReadRollout(ctx);
  int64_t revision = 0;
  if (read.ok()) {
    revision = read->second;
    if (read->first.has_value() && !RolloutSettled(*read->first)) {
      return Refuse(
          "upgrade",
          FailedPrecondition("rollout " + read->first->id + " is " + ToString(read->first->state) +
                             " and not settled; abort it or wait for its end"));
    }
  } else if (read.status().code() == StatusCode::kInvalidArgument) {
    // A record no controller can read is replaced: read the revision to replace it.
    Result<std::optional<EtcdKeyValue>> kv = ctx.etcd->Get(FleetRolloutKey(ctx.prefix));
    if (!kv.ok()) return Refuse("upgrade", kv.status());
    revision = kv->has_value() ? (*kv)->mod_revision : 0;
  } else {
    return Refuse("upgrade", read.status());
  }
  const FleetUpgradeArgs& a = *parsed;
  Rollout r;
  r.created_ms = r.updated_ms = UnixMillisNow();
  Result<std::string> id = NewRolloutId(r.created_ms, ctx.node);
  if (!id.ok()) return Refuse("upgrade", id.status());
  r.id = std::move(*id);
  r.command = a.request.command;
  r.fraction = a.fraction.value_or(0);
  r.batch = a.fraction.has_value()
                ? BatchOfFraction(*a.fraction, nodes.size())
                : std::min<uint32_t>(a.batch.value_or(1), static_cast<uint32_t>(nodes.size()));
  r.keep_upgraded = a.keep_upgraded;
  if (a.request.steps.has_value()) r.steps = *a.request.steps;
  if (a.request.step_duration.has_value()) {
    r.step_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(*a.request.step_duration).count());
  }
  r.min_requests = a.request.min_requests.value_or(0);
  r.started_by = ctx.node;
  for (const std::string& n : nodes) r.nodes.push_back({.node = n, .since_ms = r.created_ms});
  if (Status s = PutNewRollout(ctx, r, revision); !s.ok()) return Refuse("upgrade", s);
  json j = RolloutReplyJson(r);
  j["command"] = "fleet upgrade";
  return Reply(0,
               "rollout " + r.id + " started over " + std::to_string(nodes.size()) + " nodes, " +
                   std::to_string(r.batch) + " at a time\n" + RolloutText(r),
               j);
}

// Reads the rollout, lets `change` refuse or change it, and writes it by compare-and-put,
// reading again on a conflict. A conflict may be this very write, applied by an etcd member
// that did not answer in time and found moved on when retried on another: a record read
// again that is what the write made counts as written.
proto::CtlReply Mutate(const FleetCtlContext& ctx, const std::string& what,
                       const std::function<Status(Rollout&)>& change) {
  std::optional<Rollout> tried;
  for (int attempt = 0; attempt < kCasTries; ++attempt) {
    Result<std::pair<std::optional<Rollout>, int64_t>> read = ReadRollout(ctx);
    if (!read.ok()) return Refuse(what, read.status());
    if (!read->first.has_value()) return Refuse(what, FailedPrecondition("there is no rollout"));
    Rollout r = *read->first;
    if (tried.has_value() && r == *tried) {
      json j = RolloutReplyJson(r);
      j["command"] = "fleet " + what;
      return Reply(0, RolloutText(r), j);
    }
    if (Status s = change(r); !s.ok()) return Refuse(what, s);
    r.updated_ms = UnixMillisNow();
    tried = r;
    Result<std::optional<int64_t>> put =
        ctx.etcd->CompareAndPut(FleetRolloutKey(ctx.prefix), RolloutRecord(r), read->second);
    if (!put.ok()) return Refuse(what, put.status());
    if (put->has_value()) {
      json j = RolloutReplyJson(r);
      j["command"] = "fleet " + what;
      return Reply(0, RolloutText(r), j);
    }
  }
  return Refuse(what, Unavailable("the rollout record kept changing; try again"));
}

Status Pause(const std::string& by, Rollout& r) {
  if (r.state != RolloutState::kRunning) {
    return FailedPrecondition("rollout " + r.id + " is " + ToString(r.state) + ", not running");
  }
  r.state = RolloutState::kPaused;
  r.reason = "paused by batonctl on " + by;
  return OkStatus();
}

Status Resume(Rollout& r) {
  if (r.state != RolloutState::kPaused) {
    return FailedPrecondition("rollout " + r.id + " is " + ToString(r.state) + ", not paused");
  }
  r.state = RolloutState::kRunning;
  r.reason.clear();
  return OkStatus();
}

Status Abort(const std::string& by, Rollout& r) {
  if (r.state != RolloutState::kRunning && r.state != RolloutState::kPaused) {
    return FailedPrecondition("rollout " + r.id + " is " + ToString(r.state) +
                              "; only a running or paused rollout is aborted");
  }
  r.state = RolloutState::kAborted;
  r.reason = "aborted by batonctl on " + by;
  const int64_t now = UnixMillisNow();
  for (NodeRollout& n : r.nodes) {
    if (n.state != NodeRolloutState::kUpgrading) continue;
    n.state = NodeRolloutState::kRollingBack;
    n.started = false;
    n.reason = "the rollout was aborted";
    n.since_ms = now;
  }
  return OkStatus();
}

}  // namespace

Result<std::string> NewRolloutId(int64_t created_ms, const std::string& node) {
  BATON_ASSIGN_OR_RETURN(std::string token, Supervisor::NewToken());
  return "rollout-" + std::to_string(created_ms) + "-" + node + "-" + token.substr(0, 8);
}

Status PutNewRollout(const FleetCtlContext& ctx, const Rollout& r, int64_t revision) {
  const std::string record = RolloutRecord(r);
  BATON_ASSIGN_OR_RETURN(std::optional<int64_t> put,
                         ctx.etcd->CompareAndPut(FleetRolloutKey(ctx.prefix), record, revision));
  if (!put.has_value()) {
    // A write retried on another etcd member finds the key moved on by its own first try: the
    // record there is then this one, its id (random bits in it) and its author the same, though
    // a node may have moved it on meanwhile. An id alone from before ids had random bits is no
    // proof: another batonctl's record may differ in nothing but who wrote it.
    Result<std::optional<EtcdKeyValue>> now = ctx.etcd->Get(FleetRolloutKey(ctx.prefix));
    Result<Rollout> there = now.ok() && now->has_value() ? ParseRolloutRecord((*now)->value)
                                                         : Result<Rollout>(NotFound("no record"));
    if (!there.ok() || there->id != r.id || there->started_by != r.started_by) {
      return FailedPrecondition(
          "the rollout record changed meanwhile (another batonctl?); look at `batonctl fleet "
          "rollout`");
    }
  }
  return OkStatus();
}

Result<FleetUpgradeArgs> ParseFleetUpgradeArgs(const std::vector<std::string>& args) {
  FleetUpgradeArgs out;
  std::vector<std::string> canary;  // what ParseUpgradeArgs reads
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      canary.insert(canary.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (a == "--keep-upgraded") {
      out.keep_upgraded = true;
    } else if (a == "--wait") {
      out.wait = true;
    } else if (a == "--batch" || a == "--fraction") {
      if (i + 1 >= args.size()) return InvalidArgument(a + " needs a value");
      if (out.batch.has_value() || out.fraction.has_value()) {
        return InvalidArgument("--batch and --fraction: one of them, once");
      }
      if (a == "--batch") {
        BATON_ASSIGN_OR_RETURN(out.batch, ParseBatch(args[++i]));
      } else {
        BATON_ASSIGN_OR_RETURN(out.fraction, ParseFraction(args[++i]));
      }
    } else {
      canary.push_back(a);
    }
  }
  BATON_ASSIGN_OR_RETURN(out.request, ParseUpgradeArgs(canary));
  return out;
}

Status CheckFleetArgs(const std::vector<std::string>& args) {
  if (args.empty()) {
    return InvalidArgument("fleet needs one of: status, rollout, upgrade, pause, resume, abort");
  }
  const std::string& what = args[0];
  if (what == "upgrade") {
    return ParseFleetUpgradeArgs({args.begin() + 1, args.end()}).status();
  }
  if (what == "status" || what == "rollout" || what == "pause" || what == "resume" ||
      what == "abort") {
    if (args.size() != 1) return InvalidArgument("fleet " + what + " takes no arguments");
    return OkStatus();
  }
  return InvalidArgument("unknown fleet command '" + what +
                         "' (status, rollout, upgrade, pause, resume, abort)");
}

proto::CtlReply HandleFleetCommand(const FleetCtlContext& ctx,
                                   const std::vector<std::string>& args) {
  if (Status s = CheckFleetArgs(args); !s.ok()) {
    return Reply(2, s.message(), {{"ok", false}, {"error", s.message()}});
  }
  const std::string& what = args[0];
  try {
    if (what == "status") return FleetStatusReply(*ctx.etcd, ctx.prefix);
    if (what == "rollout") return Show(ctx);
    if (what == "upgrade") return Start(ctx, {args.begin() + 1, args.end()});
    if (what == "pause") return Mutate(ctx, what, [&](Rollout& r) { return Pause(ctx.node, r); });
    if (what == "resume") return Mutate(ctx, what, [](Rollout& r) { return Resume(r); });
    return Mutate(ctx, what, [&](Rollout& r) { return Abort(ctx.node, r); });
  } catch (const std::exception& e) {
    return Refuse(what, Internal(e.what()));
  }
}

std::string RolloutText(const Rollout& r) {
  std::ostringstream out;
  out << "rollout " << r.id << ": " << ToString(r.state)
      << (RolloutSettled(r) || !RolloutEnded(r.state) ? "" : " (nodes still in flight)")
      << (r.reason.empty() ? "" : " (" + r.reason + ")") << "; " << r.batch << " at a time"
      << (r.keep_upgraded ? ", upgraded nodes kept on a rollback" : "") << "; " << Joined(r.command)
      << "\n";
  for (const NodeRollout& n : r.nodes) {
    out << "  " << n.node << ": " << ToString(n.state);
    if (!n.version.empty()) out << " (" << n.version << ")";
    if (!n.reason.empty()) out << " (" << n.reason << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace baton
