// SPDX-License-Identifier: Apache-2.0
// MPI is initialised once per test process, around every Boost.Test case in the file, with
// MPI_THREAD_MULTIPLE where the library provides it: kft's MPI communicator then progresses
// asynchronous work on its own thread (the other path, MPI_Init's single thread, is what the
// examples and benchmarks use).
#pragma once

#include <boost/test/unit_test.hpp>

#include <mpi.h>

struct mpi_session {
  mpi_session() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  ~mpi_session() { MPI_Finalize(); }
};
BOOST_TEST_GLOBAL_FIXTURE(mpi_session);
