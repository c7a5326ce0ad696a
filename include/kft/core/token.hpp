/// @file kft/core/token.hpp
/// @brief Unpredictable job tokens (128 random bits, as 32 hex digits).
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <kft/core/error.hpp>

KFT_NAMESPACE_BEGIN

/// @brief 128 bits from the kernel's CSPRNG (getrandom), as lowercase hex.
/// @throws transport_error when the kernel cannot supply random bytes
inline std::string random_token() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw transport_error(std::string("getrandom failed: ") + std::strerror(errno), error_site::of("token"), errno);
    got += static_cast<std::size_t>(n);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

KFT_NAMESPACE_END
