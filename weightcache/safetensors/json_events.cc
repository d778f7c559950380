#include "weightcache/safetensors/json_events.h"

#include <string>
#include <utility>
#include <vector>

namespace baton {
namespace {

using Json = nlohmann::json;

// A SAX handler that builds the DOM; containers being filled are kept on a stack. A pointer
// into an array stays valid while it is on the stack: the array grows only once it is popped.
class DomBuilder {
 public:
  DomBuilder(Json* root, const JsonEventCallback& on_event) : root_(root), on_event_(on_event) {}

  bool null() { return Add(Json(nullptr)); }
  bool boolean(bool v) { return Add(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Add(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Add(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return Add(Json(v)); }
  bool string(Json::string_t& v) { return Add(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return Add(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return Open(Json::value_t::object, Event::object_start); }
  bool start_array(std::size_t) { return Open(Json::value_t::array, Event::array_start); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(Json::string_t& k) {
    Json parsed(k);
    on_event_(static_cast<int>(stack_.size()), Event::key, parsed);
    key_ = std::move(k);
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& ex) {
    throw ex;
  }

 private:
  using Event = Json::parse_event_t;

  Json* Place(Json v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool Add(Json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(Json::value_t type, Event event) {
    Json none;
    on_event_(static_cast<int>(stack_.size()), event, none);
    stack_.push_back(Place(Json(type)));
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  Json* root_;
  const JsonEventCallback& on_event_;
  std::vector<Json*> stack_;
  std::string key_;
};

}  // namespace

Json ParseJsonWithEvents(std::string_view text, const JsonEventCallback& on_event) {
  Json root;
  DomBuilder builder(&root, on_event);
  Json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

}  // namespace baton
