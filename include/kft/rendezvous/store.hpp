// SPDX-License-Identifier: Apache-2.0
/// @file kft/rendezvous/store.hpp
/// @brief The rendezvous store: a small key-value service every rank (and every kftrun
/// agent) of a job can reach, used to meet, exchange addresses and agree.
///
/// Implementations: `memory_store` (ranks as threads of one process), `file_store` (one host),
/// `tcp_store` (any number of hosts; the server runs in kftrun's node-0 agent or in rank 0),
/// and an MPI bootstrap that sets up a `tcp_store` through MPI (`mpi_bootstrap.hpp`).
/// `prefix_store` scopes any of them (one job, one restart round, one communicator).
///
/// Every wait takes a timeout; running past it is a `timeout_error` that names the keys still
/// missing and the store.
///
/// Batches: `wait` (many keys), `multi_get` and `multi_set` are one request each on the TCP store
/// (one round trip for any number of keys); the other stores do them key by key (the defaults
/// below), with the same results.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN
namespace rendezvous {

using namespace std::chrono_literals;

/// @brief Result of `compare_set`.
struct cas_result {
  bool swapped = false;                ///< true when the value was replaced (or created)
  std::optional<std::string> current;  ///< the value after the call (nullopt: key absent)
};

/// @brief One key and its value, for `multi_set`.
using key_value = std::pair<std::string, std::string>;

/// @brief Key-value store shared by the processes of a job. Values are arbitrary bytes.
class store {
 public:
  virtual ~store() = default;

  /// @brief Sets (or replaces) a key; wakes everyone waiting for it.
  virtual void set(std::string_view key, std::string_view value) = 0;
  /// @brief The value if the key exists now; never waits.
  virtual std::optional<std::string> try_get(std::string_view key) = 0;
  /// @brief Waits until the key exists, then returns its value.
  /// @throws timeout_error naming the key after `timeout`
  virtual std::string get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  /// @brief Waits until every key exists.
  /// @throws timeout_error naming the keys still missing after `timeout`
  virtual void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) = 0;
  /// @brief Atomically adds `delta` to an integer key (absent = 0) and returns the new value.
  /// @throws usage_error when the key holds something that is not a decimal integer
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  /// @brief Atomically sets `key` to `desired` if its value is `expected` (nullopt: if it is
  /// absent). Returns whether it did and the value afterwards.
  virtual cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                                 std::string_view desired) = 0;
  /// @brief Removes a key; returns whether it existed.
  virtual bool erase(std::string_view key) = 0;
  /// @brief The keys that start with `prefix`, sorted.
  virtual std::vector<std::string> keys(std::string_view prefix) = 0;
  /// @brief E.g. "tcp store 10.0.0.1:29500", for messages.
  virtual std::string describe() const = 0;

  /// @brief Sets every key to its value (a later item wins over an earlier one with the same key).
  /// The TCP store sends them in one request and applies them as one step; the default sets them
  /// one by one.
  virtual void multi_set(std::span<const key_value> items) {
    for (const auto& [key, value] : items) set(key, value);
  }
  /// @brief Waits until every key exists, then returns their values in the order of `keys`. The
  /// TCP store asks in one request; the default waits for all, then reads them one by one (a key
  /// erased in between is waited for again until the same deadline).
  /// @throws timeout_error naming the keys still missing after `timeout`
  virtual std::vector<std::string> multi_get(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    wait(keys, timeout);
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const auto& key : keys) {
      auto v = try_get(key);
      if (!v) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        v = get(key, std::max(left, std::chrono::milliseconds(0)));
      }
      values.push_back(std::move(*v));
    }
    return values;
  }
};

namespace detail {
inline std::string missing_list(std::span<const std::string> keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "\"" : ", \"") + k + "\"";
  return s;
}
inline timeout_error wait_timeout(const std::string& op, std::span<const std::string> missing,
                                  std::chrono::milliseconds timeout, const std::string& where) {
  return timeout_error("timed out after " + kft::detail::describe_duration(timeout) + " waiting for " +
                           (missing.size() == 1 ? "key " : "keys ") + missing_list(missing) + " on " + where,
                       error_site::of("store " + op));
}
}  // namespace detail

/// @brief A view of another store with every key prefixed (e.g. "job42/round3/").
class prefix_store final : public store {
 public:
  prefix_store(std::shared_ptr<store> inner, std::string prefix) : inner_(std::move(inner)), prefix_(std::move(prefix)) {
    if (!inner_) throw usage_error("prefix_store needs a store", error_site::of("store"));
  }

  void set(std::string_view key, std::string_view value) override { inner_->set(full(key), value); }
  std::optional<std::string> try_get(std::string_view key) override { return inner_->try_get(full(key)); }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    return inner_->get(full(key), timeout);
  }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> k;
    k.reserve(keys.size());
    for (const auto& key : keys) k.push_back(full(key));
    inner_->wait(k, timeout);
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override { return inner_->add(full(key), delta); }
  cas_result compare_set(std::string_view key, std::optional<std::string_view> expected,
                         std::string_view desired) override {
    return inner_->compare_set(full(key), expected, desired);
  }
  bool erase(std::string_view key) override { return inner_->erase(full(key)); }
  void multi_set(std::span<const key_value> items) override {
    std::vector<key_value> full_items;
    full_items.reserve(items.size());
    for (const auto& [key, value] : items) full_items.emplace_back(full(key), value);
    inner_->multi_set(full_items);
  }
  std::vector<std::string> multi_get(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> k;
    k.reserve(keys.size());
    for (const auto& key : keys) k.push_back(full(key));
    return inner_->multi_get(k, timeout);
  }
  std::vector<std::string> keys(std::string_view prefix) override {
    auto all = inner_->keys(full(prefix));
    for (auto& k : all) k.erase(0, prefix_.size());
    return all;
  }
  std::string describe() const override { return inner_->describe() + " (prefix \"" + prefix_ + "\")"; }

  const std::shared_ptr<store>& inner() const noexcept { return inner_; }

 private:
  std::string full(std::string_view key) const { return prefix_ + std::string(key); }
  std::shared_ptr<store> inner_;
  std::string prefix_;
};

/// @brief Blocks until `count` participants have called `barrier` with the same `name`.
/// Each name can be used once per store scope (use a prefix_store per round).
/// @throws timeout_error naming how many arrived
inline void barrier(store& s, const std::string& name, int count, std::chrono::milliseconds timeout) {
  const auto arrived = s.add(name + "/arrived", 1);
  if (arrived == count) s.set(name + "/open", "1");
  try {
    (void)s.get(name + "/open", timeout);
  } catch (const timeout_error&) {
    const auto now = s.add(name + "/arrived", 0);
    throw timeout_error("barrier \"" + name + "\" timed out after " + kft::detail::describe_duration(timeout) + ": " +
                            std::to_string(now) + " of " + std::to_string(count) + " arrived on " + s.describe(),
                        error_site::of("store barrier"));
  }
}

}  // namespace rendezvous
KFT_NAMESPACE_END
