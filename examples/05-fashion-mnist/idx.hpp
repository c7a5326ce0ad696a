// SPDX-License-Identifier: Apache-2.0
// idx.hpp: the IDX file format of (Fashion-)MNIST, read from plain or gzip-compressed files.
//
// An IDX file is a 4-byte magic (0, 0, element type, number of dimensions), one big-endian
// u32 per dimension, then the elements in row-major order. Only unsigned bytes (type 0x08) are
// needed here. `parse_idx` checks every field against the file's length and names the file in
// its errors; `load_idx` decompresses with zlib (which reads plain files too).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
  std::size_t count() const { return dims.empty() ? 0 : dims[0]; }
  std::size_t row() const {  // elements per item
    std::size_t n = 1;
    for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
    return n;
  }
};

inline idx_array parse_idx(const std::vector<std::uint8_t>& b, const std::string& what) {
  auto fail = [&](const std::string& why) { throw std::runtime_error(what + ": not an IDX file of bytes: " + why); };
  if (b.size() < 4) fail("shorter than its 4-byte header");
  if (b[0] != 0 || b[1] != 0) fail("the magic does not start with two zero bytes");
  if (b[2] != 0x08) fail("element type 0x" + std::to_string(b[2]) + " (only 0x08, unsigned byte, is read)");
  const std::size_t nd = b[3];
  if (nd == 0 || nd > 4) fail(std::to_string(nd) + " dimensions");
  if (b.size() < 4 + 4 * nd) fail("the dimension sizes are cut off");
  idx_array a;
  std::size_t total = 1;
  for (std::size_t d = 0; d < nd; ++d) {
    const std::size_t o = 4 + 4 * d;
    const std::uint32_t v = (std::uint32_t{b[o]} << 24) | (std::uint32_t{b[o + 1]} << 16) |
                            (std::uint32_t{b[o + 2]} << 8) | std::uint32_t{b[o + 3]};
    a.dims.push_back(v);
    total *= v;
  }
  const std::size_t have = b.size() - 4 - 4 * nd;
  if (have != total)
    fail("the header promises " + std::to_string(total) + " bytes of data, the file has " + std::to_string(have));
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(4 + 4 * nd), b.end());
  return a;
}

inline std::vector<std::uint8_t> read_gz(const std::filesystem::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const std::string why = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error(p.string() + ": " + why);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}

inline idx_array load_idx(const std::filesystem::path& p) { return parse_idx(read_gz(p), p.string()); }

/// Images (n x 784 bytes) and labels (n) of one split.
struct dataset {
  std::size_t n = 0, dim = 0;
  std::vector<std::uint8_t> images, labels;
};

/// `split` is "train" or "t10k". Names the Debian package when the files are missing.
inline dataset load_split(const std::filesystem::path& dir, const std::string& split) {
  const auto img = dir / (split + "-images-idx3-ubyte.gz"), lab = dir / (split + "-labels-idx1-ubyte.gz");
  for (const auto& p : {img, lab})
    if (!std::filesystem::exists(p))
      throw std::runtime_error(p.string() + " does not exist: install Debian's Fashion-MNIST "
                               "(apt-get install dataset-fashion-mnist) or point --data at a directory holding "
                               "the four *-ubyte.gz files");
  idx_array x = load_idx(img), y = load_idx(lab);
  if (x.dims.size() != 3) throw std::runtime_error(img.string() + ": images need 3 dimensions");
  if (y.dims.size() != 1) throw std::runtime_error(lab.string() + ": labels need 1 dimension");
  if (x.count() != y.count())
    throw std::runtime_error(img.string() + " has " + std::to_string(x.count()) + " images but " + lab.string() +
                             " has " + std::to_string(y.count()) + " labels");
  for (auto l : y.data)
    if (l > 9) throw std::runtime_error(lab.string() + ": label " + std::to_string(l) + " is not a class 0..9");
  dataset d;
  d.n = x.count();
  d.dim = x.row();
  d.images = std::move(x.data);
  d.labels = std::move(y.data);
  return d;
}

}  // namespace fmnist
