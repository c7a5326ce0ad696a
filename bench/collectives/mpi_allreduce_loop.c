// SPDX-License-Identifier: Apache-2.0
/* mpi_allreduce_loop.c: the peer column of bench/scripts/shm_peers.py. A plain MPI_Allreduce loop (float
 * sum, out of place, one send and one receive buffer of the largest size reused for every size and
 * call, as an MPI code does), compiled once per MPI implementation (bench/CMakeLists.txt builds it
 * with mpicc.openmpi and mpicc.mpich when they are there), so Open MPI and MPICH are timed by the
 * same lines. No kft code: what a user of that MPI gets.
 *
 *   mpirun -np 2 build/bench/allreduce_loop.openmpi -b 8 -e 1G -f 4 [--tuned-malloc] [--memcpy]
 *
 * Per size: one call times the size, w warm-up calls (fewer for sizes where they would take more
 * than a quarter of the budget), a barrier, then n calls, or as many as fit in --budget seconds
 * (at least one). Where n calls take under a quarter of the budget, n more warm calls are timed
 * first and the loop runs at least 10 ms of calls (within the budget): ten calls of a microsecond
 * would time the clock and the barrier's skew. A rank's time is its average call, the row shows
 * the slowest rank's.
 * --tuned-malloc: mallopt() keeps freed memory instead of unmapping it, so an implementation's
 * per-call temporaries do not page-fault each call. --memcpy: also times memcpy of the same
 * bytes between each rank's same buffers, on the first min(ranks, online CPUs) ranks at once,
 * and reports the slowest of them: the rate each rank gets while the others move memory too,
 * which is what an allreduce's ranks get (a lone rank's memcpy overstates it where the ranks
 * share a memory controller). With more ranks than CPUs the others sleep through the copies
 * (an MPI wait polls, and would take CPU time from the copiers).
 * Output: one JSON object per line on rank 0, e.g.
 *   {"size": 1048576, "time_us": 201.9, "busbw": 5.19, "iters": 20, "memcpy_gbps": 38.4}
 * and first a line {"mpi": "<MPI_Get_library_version>", "ranks": 2, "tuned_malloc": false}.
 * Exit status 0, or 2 with a message naming the bad argument.
 */
#include <limits.h>
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int parse_size(const char* s, size_t* out) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  switch (*end) {
    case 'K': case 'k': v <<= 10; ++end; break;
    case 'M': case 'm': v <<= 20; ++end; break;
    case 'G': case 'g': v <<= 30; ++end; break;
    default: break;
  }
  if (*end != '\0') return -1;
  *out = (size_t)v;
  return 0;
}

static void one_line(char* s) {
  for (; *s; ++s)
    if ((unsigned char)*s < 0x20 || *s == '"' || *s == '\\') *s = ' ';
}

int main(int argc, char** argv) {
  size_t min_bytes = 8, max_bytes = 1u << 20, factor = 2;
  int iters = 20, warmup = 5, tuned = 0, with_memcpy = 0;
  double budget = 1.0;
  MPI_Init(&argc, &argv);
  int me = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--tuned-malloc")) { tuned = 1; continue; }
    if (!strcmp(a, "--memcpy")) { with_memcpy = 1; continue; }
    if (!v) bad = 1;
    else if (!strcmp(a, "-b")) bad = parse_size(v, &min_bytes);
    else if (!strcmp(a, "-e")) bad = parse_size(v, &max_bytes);
    else if (!strcmp(a, "-f")) bad = parse_size(v, &factor) || factor < 2;
    else if (!strcmp(a, "-n")) bad = (iters = atoi(v)) < 1;
    else if (!strcmp(a, "-w")) bad = (warmup = atoi(v)) < 0;
    else if (!strcmp(a, "--budget")) bad = (budget = atof(v)) <= 0;
    else bad = 1;
    if (bad) {
      if (me == 0) fprintf(stderr, "%s: bad argument %s%s%s (flags: -b -e -f -n -w --budget --tuned-malloc --memcpy)\n",
                           argv[0], a, v ? " " : "", v ? v : "");
      MPI_Finalize();
      return 2;
    }
    ++i;
  }
  if (min_bytes < sizeof(float) || min_bytes > max_bytes) {
    if (me == 0) fprintf(stderr, "%s: -b must be >= 4 and <= -e (got -b %zu -e %zu)\n", argv[0], min_bytes, max_bytes);
    MPI_Finalize();
    return 2;
  }
  if (tuned) {
    /* Freed blocks stay in the heap: no mmap/munmap (and page faults) per call. */
    mallopt(M_MMAP_THRESHOLD, INT_MAX);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
  }
  float* in = malloc(max_bytes);
  float* out = malloc(max_bytes);
  if (!in || !out) {
    fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", argv[0], me, max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < max_bytes / sizeof(float); ++i) in[i] = (float)((i + (size_t)me) % 7);
  memset(out, 0, max_bytes);
  if (me == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl) *nl = '\0';
    one_line(version);
    printf("{\"mpi\": \"%s\", \"ranks\": %d, \"tuned_malloc\": %s}\n", version, p, tuned ? "true" : "false");
  }
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const int count = (int)(bytes / sizeof(float));
    /* One timed call decides (on rank 0) how many calls fit the budget; every rank runs as many. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t_one = MPI_Wtime();
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t_one = MPI_Wtime() - t_one;
    /* Rank 0's time decides for everyone: ranks that counted differently would call a different
       number of times (and hang in mismatched collectives). */
    MPI_Bcast(&t_one, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int done = iters;
    if (t_one * iters > budget) done = t_one > budget ? 1 : (int)(budget / t_one);
    for (int w = 0; w < warmup && (double)w * t_one < budget / 4; ++w)
      MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (t_one * iters < budget / 4) {
      /* A cold first call overstates small sizes many times over, and n calls of a microsecond
         time the clock and the barrier's skew: time n warm calls, then run at least 10 ms worth
         (within the budget). Rank 0's estimate again decides for every rank. */
      MPI_Barrier(MPI_COMM_WORLD);
      double t_warm = MPI_Wtime();
      for (int i = 0; i < iters; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t_warm = (MPI_Wtime() - t_warm) / iters;
      MPI_Bcast(&t_warm, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (t_warm > 0) {
        double want = 0.01 / t_warm + 1;
        if (want > budget / t_warm) want = budget / t_warm;
        if (want > 1e8) want = 1e8;
        if (want > done) done = (int)want;
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < done; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double mine = (MPI_Wtime() - t0) / done;
    double slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* Check once: every element is the sum over ranks of (i + r) % 7. */
    int wrong = 0;
    for (int i = 0; i < count; i += 1 + count / 64) {
      float want = 0;
      for (int r = 0; r < p; ++r) want += (float)(((size_t)i + (size_t)r) % 7);
      if (out[i] != want) ++wrong;
    }
    int wrong_all = 0;
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    double mc = 0;
    if (with_memcpy) {
      const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      const int copiers = cpus > 0 && cpus < p ? (int)cpus : p;
      /* Rank 0's one timed copy decides how many every copier makes: >= iters, >= 10 ms, within the budget. */
      double t_copy = 0;
      if (me == 0) {
        memcpy(out, in, bytes);
        t_copy = MPI_Wtime();
        memcpy(out, in, bytes);
        t_copy = MPI_Wtime() - t_copy;
      }
      MPI_Bcast(&t_copy, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      int n = iters;
      if (t_copy > 0 && t_copy * n < 0.01) n = (int)(0.01 / t_copy) + 1;
      if (t_copy > 0 && t_copy * n > budget) n = t_copy > budget ? 1 : (int)(budget / t_copy);
      if (me < copiers) memcpy(out, in, bytes);
      MPI_Barrier(MPI_COMM_WORLD);
      double took = 0;
      if (me >= copiers) {  /* sleep, not poll, while the copiers run (1.5x their expected time) */
        const double nap = 1.5 * t_copy * n + 0.005;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
      }
      if (me < copiers) {
        const double m0 = MPI_Wtime();
        for (int i = 0; i < n; ++i) {
          memcpy(out, in, bytes);
          __asm__ __volatile__("" : : "r"(out) : "memory");  /* keep every copy */
        }
        took = MPI_Wtime() - m0;
      }
      double slowest_copy = 0;
      MPI_Reduce(&took, &slowest_copy, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (me == 0) mc = (double)bytes * n / slowest_copy / 1e9;
      MPI_Barrier(MPI_COMM_WORLD);
    }
    if (me == 0) {
      const double busbw = (double)bytes / slowest / 1e9 * 2.0 * (p - 1) / (p > 1 ? p : 1);
      printf("{\"size\": %zu, \"time_us\": %.3f, \"busbw\": %.4f, \"iters\": %d, \"wrong\": %d", bytes, slowest * 1e6,
             busbw, done, wrong_all);
      if (with_memcpy) printf(", \"memcpy_gbps\": %.4f", mc);
      printf("}\n");
      fflush(stdout);
    }
    if (bytes > max_bytes / factor) break;
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
