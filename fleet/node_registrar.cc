#include "fleet/node_registrar.h"

#include <algorithm>

#include "base/log.h"

namespace baton {
namespace {

constexpr const char* kLog = "fleet";
constexpr std::chrono::milliseconds kRetry{200};

std::chrono::seconds LeaseSeconds(std::chrono::milliseconds ttl) {
  return std::chrono::seconds(std::max<int64_t>(1, (ttl.count() + 999) / 1000));
}

}  // namespace

NodeRegistrar::NodeRegistrar(EtcdClient* etcd, NodeRegistrarOptions options)
    : etcd_(etcd), options_(std::move(options)), thread_([this] { Run(); }) {}

NodeRegistrar::~NodeRegistrar() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  thread_.join();
}

void NodeRegistrar::Publish(std::string record) {
  {
    MutexLock lock(mu_);
    record_ = std::move(record);
    has_record_ = true;
    record_written_ = false;
    published_ = true;
  }
  wake_.NotifyAll();
}

NodeRegistration NodeRegistrar::state() const {
  MutexLock lock(mu_);
  return state_;
}

void NodeRegistrar::Failed(const Status& status) {
  MutexLock lock(mu_);
  ++state_.failures;
  if (state_.last_error.empty()) {
    BATON_LOG(WARN, kLog) << options_.key << ": etcd: " << status.ToString();
  }
  state_.last_error = status.ToString();
}

std::chrono::milliseconds NodeRegistrar::Round() {
  MutexLock lock(mu_);
  published_ = false;
  if (!has_record_) return options_.ttl;
  int64_t lease = state_.lease;
  lock.Unlock();
  // The next renewal is due a third of the lease's TTL after this one starts, however long
  // this round's calls take (a slow etcd): not a third after the round's end.
  const auto started = std::chrono::steady_clock::now();
  std::chrono::milliseconds renew_every = options_.ttl / 3;
  const auto until_next = [&] {
    const auto left = started + renew_every - std::chrono::steady_clock::now();
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(left));
  };
  if (lease == 0) {
    Result<int64_t> granted = etcd_->GrantLease(LeaseSeconds(options_.ttl));
    if (!granted.ok()) {
      Failed(granted.status());
      return kRetry;
    }
    lease = *granted;
    lock.Lock();
    state_.lease = lease;
    ++state_.leases;
    record_written_ = false;
    lock.Unlock();
  } else if (Result<int64_t> ttl = etcd_->KeepAlive(lease); !ttl.ok()) {
    Failed(ttl.status());
    if (ttl.status().code() == StatusCode::kNotFound) {  // expired: register again
      BATON_LOG(WARN, kLog) << options_.key << ": lease " << lease << " lost; registering again";
      lock.Lock();
      state_.lease = 0;
      state_.registered = false;
    }
    return kRetry;
  } else {
    // Never later than a third of the TTL etcd says the lease has now.
    renew_every = std::min(renew_every, std::chrono::milliseconds(*ttl * 1000 / 3));
  }
  if (!CheckKey(lease)) return until_next();
  lock.Lock();
  if (!record_written_) {
    const std::string record = record_;
    lock.Unlock();
    Result<int64_t> put = etcd_->Put(options_.key, record, lease);
    if (!put.ok()) {
      Failed(put.status());
      return kRetry;
    }
    lock.Lock();
    record_written_ = record == record_;
    ++state_.writes;
    if (!state_.registered) {
      BATON_LOG(INFO, kLog) << options_.key << ": registered under lease " << lease << " (TTL "
                            << LeaseSeconds(options_.ttl).count() << " s)";
    }
    state_.registered = true;
  }
  if (!state_.last_error.empty()) {
    BATON_LOG(INFO, kLog) << options_.key << ": etcd answers again";
    state_.last_error.clear();
  }
  return record_written_ ? until_next() : std::chrono::milliseconds(0);
}

bool NodeRegistrar::CheckKey(int64_t lease) {
  {
    MutexLock lock(mu_);
    if (!record_written_) return true;  // written below, whoever holds the key now
  }
  Result<std::optional<EtcdKeyValue>> kv = etcd_->Get(options_.key);
  if (!kv.ok()) {
    Failed(kv.status());
    return true;  // the lease is renewed: the record stands as far as this node can tell
  }
  if (kv->has_value() && (*kv)->lease == 0) {
    // Written without a lease (by hand, a tool): no controller's, and it would never expire.
    // Replaced by compare-and-put on the revision read; a key that moved on meanwhile is read
    // again at the next renewal.
    std::string record;
    {
      MutexLock lock(mu_);
      record = record_;
    }
    Result<std::optional<int64_t>> put =
        etcd_->CompareAndPut(options_.key, record, (*kv)->mod_revision, lease);
    if (!put.ok()) Failed(put.status());
    if (!put.ok() || !put->has_value()) return true;
    MutexLock lock(mu_);
    BATON_LOG(WARN, kLog) << options_.key << ": replaced a record written without a lease (mod "
                          << "revision " << (*kv)->mod_revision << ": "
                          << (*kv)->value.substr(0, 120) << ") by this node's, lease " << lease;
    record_written_ = record == record_;
    ++state_.writes;
    state_.conflict.clear();
    state_.registered = true;
    return true;
  }
  MutexLock lock(mu_);
  if (!kv->has_value()) {
    // Deleted by hand, or with the lease of another writer of this key that then ended.
    BATON_LOG(WARN, kLog) << options_.key << ": the record was deleted; writing it again";
    state_.conflict.clear();
    record_written_ = false;
    state_.registered = false;
    return true;
  }
  if ((*kv)->lease == lease) {
    if (!state_.conflict.empty()) {
      BATON_LOG(INFO, kLog) << options_.key << ": the key is this node's again";
      state_.conflict.clear();
    }
    return true;
  }
  // Another process wrote the key with its own lease: two controllers share a fleet.node.
  // Writing it back would have the two take turns; this one waits until the key is free.
  const std::string conflict = "the key is held by lease " + std::to_string((*kv)->lease) +
                               ", not this node's " + std::to_string(lease) +
                               ": another controller uses the same fleet.node";
  if (state_.conflict.empty()) BATON_LOG(ERROR, kLog) << options_.key << ": " << conflict;
  state_.conflict = conflict;
  state_.registered = false;
  return false;
}

void NodeRegistrar::Run() {
  MutexLock lock(mu_);
  while (!stop_) {
    lock.Unlock();
    const std::chrono::milliseconds wait = Round();
    lock.Lock();
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!stop_ && !published_) {
      if (wake_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
    }
  }
}

}  // namespace baton
