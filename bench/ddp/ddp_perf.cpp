// SPDX-License-Identifier: Apache-2.0
// ddp_perf: the DDP reducer against what users do without it, measured in one run.
//
//     kftrun --nproc-per-node 2 -- build-tests/bench/ddp_perf bucketing
//     kftrun --nproc-per-node 2 -- build-tests/bench/ddp_perf compute --layers 8 --width 1024 --batch 64
//
// bucketing  200 gradients of 1 KiB - 1 MiB (log-uniform, the same on every rank): the
//            reducer's buckets (first 1 MiB, cap 25 MiB) against one asynchronous allreduce per
//            tensor on the same memory; then one 4 MiB tensor: the reducer against a plain
//            allreduce of that buffer (what bucketing costs when there is nothing to fuse).
//            --gloo: both again over a kft::gloo::communicator between the same ranks (TCP:
//            the anchors' per-call cost); --list-sizes prints the sizes for the PyTorch peer
//            (bench/ddp/ddp_bucketing.py runs all three).
// compute    an MLP's backward pass through OpenBLAS (dW = H^T dY, dX = dY W^T, per layer, one
//            BLAS thread per rank): the reducer with overlap (mark_ready after each layer's dW)
//            against allreduce-after-backward (the same reducer, everything marked after the
//            last layer) and against deterministic mode, with
//              B  the backward alone (under no_sync: no communication),
//              C  the communication alone (every gradient ready at once),
//              H  = 1 - max(0, T - B) / C, the hidden fraction (wall clock, not interval overlap).
//            On a CPU the allreduce competes with the BLAS for the cores, so H is bounded; what
//            must hold is that overlap is never slower than allreduce-after-backward.
//
// Every measurement is the slowest rank's; the variants alternate within each repetition in a
// rotating order (no variant always runs first); the table shows medians of the repetitions and
// the median of the per-repetition ratios. Numbers, not a pass/fail test: the run checks its
// results (averages, replicas bit-identical) and prints how many were wrong.
#include <cblas.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/core/hash.hpp>
#include <kft/ddp/reducer.hpp>
#if KFT_WITH_GLOO
#include <kft/group/gloo_group.hpp>
#include <kft/transport/gloo/communicator.hpp>
#endif

#include "ddp_common.hpp"

using namespace ddp_bench;
namespace ddp = kft::ddp;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown CPU";
}

std::uint64_t fnv(const void* p, std::size_t n, std::uint64_t h = kft::detail::fnv1a_basis) {
  return kft::detail::fnv1a(std::string_view(static_cast<const char*>(p), n), h);
}

// Runs the variants `reps` times in a rotating order; each variant's function returns its
// time on this rank, recorded as the slowest rank's.
std::vector<std::vector<double>> alternate(job& j, int reps, const std::vector<std::function<double()>>& variants) {
  const std::size_t n = variants.size();
  std::vector<std::vector<double>> t(n);
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t v = (k + static_cast<std::size_t>(r)) % n;
      j.pg.barrier();
      t[v].push_back(j.slowest(variants[v]()));
    }
  return t;
}

double median_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (std::size_t i = 0; i < num.size() && i < den.size(); ++i) r.push_back(num[i] / den[i]);
  return median(r);
}

// ---- bucketing --------------------------------------------------------------------------------

// The gradients' element counts: log-uniform byte sizes from one seed (the same on every rank).
std::vector<std::size_t> tensor_counts(int tensors, std::size_t min_bytes, std::size_t max_bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(min_bytes)),
                                           std::log(static_cast<double>(max_bytes)));
  std::vector<std::size_t> n;
  for (int i = 0; i < tensors; ++i)
    n.push_back(std::max<std::size_t>(1, static_cast<std::size_t>(std::exp(u(rng))) / sizeof(float)));
  return n;
}

// One transport's bucketing numbers: the 200 tensors bucketed and one allreduce each, then
// one 4 MiB tensor through the reducer and plainly; `wrong` counts wrong averages.
struct bucket_times {
  std::vector<std::vector<double>> t;  // bucketed, per-tensor, one-tensor reducer, one-tensor plain
  std::int64_t wrong = 0;
  std::size_t buckets = 0;
};

template <class Group>
bucket_times bucket_rows(job& j, Group& g, const std::vector<std::size_t>& counts, std::size_t cap, int reps) {
  std::vector<ddp::parameter> params;
  for (std::size_t i = 0; i < counts.size(); ++i) params.push_back({counts[i], kft::dtype::f32, "t" + std::to_string(i)});
  ddp::reducer_options ro{.rebuild_buckets = false};
  ro.limits.bucket_bytes_cap = cap;
  ddp::reducer<Group> red(g, params, ro);
  ddp::reducer<Group> one(g, {{(4u << 20) / sizeof(float), kft::dtype::f32, "w"}}, {.rebuild_buckets = false});
  const float mine = static_cast<float>(g.rank() + 1);
  const float want = static_cast<float>(g.size() + 1) / 2.0f;  // the average of 1..p (exact for p <= 4)
  auto fill = [&](auto& r) {
    for (std::size_t i = 0; i < r.parameters(); ++i) {
      auto grad = r.template gradient<float>(i);
      std::fill(grad.begin(), grad.end(), mine);
    }
  };
  bucket_times out;
  auto check = [&](auto& r) {
    for (std::size_t i = 0; i < r.parameters(); ++i)
      for (float v : r.template gradient<float>(i)) out.wrong += v != want;
  };
  std::vector<kft::async::work> works;
  works.reserve(params.size());
  auto bucketed = [&] {
    fill(red);
    j.start_together();
    const auto t0 = clk::now();
    for (std::size_t i = params.size(); i-- > 0;) red.mark_ready(i);
    red.finish();
    const double t = seconds(t0, clk::now());
    check(red);
    return t;
  };
  auto per_tensor = [&] {
    fill(red);
    j.start_together();
    const auto t0 = clk::now();
    for (std::size_t i = params.size(); i-- > 0;) {
      auto grad = red.template gradient<float>(i);
      works.push_back(g.allreduce_async(grad.data(), grad.data(), grad.size(), kft::dtype::f32, kft::op_kind::avg));
    }
    for (auto& w : works) w.wait();
    const double t = seconds(t0, clk::now());
    works.clear();
    check(red);
    return t;
  };
  auto single_reducer = [&] {
    fill(one);
    j.start_together();
    const auto t0 = clk::now();
    one.mark_ready(0);
    one.finish();
    const double t = seconds(t0, clk::now());
    check(one);
    return t;
  };
  auto single_plain = [&] {
    fill(one);
    j.start_together();
    auto grad = one.template gradient<float>(0);
    const auto t0 = clk::now();
    g.allreduce_async(grad.data(), grad.data(), grad.size(), kft::dtype::f32, kft::op_kind::avg).wait();
    const double t = seconds(t0, clk::now());
    check(one);
    return t;
  };
  // Each pair alternates on its own, so the 4 MiB pair is not timed right after the 200
  // per-tensor calls (whose aftermath, on 2 cores, lands on whichever variant runs next).
  alternate(j, 2, {bucketed, per_tensor});  // warm-up
  alternate(j, 2, {single_reducer, single_plain});
  out.wrong = 0;
  out.t = alternate(j, reps, {bucketed, per_tensor});
  for (auto& v : alternate(j, reps, {single_reducer, single_plain})) out.t.push_back(std::move(v));
  out.buckets = red.buckets().size();
  return out;
}

void print_bucket_rows(const std::string& transport, const bucket_times& b, std::size_t tensors) {
  const std::string what = std::to_string(tensors) + " tensors: buckets vs per-tensor";
  std::printf("  %-10s %-34s %12.3f %12.3f %10.2f\n", transport.c_str(), what.c_str(), median(b.t[0]) * 1e3,
              median(b.t[1]) * 1e3, median_ratio(b.t[1], b.t[0]));
  std::printf("  %-10s %-34s %12.3f %12.3f %10.2f\n", transport.c_str(), "one 4 MiB tensor: reducer vs plain",
              median(b.t[2]) * 1e3, median(b.t[3]) * 1e3, median_ratio(b.t[3], b.t[2]));
  const double extra = (median(b.t[1]) - median(b.t[0])) / static_cast<double>(tensors > 1 ? tensors - 1 : 1);
  std::printf("  %-10s %-34s %12.1f\n", transport.c_str(), "  cost of each extra call (us)", extra * 1e6);
}

int bucketing(job& j, const std::vector<std::size_t>& counts, std::size_t min_bytes, std::size_t max_bytes, int reps,
              std::uint64_t seed, std::size_t cap, bool with_gloo) {
  auto& pg = j.pg;
  const int tensors = static_cast<int>(counts.size());
  std::size_t total = 0;
  for (auto n : counts) total += n * sizeof(float);
  const auto mine = bucket_rows(j, pg, counts, cap, reps);
  std::int64_t wrong = mine.wrong;
#if KFT_WITH_GLOO
  // The anchors' transport: Gloo's TCP pairs between the same ranks (what PyTorch DDP uses on
  // CPUs), met through the job's store, on the interface that routes to the store's host.
  std::optional<bucket_times> theirs;
  std::string gloo_where;
  if (with_gloo && pg.size() > 1) {
    const auto nic = kft::group::gloo_interface(j.me, j.env);
    gloo_where = nic.name + " " + nic.address;
    kft::gloo::communicator gc(std::make_shared<kft::rendezvous::prefix_store>(j.store, "ddp-perf-gloo/"),
                               pg.rank(), pg.size(), kft::gloo::make_device(nic));
    theirs = bucket_rows(j, gc, counts, cap, reps);
    wrong += theirs->wrong;
  }
#else
  if (with_gloo && pg.rank() == 0) std::printf("# --gloo: this build has no Gloo (KFT_WITH_GLOO=OFF)\n");
#endif
  pg.allreduce(&wrong, &wrong, 1, kft::dtype::i64, kft::op_kind::sum);
  if (pg.rank() == 0) {
    std::printf("# ddp_perf bucketing: %d ranks (%s), %s\n", pg.size(), pg.description().c_str(), cpu_model().c_str());
    std::printf("# %d f32 tensors of %zu B - %zu B (log-uniform, seed %" PRIu64 "), %.1f MiB in all; %zu bucket(s) "
                "(first 1 MiB, cap %.1f MiB); medians of %d alternating repetitions, slowest rank\n",
                tensors, min_bytes, max_bytes, seed, static_cast<double>(total) / (1 << 20), mine.buckets,
                static_cast<double>(cap) / (1 << 20), reps);
    std::printf("# kft = the reducer's buckets, other = one asynchronous allreduce per tensor on the same memory\n");
    std::printf("# %-10s %-34s %12s %12s %10s\n", "transport", "case", "kft (ms)", "other (ms)", "other/kft");
    print_bucket_rows("group", mine, counts.size());
#if KFT_WITH_GLOO
    if (theirs) {
      std::printf("#   gloo: a kft::gloo::communicator over the same ranks (TCP on %s), the transport PyTorch DDP uses on CPUs\n",
                  gloo_where.c_str());
      print_bucket_rows("gloo", *theirs, counts.size());
    }
#endif
    std::printf("# wrong values: %" PRId64 "\n", wrong);
  }
  return wrong == 0 ? 0 : 1;
}

// ---- compute ----------------------------------------------------------------------------------

int compute(job& j, int layers, int width, int batch, int reps, int blas_threads) {
  auto& pg = j.pg;
  openblas_set_num_threads(blas_threads);
  const auto W = static_cast<std::size_t>(width), N = static_cast<std::size_t>(batch);
  const auto L = static_cast<std::size_t>(layers);
  std::mt19937 rng(1234u + static_cast<unsigned>(pg.rank()));  // each rank its own data, as DDP's shards
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(W)));
  // Weights (the same on every rank: one seed), activations of a forward pass (this rank's batch).
  std::mt19937 wrng(99u);
  std::vector<std::vector<float>> w(L, std::vector<float>(W * W)), h(L + 1, std::vector<float>(N * W));
  for (auto& m : w)
    for (auto& x : m) x = nd(wrng);
  for (auto& x : h[0]) x = nd(rng) * std::sqrt(static_cast<float>(W));
  for (std::size_t l = 0; l < L; ++l) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, width, width, 1.0f, h[l].data(), width, w[l].data(),
                width, 0.0f, h[l + 1].data(), width);
    for (auto& x : h[l + 1]) x = std::max(x, 0.0f);  // ReLU
  }
  std::vector<float> dy0(N * W), dy(N * W), dx(N * W);
  for (auto& x : dy0) x = nd(rng);

  std::vector<ddp::parameter> params;
  for (std::size_t l = 0; l < L; ++l) params.push_back({W * W, kft::dtype::f32, "fc" + std::to_string(l) + ".weight"});
  ddp::reducer fast(pg, params);
  ddp::reducer fixed(pg, params, {.deterministic = true});
  if (!fast.shared_storage() || !fixed.shared_storage())
    std::fprintf(stderr, "ddp_perf: bucket storage is not in the shared segment (%s reducer): numbers include copies\n",
                 fast.shared_storage() ? "deterministic" : "default");

  // One backward pass into `r`'s gradients; `overlap`: mark each layer as soon as its dW is done.
  auto backward = [&](auto& r, bool overlap) {
    std::copy(dy0.begin(), dy0.end(), dy.begin());
    for (std::size_t l = L; l-- > 0;) {
      float* dw = r.template gradient<float>(l).data();
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, width, width, batch, 1.0f, h[l].data(), width, dy.data(),
                  width, 0.0f, dw, width);
      if (overlap) r.mark_ready(l);
      if (l == 0) break;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, width, width, 1.0f, dy.data(), width, w[l].data(),
                  width, 0.0f, dx.data(), width);
      for (std::size_t i = 0; i < N * W; ++i) dy[i] = h[l][i] > 0.0f ? dx[i] : 0.0f;  // ReLU'
    }
    if (!overlap)
      for (std::size_t l = L; l-- > 0;) r.mark_ready(l);
  };
  auto timed = [&](auto& r, bool overlap) {
    const auto t0 = clk::now();
    backward(r, overlap);
    r.finish();
    return seconds(t0, clk::now());
  };
  auto T = [&] { return timed(fast, true); };
  auto A = [&] { return timed(fast, false); };
  auto D = [&] { return timed(fixed, true); };
  auto B = [&] {
    auto guard = fast.no_sync();
    const double t = timed(fast, true);
    return t;
  };
  auto C = [&] {
    const auto t0 = clk::now();
    for (std::size_t l = L; l-- > 0;) fast.mark_ready(l);
    fast.finish();
    return seconds(t0, clk::now());
  };
  alternate(j, 3, {T, A, D, B, C});  // warm-up (the first synced step rebuilds `fast`'s buckets)
  const auto t = alternate(j, reps, {T, A, D, B, C});

  // Checks: the two reducers' gradients of one more overlapped step agree with each other, and
  // every rank holds the same bits.
  timed(fast, true);
  timed(fixed, true);
  std::uint64_t hf = kft::detail::fnv1a_basis, hd = hf;
  for (std::size_t l = 0; l < L; ++l) {
    auto a = fast.gradient<float>(l);
    auto b = fixed.gradient<float>(l);
    hf = fnv(a.data(), a.size_bytes(), hf);
    hd = fnv(b.data(), b.size_bytes(), hd);
  }
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(pg.size()));
  std::uint64_t mine[2] = {hf, hd};
  pg.allgather(mine, all.data(), 2, kft::dtype::i64);  // 64 bits moved as they are
  std::int64_t wrong = 0;
  for (int r = 0; r < pg.size(); ++r)
    for (int k = 0; k < 2; ++k) wrong += all[2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(k)] != mine[k];
  pg.allreduce(&wrong, &wrong, 1, kft::dtype::i64, kft::op_kind::sum);

  if (pg.rank() == 0) {
    std::vector<double> h_of;
    for (std::size_t i = 0; i < t[0].size(); ++i)
      h_of.push_back(1.0 - std::max(0.0, t[0][i] - t[3][i]) / t[4][i]);
    const double flops = 2.0 * static_cast<double>(N * W * W) * (2.0 * static_cast<double>(L) - 1.0);
    std::printf("# ddp_perf compute: %d ranks (%s), %s, OpenBLAS %s, %d BLAS thread(s) per rank\n", pg.size(),
                pg.description().c_str(), cpu_model().c_str(), openblas_get_config(), blas_threads);
    std::printf("# MLP backward: %d layers of %dx%d f32 weights (%.1f MiB of gradients), batch %d per rank, "
                "%.2f GFLOP per backward; %zu bucket(s); medians of %d alternating repetitions, slowest rank\n",
                layers, width, width, static_cast<double>(L * W * W * sizeof(float)) / (1 << 20), batch, flops * 1e-9,
                fast.buckets().size(), reps);
    std::printf("# T = overlap, A = allreduce after backward, D = deterministic (overlap), B = backward alone, "
                "C = communication alone; H = 1 - max(0, T - B) / C\n");
    std::printf("# %9s %9s %9s %9s %9s %7s %7s %7s\n", "T (ms)", "A (ms)", "D (ms)", "B (ms)", "C (ms)", "H", "A/T",
                "D/T");
    std::printf("  %9.3f %9.3f %9.3f %9.3f %9.3f %7.2f %7.3f %7.3f\n", median(t[0]) * 1e3, median(t[1]) * 1e3,
                median(t[2]) * 1e3, median(t[3]) * 1e3, median(t[4]) * 1e3, median(h_of), median_ratio(t[1], t[0]),
                median_ratio(t[2], t[0]));
    std::printf("# overlap and deterministic gradients bit-identical: %s\n", hf == hd ? "yes" : "no");
    std::printf("# wrong values: %" PRId64 " (ranks whose gradients differ from rank 0's)\n", wrong);
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the DDP reducer against per-tensor allreduces and allreduce-after-backward"};
  app.require_subcommand(1);
  int reps = 15;
  app.add_option("--reps", reps, "repetitions of each variant (medians)")->capture_default_str()->check(CLI::PositiveNumber);

  auto* b = app.add_subcommand("bucketing", "200 small tensors: buckets vs one allreduce each; one 4 MiB tensor");
  int tensors = 200;
  std::string min_s = "1K", max_s = "1M";
  std::uint64_t seed = 1;
  b->add_option("--tensors", tensors, "how many gradients")->capture_default_str()->check(CLI::PositiveNumber);
  b->add_option("--min", min_s, "smallest gradient (bytes, K/M suffix)")->capture_default_str();
  b->add_option("--max", max_s, "largest gradient")->capture_default_str();
  b->add_option("--seed", seed, "sizes' random seed")->capture_default_str();
  std::string cap_s = "25M";
  b->add_option("--cap", cap_s, "bucket cap (bytes, K/M suffix)")->capture_default_str();
  bool with_gloo = false, list_sizes = false;
  b->add_flag("--list-sizes", list_sizes, "print the gradients' element counts, one per line, and exit (bench/ddp/ddp_bucketing_torch.py reads them)");
  b->add_flag("--gloo", with_gloo, "also time both over Gloo's TCP transport between the same ranks (the anchors' regime)");

  auto* c = app.add_subcommand("compute", "an MLP backward through OpenBLAS: overlap vs after-backward vs deterministic");
  int layers = 8, width = 1024, batch = 64, threads = 1;
  c->add_option("--layers", layers, "layers (one weight each)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--width", width, "layer width (weights are width x width)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--batch", batch, "rows per rank")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--blas-threads", threads, "OpenBLAS threads per rank")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*b) {
      const std::size_t lo = parse_size(min_s), hi = parse_size(max_s);
      if (lo < sizeof(float) || hi < lo) throw std::invalid_argument("--min/--max: need 4 <= min <= max");
      const auto counts = tensor_counts(tensors, lo, hi, seed);
      if (list_sizes) {
        std::printf("# ddp_perf bucketing: %d f32 tensors of %zu B - %zu B (log-uniform, seed %" PRIu64 "), element counts\n",
                    tensors, lo, hi, seed);
        for (auto n : counts) std::printf("%zu\n", n);
        return 0;
      }
      std::size_t bytes = 0;
      for (auto n : counts) bytes += n * sizeof(float);
      job j(bytes + (4u << 20) + (8u << 20));  // the buckets, the 4 MiB tensor, alignment
      return bucketing(j, counts, lo, hi, reps, seed, parse_size(cap_s), with_gloo);
    }
    const std::size_t grad_bytes = static_cast<std::size_t>(layers) * static_cast<std::size_t>(width) *
                                   static_cast<std::size_t>(width) * sizeof(float);
    job j(3 * grad_bytes + (8u << 20));  // two reducers, and the first one's rebuild
    return compute(j, layers, width, batch, reps, threads);
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "ddp_perf: %s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ddp_perf: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_perf: %s\n", e.what());
    return 1;
  }
}
