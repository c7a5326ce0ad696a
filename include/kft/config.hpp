// SPDX-License-Identifier: Apache-2.0
/// @file kft/config.hpp
/// @brief kft's version and which optional components the headers may use.
///
/// The defaults here make `include/` usable on its own: copy it into a project and
/// `g++ -std=c++20 -I<dir> -pthread` compiles the portable core with every component off.
/// A component is turned on by the build, never by a guess:
///
/// - CMake generates `kft/configured.hpp`, which this file includes when it exists. In kft's own
///   build (its tests, tools, examples) every component the configuration found is on. An
///   installed or embedded kft (find_package, the .deb, pkg-config, add_subdirectory,
///   FetchContent) turns a component on only for code that links its target: `kft::mpi` defines
///   `KFT_WITH_MPI=1`, so `kft::kft` alone is the portable core.
/// - Without CMake, define the macro yourself: `-DKFT_WITH_MPI=1` (and link MPI), likewise
///   `KFT_WITH_HWLOC`, `KFT_WITH_GLOO`, `KFT_WITH_CUDA`, `KFT_WITH_NCCL`.
///
/// Every macro is 0 or 1. The values are folded into kft's inline namespace
/// (`core/namespace.hpp`), so two translation units built with different settings fail to link
/// together instead of misbehaving. Component headers refuse to compile when their macro is 0.
#pragma once

// The project's version: CMake's project() reads it from these three lines.
#define KFT_VERSION_MAJOR 0
#define KFT_VERSION_MINOR 1
#define KFT_VERSION_PATCH 0
#define KFT_DETAIL_VERSION_STR2(a, b, c) #a "." #b "." #c
#define KFT_DETAIL_VERSION_STR(a, b, c) KFT_DETAIL_VERSION_STR2(a, b, c)
/// The version as "major.minor.patch".
#define KFT_VERSION_STRING KFT_DETAIL_VERSION_STR(KFT_VERSION_MAJOR, KFT_VERSION_MINOR, KFT_VERSION_PATCH)

#if __has_include(<kft/configured.hpp>)
#include <kft/configured.hpp>
#endif

#ifndef KFT_WITH_MPI
#define KFT_WITH_MPI 0
#endif
#ifndef KFT_WITH_CUDA
#define KFT_WITH_CUDA 0
#endif
#ifndef KFT_WITH_NCCL
#define KFT_WITH_NCCL 0
#endif
#ifndef KFT_WITH_HWLOC
#define KFT_WITH_HWLOC 0
#endif
#ifndef KFT_WITH_GLOO
#define KFT_WITH_GLOO 0
#endif

#if (KFT_WITH_MPI != 0 && KFT_WITH_MPI != 1) || (KFT_WITH_CUDA != 0 && KFT_WITH_CUDA != 1) || \
    (KFT_WITH_NCCL != 0 && KFT_WITH_NCCL != 1) || (KFT_WITH_HWLOC != 0 && KFT_WITH_HWLOC != 1) || \
    (KFT_WITH_GLOO != 0 && KFT_WITH_GLOO != 1)
#error "kft: each KFT_WITH_* macro must be 0 or 1"
#endif
#if KFT_WITH_NCCL && !KFT_WITH_CUDA
#error "kft: KFT_WITH_NCCL=1 needs KFT_WITH_CUDA=1"
#endif
