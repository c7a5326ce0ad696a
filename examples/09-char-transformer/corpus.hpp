// SPDX-License-Identifier: Apache-2.0
// corpus.hpp: the text a char_gpt learns, read from files, as token ids over a compact
// vocabulary (the distinct bytes seen, sorted), split into training and validation.
//
// A path is a file or a directory; a directory stands for its regular files whose names do not
// end in .dat or .u8 (the index and UTF-8 copies beside the fortune files of Debian's `fortunes`
// package, /usr/share/games/fortunes), in name order. The files' bytes are concatenated in the
// order given; the last `valid_fraction` of them (10% by default) is the validation text.
// A missing path, an empty file or a directory without text files is an error naming it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace chargpt {

/// The bytes a corpus uses, numbered in byte order: id i is bytes[i].
struct vocabulary {
  std::vector<std::uint8_t> bytes;
  std::array<std::int16_t, 256> ids{};  ///< byte -> id, -1 when the byte is not in the vocabulary

  /// The vocabulary of the bytes in `text`.
  static vocabulary of(std::span<const std::uint8_t> text) {
    std::array<bool, 256> seen{};
    for (const std::uint8_t b : text) seen[b] = true;
    vocabulary v;
    v.ids.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        v.ids[static_cast<std::size_t>(b)] = static_cast<std::int16_t>(v.bytes.size());
        v.bytes.push_back(static_cast<std::uint8_t>(b));
      }
    return v;
  }
  int size() const noexcept { return static_cast<int>(bytes.size()); }

  std::vector<std::uint8_t> encode(std::span<const std::uint8_t> text) const {
    std::vector<std::uint8_t> out(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const int id = ids[text[i]];
      if (id < 0) throw std::invalid_argument("vocabulary: byte " + std::to_string(text[i]) + " is not in it");
      out[i] = static_cast<std::uint8_t>(id);
    }
    return out;
  }
  std::vector<std::uint8_t> encode(std::string_view text) const {
    return encode(std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  }
  std::string decode(std::span<const std::uint8_t> tokens) const {
    std::string s(tokens.size(), '\0');
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= bytes.size())
        throw std::invalid_argument("vocabulary: token " + std::to_string(tokens[i]) + " of " + std::to_string(size()));
      s[i] = static_cast<char>(bytes[tokens[i]]);
    }
    return s;
  }
};

/// Token ids for training and validation, the vocabulary and the files they came from.
struct corpus {
  std::vector<std::filesystem::path> files;
  vocabulary vocab;
  std::vector<std::uint8_t> train, valid;
  std::size_t bytes() const noexcept { return train.size() + valid.size(); }
};

/// The text files `path` stands for: itself, or a directory's regular files not ending .dat/.u8, by name.
inline std::vector<std::filesystem::path> text_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) throw std::runtime_error("corpus: " + path.string() + ": no such file or directory");
  if (!fs::is_directory(st)) return {path};
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8") out.push_back(e.path());
  }
  if (out.empty())
    throw std::runtime_error("corpus: " + path.string() +
                             ": a directory without text files (its regular files not ending .dat or .u8 are read)");
  std::sort(out.begin(), out.end());
  return out;
}

/// A corpus of `text`: its vocabulary, the last `valid_fraction` of it for validation.
inline corpus corpus_of(std::span<const std::uint8_t> text, double valid_fraction = 0.1) {
  if (!(valid_fraction >= 0.0 && valid_fraction < 1.0))
    throw std::invalid_argument("corpus: validation fraction " + std::to_string(valid_fraction) + ": 0 <= f < 1");
  corpus c;
  c.vocab = vocabulary::of(text);
  auto ids = c.vocab.encode(text);
  const auto valid = static_cast<std::size_t>(static_cast<double>(ids.size()) * valid_fraction);
  c.valid.assign(ids.end() - static_cast<std::ptrdiff_t>(valid), ids.end());
  ids.resize(ids.size() - valid);
  c.train = std::move(ids);
  return c;
}

/// Reads the files `paths` stand for (see text_files), in order.
inline corpus read_corpus(const std::vector<std::filesystem::path>& paths, double valid_fraction = 0.1) {
  std::vector<std::filesystem::path> files;
  for (const auto& p : paths)
    for (auto& f : text_files(p)) files.push_back(std::move(f));
  if (files.empty()) throw std::runtime_error("corpus: no files given");
  std::vector<std::uint8_t> text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("corpus: " + f.string() + ": cannot open");
    const std::size_t before = text.size();
    text.insert(text.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error("corpus: " + f.string() + ": read error");
    if (text.size() == before) throw std::runtime_error("corpus: " + f.string() + ": empty");
  }
  corpus c = corpus_of(text, valid_fraction);
  c.files = std::move(files);
  return c;
}
inline corpus read_corpus(const std::filesystem::path& path, double valid_fraction = 0.1) {
  return read_corpus(std::vector<std::filesystem::path>{path}, valid_fraction);
}

}  // namespace chargpt
