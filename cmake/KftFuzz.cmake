# SPDX-License-Identifier: Apache-2.0
# kft's libFuzzer targets (tests/fuzz/) as a standing check, from the tests' CMakeLists.
#
#   KFT_FUZZ = AUTO (build and run them when clang++ with libFuzzer is found), ON (must be found),
#              OFF (never)
#   KFT_FUZZ_CXX      the clang++ to build them with (found on PATH as clang++ or clang++-<N>)
#   KFT_FUZZ_SECONDS  how long each fuzz.<target> test fuzzes (default 10)
#
# libFuzzer needs clang while the main build is usually GCC, so tests/fuzz is a project of its own,
# built through ExternalProject in <build>/fuzz. Per target <t> two CTest tests (label "fuzz"):
#   fuzz.<t>              fuzzes for KFT_FUZZ_SECONDS from a scratch copy of tests/fuzz/corpus/<t>
#   fuzz.<t>.regressions  replays every file of tests/fuzz/regressions/<t>/ once
# docs/fuzzing.md has the rest.

set(KFT_FUZZ AUTO CACHE STRING "Build and run the libFuzzer targets (AUTO, ON or OFF; needs clang++ with libFuzzer)")
set_property(CACHE KFT_FUZZ PROPERTY STRINGS AUTO ON OFF)
if(NOT KFT_FUZZ MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "kft: KFT_FUZZ=${KFT_FUZZ} is not one of AUTO, ON, OFF")
endif()
set(KFT_FUZZ_SECONDS 10 CACHE STRING "Seconds each fuzz.<target> test fuzzes")

# Does `cxx` build and link a libFuzzer target with ASan and UBSan? Sets `out` to TRUE/FALSE and
# `why` to what failed. The answer is cached per compiler.
function(_kft_fuzz_probe cxx out why)
  if(DEFINED CACHE{_KFT_FUZZ_PROBED_CXX} AND "${_KFT_FUZZ_PROBED_CXX}" STREQUAL "${cxx}")
    set(${out} ${_KFT_FUZZ_PROBE_OK} PARENT_SCOPE)
    set(${why} "${_KFT_FUZZ_PROBE_WHY}" PARENT_SCOPE)
    return()
  endif()
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/fuzz-probe")
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dir}/probe.cpp"
       "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND "${cxx}" -std=c++20 -fsanitize=fuzzer,address,undefined probe.cpp -o probe
                  WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(rc EQUAL 0)
    set(ok TRUE)
    set(msg "")
  else()
    set(ok FALSE)
    string(REGEX REPLACE "\n.*" "" first "${log}")
    set(msg "${cxx} cannot link a libFuzzer target (${first}); Debian: apt-get install clang libclang-rt-14-dev")
  endif()
  set(_KFT_FUZZ_PROBED_CXX "${cxx}" CACHE INTERNAL "")
  set(_KFT_FUZZ_PROBE_OK ${ok} CACHE INTERNAL "")
  set(_KFT_FUZZ_PROBE_WHY "${msg}" CACHE INTERNAL "")
  set(${out} ${ok} PARENT_SCOPE)
  set(${why} "${msg}" PARENT_SCOPE)
endfunction()

set(KFT_HAVE_FUZZ FALSE)
if(NOT KFT_FUZZ STREQUAL "OFF")
  find_program(KFT_FUZZ_CXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14
               DOC "clang++ for the libFuzzer targets")
  if(KFT_FUZZ_CXX)
    _kft_fuzz_probe("${KFT_FUZZ_CXX}" _kft_fuzz_ok _kft_fuzz_why)
  else()
    set(_kft_fuzz_ok FALSE)
    set(_kft_fuzz_why "clang++ was not found (Debian: apt-get install clang libclang-rt-14-dev)")
  endif()
  if(_kft_fuzz_ok)
    set(KFT_HAVE_FUZZ TRUE)
  elseif(KFT_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "kft: KFT_FUZZ=ON but ${_kft_fuzz_why}")
  else()
    message(STATUS "kft: fuzz tests not registered: ${_kft_fuzz_why}")
  endif()
endif()

if(KFT_HAVE_FUZZ)
  include(ExternalProject)
  set(_kft_fuzz_src "${PROJECT_SOURCE_DIR}/tests/fuzz")
  set(_kft_fuzz_bin "${CMAKE_CURRENT_BINARY_DIR}/fuzz")
  # manifest_job/manifest_args compile kft-manifest's source and kftrun_args kftrun's command line,
  # so they need what the tools need.
  find_package(yaml-cpp QUIET)
  find_package(CLI11 QUIET)
  set(_kft_fuzz_targets discovery_env slurm_lists store_server store_wire)
  if(yaml-cpp_FOUND AND CLI11_FOUND)
    list(APPEND _kft_fuzz_targets manifest_job manifest_args)
  endif()
  if(CLI11_FOUND)
    list(APPEND _kft_fuzz_targets kftrun_args)
  endif()
  set(_kft_fuzz_bins)
  foreach(t IN LISTS _kft_fuzz_targets)
    list(APPEND _kft_fuzz_bins "${_kft_fuzz_bin}/${t}")
  endforeach()
  ExternalProject_Add(kft_fuzzers
    SOURCE_DIR "${_kft_fuzz_src}"
    BINARY_DIR "${_kft_fuzz_bin}"
    CMAKE_ARGS -DCMAKE_CXX_COMPILER=${KFT_FUZZ_CXX} -DKFT_SOURCE_DIR=${PROJECT_SOURCE_DIR} -DKFT_WERROR=${KFT_WERROR}
    INSTALL_COMMAND ""
    BUILD_ALWAYS TRUE  # the headers change under it; the sub-build knows what is stale
    BUILD_BYPRODUCTS ${_kft_fuzz_bins}
    USES_TERMINAL_BUILD TRUE)
  foreach(t IN LISTS _kft_fuzz_targets)
    set(dict)
    if(EXISTS "${_kft_fuzz_src}/${t}.dict")
      set(dict "-dict=${_kft_fuzz_src}/${t}.dict")
    endif()
    add_test(NAME fuzz.${t}
             COMMAND bash "${_kft_fuzz_src}/run-fuzz.sh" fuzz "${_kft_fuzz_bin}/${t}" "${_kft_fuzz_src}/corpus/${t}"
                     "${_kft_fuzz_bin}/runs/${t}" ${KFT_FUZZ_SECONDS} ${dict})
    # The run's own time, plus starting and loading the corpus; one core each.
    math(EXPR _timeout "${KFT_FUZZ_SECONDS} + 120")
    set_tests_properties(fuzz.${t} PROPERTIES TIMEOUT ${_timeout} LABELS "fuzz")
    add_test(NAME fuzz.${t}.regressions
             COMMAND bash "${_kft_fuzz_src}/run-fuzz.sh" regress "${_kft_fuzz_bin}/${t}"
                     "${_kft_fuzz_src}/regressions/${t}")
    set_tests_properties(fuzz.${t}.regressions PROPERTIES TIMEOUT 120 LABELS "fuzz")
  endforeach()
  message(STATUS "kft: fuzz targets (${KFT_FUZZ_CXX}): ${_kft_fuzz_targets}, ${KFT_FUZZ_SECONDS} s each")
endif()
