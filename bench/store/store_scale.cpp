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
#include <sys/resource.h>
#include <sys/syscall.h>
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
  CLI11_PARSE(app, argc, argv);
  try {
    if (sv->parsed()) return serve(serve_host);
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
