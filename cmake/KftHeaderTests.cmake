# kft_add_header_tests(<target> <include-root>)
#
# Generates one translation unit per public header (each includes its header twice, so a
# missing include or include guard shows) and builds them all into the object library
# <target>. Headers of a component whose target does not exist are left out; CUDA and NCCL
# headers are compiled a second time by nvcc when the CUDA language is enabled.

# A header's component comes from the header itself: component headers refuse to compile
# with `#if !KFT_WITH_<COMP>` + `#error`, and that line names the target they need.
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
    if(text MATCHES "#if !KFT_WITH_([A-Z]+)")
      string(TOLOWER "${CMAKE_MATCH_1}" comp)
      set(needs kft::${comp})
    elseif(text MATCHES "#include <nlohmann/json.hpp>")
      set(needs nlohmann_json::nlohmann_json)
    endif()
    if(needs AND NOT TARGET ${needs})
      list(APPEND skipped ${h})
      continue()
    endif()
    if(needs)
      list(APPEND libs ${needs})
    endif()
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(body "// Generated: ${h} must compile on its own.\n#include <${h}>\n#include <${h}>\n")
    file(CONFIGURE OUTPUT "${gen_dir}/${id}.cpp" CONTENT "${body}")
    list(APPEND cxx_sources "${gen_dir}/${id}.cpp")
    if(CMAKE_CUDA_COMPILER AND needs MATCHES "kft::(cuda|nccl)")
      file(CONFIGURE OUTPUT "${gen_dir}/${id}.cu" CONTENT "${body}")
      list(APPEND cu_sources "${gen_dir}/${id}.cu")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES libs)
  add_library(${target} OBJECT ${cxx_sources} ${cu_sources})
  target_link_libraries(${target} PRIVATE ${libs} kft_warnings)
  list(LENGTH cxx_sources n_cxx)
  list(LENGTH cu_sources n_cu)
  message(STATUS "kft: ${target}: ${n_cxx} header TUs (C++), ${n_cu} (nvcc); without their component: ${skipped}")
endfunction()
