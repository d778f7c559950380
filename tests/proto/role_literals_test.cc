// Roles, promotion kinds, upgrade phases and outcomes, Hello's peer roles and drill kinds are
// enums (proto/roles.h, controller/core/upgrade_kind.h, controller/core/promotion.h,
// controller/core/drill_kind.h); their names appear only in the files that turn enums into
// text and back. This test reads the source tree and names, as file:line, every string
// literal that is one of those names anywhere else. Comments, raw strings and JSON keys
// ({"primary", ...}, j["canary"], j.contains("primary")) do not count. The names that are
// also everyday words of the code (log tags, batonctl's commands, a syscall's name: "engine",
// "controller", "drill", "kill", ...) count where they are a role's or a kind's value:
// compared with one (hello.role == "engine", kind != "kill") or given to one (.role = "cli").
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace baton {
namespace {

namespace fs = std::filesystem;

// Watched everywhere.
const std::set<std::string, std::less<>> kWatched = {
    // engine and launch roles, promotion kinds, upgrade outcomes
    "primary", "standby", "canary", "promoted", "rolled_back", "failover", "switchover",
    // upgrade phases (and "canary")
    "launching", "reclaiming", "promoting", "finishing", "rolling_back",
    // a peer role and a drill kind that are no other word of the code
    "cli", "hang"};
// Watched where they are a role's or a kind's value (IsRoleOrKindValue).
const std::set<std::string, std::less<>> kWatchedAsValues = {"engine",     "router",
                                                             "controller", "drill",   // peer roles
                                                             "kill",       "error"};  // drill kinds

// The folders scanned, and the files that convert enums to these names and back.
constexpr const char* kFolders[] = {"controller", "router", "standby", "fleet", "proto", "cuda"};
const std::set<std::string, std::less<>> kEdges = {
    "proto/roles.cc",                        // EngineRole, LaunchRole, PeerRole
    "proto/messages.cc",                     // ReattachRole
    "controller/core/promotion.cc",          // PromotionKind
    "controller/core/upgrade_kind.cc",       // UpgradeKind, UpgradePhase, UpgradeOutcome
    "controller/core/drill_kind.cc",         // DrillKind
    "controller/core/pair_state.cc",         // PairState, EngineState
    "controller/core/pool_ledger.cc",        // LedgerRole
    "controller/core/roster.cc",             // RosterRole, and the roster's JSON
    "controller/rollout/rollout_record.cc",  // RolloutState, NodeState
    "standby/sdk/engine_sdk.cc",             // SessionEventKind
};

char NextNonSpace(std::string_view text, size_t from) {
  while (from < text.size() && (text[from] == ' ' || text[from] == '\t')) ++from;
  return from < text.size() ? text[from] : '\0';
}

// Whether the literal that opens at `open` and closes at `close` is a JSON key.
bool IsJsonKey(std::string_view line, size_t open, size_t close) {
  size_t before = open;
  while (before > 0 && (line[before - 1] == ' ' || line[before - 1] == '\t')) --before;
  const char after = NextNonSpace(line, close + 1);
  if (before > 0 && (line[before - 1] == '{' || line[before - 1] == '[')) {
    return after == ',' || after == ']';
  }
  for (std::string_view call : {"contains(", "value(", "find(", "at("}) {
    if (before >= call.size() && line.substr(before - call.size(), call.size()) == call) {
      return after == ')' || after == ',';
    }
  }
  return false;
}

bool IsIdentifierChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Whether `name` (an identifier, or a member access such as hello.role) ends in a role or a
// kind: role, Role, kind, Kind.
bool NamesRoleOrKind(std::string_view name) {
  for (std::string_view end : {"role", "Role", "kind", "Kind"}) {
    if (name.size() >= end.size() && name.substr(name.size() - end.size()) == end) return true;
  }
  return false;
}

// Whether the literal that opens at `open` and closes at `close` is compared with, or given
// to, something named a role or a kind: x.role == "engine", "kill" != kind, .role = "router".
bool IsRoleOrKindValue(std::string_view line, size_t open, size_t close) {
  size_t end = open;
  while (end > 0 && (line[end - 1] == ' ' || line[end - 1] == '\t')) --end;
  if (end >= 1 && line[end - 1] == '=') {
    end -= end >= 2 && (line[end - 2] == '=' || line[end - 2] == '!') ? 2 : 1;
    while (end > 0 && (line[end - 1] == ' ' || line[end - 1] == '\t')) --end;
    size_t begin = end;
    while (begin > 0 && IsIdentifierChar(line[begin - 1])) --begin;
    if (NamesRoleOrKind(line.substr(begin, end - begin))) return true;
  }
  size_t from = close + 1;
  while (from < line.size() && (line[from] == ' ' || line[from] == '\t')) ++from;
  const std::string_view op = line.substr(from, 2);
  if (op != "==" && op != "!=") return false;
  from += 2;
  while (from < line.size() && (line[from] == ' ' || line[from] == '\t')) ++from;
  size_t to = from;
  while (to < line.size() &&
         (IsIdentifierChar(line[to]) || line[to] == '.' || line.substr(to, 2) == "->")) {
    to += line.substr(to, 2) == "->" ? 2 : 1;
  }
  return NamesRoleOrKind(line.substr(from, to - from));
}

// "path:line: "name"" for every watched literal in `text`, a file's contents.
std::vector<std::string> WatchedLiterals(const std::string& path, std::string_view text) {
  std::vector<std::string> found;
  bool in_block_comment = false;
  bool in_raw = false;
  int line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    ++line_no;
    for (size_t i = 0; i < line.size(); ++i) {
      if (in_block_comment || in_raw) {
        const std::string_view close = in_raw ? ")\"" : "*/";
        if (line.substr(i, 2) == close) {
          in_block_comment = in_raw = false;
          ++i;
        }
        continue;
      }
      if (line.substr(i, 2) == "//") break;
      if (line.substr(i, 2) == "/*") {
        in_block_comment = true;
        ++i;
      } else if (line.substr(i, 3) == "R\"(") {
        in_raw = true;
        i += 2;
      } else if (line[i] == '\'') {
        i += line.substr(i, 2) == "'\\" ? 3 : 2;  // a character literal: '"' is no string
      } else if (line[i] == '"') {
        size_t close = i + 1;
        while (close < line.size() && line[close] != '"') close += line[close] == '\\' ? 2 : 1;
        const std::string_view literal = line.substr(i + 1, std::min(close, line.size()) - i - 1);
        const bool watched =
            kWatched.count(literal) != 0 ||
            (kWatchedAsValues.count(literal) != 0 && IsRoleOrKindValue(line, i, close));
        if (watched && !IsJsonKey(line, i, close)) {
          found.push_back(path + ":" + std::to_string(line_no) + ": \"" + std::string(literal) +
                          "\"");
        }
        i = close;
      }
    }
    start = end + 1;
  }
  return found;
}

TEST(RoleLiteralsTest, FindsALiteralOnItsLine) {
  const std::string fixture =
      "// \"primary\" in a comment\n"
      "if (e.role == \"primary\") return;\n"
      "out << R\"({\"status\":\"standby\"})\";\n"
      "j = {{\"canary\", r.canary}, {\"role\", x}};\n"
      "if (u.contains(\"primary\")) use(u[\"primary\"]);\n"
      "EndUpgrade(\"rolled_back\", why);  /* \"failover\" */\n"
      "std::string m = \"a \\\"switchover\\\" in text\";\n";
  const std::vector<std::string> want = {"fixture.cc:2: \"primary\"",
                                         "fixture.cc:6: \"rolled_back\""};
  EXPECT_EQ(WatchedLiterals("fixture.cc", fixture), want);
}

TEST(RoleLiteralsTest, FindsPhasesPeerRolesAndDrillKinds) {
  const std::string fixture =
      "if (u->phase == \"finishing\") return;\n"
      "BATON_LOG(INFO, \"controller\") << \"drill \" << ToString(kind);\n"
      "if (hello.role == \"engine\") Attach();\n"
      "ClientHello(c, {.peer_name = \"drill-a\", .role = \"drill\"});\n"
      "if (cmd == \"drill\" || \"kill\" != args->kind) return;\n"
      "return ErrnoStatus(\"kill\", errno);\n"
      "j = {{\"error\", why}}; if (h.role != \"cli\") {}\n"
      "args.role = \"standby\"; Spin(\"hang\");\n";
  const std::vector<std::string> want = {"fixture.cc:1: \"finishing\"", "fixture.cc:3: \"engine\"",
                                         "fixture.cc:4: \"drill\"",     "fixture.cc:5: \"kill\"",
                                         "fixture.cc:7: \"cli\"",       "fixture.cc:8: \"standby\"",
                                         "fixture.cc:8: \"hang\""};
  EXPECT_EQ(WatchedLiterals("fixture.cc", fixture), want);
}

TEST(RoleLiteralsTest, RolesAreNamedOnlyWhereEnumsBecomeText) {
  const fs::path root = BATON_SOURCE_DIR;
  std::vector<std::string> found;
  size_t scanned = 0;
  for (const char* folder : kFolders) {
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      const std::string path = entry.path().lexically_relative(root).generic_string();
      if (kEdges.count(path) != 0) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      for (std::string& f : WatchedLiterals(path, text.str())) found.push_back(std::move(f));
      ++scanned;
    }
  }
  EXPECT_GT(scanned, 100u) << "the source tree was not found under " << root;
  std::string list;
  for (const std::string& f : found) list += "  " + f + "\n";
  EXPECT_TRUE(found.empty()) << "role, promotion, upgrade or drill names outside the edge "
                                "files (use the enum, or convert in an edge file):\n"
                             << list;
}

}  // namespace
}  // namespace baton
