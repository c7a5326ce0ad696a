// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/mpi_error.hpp
/// @brief The one place where MPI return codes become kft exceptions (component `kft::mpi`):
/// discovery, topology, the MPI store bootstrap and the MPI transport all call `mpi_check`.
/// The exception keeps MPI's own text (`MPI_Error_string`) and its error class as the
/// backend code.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/core/mpi_error.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <string>
#include <string_view>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

/// @brief MPI's text for a return code ("MPI_ERR_TRUNCATE: message truncated").
inline std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

/// @brief Throws `transport_error("<call> failed: <MPI's text>", site)` unless rc is MPI_SUCCESS.
inline void mpi_check(int rc, std::string_view call, const error_site& site) {
  if (rc == MPI_SUCCESS) return;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  throw transport_error(std::string(call) + " failed: " + mpi_error_string(rc), site, cls);
}

KFT_NAMESPACE_END
