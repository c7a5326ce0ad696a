// SPDX-License-Identifier: Apache-2.0
// A rank of a real multi-process job running the DDP reducer over the job's process group
// (shared memory under kftrun or by hand; shared memory per node + MPI between nodes under
// mpirun with KFT_HOST_ID "nodes"). Driven by tests/integration/ddp_process_test.py. Modes:
//   equivalence  4 steps of a mixed-dtype model (sizes 1, 7, 1023, 4099, 1 Mi + 3; f32, f64,
//                bf16), gradients marked in an order shuffled per rank and per step, checked
//                element by element against the average computed here in rank order (exact
//                values, so any reduction order must give these bits); then deterministic mode
//                with non-exact values under bucket caps 64 KiB, 1 MiB, 25 MiB and shuffled
//                orders. Prints "rank R of P OK layout=H det=D1,D2,D3": H hashes the checked
//                results, D* the deterministic results per cap.
//   kill         rank 1 marks half of its gradients in step 3 and kills itself (SIGKILL); the
//                others' finish() must raise (printed; exit 3).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <kft/ddp/reducer.hpp>
#include <kft/core/hash.hpp>
#include <kft/init.hpp>
#include <kft/kft.hpp>

using namespace std::chrono_literals;
namespace ddp = kft::ddp;

namespace {

std::vector<ddp::parameter> model() {
  const std::pair<std::size_t, kft::dtype> shapes[] = {
      {1, kft::dtype::f32},     {7, kft::dtype::f64},    {1023, kft::dtype::bf16}, {(1u << 20) + 3, kft::dtype::f32},
      {4099, kft::dtype::f32},  {1023, kft::dtype::f64}, {7, kft::dtype::bf16},    {300000, kft::dtype::f32},
      {1023, kft::dtype::f32},  {1, kft::dtype::f64}};
  std::vector<ddp::parameter> ps;
  for (std::size_t i = 0; i < std::size(shapes); ++i)
    ps.push_back({shapes[i].first, shapes[i].second, "layer" + std::to_string(i / 2) + (i % 2 ? ".bias" : ".weight")});
  return ps;
}

// Rank r's gradient element j of parameter i in step s. Exact: small integers, so every sum
// and partial sum (in any order, in f32, f64 or bf16) is exact.
double exact_value(int r, std::size_t i, std::size_t j, int s) {
  return static_cast<double>((static_cast<std::size_t>(r) * 5 + i * 3 + j * 7 + static_cast<std::size_t>(s) * 11) % 9) - 4.0;
}
// Not exact: sums depend on the order of the additions.
double noisy_value(int r, std::size_t i, std::size_t j, int s) {
  const std::uint64_t h = (static_cast<std::uint64_t>(r) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull) ^
                          (j * 0x94d049bb133111ebull) ^ (static_cast<std::uint64_t>(s) << 40);
  return static_cast<double>((h * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53 * 2.0 - 1.0;
}

template <class R>
void write(R& red, std::size_t i, int r, int s, bool exact) {
  const auto& p = red.param(i);
  auto f = [&](std::size_t j) { return exact ? exact_value(r, i, j, s) : noisy_value(r, i, j, s); };
  switch (p.type) {
    case kft::dtype::f32:
      for (std::size_t j = 0; auto& x : red.template gradient<float>(i)) x = static_cast<float>(f(j++));
      break;
    case kft::dtype::f64:
      for (std::size_t j = 0; auto& x : red.template gradient<double>(i)) x = f(j++);
      break;
    case kft::dtype::bf16:
      for (std::size_t j = 0; auto& x : red.template gradient<kft::bfloat16>(i)) x = kft::bfloat16(static_cast<float>(f(j++)));
      break;
    default: throw std::logic_error("dtype");
  }
}

double read(void* base, kft::dtype t, std::size_t j) {
  switch (t) {
    case kft::dtype::f32: return static_cast<float*>(base)[j];
    case kft::dtype::f64: return static_cast<double*>(base)[j];
    case kft::dtype::bf16: return static_cast<float>(static_cast<kft::bfloat16*>(base)[j]);
    default: throw std::logic_error("dtype");
  }
}

// The average of an exact sum over p ranks, divided once in the element's type (bf16: in float,
// rounded once), as every transport's avg does.
double average(kft::dtype t, double sum, int p) {
  switch (t) {
    case kft::dtype::f32: return static_cast<float>(sum) / static_cast<float>(p);
    case kft::dtype::f64: return sum / p;
    case kft::dtype::bf16: return static_cast<float>(kft::bfloat16(static_cast<float>(sum) / static_cast<float>(p)));
    default: throw std::logic_error("dtype");
  }
}

std::uint64_t hash_gradients(ddp::reducer<>& red, std::uint64_t h = kft::detail::fnv1a_basis) {
  for (std::size_t i = 0; i < red.parameters(); ++i)
    h = kft::detail::fnv1a(std::string_view(static_cast<const char*>(red.gradient_data(i)),
                                            red.param(i).count * kft::size_of(red.param(i).type)),
                           h);
  return h;
}

// One step: write, mark in a shuffled order (seeded per rank and step), finish.
void step(ddp::reducer<>& red, int me, int s, bool exact, std::uint64_t seed) {
  std::vector<std::size_t> order(red.parameters());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  red.zero_grad();
  for (std::size_t i : order) {
    write(red, i, me, s, exact);
    red.mark_ready(i);
  }
  red.finish();
}

int equivalence(kft::group::process_group& pg) {
  const int me = pg.rank(), p = pg.size();
  std::size_t wrong = 0;
  std::uint64_t layout_hash = kft::detail::fnv1a_basis;
  {
    ddp::reducer red(pg, model(), {.limits = {.first_bucket_bytes = 16u << 10, .bucket_bytes_cap = 1u << 20}});
    for (int s = 1; s <= 4; ++s) {
      step(red, me, s, true, static_cast<std::uint64_t>(me) * 1000 + static_cast<std::uint64_t>(s));
      for (std::size_t i = 0; i < red.parameters(); ++i) {
        const auto& prm = red.param(i);
        for (std::size_t j = 0; j < prm.count; ++j) {
          double sum = 0;
          for (int r = 0; r < p; ++r) sum += exact_value(r, i, j, s);
          const double want = average(prm.type, sum, p);
          if (read(red.gradient_data(i), prm.type, j) != want && wrong++ < 5)
            std::fprintf(stderr, "rank %d step %d: %s[%zu] = %g, want %g\n", me, s, prm.name.c_str(), j,
                         read(red.gradient_data(i), prm.type, j), want);
        }
      }
      layout_hash = hash_gradients(red, layout_hash);
    }
    if (red.layout_version() < 1) wrong++;
  }
  std::string det;
  for (std::size_t cap : {64u << 10, 1u << 20, 25u << 20}) {
    ddp::reducer red(pg, model(), {.limits = {.first_bucket_bytes = std::min<std::size_t>(cap, 1u << 20), .bucket_bytes_cap = cap},
                                   .deterministic = true});
    std::uint64_t h = kft::detail::fnv1a_basis;
    for (int s = 1; s <= 2; ++s) {
      step(red, me, s, false, static_cast<std::uint64_t>(me) * 7919 + cap + static_cast<std::uint64_t>(s));
      h = hash_gradients(red, h);
    }
    det += (det.empty() ? "" : ",") + std::to_string(h);
  }
  if (wrong) {
    std::fprintf(stderr, "rank %d: %zu wrong elements\n", me, wrong);
    return 1;
  }
  std::printf("ddp_worker equivalence: rank %d of %d OK layout=%llu det=%s group=\"%s\"\n", me, p,
              static_cast<unsigned long long>(layout_hash), det.c_str(), pg.description().c_str());
  return 0;
}

int kill_test(kft::group::process_group& pg) {
  const int me = pg.rank();
  ddp::reducer red(pg, model(), {.limits = {.first_bucket_bytes = 16u << 10, .bucket_bytes_cap = 1u << 20}});
  try {
    for (int s = 1; s <= 5; ++s) {
      red.zero_grad();
      for (std::size_t k = red.parameters(); k-- > 0;) {
        if (me == 1 && s == 3 && k == red.parameters() / 2) ::raise(SIGKILL);
        write(red, k, me, s, true);
        red.mark_ready(k);
      }
      red.finish();
    }
  } catch (const kft::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    return 3;
  }
  std::fprintf(stderr, "rank %d: finished every step although rank 1 died\n", me);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "equivalence";
  int status = 0;
  std::optional<kft::session> job;
  try {
    // kftrun, mpirun (MPI initialised here) or ranks started by hand with RANK/MASTER_ADDR.
    kft::init_options o;
    o.group.shm.pool_bytes = 64u << 20;
    o.group.shm.timeout = 30s;
    o.group.shm.name = "ddp-worker";
    o.group.group.warn = false;
    job.emplace(kft::init(argc, argv, std::move(o)));
    auto& pg = job->group();
    if (mode == "equivalence") status = equivalence(pg);
    else if (mode == "kill") status = kill_test(pg);
    else {
      std::fprintf(stderr, "ddp_worker: unknown mode %s\n", mode.c_str());
      status = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_worker: %s\n", e.what());
    status = 1;
  }
#if KFT_WITH_MPI
  // A rank that failed under MPI: the others may wait in a collective; end the whole job.
  if (status != 0 && job && job->owns_mpi()) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  return status;  // ~session: the group, the store, then MPI_Finalize
}
