// A Redis Cluster of three masters for the Redis tier's cluster tests
// (test_redis_cluster.cpp): three redis-servers (redis_server.h) with
// --cluster-enabled yes, each in a scratch directory of its own (its
// nodes.conf), on free loopback ports for clients and for the cluster bus;
// the slots are assigned here (CLUSTER ADDSLOTSRANGE, CLUSTER MEET) as
// `redis-cli --cluster create` would, and a start waits until every node says
// cluster_state:ok. Slot migrations (CLUSTER SETSLOT, MIGRATE) are done by
// hand, so that a test can stop half way (ASK) or finish one (MOVED).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "redis_server.h"

namespace pqrt {

class RedisCluster {
 public:
  static constexpr int kMasters = 3;
  static constexpr int kSlots = 16384;

  RedisCluster() = default;
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Starts the three nodes, assigns node i the slots [i * 16384 / 3,
  // (i + 1) * 16384 / 3), introduces them and waits for cluster_state:ok.
  // Returns "" or why not. The servers' destructors kill them (also when a
  // test fails half way).
  std::string start() {
    for (int i = 0; i < kMasters; ++i) {
      std::string why;
      for (int attempt = 0; attempt < 3; ++attempt) {  // the bus port may be taken meanwhile
        bus_[i] = free_port();
        nodes_[i].set_extra_args({"--cluster-enabled", "yes", "--cluster-config-file",
                                  "nodes.conf", "--cluster-node-timeout", "5000",
                                  "--cluster-port", std::to_string(bus_[i])});
        why = nodes_[i].start();
        if (why.empty() || why.find("not installed") != std::string::npos) break;
      }
      if (!why.empty()) return why;
    }
    for (int i = 0; i < kMasters; ++i) {
      const std::string first = std::to_string(i * kSlots / kMasters);
      const std::string last = std::to_string((i + 1) * kSlots / kMasters - 1);
      const std::string added = run(i, {"CLUSTER", "ADDSLOTSRANGE", first, last});
      if (added != "+OK") return "CLUSTER ADDSLOTSRANGE on node " + std::to_string(i) + ": " + added;
      ids_[i] = run(i, {"CLUSTER", "MYID"});
    }
    for (int i = 1; i < kMasters; ++i) {
      const std::string met = run(0, {"CLUSTER", "MEET", "127.0.0.1", std::to_string(port(i)),
                                      std::to_string(bus_[i])});
      if (met != "+OK") return "CLUSTER MEET of node " + std::to_string(i) + ": " + met;
    }
    return wait_ok();
  }

  // Node i's client port, its node id, and the node whose slot range holds
  // `slot` (as start assigned them).
  int port(int i) const { return nodes_[i].port(); }
  const std::string& id(int i) const { return ids_[i]; }
  static int node_of_slot(int slot) { return slot * kMasters / kSlots; }
  RedisServer& server(int i) { return nodes_[i]; }

  // The slot of a key name, as node 0 computes it (CLUSTER KEYSLOT), so that
  // the tests do not trust the library's own hash.
  int key_slot(const std::string& name) {
    const std::string reply = run(0, {"CLUSTER", "KEYSLOT", name});
    return reply.size() > 1 && reply[0] == ':' ? std::stoi(reply.substr(1)) : -1;
  }

  // A command on node i through a connection of the test's own.
  std::string run(int i, const std::vector<std::string>& args) {
    RawRedis raw(port(i));
    return raw.ok() ? raw.run(args) : "(cannot connect to node " + std::to_string(i) + ")";
  }

  // The same, preceded by ASKING: node i answers for a slot it is importing.
  std::string run_asking(int i, const std::vector<std::string>& args) {
    RawRedis raw(port(i));
    if (!raw.ok()) return "(cannot connect to node " + std::to_string(i) + ")";
    const std::string asking = raw.run({"ASKING"});
    return asking == "+OK" ? raw.run(args) : "ASKING: " + asking;
  }

  // Kills node i (SIGKILL, as a crash).
  void kill(int i) { nodes_[i].stop(); }

  // Starts node i again on its ports and directory: it reads its nodes.conf
  // and rejoins with its slots, empty (no persistence). Waits for ok.
  std::string restart(int i) {
    const std::string why = nodes_[i].start(port(i));
    return why.empty() ? wait_ok() : why;
  }

  // Slot migration by hand, in redis-cli --cluster reshard's steps:
  // IMPORTING on the target, MIGRATING on the source ...
  std::string begin_migration(int slot, int from, int to) {
    const std::string s = std::to_string(slot);
    std::string a = run(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", ids_[from]});
    std::string b = run(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", ids_[to]});
    return a == "+OK" && b == "+OK" ? "" : "CLUSTER SETSLOT: " + a + " / " + b;
  }
  // ... MIGRATE of some keys from the source to the target ...
  std::string migrate_keys(int from, int to, const std::vector<std::string>& keys) {
    std::vector<std::string> args = {"MIGRATE", "127.0.0.1", std::to_string(port(to)), "", "0",
                                     "5000", "KEYS"};
    args.insert(args.end(), keys.begin(), keys.end());
    const std::string r = run(from, args);
    return r == "+OK" ? "" : "MIGRATE: " + r;
  }
  // ... and the slot given to the target on every node.
  std::string end_migration(int slot, int to) {
    for (int i = 0; i < kMasters; ++i) {
      const std::string r = run(i, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", ids_[to]});
      if (r != "+OK") return "CLUSTER SETSLOT NODE on node " + std::to_string(i) + ": " + r;
    }
    return "";
  }
  // The key names in a slot on node i (CLUSTER GETKEYSINSLOT).
  std::vector<std::string> keys_in_slot(int i, int slot) {
    RawRedis raw(port(i));
    std::vector<std::string> out;
    if (!raw.ok()) return out;
    const std::string s = std::to_string(slot);
    const char* argv[] = {"CLUSTER", "GETKEYSINSLOT", s.c_str(), "100000"};
    auto* r = static_cast<redisReply*>(redisCommandArgv(raw.get(), 4, argv, nullptr));
    if (r != nullptr && r->type == REDIS_REPLY_ARRAY)
      for (size_t k = 0; k < r->elements; ++k)
        out.emplace_back(r->element[k]->str, r->element[k]->len);
    if (r) freeReplyObject(r);
    return out;
  }

  // Waits until every node says cluster_state:ok and knows all three.
  std::string wait_ok() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      bool ok = true;
      for (int i = 0; i < kMasters && ok; ++i) {
        last = run(i, {"CLUSTER", "INFO"});
        ok = last.find("cluster_state:ok") != std::string::npos &&
             last.find("cluster_known_nodes:3") != std::string::npos &&
             last.find("cluster_slots_ok:16384") != std::string::npos;
      }
      if (ok) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "the cluster did not reach cluster_state:ok within 30 s; last CLUSTER INFO: " + last;
  }

 private:
  RedisServer nodes_[kMasters];
  int bus_[kMasters] = {};
  std::string ids_[kMasters];
};

}  // namespace pqrt
