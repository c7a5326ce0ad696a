// SPDX-License-Identifier: Apache-2.0
// In the all-off configuration config.hpp must say so, and the inline namespace must differ
// from any configuration with a component on.
#include <string_view>

#include <kft/kft.hpp>

static_assert(KFT_WITH_MPI == 0 && KFT_WITH_CUDA == 0 && KFT_WITH_NCCL == 0 && KFT_WITH_HWLOC == 0,
              "all components were configured OFF");
static_assert(std::string_view(KFT_ABI_NAMESPACE_STRING).ends_with("_mpi0_cuda0_nccl0_hwloc0_gloo0"));
