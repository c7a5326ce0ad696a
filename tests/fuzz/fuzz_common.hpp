// SPDX-License-Identifier: Apache-2.0
// What every kft fuzz target shares: the rule that kft fails only with its own exceptions, and
// a loud abort (which libFuzzer records as a crash, with the input) when something else happens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <streambuf>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <kft/core/error.hpp>

namespace kft_fuzz {

inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Reports a broken expectation and aborts: libFuzzer saves the input as crash-<sha1>.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "kft fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) fail("invariant broken: " + what);
}

/// Runs `f`; a kft exception of type `Allowed` (the documented failure) is fine, anything else
/// thrown (std::out_of_range from stoi, a library's own exception, another kft error) is a finding.
/// Returns true when `f` returned normally.
template <class Allowed = kft::error, class F>
bool expect_only(const char* what, F&& f) {
  try {
    f();
    return true;
  } catch (const Allowed&) {
    return false;
  } catch (const kft::error& e) {
    fail(std::string(what) + " threw kft error " + typeid(e).name() + " where only " + typeid(Allowed).name() +
         " is documented: " + e.what());
  } catch (const std::exception& e) {
    fail(std::string(what) + " threw " + typeid(e).name() + " (not a kft::error): " + e.what());
  } catch (...) {
    fail(std::string(what) + " threw something that is not a std::exception");
  }
}

/// Runs `f`, which must not throw at all.
template <class F>
void expect_no_throw(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail(std::string(what) + " threw " + typeid(e).name() + ": " + e.what());
  } catch (...) {
    fail(std::string(what) + " threw something that is not a std::exception");
  }
}

/// Runs `f` with std::cout going nowhere (without failing: the tools check the stream) and
/// standard error captured: std::cerr and C's stderr (where kft::log writes the tools' lines);
/// returns what `f` wrote there. `f` must not throw (see expect_no_throw).
template <class F>
std::string quietly(F&& f) {
  class null_buffer final : public std::streambuf {
   protected:
    int overflow(int c) override { return traits_type::not_eof(c); }
    std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
  };
  static null_buffer nowhere;
  std::ostringstream captured;
  char* c_text = nullptr;
  std::size_t c_size = 0;
  std::FILE* c_err = ::open_memstream(&c_text, &c_size);  // glibc: stderr is assignable
  std::FILE* const old_c_err = stderr;
  if (c_err != nullptr) stderr = c_err;
  auto* old_out = std::cout.rdbuf(&nowhere);
  auto* old_err = std::cerr.rdbuf(captured.rdbuf());
  f();
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  stderr = old_c_err;
  if (c_err != nullptr) {
    std::fclose(c_err);
    captured << std::string_view(c_text, c_size);
    std::free(c_text);
  }
  return captured.str();
}

/// Splits on '\n', dropping one trailing '\r' per line (so seeds edited on any system work).
inline std::vector<std::string_view> lines(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const auto nl = s.find('\n');
    auto line = s.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.push_back(line);
    if (nl == std::string_view::npos) break;
    s.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace kft_fuzz
