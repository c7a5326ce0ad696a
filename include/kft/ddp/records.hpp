// SPDX-License-Identifier: Apache-2.0
/// @file kft/ddp/records.hpp
/// @brief Streamed data: fixed-size records read from files (token ids cut into a language
/// model's windows, say), each rank reading only its own share from disk, in an order that does
/// not depend on the number of ranks, with a position that is part of a checkpoint.
///
///     kft::ddp::record_source src = kft::ddp::open_records(group, {.files = {"a.tok", "b.tok"},
///         .token = kft::ddp::token_type::u16, .record_tokens = 1025, .seed = 1});  // collective
///     kft::ddp::record_batch mine;
///     src.set_epoch(e);
///     while (auto b = src.next(global_batch)) {
///       src.read(*b, group.rank(), group.size(), mine);   // mine.rows records of 1025 tokens
///       ...                                               // leave rows with mine.padding[i] out
///       src.advance(*b);
///     }
///     src.save(writer);   /   src.load(reader);           // checkpoint.hpp's sections
///
/// **The records.** Each file holds little-endian tokens of one `token_type` (u8, u16 or u32);
/// a record is `record_tokens` consecutive tokens (`record_tokens` x the token's bytes). The
/// records are numbered across the files in the order given: file 0's first, then file 1's, ...
/// A file whose size is not a multiple of the record size is an error naming it, unless
/// `drop_partial_record` (its last, partial record is then never read).
///
/// **The epoch's order** is sampler.hpp's, over the record numbers: `permutation(records, seed,
/// epoch, shuffle)` (a splitmix64-driven Fisher-Yates over all records; 0..records-1 without
/// `shuffle`). It depends on (seed, epoch, the files' list and sizes, the record size) only,
/// never on the number of ranks, so a saved position resumes exactly on any world size.
///
/// **Global batches and the ragged end** are distributed_sampler's: consecutive positions of the
/// order, the cursor counts positions consumed; in a global batch of n positions rank r of N
/// takes positions r, r + N, ...; when N does not divide n (the epoch's last, shorter batch, or
/// N > n) the shares are padded to ceil(n / N) rows by wrapping to the start of the epoch's
/// order, and those rows are flagged in `record_batch::padding`: they hold a real record's
/// tokens (so every rank runs the same shapes) but count for nothing. Leaving the flagged rows
/// out, every record is seen exactly once per epoch across the ranks. With `drop_last` the
/// epoch's last, shorter batch is dropped instead (those records are not seen that epoch).
///
/// **Memory**: the epoch's order, 4 bytes a record (at most 2^32 - 1 records; rebuilt once per
/// epoch, O(records)); a table of the files (their names and sizes); this rank's batch, rows x
/// `record_tokens` x 4 bytes (tokens widened to u32) plus, for u8 and u16 files, the rows' raw
/// bytes; at most `max_open_files` descriptors. The files are read with pread, one call per run
/// of adjacent records; nothing else of the dataset is held.
///
/// **A checkpoint** holds three sections (`<prefix>.fingerprint`, `<prefix>.epoch`,
/// `<prefix>.cursor`, prefix "records" by default). The fingerprint is the files' names (the
/// last component only, so the data set may move) and sizes in order, the token type, the
/// record length, the seed and `shuffle`; `load` refuses another source's checkpoint naming the
/// first difference.
///
/// **Across ranks** `open_records` and `verify_same_source` (collective, before training)
/// compare every rank's fingerprint (`drop_last` included) with rank 0's: a rank whose files
/// differ (so it would run dry, or read other data) or that could not open its files is an
/// error on every rank naming it and what differs, instead of a hang in the middle of an epoch.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kft/core/dtype.hpp>
#include <kft/core/error.hpp>
#include <kft/core/namespace.hpp>
#include <kft/core/options.hpp>
#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/model.hpp>
#include <kft/ddp/sampler.hpp>

KFT_NAMESPACE_BEGIN
namespace ddp {

/// @brief The type of the tokens in a record file (little-endian); the value is its bytes.
enum class token_type : std::uint8_t { u8 = 1, u16 = 2, u32 = 4 };

/// @brief "u8", "u16", "u32".
inline std::string to_string(token_type t) {
  switch (t) {
    case token_type::u8: return "u8";
    case token_type::u16: return "u16";
    case token_type::u32: return "u32";
  }
  return "token type " + std::to_string(static_cast<int>(t));
}

struct record_options {
  std::vector<std::filesystem::path> files;  ///< one data set, numbered in this order
  token_type token = token_type::u16;
  std::uint64_t record_tokens = 0;  ///< tokens per record (a language model's window, plus one)
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;            ///< drop the epoch's last, shorter global batch
  bool drop_partial_record = false;  ///< ignore a file's last, partial record instead of refusing the file
  std::size_t max_open_files = 64;   ///< descriptors kept open (least recently used closed first)
};

/// @brief What must agree between ranks, and between a checkpoint and the source resuming it.
struct record_fingerprint {
  struct file {
    std::string name;  ///< the last component of the path
    std::uint64_t bytes = 0;
    bool operator==(const file&) const = default;
  };
  token_type token = token_type::u16;
  std::uint64_t record_tokens = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  std::vector<file> files;
  bool operator==(const record_fingerprint&) const = default;

  /// @brief Bytes for a checkpoint section or an exchange between ranks.
  std::string encode() const {
    std::string s = "KFTREC01";
    auto u64 = [&s](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
    };
    s += static_cast<char>(token);
    s += static_cast<char>(shuffle ? 1 : 0);
    s += static_cast<char>(drop_last ? 1 : 0);
    u64(record_tokens);
    u64(seed);
    u64(files.size());
    for (const auto& f : files) {
      u64(f.bytes);
      u64(f.name.size());
      s += f.name;
    }
    return s;
  }
  /// @brief The inverse of encode(); none when `bytes` is not one.
  static std::optional<record_fingerprint> decode(std::string_view bytes) {
    std::size_t at = 0;
    auto take = [&](std::size_t n) -> std::optional<std::string_view> {
      if (n > bytes.size() - at) return std::nullopt;
      auto v = bytes.substr(at, n);
      at += n;
      return v;
    };
    auto u64 = [&]() -> std::optional<std::uint64_t> {
      auto v = take(8);
      if (!v) return std::nullopt;
      std::uint64_t x = 0;
      for (int i = 7; i >= 0; --i) x = (x << 8) | static_cast<unsigned char>((*v)[static_cast<std::size_t>(i)]);
      return x;
    };
    auto magic = take(8);
    auto flags = take(3);
    if (!magic || *magic != "KFTREC01" || !flags) return std::nullopt;
    record_fingerprint f;
    const auto t = static_cast<unsigned char>((*flags)[0]);
    if (t != 1 && t != 2 && t != 4) return std::nullopt;
    f.token = static_cast<token_type>(t);
    f.shuffle = (*flags)[1] != 0;
    f.drop_last = (*flags)[2] != 0;
    auto l = u64(), seed = u64(), n = u64();
    if (!l || !seed || !n || *n > bytes.size()) return std::nullopt;
    f.record_tokens = *l;
    f.seed = *seed;
    for (std::uint64_t i = 0; i < *n; ++i) {
      auto size = u64(), len = u64();
      if (!size || !len) return std::nullopt;
      auto name = take(static_cast<std::size_t>(std::min<std::uint64_t>(*len, bytes.size() + 1)));
      if (!name) return std::nullopt;
      f.files.push_back({std::string(*name), *size});
    }
    if (at != bytes.size()) return std::nullopt;
    return f;
  }
};

/// @brief The first difference between fingerprints `a` (called `a_name`, e.g. "rank 0") and
/// `b` (`b_name`), in words; "" when they agree. `drop_last` is compared when `with_drop_last`.
inline std::string difference(const record_fingerprint& a, std::string_view a_name, const record_fingerprint& b,
                              std::string_view b_name, bool with_drop_last = true) {
  auto both = [&](const std::string& what, const std::string& x, const std::string& y) {
    return what + ": " + x + " on " + std::string(a_name) + ", " + y + " on " + std::string(b_name);
  };
  auto file = [](const record_fingerprint::file& f) {
    return "'" + kft::detail::excerpt(f.name) + "' (" + std::to_string(f.bytes) + " bytes)";
  };
  if (a.token != b.token) return both("the token type", to_string(a.token), to_string(b.token));
  if (a.record_tokens != b.record_tokens)
    return both("the record length", std::to_string(a.record_tokens) + " tokens", std::to_string(b.record_tokens) + " tokens");
  const std::size_t n = std::min(a.files.size(), b.files.size());
  for (std::size_t i = 0; i < n; ++i)
    if (a.files[i] != b.files[i])
      return both("file " + std::to_string(i) + " of " + std::to_string(a.files.size()), file(a.files[i]),
                  file(b.files[i]));
  if (a.files.size() != b.files.size()) {
    const bool a_more = a.files.size() > b.files.size();
    return both("the number of files", std::to_string(a.files.size()), std::to_string(b.files.size())) +
           " (the first one only on " + std::string(a_more ? a_name : b_name) + ": " +
           file(a_more ? a.files[n] : b.files[n]) + ")";
  }
  if (a.seed != b.seed) return both("the seed", std::to_string(a.seed), std::to_string(b.seed));
  if (a.shuffle != b.shuffle) return both("shuffle", a.shuffle ? "on" : "off", b.shuffle ? "on" : "off");
  if (with_drop_last && a.drop_last != b.drop_last)
    return both("drop_last", a.drop_last ? "on" : "off", b.drop_last ? "on" : "off");
  return {};
}

namespace detail {
// Descriptors of a record source's files, opened on first use and closed least recently used
// first; move-only, closes them all when destroyed.
class record_fds {
 public:
  explicit record_fds(std::size_t cap) : cap_(std::max<std::size_t>(cap, 1)) {}
  record_fds(record_fds&& o) noexcept : cap_(o.cap_), open_(std::move(o.open_)), tick_(o.tick_) { o.open_.clear(); }
  record_fds& operator=(record_fds&& o) noexcept {
    if (this != &o) {
      close_all();
      cap_ = o.cap_;
      open_ = std::move(o.open_);
      o.open_.clear();
      tick_ = o.tick_;
    }
    return *this;
  }
  record_fds(const record_fds&) = delete;
  record_fds& operator=(const record_fds&) = delete;
  ~record_fds() { close_all(); }

  /// The descriptor of file `index` at `path`, -1 with errno set when it cannot be opened.
  int get(std::size_t index, const std::filesystem::path& path) {
    for (auto& o : open_)
      if (o.index == index) {
        o.used = ++tick_;
        return o.fd;
      }
    if (open_.size() >= cap_) {
      auto lru = std::min_element(open_.begin(), open_.end(), [](const slot& a, const slot& b) { return a.used < b.used; });
      ::close(lru->fd);
      open_.erase(lru);
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) open_.push_back({index, fd, ++tick_});
    return fd;
  }
  std::size_t open_count() const noexcept { return open_.size(); }

 private:
  struct slot {
    std::size_t index;
    int fd;
    std::uint64_t used;
  };
  void close_all() noexcept {
    for (auto& o : open_) ::close(o.fd);
    open_.clear();
  }
  std::size_t cap_;
  std::vector<slot> open_;
  std::uint64_t tick_ = 0;
};
}  // namespace detail

/// @brief Fixed-size records from files, each rank reading its share (see the file comment).
class record_source {
 public:
  /// @throws usage_error naming the file and what is wrong with it (missing, not a regular file,
  /// unreadable, a size that is not whole records), or the setting at fault (no files, a record
  /// length of 0, an empty data set, more than 2^32 - 1 records)
  explicit record_source(record_options o)
      : o_(std::move(o)), fds_(o_.max_open_files), sampler_(sampler_options{count_records(), o_.seed, o_.shuffle, o_.drop_last}) {}

  const record_options& options() const noexcept { return o_; }
  /// @brief Records in the data set (the epoch's length).
  std::uint64_t size() const noexcept { return starts_.back(); }
  std::uint64_t epoch_length() const noexcept { return size(); }
  std::uint64_t record_bytes() const noexcept { return o_.record_tokens * static_cast<std::uint64_t>(o_.token); }
  std::uint64_t epoch() const noexcept { return sampler_.epoch(); }
  std::uint64_t cursor() const noexcept { return sampler_.cursor(); }
  /// @brief The position (seed, epoch, records consumed by all ranks together).
  const sampler_state& state() const noexcept { return sampler_.state(); }
  const record_fingerprint& fingerprint() const noexcept { return fp_; }
  /// @brief Descriptors open now (at most `max_open_files`).
  std::size_t open_files() const noexcept { return fds_.open_count(); }

  /// @brief Starts epoch `e` from its first record.
  void set_epoch(std::uint64_t e) { sampler_.set_epoch(e); }
  /// @brief Continues from a position (any number of ranks); see also load().
  void restore(const sampler_state& s) { sampler_.restore(s); }

  /// @brief The next global batch of up to `batch` records; none at the end of the epoch.
  std::optional<global_batch> next(std::uint64_t batch) const { return sampler_.next(batch); }
  std::uint64_t batches_left(std::uint64_t batch) const noexcept { return sampler_.batches_left(batch); }
  void advance(const global_batch& b) { sampler_.advance(b); }

  /// @brief Rank `rank` of `world`'s records of `b`, read from disk into `out` (its buffers are
  /// reused: no allocation once they have grown to the batch's size).
  /// @throws usage_error naming the file, the offset and the rank when a read fails or comes up short
  void read(const global_batch& b, int rank, int world, record_batch& out) {
    sampler_.rank_indices(b, rank, world, out.ids);  // checks rank and world
    const std::size_t rows = out.ids.size();
    out.padding.resize(rows);
    out.real = 0;
    for (std::size_t k = 0; k < rows; ++k) {
      const bool pad = static_cast<std::uint64_t>(rank) + k * static_cast<std::uint64_t>(world) >= b.size;
      out.padding[k] = pad ? 1 : 0;
      out.real += pad ? 0 : 1;
    }
    fill(out, rank, world);
  }

  /// @brief Micro-shard `j` of `shards` of `b` (the trainer's deterministic mode: positions
  /// [j n / shards, (j + 1) n / shards) of the batch, no padding; possibly empty), read from
  /// disk into `out`. `rank` and `world` only name the reader in errors.
  void read_shard(const global_batch& b, std::uint64_t j, std::uint64_t shards, record_batch& out, int rank = 0,
                  int world = 1) {
    sampler_.micro_shard(b, j, shards, out.ids);
    out.padding.assign(out.ids.size(), 0);
    out.real = out.ids.size();
    fill(out, rank, world);
  }

  /// @brief Writes the position and the fingerprint as sections `<prefix>.fingerprint`,
  /// `<prefix>.epoch` and `<prefix>.cursor`.
  void save(checkpoint_writer& w, std::string_view prefix = "records") const {
    const std::string p(prefix);
    w.put_string(p + ".fingerprint", fp_.encode());
    w.put_u64(p + ".epoch", sampler_.epoch());
    w.put_u64(p + ".cursor", sampler_.cursor());
  }
  /// @brief Continues from a checkpoint's position (on any number of ranks).
  /// @throws usage_error naming the checkpoint and the first difference when it was written for
  /// another source (files, sizes, token type, record length, seed or shuffle)
  void load(const checkpoint_reader& r, std::string_view prefix = "records") {
    const std::string p(prefix);
    auto fail = [&](const std::string& why) {
      throw usage_error("records: checkpoint " + r.what() + ": " + why, error_site::of("records load"));
    };
    auto theirs = record_fingerprint::decode(r.get_string(p + ".fingerprint"));
    if (!theirs) fail("section '" + p + ".fingerprint' is not a record source's fingerprint");
    const std::string diff = difference(*theirs, "the checkpoint", fp_, "this source", false);
    if (!diff.empty()) fail("it was written for another record source: " + diff);
    const std::uint64_t epoch = r.get_u64(p + ".epoch"), cursor = r.get_u64(p + ".cursor");
    if (cursor > size())
      fail("its cursor " + std::to_string(cursor) + " is past the " + std::to_string(size()) + " records");
    sampler_.restore(sampler_state{o_.seed, epoch, cursor});
  }

 private:
  // The records out.ids name, read into out.tokens (one pread per run of adjacent records).
  void fill(record_batch& out, int rank, int world) {
    const std::size_t rows = out.ids.size(), L = static_cast<std::size_t>(o_.record_tokens);
    const std::size_t rb = static_cast<std::size_t>(record_bytes());
    out.rows = rows;
    out.record_tokens = L;
    out.tokens.resize(rows * L);
    const bool wide = o_.token == token_type::u32;
    if (!wide) raw_.resize(rows * rb);
    auto* dst = wide ? reinterpret_cast<unsigned char*>(out.tokens.data()) : raw_.data();
    for (std::size_t i = 0; i < rows;) {
      const std::uint64_t id = out.ids[i];
      const std::size_t f = file_of(id);
      std::size_t j = i + 1;
      while (j < rows && out.ids[j] == out.ids[j - 1] + 1 && out.ids[j] < starts_[f + 1]) ++j;
      read_run(f, (id - starts_[f]) * rb, dst + i * rb, (j - i) * rb, rank, world);
      i = j;
    }
    if (o_.token == token_type::u8) {
      for (std::size_t k = 0; k < rows * L; ++k) out.tokens[k] = raw_[k];
    } else if (o_.token == token_type::u16) {
      for (std::size_t k = 0; k < rows * L; ++k) {
        std::uint16_t v;
        std::memcpy(&v, raw_.data() + 2 * k, 2);
        out.tokens[k] = v;
      }
    }
  }

  // Checks the options and the files, fills fp_ and starts_; returns the number of records.
  std::uint64_t count_records() {
    static_assert(std::endian::native == std::endian::little, "record files are little-endian");
    auto fail = [](const std::string& why) { throw usage_error("records: " + why, error_site::of("records open")); };
    const auto t = static_cast<unsigned>(o_.token);
    if (t != 1 && t != 2 && t != 4) fail("token type " + std::to_string(t) + " (u8, u16 or u32)");
    if (o_.record_tokens == 0) fail("a record of 0 tokens (record_options::record_tokens = 0)");
    if (o_.files.empty()) fail("no files (record_options::files is empty)");
    const std::uint64_t rb = record_bytes();
    fp_ = {o_.token, o_.record_tokens, o_.seed, o_.shuffle, o_.drop_last, {}};
    starts_.assign(1, 0);
    for (std::size_t i = 0; i < o_.files.size(); ++i) {
      const auto& path = o_.files[i];
      const std::string name = "'" + kft::detail::excerpt(path.string()) + "'";
      struct stat st{};
      if (::stat(path.c_str(), &st) != 0) fail("cannot open " + name + ": " + std::strerror(errno));
      if (!S_ISREG(st.st_mode)) fail(name + " is not a regular file");
      if (fds_.get(i, path) < 0) fail("cannot open " + name + ": " + std::strerror(errno));
      const auto bytes = static_cast<std::uint64_t>(st.st_size);
      if (bytes % rb != 0 && !o_.drop_partial_record)
        fail(name + " has " + std::to_string(bytes) + " bytes, not a multiple of the record size " +
             std::to_string(rb) + " bytes (" + std::to_string(o_.record_tokens) + " tokens x " + std::to_string(t) +
             " bytes, " + to_string(o_.token) + "): " + std::to_string(bytes % rb) +
             " bytes left over (drop_partial_record ignores them)");
      fp_.files.push_back({path.filename().string(), bytes});
      starts_.push_back(starts_.back() + bytes / rb);
    }
    if (starts_.back() == 0)
      fail("the data set is empty: " + std::to_string(o_.files.size()) + " file(s) without a whole record of " +
           std::to_string(rb) + " bytes");
    if (starts_.back() > 0xFFFFFFFFull)
      fail(std::to_string(starts_.back()) + " records: at most 2^32 - 1 (use longer records or fewer files)");
    return starts_.back();
  }

  std::size_t file_of(std::uint64_t id) const {
    return static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), id) - starts_.begin()) - 1;
  }

  void read_run(std::size_t f, std::uint64_t offset, unsigned char* dst, std::size_t bytes, int rank, int world) {
    auto fail = [&](const std::string& why) {
      throw usage_error("records: '" + kft::detail::excerpt(o_.files[f].string()) + "' at byte " + std::to_string(offset) +
                            " (" + std::to_string(bytes) + " bytes): " + why,
                        error_site::in({}, rank, world, "records read"));
    };
    const int fd = fds_.get(f, o_.files[f]);
    if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(std::strerror(errno));
      if (n == 0)
        fail("the file ends after " + std::to_string(offset + done) + " bytes; it had " +
             std::to_string(fp_.files[f].bytes) + " when opened (changed under the job?)");
      done += static_cast<std::size_t>(n);
    }
  }

  record_options o_;
  detail::record_fds fds_;
  record_fingerprint fp_;
  std::vector<std::uint64_t> starts_;  // file i's records are [starts_[i], starts_[i + 1])
  distributed_sampler sampler_;        // built last: from count_records()
  std::vector<unsigned char> raw_;     // u8 and u16 files: the rows' bytes before widening
};

namespace detail {
// Every rank's blob (a fingerprint, or "!" + why it could not open its source) agreed with rank
// 0's, or a mismatch_error on every rank naming the ranks that differ and the first difference.
// One allgather of a hash when all agree; two more (lengths, blobs) only when they do not.
template <class Group>
void check_record_blobs(Group& g, const std::string& mine, const kft::options& co) {
  const int n = g.size();
  const auto un = static_cast<std::size_t>(n);
  const error_site site = error_site::in({}, g.rank(), n, "records verify");
  std::int64_t h = static_cast<std::int64_t>(hash64(mine.data(), mine.size()));
  std::vector<std::int64_t> all(un);
  g.allgather(&h, all.data(), 1, dtype::i64, co);
  if (std::all_of(all.begin(), all.end(), [&](std::int64_t x) { return x == all[0]; })) return;
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  g.allgather(&len, all.data(), 1, dtype::i64, co);
  const auto width = static_cast<std::size_t>(*std::max_element(all.begin(), all.end()));
  std::string padded = mine;
  padded.resize(width);
  std::string blobs(width * un, '\0');
  g.allgather(padded.data(), blobs.data(), width, dtype::u8, co);
  auto blob = [&](int r) {
    return std::string_view(blobs).substr(static_cast<std::size_t>(r) * width, static_cast<std::size_t>(all[static_cast<std::size_t>(r)]));
  };
  for (int r = 0; r < n; ++r)
    if (!blob(r).empty() && blob(r)[0] == '!')
      throw mismatch_error("records: rank " + std::to_string(r) + " could not open its record source: " +
                               std::string(blob(r).substr(1)),
                           site);
  const auto zero = record_fingerprint::decode(blob(0));
  std::string differ, first;
  for (int r = 1; r < n; ++r) {
    if (blob(r) == blob(0)) continue;
    differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (first.empty()) {
      const auto other = record_fingerprint::decode(blob(r));
      first = zero && other ? difference(*zero, "rank 0", *other, "rank " + std::to_string(r))
                            : "rank " + std::to_string(r) + "'s fingerprint does not decode";
    }
  }
  throw mismatch_error("records: the record source of rank(s) " + differ + " differs from rank 0's (a rank would run " +
                           "dry or read other records): " + first,
                       site);
}
}  // namespace detail

/// @brief Collective: checks that every rank of `g` has the same record source (files, sizes,
/// token type, record length, seed, shuffle, drop_last) as rank 0.
/// @throws mismatch_error on every rank, naming the ranks that differ and the first difference
template <class Group>
void verify_same_source(Group& g, const record_source& s, const kft::options& co = {}) {
  detail::check_record_blobs(g, s.fingerprint().encode(), co);
}

/// @brief Collective: opens the record source on every rank of `g` and verifies it
/// (verify_same_source). A rank that cannot open its files makes every rank throw, naming it
/// and its reason, where the others would otherwise wait for it in the first collective.
/// On a group that joined a running job (`process_group::newcomer()`: a replacement under
/// kftrun's `--on-failure heal`) it opens the files alone, as the members are training: the
/// trainer compares them with the members' when the joiner's fit() starts.
template <class Group>
record_source open_records(Group& g, record_options o, const kft::options& co = {}) {
  if constexpr (requires(const Group& x) { x.newcomer(); })
    if (g.newcomer()) return record_source(std::move(o));
  std::optional<record_source> s;
  std::string blob;
  try {
    s.emplace(std::move(o));
    blob = s->fingerprint().encode();
  } catch (const error& e) {
    blob = "!" + e.detail();
  }
  detail::check_record_blobs(g, blob, co);  // throws unless every rank has rank 0's blob
  if (!s)  // every rank failed the same way
    throw usage_error("records: every rank failed to open its record source: " + blob.substr(1),
                      error_site::in({}, g.rank(), g.size(), "records open"));
  return std::move(*s);
}

}  // namespace ddp
KFT_NAMESPACE_END
