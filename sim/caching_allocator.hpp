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
#include <optional>
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
  // Where a live handle's block lies: its segment (identified by its simulated base
  // address, never reused) and its offset in it. A real allocator backs each segment with
  // one cudaMalloc and places blocks where this model does (exec/allocator.cpp).
  struct Place {
    std::int64_t segment = 0, segment_size = 0, offset = 0;
  };
  Place place(Handle h) const;
  std::vector<std::int64_t> segment_ids() const;  // the segments held now
  // The segments held now, in the order they were created: what reserved bytes are made of.
  struct SegmentInfo {
    std::int64_t size = 0;       // bytes held (one cudaMalloc)
    std::int64_t allocated = 0;  // bytes of its live blocks
    int stream = 0;
    bool small_pool = false;     // the 2 MiB segments of requests <= 1 MiB
  };
  std::vector<SegmentInfo> segment_info() const;

  // Two allocators in the same state serve the same request sequence identically; the
  // memory replay uses this to skip repeated micro-steps once the state is a fixed point.
  // Equal: the same blocks at the same addresses, the same counters and peaks.
  friend bool operator==(const CachingAllocatorModel& a, const CachingAllocatorModel& b) { return a.same_state(b); }

 private:
  // Plain value members: a copy is an independent allocator state. Flat arrays rather
  // than node-based trees, so that copies (the memory replay snapshots the state at
  // every micro-step) and operations touch little memory.
  enum class Pool : std::uint8_t { small, large };

  // One block: a piece of a segment, allocated or cached. Blocks of a segment tile it
  // without gaps; `prev`/`next` link its neighbours in address order (slots in
  // `slots_`, -1 at the segment's ends).
  struct Block {
    std::int64_t addr = 0;
    std::int64_t size = 0;
    std::int64_t segment_base = 0;   // address of the segment's first byte
    std::int64_t segment_size = 0;
    std::int32_t prev = -1, next = -1;
    int stream = 0;
    Pool pool = Pool::large;
    bool allocated = false;
    bool whole_segment() const { return size == segment_size; }
  };

  // The cached (free) blocks of one pool and stream in best-fit order: size, then
  // address. Requests repeat a few sizes, so blocks are kept in one bucket per size (the
  // buckets by size, each bucket's blocks by address, the lowest last): a best fit is the
  // last block of the first non-empty bucket large enough.
  class FreeIndex {
   public:
    struct Key {
      std::int64_t size = 0;
      std::int64_t addr = 0;
      std::int32_t slot = -1;        // not part of the order (a function of addr)
    };
    std::size_t size() const { return size_; }
    // The bucket of the smallest blocks of at least `size` bytes, or npos.
    std::size_t first_fit(std::int64_t size) const;
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    Key lowest(std::size_t bucket) const {  // its block of the lowest address
      const Entry& e = buckets_[bucket].blocks.back();
      return Key{buckets_[bucket].size, e.addr, e.slot};
    }
    void pop_lowest(std::size_t bucket);
    void insert(const Key& k);
    void erase(std::int64_t size, std::int64_t addr);
    std::vector<Key> sorted() const;  // every block, in best-fit order
    template <class F> void remove_if(F&& f);

   private:
    struct Entry {
      std::int64_t addr = 0;
      std::int32_t slot = -1;
    };
    struct Bucket {
      std::int64_t size = 0;
      std::vector<Entry> blocks;     // by descending address
    };
    std::size_t find_bucket(std::int64_t size) const;  // the first bucket of at least `size`
    void became_empty();
    std::vector<Bucket> buckets_;    // by ascending size; empty ones are kept for a while
    std::vector<std::vector<Entry>> spare_;  // storage of dropped buckets, for new ones
    std::size_t size_ = 0;
    std::size_t empty_ = 0;          // empty buckets
  };
  struct StreamPools {
    int stream = 0;
    FreeIndex small, large;
  };

  // Live (allocated) blocks by address: open addressing, linear probing, 0 = empty.
  struct HandleTable {
    std::vector<std::int64_t> keys;
    std::vector<std::int32_t> slots;
    std::size_t count = 0;
    int shift = 64;                  // 64 - log2(keys.size())
    std::int32_t find(std::int64_t addr) const;
    void insert(std::int64_t addr, std::int32_t slot);
    void erase(std::int64_t addr);
    std::size_t home(std::int64_t addr) const;
  };

  FreeIndex& free_index(Pool p, int stream) {
    for (auto& s : free_)
      if (s.stream == stream) return p == Pool::small ? s.small : s.large;
    return add_stream(p, stream);
  }
  FreeIndex& add_stream(Pool p, int stream);
  std::int32_t new_slot(const Block& b);
  void drop_slot(std::int32_t slot);
  void insert_free(std::int32_t slot);
  void erase_free(std::int32_t slot);
  std::int32_t find_free_block(Pool pool, int stream, std::int64_t size);
  std::int32_t create_segment(Pool pool, int stream, std::int64_t seg_size);
  bool release_oversize_blocks(Pool pool, int stream, std::int64_t size);
  void release_all_cached();
  void release_segment(std::int32_t slot);
  std::int64_t take_block(std::int32_t slot, std::int64_t size);
  bool same_state(const CachingAllocatorModel& o) const;

  CachingAllocatorOptions opt_;
  std::vector<Block> slots_;               // every block (and unused slots)
  std::vector<std::int32_t> unused_;       // slots free for reuse
  std::vector<std::int32_t> segments_list_;  // first block of every segment, by descending address
  HandleTable live_;                       // allocated blocks by address (the handle)
  std::vector<StreamPools> free_;          // cached blocks by stream and pool
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
