# SPDX-License-Identifier: Apache-2.0
# Runs one *_perf benchmark for CTest and passes only if it exits 0 and reports no wrong values
# (and, with -DEXPECT=<regex>, its output matches that too).
#   cmake "-DCOMMAND=mpirun;-np;2;.../allreduce_perf;-b;8" -P check_perf.cmake
if(NOT COMMAND)
  message(FATAL_ERROR "check_perf.cmake: pass -DCOMMAND=<the command as a ;-list>")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(err)
  message("stderr:\n${err}")
endif()
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "check_perf: exit code ${rc}")
endif()
string(FIND "${out}" "# Out of bounds values : 0 OK" ok)
if(ok EQUAL -1 AND NOT NO_BOUNDS)
  message(FATAL_ERROR "check_perf: no \"# Out of bounds values : 0 OK\" line")
endif()
if(EXPECT AND NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "check_perf: the output does not match \"${EXPECT}\"")
endif()
