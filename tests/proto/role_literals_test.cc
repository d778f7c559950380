// Roles, promotion kinds and upgrade outcomes are enums (proto/roles.h,
// controller/core/upgrade_kind.h, controller/core/promotion.h); their names appear only in the
// files that turn enums into text and back. This test reads the source tree and names, as
// file:line, every string literal that is one of those names anywhere else. Comments, raw
// strings and JSON keys ({"primary", ...}, j["canary"], j.contains("primary")) do not count.
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

const std::set<std::string, std::less<>> kWatched = {
    "primary", "standby", "canary", "promoted", "rolled_back", "failover", "switchover"};

// The folders scanned, and the files that convert enums to these names and back.
constexpr const char* kFolders[] = {"controller", "router", "standby", "fleet", "proto"};
const std::set<std::string, std::less<>> kEdges = {
    "proto/roles.cc",                        // EngineRole, LaunchRole
    "proto/messages.cc",                     // ReattachRole
    "controller/core/promotion.cc",          // PromotionKind
    "controller/core/upgrade_kind.cc",       // UpgradeKind, UpgradeOutcome
    "controller/core/upgrade.cc",            // Upgrade::Phase
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
        if (kWatched.count(literal) != 0 && !IsJsonKey(line, i, close)) {
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
  EXPECT_TRUE(found.empty()) << "role, promotion or upgrade names outside the edge files "
                                "(use the enum, or convert in an edge file):\n"
                             << list;
}

}  // namespace
}  // namespace baton
