// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/gloo/config.hpp
/// @brief Settings of a Gloo communicator, fixed at construction: its deadlines, where it sits
/// in the job, and this rank's host (for the other ranks' messages).
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_GLOO
#error "kft/transport/gloo/config.hpp needs the Gloo component: configure kft with KFT_WITH_GLOO=ON and link kft::gloo"
#endif

#include <chrono>
#include <string>

#include <kft/core/error.hpp>
#include <kft/core/timeout.hpp>

KFT_NAMESPACE_BEGIN
namespace gloo {

using namespace std::chrono_literals;

/// @brief Settings of one communicator. The transport reads no environment variable: the
/// defaults are kft's (`default_job_timeout`, `default_timeouts`), and the process groups apply
/// the job's `KFT_TIMEOUT` (`group::gloo_group_config_from`).
struct config {
  std::chrono::milliseconds timeout = default_job_timeout;  ///< default deadline of every call and of connecting
  std::chrono::milliseconds report_grace = default_timeouts.report_grace;  ///< after a failure: how long to wait for the others' records
  group_identity identity{};                    ///< where this communicator sits in the job
  std::string host;                             ///< this rank's host, for the others' messages
};

}  // namespace gloo
KFT_NAMESPACE_END
