// SPDX-License-Identifier: Apache-2.0
/// @file kft/init.hpp
/// @brief `kft::init()`: one call to join the job, as `torch.distributed.init_process_group()`.
///
///     #include <kft/init.hpp>
///     int main(int argc, char** argv) {
///       auto job = kft::init(argc, argv);          // discover, meet, build the group
///       std::vector<float> grad(1000, 1.0f);
///       job.group().allreduce(std::span<float>(grad), kft::ops::avg);
///     }                                            // group, store, then MPI_Finalize
///
/// It decides between the two ways ranks meet, with the rule kft-info and the examples use:
///
/// | started by | discovery | ranks meet through (`bootstrap()`) |
/// | --- | --- | --- |
/// | kftrun | torchrun | "kftrun's store at A:P" (`KFT_STORE_ADDR`, token from kftrun) |
/// | torchrun, static rendezvous | torchrun | "torchrun's TCPStore at A:P" |
/// | torchrun `--standalone`, c10d | torchrun | "kft store hosted by rank 0 at A:P ..." |
/// | Open MPI's mpirun, MPICH's mpirun, srun --mpi=pmix | mpi (MPI_COMM_WORLD) | "MPI (Open MPI's mpirun)" (`mpi_bootstrap`) |
/// | srun --mpi=none, a Kubeflow TrainJob pod, a Kubernetes Job | slurm, kubeflow, kubernetes | "kft store hosted by rank 0 at A:P ..." |
/// | nothing (a lone process) | single | "single process" (an in-process store) |
///
/// An MPI launcher counts when its variables (`OMPI_COMM_WORLD_SIZE`, `PMIX_RANK`, `PMI_SIZE`)
/// are present and the process is not a torchrun/kftrun worker (`TORCHELASTIC_RUN_ID`): such a
/// worker inherits its agent's PMIx variables under `srun --mpi=pmix torchrun ...`. With the MPI
/// component (`kft::mpi`) init calls `MPI_Init_thread(MPI_THREAD_MULTIPLE)` there, or uses an MPI
/// the program initialised itself (and then leaves finalising it to the program).
///
/// Environment read here: `KFT_LOG_LEVEL` (the report's verbosity), `KFT_TIMEOUT` (the job's
/// timeout: the rendezvous deadline, and through `connect_store`, `mpi_bootstrap` and
/// `make_process_group` every default deadline of the store and the group; `session::timeout()`
/// for a transport the program builds itself), the launchers' variables (discovery), and what
/// `connect_store` and `make_process_group` read.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <kft/config.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/log.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/discover.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/group/factory.hpp>
#include <kft/group/process_group.hpp>
#include <kft/rendezvous/connect.hpp>
#include <kft/rendezvous/store.hpp>
#if KFT_WITH_MPI
#include <mpi.h>

#include <kft/discovery/mpi.hpp>
#include <kft/rendezvous/mpi_bootstrap.hpp>
#endif

KFT_NAMESPACE_BEGIN

/// @brief What `kft::init()` may do and how the group is built.
struct init_options {
  /// The process group's settings (shared-memory pool, timeouts, segment name, ...).
  group::group_options group{};
  /// The environment to read; default: this process's (`environment::process()`). A fixed one
  /// makes a thread a rank in tests.
  std::optional<environment> env{};
  /// Whether init may call `MPI_Init_thread(MPI_THREAD_MULTIPLE)` when an MPI launcher started
  /// this process and MPI is not initialised yet (only with the MPI component). false: MPI is
  /// used only if the program initialised it; otherwise the ranks meet through a store.
  bool init_mpi = true;
  /// false: discovery and the store (and MPI) only, no group; for programs that build their own
  /// communicator (`group::node_communicator`, `group::mpi_group`) or act between the
  /// rendezvous and the group (fault tests). `session::group()` must not be called then; a
  /// transport built directly takes `session::timeout()` to honour `KFT_TIMEOUT`.
  bool make_group = true;
  /// A store the caller already has (a `file_store`, a `memory_store` shared by threads); the
  /// ranks meet through it instead of the launcher's. nullptr: chosen as in the table above.
  std::shared_ptr<rendezvous::store> store{};
  /// The deadline for reaching the store; 0 = `KFT_TIMEOUT` from `env` (else 5 minutes).
  std::chrono::milliseconds rendezvous_timeout{0};
};

/// @brief This process's membership of the job: who it is, the store, the process group, and
/// MPI when init initialised it. Move-only; destroying it leaves the job (group, then store,
/// then `MPI_Finalize` when `owns_mpi()`).
class session {
 public:
  session(session&& o) noexcept
      : world_(std::move(o.world_)),
        bootstrap_(std::move(o.bootstrap_)),
        store_(std::move(o.store_)),
        group_(std::move(o.group_)),
        timeout_(o.timeout_),
        owns_mpi_(std::exchange(o.owns_mpi_, false)) {
    o.group_.reset();
  }
  session& operator=(session&& o) noexcept {
    if (this != &o) {
      leave();
      world_ = std::move(o.world_);
      bootstrap_ = std::move(o.bootstrap_);
      store_ = std::move(o.store_);
      group_ = std::move(o.group_);
      o.group_.reset();
      timeout_ = o.timeout_;
      owns_mpi_ = std::exchange(o.owns_mpi_, false);
    }
    return *this;
  }
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  ~session() { leave(); }

  /// @brief Who this process is (what discovery found).
  const world_info& world() const noexcept { return world_; }
  int rank() const noexcept { return world_.rank; }
  int size() const noexcept { return world_.world_size; }
  /// @brief Whether init built a group (`init_options::make_group`).
  bool has_group() const noexcept { return group_.has_value(); }
  /// @brief The job's process group, ready to use. Precondition: `has_group()` (a call without
  /// one ends the process with a message: it is a programming error, and noexcept).
  group::process_group& group() noexcept {
    if (!group_) {
      log::error("kft[rank " + std::to_string(world_.rank) + "]",
                 "session::group() called, but kft::init ran with make_group = false");
      std::terminate();
    }
    return *group_;
  }
  /// @brief The job's store (kftrun's, torchrun's, rank 0's, MPI's or the caller's).
  const std::shared_ptr<rendezvous::store>& store() const noexcept { return store_.client; }
  /// @brief How the ranks met, in words: "MPI (Open MPI's mpirun)", "kftrun's store at
  /// 127.0.0.1:29500", "torchrun's TCPStore at ...", "single process", ...
  const std::string& bootstrap() const noexcept { return bootstrap_; }
  /// @brief The job's timeout (`KFT_TIMEOUT` in init's environment, else 5 minutes), which init
  /// applied to the store and the group. A transport the program builds itself takes its
  /// config's timeout: `cfg.timeout = job.timeout()` gives it the job's (kftrun's `--timeout`).
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// @brief Whether init called MPI_Init (so the destructor calls MPI_Finalize).
  bool owns_mpi() const noexcept { return owns_mpi_; }
  /// @brief The line init logs at rank 0 (`KFT_LOG_LEVEL=info`): rank and size, discovery
  /// backend, bootstrap and the group.
  std::string report() const {
    std::string s = "joined as rank " + std::to_string(world_.rank) + " of " + std::to_string(world_.world_size) +
                    "; discovery: " + world_.backend + "; bootstrap: " + bootstrap_ + "; group: ";
    s += group_ ? group_->description() : std::string("none (make_group = false)");
    return s;
  }

 private:
  friend session init_impl(int*, char***, init_options);
  session() = default;

  void leave() noexcept {
    group_.reset();
    store_ = rendezvous::store_handle{};
#if KFT_WITH_MPI
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
#endif
    owns_mpi_ = false;
  }

  world_info world_;
  std::string bootstrap_;
  rendezvous::store_handle store_;
  std::optional<group::process_group> group_;
  std::chrono::milliseconds timeout_ = default_job_timeout;
  bool owns_mpi_ = false;
};

namespace detail {

/// @brief The MPI launcher that started this process, in words, or "" when none did (or the
/// process is a torchrun/kftrun worker, which inherits its agent's PMIx variables).
inline std::string mpi_launcher(const environment& env) {
  if (env.has("TORCHELASTIC_RUN_ID")) return {};
  const bool step = env.has("SLURM_STEP_ID");
  if (env.has("OMPI_COMM_WORLD_SIZE")) return "Open MPI's mpirun";
  if (env.has("PMIX_RANK")) return step ? "srun --mpi=pmix" : "a PMIx launcher";
  if (env.has("PMI_SIZE")) return step ? "srun --mpi=pmi2" : "MPICH's mpirun (Hydra) or another PMI launcher";
  return {};
}

/// @brief How `connect_store(w, env)` makes the ranks meet, in words (mirrors its rules).
inline std::string store_bootstrap(const world_info& w, const environment& env) {
  auto at = [](const std::string& h, const std::string& p) { return h + ":" + p; };
  if (auto a = env.get("KFT_STORE_ADDR"))
    return "kftrun's store at " + at(*a, env.get("KFT_STORE_PORT").value_or("?"));
  const std::string master =
      w.master_addr && w.master_port ? at(*w.master_addr, std::to_string(*w.master_port)) : std::string();
  if (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True") return "torchrun's TCPStore at " + master;
  if (master.empty() && w.world_size == 1) return "single process";
  std::string who = w.backend;
  if (w.backend == "torchrun") who = "torchrun's rendezvous address (c10d or --standalone)";
  else if (w.backend == "slurm") who = "the Slurm step";
  else if (w.backend == "kubeflow") who = "the Kubeflow TrainJob";
  else if (w.backend == "kubernetes") who = "the Kubernetes Job";
  return "kft store hosted by rank 0 at " + master + " (" + who + ")";
}

/// @brief Rethrows `e` as the same kft error type with the init step in its operation, so
/// "kft: init: discover: RANK=..." says which step failed; rank, group and sequence are kept.
[[noreturn]] inline void rethrow_in(const std::string& step) {
  auto site_of = [&](const error& e) {
    error_site s;
    s.rank = e.rank();
    s.world_size = e.world_size();
    s.group = e.group();
    s.sequence = e.sequence();
    const std::string& op = e.operation();
    // "discover (mpi)" already names the step; "store connect" gets it: "rendezvous (store connect)".
    // The settings read first have no step of their own: "init (log)".
    const std::string in = op.empty() ? std::string() : " (" + op + ")";
    s.operation = step.empty() ? "init" + in : "init: " + (op.rfind(step, 0) == 0 ? op : step + in);
    return s;
  };
  try {
    throw;
  } catch (const config_error& e) {
    // The detail starts with `VAR="value" `, which the constructor writes again.
    std::string d = e.detail();
    if (!e.variable().empty()) {
      const std::string head = e.variable() + "=\"" + detail::excerpt(e.value()) + "\" ";
      if (d.rfind(head, 0) == 0) d.erase(0, head.size());
    }
    throw config_error(e.variable(), e.value(), d, site_of(e));
  } catch (const usage_error& e) {
    throw usage_error(e.detail(), site_of(e), e.backend_code());
  } catch (const timeout_error& e) {
    throw timeout_error(e.detail(), site_of(e), e.backend_code());
  } catch (const mismatch_error& e) {
    throw mismatch_error(e.detail(), site_of(e), e.backend_code());
  } catch (const transport_error& e) {
    throw transport_error(e.detail(), site_of(e), e.backend_code());
  } catch (const remote_error& e) {
    throw remote_error(e.detail(), site_of(e), e.backend_code());
  } catch (const group::join_closed_error& e) {  // (a replacement that came after the end: exit 0 on it)
    throw group::join_closed_error(e.detail(), site_of(e), e.backend_code());
  } catch (const group::membership_error& e) {
    throw group::membership_error(e.detail(), site_of(e), e.backend_code());
  } catch (const error& e) {
    throw error(e.detail(), site_of(e), e.backend_code());
  }
  // Anything else (std::bad_alloc, a std::system_error) passes through unchanged.
}

/// @brief Runs one step of init; a kft error leaving it names the step.
template <class F>
auto step(const std::string& name, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const error&) {
    rethrow_in(name);
  }
}

}  // namespace detail

/// @private The one implementation behind both `init` overloads.
inline session init_impl(int* argc, char*** argv, init_options o) {
  const environment env = o.env ? std::move(*o.env) : environment::process();
  log::set_threshold(detail::step("", [&] { return log::threshold_from(env, log::level::warn); }));
  const std::chrono::milliseconds job = detail::step("", [&] { return job_timeout(env); });
  const std::chrono::milliseconds timeout = o.rendezvous_timeout.count() > 0 ? o.rendezvous_timeout : job;

  session s;
  s.timeout_ = job;
  std::string launcher = detail::mpi_launcher(env);
  bool use_mpi = false;
#if KFT_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!launcher.empty() && !initialized && !finalized && o.init_mpi) {
    int provided = 0;
    detail::step("MPI", [&] {
      mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread", error_site::of("MPI"));
    });
    initialized = 1;
    s.owns_mpi_ = true;
  }
  if (initialized && !finalized) {
    if (!launcher.empty()) {
      use_mpi = true;
    } else if (!env.has("TORCHELASTIC_RUN_ID")) {
      // The program initialised MPI itself and no launcher variables say so (a custom launch):
      // a world of several ranks is a real MPI job; one rank is a singleton, not a job.
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (size > 1) {
        use_mpi = true;
        launcher = "initialised by the program";
      }
    }
  }
#else
  (void)argc;
  (void)argv;
#endif

  // A failure after init initialised MPI: the session that would finalise it is never made.
  // Finalise after a discovery failure (every rank reads the same kind of environment and
  // stops there); after a failed rendezvous or group MPI stays up, since MPI_Finalize could
  // wait for ranks that are gone: the program exits (or calls MPI_Abort).
  // (Declared after `s`, so it runs before the half-made session's destructor, which must not
  // finalise MPI either.)
  struct on_failure {
    session& s;
    bool armed = true, finalize = true;
    ~on_failure() {
      if (!armed) return;
#if KFT_WITH_MPI
      if (finalize && s.owns_mpi_) MPI_Finalize();
#endif
      s.owns_mpi_ = false;
    }
  } guard{s};

#if KFT_WITH_MPI
  s.world_ = detail::step("discover", [&] { return use_mpi ? discover_with_mpi(env) : discover(env); });
#else
  s.world_ = detail::step("discover", [&] { return discover(env); });
#endif
  guard.finalize = false;
  const world_info& w = s.world_;
  if (o.store) {
    s.store_.client = std::move(o.store);
    s.bootstrap_ = "the given store (" + s.store_.client->describe() + ")";
  } else if (use_mpi) {
#if KFT_WITH_MPI
    s.store_ = detail::step("rendezvous", [&] { return rendezvous::mpi_bootstrap(MPI_COMM_WORLD, timeout); });
    s.store_.drain_timeout = job;
    s.bootstrap_ = "MPI (" + launcher + ")";
#endif
  } else {
    if (!launcher.empty() && w.world_size > 1 && !env.has("KFT_STORE_ADDR") && (!w.master_addr || !w.master_port)) {
      const std::string var = env.has("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE"
                              : env.has("PMIX_RANK")          ? "PMIX_RANK"
                                                              : "PMI_SIZE";
      const std::string why =
          KFT_WITH_MPI ? "init_options.init_mpi is false and the program did not initialise MPI"
                       : "kft was built without MPI (KFT_WITH_MPI=OFF)";
      throw config_error(var, env.get(var).value_or(""),
                         "says " + launcher + " started this process, but " + why +
                             ", and the launcher gave no store address: link kft::mpi (KFT_WITH_MPI=ON) so "
                             "the ranks meet through MPI, or set MASTER_ADDR and MASTER_PORT (and "
                             "KFT_RDZV_TOKEN across hosts) on every rank, or start the job with kftrun",
                         error_site::in({}, w.rank, w.world_size, "init: rendezvous"));
    }
    s.store_ = detail::step("rendezvous", [&] { return rendezvous::connect_store(w, env, timeout); });
    s.bootstrap_ = detail::store_bootstrap(w, env);
  }
  if (o.make_group)
    s.group_.emplace(detail::step(
        "process group", [&] { return group::make_process_group(w, s.store_.client, std::move(o.group), env); }));

  guard.armed = false;
  const std::string who = "kft[rank " + std::to_string(w.rank) + "]";
  if (w.rank == 0) log::info(who, s.report());
  else log::debug(who, s.report());
  return s;
}

/// @brief Joins the job: discovers this process, initialises MPI when an MPI launcher started
/// it (and kft::mpi is built), meets the other ranks and builds the process group. Collective:
/// every rank calls it. `argc`/`argv` go to `MPI_Init_thread`.
/// @throws config_error for a malformed environment (naming the variable), and any kft error
/// of the rendezvous or the group; the message names the step ("kft: init: discover: ...",
/// "init: rendezvous (store connect)", "init: process group").
[[nodiscard]] inline session init(int& argc, char**& argv, init_options o = {}) {
  return init_impl(&argc, &argv, std::move(o));
}

/// @brief `init` without the command line (MPI_Init_thread gets none).
[[nodiscard]] inline session init(init_options o = {}) { return init_impl(nullptr, nullptr, std::move(o)); }

KFT_NAMESPACE_END
