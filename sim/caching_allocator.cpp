#include "sim/caching_allocator.hpp"

#include <limits>
#include <stdexcept>
#include <string>

// The rules follow PyTorch's CUDA caching allocator (native backend, without
// expandable segments); docs/allocator.md lists them and what is left out.
// Every operation is O(log n) in the number of blocks, except the release of
// cached segments on a failed growth, which scans the cached blocks once.

namespace zp::sim {

namespace {

constexpr std::int64_t kMinBlockSize = 512;            // every size is a multiple of this
constexpr std::int64_t kSmallSize = 1 << 20;           // largest small-pool request: 1 MiB
constexpr std::int64_t kSmallBuffer = 2 << 20;         // small-pool segment: 2 MiB
constexpr std::int64_t kLargeBuffer = 20 << 20;        // segment for 1-10 MiB requests: 20 MiB
constexpr std::int64_t kMinLargeAlloc = 10 << 20;      // from here segments are the request...
constexpr std::int64_t kRoundLarge = 2 << 20;          // ...rounded up to 2 MiB
constexpr std::int64_t kNoLimit = std::numeric_limits<std::int64_t>::max();

std::int64_t round_up(std::int64_t v, std::int64_t m) { return ((v + m - 1) / m) * m; }

}  // namespace

CachingAllocatorModel::CachingAllocatorModel(CachingAllocatorOptions opt) : opt_(opt) {
  if (opt_.capacity.v < 0) throw std::invalid_argument("caching allocator: capacity must be >= 0");
  // PyTorch accepts max_split_size_mb only above 20 (kLargeBuffer); the rules below
  // rely on it (an oversize cached block is always a whole segment).
  if (opt_.max_split_size.v != kNoLimit && opt_.max_split_size.v <= kLargeBuffer)
    throw std::invalid_argument("caching allocator: max_split_size must exceed 20 MiB, got " +
                                std::to_string(opt_.max_split_size.v) + " B");
}

Bytes CachingAllocatorModel::round_size(Bytes request) {
  if (request.v < kMinBlockSize) return Bytes{kMinBlockSize};
  return Bytes{round_up(request.v, kMinBlockSize)};
}

Bytes CachingAllocatorModel::segment_size(Bytes rounded) {
  if (rounded.v <= kSmallSize) return Bytes{kSmallBuffer};
  if (rounded.v < kMinLargeAlloc) return Bytes{kLargeBuffer};
  return Bytes{round_up(rounded.v, kRoundLarge)};
}

void CachingAllocatorModel::insert_free(std::int64_t addr, const Block& b) {
  free_set(b.pool).insert(FreeKey{b.stream, b.size, addr});
}

void CachingAllocatorModel::erase_free(std::int64_t addr, const Block& b) {
  free_set(b.pool).erase(FreeKey{b.stream, b.size, addr});
}

// Best fit within (pool, stream): the smallest cached block of at least `size`,
// lowest address among equals. Oversize blocks (>= max_split_size) serve only
// requests that are themselves oversize and no more than kLargeBuffer smaller.
std::optional<std::int64_t> CachingAllocatorModel::find_free_block(Pool pool, int stream,
                                                                   std::int64_t size) {
  FreeSet& set = free_set(pool);
  auto it = set.lower_bound(FreeKey{stream, size, std::numeric_limits<std::int64_t>::min()});
  if (it == set.end() || it->stream != stream) return std::nullopt;
  const std::int64_t max_split = opt_.max_split_size.v;
  if (size < max_split && it->size >= max_split) return std::nullopt;
  if (size >= max_split && it->size >= size + kLargeBuffer) return std::nullopt;
  const std::int64_t addr = it->addr;
  set.erase(it);
  return addr;
}

// A new segment (cudaMalloc), unless it would take the reserved bytes past capacity.
// Addresses only break ties between cached blocks of equal size (lowest address
// wins). The driver tends to hand out each new segment below the previous ones, so
// the simulated address space grows downwards: among equal-size cached blocks the
// one in the most recently created segment is taken, as on the device (see
// docs/allocator.md; address reuse after a release is not modelled).
std::optional<std::int64_t> CachingAllocatorModel::create_segment(Pool pool, int stream,
                                                                  std::int64_t seg_size) {
  if (seg_size > opt_.capacity.v - reserved_) return std::nullopt;
  next_segment_addr_ -= seg_size;
  const std::int64_t addr = next_segment_addr_;
  blocks_.emplace(addr, Block{seg_size, addr, seg_size, stream, pool, false});
  reserved_ += seg_size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++segments_;
  return addr;
}

void CachingAllocatorModel::release_segment(std::int64_t addr) {
  auto it = blocks_.find(addr);
  const Block& b = it->second;
  erase_free(addr, b);
  reserved_ -= b.segment_size;
  --segments_;
  blocks_.erase(it);
}

// With a max_split_size set: free cached oversize segments of this pool and stream,
// the smallest one that covers the request if there is one, else the largest ones
// until their total covers it. Returns whether enough was released.
bool CachingAllocatorModel::release_oversize_blocks(Pool pool, int stream, std::int64_t size) {
  const std::int64_t max_split = opt_.max_split_size.v;
  if (max_split == kNoLimit) return false;
  FreeSet& set = free_set(pool);
  const std::int64_t target = std::max(size, max_split);
  auto it = set.lower_bound(FreeKey{stream, target, std::numeric_limits<std::int64_t>::min()});
  if (it != set.end() && it->stream == stream) {
    release_segment(it->addr);
    return true;
  }
  if (it == set.begin()) return false;
  --it;  // the largest cached block of this stream, if any
  std::int64_t released = 0;
  while (released < target && it->size >= max_split && it->stream == stream) {
    const std::int64_t addr = it->addr;
    released += it->size;
    const bool first = it == set.begin();
    if (!first) --it;
    release_segment(addr);
    if (first) break;
  }
  return released >= target;
}

// Free every cached block that is a whole segment, in both pools and all streams.
void CachingAllocatorModel::release_all_cached() {
  for (FreeSet* set : {&free_large_, &free_small_}) {
    for (auto it = set->begin(); it != set->end();) {
      const std::int64_t addr = it->addr;
      ++it;
      if (blocks_.at(addr).whole_segment()) release_segment(addr);
    }
  }
}

// Marks the block at `addr` allocated for `size` bytes, splitting off the remainder
// when PyTorch would. Returns the block's final size.
std::int64_t CachingAllocatorModel::take_block(std::int64_t addr, std::int64_t size) {
  Block& b = blocks_.at(addr);
  const std::int64_t remaining = b.size - size;
  const bool split = b.pool == Pool::small
                         ? remaining >= kMinBlockSize
                         : (size < opt_.max_split_size.v && remaining > kSmallSize);
  if (split) {
    Block rest = b;
    rest.size = remaining;
    b.size = size;
    blocks_.emplace(addr + size, rest);
    insert_free(addr + size, rest);
  }
  b.allocated = true;
  return b.size;
}

std::optional<CachingAllocatorModel::Handle> CachingAllocatorModel::allocate(Bytes size, int stream) {
  if (size.v < 0) throw std::invalid_argument("caching allocator: negative allocation size");
  if (size.v == 0) return Handle{0};  // PyTorch hands out a null pointer without allocating
  const std::int64_t rounded = round_size(size).v;
  const Pool pool = rounded <= kSmallSize ? Pool::small : Pool::large;
  const std::int64_t seg = segment_size(Bytes{rounded}).v;

  std::optional<std::int64_t> addr = find_free_block(pool, stream, rounded);
  if (!addr) addr = create_segment(pool, stream, seg);
  if (!addr && release_oversize_blocks(pool, stream, rounded)) addr = create_segment(pool, stream, seg);
  if (!addr) {
    release_all_cached();
    ++retries_;
    addr = create_segment(pool, stream, seg);
  }
  if (!addr) {
    ++ooms_;
    return std::nullopt;
  }
  allocated_ += take_block(*addr, rounded);
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return Handle{*addr};
}

void CachingAllocatorModel::free(Handle h) {
  if (h == 0) return;
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.allocated)
    throw std::logic_error("caching allocator: free of a handle that is not allocated: " +
                           std::to_string(h));
  Block& b = it->second;
  b.allocated = false;
  allocated_ -= b.size;
  // Coalesce with the cached neighbours of the same segment.
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.segment_base == b.segment_base) {
      erase_free(prev->first, prev->second);
      prev->second.size += b.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != blocks_.end() && !next->second.allocated &&
      next->second.segment_base == it->second.segment_base) {
    erase_free(next->first, next->second);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  insert_free(it->first, it->second);
}

void CachingAllocatorModel::empty_cache() { release_all_cached(); }

Bytes CachingAllocatorModel::block_size(Handle h) const {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.allocated) return Bytes{0};
  return Bytes{it->second.size};
}

Bytes CachingAllocatorModel::allocated() const { return Bytes{allocated_}; }
Bytes CachingAllocatorModel::reserved() const { return Bytes{reserved_}; }
Bytes CachingAllocatorModel::peak_allocated() const { return Bytes{peak_allocated_}; }
Bytes CachingAllocatorModel::peak_reserved() const { return Bytes{peak_reserved_}; }
std::int64_t CachingAllocatorModel::segments() const { return segments_; }
std::int64_t CachingAllocatorModel::num_oom_retries() const { return retries_; }
std::int64_t CachingAllocatorModel::num_ooms() const { return ooms_; }

}  // namespace zp::sim
