# SPDX-License-Identifier: Apache-2.0
# Helpers that register kft's tests with CTest.
#
#   kft_add_test(<name> SOURCES <files...> [LIBRARIES <targets...>] [LABELS <labels...>] [TIMEOUT <s>])
#     A Boost.Test executable run once as one CTest test.
#
#   kft_add_mpi_test(<name> SOURCES <files...> RANKS <n...> [LIBRARIES ...] [LABELS ...] [TIMEOUT <s>])
#     A Boost.Test executable run under Open MPI's mpirun once per rank count, registered as
#     <name>.<n>ranks (label "mpi"), with --oversubscribe so more ranks than cores work.

#
#   kft_suite_computes(<targets...>)
#     Programs whose tests spend their time computing (the conformance sweeps): built with
#     KFT_SUITE_OPTIMIZE_COMPUTE when it is set (it comes after the directory's
#     KFT_SUITE_OPTIMIZE, so it wins). Targets that do not exist are skipped.

find_package(Boost 1.74 REQUIRED COMPONENTS unit_test_framework)

function(kft_suite_computes)
  if(NOT KFT_SUITE_OPTIMIZE_COMPUTE)
    return()
  endif()
  foreach(t IN LISTS ARGN)
    if(TARGET ${t})
      target_compile_options(${t} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${KFT_SUITE_OPTIMIZE_COMPUTE}>")
    endif()
  endforeach()
endfunction()

function(_kft_test_executable name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBRARIES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE kft::kft Boost::unit_test_framework kft_warnings ${T_LIBRARIES})
  target_compile_definitions(${name} PRIVATE BOOST_TEST_DYN_LINK)
endfunction()

function(kft_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBRARIES;LABELS" ${ARGN})
  _kft_test_executable(${name} SOURCES ${T_SOURCES} LIBRARIES ${T_LIBRARIES})
  add_test(NAME ${name} COMMAND ${name} --log_level=test_suite --report_level=short --color_output=false)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}")
endfunction()

function(kft_add_mpi_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBRARIES;LABELS;RANKS" ${ARGN})
  if(NOT TARGET kft::mpi)
    message(STATUS "kft: ${name} not registered: the MPI component is off")
    return()
  endif()
  _kft_test_executable(${name} SOURCES ${T_SOURCES} LIBRARIES kft::mpi ${T_LIBRARIES})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${name}.${n}ranks
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
                     $<TARGET_FILE:${name}> --log_level=test_suite --report_level=short --color_output=false)
    set_tests_properties(${name}.${n}ranks PROPERTIES
      TIMEOUT ${T_TIMEOUT} LABELS "mpi;${T_LABELS}" PROCESSORS 2
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endfunction()
