// Redis Cluster for libpqcache_redis (cluster.h): hash slots, the slot map
// from CLUSTER SLOTS, routing, and MOVED/ASK. Written here rather than taken
// from hiredis-cluster, which Debian does not package (docs/redis.md says
// why): what the tier needs is one slot per operation, so this is a slot
// table, a CRC-16 and the two redirects.
#include "cluster.h"

#include <cstdlib>

#include "internal.h"

namespace pqr {

namespace {

// CRC-16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's key hash.
uint16_t crc16(const char* p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    crc = static_cast<uint16_t>(crc ^ (static_cast<uint8_t>(p[i]) << 8));
    for (int bit = 0; bit < 8; ++bit)
      crc = static_cast<uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

std::string reply_text(const redisReply* reply) {
  return std::string(reply->str, static_cast<size_t>(reply->len));
}

[[noreturn]] void bad_slots_reply(const Node& n, const std::string& why) {
  fail(PQ_ERR_BACKEND, "redis at " + n.where() + ": CLUSTER SLOTS: unexpected reply (" + why + ")");
}

// The slot map of a CLUSTER SLOTS reply from n: entries [first, last,
// [host, port, id, ...], replicas ...]; an empty host is n's own.
std::array<Node*, kSlots> parse_slots(Cluster& cl, const Node& n, const redisReply* reply) {
  if (reply->type != REDIS_REPLY_ARRAY) bad_slots_reply(n, "not an array");
  std::array<Node*, kSlots> owner{};
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER)
      bad_slots_reply(n, "entry " + std::to_string(i) + " is not [first, last, master, ...]");
    const long long first = e->element[0]->integer, last = e->element[1]->integer;
    if (first < 0 || last < first || last >= kSlots)
      bad_slots_reply(n, "slots " + std::to_string(first) + "-" + std::to_string(last));
    const redisReply* master = e->element[2];
    if (master->type != REDIS_REPLY_ARRAY || master->elements < 2 ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER || master->element[1]->integer < 1 ||
        master->element[1]->integer > 65535)
      bad_slots_reply(n, "the master of entry " + std::to_string(i) + " is not [host, port, ...]");
    std::string host = reply_text(master->element[0]);
    if (host.empty() || host == "?") host = n.host;  // the node does not know its address
    Node& at = cl.node(host, static_cast<int>(master->element[1]->integer));
    for (long long s = first; s <= last; ++s) owner[static_cast<size_t>(s)] = &at;
  }
  return owner;
}

}  // namespace

uint16_t key_slot(const std::string& name) {
  const size_t open = name.find('{');
  if (open != std::string::npos) {
    const size_t close = name.find('}', open + 1);
    if (close != std::string::npos && close > open + 1)
      return crc16(name.data() + open + 1, close - open - 1) % kSlots;
  }
  return crc16(name.data(), name.size()) % kSlots;
}

std::string stored_name(const pq_redis& r, const std::string& key) {
  return r.cluster ? "{" + key + "}" : key;
}

Node& Cluster::node(const std::string& host, int port) {
  for (auto& n : nodes)
    if (n->host == host && n->port == port) return *n;
  nodes.push_back(std::make_unique<Node>());
  nodes.back()->host = host;
  nodes.back()->port = port;
  return *nodes.back();
}

void refresh_slots(pq_redis& r) {
  Cluster& cl = *r.cluster;
  // Connected nodes first: no connect to a node that may be gone.
  std::vector<Node*> order;
  for (auto& n : cl.nodes)
    if (n->c != nullptr) order.push_back(n.get());
  for (auto& n : cl.nodes)
    if (n->c == nullptr) order.push_back(n.get());
  std::string tried;
  for (Node* n : order) {
    try {
      Reply reply = send_to(r, *n, {"CLUSTER", "SLOTS"}, "CLUSTER SLOTS");
      if (reply->type == REDIS_REPLY_ERROR) {
        const std::string text = reply_text(reply.get());
        fail(PQ_ERR_BACKEND,
             "redis at " + n->where() + ": CLUSTER SLOTS: the server answered \"" + text + "\"" +
                 (text.find("cluster support disabled") != std::string::npos
                      ? " (not a Redis Cluster node: connect to it with pq_redis_connect)"
                      : ""));
      }
      cl.owner = parse_slots(cl, *n, reply.get());
      cl.stale = false;
      cl.map_from = n->where();
      return;
    } catch (const Error& e) {
      if (e.status() != PQ_ERR_BACKEND) throw;
      tried += (tried.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  fail(PQ_ERR_BACKEND, "no node of the Redis Cluster answered CLUSTER SLOTS: " + tried);
}

void route(pq_redis& r, const std::string& name) {
  if (!r.cluster) {
    r.node = &r.server;
    ensure_connected(r, r.server);
    return;
  }
  Cluster& cl = *r.cluster;
  if (cl.stale) refresh_slots(r);
  const uint16_t slot = key_slot(name);
  Node* owner = cl.owner[slot];
  if (owner == nullptr)
    fail(PQ_ERR_BACKEND, "no node of the Redis Cluster serves slot " + std::to_string(slot) +
                             " (key \"" + name + "\"; slot map from " + cl.map_from + ")");
  r.node = owner;
  try {
    ensure_connected(r, *owner);
  } catch (const Error& e) {
    fail(e.status(), std::string(e.what()) + " (the node that serves slot " +
                         std::to_string(slot) + ", key \"" + name + "\", in the slot map from " +
                         cl.map_from + ")");
  }
}

bool parse_redirect(const redisReply* reply, const std::string& replier_host, Redirect* out) {
  if (reply->type != REDIS_REPLY_ERROR) return false;
  const std::string text = reply_text(reply);
  Redirect to;
  size_t at = 0;
  if (text.rfind("MOVED ", 0) == 0) {
    at = 6;
  } else if (text.rfind("ASK ", 0) == 0) {
    to.ask = true;
    at = 4;
  } else {
    return false;
  }
  const size_t space = text.find(' ', at);
  const size_t colon = text.rfind(':');  // the last one: an IPv6 host has colons
  if (space == std::string::npos || colon == std::string::npos || colon < space) return false;
  char* end = nullptr;
  const long slot = std::strtol(text.c_str() + at, &end, 10);
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (end != text.c_str() + space || slot < 0 || slot >= kSlots || port < 1 || port > 65535)
    return false;
  to.slot = static_cast<int>(slot);
  to.host = text.substr(space + 1, colon - space - 1);
  if (to.host.empty()) to.host = replier_host;
  to.port = static_cast<int>(port);
  to.text = text;
  *out = to;
  return true;
}

Reply follow_redirects(pq_redis& r, Node& from, Reply reply, const std::vector<Arg>& args,
                       const std::string& doing, const Node* busy) {
  Node* at = &from;
  for (int hop = 0; hop < kMaxRedirects; ++hop) {
    Redirect to;
    if (!parse_redirect(reply.get(), at->host, &to)) return reply;
    Node& target = r.cluster->node(to.host, to.port);
    if (&target == busy)
      fail(PQ_ERR_BACKEND, "redis at " + at->where() + ": " + doing + ": the server answered \"" +
                               to.text + "\", the node this pipeline is waiting on (a node "
                               "redirecting to itself: the cluster's slot map is inconsistent)");
    if (!to.ask) {  // the slot lives there now: so does the rest of the operation
      r.cluster->owner[static_cast<size_t>(to.slot)] = &target;
      r.cluster->stale = true;
      r.node = &target;
    }
    reply = send_to(r, target, args, doing, to.ask);
    at = &target;
  }
  Redirect again;
  if (parse_redirect(reply.get(), at->host, &again))
    fail(PQ_ERR_BACKEND, "redis at " + at->where() + ": " + doing + ": still redirected after " +
                             std::to_string(kMaxRedirects) + " redirects (the last answer: \"" +
                             again.text + "\"): the cluster's slot map keeps changing");
  return reply;
}

}  // namespace pqr
