/// @file kft/topology/hwloc.hpp
/// @brief Host facts from hwloc (component `kft::hwloc`): cores, NUMA nodes, binding.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_HWLOC
#error "kft/topology/hwloc.hpp needs the hwloc component: configure kft with KFT_WITH_HWLOC=ON and link kft::hwloc"
#endif

#include <hwloc.h>

#include <cstdlib>
#include <memory>
#include <string>

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
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set.get()) >= 0 && text != nullptr) {
    f.bound_cpuset = text;
    std::free(text);
  }
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

}  // namespace topology
KFT_NAMESPACE_END
