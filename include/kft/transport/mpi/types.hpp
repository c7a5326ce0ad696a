// SPDX-License-Identifier: Apache-2.0
/// @file kft/transport/mpi/types.hpp
/// @brief kft's element types and reductions in MPI terms (component `kft::mpi`): MPI
/// datatypes, MPI's built-in ops, and user ops for f16/bf16 that accumulate in float.
#pragma once

#include <kft/config.hpp>
#if !KFT_WITH_MPI
#error "kft/transport/mpi/types.hpp needs the MPI component: configure kft with KFT_WITH_MPI=ON and link kft::mpi"
#endif

#include <mpi.h>

#include <array>
#include <cstddef>

#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/kernels/reduce.hpp>

KFT_NAMESPACE_BEGIN
namespace mpi {

namespace detail {

// f16/bf16 travel as MPI_UINT16_T and reduce through these user ops (float accumulation).
template <dtype T, op_kind Op>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  kernels::reduce(inout, srcs, 2, static_cast<std::size_t>(*len), T, Op, 1);
}

template <dtype T>
MPI_Op user_op(op_kind op) {
  // One MPI_Op per (type, op), created on first use (MPI is initialised by then) and kept
  // until MPI_Finalize frees it.
  static const std::array<MPI_Op, 4> ops = [] {
    std::array<MPI_Op, 4> o{};
    MPI_Op_create(&reduce16<T, op_kind::sum>, 1, &o[0]);
    MPI_Op_create(&reduce16<T, op_kind::prod>, 1, &o[1]);
    MPI_Op_create(&reduce16<T, op_kind::min>, 1, &o[2]);
    MPI_Op_create(&reduce16<T, op_kind::max>, 1, &o[3]);
    return o;
  }();
  switch (op) {
    case op_kind::prod: return ops[1];
    case op_kind::min: return ops[2];
    case op_kind::max: return ops[3];
    default: return ops[0];  // sum, and avg (divided afterwards)
  }
}

inline MPI_Datatype datatype(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
    case dtype::f16:
    case dtype::bf16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op reduction(dtype t, op_kind op) {
  if (t == dtype::f16) return user_op<dtype::f16>(op);
  if (t == dtype::bf16) return user_op<dtype::bf16>(op);
  switch (op) {
    case op_kind::prod: return MPI_PROD;
    case op_kind::min: return MPI_MIN;
    case op_kind::max: return MPI_MAX;
    default: return MPI_SUM;
  }
}

}  // namespace detail

}  // namespace mpi
KFT_NAMESPACE_END
