// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/hooks.hpp
/// @brief Communication hooks: how the DDP reducer reduces one bucket (c10d's comm hooks).
///
/// A hook has `launch(group, bucket)`, which starts the bucket's reduction and returns its work
/// (after which the bucket's storage must hold the average over the ranks), and
/// `complete(bucket)`, run once that work is done. kft's:
///  - `allreduce_avg` (the default): one allreduce with `op_kind::avg`; the division happens in
///    the reduction itself, so averaging costs no extra pass over the gradients;
///  - `bf16_compress` / `fp16_compress`, for f32 buckets: scale by 1/N and compress to 16 bits,
///    allreduce the half-size buffer (kft's kernels add 16-bit values in f32 and round once per
///    step), widen back into the bucket. Half the bytes on the wire, at a precision cost.
/// Write your own by providing the same two members (`kft::ddp::comm_hook`).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <kft/async/work.hpp>
#include <kft/core/dtype.hpp>
#include <kft/core/ops.hpp>
#include <kft/core/options.hpp>
#include <kft/ddp/memory.hpp>
#include <kft/transport/concepts.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief One bucket as a hook sees it.
struct bucket_view {
  std::size_t index = 0;  ///< bucket number (launch order)
  dtype type = dtype::f32;
  void* data = nullptr;   ///< the bucket's gradients, contiguous
  std::size_t count = 0;  ///< elements (a multiple of reducer_options::bucket_multiple)
  std::size_t used = 0;   ///< elements holding gradients; [used, count) is zero padding
  bool last = false;      ///< the step's last bucket
  options opts;           ///< what the reducer's collectives carry (the layout's fingerprint as tag, timeout)
};

/// @brief What a communication hook provides.
template <class H, class G>
concept comm_hook = requires(H& h, G& g, bucket_view& b) {
  { h.launch(g, b) } -> work_handle;
  h.complete(b);
};

/// @brief The default: the bucket averaged by one allreduce.
struct allreduce_avg {
  template <class G>
  auto launch(G& g, bucket_view& b) {
    return g.allreduce_async(b.data, b.data, b.count, b.type, op_kind::avg, b.opts);
  }
  void complete(bucket_view&) {}
};

/// @brief f32 buckets travel as 16-bit values (`Wire` = bf16 or f16); other dtypes as they are.
template <dtype Wire>
class compress_hook {
  static_assert(Wire == dtype::bf16 || Wire == dtype::f16, "compress_hook carries bf16 or f16");

 public:
  template <class G>
  auto launch(G& g, bucket_view& b) {
    static_assert(!device_buffers_v<G>, "the compression hooks convert on the host: not for a GPU group's device buckets");
    if (b.type != dtype::f32) return g.allreduce_async(b.data, b.data, b.count, b.type, op_kind::avg, b.opts);
    if (wire_.size() <= b.index) wire_.resize(b.index + 1);
    auto& w = wire_[b.index];
    w.resize(b.count);  // reserved once per bucket: no allocation in later steps
    const float scale = 1.0f / static_cast<float>(g.size());
    const auto* src = static_cast<const float*>(b.data);
    for (std::size_t i = 0; i < b.count; ++i) w[i] = encode(src[i] * scale);  // divide first: no 16-bit overflow
    return g.allreduce_async(w.data(), w.data(), b.count, Wire, op_kind::sum, b.opts);
  }
  void complete(bucket_view& b) {
    if (b.type != dtype::f32) return;
    const auto& w = wire_[b.index];
    auto* dst = static_cast<float*>(b.data);
    for (std::size_t i = 0; i < b.count; ++i) dst[i] = decode(w[i]);
  }

 private:
  static std::uint16_t encode(float v) {
    if constexpr (Wire == dtype::bf16) return bfloat16::from_float(v);
    else return half::from_float(v);
  }
  static float decode(std::uint16_t v) {
    if constexpr (Wire == dtype::bf16) return bfloat16::to_float(v);
    else return half::to_float(v);
  }
  std::vector<std::vector<std::uint16_t>> wire_;
};

using bf16_compress = compress_hook<dtype::bf16>;
using fp16_compress = compress_hook<dtype::f16>;

}  // namespace ddp
KFT_NAMESPACE_END
