# SPDX-License-Identifier: Apache-2.0
# Two objects built against differently configured kft installs must fail to link, because
# the inline namespace (kft::v0_1_mpi1_... vs kft::v0_1_mpi0_...) differs; the same two
# sources built against one configuration must link (the control).
#   cmake -DCXX=... -DSRC=<kft source> -DCONFIG_A=<dir with kft/configured.hpp> -DCONFIG_B=<dir> -DWORK=<dir> -P abi_mixed_link.cmake
file(MAKE_DIRECTORY ${WORK})
function(compile out src config)
  execute_process(COMMAND ${CXX} -std=c++20 -I${SRC}/include -I${config} -c ${src} -o ${out}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "compiling ${src} against ${config} failed:\n${err}")
  endif()
endfunction()
function(try_link out result)
  execute_process(COMMAND ${CXX} ${ARGN} -o ${out} RESULT_VARIABLE rc ERROR_VARIABLE err)
  set(${result} ${rc} PARENT_SCOPE)
  set(link_errors "${err}" PARENT_SCOPE)
endfunction()

set(H ${SRC}/tests/headers)
compile(${WORK}/def_a.o ${H}/abi_probe_def.cpp ${CONFIG_A})
compile(${WORK}/use_a.o ${H}/abi_probe_use.cpp ${CONFIG_A})
compile(${WORK}/use_b.o ${H}/abi_probe_use.cpp ${CONFIG_B})

try_link(${WORK}/same ok ${WORK}/def_a.o ${WORK}/use_a.o)
if(ok)
  message(FATAL_ERROR "control failed: one configuration did not link:\n${link_errors}")
endif()
try_link(${WORK}/mixed mixed ${WORK}/def_a.o ${WORK}/use_b.o)
if(NOT mixed)
  message(FATAL_ERROR "objects from two kft configurations linked together: the inline namespace does not encode the configuration")
endif()
string(REGEX MATCH "undefined reference to `abi_probe\\(kft::[^`']*" why "${link_errors}")
message(STATUS "mixed configurations refused at link time as intended: ${why}")
