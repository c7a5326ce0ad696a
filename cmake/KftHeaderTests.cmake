# SPDX-License-Identifier: Apache-2.0
# kft_add_header_tests(<target> <include-root>)
#
# Generates one translation unit per public header (each includes its header twice, so a
# missing include or include guard shows) and builds them all into the object library
# <target>. Headers of a component whose target does not exist are left out; CUDA and NCCL
# headers are compiled a second time by nvcc when the CUDA language is enabled.

# A header's components come from the header itself: component headers refuse to compile
# with `#if !KFT_WITH_<COMP>` + `#error`, and each such line names a target they need.
function(kft_add_header_tests target include_root)
  file(GLOB_RECURSE headers RELATIVE "${include_root}" CONFIGURE_DEPENDS
       "${include_root}/kft/*.hpp" "${include_root}/kft/*.cuh")
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  set(cxx_sources)
  set(cu_sources)
  set(libs kft::kft)
  set(skipped)
  foreach(h IN LISTS headers)
    file(READ "${include_root}/${h}" text)
    set(needs "")
    # Every guard counts: a header may need two components (e.g. NCCL and MPI).
    string(REGEX MATCHALL "#if !KFT_WITH_[A-Z]+" guards "${text}")
    foreach(g IN LISTS guards)
      string(REGEX REPLACE "#if !KFT_WITH_" "" comp "${g}")
      string(TOLOWER "${comp}" comp)
      list(APPEND needs kft::${comp})
    endforeach()
    if(NOT needs AND text MATCHES "#include <nlohmann/json.hpp>")
      set(needs nlohmann_json::nlohmann_json)
    endif()
    set(missing FALSE)
    foreach(n IN LISTS needs)
      if(NOT TARGET ${n})
        set(missing TRUE)
      endif()
    endforeach()
    if(missing)
      list(APPEND skipped ${h})
      continue()
    endif()
    if(needs)
      list(APPEND libs ${needs})
    endif()
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(body "// Generated: ${h} must compile on its own.\n#include <${h}>\n#include <${h}>\n")
    # A .cuh holds kernels: nvcc only (left out when there is no CUDA compiler).
    if(h MATCHES "\\.cuh$" AND NOT CMAKE_CUDA_COMPILER)
      list(APPEND skipped ${h})
      continue()
    endif()
    if(NOT h MATCHES "\\.cuh$")
      file(CONFIGURE OUTPUT "${gen_dir}/${id}.cpp" CONTENT "${body}")
      list(APPEND cxx_sources "${gen_dir}/${id}.cpp")
    endif()
    # nvcc builds the GPU headers; one that also needs a host-only component (MPI) is left to
    # the C++ compiler (the MPI headers are not checked under nvcc).
    set(host_only "${needs}")
    list(FILTER host_only EXCLUDE REGEX "^kft::(cuda|nccl)$")
    if(CMAKE_CUDA_COMPILER AND needs MATCHES "kft::(cuda|nccl)" AND NOT host_only)
      file(CONFIGURE OUTPUT "${gen_dir}/${id}.cu" CONTENT "${body}")
      list(APPEND cu_sources "${gen_dir}/${id}.cu")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES libs)
  add_library(${target} OBJECT ${cxx_sources} ${cu_sources})
  target_link_libraries(${target} PRIVATE ${libs} kft_warnings)
  if(cu_sources)
    # kft::kft asks for C++20 of the C++ compiler only; nvcc needs it asked too (by flag: CMake
    # before 3.26 knows no CUDA_STANDARD 20 for nvcc).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  list(LENGTH cxx_sources n_cxx)
  list(LENGTH cu_sources n_cu)
  message(STATUS "kft: ${target}: ${n_cxx} header TUs (C++), ${n_cu} (nvcc); without their component: ${skipped}")
endfunction()
