# SPDX-License-Identifier: Apache-2.0
# kft_add_header_tests(<target> <include-root> [PER_FOLDER])
#
# Generates one translation unit per public header (each includes its header twice, so a
# missing include or include guard shows) and builds them all into the object library
# <target>. Headers of a component whose target does not exist are left out.
#
# nvcc: each .cuh (kernels, nvcc only) gets a translation unit of its own; the .hpp headers of
# the CUDA and NCCL components, each already compiled on its own by the C++ compiler, are
# compiled together in one nvcc translation unit (what nvcc adds is its front end, not a
# second self-containment check; one nvcc run costs 15-25 s, most of it fixed).
#
# PER_FOLDER: one translation unit per folder, including each of its headers (twice), for a
# second configuration (the all-components-off build) whose headers were each checked alone in
# the main build: it checks that they compile in that configuration, in a fraction of the time.

# A header's components come from the header itself: component headers refuse to compile
# with `#if !KFT_WITH_<COMP>` + `#error`, and each such line names a target they need.
function(kft_add_header_tests target include_root)
  cmake_parse_arguments(arg "PER_FOLDER" "" "" ${ARGN})
  file(GLOB_RECURSE headers RELATIVE "${include_root}" CONFIGURE_DEPENDS
       "${include_root}/kft/*.hpp" "${include_root}/kft/*.cuh")
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  set(cxx_sources)
  set(cu_sources)
  set(cu_together "")     # the .hpp headers nvcc compiles in one translation unit
  set(folder_bodies)      # PER_FOLDER: folder ids, each with a variable body_<id>
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
      if(arg_PER_FOLDER)
        get_filename_component(folder "${h}" DIRECTORY)
        string(MAKE_C_IDENTIFIER "${folder}" fid)
        if(NOT fid IN_LIST folder_bodies)
          list(APPEND folder_bodies ${fid})
          set(body_${fid} "// Generated: the headers of ${folder}/ compile in this configuration.\n")
        endif()
        string(APPEND body_${fid} "#include <${h}>\n#include <${h}>\n")
      else()
        file(CONFIGURE OUTPUT "${gen_dir}/${id}.cpp" CONTENT "${body}")
        list(APPEND cxx_sources "${gen_dir}/${id}.cpp")
      endif()
    endif()
    # nvcc builds the GPU headers; one that also needs a host-only component (MPI) is left to
    # the C++ compiler (the MPI headers are not checked under nvcc).
    set(host_only "${needs}")
    list(FILTER host_only EXCLUDE REGEX "^kft::(cuda|nccl)$")
    if(CMAKE_CUDA_COMPILER AND needs MATCHES "kft::(cuda|nccl)" AND NOT host_only)
      if(h MATCHES "\\.cuh$")
        file(CONFIGURE OUTPUT "${gen_dir}/${id}.cu" CONTENT "${body}")
        list(APPEND cu_sources "${gen_dir}/${id}.cu")
      else()
        string(APPEND cu_together "#include <${h}>\n#include <${h}>\n")
      endif()
    endif()
  endforeach()
  foreach(fid IN LISTS folder_bodies)
    file(CONFIGURE OUTPUT "${gen_dir}/folder_${fid}.cpp" CONTENT "${body_${fid}}")
    list(APPEND cxx_sources "${gen_dir}/folder_${fid}.cpp")
  endforeach()
  if(cu_together)
    file(CONFIGURE OUTPUT "${gen_dir}/gpu_headers_under_nvcc.cu"
         CONTENT "// Generated: the CUDA and NCCL .hpp headers (each compiled alone by the C++ compiler) under nvcc.\n${cu_together}")
    list(APPEND cu_sources "${gen_dir}/gpu_headers_under_nvcc.cu")
  endif()
  list(REMOVE_DUPLICATES libs)
  add_library(${target} OBJECT ${cxx_sources} ${cu_sources})
  target_link_libraries(${target} PRIVATE ${libs} kft_warnings)
  # A header check proves that a header compiles on its own; it runs no code, so it needs no
  # optimiser (and gives up no warning: GCC analyses only the functions a TU emits, and a header
  # check emits almost none). Without it the 111 C++ checks took 190 CPU-s and the 11 nvcc ones
  # 177 CPU-s, most of the latter in cicc optimising device code (communicator.cuh: cicc 11.0 s
  # at its default level against 2.1 s at -O0, of 19.9 s in all).
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0 -g0>
                         $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-O0,-g0 -Xcicc=-O0 -Xptxas=-O0>)
  if(cu_sources)
    # kft::kft asks for C++20 of the C++ compiler only; nvcc needs it asked too (by flag: CMake
    # before 3.26 knows no CUDA_STANDARD 20 for nvcc).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  list(LENGTH cxx_sources n_cxx)
  list(LENGTH cu_sources n_cu)
  message(STATUS "kft: ${target}: ${n_cxx} header TUs (C++), ${n_cu} (nvcc); without their component: ${skipped}")
endfunction()
