// MPI is initialised once per test process, around every Boost.Test case in the file.
#pragma once

#include <boost/test/unit_test.hpp>

#include <mpi.h>

struct mpi_session {
  mpi_session() { MPI_Init(nullptr, nullptr); }
  ~mpi_session() { MPI_Finalize(); }
};
BOOST_TEST_GLOBAL_FIXTURE(mpi_session);
