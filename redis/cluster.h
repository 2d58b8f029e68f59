// Redis Cluster for libpqcache_redis (cluster.cpp): the hash slot of a key,
// the slot map read with CLUSTER SLOTS, the routing of an operation to the
// node that serves its key's slot, and the MOVED and ASK redirects. A
// connection made by pq_redis_connect has no Cluster and routes every
// command to its one server, as before.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "connection.h"

namespace pqr {

constexpr int kSlots = 16384;
// A command is sent again at most this often after MOVED or ASK; more means
// the slot map keeps changing under us (or a node points at itself).
constexpr int kMaxRedirects = 5;

// The slot of a key name: CRC-16/XMODEM of its hash tag (the bytes between
// the first '{' and the next '}', when not empty) or of the whole name,
// modulo 16384, as Redis Cluster computes it.
uint16_t key_slot(const std::string& name);

// The name a stored state's keys start with: the user's key in single-server
// mode, "{key}" in cluster mode, so that the manifest and every block hash to
// one slot and a transfer runs on one node (docs/redis.md, "Redis Cluster").
std::string stored_name(const pq_redis& r, const std::string& key);

// The nodes and who serves which slot.
struct Cluster {
  // Every node met so far (the seed, CLUSTER SLOTS, redirects). Nodes are
  // never freed before the connection, so a pipeline's Node* stays valid.
  std::vector<std::unique_ptr<Node>> nodes;
  std::array<Node*, kSlots> owner{};  // null: no node serves the slot
  bool stale = true;                  // read CLUSTER SLOTS before the next operation
  std::string map_from;               // the node whose CLUSTER SLOTS the map is

  Node& node(const std::string& host, int port);
};

// Reads the slot map from the first node that answers CLUSTER SLOTS (those
// connected first). PQ_ERR_BACKEND when none does; a server without cluster
// support says so.
void refresh_slots(pq_redis& r);

// Points r.node at the node whose slot holds `name` (single-server mode: the
// server), connected. Reads the slot map first when it is stale.
void route(pq_redis& r, const std::string& name);

// A MOVED or ASK error reply: where the slot is (MOVED) or where this one
// command should go (ASK).
struct Redirect {
  bool ask = false;
  int slot = 0;
  std::string host;
  int port = 0;
  std::string text;  // the reply, for messages
};
bool parse_redirect(const redisReply* reply, const std::string& replier_host, Redirect* out);

// `reply`, the answer of `from` to `args`, when it redirects: sends the
// command where it says (ASK: preceded by ASKING; MOVED: the slot's owner is
// updated, r.node follows and the map is read again before the next
// operation), up to kMaxRedirects times, and returns the last reply, which
// may be an error reply still; still a redirect after that: PQ_ERR_BACKEND. `busy`: a node with replies outstanding in
// the caller's pipeline, to which nothing may be sent (PQ_ERR_BACKEND).
Reply follow_redirects(pq_redis& r, Node& from, Reply reply, const std::vector<Arg>& args,
                       const std::string& doing, const Node* busy);

}  // namespace pqr
