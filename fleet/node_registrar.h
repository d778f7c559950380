// NodeRegistrar: keeps one key of a node in etcd, under a lease, for as long as the node
// lives (docs/fleet.md). It grants a lease of `ttl`, writes the node's latest record under
// the key with it, and renews the lease every ttl/3. When the lease is lost (etcd expired it
// while this node could not reach etcd, or it was revoked) it grants a new one and writes the
// record again; when etcd cannot be reached it keeps trying and changes nothing else: a node
// is never stopped for lack of etcd. A new record (Publish) is written at once. After each
// renewal the key is read back: a record deleted (by hand, or by the lease of another writer
// of the same key ending) is written again; one that another writer's lease holds (two
// controllers with one fleet.node) is left to it, reported as a conflict, until it is free.
//
// The lease is not revoked when the registrar ends: the node's engines outlive its
// controller, so its record stays until the TTL runs out, and a restarted controller writes
// it again under a new lease.
//
// Thread: its own; Publish() and state() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "fleet/etcd_client.h"

namespace baton {

struct NodeRegistrarOptions {
  std::string key;                      // e.g. "/baton/nodes/node-a"
  std::chrono::milliseconds ttl{2000};  // the lease (etcd counts whole seconds, at least 1)
};

struct NodeRegistration {
  bool registered = false;  // the latest record is in etcd under a live lease
  int64_t lease = 0;
  uint64_t writes = 0;     // records written
  uint64_t leases = 0;     // leases granted (more than one: a lease was lost)
  uint64_t failures = 0;   // calls to etcd that failed
  std::string last_error;  // of the latest failure ("" once a call succeeds again)
  // Set while another writer's lease holds the key (two controllers with one fleet.node):
  // not registered until the key is free again.
  std::string conflict;
};

class NodeRegistrar {
 public:
  NodeRegistrar(EtcdClient* etcd, NodeRegistrarOptions options);
  ~NodeRegistrar();
  NodeRegistrar(const NodeRegistrar&) = delete;
  NodeRegistrar& operator=(const NodeRegistrar&) = delete;

  // The record to keep under the key (replaces the previous one).
  void Publish(std::string record);
  NodeRegistration state() const;

 private:
  void Run();
  // One round: lease, record, renewal. Returns how long to wait before the next.
  std::chrono::milliseconds Round();
  // After a renewal, whether the record written under `lease` is still there: a key deleted
  // is written again (true, record_written_ cleared); one another writer's lease holds is
  // left to it (false: the conflict is reported and the node is not registered).
  bool CheckKey(int64_t lease);
  void Failed(const Status& status);

  EtcdClient* etcd_;
  const NodeRegistrarOptions options_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stop_ BATON_GUARDED_BY(mu_) = false;
  std::string record_ BATON_GUARDED_BY(mu_);
  bool record_written_ BATON_GUARDED_BY(mu_) = false;  // record_ is in etcd under lease_
  bool has_record_ BATON_GUARDED_BY(mu_) = false;
  bool published_ BATON_GUARDED_BY(mu_) = false;  // a record came since the round began
  NodeRegistration state_ BATON_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace baton
