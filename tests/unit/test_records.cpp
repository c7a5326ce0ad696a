// SPDX-License-Identifier: Apache-2.0
// kft/ddp/records.hpp: streamed records from token files. Every record seen exactly once per
// epoch across 1, 2, 3, 4 and 7 ranks (with and without shuffle, u8/u16/u32 tokens), resumes in
// the middle of an epoch on the same and on another number of ranks, the documented order, the
// ragged end, bad input, and the cross-rank check with ranks as threads over shared memory.
#define BOOST_TEST_MODULE kft_records
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include <kft/ddp/checkpoint.hpp>
#include <kft/ddp/records.hpp>
#include <kft/ddp/sampler.hpp>

#include "../common/shm_ranks.hpp"

namespace ddp = kft::ddp;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t L = 7;  // tokens per record

// A fresh directory, removed at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() / ("kft-records-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

// Token j of record `id`: the id's bytes in the first 4 / width tokens, then a pattern.
std::uint32_t token_of(std::uint64_t id, std::uint64_t j, ddp::token_type t) {
  const unsigned bits = 8 * static_cast<unsigned>(t);
  const std::uint64_t mask = bits == 32 ? 0xFFFFFFFFull : (1ull << bits) - 1;
  const std::uint64_t id_tokens = 4 / static_cast<unsigned>(t);
  if (j < id_tokens) return static_cast<std::uint32_t>((id >> (bits * j)) & mask);
  return static_cast<std::uint32_t>((id * 7919 + j * 31 + 5) & mask);
}

// Writes `records` records numbered from `first` (little-endian, `t` tokens).
void write_records(const fs::path& p, std::uint64_t first, std::uint64_t records, ddp::token_type t,
                   std::uint64_t extra_bytes = 0) {
  std::ofstream out(p, std::ios::binary);
  const auto w = static_cast<std::size_t>(t);
  for (std::uint64_t id = first; id < first + records; ++id)
    for (std::uint64_t j = 0; j < L; ++j) {
      const std::uint32_t v = token_of(id, j, t);
      char b[4];
      for (std::size_t k = 0; k < 4; ++k) b[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
      out.write(b, static_cast<std::streamsize>(w));
    }
  for (std::uint64_t i = 0; i < extra_bytes; ++i) out.put('x');
}

// The data set of most tests: 5 files of 5, 0, 13, 1 and 8 records (27; a file without records).
const std::vector<std::uint64_t> sizes = {5, 0, 13, 1, 8};
constexpr std::uint64_t total = 27;

std::vector<fs::path> write_set(const temp_dir& d, ddp::token_type t, const std::vector<std::uint64_t>& counts = sizes) {
  std::vector<fs::path> files;
  std::uint64_t first = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    files.push_back(d / ("part-" + std::to_string(i) + ".tok"));
    write_records(files.back(), first, counts[i], t);
    first += counts[i];
  }
  return files;
}

ddp::record_options opts(std::vector<fs::path> files, ddp::token_type t, bool shuffle, std::uint64_t seed = 11) {
  return {.files = std::move(files), .token = t, .record_tokens = L, .seed = seed, .shuffle = shuffle};
}

std::vector<ddp::record_source> ranks_of(const ddp::record_options& o, int world) {
  std::vector<ddp::record_source> v;
  for (int r = 0; r < world; ++r) v.emplace_back(o);
  return v;
}

// What an epoch (or part of one) looked like across the ranks.
struct seen {
  std::vector<int> count;               // per record id, real rows only
  std::vector<std::int64_t> at;         // epoch position -> record id (-1: not seen)
  std::uint64_t padding = 0, rows = 0;  // padding rows, all rows
  std::uint64_t bad_rows = 0;           // rows whose tokens are not their id's
  explicit seen(std::uint64_t n) : count(n, 0), at(n, -1) {}
};

// Runs up to `max_batches` global batches of `batch` records on the ranks in lockstep (each rank
// its own source: its own descriptors and reads). Returns the batches run.
std::uint64_t consume(std::vector<ddp::record_source>& ranks, std::uint64_t batch, seen& s,
                      std::uint64_t max_batches = ~0ull) {
  const int world = static_cast<int>(ranks.size());
  const ddp::token_type t = ranks[0].options().token;
  ddp::record_batch mine;
  std::uint64_t done = 0;
  for (; done < max_batches; ++done) {
    auto b = ranks[0].next(batch);
    for (auto& r : ranks) BOOST_REQUIRE(r.next(batch).has_value() == b.has_value());
    if (!b) break;
    for (int r = 0; r < world; ++r) {
      ranks[static_cast<std::size_t>(r)].read(*b, r, world, mine);
      BOOST_REQUIRE_EQUAL(mine.rows, (b->size + static_cast<std::uint64_t>(world) - 1) / static_cast<std::uint64_t>(world));
      for (std::size_t k = 0; k < mine.rows; ++k) {
        const std::uint32_t id = mine.ids[k];
        auto row = mine.row(k);
        for (std::uint64_t j = 0; j < L; ++j)
          if (row[j] != token_of(id, j, t)) {
            ++s.bad_rows;
            break;
          }
        ++s.rows;
        if (mine.padding[k]) {
          ++s.padding;
          continue;
        }
        ++s.count[id];
        const std::uint64_t pos = b->start + static_cast<std::uint64_t>(r) + k * static_cast<std::uint64_t>(world);
        s.at[pos] = id;
      }
    }
    for (auto& r : ranks) r.advance(*b);
  }
  return done;
}

bool each_once(const seen& s) {
  for (std::size_t i = 0; i < s.count.size(); ++i)
    if (s.count[i] != 1) {
      BOOST_TEST_MESSAGE("record " << i << " seen " << s.count[i] << " times");
      return false;
    }
  return s.bad_rows == 0;
}

std::vector<unsigned char> saved(const ddp::record_source& s) {
  ddp::checkpoint_writer w;
  s.save(w);
  return w.finish();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kft::error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return true;
  BOOST_TEST_MESSAGE("'" << part << "' not in: " << text);
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_record_once_per_epoch_on_1_2_3_4_7_ranks) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  for (bool shuffle : {false, true})
    for (int world : {1, 2, 3, 4, 7})
      for (std::uint64_t batch : {1ull, 6ull, 27ull, 100ull}) {
        auto ranks = ranks_of(opts(files, ddp::token_type::u16, shuffle), world);
        BOOST_TEST_CONTEXT("shuffle " << shuffle << ", " << world << " ranks, global batch " << batch) {
          BOOST_TEST(ranks[0].size() == total);
          for (std::uint64_t e = 0; e < 3; ++e) {
            for (auto& r : ranks) r.set_epoch(e);
            seen s(total);
            consume(ranks, batch, s);
            BOOST_TEST(each_once(s));
            // Padding only fills the shares of the epoch's ragged batches, to ceil(n / N) rows.
            const auto n = static_cast<std::uint64_t>(world);
            std::uint64_t rows = 0;
            for (std::uint64_t start = 0; start < total; start += batch)
              rows += (std::min(batch, total - start) + n - 1) / n * n;
            BOOST_TEST(s.rows == rows);
            BOOST_TEST(s.padding == rows - total);
            if (!shuffle)
              for (std::uint64_t p = 0; p < total; ++p) BOOST_TEST(s.at[p] == static_cast<std::int64_t>(p));
          }
        }
      }
}

BOOST_AUTO_TEST_CASE(u8_and_u32_tokens_and_few_descriptors) {
  for (auto t : {ddp::token_type::u8, ddp::token_type::u32}) {
    temp_dir d;
    const auto files = write_set(d, t);
    auto o = opts(files, t, true);
    o.max_open_files = 1;  // every change of file closes the last one
    auto ranks = ranks_of(o, 3);
    for (std::uint64_t e = 0; e < 2; ++e) {
      for (auto& r : ranks) r.set_epoch(e);
      seen s(total);
      consume(ranks, 4, s);
      BOOST_TEST(each_once(s), ddp::to_string(t));
      for (auto& r : ranks) BOOST_TEST(r.open_files() <= 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(drop_last_drops_the_ragged_batch_only) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  for (int world : {1, 3, 4}) {
    auto o = opts(files, ddp::token_type::u16, true);
    o.drop_last = true;
    auto ranks = ranks_of(o, world);
    seen s(total);
    BOOST_TEST(consume(ranks, 6, s) == 4u);  // 27 = 4 x 6 + 3: the 3 dropped
    std::uint64_t once = 0, never = 0, more = 0;
    for (int c : s.count) ++(c == 0 ? never : c == 1 ? once : more);
    BOOST_TEST(once == 24u);
    BOOST_TEST(never == 3u);
    BOOST_TEST(more == 0u);
    const auto n = static_cast<std::uint64_t>(world);
    BOOST_TEST(s.padding == 4 * ((6 + n - 1) / n * n - 6));  // padding only where N does not divide 6
    BOOST_TEST(s.bad_rows == 0u);
  }
}

BOOST_AUTO_TEST_CASE(the_order_is_the_documented_permutation_on_any_world_size) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  std::vector<std::vector<std::int64_t>> by_epoch;
  for (std::uint64_t e = 0; e < 3; ++e) {
    const auto p = ddp::permutation(total, 11, e, true);  // sampler.hpp's rule, over record numbers
    std::vector<std::int64_t> expect(p.begin(), p.end());
    for (int world : {1, 2, 3, 4, 7}) {
      auto ranks = ranks_of(opts(files, ddp::token_type::u16, true), world);
      for (auto& r : ranks) r.set_epoch(e);
      seen s(total);
      consume(ranks, 5, s);
      BOOST_TEST((s.at == expect), "epoch " << e << " on " << world << " ranks");
    }
    by_epoch.push_back(expect);
  }
  BOOST_TEST((by_epoch[0] != by_epoch[1]));
  BOOST_TEST((by_epoch[1] != by_epoch[2]));
  auto other_seed = ranks_of(opts(files, ddp::token_type::u16, true, 12), 2);
  seen s(total);
  consume(other_seed, 5, s);
  BOOST_TEST((s.at != by_epoch[0]));
}

BOOST_AUTO_TEST_CASE(resume_in_the_middle_on_the_same_and_another_world_size) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  const auto o = opts(files, ddp::token_type::u16, true);
  struct move_case {
    int before, after;
    std::uint64_t batches;  // global batches of 4 before the checkpoint
  };
  for (auto c : {move_case{4, 4, 3}, move_case{4, 3, 2}, move_case{2, 5, 3}, move_case{3, 2, 1}, move_case{1, 7, 4},
                 move_case{7, 1, 5}, move_case{3, 4, 7}})
    BOOST_TEST_CONTEXT(c.before << " -> " << c.after << " ranks after " << c.batches << " batches") {
      auto first = ranks_of(o, c.before);
      for (auto& r : first) r.set_epoch(2);
      seen s(total);
      BOOST_TEST(consume(first, 4, s, c.batches) == c.batches);
      const auto bytes = saved(first[0]);
      for (auto& r : first) BOOST_TEST((saved(r) == bytes));  // every rank holds the same position

      auto second = ranks_of(o, c.after);
      ddp::checkpoint_reader reader(bytes, "test");
      for (auto& r : second) r.load(reader);
      BOOST_TEST(second[0].epoch() == 2u);
      BOOST_TEST(second[0].cursor() == std::min(total, 4 * c.batches));
      consume(second, 4, s);
      BOOST_TEST(each_once(s));  // before + after: every record exactly once
      const auto p = ddp::permutation(total, 11, 2, true);
      BOOST_TEST((s.at == std::vector<std::int64_t>(p.begin(), p.end())));  // the unbroken epoch's order
    }
}

BOOST_AUTO_TEST_CASE(resume_at_an_epochs_end_starts_the_next) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  const auto o = opts(files, ddp::token_type::u16, true);
  auto first = ranks_of(o, 2);
  seen s0(total);
  consume(first, 8, s0);
  BOOST_TEST(each_once(s0));
  auto second = ranks_of(o, 3);
  ddp::checkpoint_reader reader(saved(first[0]), "test");
  for (auto& r : second) r.load(reader);
  BOOST_TEST(!second[0].next(8).has_value());
  const std::uint64_t next_epoch = second[0].epoch() + 1;
  for (auto& r : second) r.set_epoch(next_epoch);
  seen s1(total);
  consume(second, 8, s1);
  BOOST_TEST(each_once(s1));
}

BOOST_AUTO_TEST_CASE(bad_input_is_named) {
  temp_dir d;
  const auto files = write_set(d, ddp::token_type::u16);
  const auto t = ddp::token_type::u16;

  auto missing = files;
  missing[2] = d / "nowhere.tok";
  auto e = error_of([&] { ddp::record_source s(opts(missing, t, true)); });
  BOOST_TEST(has(e, "records open"));
  BOOST_TEST(has(e, (d / "nowhere.tok").string()));
  BOOST_TEST(has(e, "No such file"));

  auto dir = files;
  dir[0] = d.path;
  e = error_of([&] { ddp::record_source s(opts(dir, t, true)); });
  BOOST_TEST(has(e, d.path.string() + "' is not a regular file"));

  write_records(d / "ragged.tok", 0, 3, t, 5);  // 3 records of 14 bytes and 5 more
  auto ragged = files;
  ragged.push_back(d / "ragged.tok");
  e = error_of([&] { ddp::record_source s(opts(ragged, t, true)); });
  BOOST_TEST(has(e, "ragged.tok' has 47 bytes, not a multiple of the record size 14 bytes (7 tokens x 2 bytes, u16): "
                    "5 bytes left over"));
  auto lenient = opts(ragged, t, true);
  lenient.drop_partial_record = true;
  BOOST_TEST(ddp::record_source(lenient).size() == total + 3);

  std::ofstream(d / "empty-a.tok").close();
  std::ofstream(d / "empty-b.tok").close();
  e = error_of([&] { ddp::record_source s(opts({d / "empty-a.tok", d / "empty-b.tok"}, t, true)); });
  BOOST_TEST(has(e, "the data set is empty: 2 file(s) without a whole record of 14 bytes"));
  e = error_of([&] { ddp::record_source s(opts({}, t, true)); });
  BOOST_TEST(has(e, "no files"));

  auto zero = opts(files, t, true);
  zero.record_tokens = 0;
  e = error_of([&] { ddp::record_source s(zero); });
  BOOST_TEST(has(e, "a record of 0 tokens"));

  if (::geteuid() != 0) {  // root reads any file: the permission case only means something for others
    fs::permissions(d / "part-0.tok", fs::perms::none);
    e = error_of([&] { ddp::record_source s(opts(files, t, true)); });
    BOOST_TEST(has(e, "cannot open '" + (d / "part-0.tok").string() + "': Permission denied"));
    fs::permissions(d / "part-0.tok", fs::perms::owner_all);
  }

  // A file that shrinks under the job: the read names it, the offset and the rank.
  ddp::record_source s(opts(files, t, false));
  fs::resize_file(files[4], 3 * 2 * L);  // 8 records -> 3
  ddp::record_batch mine;
  e = error_of([&] { s.read(ddp::global_batch{0, total}, 1, 3, mine); });
  BOOST_TEST(has(e, "rank 1/3 records read"));
  BOOST_TEST(has(e, "part-4.tok' at byte"));
  BOOST_TEST(has(e, "it had 112 when opened"));
  BOOST_TEST(has(error_of([&] { s.read(ddp::global_batch{0, 4}, 3, 3, mine); }), "rank 3 of 3"));
}

BOOST_AUTO_TEST_CASE(a_checkpoint_of_another_source_is_refused) {
  temp_dir d;
  const auto t = ddp::token_type::u16;
  const auto files = write_set(d, t);
  ddp::record_source here(opts(files, t, true));
  here.set_epoch(1);
  here.advance(*here.next(10));
  const auto bytes = saved(here);
  auto load_into = [&](const ddp::record_options& o) {
    return error_of([&] {
      ddp::record_source s(o);
      s.load(ddp::checkpoint_reader(bytes, "ckpt-000000000007.kft"));
    });
  };
  BOOST_TEST(load_into(opts(files, t, true)) == "(no error)");

  temp_dir other;
  auto longer = sizes;
  longer[2] = 14;
  auto e = load_into(opts(write_set(other, t, longer), t, true));
  BOOST_TEST(has(e, "records load: records: checkpoint ckpt-000000000007.kft: it was written for another record source: "
                    "file 2 of 5: 'part-2.tok' (182 bytes) on the checkpoint, 'part-2.tok' (196 bytes) on this source"));
  e = load_into(opts({files[0], files[1], files[2]}, t, true));
  BOOST_TEST(has(e, "the number of files: 5 on the checkpoint, 3 on this source (the first one only on the checkpoint: "
                    "'part-3.tok' (14 bytes))"));
  temp_dir wide;
  e = load_into(opts(write_set(wide, ddp::token_type::u32), ddp::token_type::u32, true));
  BOOST_TEST(has(e, "the token type: u16 on the checkpoint, u32 on this source"));
  e = load_into(opts(files, t, true, 12));
  BOOST_TEST(has(e, "the seed: 11 on the checkpoint, 12 on this source"));
  e = load_into(opts(files, t, false));
  BOOST_TEST(has(e, "shuffle: on on the checkpoint, off on this source"));
  auto drop = opts(files, t, true);
  drop.drop_last = true;  // drop_last changes only the epoch's end: the position still holds
  BOOST_TEST(load_into(drop) == "(no error)");
  // The data set moved to another directory: the names are the files' own, the position holds.
  temp_dir moved;
  BOOST_TEST(load_into(opts(write_set(moved, t), t, true)) == "(no error)");
}

BOOST_AUTO_TEST_CASE(ranks_as_threads_read_every_record_once_and_agree) {
  temp_dir d;
  const auto t = ddp::token_type::u16;
  const auto files = write_set(d, t);
  std::vector<std::atomic<int>> counts(total);
  auto errors = kft_test::with_shm_ranks(
      3,
      [&](kft::group::process_group& g) {
        auto src = ddp::open_records(g, opts(files, t, true));
        ddp::record_batch mine;
        src.set_epoch(4);
        while (auto b = src.next(5)) {
          src.read(*b, g.rank(), g.size(), mine);
          for (std::size_t k = 0; k < mine.rows; ++k)
            if (!mine.padding[k]) ++counts[mine.ids[k]];
          src.advance(*b);
        }
        ddp::verify_same_source(g, src);
      },
      {.pool = 1u << 20, .timeout = 20s});
  BOOST_TEST(kft_test::first_error(errors) == "");
  for (auto& c : counts) BOOST_TEST(c.load() == 1);
}

BOOST_AUTO_TEST_CASE(a_rank_with_other_files_is_named_on_every_rank) {
  temp_dir d, elsewhere;
  const auto t = ddp::token_type::u16;
  const auto files = write_set(d, t);
  auto longer = sizes;
  longer[3] = 2;
  const auto other_sizes = write_set(elsewhere, t, longer);
  struct variant {
    std::string what;
    std::function<ddp::record_options(int)> options_of;  // rank -> its options
    std::string expect;
  };
  const std::vector<variant> cases = {
      {"a file fewer on rank 2",
       [&](int r) { return opts(r == 2 ? std::vector<fs::path>(files.begin(), files.end() - 1) : files, t, true); },
       "the record source of rank(s) 2 differs from rank 0's (a rank would run dry or read other records): the number "
       "of files: 5 on rank 0, 4 on rank 2 (the first one only on rank 0: 'part-4.tok' (112 bytes))"},
      {"a longer file on ranks 1 and 3", [&](int r) { return opts(r % 2 ? other_sizes : files, t, true); },
       "rank(s) 1, 3 differs from rank 0's (a rank would run dry or read other records): file 3 of 5: 'part-3.tok' (14 "
       "bytes) on rank 0, 'part-3.tok' (28 bytes) on rank 1"},
      {"another seed on rank 1", [&](int r) { return opts(files, t, true, r == 1 ? 99 : 11); },
       "the seed: 11 on rank 0, 99 on rank 1"},
      {"drop_last on rank 3",
       [&](int r) {
         auto o = opts(files, t, true);
         o.drop_last = r == 3;
         return o;
       },
       "drop_last: off on rank 0, on on rank 3"},
      {"a missing file on rank 2",
       [&](int r) {
         auto f = files;
         if (r == 2) f[1] = d / "gone.tok";
         return opts(f, t, true);
       },
       "records: rank 2 could not open its record source: records: cannot open '" + (d / "gone.tok").string() +
           "': No such file or directory"},
  };
  for (const auto& c : cases) {
    auto errors = kft_test::with_shm_ranks(
        4, [&](kft::group::process_group& g) { auto src = ddp::open_records(g, c.options_of(g.rank())); },
        {.pool = 1u << 20, .timeout = 20s});
    for (int r = 0; r < 4; ++r) {
      const auto& e = errors[static_cast<std::size_t>(r)];
      BOOST_TEST(has(e, "kft: rank " + std::to_string(r) + "/4 records verify: "), c.what);
      BOOST_TEST(has(e, c.expect), c.what);
    }
  }
  // verify_same_source on sources already open: the same check.
  auto errors = kft_test::with_shm_ranks(
      2,
      [&](kft::group::process_group& g) {
        ddp::record_source src(opts(files, t, true, g.rank() == 0 ? 11 : 12));
        ddp::verify_same_source(g, src);
      },
      {.pool = 1u << 20, .timeout = 20s});
  BOOST_TEST(has(errors[0], "the seed: 11 on rank 0, 12 on rank 1"));
  BOOST_TEST(has(errors[1], "the seed: 11 on rank 0, 12 on rank 1"));
}
