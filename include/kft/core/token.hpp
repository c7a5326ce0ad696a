// SPDX-License-Identifier: Apache-2.0
/// @file kft/core/token.hpp
/// @brief Unpredictable job tokens (128 random bits, as 32 hex digits).
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <kft/core/error.hpp>
#include <kft/core/hex.hpp>

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
  return detail::to_hex(bytes, sizeof bytes);
}

KFT_NAMESPACE_END
