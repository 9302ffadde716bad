#pragma once
// A model of PyTorch's CUDA caching allocator (REFERENCE.md §6), so that "reserved"
// bytes are predicted by the same rules the real allocator follows:
//  - every request is rounded up to a multiple of 512 B;
//  - requests <= 1 MiB come from the small pool, carved from 2 MiB segments;
//  - larger requests < 10 MiB get a 20 MiB segment; >= 10 MiB are rounded up to 2 MiB;
//  - best fit within (pool, stream); a block is split when the remainder is >= 512 B
//    (small pool) or > 1 MiB (large pool), and large blocks are split only when smaller
//    than max_split_size;
//  - freed blocks stay cached and coalesce with free neighbours of the same segment;
//  - when a new segment would exceed the device capacity, unsplit cached segments are
//    released and the allocation retried; if it still does not fit, the request fails (OOM).
// Deterministic: same request sequence → same reserved bytes. The executor's allocator
// (exec/) uses this same class so measured reserved bytes follow the same rules.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "core/units.hpp"

namespace zp::sim {

struct CachingAllocatorOptions {
  Bytes capacity{INT64_MAX};         // device bytes the allocator may reserve
  Bytes max_split_size{INT64_MAX};   // PYTORCH_CUDA_ALLOC_CONF max_split_size_mb (unbounded default)
  friend bool operator==(const CachingAllocatorOptions&, const CachingAllocatorOptions&) = default;
};

class CachingAllocatorModel {
 public:
  using Handle = std::int64_t;       // opaque, returned by allocate

  explicit CachingAllocatorModel(CachingAllocatorOptions opt = {});

  // Returns a handle, or std::nullopt when the request cannot be satisfied (OOM)
  // even after releasing cached segments. `stream` separates pools like PyTorch does.
  std::optional<Handle> allocate(Bytes size, int stream = 0);
  void free(Handle h);

  Bytes allocated() const;           // sum of rounded sizes of live blocks
  Bytes reserved() const;            // sum of segment sizes held
  Bytes peak_allocated() const;
  Bytes peak_reserved() const;
  std::int64_t segments() const;
  std::int64_t num_oom_retries() const;  // times cached segments were released to satisfy a request

  static Bytes round_size(Bytes request);        // 512 B rounding
  static Bytes segment_size(Bytes rounded);      // 2 MiB / 20 MiB / round to 2 MiB

  // Additions beyond the agreed core API.
  std::int64_t num_ooms() const;         // requests that failed (returned nullopt)
  void empty_cache();                    // torch.cuda.empty_cache(): release cached whole segments
  Bytes block_size(Handle h) const;      // rounded (or unsplit) size held by a live handle

  // Two allocators in the same state serve the same request sequence identically; the
  // memory replay uses this to skip repeated micro-steps once the state is a fixed point.
  friend bool operator==(const CachingAllocatorModel&, const CachingAllocatorModel&) = default;

 private:
  // Plain value members: a copy is an independent allocator state.
  enum class Pool : std::uint8_t { small, large };

  // One block: a piece of a segment, allocated or cached. Blocks of a segment tile
  // it without gaps; neighbours are found through `blocks_` (ordered by address).
  struct Block {
    std::int64_t size = 0;
    std::int64_t segment_base = 0;   // address of the segment's first byte
    std::int64_t segment_size = 0;
    int stream = 0;
    Pool pool = Pool::large;
    bool allocated = false;
    bool whole_segment() const { return size == segment_size; }
    friend bool operator==(const Block&, const Block&) = default;
  };

  // A cached (free) block in best-fit order: stream, then size, then address.
  struct FreeKey {
    int stream = 0;
    std::int64_t size = 0;
    std::int64_t addr = 0;
    friend auto operator<=>(const FreeKey&, const FreeKey&) = default;
  };
  using FreeSet = std::set<FreeKey>;

  FreeSet& free_set(Pool p) { return p == Pool::small ? free_small_ : free_large_; }
  void insert_free(std::int64_t addr, const Block& b);
  void erase_free(std::int64_t addr, const Block& b);
  std::optional<std::int64_t> find_free_block(Pool pool, int stream, std::int64_t size);
  std::optional<std::int64_t> create_segment(Pool pool, int stream, std::int64_t seg_size);
  bool release_oversize_blocks(Pool pool, int stream, std::int64_t size);
  void release_all_cached();
  void release_segment(std::int64_t addr);
  std::int64_t take_block(std::int64_t addr, std::int64_t size);

  CachingAllocatorOptions opt_;
  std::map<std::int64_t, Block> blocks_;   // every block, by address (the handle)
  FreeSet free_small_;                      // cached blocks <= 1 MiB pool
  FreeSet free_large_;                      // cached blocks of the large pool
  std::int64_t next_segment_addr_ = std::int64_t{1} << 62;  // simulated addresses, growing down
  std::int64_t allocated_ = 0;
  std::int64_t reserved_ = 0;
  std::int64_t peak_allocated_ = 0;
  std::int64_t peak_reserved_ = 0;
  std::int64_t segments_ = 0;
  std::int64_t retries_ = 0;
  std::int64_t ooms_ = 0;
};

}  // namespace zp::sim
