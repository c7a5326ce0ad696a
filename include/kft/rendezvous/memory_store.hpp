// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/memory_store.hpp
/// @brief A store inside one process, for ranks that are threads (tests, the fast suite).
#pragma once

#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>

#include <kft/rendezvous/store.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

namespace detail {
/// Parses a stored counter; absent = 0. Shared by the stores' `add`.
inline std::int64_t counter_value(const std::optional<std::string>& v, std::string_view key, const std::string& where) {
  if (!v) return 0;
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size())
    throw usage_error("add on key \"" + kft::detail::excerpt(key) + "\" of " + where + ", which holds \"" +
                          kft::detail::excerpt(*v) + "\", not an integer",
                      error_site::of("store add"));
  return x;
}

/// The stored counter plus `delta`: what every store's `add` computes. A sum past the range of
/// int64 is a usage_error, never a wrap.
inline std::int64_t counter_add(const std::optional<std::string>& v, std::string_view key, const std::string& where,
                                std::int64_t delta) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(counter_value(v, key, where), delta, &sum))
    throw usage_error("add of " + std::to_string(delta) + " on key \"" + kft::detail::excerpt(key) + "\" of " + where +
                          " overflows a 64-bit counter (it holds " + *v + ")",
                      error_site::of("store add"));
  return sum;
}
}  // namespace detail

/// @brief Thread-safe in-process store. Share one instance (by shared_ptr) between threads.
class memory_store final : public store {
 public:
  void set(std::string_view key, std::string_view value) override {
    {
      std::lock_guard lock(mu_);
      map_.insert_or_assign(std::string(key), std::string(value));
    }
    cv_.notify_all();
  }
  std::optional<std::string> try_get(std::string_view key) override {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    auto found = [&] { return map_.find(key) != map_.end(); };
    if (!cv_.wait_for(lock, timeout, found)) {
      const std::string k(key);
      throw detail::wait_timeout("get", std::span(&k, 1), timeout, describe());
    }
    return map_.find(key)->second;
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    auto all = [&] {
      for (const auto& k : keys)
        if (map_.find(k) == map_.end()) return false;
      return true;
    };
    if (!cv_.wait_for(lock, timeout, all)) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (map_.find(k) == map_.end()) missing.push_back(k);
      throw detail::wait_timeout("wait", missing, timeout, describe());
    }
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::int64_t v = 0;
    {
      std::lock_guard lock(mu_);
      auto it = map_.find(key);
      v = detail::counter_add(it == map_.end() ? std::nullopt : std::optional<std::string>(it->second), key,
                              describe(), delta);
      map_.insert_or_assign(std::string(key), std::to_string(v));
    }
    cv_.notify_all();
    return v;
  }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    cas_result r;
    {
      std::lock_guard lock(mu_);
      auto it = map_.find(key);
      const bool matches = expected ? (it != map_.end() && it->second == *expected) : it == map_.end();
      if (matches) {
        map_.insert_or_assign(std::string(key), std::string(desired));
        r.swapped = true;
        r.current = std::string(desired);
      } else if (it != map_.end()) {
        r.current = it->second;
      }
    }
    if (r.swapped) cv_.notify_all();
    return r;
  }
  bool erase(std::string_view key) override {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    map_.erase(it);
    return true;
  }
  std::vector<std::string> keys(std::string_view prefix) override {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (auto it = map_.lower_bound(prefix); it != map_.end() && it->first.starts_with(prefix); ++it)
      out.push_back(it->first);
    return out;
  }
  std::string describe() const override { return "memory store"; }
  /// One step under the lock: no reader sees part of the batch.
  void multi_set(std::span<const key_value> items) override {
    {
      std::lock_guard lock(mu_);
      for (const auto& [key, value] : items) map_.insert_or_assign(key, value);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> map_;
};

}  // namespace rendezvous
KFT_NAMESPACE_END
