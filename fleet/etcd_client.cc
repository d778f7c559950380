#include "fleet/etcd_client.h"

#include <charconv>

#include "base/text/base64.h"

namespace baton {
namespace {

using nlohmann::json;

// etcd's gateway writes int64 fields as strings ("42"), some as numbers; absent means 0.
Result<int64_t> Int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  return Internal(std::string("etcd answer: field ") + name + " is not an integer");
}

Result<std::string> BytesField(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Internal(std::string("etcd answer: field ") + name + " is not text");
  std::optional<std::string> bytes = Base64Decode(it->get_ref<const std::string&>());
  if (!bytes) return Internal(std::string("etcd answer: field ") + name + " is not base64");
  return *bytes;
}

Result<EtcdKeyValue> KeyValueOf(const json& j) {
  if (!j.is_object()) return Internal("etcd answer: a key-value is not an object");
  EtcdKeyValue kv;
  BATON_ASSIGN_OR_RETURN(kv.key, BytesField(j, "key"));
  BATON_ASSIGN_OR_RETURN(kv.value, BytesField(j, "value"));
  BATON_ASSIGN_OR_RETURN(kv.create_revision, Int64Field(j, "create_revision"));
  BATON_ASSIGN_OR_RETURN(kv.mod_revision, Int64Field(j, "mod_revision"));
  BATON_ASSIGN_OR_RETURN(kv.version, Int64Field(j, "version"));
  BATON_ASSIGN_OR_RETURN(kv.lease, Int64Field(j, "lease"));
  return kv;
}

Result<int64_t> HeaderRevision(const json& j) {
  auto it = j.find("header");
  if (it == j.end() || !it->is_object()) return Internal("etcd answer: no header");
  return Int64Field(*it, "revision");
}

Result<EtcdRange> ReadRange(const json& r) {
  EtcdRange out;
  BATON_ASSIGN_OR_RETURN(out.revision, HeaderRevision(r));
  if (auto it = r.find("kvs"); it != r.end()) {
    if (!it->is_array()) return Internal("etcd answer: kvs is not an array");
    for (const json& kv : *it) {
      BATON_ASSIGN_OR_RETURN(EtcdKeyValue v, KeyValueOf(kv));
      out.kvs.push_back(std::move(v));
    }
  }
  return out;
}

// `r`, an error naming where the answer came from (<endpoint><path>).
template <class T>
Result<T> At(const std::string& where, Result<T> r) {
  if (!r.ok()) return r.status().WithContext(where);
  return r;
}

}  // namespace

std::string EtcdPrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xFF) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::unique_ptr<JsonHttpClient>> members, int64_t range_page)
    : members_(std::move(members)), range_page_(range_page) {}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) return InvalidArgument("etcd: no endpoints");
  if (options.range_page < 1) return InvalidArgument("etcd: range_page must be at least 1");
  std::shared_ptr<TlsClientContext> tls;
  for (const std::string& e : options.endpoints) {
    if (options.tls.empty() && e.rfind("https://", 0) == 0) {
      return InvalidArgument("etcd: endpoint " + e +
                             ": https needs a CA file to verify the members' certificates");
    }
    if (!options.tls.empty() && e.rfind("http://", 0) == 0) {
      return InvalidArgument("etcd: endpoint " + e +
                             ": plain http while TLS is configured; every member is reached "
                             "with TLS (write https://)");
    }
  }
  if (!options.tls.empty()) {
    Result<std::shared_ptr<TlsClientContext>> context = TlsClientContext::Create(options.tls);
    if (!context.ok()) return context.status().WithContext("etcd");
    tls = std::move(*context);
  }
  std::vector<std::unique_ptr<JsonHttpClient>> members;
  for (const std::string& e : options.endpoints) {
    const std::string endpoint =
        tls != nullptr && e.find("://") == std::string::npos ? "https://" + e : e;
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<JsonHttpClient> c,
                           JsonHttpClient::Create(endpoint, options.timeout, tls));
    members.push_back(std::move(c));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(members), options.range_page));
}

std::string EtcdClient::endpoint() const {
  MutexLock lock(mu_);
  return members_[current_]->endpoint();
}

Result<EtcdClient::Answer> EtcdClient::Call(const std::string& path, const json& body) {
  MutexLock lock(mu_);
  Status last = OkStatus();
  for (size_t tried = 0; tried < members_.size(); ++tried) {
    const size_t i = (current_ + tried) % members_.size();
    Result<json> r = members_[i]->Post(path, body);
    if (r.ok()) {
      current_ = i;
      return Answer{.body = std::move(*r), .where = members_[i]->endpoint() + path};
    }
    // Unavailable: unreachable, no JSON, HTTP 429 or 5xx (JsonHttpClient): try the next.
    if (r.status().code() != StatusCode::kUnavailable &&
        r.status().code() != StatusCode::kDeadlineExceeded) {
      return r.status();
    }
    last = r.status();
  }
  return Unavailable("etcd: no endpoint answered; last: " + last.message());
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/kv/put", body));
  return At(a.where, HeaderRevision(a.body));
}

Result<EtcdRange> EtcdClient::Range(json body) {
  BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/kv/range", body));
  return At(a.where, ReadRange(a.body));
}

Result<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) {
  BATON_ASSIGN_OR_RETURN(EtcdRange r, Range({{"key", Base64Encode(key)}}));
  if (r.kvs.empty()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(std::move(r.kvs.front()));
}

Result<EtcdRange> EtcdClient::GetPrefix(std::string_view prefix) {
  const std::string end = Base64Encode(EtcdPrefixEnd(prefix));
  EtcdRange all;
  std::string from(prefix);
  for (;;) {
    json body = {
        {"key", Base64Encode(from)}, {"range_end", end}, {"limit", std::to_string(range_page_)}};
    if (all.revision != 0) body["revision"] = std::to_string(all.revision);
    BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/kv/range", body));
    BATON_ASSIGN_OR_RETURN(EtcdRange page, At(a.where, ReadRange(a.body)));
    if (all.revision == 0) all.revision = page.revision;
    // proto3 JSON leaves a false `more` out.
    auto more = a.body.find("more");
    const bool last = more == a.body.end() || !more->is_boolean() || !more->get<bool>();
    if (!last && (page.kvs.empty() || page.kvs.back().key < from)) {
      return Internal(a.where + ": etcd answer: more keys, but the page does not move on");
    }
    for (EtcdKeyValue& kv : page.kvs) all.kvs.push_back(std::move(kv));
    if (last) return all;
    from = all.kvs.back().key + '\0';  // the next key after the page's last
  }
}

Result<int64_t> EtcdClient::Delete(std::string_view key) {
  BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/kv/deleterange", {{"key", Base64Encode(key)}}));
  return At(a.where, Int64Field(a.body, "deleted"));
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  BATON_ASSIGN_OR_RETURN(
      Answer a, Call("/v3/kv/deleterange", {{"key", Base64Encode(prefix)},
                                            {"range_end", Base64Encode(EtcdPrefixEnd(prefix))}}));
  return At(a.where, Int64Field(a.body, "deleted"));
}

Result<EtcdClient::Answer> EtcdClient::Txn(std::string_view key, int64_t mod_revision, json then) {
  if (mod_revision < 0) return InvalidArgument("etcd txn: a mod revision is never negative");
  const json body = {{"compare", json::array({{{"key", Base64Encode(key)},
                                               {"target", "MOD"},
                                               {"result", "EQUAL"},
                                               {"mod_revision", std::to_string(mod_revision)}}})},
                     {"success", json::array({std::move(then)})},
                     {"failure", json::array()}};
  return Call("/v3/kv/txn", body);
}

Result<std::optional<int64_t>> EtcdClient::CompareAndPut(std::string_view key,
                                                         std::string_view value,
                                                         int64_t expected_mod_revision,
                                                         int64_t lease) {
  json put = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  BATON_ASSIGN_OR_RETURN(Answer a, Txn(key, expected_mod_revision, {{"request_put", put}}));
  // proto3 JSON leaves a false `succeeded` out.
  auto ok = a.body.find("succeeded");
  if (ok == a.body.end() || !ok->is_boolean() || !ok->get<bool>()) {
    return std::optional<int64_t>();
  }
  BATON_ASSIGN_OR_RETURN(int64_t revision, At(a.where, HeaderRevision(a.body)));
  return std::optional<int64_t>(revision);
}

Result<bool> EtcdClient::CompareAndDelete(std::string_view key, int64_t expected_mod_revision) {
  if (expected_mod_revision == 0) return false;  // a key that does not exist is not deleted
  BATON_ASSIGN_OR_RETURN(Answer a, Txn(key, expected_mod_revision,
                                       {{"request_delete_range", {{"key", Base64Encode(key)}}}}));
  auto ok = a.body.find("succeeded");
  return ok != a.body.end() && ok->is_boolean() && ok->get<bool>();
}

Result<int64_t> EtcdClient::GrantLease(std::chrono::seconds ttl) {
  if (ttl.count() < 1) return InvalidArgument("etcd lease: the TTL must be at least 1 s");
  BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}}));
  const json& r = a.body;
  if (r.contains("error") && r["error"].is_string() && !r["error"].get<std::string>().empty()) {
    return FailedPrecondition(a.where + ": etcd lease grant: " + r["error"].get<std::string>());
  }
  BATON_ASSIGN_OR_RETURN(int64_t id, At(a.where, Int64Field(r, "ID")));
  if (id == 0) return Internal(a.where + ": etcd lease grant: no lease id in the answer");
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  BATON_ASSIGN_OR_RETURN(Answer a, Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}));
  auto it = a.body.find("result");
  if (it == a.body.end() || !it->is_object()) {
    return Internal(a.where + ": etcd keepalive: no result");
  }
  BATON_ASSIGN_OR_RETURN(int64_t ttl, At(a.where, Int64Field(*it, "TTL")));
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status EtcdClient::RevokeLease(int64_t lease) {
  return Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}).status();
}

}  // namespace baton
