// SPDX-License-Identifier: Apache-2.0
/// @file kft/kft.hpp
/// @brief The portable core of kft: errors, environment, discovery, the rendezvous store and
/// the shared-memory collectives.
///
/// Components are included explicitly where used: `kft/discovery/mpi.hpp` (kft::mpi),
/// `kft/topology/hwloc.hpp` (kft::hwloc), `kft/topology/cuda.hpp` (kft::cuda),
/// `kft/transport/nccl/nccl.hpp` (kft::nccl).
#pragma once

#include <kft/config.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/core/parse.hpp>
#include <kft/core/timeout.hpp>
#include <kft/discovery/discover.hpp>
#include <kft/discovery/world_info.hpp>
#include <kft/rendezvous/connect.hpp>
#include <kft/topology/layout.hpp>
#include <kft/group/node.hpp>
#include <kft/transport/shm/communicator.hpp>
