// SPDX-License-Identifier: Apache-2.0
// Conformance in processes started by a launcher without MPI (kftrun agents, torchrun, a pod
// per node): the Gloo communicator over every rank ("gloo"), and the process group the factory
// makes for the job ("group": shared memory per node + Gloo between nodes, flat and
// hierarchical). Every rank registers the same cases in the same order and runs each
// collectively; outcomes are compared through the job's store, outside the communicators under
// test. KFT_TEST_EXPECT_GROUP, when set, is text the group's description must contain.
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include <kft/group/factory.hpp>
#include <kft/group/gloo_group.hpp>
#include <kft/init.hpp>
#include <kft/transport/gloo/communicator.hpp>

#include "registry.hpp"

namespace conf = kft_test::conformance;

namespace {

// The job's identity and store through kft::init; no group: each case builds the
// communicators under test itself.
kft::init_options store_only() {
  kft::init_options o;
  o.make_group = false;
  return o;
}

struct session {
  kft::session job = kft::init(store_only());
  const kft::world_info& me = job.world();
  std::shared_ptr<kft::rendezvous::store> store = job.store();
  std::uint64_t round = 0;  // one per case, in registration order on every rank
};

// This rank's outcome next to everyone's, through the store.
std::vector<conf::outcome> everyone(session& s, const conf::outcome& mine) {
  const int p = s.me.world_size;
  const std::string scope = "conformance/outcome/" + std::to_string(++s.round) + "/";
  s.store->set(scope + std::to_string(s.me.rank), std::to_string(mine.wrong) + " " + std::to_string(mine.output_hash));
  std::vector<conf::outcome> out(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::istringstream in(s.store->get(scope + std::to_string(r), std::chrono::seconds(300)));
    in >> out[static_cast<std::size_t>(r)].wrong >> out[static_cast<std::size_t>(r)].output_hash;
  }
  out[static_cast<std::size_t>(s.me.rank)].first = mine.first;
  return out;
}

template <class Comm>
conf::runner over(std::shared_ptr<session> s, std::shared_ptr<Comm> comm) {
  return [s, comm](const conf::spec& spec) {
    conf::outcome o;
    try {
      o = conf::run_case(*comm, spec);
    } catch (const std::exception& e) {
      o.wrong = 1;
      o.first = std::string("threw: ") + e.what();
    }
    return everyone(*s, o);
  };
}

std::shared_ptr<session> the_session;

}  // namespace

bool init_unit_test() {
  auto s = the_session;
  const int p = s->me.world_size;
  const auto env = kft::environment::process();
  const std::string which = env.get("KFT_CONFORMANCE").value_or("all");  // gloo, group or all
  if (which == "gloo" || which == "all") {
    kft::gloo::config gc;
    gc.identity = {s->me.rank, p, ""};
    gc.host = env.get("KFT_HOST_ID").value_or(s->me.hostname);
    auto comm = std::make_shared<kft::gloo::communicator>(
        std::make_shared<kft::rendezvous::prefix_store>(s->store, "conformance/gloo/"), s->me.rank, p,
        kft::gloo::make_device(kft::group::gloo_interface(s->me, env)), gc);
    conf::register_suite("gloo", p, conf::cases(p, [](kft::collective c) {
                           if (c == kft::collective::allreduce) return std::vector{kft::algo::automatic, kft::algo::ring};
                           return std::vector{kft::algo::automatic};
                         }),
                         over(s, comm));
  }
  if (which == "group" || which == "all") {
    kft::group::group_options o;
    o.group.warn = s->me.rank == 0;
    o.group.hierarchical.chunk_bytes = 64u << 10;  // many pipeline chunks
    o.group.hierarchical.small_bytes = 1u << 10;   // the pipelined path from small messages
    auto pg = std::make_shared<kft::group::process_group>(kft::group::make_process_group(s->me, s->store, o));
    const std::string what = pg->description();
    if (s->me.rank == 0) std::printf("kft conformance: rank 0 of %d: group: %s\n", p, what.c_str());
    const bool several = pg->get<kft::group::gloo_cpu_group>() != nullptr;
    if (auto want = env.get("KFT_TEST_EXPECT_GROUP"))
      boost::unit_test::framework::master_test_suite().add(boost::unit_test::make_test_case(
          [what, w = *want] { BOOST_TEST(what.find(w) != std::string::npos, "group \"" << what << "\" lacks \"" << w << "\""); },
          "group_is_the_expected_one", __FILE__, __LINE__));
    conf::register_suite("group", p, conf::cases(p, [several](kft::collective c) {
                           if (c == kft::collective::allreduce && several)
                             return std::vector{kft::algo::automatic, kft::algo::flat, kft::algo::hierarchical};
                           return std::vector{kft::algo::automatic};
                         }),
                         over(s, pg));
  }
  return true;
}

int main(int argc, char* argv[]) {
  try {
    the_session = std::make_shared<session>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const int rc = boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
  the_session.reset();  // the communicators went with the test tree; the store last
  return rc;
}
