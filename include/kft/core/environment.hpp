// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/environment.hpp
/// @brief A snapshot of the process environment: what discovery, the store, topology and the
/// process groups read.
///
/// The one place in kft that reads the process environment (`environ`; nothing calls getenv()):
/// everything else reads an `environment` it is given, which is either a snapshot of this
/// process (`environment::process()`, taken by the program, `kft::init`, the groups or the
/// tools) or a fixed map (tests, tools that explain "what would rank 3 see"). Below the process
/// groups nothing takes the snapshot itself (docs/architecture.md). The hostname and the files
/// discovery may read (Kubernetes' MPI hostfile) go through it too, so a fixed environment is
/// complete.
#pragma once

#include <unistd.h>

#include <climits>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <kft/core/namespace.hpp>

extern "C" char** environ;  // POSIX

KFT_NAMESPACE_BEGIN

/// @brief Immutable set of environment variables plus the host's name.
class environment {
 public:
  using map_type = std::map<std::string, std::string, std::less<>>;

  environment() = default;
  /// @brief A fixed environment; `hostname` stands in for gethostname().
  explicit environment(map_type vars, std::string hostname = "localhost")
      : vars_(std::move(vars)), hostname_(std::move(hostname)) {}

  /// @brief Snapshot of this process's environment and hostname.
  static environment process() {
    map_type vars;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string_view kv(*e);
      auto eq = kv.find('=');
      if (eq == std::string_view::npos) continue;
      vars.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
    char host[HOST_NAME_MAX + 1] = {};
    std::string h = ::gethostname(host, sizeof host) == 0 ? std::string(host) : "localhost";
    return environment(std::move(vars), std::move(h));
  }

  /// @brief The variable's value, or nullopt when unset. An empty value counts as set.
  std::optional<std::string> get(std::string_view name) const {
    auto it = vars_.find(name);
    if (it == vars_.end()) return std::nullopt;
    return it->second;
  }
  bool has(std::string_view name) const { return vars_.find(name) != vars_.end(); }

  /// @brief This host's name (gethostname() for a process snapshot).
  const std::string& hostname() const noexcept { return hostname_; }
  const map_type& variables() const noexcept { return vars_; }

  /// @brief Returns a copy with `name` set (or overwritten).
  environment with(std::string name, std::string value) const {
    environment copy = *this;
    copy.vars_.insert_or_assign(std::move(name), std::move(value));
    return copy;
  }

 private:
  map_type vars_;
  std::string hostname_ = "localhost";
};

/// @brief Reads a whole text file; nullopt when it cannot be opened.
inline std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

KFT_NAMESPACE_END
