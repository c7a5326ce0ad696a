// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/namespace.hpp
/// @brief The versioned inline namespace that wraps everything in kft.
///
/// The inline namespace's name carries the version and the enabled components
/// (e.g. `kft::v0_1_mpi1_cuda1_nccl1_hwloc1_gloo1`). User code always writes `kft::`; the
/// linker sees the full name, so objects compiled against two different configurations
/// of kft cannot be linked into one program by accident.
#pragma once

#include <kft/config.hpp>

#define KFT_DETAIL_NS_JOIN(maj, min, mpi, cuda, nccl, hwloc, gloo) \
  v##maj##_##min##_mpi##mpi##_cuda##cuda##_nccl##nccl##_hwloc##hwloc##_gloo##gloo
#define KFT_DETAIL_NS_EXPAND(...) KFT_DETAIL_NS_JOIN(__VA_ARGS__)

/// The name of kft's inline namespace for this configuration.
#define KFT_ABI_NAMESPACE                                                                \
  KFT_DETAIL_NS_EXPAND(KFT_VERSION_MAJOR, KFT_VERSION_MINOR, KFT_WITH_MPI, KFT_WITH_CUDA, \
                       KFT_WITH_NCCL, KFT_WITH_HWLOC, KFT_WITH_GLOO)

#define KFT_NAMESPACE_BEGIN \
  namespace kft {           \
  inline namespace KFT_ABI_NAMESPACE {
#define KFT_NAMESPACE_END \
  }                       \
  }

#define KFT_DETAIL_STRINGIFY2(x) #x
#define KFT_DETAIL_STRINGIFY(x) KFT_DETAIL_STRINGIFY2(x)
/// The inline namespace's name as a string (shown by kft-info).
#define KFT_ABI_NAMESPACE_STRING KFT_DETAIL_STRINGIFY(KFT_ABI_NAMESPACE)
