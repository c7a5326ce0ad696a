// SPDX-License-Identifier: Apache-2.0
/// @file kft/topology/hwloc.hpp
/// @brief Host facts from hwloc (component `kft::hwloc`): cores, NUMA nodes, binding.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_HWLOC
#error "kft/topology/hwloc.hpp needs the hwloc component: configure kft with KFT_WITH_HWLOC=ON and link kft::hwloc"
#endif

#include <hwloc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace topology {

/// @brief What this host looks like and where this process may run.
struct host_facts {
  int packages = 0;    ///< sockets
  int numa_nodes = 0;  ///< NUMA nodes
  int cores = 0;       ///< physical cores
  int pus = 0;         ///< hardware threads
  std::string bound_cpuset;  ///< PUs this process is bound to, as a list ("0-3,8")
  int bound_pus = 0;         ///< how many PUs that is
  int bound_numa_nodes = 0;  ///< NUMA nodes those PUs touch
  std::string hwloc_api_version; ///< hwloc API version of the loaded library
};

namespace detail {
struct topology_deleter {
  void operator()(hwloc_topology_t t) const noexcept { hwloc_topology_destroy(t); }
};
struct bitmap_deleter {
  void operator()(hwloc_bitmap_s* b) const noexcept { hwloc_bitmap_free(b); }
};
using unique_topology = std::unique_ptr<hwloc_topology, topology_deleter>;
using unique_bitmap = std::unique_ptr<hwloc_bitmap_s, bitmap_deleter>;

// The one place where hwloc's return codes become kft exceptions.
inline void hwloc_check(int rc, const char* call) {
  if (rc < 0) throw transport_error(std::string(call) + " failed", error_site::of("topology"), rc);
}

inline std::string list_of(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  std::string out;
  if (hwloc_bitmap_list_asprintf(&text, set) >= 0 && text != nullptr) {
    out = text;
    std::free(text);
  }
  return out;
}

inline unique_topology load_topology() {
  hwloc_topology_t raw = nullptr;
  hwloc_check(hwloc_topology_init(&raw), "hwloc_topology_init");
  unique_topology topo(raw);
  hwloc_check(hwloc_topology_load(raw), "hwloc_topology_load");
  return topo;
}
}  // namespace detail

/// @brief Reads this host's topology and this process's CPU binding.
/// @throws transport_error when hwloc cannot load the topology
inline host_facts query_host() {
  auto topo = detail::load_topology();
  hwloc_topology_t t = topo.get();
  host_facts f;
  auto count = [&](hwloc_obj_type_t type) { return hwloc_get_nbobjs_by_type(t, type); };
  f.packages = count(HWLOC_OBJ_PACKAGE);
  f.numa_nodes = count(HWLOC_OBJ_NUMANODE);
  f.cores = count(HWLOC_OBJ_CORE);
  f.pus = count(HWLOC_OBJ_PU);

  detail::unique_bitmap set(hwloc_bitmap_alloc());
  if (!set) throw transport_error("hwloc_bitmap_alloc failed", error_site::of("topology"));
  detail::hwloc_check(hwloc_get_cpubind(t, set.get(), HWLOC_CPUBIND_PROCESS), "hwloc_get_cpubind");
  f.bound_cpuset = detail::list_of(set.get());
  f.bound_pus = hwloc_bitmap_weight(set.get());
  detail::unique_bitmap nodes(hwloc_bitmap_alloc());
  if (nodes) {
    hwloc_cpuset_to_nodeset(t, set.get(), nodes.get());
    f.bound_numa_nodes = hwloc_bitmap_weight(nodes.get());
  }
  const unsigned v = hwloc_get_api_version();
  f.hwloc_api_version = std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff);
  return f;
}

/// @brief Where `bind_local_rank` puts a process.
enum class bind_policy {
  none,  ///< leave the binding alone
  core,  ///< a share of the cores: local ranks spread over NUMA nodes, then cores within each
  numa,  ///< the whole NUMA node (local ranks round-robin over NUMA nodes)
  gpu,   ///< the cores closest to the rank's GPU (its PCI bus id)
};

/// @brief `KFT_BIND` = none | core | numa | gpu; absent = `fallback`.
/// @throws config_error naming the variable and value
inline bind_policy bind_policy_from_env(const environment& env = environment::process(),
                                        bind_policy fallback = bind_policy::none) {
  const auto v = env.get("KFT_BIND");
  if (!v || v->empty()) return fallback;
  if (*v == "none") return bind_policy::none;
  if (*v == "core") return bind_policy::core;
  if (*v == "numa") return bind_policy::numa;
  if (*v == "gpu") return bind_policy::gpu;
  throw config_error("KFT_BIND", *v, "is not none, core, numa or gpu", error_site::of("topology"));
}

/// @brief What `bind_local_rank` did.
struct binding {
  bool applied = false;
  std::string cpuset;  ///< PUs, as a list ("0-3,8"); empty when nothing was applied
  int pus = 0;
  std::string reason;  ///< how the set was chosen, or why nothing was applied
};

/// @brief The PUs local rank `local_rank` of `local_size` should run on under `policy`.
/// Ranks are spread first over NUMA nodes (so memory bandwidth is shared evenly), then over the
/// cores of their node; more ranks than cores share cores round-robin. For `gpu`,
/// `gpu_pci_bus_id` ("0000:3b:00.0", e.g. from `topology::query_cuda_devices()`) picks the
/// cores of the GPU's closest non-I/O ancestor (its NUMA node or package).
/// @throws usage_error for bad ranks or a missing bus id, transport_error when hwloc fails
inline binding plan_binding(int local_rank, int local_size, bind_policy policy, std::string_view gpu_pci_bus_id = {}) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size)
    throw usage_error("binding: local rank " + std::to_string(local_rank) + " of " + std::to_string(local_size) +
                          " is not a valid place",
                      error_site::of("topology"));
  binding b;
  if (policy == bind_policy::none) {
    b.reason = "policy none";
    return b;
  }
  hwloc_topology_t raw = nullptr;
  detail::hwloc_check(hwloc_topology_init(&raw), "hwloc_topology_init");
  detail::unique_topology topo(raw);
  if (policy == bind_policy::gpu)
    hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  detail::hwloc_check(hwloc_topology_load(raw), "hwloc_topology_load");
  detail::unique_bitmap set(hwloc_bitmap_alloc());
  if (policy == bind_policy::gpu) {
    if (gpu_pci_bus_id.empty())
      throw usage_error("binding near a GPU needs its PCI bus id", error_site::of("topology"));
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(raw, std::string(gpu_pci_bus_id).c_str());
    hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(raw, dev) : nullptr;
    if (anc == nullptr || anc->cpuset == nullptr) {
      b.reason = "hwloc does not see PCI device " + std::string(gpu_pci_bus_id) + ": binding left alone";
      return b;
    }
    hwloc_bitmap_copy(set.get(), anc->cpuset);
    b.reason = "the cores nearest GPU " + std::string(gpu_pci_bus_id);
  } else {
    const int numa = std::max(1, hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE));
    const int node = local_rank % numa;
    hwloc_obj_t numa_obj = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node));
    hwloc_const_cpuset_t node_set = numa_obj && numa_obj->cpuset ? numa_obj->cpuset : hwloc_topology_get_topology_cpuset(raw);
    if (policy == bind_policy::numa) {
      hwloc_bitmap_copy(set.get(), node_set);
      b.reason = "NUMA node " + std::to_string(node) + " of " + std::to_string(numa);
    } else {
      // Ranks on this NUMA node: local_rank = node + numa * i, i = 0..here-1.
      const int here = (local_size - node + numa - 1) / numa, i = local_rank / numa;
      std::vector<hwloc_obj_t> cores;
      for (hwloc_obj_t c = nullptr; (c = hwloc_get_next_obj_covering_cpuset_by_type(raw, node_set, HWLOC_OBJ_CORE, c));)
        cores.push_back(c);
      if (cores.empty()) {
        hwloc_bitmap_copy(set.get(), node_set);
        b.reason = "no cores listed: NUMA node " + std::to_string(node);
      } else {
        const std::size_t n = cores.size(), h = static_cast<std::size_t>(here), ii = static_cast<std::size_t>(i);
        // An even share of the node's cores; more ranks than cores wrap around.
        const std::size_t first = h <= n ? ii * n / h : ii % n, last = h <= n ? (ii + 1) * n / h : first + 1;
        hwloc_bitmap_zero(set.get());
        for (std::size_t c = first; c < last; ++c) hwloc_bitmap_or(set.get(), set.get(), cores[c]->cpuset);
        b.reason = "core(s) " + std::to_string(first) + "-" + std::to_string(last - 1) + " of NUMA node " +
                   std::to_string(node) + " (" + std::to_string(here) + " local rank(s) share its " +
                   std::to_string(n) + " core(s))";
      }
    }
  }
  b.cpuset = detail::list_of(set.get());
  b.pus = hwloc_bitmap_weight(set.get());
  return b;
}

/// @brief Plans (`plan_binding`) and applies the binding to the whole process.
inline binding bind_local_rank(int local_rank, int local_size, bind_policy policy, std::string_view gpu_pci_bus_id = {}) {
  binding b = plan_binding(local_rank, local_size, policy, gpu_pci_bus_id);
  if (b.cpuset.empty()) return b;
  auto topo = detail::load_topology();
  detail::unique_bitmap set(hwloc_bitmap_alloc());
  if (hwloc_bitmap_list_sscanf(set.get(), b.cpuset.c_str()) < 0)
    throw transport_error("hwloc could not parse cpuset " + b.cpuset, error_site::of("topology"));
  detail::hwloc_check(hwloc_set_cpubind(topo.get(), set.get(), HWLOC_CPUBIND_PROCESS), "hwloc_set_cpubind");
  b.applied = true;
  return b;
}

}  // namespace topology
KFT_NAMESPACE_END
