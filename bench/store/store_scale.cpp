// SPDX-License-Identifier: Apache-2.0
// The rendezvous store at scale: one side of store_scale.py (bench/README.md).
//
//   store_scale serve [--host 127.0.0.1]
//     hosts a kft tcp_store_server (token: the first line of standard input), prints
//     "port <p>", then answers each "stats" line with "stats rss_kib <k> connected <n> requests <r>
//     dropped <d>" (d: connections turned away before their hello was read) and exits when
//     standard input closes.
//
//   store_scale clients --protocol kft|torch --port P --world N --first I --count K [--timeout S]
//     K clients, one thread each (global indices I..I+K-1 of N), the kft client (token: the first
//     line of standard input) or kft's client of torch's TCPStore (torch 1.13's protocol, one
//     connection per client). Client i connects from its own address of 127.0.0.0/8
//     (source_address(i)). It prints "ready", then runs one phase per "go <phase>" line and
//     answers "done <phase> <start ns> <end ns> <errors> <reconnects> <first error>" (CLOCK_MONOTONIC:
//     start when the line was read, end when the last of its clients finished):
//       connect  connect and authenticate (kft: the hello; torch: 1.13's GETNUMKEYS probe); a
//                connection the server resets or drops before it answered is made again, with
//                backoff (20 ms doubling to 1 s), until --timeout: kft's client does that by
//                itself (a store sheds strangers), and the torch side gets the same (torch
//                1.13's server, accepting one connection per poll of all of them, lets its
//                listen queue overflow at 16,000, and the kernel resets what it could not accept)
//       rank     add("rank", 1): the rank is the value - 1
//       publish  set("addr/<rank>", an address)
//       read     get("addr/<(rank + 1) % N>"): one peer's address
//       barrier  rendezvous::barrier(store, "barrier", N): add, the last one sets, get
//       leave    close the connection
//     Every wait is bounded by --timeout (a client past it counts as an error).
//
//   store_scale nodes --port P --world N --first-node F --nodes K [--ranks-per-node R] [--timeout S]
//     K nodes of a job laid out as N / R nodes x R ranks (global node indices F..F+K-1): each node
//     has its relay (a tcp_store_server relaying to the job's store at P over one connection,
//     listening on its own address of 127.0.0.0/8, source_address(node)), and its R ranks are
//     clients of their node's relay. The ranks are driven by one thread (non-blocking sockets,
//     epoll: tens of thousands of them need no thread each), speaking the store's protocol as
//     kft's client does. The same lines and phases as `clients`; in "connect" the relays
//     connect to the job's store first (timed with the phase), then the ranks to their relay.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/futex.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/rendezvous/tcp_store.hpp>
#include <kft/rendezvous/tcp_store_server.hpp>
#include <kft/rendezvous/tcp_store_relay.hpp>
#include <kft/rendezvous/torch_store.hpp>

namespace rdzv = kft::rendezvous;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> phases{"connect", "rank", "publish", "read", "barrier", "leave"};

// Client i's source address: 127.c.b.a with a, b in 1..250 and c from 1 (never a .0 or .255).
std::string source_address(long i) {
  return "127." + std::to_string(1 + i / 62500) + "." + std::to_string(1 + (i / 250) % 250) + "." +
         std::to_string(1 + i % 250);
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

std::string read_token() {
  std::string token;
  if (!std::getline(std::cin, token) || token.empty()) {
    std::fprintf(stderr, "store_scale: expected the token on the first line of standard input\n");
    std::exit(2);
  }
  return token;
}

// Threads of a phase start together: a futex every client thread waits on, woken at once.
class gate {
 public:
  void open(std::uint32_t phase) {
    word_.store(phase);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }
  // Waits until `phase` is open; false at the deadline.
  bool wait(std::uint32_t phase, clock_type::time_point deadline) {
    while (true) {
      const auto seen = word_.load();
      if (seen >= phase) return true;
      const auto left = deadline - clock_type::now();
      if (left <= 0s) return false;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::min<clock_type::duration>(left, 1s)).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
    }
  }

 private:
  std::atomic<std::uint32_t> word_{0};
};
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

struct settings {
  std::string protocol = "kft";
  std::string host = "127.0.0.1";
  int port = 0;
  long world = 0, first = 0, count = 0;
  int timeout_s = 300;
  std::string token;
};

struct shared_state {
  const settings* cfg = nullptr;
  gate go;
  std::mutex mu;
  std::condition_variable all_done;
  long finished = 0;            // clients done with the current phase
  long long last_end = 0;       // the latest end of the current phase (ns)
  long errors = 0;
  long reconnects = 0;
  std::string first_error;
};

struct client_arg {
  shared_state* st;
  long index;
};

std::unique_ptr<rdzv::store> connect(const settings& cfg, long index) {
  const std::chrono::milliseconds limit(static_cast<long long>(cfg.timeout_s) * 1000);
  if (cfg.protocol == "kft") {
    rdzv::tcp_store::options o;
    o.host = cfg.host;
    o.port = cfg.port;
    o.token = cfg.token;
    o.connect_timeout = limit;
    o.io_timeout = limit;
    o.name = "store_scale client " + std::to_string(index);
    o.source_address = source_address(index);
    return std::make_unique<rdzv::tcp_store>(o);
  }
  rdzv::torch_tcp_store::options o;
  o.host = cfg.host;
  o.port = cfg.port;
  o.connect_timeout = limit;
  o.io_timeout = limit;
  o.probe_timeout = limit;  // a 1.13 server: wait for its answer, however busy it is (no 2.x handshake)
  o.role = "store_scale";
  o.source_address = source_address(index);
  return std::make_unique<rdzv::torch_tcp_store>(o);
}

void* client_main(void* p) {
  const auto* arg = static_cast<client_arg*>(p);
  shared_state& st = *arg->st;
  const settings& cfg = *st.cfg;
  const std::chrono::milliseconds limit(static_cast<long long>(cfg.timeout_s) * 1000);
  std::unique_ptr<rdzv::store> s;
  long rank = -1;
  for (std::uint32_t ph = 1; ph <= phases.size(); ++ph) {
    if (!st.go.wait(ph, clock_type::now() + 24h)) break;  // (main exits on its own deadline first)
    std::string error;
    try {
      const auto& name = phases[ph - 1];
      if (name == "connect") {
        const auto deadline = clock_type::now() + limit;
        for (auto pause = 20ms; !s;) {
          try {
            s = connect(cfg, arg->index);
          } catch (const kft::transport_error&) {
            if (clock_type::now() + pause >= deadline) throw;
            {
              std::lock_guard lock(st.mu);
              ++st.reconnects;
            }
            std::this_thread::sleep_for(pause);
            pause = std::min<std::chrono::milliseconds>(pause * 2, 1s);
          }
        }
      } else if (!s) {
        error = "not connected";
      } else if (name == "rank") {
        rank = s->add("rank", 1) - 1;
      } else if (name == "publish") {
        s->set("addr/" + std::to_string(rank), source_address(arg->index) + ":" + std::to_string(29500 + rank % 1000));
      } else if (name == "read") {
        const auto peer = s->get("addr/" + std::to_string((rank + 1) % cfg.world), limit);
        if (peer.rfind("127.", 0) != 0) error = "read a peer's address \"" + peer + "\"";
      } else if (name == "barrier") {
        rdzv::barrier(*s, "barrier", static_cast<int>(cfg.world), limit);
      } else if (name == "leave") {
        s.reset();
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    const auto end = now_ns();
    std::lock_guard lock(st.mu);
    st.last_end = std::max(st.last_end, end);
    if (!error.empty() && st.errors++ == 0) st.first_error = "client " + std::to_string(arg->index) + ": " + error;
    if (++st.finished == cfg.count) st.all_done.notify_one();
  }
  return nullptr;
}

int serve(const std::string& host) {
  rdzv::tcp_store_server::options o;
  o.host = host;
  o.token = read_token();
  rdzv::tcp_store_server server(o);
  std::printf("port %d\n", server.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "stats")
      std::printf("stats rss_kib %ld connected %d requests %llu dropped %d\n", rss_kib(), server.connected(),
                  static_cast<unsigned long long>(server.requests()), server.dropped());
    std::fflush(stdout);
  }
  return 0;
}

int clients(const settings& cfg) {
  shared_state st;
  st.cfg = &cfg;
  std::vector<client_arg> args(static_cast<std::size_t>(cfg.count));
  std::vector<pthread_t> threads;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);  // thousands of threads: small stacks
  for (long i = 0; i < cfg.count; ++i) {
    args[static_cast<std::size_t>(i)] = {&st, cfg.first + i};
    pthread_t t;
    if (const int rc = pthread_create(&t, &attr, client_main, &args[static_cast<std::size_t>(i)]); rc != 0) {
      std::fprintf(stderr, "store_scale: cannot start client thread %ld of %ld: %s\n", i, cfg.count, std::strerror(rc));
      std::exit(1);
    }
    threads.push_back(t);
  }
  pthread_attr_destroy(&attr);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  for (std::uint32_t ph = 1; ph <= phases.size(); ++ph) {
    if (!std::getline(std::cin, line) || line != "go " + phases[ph - 1]) {
      std::fprintf(stderr, "store_scale: expected \"go %s\", got \"%s\"\n", phases[ph - 1].c_str(), line.c_str());
      std::_Exit(1);
    }
    const auto start = now_ns();
    {
      std::lock_guard lock(st.mu);
      st.finished = 0;
      st.last_end = 0;
      st.errors = 0;
      st.reconnects = 0;
      st.first_error.clear();
    }
    st.go.open(ph);
    std::unique_lock lock(st.mu);
    // Every client's own waits are bounded by --timeout; this one by twice that.
    if (!st.all_done.wait_for(lock, std::chrono::seconds(2L * cfg.timeout_s + 30), [&] { return st.finished == cfg.count; })) {
      std::printf("done %s %lld %lld %ld %ld %s\n", phases[ph - 1].c_str(), start, now_ns(), cfg.count - st.finished,
                  st.reconnects, "clients still running past twice the timeout");
      std::fflush(stdout);
      std::_Exit(1);
    }
    std::string first = st.first_error;
    for (auto& ch : first)
      if (ch == '\n') ch = ' ';
    std::printf("done %s %lld %lld %ld %ld %s\n", phases[ph - 1].c_str(), start, st.last_end, st.errors, st.reconnects,
                first.c_str());
    std::fflush(stdout);
  }
  for (auto t : threads) pthread_join(t, nullptr);
  return 0;
}

}  // namespace

// ---- nodes: relays, and their ranks driven by one event loop ---------------------------------

namespace wire = rdzv::wire;

struct node_settings {
  int port = 0;
  long world = 0, first_node = 0, nodes = 0, per_node = 8;
  int timeout_s = 300;
  std::string token;
};

// One rank: a non-blocking connection to its node's relay and where it stands in the phase.
struct rank_conn {
  int fd = -1;
  long index = 0;  // global rank index (node * per_node + local)
  long rank = -1;  // what "rank" gave it
  int step = 0;    // within the phase
  bool connecting = false, done = false;
  std::string out, in;
  std::uint32_t events = 0;
};

class node_driver {
 public:
  explicit node_driver(const node_settings& cfg) : cfg_(cfg), epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    ranks_.resize(static_cast<std::size_t>(cfg.nodes * cfg.per_node));
    for (std::size_t i = 0; i < ranks_.size(); ++i) ranks_[i].index = cfg.first_node * cfg.per_node + static_cast<long>(i);
  }
  ~node_driver() {
    for (auto& r : ranks_)
      if (r.fd >= 0) ::close(r.fd);
    ::close(epoll_);
  }

  // Runs one phase for every rank; returns (errors, first error).
  std::pair<long, std::string> phase(const std::string& name) {
    name_ = name;
    errors_ = 0;
    first_error_.clear();
    left_ = static_cast<long>(ranks_.size());
    if (name == "connect") {
      try {
        for (long k = 0; k < cfg_.nodes; ++k) {
          rdzv::tcp_store_server::options o;
          o.host = source_address(cfg_.first_node + k);
          o.token = cfg_.token;
          o.upstream = rdzv::relay_to("127.0.0.1", cfg_.port);
          o.upstream.source_address = o.host;
          o.upstream.connect_timeout = std::chrono::seconds(cfg_.timeout_s);
          o.upstream.name = "node " + std::to_string(cfg_.first_node + k);
          relays_.push_back(std::make_unique<rdzv::tcp_store_server>(o));
        }
      } catch (const std::exception& e) {
        return {static_cast<long>(ranks_.size()), std::string("a relay: ") + e.what()};
      }
    }
    for (auto& r : ranks_) {
      r.step = 0;
      r.done = false;
      start(r);
    }
    const auto deadline = clock_type::now() + std::chrono::seconds(cfg_.timeout_s);
    std::vector<epoll_event> evs(1024);
    while (left_ > 0) {
      const auto now = clock_type::now();
      if (now >= deadline) {
        for (auto& r : ranks_)
          if (!r.done) fail(r, "no answer within --timeout");
        break;
      }
      const int n = ::epoll_wait(epoll_, evs.data(), static_cast<int>(evs.size()), 100);
      for (int i = 0; i < n; ++i) {
        auto& r = ranks_[static_cast<std::size_t>(evs[static_cast<std::size_t>(i)].data.u64)];
        on_event(r, evs[static_cast<std::size_t>(i)].events);
      }
    }
    if (name == "leave") relays_.clear();
    return {errors_, first_error_};
  }

 private:
  void watch(rank_conn& r, std::uint32_t want) {
    if (want == r.events || r.fd < 0) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = static_cast<std::uint64_t>(&r - ranks_.data());
    ::epoll_ctl(epoll_, r.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, r.fd, &ev);
    r.events = want;
  }
  void finish(rank_conn& r) {
    if (r.done) return;
    r.done = true;
    --left_;
  }
  void fail(rank_conn& r, const std::string& why) {
    if (r.done) return;
    if (errors_++ == 0) first_error_ = "rank " + std::to_string(r.index) + ": " + why;
    finish(r);
  }
  void send(rank_conn& r, std::string frame) {
    r.out += frame;
    flush(r);
  }
  void flush(rank_conn& r) {
    while (!r.out.empty()) {
      const ssize_t n = ::send(r.fd, r.out.data(), r.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        r.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return fail(r, std::string("send: ") + std::strerror(errno));
    }
    watch(r, EPOLLIN | (r.out.empty() ? 0u : static_cast<std::uint32_t>(EPOLLOUT)));
  }
  std::uint32_t ms() const { return static_cast<std::uint32_t>(cfg_.timeout_s) * 1000u; }
  static std::string req(wire::op o) { return std::string(1, static_cast<char>(o)); }

  // The phase's first request.
  void start(rank_conn& r) {
    const auto op = [](wire::op o) { return wire::writer().u8(static_cast<std::uint8_t>(o)); };
    if (name_ == "connect") {
      const long node = r.index / cfg_.per_node;
      const auto& relay = *relays_[static_cast<std::size_t>(node - cfg_.first_node)];
      r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (r.fd < 0) return fail(r, std::string("socket: ") + std::strerror(errno));
      int one = 1;
      ::setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(relay.port()));
      ::inet_pton(AF_INET, relay.host().c_str(), &a.sin_addr);
      if (::connect(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
        return fail(r, std::string("connect: ") + std::strerror(errno));
      r.connecting = true;
      r.out = wire::writer().u8(static_cast<std::uint8_t>(wire::op::hello)).str(cfg_.token).str("rank").done();
      watch(r, EPOLLOUT | EPOLLIN);
    } else if (r.fd < 0) {
      fail(r, "not connected");
    } else if (name_ == "rank") {
      send(r, op(wire::op::add).str("rank").i64(1).done());
    } else if (name_ == "publish") {
      send(r, op(wire::op::set).str("addr/" + std::to_string(r.rank)).str(source_address(r.index) + ":" +
                                                                            std::to_string(29500 + r.rank % 1000)).done());
    } else if (name_ == "read") {
      send(r, op(wire::op::get).str("addr/" + std::to_string((r.rank + 1) % cfg_.world)).u32(ms()).done());
    } else if (name_ == "barrier") {  // rendezvous::barrier: add; the last one sets; get
      send(r, op(wire::op::add).str("barrier/arrived").i64(1).done());
    } else if (name_ == "leave") {
      ::epoll_ctl(epoll_, EPOLL_CTL_DEL, r.fd, nullptr);
      ::close(r.fd);
      r.fd = -1;
      r.events = 0;
      finish(r);
    }
  }

  void on_event(rank_conn& r, std::uint32_t ev) {
    if (r.done && name_ != "connect") {
      // (a reply after the phase: not expected)
    }
    if (r.connecting && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return fail(r, std::string("connect: ") + std::strerror(err));
      r.connecting = false;
    }
    if (ev & EPOLLOUT) flush(r);
    if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(r.fd, buf, sizeof buf, 0);
      if (n > 0) {
        r.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return fail(r, n == 0 ? "the relay closed the connection" : std::string("recv: ") + std::strerror(errno));
    }
    while (r.in.size() >= 4) {
      const auto n = wire::frame_length(r.in);
      if (r.in.size() < 4u + n) break;
      wire::reader reply(r.in.substr(4, n));
      r.in.erase(0, 4u + n);
      on_reply(r, reply);
    }
  }

  void on_reply(rank_conn& r, wire::reader& rep) {
    const auto st = static_cast<wire::status>(rep.u8());
    if (st != wire::status::ok)
      return fail(r, "phase " + name_ + ": the store answered status " + std::to_string(static_cast<int>(st)) +
                         (st == wire::status::error ? " (" + rep.str() + ")" : std::string()));
    const auto op = [](wire::op o) { return wire::writer().u8(static_cast<std::uint8_t>(o)); };
    if (name_ == "connect" || name_ == "publish") return finish(r);
    if (name_ == "rank") {
      r.rank = rep.i64() - 1;
      return finish(r);
    }
    if (name_ == "read") {
      const auto peer = rep.str();
      if (peer.rfind("127.", 0) != 0) return fail(r, "read a peer's address \"" + peer + "\"");
      return finish(r);
    }
    if (name_ == "barrier") {
      if (r.step == 0) {
        r.step = 1;
        if (rep.i64() == cfg_.world) {
          r.step = 2;
          return send(r, op(wire::op::set).str("barrier/open").str("1").done());
        }
        return send(r, op(wire::op::get).str("barrier/open").u32(ms()).done());
      }
      if (r.step == 2) {
        r.step = 1;
        return send(r, op(wire::op::get).str("barrier/open").u32(ms()).done());
      }
      return finish(r);
    }
  }

  const node_settings& cfg_;
  int epoll_;
  std::vector<rank_conn> ranks_;
  std::vector<std::unique_ptr<rdzv::tcp_store_server>> relays_;
  std::string name_, first_error_;
  long errors_ = 0, left_ = 0;
};

int nodes_main(const node_settings& cfg) {
  node_driver d(cfg);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  for (const auto& name : phases) {
    if (!std::getline(std::cin, line) || line != "go " + name) {
      std::fprintf(stderr, "store_scale: expected \"go %s\", got \"%s\"\n", name.c_str(), line.c_str());
      return 1;
    }
    const auto start = now_ns();
    auto [errors, first] = d.phase(name);
    for (auto& ch : first)
      if (ch == '\n') ch = ' ';
    std::printf("done %s %lld %lld %ld %ld %s\n", name.c_str(), start, now_ns(), errors, 0L, first.c_str());
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"The rendezvous store at scale: a kft store server, or clients of kft's or torch's store "
               "(bench/store/store_scale.py runs both)"};
  app.require_subcommand(1);
  std::string serve_host = "127.0.0.1";
  auto* sv = app.add_subcommand("serve", "host a kft store server (token on standard input)");
  sv->add_option("--host", serve_host, "address to listen on");
  settings cfg;
  auto* cl = app.add_subcommand("clients", "run clients, one thread each, phase by phase");
  cl->add_option("--protocol", cfg.protocol, "kft, or torch (kft's client of torch 1.13's TCPStore)")
      ->check(CLI::IsMember({"kft", "torch"}));
  cl->add_option("--host", cfg.host, "the store's address");
  cl->add_option("--port", cfg.port, "the store's port")->required()->check(CLI::Range(1, 65535));
  cl->add_option("--world", cfg.world, "clients in all processes")->required()->check(CLI::Range(1L, 1000000L));
  cl->add_option("--first", cfg.first, "the global index of this process's first client")->check(CLI::Range(0L, 1000000L));
  cl->add_option("--count", cfg.count, "clients in this process")->required()->check(CLI::Range(1L, 100000L));
  cl->add_option("--timeout", cfg.timeout_s, "seconds any one wait may take")->check(CLI::Range(1, 3600));
  node_settings ncfg;
  auto* nd = app.add_subcommand("nodes", "run nodes: a relay each, and its ranks as its clients (token on standard input)");
  nd->add_option("--port", ncfg.port, "the job's store's port")->required()->check(CLI::Range(1, 65535));
  nd->add_option("--world", ncfg.world, "ranks in all nodes of all processes")->required()->check(CLI::Range(1L, 1000000L));
  nd->add_option("--first-node", ncfg.first_node, "the global index of this process's first node")->check(CLI::Range(0L, 1000000L));
  nd->add_option("--nodes", ncfg.nodes, "nodes in this process")->required()->check(CLI::Range(1L, 100000L));
  nd->add_option("--ranks-per-node", ncfg.per_node, "ranks of each node")->check(CLI::Range(1L, 1024L));
  nd->add_option("--timeout", ncfg.timeout_s, "seconds any one wait may take")->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  try {
    if (sv->parsed()) return serve(serve_host);
    if (nd->parsed()) {
      if (ncfg.world % ncfg.per_node != 0 || (ncfg.first_node + ncfg.nodes) * ncfg.per_node > ncfg.world) {
        std::fprintf(stderr, "store_scale: --first-node %ld + --nodes %ld of %ld ranks each do not fit --world %ld\n",
                     ncfg.first_node, ncfg.nodes, ncfg.per_node, ncfg.world);
        return 2;
      }
      ncfg.token = read_token();
      return nodes_main(ncfg);
    }
    if (cfg.first + cfg.count > cfg.world) {
      std::fprintf(stderr, "store_scale: --first %ld + --count %ld is more than --world %ld\n", cfg.first, cfg.count, cfg.world);
      return 2;
    }
    if (cfg.protocol == "kft") cfg.token = read_token();
    return clients(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_scale: %s\n", e.what());
    return 1;
  }
}
