// SPDX-License-Identifier: Apache-2.0
// Example 06: an MPI code that drops kft's headers in: a distributed conjugate-gradient solver
// for the 2D Poisson problem.
//
//   mpirun -np 4 build/examples/06-poisson-cg --n 512
//   srun -N 2 -n 4 --mpi=pmix build/examples/06-poisson-cg --n 512
//
// -laplace(u) = f on the unit square, u = 0 on its boundary, discretised with the 5-point
// stencil on an n x n grid of interior points. The grid's rows are split in blocks across the
// ranks; each matrix-vector product exchanges one halo row with each neighbour through MPI
// point-to-point, exactly as the code did before kft. What kft changes is the two dot products
// per iteration: each is an 8-byte allreduce, the latency-bound collective a CG solver lives
// on, and kft's group does it through shared memory inside a node (docs/hpc.md shows the lines
// that change).
//
// The right-hand side is the discrete operator applied to a known smooth field, so the exact solution of the discrete system is known: the solver must reach
// the relative residual --tol, recomputed from scratch at the end, and the error against that
// field is printed. `--allreduce both` (the default) solves with kft's allreduce and with
// MPI_Allreduce, alternating, and prints iterations per second of each (the fastest of
// --rounds solves). kft's allreduce gives every rank the same bits, so every rank takes the
// same branch of the convergence test.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <kft/group/mpi_group.hpp>

namespace {

// This rank's block of rows, with one halo row above and one below: (rows + 2) x n values.
struct field {
  int n = 0, rows = 0, first_row = 0;
  std::vector<double> v;
  double* row(int i) { return v.data() + static_cast<std::size_t>(i + 1) * static_cast<std::size_t>(n); }
  const double* row(int i) const { return v.data() + static_cast<std::size_t>(i + 1) * static_cast<std::size_t>(n); }
};

class poisson {
 public:
  poisson(int n, MPI_Comm comm) : n_(n), comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    const int base = n / size_, extra = n % size_;
    rows_ = base + (rank_ < extra ? 1 : 0);
    first_ = rank_ * base + std::min(rank_, extra);
    up_ = rank_ > 0 ? rank_ - 1 : MPI_PROC_NULL;
    down_ = rank_ + 1 < size_ ? rank_ + 1 : MPI_PROC_NULL;
  }

  field make() const { return {n_, rows_, first_, std::vector<double>(static_cast<std::size_t>(rows_ + 2) * n_, 0.0)}; }
  int rows() const { return rows_; }

  // The halo rows from the neighbours: unchanged MPI code.
  void exchange(field& f) const {
    MPI_Sendrecv(f.row(0), n_, MPI_DOUBLE, up_, 0, f.row(rows_), n_, MPI_DOUBLE, down_, 0, comm_, MPI_STATUS_IGNORE);
    MPI_Sendrecv(f.row(rows_ - 1), n_, MPI_DOUBLE, down_, 1, f.row(-1), n_, MPI_DOUBLE, up_, 1, comm_,
                 MPI_STATUS_IGNORE);
  }

  // out = A in, A the 5-point stencil scaled by h^2 (4 on the diagonal); `in` needs its halos.
  void apply(const field& in, field& out) const {
    for (int i = 0; i < rows_; ++i) {
      const double *c = in.row(i), *u = in.row(i - 1), *d = in.row(i + 1);
      double* o = out.row(i);
      // The grid's top and bottom boundary rows are zero: the halo of the first and last rank
      // stays zero (MPI_PROC_NULL receives nothing).
      for (int j = 0; j < n_; ++j) {
        const double left = j > 0 ? c[j - 1] : 0.0, right = j + 1 < n_ ? c[j + 1] : 0.0;
        o[j] = 4.0 * c[j] - u[j] - d[j] - left - right;
      }
    }
  }

  // This rank's share of a . b (interior rows only).
  double local_dot(const field& a, const field& b) const {
    double s = 0;
    for (int i = 0; i < rows_; ++i) {
      const double *x = a.row(i), *y = b.row(i);
      for (int j = 0; j < n_; ++j) s += x[j] * y[j];
    }
    return s;
  }

 private:
  int n_, rows_ = 0, first_ = 0, rank_ = 0, size_ = 1, up_ = MPI_PROC_NULL, down_ = MPI_PROC_NULL;
  MPI_Comm comm_;
};

struct outcome {
  int iterations = 0;
  double relative_residual = 0, max_error = 0, seconds = 0;
};

// Conjugate gradients; `sum` turns this rank's share of a dot product into the job's total.
template <class Sum>
outcome solve(const poisson& p, const field& b, const field& exact, double tol, int max_iters, Sum&& sum) {
  field x = p.make(), r = b, d = b, q = p.make();
  const double b_norm = std::sqrt(sum(p.local_dot(b, b)));
  double rr = b_norm * b_norm;
  outcome out;
  const auto t0 = std::chrono::steady_clock::now();
  while (out.iterations < max_iters && std::sqrt(rr) > tol * b_norm) {
    p.exchange(d);
    p.apply(d, q);
    const double alpha = rr / sum(p.local_dot(d, q));
    for (std::size_t k = static_cast<std::size_t>(b.n); k < x.v.size() - static_cast<std::size_t>(b.n); ++k) {
      x.v[k] += alpha * d.v[k];
      r.v[k] -= alpha * q.v[k];
    }
    const double rr_next = sum(p.local_dot(r, r));
    const double beta = rr_next / rr;
    rr = rr_next;
    for (std::size_t k = static_cast<std::size_t>(b.n); k < d.v.size() - static_cast<std::size_t>(b.n); ++k)
      d.v[k] = r.v[k] + beta * d.v[k];
    ++out.iterations;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The true residual, from scratch: b - A x (with fresh halos), reduced by plain MPI so that the
  // check does not depend on the allreduce under test.
  p.exchange(x);
  p.apply(x, q);
  double local[2] = {0, 0};
  for (int i = 0; i < p.rows(); ++i)
    for (int j = 0; j < b.n; ++j) {
      const double e = b.row(i)[j] - q.row(i)[j];
      local[0] += e * e;
      local[1] = std::max(local[1], std::abs(x.row(i)[j] - exact.row(i)[j]));
    }
  double global[2];
  MPI_Allreduce(&local[0], &global[0], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&local[1], &global[1], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  out.relative_residual = std::sqrt(global[0]) / b_norm;
  out.max_error = global[1];
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kft example 06: distributed CG for the 2D Poisson problem, dot products through kft"};
  int n = 256, max_iters = 20000, rounds = 3;
  double tol = 1e-8;
  std::string which = "both";
  app.add_option("--n", n, "interior grid points per side")->check(CLI::Range(4, 1 << 15))->capture_default_str();
  app.add_option("--tol", tol, "relative residual to reach")->check(CLI::Range(1e-14, 0.5))->capture_default_str();
  app.add_option("--max-iters", max_iters, "give up after this many iterations")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  app.add_option("--allreduce", which, "the dot products' allreduce: kft, mpi, or both (alternating, timed)")
      ->check(CLI::IsMember({"kft", "mpi", "both"}))->capture_default_str();
  app.add_option("--rounds", rounds, "with both: solves per allreduce, alternating (the fastest is reported)")
      ->check(CLI::Range(1, 100))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    auto g = kft::group::mpi_group();  // the job's ranks, by node: shared memory inside each
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (n < size) throw kft::config_error("--n", std::to_string(n), "must be at least the number of ranks (" +
                                                                         std::to_string(size) + ")");
    const poisson p(n, MPI_COMM_WORLD);

    // The manufactured solution and b = A u*, so that u* solves the discrete system exactly.
    field exact = p.make(), b = p.make();
    const double h = 1.0 / (n + 1), pi = std::numbers::pi;
    for (int i = 0; i < exact.rows; ++i)
      for (int j = 0; j < n; ++j) {
        const double x = (j + 1) * h, y = (exact.first_row + i + 1) * h;
        // Not a few eigenvectors of the stencil (sines alone would converge in a handful of
        // iterations): a smooth field with every mode in it, zero on the boundary.
        exact.row(i)[j] = 16 * x * (1 - x) * y * (1 - y) * std::exp(x * y) * (1 + 0.25 * std::sin(5 * pi * x * y));
      }
    p.exchange(exact);
    p.apply(exact, b);

    auto kft_sum = [&](double v) {
      g->allreduce(std::span<double>(&v, 1), kft::ops::sum);
      return v;
    };
    auto mpi_sum = [](double v) {
      double out = 0;
      MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return out;
    };
    if (rank == 0)
      std::printf("poisson-cg: %d x %d grid on %d ranks (%s: shared memory inside a node, MPI between nodes), "
                  "tol %.1e\n", n, n, size, g->layout().describe().c_str(), tol);
    std::vector<std::string> kinds;
    if (which != "mpi") kinds.push_back("kft");
    if (which != "kft") kinds.push_back("mpi");
    const int solves = which == "both" ? rounds : 1;
    std::vector<outcome> best(kinds.size());
    for (int s = 0; s < solves; ++s)
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const auto o = kinds[k] == "kft" ? solve(p, b, exact, tol, max_iters, kft_sum)
                                         : solve(p, b, exact, tol, max_iters, mpi_sum);
        if (o.relative_residual > tol * 1.01 || !std::isfinite(o.relative_residual)) {
          if (rank == 0)
            std::fprintf(stderr, "poisson-cg: %s: relative residual %.3e after %d iterations, above the tolerance %.1e\n",
                         kinds[k].c_str(), o.relative_residual, o.iterations, tol);
          status = 1;
        }
        if (s == 0 || o.seconds < best[k].seconds) best[k] = o;
      }
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (rank == 0)
        std::printf("poisson-cg: %-3s allreduce: converged in %d iterations, relative residual %.2e, max error %.2e, "
                    "%.0f iterations/s\n",
                    kinds[k].c_str(), best[k].iterations, best[k].relative_residual, best[k].max_error,
                    best[k].iterations / best[k].seconds);
    if (kinds.size() == 2 && rank == 0)
      std::printf("poisson-cg: kft / MPI_Allreduce: %.2fx the iterations per second\n",
                  (best[0].iterations / best[0].seconds) / (best[1].iterations / best[1].seconds));
  } catch (const kft::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  } catch (const kft::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
