// Servers for the Redis tier's tests (tests/redis/test_redis.cpp):
//  - RedisServer: a real redis-server of the test's own, on a free loopback
//    port, without persistence, in a scratch directory; stop() kills it
//    (SIGKILL + waitpid), as a crash would;
//  - FakeRedis: a loopback server speaking just enough RESP to play a
//    Redis that answers some commands and then hangs or drops the
//    connection in the middle of a reply (a server dying mid-transfer,
//    deterministically).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace pqrt {

// The redis-server program: $PQ_REDIS_SERVER when set (none if it is not
// executable), else the first on PATH, else Debian's /usr/bin; "" when
// there is none.
inline std::string find_redis_server() {
  if (const char* env = std::getenv("PQ_REDIS_SERVER"))
    if (*env) return access(env, X_OK) == 0 ? env : "";
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/sbin";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/redis-server";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A loopback port bound (not listening) while this object lives: a connect
// to it is refused, and no other process gets it meanwhile.
class ReservedPort {
 public:
  ReservedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port_ = ntohs(addr.sin_port);
  }
  ~ReservedPort() {
    if (fd_ >= 0) close(fd_);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = -1;
};

// A loopback port nobody uses now (the kernel's choice for port 0). Another
// process may take it before the caller does: callers check and retry.
inline int free_port() { return ReservedPort().port(); }

// The process id of the Redis server that answers PING on 127.0.0.1:port
// (from INFO server), or -1 when none answers.
inline long redis_pid(int port) {
  timeval tv{0, 200 * 1000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  long pid = -1;
  if (c != nullptr && c->err == 0) {
    redisSetTimeout(c, tv);
    auto* pong = static_cast<redisReply*>(redisCommand(c, "PING"));
    const bool up = pong != nullptr && pong->type == REDIS_REPLY_STATUS &&
                    std::strcmp(pong->str, "PONG") == 0;
    if (pong) freeReplyObject(pong);
    auto* r = up ? static_cast<redisReply*>(redisCommand(c, "INFO server")) : nullptr;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      const char* at = std::strstr(r->str, "process_id:");
      if (at != nullptr) pid = std::strtol(at + 11, nullptr, 10);
    }
    if (r) freeReplyObject(r);
  }
  if (c) redisFree(c);
  return pid;
}

class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer() {
    stop();
    if (!dir_.empty()) {
      std::string cmd = "rm -rf '" + dir_ + "'";
      if (std::system(cmd.c_str()) != 0) {
      }
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts redis-server (on `port`, or on a free port when 0) and waits
  // until it answers, as itself (its process id). Returns "" or why not.
  std::string start(int port = 0) {
    if (pid_ > 0) return "already running";
    program_ = find_redis_server();
    if (program_.empty()) {
      const char* env = std::getenv("PQ_REDIS_SERVER");
      return std::string("redis-server is not installed (Debian: redis-server)") +
             (env && *env ? std::string("; PQ_REDIS_SERVER=") + env + " is not executable" : "");
    }
    if (dir_.empty()) {
      char tmpl[] = "/tmp/pqcache-redis-test-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) return "mkdtemp failed";
      dir_ = tmpl;
    }
    std::string why;
    for (int attempt = 0; attempt < 5; ++attempt) {
      int p = port != 0 ? port : free_port();
      why = spawn(p);
      if (why.empty()) {
        port_ = p;
        return "";
      }
      if (port != 0 && attempt >= 2) break;  // a fixed port: a few tries (TIME_WAIT)
    }
    return why;
  }

  // Kills the server (SIGKILL, as a crash) and reaps it.
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  // Arguments appended to redis-server's from the next start on (a
  // cluster node's, redis_cluster.h).
  void set_extra_args(std::vector<std::string> args) { extra_args_ = std::move(args); }

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  std::string log() const {
    std::ifstream in(dir_ + "/redis.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string spawn(int port) {
    const std::string port_s = std::to_string(port);
    const std::string logfile = dir_ + "/redis.log";
    std::vector<std::string> args = {program_,    "--port",       port_s,  "--bind",
                                     "127.0.0.1", "--save",       "",      "--appendonly",
                                     "no",        "--dir",        dir_,    "--daemonize",
                                     "no",        "--logfile",    logfile, "--loglevel",
                                     "warning",   "--databases",  "1"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, program_.c_str(), nullptr, nullptr, argv.data(), environ) != 0)
      return "posix_spawn(" + program_ + ") failed: " + std::strerror(errno);
    pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "redis-server exited at start on port " + port_s + ": " + log();
      }
      // Ours, not a server of another test that took the port first.
      if (redis_pid(port) == static_cast<long>(pid_)) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    return "redis-server on port " + port_s + " did not answer within 15 s: " + log();
  }

  std::string program_;
  std::string dir_;
  std::vector<std::string> extra_args_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// What FakeRedis does with one command.
struct FakeAction {
  std::string reply;   // bytes sent back (may stop in the middle of a value)
  bool close = false;  // then close the connection
  bool hang = false;   // send nothing and keep the connection open
};

// A loopback server for one client at a time: parses RESP arrays of bulk
// strings and answers each command with handler(args).
class FakeRedis {
 public:
  using Handler = std::function<FakeAction(const std::vector<std::string>&)>;
  explicit FakeRedis(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listen_fd_, 4) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRedis() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  FakeRedis(const FakeRedis&) = delete;
  FakeRedis& operator=(const FakeRedis&) = delete;

  int port() const { return port_; }
  // Commands received so far (the first argument of each).
  std::vector<std::string> commands() {
    std::lock_guard<std::mutex> lock(mu_);
    return commands_;
  }

  static std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
  }

 private:
  bool wait_readable(int fd) {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      int n = poll(&p, 1, 50);
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
    return false;
  }

  void serve() {
    while (!stop_) {
      if (!wait_readable(listen_fd_)) return;
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      talk(fd);
      close(fd);
    }
  }

  // Reads commands from fd until the handler closes it or the client goes.
  void talk(int fd) {
    std::string in;
    bool hanging = false;
    while (!stop_) {
      if (!wait_readable(fd)) return;
      char buf[65536];
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      if (hanging) continue;
      in.append(buf, static_cast<size_t>(n));
      std::vector<std::string> args;
      size_t used = 0;
      while (parse(in, &args, &used)) {
        in.erase(0, used);
        {
          std::lock_guard<std::mutex> lock(mu_);
          commands_.push_back(args.empty() ? "" : args[0]);
        }
        FakeAction a = handler_(args);
        if (a.hang) {
          hanging = true;
          break;
        }
        size_t off = 0;
        while (off < a.reply.size()) {
          ssize_t w = send(fd, a.reply.data() + off, a.reply.size() - off, MSG_NOSIGNAL);
          if (w <= 0) return;
          off += static_cast<size_t>(w);
        }
        if (a.close) return;
        args.clear();
      }
    }
  }

  // One RESP array of bulk strings from the front of in; false: incomplete.
  static bool parse(const std::string& in, std::vector<std::string>* args, size_t* used) {
    size_t pos = 0;
    auto line = [&](std::string* out) {
      size_t e = in.find("\r\n", pos);
      if (e == std::string::npos) return false;
      *out = in.substr(pos, e - pos);
      pos = e + 2;
      return true;
    };
    std::string l;
    if (!line(&l) || l.empty() || l[0] != '*') return false;
    long count = std::strtol(l.c_str() + 1, nullptr, 10);
    args->clear();
    for (long i = 0; i < count; ++i) {
      if (!line(&l) || l.empty() || l[0] != '$') return false;
      size_t len = static_cast<size_t>(std::strtoul(l.c_str() + 1, nullptr, 10));
      if (in.size() < pos + len + 2) return false;
      args->push_back(in.substr(pos, len));
      pos += len + 2;
    }
    *used = pos;
    return true;
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> commands_;
};

// A hiredis connection of the test's own (raw commands: SETRANGE, EXISTS,
// MONITOR), independent of the component under test.
class RawRedis {
 public:
  explicit RawRedis(int port) {
    timeval tv{5, 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c_ && c_->err == 0) redisSetTimeout(c_, tv);
  }
  ~RawRedis() {
    if (c_) redisFree(c_);
  }
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;
  bool ok() const { return c_ != nullptr && c_->err == 0; }
  redisContext* get() const { return c_; }

  // A command given as binary-safe arguments; the reply as a string
  // ("(nil)", ":<n>", "+status", "-error" or the bulk bytes).
  std::string run(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> argl;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      argl.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), argl.data()));
    if (r == nullptr) return std::string("(io error: ") + (c_ ? c_->errstr : "") + ")";
    std::string out;
    switch (r->type) {
      case REDIS_REPLY_NIL: out = "(nil)"; break;
      case REDIS_REPLY_INTEGER: out = ":" + std::to_string(r->integer); break;
      case REDIS_REPLY_STATUS: out = "+" + std::string(r->str, r->len); break;
      case REDIS_REPLY_ERROR: out = "-" + std::string(r->str, r->len); break;
      case REDIS_REPLY_STRING: out = std::string(r->str, r->len); break;
      default: out = "(type " + std::to_string(r->type) + ")"; break;
    }
    freeReplyObject(r);
    return out;
  }

 private:
  redisContext* c_ = nullptr;
};

}  // namespace pqrt
