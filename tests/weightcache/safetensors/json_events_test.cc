#include "weightcache/safetensors/json_events.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace baton {
namespace {

using Json = nlohmann::json;

// The DOM and the events are those of nlohmann's callback parser.
TEST(JsonEvents, SameDomAndEventsAsTheCallbackParser) {
  const std::string text =
      R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":"v"},)"
      R"("b":[[1,-2.5,true,null],{"x":{}}],"c":18446744073709551615})";
  std::vector<std::pair<int, std::string>> ours, theirs;
  auto record = [](std::vector<std::pair<int, std::string>>* out) {
    return [out](int depth, Json::parse_event_t e, Json& parsed) {
      if (e == Json::parse_event_t::key) out->emplace_back(depth, parsed.get<std::string>());
      if (e == Json::parse_event_t::object_start) out->emplace_back(depth, "{");
      if (e == Json::parse_event_t::array_start) out->emplace_back(depth, "[");
      return true;
    };
  };
  const Json mine = ParseJsonWithEvents(text, record(&ours));
  const Json reference = Json::parse(text, record(&theirs));
  EXPECT_EQ(mine, reference);
  EXPECT_EQ(ours, theirs);
}

TEST(JsonEvents, MalformedTextThrowsAParseError) {
  auto none = [](int, Json::parse_event_t, Json&) { return true; };
  EXPECT_THROW(ParseJsonWithEvents(R"({"a":)", none), Json::parse_error);
  EXPECT_THROW(ParseJsonWithEvents(R"({"a":1} x)", none), Json::parse_error);
  EXPECT_THROW(ParseJsonWithEvents("", none), Json::parse_error);
}

TEST(JsonEvents, ACallbackThrowStopsTheParse) {
  auto stop = [](int depth, Json::parse_event_t, Json&) -> bool {
    if (depth > 2) throw std::runtime_error("too deep");
    return true;
  };
  EXPECT_THROW(ParseJsonWithEvents("[[[[1]]]]", stop), std::runtime_error);
  EXPECT_NO_THROW(ParseJsonWithEvents("[[1]]", stop));
}

}  // namespace
}  // namespace baton
