// SPDX-License-Identifier: Apache-2.0
// allreduce_perf across nodes: kft's flat and hierarchical allreduce against MPI_Allreduce, all
// timed in the same run, with the bytes each node sent across nodes counted from its network
// interfaces. The group between nodes is MPI's (kft::group::mpi_group), or Gloo's with
// KFT_INTER_NODE=gloo (kft::group::gloo_group, its store bootstrapped over MPI; flat is then
// Gloo's own ring allreduce over every rank). Included by harness.cpp (allreduce only); runs
// when the ranks span several nodes (host names, or KFT_HOST_ID) or --algo is flat or
// hierarchical.
#pragma once

#include <kft/discovery/discover.hpp>
#include <kft/group/mpi_group.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#if KFT_WITH_GLOO
#include <kft/group/gloo_group.hpp>
#endif

namespace multinode {

// Bytes sent by this network namespace's interfaces other than loopback (/proc/net/dev
// follows the reading process's namespace). Cross-node MPI traffic between real or namespace
// hosts goes through them; on one host with KFT_HOST_ID "nodes" it does not (MPI uses shared
// memory), and the count stays ~0.
inline long long tx_bytes() {
  std::ifstream f("/proc/net/dev");
  std::string line;
  long long total = 0;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string dev = line.substr(0, colon);
    dev.erase(0, dev.find_first_not_of(' '));
    if (dev == "lo") continue;
    std::istringstream in(line.substr(colon + 1));
    long long v[9] = {};
    for (auto& x : v) in >> x;  // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes
    total += v[8];
  }
  return total;
}

struct measured {
  double us = 0;              // slowest rank's average call
  double node_tx_bytes = 0;   // per call, the busiest node
  long wrong = 0;
};

inline double max_all(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// Times `call` (after `warmup` calls): slowest rank's average, and per-node interface bytes.
template <class Group, class F>
measured time_it(Group& w, int warmup, int iters, F&& call) {
  for (int i = 0; i < warmup; ++i) call();
  MPI_Barrier(MPI_COMM_WORLD);
  const bool counter = w.layout().local_rank() == 0;  // one reader per node (one namespace)
  const long long tx0 = counter ? tx_bytes() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's sends are done before counters are read
  const long long tx1 = counter ? tx_bytes() : 0;
  measured m;
  m.us = max_all(sec) * 1e6;
  m.node_tx_bytes = max_all(static_cast<double>(tx1 - tx0) / iters);
  return m;
}

template <class Group>
long verify(Group& w, float* in, float* out, std::size_t count, kft::algo a) {
  const int me = w.rank(), p = w.size();
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>((static_cast<std::size_t>(me) + i) % 17);
  w.allreduce(in, out, count, kft::dtype::f32, kft::op_kind::sum, {.algorithm = a});
  long wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < p; ++r) want += static_cast<float>((static_cast<std::size_t>(r) + i) % 17);
    if (out[i] != want) ++wrong;
  }
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

// From min_bytes while next_size advances (it stops past -e), float sum. Returns the exit code.
template <class Group, class Next>
int run_on(Group& w, const std::string& inter, std::size_t min_bytes, Next next_size, int iters, int warmup,
           kft::algo requested, const std::string& json_path) {
  const int me = w.rank(), p = w.size();
  const auto& lay = w.layout();
  const int M = lay.nodes(), L = lay.local_size();
  std::size_t biggest = min_bytes;
  while (next_size(biggest)) {
  }
  const std::size_t cap = std::max<std::size_t>(biggest / sizeof(float), 1);
  std::vector<float> in(cap), out(cap);
  if (me == 0) {
    std::printf("# kft allreduce_perf across nodes: %d ranks on %s (%s), float sum, time = slowest rank's average call\n",
                p, lay.describe().c_str(), w.fallback_reason().empty() ? "hierarchical available" : "uneven: flat only");
    std::printf("# between nodes: %s; flat = %s over every rank; hier = shm reduce-scatter -> %s per rail -> shm "
                "allgather\n",
                inter.c_str(), inter == "Gloo" ? "Gloo's own ring allreduce" : "kft's ring over MPI",
                inter == "Gloo" ? "Gloo's ring" : "kft's ring");
    std::printf("# node tx = bytes this node's network interfaces (not lo) sent per call, the busiest node; "
                "model = 2(M-1)/M x N, what a ring on each rail sends per node\n");
    std::printf("# %10s %12s %13s %10s %10s %8s %11s %10s %8s %8s %14s %14s %14s %12s\n", "size", "count", "kft auto",
                "auto us", "busbw", "#wrong", "flat kft us", "hier us", "MPI us", "hier/MPI", "node tx hier",
                "node tx flat", "node tx MPI", "model hier");
  }
  nlohmann::json rows = nlohmann::json::array();
  long errors = 0;
  const double factor = p > 1 ? 2.0 * (p - 1) / p : 1.0;
  for (std::size_t size = min_bytes;;) {
    const std::size_t count = std::max<std::size_t>(size / sizeof(float), 1), bytes = count * sizeof(float);
    const kft::algo chosen = w.choose(bytes, requested);
    const long wrong = verify(w, in.data(), out.data(), count, requested) +
                       verify(w, in.data(), out.data(), count, kft::algo::hierarchical);
    errors += wrong;
    auto call = [&](kft::algo a) {
      return time_it(w, warmup, iters, [&] {
        w.allreduce(in.data(), out.data(), count, kft::dtype::f32, kft::op_kind::sum, {.algorithm = a});
      });
    };
    const measured automatic = call(requested), flat = call(kft::algo::flat), hier = call(kft::algo::hierarchical);
    const int c = static_cast<int>(count);
    const measured mpi = time_it(w, warmup, iters, [&] {
      MPI_Allreduce(in.data(), out.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double model = M > 1 ? 2.0 * (M - 1) / M * static_cast<double>(bytes) : 0.0;
    const double busbw = automatic.us > 0 ? static_cast<double>(bytes) / automatic.us / 1e3 * factor : 0.0;
    if (me == 0) {
      std::printf("  %10zu %12zu %13s %10.1f %10.3f %8ld %11.1f %10.1f %8.1f %8.2f %14.0f %14.0f %14.0f %12.0f\n", bytes,
                  count, std::string(kft::name(chosen)).c_str(), automatic.us, busbw, wrong, flat.us, hier.us, mpi.us,
                  hier.us > 0 ? mpi.us / hier.us : 0.0, hier.node_tx_bytes, flat.node_tx_bytes, mpi.node_tx_bytes, model);
      std::fflush(stdout);
    }
    rows.push_back({{"size", bytes}, {"count", count}, {"algorithm", kft::name(chosen)}, {"auto_us", automatic.us},
                    {"busbw", busbw}, {"wrong", wrong}, {"flat_us", flat.us}, {"hierarchical_us", hier.us},
                    {"mpi_us", mpi.us}, {"node_tx_bytes", {{"auto", automatic.node_tx_bytes}, {"flat", flat.node_tx_bytes},
                                                            {"hierarchical", hier.node_tx_bytes}, {"mpi", mpi.node_tx_bytes}}},
                    {"model_hierarchical_node_bytes", model}});
    if (!next_size(size)) break;
  }
  if (me == 0) {
    std::printf("# Out of bounds values : %ld %s\n", errors, errors ? "FAILED" : "OK");
    if (!json_path.empty()) {
      nlohmann::json doc = {{"collective", "allreduce"}, {"inter_node", inter}, {"ranks", p}, {"nodes", M}, {"ranks_per_node", L},
                            {"layout", lay.describe()}, {"iterations", iters}, {"results", rows}};
      std::ofstream f(json_path);
      f << doc.dump(1) << "\n";
    }
  }
  return errors ? 1 : 0;
}

template <class Next>
int run(std::size_t min_bytes, Next next_size, int iters, int warmup, kft::algo requested,
        const std::string& json_path) {
  const auto env = kft::environment::process();
  const std::string inter = env.get("KFT_INTER_NODE").value_or("mpi");
  if (inter == "gloo") {
#if KFT_WITH_GLOO
    // The store over MPI, advertised on the interface Gloo uses (KFT_SOCKET_IFNAME, as
    // netns_allreduce.sh sets: host names of namespace hosts do not resolve).
    const auto me = kft::discover(env);
    const auto nic = kft::group::gloo_interface(me, env);
    auto store = kft::rendezvous::mpi_bootstrap(MPI_COMM_WORLD, std::chrono::seconds(60), nic.address);
    kft::group::gloo_group_config cfg = kft::group::gloo_group_config_from(env);
    cfg.nic = nic;
    // KFT_BENCH_CHUNK_BYTES: the hierarchical pipeline's chunk (default: hierarchical_config's).
    if (auto c = env.get("KFT_BENCH_CHUNK_BYTES")) cfg.group.hierarchical.chunk_bytes = std::stoull(*c);
    auto g = kft::group::gloo_group(store.client, me, env, cfg);
    return run_on(*g, "Gloo", min_bytes, next_size, iters, warmup, requested, json_path);
#else
    std::fprintf(stderr, "KFT_INTER_NODE=gloo, but kft was built without Gloo\n");
    return 2;
#endif
  }
  auto g = kft::group::mpi_group();
  return run_on(*g, "MPI", min_bytes, next_size, iters, warmup, requested, json_path);
}

}  // namespace multinode
