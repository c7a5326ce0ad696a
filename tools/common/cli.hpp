// SPDX-License-Identifier: Apache-2.0
// The command-line conventions every kft tool (kftrun, kft-info, kft-manifest) follows:
//
//   --help, --version     print and exit 0; --version prints "<tool> (kft <KFT_VERSION_STRING>)"
//   -v/--verbose          KFT_LOG_LEVEL=debug (also for the programs the tool starts)
//   -q/--quiet            KFT_LOG_LEVEL=warn
//   a usage error         one line "<tool> ERROR: <what, naming the flag and value>", exit 2
//
// Diagnostics go through kft/core/log.hpp (`<who> <LEVEL>: <message>` on standard error); the
// threshold is KFT_LOG_LEVEL (default info in the tools), which the flags above only set.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include <kft/config.hpp>
#include <kft/core/environment.hpp>
#include <kft/core/error.hpp>
#include <kft/core/log.hpp>

namespace kft_tools {

/// Exit status of a tool for bad input (a flag, its value, a missing argument, the environment).
inline constexpr int usage_status = 2;

/// "kft-info (kft 0.1.0)".
inline std::string version_line(std::string_view tool) {
  return std::string(tool) + " (kft " + KFT_VERSION_STRING + ")";
}

/// An error's message for a tool's log line: kft::error's "kft: " prefix and a "<tool>: " site
/// dropped (the line already names the tool), everything else kept.
inline std::string message_of(const std::exception& e, std::string_view tool = {}) {
  std::string_view m = e.what();
  if (m.rfind("kft: ", 0) == 0) m.remove_prefix(5);
  const std::string site = std::string(tool) + ": ";
  if (!tool.empty() && m.size() > site.size() && m.substr(0, site.size()) == site) m.remove_prefix(site.size());
  return std::string(m);
}

/// The flags every tool has, on `app`: --version, -v/--verbose, -q/--quiet (--help is CLI11's).
/// `app.fallthrough()` lets a subcommand's command line carry them too.
struct common_flags {
  bool verbose = false;
  bool quiet = false;

  void add_to(CLI::App& app, std::string_view tool) {
    app.set_version_flag("--version", version_line(tool), "print the tool's and kft's version and exit");
    auto* v = app.add_flag("-v,--verbose", verbose, "more detail on standard error (sets KFT_LOG_LEVEL=debug)");
    auto* q = app.add_flag("-q,--quiet", quiet, "warnings and errors only (sets KFT_LOG_LEVEL=warn)");
    v->excludes(q);
    app.fallthrough();
  }

  /// Sets KFT_LOG_LEVEL from the flags (so programs the tool starts inherit it), then the
  /// process's threshold from KFT_LOG_LEVEL (default info). Throws kft::config_error for a
  /// KFT_LOG_LEVEL that is not a level.
  void apply() const {
    if (verbose) ::setenv("KFT_LOG_LEVEL", "debug", 1);
    if (quiet) ::setenv("KFT_LOG_LEVEL", "warn", 1);
    kft::log::set_threshold(kft::log::threshold_from(kft::environment::process(), kft::log::level::info));
  }
};

/// Parses the command line. Returns the exit status when the tool must stop: 0 after --help or
/// --version (printed on standard output), 2 for a usage error (one ERROR line on standard
/// error naming the flag or value, and a pointer to --help); nullopt to go on.
inline std::optional<int> parse(CLI::App& app, std::string_view tool, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e) == 0 ? 0 : usage_status;
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e) == 0 ? 0 : usage_status;
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e) == 0 ? 0 : usage_status;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    // An unknown argument can surface as another error (a missing subcommand): name it too.
    if (dynamic_cast<const CLI::ExtrasError*>(&e) == nullptr) {
      std::string extras;
      for (const auto& r : app.remaining()) extras += (extras.empty() ? "" : " ") + r;
      if (!extras.empty()) what = "not expected: " + extras + "; " + what;
    }
    kft::log::error(tool, what + " (run " + std::string(tool) + " --help for the options)");
    return usage_status;
  }
  return std::nullopt;
}

}  // namespace kft_tools
