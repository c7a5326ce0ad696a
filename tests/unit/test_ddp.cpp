// SPDX-License-Identifier: Apache-2.0
// The DDP reducer with ranks as threads over the shared-memory process group: bucket
// assignment (a pure function), results against a fixed-order reference for 1-4 ranks, odd
// sizes, mixed dtypes and ready orders shuffled per rank and per step, every error it raises,
// accumulation, unused parameters, compression, and deterministic mode.
#define BOOST_TEST_MODULE kft_ddp
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <kft/core/hash.hpp>
#include <kft/ddp/reducer.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/memory_store.hpp>
#include <kft/transport/shm/communicator.hpp>

#include "../common/reference.hpp"
#include "../common/rank_errors.hpp"
#include "../common/shm_ranks.hpp"

using namespace std::chrono_literals;
namespace ddp = kft::ddp;

namespace {

std::vector<std::string> with_ranks(int p, const std::function<void(kft::group::process_group&)>& body,
                                    std::size_t pool = 64u << 20, std::chrono::milliseconds timeout = 30s) {
  return kft_test::with_shm_ranks(p, body, {.pool = pool, .timeout = timeout});
}

using kft_test::none;

// What rank r contributes to element j of parameter i in step s: a small integer (exact sums).
double contribution(int r, std::size_t i, std::size_t j, std::uint64_t s) {
  return static_cast<double>((static_cast<std::size_t>(r) * 5 + i * 3 + j * 7 + s * 11) % 13) - 6.0;
}

std::vector<ddp::parameter> model(std::vector<std::pair<std::size_t, kft::dtype>> shapes) {
  std::vector<ddp::parameter> ps;
  for (std::size_t i = 0; i < shapes.size(); ++i) ps.push_back({shapes[i].first, shapes[i].second, "p" + std::to_string(i)});
  return ps;
}

// One step: write every gradient, mark them in a shuffled order, finish; count elements that
// differ from the average (within one rounding of an average), and hash the results.
template <class Reducer>
std::size_t step(Reducer& red, kft::group::process_group& g, std::uint64_t s, std::uint64_t order_seed,
                 std::uint64_t* hash = nullptr) {
  const auto n = red.parameters();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(order_seed);
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t i : order) {
    const auto& p = red.param(i);
    void* data = red.gradient_data(i);
    for (std::size_t j = 0; j < p.count; ++j) kft_test::put(p.type, data, j, contribution(g.rank(), i, j, s));
    red.mark_ready(i);
  }
  red.finish();
  std::size_t wrong = 0;
  std::uint64_t h = kft::detail::fnv1a_basis;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& p = red.param(i);
    const void* data = red.gradient_data(i);
    for (std::size_t j = 0; j < p.count; ++j) {
      double sum = 0;
      for (int r = 0; r < g.size(); ++r) sum += contribution(r, i, j, s);
      const double want = sum / g.size(), got = kft_test::get(p.type, data, j);
      if (!kft_test::close_enough(got, want, p.type, kft::op_kind::avg)) ++wrong;
    }
    h ^= kft_test::bits_hash(data, p.count * kft::size_of(p.type)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  if (hash) *hash = h;
  return wrong;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(buckets)

BOOST_AUTO_TEST_CASE(reverse_order_small_first_bucket_then_the_cap) {
  // 10 f32 parameters of 100 KiB each: first bucket closes at 1 MiB... use small limits.
  auto ps = model({{100, kft::dtype::f32}, {100, kft::dtype::f32}, {100, kft::dtype::f32}, {100, kft::dtype::f32},
                   {100, kft::dtype::f32}});
  const auto b = ddp::assign_buckets(ps, {.first_bucket_bytes = 400, .bucket_bytes_cap = 800});
  // From the last parameter: {4} reaches 400 B (first limit), then {3, 2} reach 800, then {1, 0}.
  BOOST_TEST(b.size() == 3u);
  BOOST_TEST((b[0] == std::vector<std::size_t>{4}));
  BOOST_TEST((b[1] == std::vector<std::size_t>{3, 2}));
  BOOST_TEST((b[2] == std::vector<std::size_t>{1, 0}));
}

BOOST_AUTO_TEST_CASE(a_bucket_closes_after_the_parameter_that_crosses_the_cap) {
  auto ps = model({{10, kft::dtype::f32}, {1000, kft::dtype::f32}, {10, kft::dtype::f32}});
  const auto b = ddp::assign_buckets(ps, {.first_bucket_bytes = 100, .bucket_bytes_cap = 100});
  BOOST_TEST(b.size() == 2u);
  BOOST_TEST((b[0] == std::vector<std::size_t>{2, 1}));  // 40 B, then 4040 B >= 100: closes, over the cap
  BOOST_TEST((b[1] == std::vector<std::size_t>{0}));     // still open at the end
}

BOOST_AUTO_TEST_CASE(one_dtype_per_bucket_and_an_explicit_order) {
  auto ps = model({{100, kft::dtype::f32}, {100, kft::dtype::bf16}, {100, kft::dtype::f32}, {100, kft::dtype::bf16}});
  const auto b = ddp::assign_buckets(ps, {.first_bucket_bytes = 1u << 20, .bucket_bytes_cap = 1u << 20});
  BOOST_TEST(b.size() == 2u);
  BOOST_TEST((b[0] == std::vector<std::size_t>{3, 1}));  // bf16, opened first (parameter 3)
  BOOST_TEST((b[1] == std::vector<std::size_t>{2, 0}));
  const std::vector<std::size_t> order{0, 1, 2, 3};
  const auto c = ddp::assign_buckets(ps, {.first_bucket_bytes = 1u << 20, .bucket_bytes_cap = 1u << 20}, order);
  BOOST_TEST((c[0] == std::vector<std::size_t>{0, 2}));
  BOOST_TEST(ddp::fingerprint(ps, b) != ddp::fingerprint(ps, c));
  BOOST_TEST(ddp::fingerprint(ps, b) == ddp::fingerprint(ps, ddp::assign_buckets(ps, {.first_bucket_bytes = 1u << 20,
                                                                                       .bucket_bytes_cap = 1u << 20})));
  const std::vector<std::size_t> bad{0, 1, 1, 3};
  BOOST_CHECK_THROW(ddp::assign_buckets(ps, {}, bad), kft::usage_error);
  BOOST_CHECK_THROW(ddp::assign_buckets(ps, {.first_bucket_bytes = 0}), kft::usage_error);
}

BOOST_AUTO_TEST_CASE(the_auto_cap_follows_the_measured_cost) {
  // alpha = 10 us, 1 GB/s: a 5% overhead needs alpha x 0.95 / (0.05 x beta) = 190 000 B -> 196 608 (3 x 64 KiB),
  // below the 256 KiB floor; with alpha = 100 us: 1 900 000 B -> 1 900 544 (29 x 64 KiB).
  BOOST_TEST(ddp::choose_bucket_cap({10e-6, 1e-9}) == 256u << 10);
  BOOST_TEST(ddp::choose_bucket_cap({100e-6, 1e-9}) == 29u * (64u << 10));
  BOOST_TEST(ddp::choose_bucket_cap({100e-6, 1e-9}, 0.01) == 152u * (64u << 10));  // 9.9 MB: a stricter overhead, a bigger cap
  BOOST_TEST(ddp::choose_bucket_cap({1e-3, 1e-12}) == 64u << 20);                   // a fast link: the ceiling
  BOOST_TEST(ddp::choose_bucket_cap({10e-6, 0.0}) == 64u << 20);                    // no usable slope: the ceiling
  BOOST_TEST(ddp::choose_bucket_cap({10e-6, -1e-9}) == 64u << 20);
  BOOST_TEST(ddp::choose_bucket_cap({-5e-6, 1e-9}) == 256u << 10);                  // negative alpha counts as 0
  BOOST_CHECK_THROW(ddp::choose_bucket_cap({1e-6, 1e-9}, 1.5), kft::usage_error);
  BOOST_CHECK_THROW(ddp::choose_bucket_cap({1e-6, 1e-9}, 0.05, 2u << 20, 1u << 20), kft::usage_error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reducer)

BOOST_AUTO_TEST_CASE(the_auto_cap_is_measured_and_agreed_by_every_rank) {
  const int p = 3;
  const auto shapes = model({{300000, kft::dtype::f32}, {7, kft::dtype::f32}, {200000, kft::dtype::f32},
                             {1u << 20, kft::dtype::f32}, {4099, kft::dtype::f32}});
  std::vector<std::size_t> caps(p);
  std::vector<double> alphas(p), betas(p);
  std::vector<std::uint32_t> prints(p);
  std::atomic<std::size_t> wrong{0};
  const auto errors = with_ranks(p, [&](kft::group::process_group& g) {
    ddp::reducer r(g, shapes, {.auto_bucket_cap = true});
    const auto me = static_cast<std::size_t>(g.rank());
    caps[me] = r.limits().bucket_bytes_cap;
    alphas[me] = r.measured_link().alpha_s;
    betas[me] = r.measured_link().beta_s_per_byte;
    prints[me] = ddp::fingerprint(shapes, r.buckets());
    wrong += step(r, g, 0, 11 + me);
  });
  BOOST_TEST(none(errors));
  BOOST_TEST(wrong.load() == 0u);
  for (int r = 1; r < p; ++r) {
    BOOST_TEST(caps[static_cast<std::size_t>(r)] == caps[0]);
    BOOST_TEST(alphas[static_cast<std::size_t>(r)] == alphas[0]);  // the slowest rank's timings, on every rank
    BOOST_TEST(betas[static_cast<std::size_t>(r)] == betas[0]);
    BOOST_TEST(prints[static_cast<std::size_t>(r)] == prints[0]);
  }
  BOOST_TEST(caps[0] == ddp::choose_bucket_cap({alphas[0], betas[0]}));
  BOOST_TEST_MESSAGE("measured alpha " << alphas[0] * 1e6 << " us, " << 1e-9 / betas[0] << " GB/s -> cap "
                                       << caps[0] << " B");
}

BOOST_AUTO_TEST_CASE(averages_match_the_reference_for_1_to_4_ranks) {
  const auto shapes = model({{1, kft::dtype::f32}, {7, kft::dtype::f64}, {1023, kft::dtype::bf16},
                             {(1u << 20) + 3, kft::dtype::f32}, {4099, kft::dtype::f32}, {33, kft::dtype::bf16}});
  for (int p = 1; p <= 4; ++p) {
    std::atomic<std::size_t> wrong{0}, hash_mismatch{0};
    std::vector<std::uint64_t> hashes(static_cast<std::size_t>(p) * 3);
    const auto errors = with_ranks(p, [&](kft::group::process_group& g) {
      ddp::reducer r(g, shapes, {.limits = {.first_bucket_bytes = 64u << 10, .bucket_bytes_cap = 1u << 20}});
      for (std::uint64_t s = 0; s < 3; ++s)  // step 1 rebuilds the buckets from rank 0's order
        wrong += step(r, g, s, 1000 * s + static_cast<std::uint64_t>(g.rank()) * 7 + 1,
                      &hashes[s * static_cast<std::size_t>(p) + static_cast<std::size_t>(g.rank())]);
      if (r.layout_version() < 1) throw std::runtime_error("no layout");
    });
    BOOST_TEST(none(errors));
    BOOST_TEST(wrong.load() == 0u, p << " ranks");
    for (std::size_t s = 0; s < 3; ++s)
      for (int r = 1; r < p; ++r)
        if (hashes[s * static_cast<std::size_t>(p) + static_cast<std::size_t>(r)] != hashes[s * static_cast<std::size_t>(p)])
          ++hash_mismatch;
    BOOST_TEST(hash_mismatch.load() == 0u, "every rank's gradients are bit-identical");
  }
}

BOOST_AUTO_TEST_CASE(buckets_launch_in_order_and_storage_is_shared) {
  const auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{1000, kft::dtype::f32}, {1000, kft::dtype::f32}, {1000, kft::dtype::f32}}),
                   {.limits = {.first_bucket_bytes = 4000, .bucket_bytes_cap = 4000}});
    if (!r.shared_storage()) throw std::runtime_error("bucket storage is not in the shared segment");
    if (r.buckets().size() != 3u) throw std::runtime_error("expected 3 buckets");
    const auto before = g.sequence();
    // Bucket 0 (parameter 2) marked last: nothing may launch before it.
    r.mark_ready(0);
    r.mark_ready(1);
    if (g.sequence() != before) throw std::runtime_error("a bucket launched before the ones below it were ready");
    r.mark_ready(2);
    if (g.sequence() != before + 3) throw std::runtime_error("three buckets should be in flight");
    r.finish();
  });
  BOOST_TEST(none(errors));
}

BOOST_AUTO_TEST_CASE(a_parameter_marked_twice_is_an_error_at_once) {
  const auto errors = with_ranks(1, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}, {10, kft::dtype::f32}}));
    r.mark_ready(1);
    r.mark_ready(1);
  });
  BOOST_TEST(errors[0].find("parameter 'p1' (index 1) was marked ready twice in step 1") != std::string::npos, errors[0]);
}

BOOST_AUTO_TEST_CASE(a_parameter_never_marked_is_named_on_every_rank) {
  const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}, {10, kft::dtype::f32}, {10, kft::dtype::f32}}),
                   {.limits = {.first_bucket_bytes = 40, .bucket_bytes_cap = 40}});
    for (std::size_t i = 0; i < 3; ++i)
      if (!(g.rank() == 1 && i == 0)) r.mark_ready(i);  // rank 1 never marks p0
    r.finish();
  }, 64u << 20, 20s);
  BOOST_TEST(errors[1].find("parameter 'p0' (index 0, bucket 2) was never marked ready on rank 1 before finish() in step 1") !=
                 std::string::npos,
             errors[1]);
  for (int r : {0, 2}) {
    // (their first unfinished bucket fails: the group was stopped with rank 1's reason)
    BOOST_TEST(errors[static_cast<std::size_t>(r)].find("of step 1") != std::string::npos, errors[static_cast<std::size_t>(r)]);
    BOOST_TEST(errors[static_cast<std::size_t>(r)].find("'p0' (index 0, bucket 2) was never marked ready on rank 1") !=
                   std::string::npos,
               errors[static_cast<std::size_t>(r)]);
  }
}

BOOST_AUTO_TEST_CASE(different_models_are_refused_at_construction) {
  const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}, {g.rank() == 2 ? 64u : 128u, kft::dtype::f32}}));
  });
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST(errors[static_cast<std::size_t>(r)].find("parameter 1 ('p1'): rank 0 has f32 x 128, rank 2 has") !=
                   std::string::npos,
               errors[static_cast<std::size_t>(r)]);
  }
  BOOST_TEST(errors[2].find("rank 2 has f32 x 64") != std::string::npos, errors[2]);
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_reaches_a_bucket_is_a_timeout_naming_bucket_and_step) {
  const auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{100, kft::dtype::f32}}), {.timeout = 300ms});
    if (g.rank() == 1) {
      std::this_thread::sleep_for(1500ms);  // stuck in its backward
      return;
    }
    r.mark_ready(0);
    r.finish();
  }, 64u << 20, 5s);
  BOOST_TEST_MESSAGE(errors[0]);
  BOOST_TEST(errors[0].find("bucket 0 of step 1 (1 parameter(s): 'p0') did not complete") != std::string::npos, errors[0]);
  BOOST_TEST(errors[0].find("timed out after 300 ms") != std::string::npos, errors[0]);
  BOOST_TEST(errors[0].find("waiting for rank(s) 1") != std::string::npos, errors[0]);
}

BOOST_AUTO_TEST_CASE(no_sync_micro_steps_send_nothing_and_the_synced_step_reduces_the_sum) {
  std::atomic<std::size_t> wrong{0};
  const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{257, kft::dtype::f32}, {31, kft::dtype::f64}}), {.rebuild_buckets = false});
    const auto start = g.sequence();
    r.zero_grad();
    for (int micro = 0; micro < 4; ++micro) {
      std::optional<decltype(r.no_sync())> guard;
      if (micro < 3) guard.emplace(r.no_sync());
      for (std::size_t i = 0; i < 2; ++i) {
        const auto& p = r.param(i);
        for (std::size_t j = 0; j < p.count; ++j) {
          void* d = r.gradient_data(i);
          kft_test::put(p.type, d, j, kft_test::get(p.type, d, j) + contribution(g.rank(), i, j, static_cast<std::uint64_t>(micro)));
        }
        r.mark_ready(i);
      }
      r.finish();
    }
    if (g.sequence() - start != r.buckets().size()) throw std::runtime_error("4 micro-steps issued more than one step's collectives");
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < r.param(i).count; ++j) {
        double sum = 0;
        for (int rank = 0; rank < 3; ++rank)
          for (std::uint64_t m = 0; m < 4; ++m) sum += contribution(rank, i, j, m);
        if (!kft_test::close_enough(kft_test::get(r.param(i).type, r.gradient_data(i), j), sum / 3, r.param(i).type,
                                    kft::op_kind::avg))
          ++wrong;
      }
  });
  BOOST_TEST(none(errors));
  BOOST_TEST(wrong.load() == 0u);
}

BOOST_AUTO_TEST_CASE(unused_parameters_mode_counts_who_used_what) {
  std::atomic<int> bad{0};
  const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}, {10, kft::dtype::f32}}), {.find_unused_parameters = true});
    auto* g0 = r.gradient<float>(0).data();
    std::fill(g0, g0 + 10, 3.0f);
    r.mark_ready(0);
    if (g.rank() == 0) {  // only rank 0 uses p1
      auto p1 = r.gradient<float>(1);
      std::fill(p1.begin(), p1.end(), 6.0f);
      r.mark_ready(1);
    }
    r.finish();
    if (r.used_by(0) != 3 || r.used_by(1) != 1) ++bad;
    if (r.gradient<float>(1)[0] != 2.0f) ++bad;  // (6 + 0 + 0) / 3
  });
  BOOST_TEST(none(errors));
  BOOST_TEST(bad.load() == 0);
}

BOOST_AUTO_TEST_CASE(bf16_compression_hook_stays_within_bf16_precision) {
  std::atomic<std::size_t> wrong{0};
  const auto errors = with_ranks(2, [&](kft::group::process_group& g) {
    ddp::reducer<kft::group::process_group, ddp::bf16_compress> r(g, model({{5000, kft::dtype::f32}}));
    auto x = r.gradient<float>(0);
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(contribution(g.rank(), 0, j, 0)) * 0.37f;
    r.mark_ready(0);
    r.finish();
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double want = (contribution(0, 0, j, 0) + contribution(1, 0, j, 0)) * 0.37 / 2;
      if (std::fabs(x[j] - want) > 3 * 0x1p-8 * std::max(std::fabs(want), 1.0)) ++wrong;
    }
  });
  BOOST_TEST(none(errors));
  BOOST_TEST(wrong.load() == 0u);
}

// Deterministic mode: the same inputs give the same bits whatever the bucket cap and the
// order gradients arrive in.
BOOST_AUTO_TEST_CASE(deterministic_results_do_not_depend_on_caps_or_arrival_order) {
  const auto shapes = model({{3000, kft::dtype::f32}, {70001, kft::dtype::f32}, {513, kft::dtype::bf16},
                             {20000, kft::dtype::f64}, {9, kft::dtype::f32}});
  std::vector<std::uint64_t> seen;
  std::mutex mu;
  for (std::size_t cap : {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{25} << 20})
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
        ddp::reducer r(g, shapes, {.limits = {.first_bucket_bytes = cap / 4, .bucket_bytes_cap = cap}, .deterministic = true});
        std::uint64_t h = 0;
        step(r, g, 5, seed * 31 + static_cast<std::uint64_t>(g.rank()), &h);
        std::lock_guard lock(mu);
        if (g.rank() == 0) seen.push_back(h);
      });
      BOOST_TEST(none(errors));
    }
  BOOST_REQUIRE(seen.size() == 9u);
  for (auto h : seen) BOOST_TEST(h == seen[0]);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(the_trailer_rides_in_the_last_bucket_with_no_collective_of_its_own) {
  for (const auto type : {kft::dtype::f32, kft::dtype::i64, kft::dtype::f64}) {
    const auto errors = with_ranks(3, [&](kft::group::process_group& g) {
      ddp::reducer r(g, model({{1000, kft::dtype::f32}, {1000, kft::dtype::f32}, {1000, kft::dtype::f32}}),
                     {.limits = {.first_bucket_bytes = 4000, .bucket_bytes_cap = 8001}, .trailer = 2, .trailer_type = type});
      if (r.parameters() != 3u) throw std::runtime_error("the trailer counts as a parameter");
      // Of the gradients' type: in their last bucket; of another: a bucket of its own, last.
      const std::size_t want_buckets = type == kft::dtype::f32 ? 2u : 3u;
      if (r.buckets().size() != want_buckets) throw std::runtime_error("buckets: " + std::to_string(r.buckets().size()));
      if (r.buckets().back().back() != 3u) throw std::runtime_error("the trailer is not the last bucket's last member");
      if (r.holds_gradients(r.buckets().size() - 1) != (type == kft::dtype::f32))
        throw std::runtime_error("holds_gradients() is wrong for the trailer's bucket");
      for (int s = 0; s < 3; ++s) {  // the second step runs on the rebuilt layout
        const auto before = g.sequence();
        for (std::size_t i = 0; i < 3; ++i) {
          auto v = r.gradient<float>(i);
          std::fill(v.begin(), v.end(), static_cast<float>(g.rank() + 1));
          r.mark_ready(i);
        }
        const std::size_t launched = g.sequence() - before;
        if (launched != want_buckets - 1) throw std::runtime_error("the last bucket launched before finish()");
        if (type == kft::dtype::i64) {
          auto t = r.trailer<std::int64_t>();
          t[0] = g.rank() + 1, t[1] = 10 * (g.rank() + 1);
        } else if (type == kft::dtype::f64) {
          auto t = r.trailer<double>();
          t[0] = g.rank() + 1, t[1] = 10 * (g.rank() + 1);
        } else {
          auto t = r.trailer<float>();
          t[0] = static_cast<float>(g.rank() + 1), t[1] = static_cast<float>(10 * (g.rank() + 1));
        }
        r.finish();
        const std::size_t rebuild = s == 0 ? 1 : 0;  // step 1's finish() broadcasts the observed order
        if (g.sequence() - before != want_buckets + rebuild)
          throw std::runtime_error("the trailer cost a collective of its own");
        // The default hook averages: (1 + 2 + 3) / 3 = 2 (integers are summed by a sum hook, averaged here: 2).
        double t0 = 0, t1 = 0;
        if (type == kft::dtype::i64) t0 = static_cast<double>(r.trailer<std::int64_t>()[0]), t1 = static_cast<double>(r.trailer<std::int64_t>()[1]);
        else if (type == kft::dtype::f64) t0 = r.trailer<double>()[0], t1 = r.trailer<double>()[1];
        else t0 = r.trailer<float>()[0], t1 = r.trailer<float>()[1];
        if (t0 != 2.0 || t1 != 20.0)
          throw std::runtime_error("trailer " + std::to_string(t0) + ", " + std::to_string(t1) + " (want 2, 20)");
        if (r.gradient<float>(2)[999] != 2.0f) throw std::runtime_error("a gradient was not averaged");
      }
    });
    BOOST_TEST(none(errors));
  }
  // Misuse is named.
  const auto errors = with_ranks(1, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}}), {.trailer = 2, .trailer_type = kft::dtype::f64});
    (void)r.trailer<float>();
  });
  BOOST_TEST(errors[0].find("trailer<f32>(): the trailer holds f64") != std::string::npos, errors[0]);
  const auto none_here = with_ranks(1, [&](kft::group::process_group& g) {
    ddp::reducer r(g, model({{10, kft::dtype::f32}}));
    (void)r.trailer<float>();
  });
  BOOST_TEST(none_here[0].find("this reducer has none") != std::string::npos, none_here[0]);
}

BOOST_AUTO_TEST_CASE(shards_cover_every_gradient_element_once_across_the_ranks) {
  for (int world : {1, 2, 3, 4}) {
    const auto errors = with_ranks(1, [&](kft::group::process_group& g) {
      const auto n = static_cast<std::size_t>(world);
      ddp::reducer r(g, model({{7, kft::dtype::f32}, {1001, kft::dtype::f32}, {3, kft::dtype::f32}, {500, kft::dtype::f32}}),
                     {.limits = {.first_bucket_bytes = 2000, .bucket_bytes_cap = 3000}, .bucket_multiple = n,
                      .trailer = 2, .trailer_type = kft::dtype::f64});
      std::vector<std::vector<int>> seen(4);
      for (std::size_t i = 0; i < 4; ++i) seen[i].assign(r.param(i).count, 0);
      for (int rank = 0; rank < world; ++rank) {
        std::size_t last_bucket = 0;
        for (const auto& s : r.shard(rank, world)) {
          const std::size_t per = r.bucket_elements(s.bucket) / n;
          if (s.bucket < last_bucket) throw std::runtime_error("pieces out of bucket order");
          last_bucket = s.bucket;
          if (s.at < static_cast<std::size_t>(rank) * per || s.at + s.count > static_cast<std::size_t>(rank + 1) * per)
            throw std::runtime_error("a piece outside rank " + std::to_string(rank) + "'s slice");
          if (s.at != r.offset_in_bucket(s.param) + s.offset) throw std::runtime_error("a piece's position is wrong");
          for (std::size_t e = 0; e < s.count; ++e) ++seen[s.param][s.offset + e];
        }
      }
      for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t e = 0; e < seen[i].size(); ++e)
          if (seen[i][e] != 1)
            throw std::runtime_error(std::to_string(world) + " ranks: element " + std::to_string(e) + " of parameter " +
                                     std::to_string(i) + " is in " + std::to_string(seen[i][e]) + " shards");
      if (world > 1) (void)r.shard(world, world);  // not a rank of that many
    });
    if (world == 1) BOOST_TEST(none(errors));
    else BOOST_TEST(errors[0].find("not a rank of that many") != std::string::npos, errors[0]);
  }
}
