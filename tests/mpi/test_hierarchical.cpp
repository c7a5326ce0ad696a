// SPDX-License-Identifier: Apache-2.0
// The MPI communicator, node grouping, and flat vs hierarchical allreduce across "nodes", checked
// against a reference computed locally. Ranks of one machine are split into nodes by host
// identity (mpi_group_config::host here; KFT_HOST_ID in the launcher-level tests).
#define BOOST_TEST_MODULE kft_hierarchical
#include <boost/test/unit_test.hpp>

#include "../common/reference.hpp"

#include "mpi_session.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <kft/group/mpi_group.hpp>

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

using kft_test::expected;
using kft_test::input;

// One allreduce through `run`, checked element by element; returns the number of wrong elements
// (each rank checks its own output).
template <class Run>
long check_allreduce(Run&& run, kft::dtype t, kft::op_kind op, std::size_t count, bool in_place) {
  const int me = world_rank(), p = world_size();
  const std::size_t es = kft::size_of(t);
  std::vector<unsigned char> in(std::max<std::size_t>(count * es, 1)), out(in.size());
  for (std::size_t i = 0; i < count; ++i) kft_test::put(t, in.data(), i, input(me, i, op, t));
  if (in_place) out = in;
  run(in_place ? out.data() : in.data(), out.data(), count, t, op);
  long wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = expected(p, i, op, t), got = kft_test::get(t, out.data(), i);
    if (!kft_test::close_enough(got, want, t, op)) {
      if (wrong++ < 3)
        BOOST_TEST_MESSAGE("rank " << me << " " << kft::name(t) << " " << kft::name(op) << " x " << count
                                   << (in_place ? " in place" : "") << ": element " << i << " is " << got
                                   << ", want " << want);
    }
  }
  if (!in_place)  // out of place: the input is left as it was
    for (std::size_t i = 0; i < count; ++i)
      if (kft_test::get(t, in.data(), i) != input(me, i, op, t)) ++wrong;
  return wrong;
}

const std::vector<std::size_t> kCounts = {0, 1, 7, 4099, (1u << 20) + 3};
const std::vector<kft::dtype> kTypes = {kft::dtype::f32, kft::dtype::f64, kft::dtype::f16, kft::dtype::bf16,
                                        kft::dtype::i32, kft::dtype::i64, kft::dtype::u8};
const std::vector<kft::op_kind> kOps = {kft::op_kind::sum, kft::op_kind::prod, kft::op_kind::min, kft::op_kind::max,
                                        kft::op_kind::avg};

// Host identities that split the world into nodes of the given sizes.
std::string host_for(const std::vector<int>& sizes) {
  int r = world_rank();
  for (std::size_t n = 0; n < sizes.size(); ++n) {
    if (r < sizes[n]) return "test-node-" + std::to_string(n);
    r -= sizes[n];
  }
  return "test-node-extra";
}

std::vector<std::vector<int>> layouts_for(int p) {
  switch (p) {
    case 1: return {{1}};
    case 2: return {{2}, {1, 1}};
    case 3: return {{3}, {1, 1, 1}, {2, 1}};
    case 4: return {{2, 2}, {4}, {1, 1, 1, 1}, {3, 1}};
    default: return {{p}};
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(mpi_communicator_collectives) {
  kft::mpi::communicator c;
  const int me = c.rank(), p = c.size();
  long wrong = 0;
  std::uint64_t calls = 0;
  for (auto a : {kft::algo::automatic, kft::algo::ring})  // MPI's allreduce, kft's ring
    for (auto t : kTypes)
      for (auto op : kOps)
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{70001}})
          for (bool ip : {false, true})
            wrong += check_allreduce([&](const void* i, void* o, std::size_t cnt, kft::dtype tt, kft::op_kind k) {
              c.allreduce(i, o, cnt, tt, k, {.algorithm = a});
              ++calls;
            }, t, op, n, ip);
  BOOST_TEST(wrong == 0);

  // broadcast, reduce_scatter, allgather (in and out of place)
  std::vector<std::int64_t> b(33, me == p - 1 ? 42 : -1);
  c.broadcast(std::span<std::int64_t>(b), p - 1);
  for (auto v : b) BOOST_TEST(v == 42);
  std::vector<std::int32_t> rs_in(static_cast<std::size_t>(p) * 5), rs_out(5);
  for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = static_cast<std::int32_t>(i) + me;
  c.reduce_scatter(std::span<const std::int32_t>(rs_in), std::span<std::int32_t>(rs_out), kft::ops::sum);
  for (std::size_t j = 0; j < 5; ++j)
    BOOST_TEST(rs_out[j] == static_cast<std::int32_t>(p * (static_cast<int>(j) + me * 5) + p * (p - 1) / 2));
  // in place: the result lands in this rank's own slot
  c.reduce_scatter(rs_in.data(), rs_in.data() + static_cast<std::size_t>(me) * 5, 5, kft::dtype::i32,
                   kft::op_kind::sum);
  for (std::size_t j = 0; j < 5; ++j) BOOST_TEST(rs_in[static_cast<std::size_t>(me) * 5 + j] == rs_out[j]);
  std::vector<double> ag(static_cast<std::size_t>(p) * 3, 0.0);
  for (int j = 0; j < 3; ++j) ag[static_cast<std::size_t>(me * 3 + j)] = me * 10 + j;
  c.allgather(ag.data() + me * 3, ag.data(), 3, kft::dtype::f64);
  for (int r = 0; r < p; ++r)
    for (int j = 0; j < 3; ++j) BOOST_TEST(ag[static_cast<std::size_t>(r * 3 + j)] == r * 10 + j);
  c.barrier();
  BOOST_TEST(c.sequence() == calls + 5);  // every call numbered
}

BOOST_AUTO_TEST_CASE(split_gives_rails) {
  kft::mpi::communicator c;
  const int me = c.rank(), p = c.size();
  auto even = c.split(me % 2, me);
  BOOST_TEST(even.valid());
  BOOST_TEST(even.size() == (p + 1 - me % 2) / 2);
  BOOST_TEST(even.rank() == me / 2);
  auto none = c.split(me == 0 ? -1 : 0, me);
  BOOST_TEST(none.valid() == (me != 0));
  if (me == 0) BOOST_CHECK_THROW(none.barrier(), kft::usage_error);
  auto moved = std::move(even);
  BOOST_TEST(moved.valid());
  BOOST_TEST(!even.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
}

BOOST_AUTO_TEST_CASE(signature_mismatch_names_both_ranks) {
  if (world_size() < 2) {
    BOOST_TEST_MESSAGE("one rank: no peer to disagree with");
    return;
  }
  kft::mpi::config cfg;
  cfg.check_signatures = true;
  kft::mpi::communicator c(MPI_COMM_WORLD, cfg);
  std::vector<float> x(c.rank() == 1 ? 8 : 4, 1.0f);
  try {
    c.allreduce(std::span<float>(x), kft::ops::sum);
    BOOST_FAIL("no mismatch_error");
  } catch (const kft::mismatch_error& e) {
    const std::string m = e.what();
    BOOST_TEST_MESSAGE(m);
    BOOST_TEST(m.find("count " + std::to_string(c.rank() == 1 ? 4 : 8)) != std::string::npos);
    BOOST_TEST(m.find("mpi allreduce #1") != std::string::npos);
  }
  BOOST_CHECK_THROW(c.barrier(), kft::usage_error);  // stopped by the mismatch
}

BOOST_AUTO_TEST_CASE(layouts_flat_and_hierarchical_match_the_reference) {
  const int p = world_size();
  for (const auto& sizes : layouts_for(p)) {
    for (std::size_t small : {std::size_t{64} << 10, std::size_t{256}}) {
      kft::group::mpi_group_config cfg;
      cfg.host = host_for(sizes);
      cfg.group.warn = false;
      cfg.group.hierarchical.chunk_bytes = 64u << 10;  // many pipeline chunks even at 1 MiB
      cfg.group.hierarchical.small_bytes = small;      // 256: the pipelined path from 4099 elements
      auto g = kft::group::mpi_group(MPI_COMM_WORLD, kft::environment::process(), cfg);
      auto& w = *g;
      const auto& lay = w.layout();
      BOOST_TEST(lay.nodes() == static_cast<int>(sizes.size()));
      BOOST_TEST(lay.local_size() == sizes[static_cast<std::size_t>(lay.node())]);
      BOOST_TEST(w.intra().size() == lay.local_size());
      BOOST_TEST(w.rail().size() == static_cast<int>(lay.rail(lay.local_rank()).size()));
      const bool uneven = !lay.uniform();
      BOOST_TEST(w.fallback_reason().empty() == !uneven);
      for (std::size_t bytes : {std::size_t{8}, std::size_t{16} << 20}) {
        const auto a = w.choose(bytes);
        if (lay.nodes() == 1) BOOST_TEST((a == kft::algo::one_shot || a == kft::algo::two_shot));
        else BOOST_TEST((a == (uneven ? kft::algo::flat : kft::algo::hierarchical)));
        BOOST_TEST((w.choose(bytes, kft::algo::flat) == kft::algo::flat));
        if (uneven) BOOST_TEST((w.choose(bytes, kft::algo::hierarchical) == kft::algo::flat));
      }
      long wrong = 0;
      // (across nodes `automatic` is flat or hierarchical, as checked above: both run below; on
      // one node it is the node's own algorithms, which only it reaches)
      for (auto forced : {kft::algo::automatic, kft::algo::flat, kft::algo::hierarchical})
        for (auto t : kTypes) {
          if (forced == kft::algo::automatic && lay.nodes() > 1) break;
          for (auto op : kOps)
            for (std::size_t n : kCounts) {
              if (n > 5000 && (t != kft::dtype::f32 && t != kft::dtype::i64)) continue;  // keep the suite quick
              for (bool ip : {false, true})
                wrong += check_allreduce([&](const void* i, void* o, std::size_t cnt, kft::dtype tt, kft::op_kind k) {
                  w.allreduce(i, o, cnt, tt, k, {.algorithm = forced});
                }, t, op, n, ip);
            }
        }
      BOOST_TEST_MESSAGE("layout " << lay.describe() << ", small_bytes " << small << ": " << wrong << " wrong");
      BOOST_TEST(wrong == 0);
    }
  }
}

// Under a launcher that sets KFT_HOST_ID per rank (tests/CMakeLists.txt): the default host
// identity groups ranks, and the layout matches what the launcher was told.
BOOST_AUTO_TEST_CASE(host_id_from_the_environment) {
  const char* want = std::getenv("KFT_TEST_EXPECT_LAYOUT");
  if (want == nullptr) {
    BOOST_TEST_MESSAGE("KFT_TEST_EXPECT_LAYOUT not set: runs only in the KFT_HOST_ID tests");
    return;
  }
  auto g = kft::group::mpi_group();
  auto& w = *g;
  BOOST_TEST(w.layout().describe() == want);
  BOOST_TEST(w.fallback_reason().empty() == w.layout().uniform());
  long wrong = 0;
  for (auto op : kOps)
    for (std::size_t n : kCounts)
      wrong += check_allreduce([&](const void* i, void* o, std::size_t cnt, kft::dtype tt, kft::op_kind k) {
        w.allreduce(i, o, cnt, tt, k);
      }, kft::dtype::f32, op, n, false);
  BOOST_TEST(wrong == 0);
}

// Every wait has a deadline: rank 0 calls a collective the others join late or never; it gets
// a timeout_error naming the call, and the communicator refuses further calls. MPI's own
// collective cannot be withdrawn, so the others join it afterwards (it completes and MPI can
// finalise); the ring's point-to-point messages are cancelled on timeout, so they never join.
BOOST_AUTO_TEST_CASE(mpi_collective_times_out) {
  if (world_size() < 2) {
    BOOST_TEST_MESSAGE("one rank: nobody to wait for");
    return;
  }
  for (auto a : {kft::algo::automatic, kft::algo::ring}) {
    kft::mpi::communicator c;
    std::vector<float> x(1024, 1.0f);
    if (c.rank() == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.allreduce(std::span<float>(x), kft::ops::sum, {.algorithm = a, .timeout = std::chrono::milliseconds(300)});
        BOOST_FAIL("no timeout_error");
      } catch (const kft::timeout_error& e) {
        const std::string m = e.what();
        BOOST_TEST_MESSAGE(m);
        BOOST_TEST(m.find("mpi allreduce #1") != std::string::npos);
        BOOST_TEST(m.find("timed out after 300 ms") != std::string::npos);
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      BOOST_TEST(waited < 5.0);  // the deadline, not the peers' arrival, ended the wait
      BOOST_CHECK_THROW(c.barrier(), kft::usage_error);
      MPI_Barrier(MPI_COMM_WORLD);  // now the others may join the abandoned collective
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      if (a == kft::algo::automatic) c.allreduce(std::span<float>(x), kft::ops::sum, {.algorithm = a});
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A split communicator places its errors in the job: the global rank first, then the label and
// the rank inside it ("kft: rank 3/4 (rail 1, rank 1/2) mpi allreduce #1: ...").
BOOST_AUTO_TEST_CASE(split_communicators_name_their_place_in_the_job) {
  kft::mpi::communicator world;
  const int me = world.rank(), p = world.size();
  auto rail = world.split(me % 2, me, "rail " + std::to_string(me % 2));
  const std::string m = kft::error("x", rail.next_site(kft::collective::allreduce)).what();
  BOOST_TEST_INFO(m);
  if (p == 1) {
    BOOST_TEST(m.find("kft: rank 0/1 (rail 0, rank 0/1) mpi allreduce #1: x") == 0u);
  } else {
    const std::string want = "kft: rank " + std::to_string(me) + "/" + std::to_string(p) + " (rail " +
                             std::to_string(me % 2) + ", rank " + std::to_string(rail.rank()) + "/" +
                             std::to_string(rail.size()) + ") mpi allreduce #1: x";
    BOOST_TEST(m == want);
  }
  // The whole job's communicator needs no label.
  BOOST_TEST(std::string(kft::error("x", world.next_site(kft::collective::barrier)).what()).find("(") ==
             std::string::npos);
  // An algorithm MPI does not run is refused, not replaced.
  std::vector<float> v(4, 1.0f);
  BOOST_CHECK_THROW(world.allreduce(std::span<float>(v), kft::ops::sum, {.algorithm = kft::algo::two_shot}),
                    kft::usage_error);
}
