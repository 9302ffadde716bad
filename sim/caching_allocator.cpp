#include "sim/caching_allocator.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

// The rules follow PyTorch's CUDA caching allocator (native backend, without
// expandable segments); docs/allocator.md lists them and what is left out.
// Blocks live in a flat slot array linked to their segment neighbours; cached blocks
// are kept per (pool, stream) in buckets by size (best-fit order) and live ones in an
// address hash table, so a lookup is O(log n) and an insertion or removal moves part of
// one bucket.
// The release of cached segments on a failed growth scans the cached blocks once.

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

// ---- handle table ---------------------------------------------------------------

std::size_t CachingAllocatorModel::HandleTable::home(std::int64_t addr) const {
  // Addresses are multiples of 512: Fibonacci hashing of the rest, top bits.
  const auto h = static_cast<std::uint64_t>(addr >> 9) * 0x9E3779B97F4A7C15ull;
  return static_cast<std::size_t>(h >> shift);
}

std::int32_t CachingAllocatorModel::HandleTable::find(std::int64_t addr) const {
  if (keys.empty() || addr == 0) return -1;
  const std::size_t mask = keys.size() - 1;
  for (std::size_t i = home(addr);; i = (i + 1) & mask) {
    if (keys[i] == addr) return slots[i];
    if (keys[i] == 0) return -1;
  }
}

void CachingAllocatorModel::HandleTable::insert(std::int64_t addr, std::int32_t slot) {
  if (2 * (count + 1) > keys.size()) {
    std::vector<std::int64_t> old_keys(std::max<std::size_t>(512, 2 * keys.size()), 0);
    std::vector<std::int32_t> old_slots(old_keys.size(), -1);
    old_keys.swap(keys);
    old_slots.swap(slots);
    shift = 64;
    for (std::size_t size = keys.size(); size > 1; size /= 2) --shift;
    count = 0;
    for (std::size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != 0) insert(old_keys[i], old_slots[i]);
  }
  const std::size_t mask = keys.size() - 1;
  std::size_t i = home(addr);
  while (keys[i] != 0) i = (i + 1) & mask;
  keys[i] = addr;
  slots[i] = slot;
  ++count;
}

void CachingAllocatorModel::HandleTable::erase(std::int64_t addr) {
  const std::size_t mask = keys.size() - 1;
  std::size_t i = home(addr);
  while (keys[i] != addr) i = (i + 1) & mask;
  // Backward-shift deletion: no tombstones.
  for (std::size_t j = (i + 1) & mask; keys[j] != 0; j = (j + 1) & mask) {
    const std::size_t h = home(keys[j]);
    // Move j into the hole at i when j's home is not in (i, j] (cyclically).
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (stays) continue;
    keys[i] = keys[j];
    slots[i] = slots[j];
    i = j;
  }
  keys[i] = 0;
  slots[i] = -1;
  --count;
}

// ---- cached blocks ------------------------------------------------------------------

std::size_t CachingAllocatorModel::FreeIndex::find_bucket(std::int64_t size) const {
  std::size_t lo = 0, n = buckets_.size();
  while (n > 0) {
    const std::size_t half = n / 2;
    if (buckets_[lo + half].size < size) {
      lo += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  return lo;
}

std::size_t CachingAllocatorModel::FreeIndex::first_fit(std::int64_t size) const {
  for (std::size_t b = find_bucket(size); b < buckets_.size(); ++b)
    if (!buckets_[b].blocks.empty()) return b;
  return npos;
}

void CachingAllocatorModel::FreeIndex::became_empty() {
  // Empty buckets are kept (a size tends to come back) until they outnumber the others.
  if (++empty_ <= 16 || 2 * empty_ <= buckets_.size()) return;
  std::size_t keep = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].blocks.empty()) spare_.push_back(std::move(buckets_[b].blocks));
    else if (keep++ != b) buckets_[keep - 1] = std::move(buckets_[b]);
  }
  buckets_.resize(keep);
  empty_ = 0;
}

void CachingAllocatorModel::FreeIndex::pop_lowest(std::size_t bucket) {
  --size_;
  buckets_[bucket].blocks.pop_back();
  if (buckets_[bucket].blocks.empty()) became_empty();
}

void CachingAllocatorModel::FreeIndex::insert(const Key& k) {
  ++size_;
  const std::size_t b = find_bucket(k.size);
  if (b == buckets_.size() || buckets_[b].size != k.size) {
    buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(b), Bucket{k.size, {}});
    if (!spare_.empty()) {
      buckets_[b].blocks = std::move(spare_.back());  // empty, with room
      spare_.pop_back();
    }
  } else if (buckets_[b].blocks.empty()) {
    --empty_;
  }
  auto& v = buckets_[b].blocks;
  // Descending addresses: the position after every higher address.
  std::size_t lo = 0, n = v.size();
  while (n > 0) {
    const std::size_t half = n / 2;
    if (v[lo + half].addr > k.addr) {
      lo += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  v.insert(v.begin() + static_cast<std::ptrdiff_t>(lo), Entry{k.addr, k.slot});
}

void CachingAllocatorModel::FreeIndex::erase(std::int64_t size, std::int64_t addr) {
  --size_;
  auto& v = buckets_[find_bucket(size)].blocks;
  std::size_t lo = 0, n = v.size();
  while (n > 0) {
    const std::size_t half = n / 2;
    if (v[lo + half].addr > addr) {
      lo += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(lo));
  if (v.empty()) became_empty();
}

std::vector<CachingAllocatorModel::FreeIndex::Key> CachingAllocatorModel::FreeIndex::sorted() const {
  std::vector<Key> out;
  out.reserve(size_);
  for (const Bucket& b : buckets_)
    for (auto it = b.blocks.rbegin(); it != b.blocks.rend(); ++it) out.push_back(Key{b.size, it->addr, it->slot});
  return out;
}

template <class F>
void CachingAllocatorModel::FreeIndex::remove_if(F&& f) {
  for (Bucket& b : buckets_) {
    const bool was_empty = b.blocks.empty();
    const std::size_t before = b.blocks.size();
    std::erase_if(b.blocks, [&](const Entry& e) { return f(Key{b.size, e.addr, e.slot}); });
    size_ -= before - b.blocks.size();
    if (!was_empty && b.blocks.empty()) ++empty_;
  }
}

// ---- blocks -------------------------------------------------------------------------

CachingAllocatorModel::FreeIndex& CachingAllocatorModel::add_stream(Pool p, int stream) {
  free_.push_back(StreamPools{stream, {}, {}});
  return p == Pool::small ? free_.back().small : free_.back().large;
}

std::int32_t CachingAllocatorModel::new_slot(const Block& b) {
  if (!unused_.empty()) {
    const std::int32_t s = unused_.back();
    unused_.pop_back();
    slots_[static_cast<std::size_t>(s)] = b;
    return s;
  }
  slots_.push_back(b);
  return static_cast<std::int32_t>(slots_.size() - 1);
}

void CachingAllocatorModel::drop_slot(std::int32_t slot) { unused_.push_back(slot); }

void CachingAllocatorModel::insert_free(std::int32_t slot) {
  const Block& b = slots_[static_cast<std::size_t>(slot)];
  free_index(b.pool, b.stream).insert(FreeIndex::Key{b.size, b.addr, slot});
}

void CachingAllocatorModel::erase_free(std::int32_t slot) {
  const Block& b = slots_[static_cast<std::size_t>(slot)];
  free_index(b.pool, b.stream).erase(b.size, b.addr);
}

// Best fit within (pool, stream): the smallest cached block of at least `size`,
// lowest address among equals. Oversize blocks (>= max_split_size) serve only
// requests that are themselves oversize and no more than kLargeBuffer smaller.
std::int32_t CachingAllocatorModel::find_free_block(Pool pool, int stream, std::int64_t size) {
  FreeIndex& set = free_index(pool, stream);
  const std::size_t bucket = set.first_fit(size);
  if (bucket == FreeIndex::npos) return -1;
  const FreeIndex::Key k = set.lowest(bucket);
  const std::int64_t max_split = opt_.max_split_size.v;
  if (size < max_split && k.size >= max_split) return -1;
  if (size >= max_split && k.size >= size + kLargeBuffer) return -1;
  set.pop_lowest(bucket);
  return k.slot;
}

// A new segment (cudaMalloc), unless it would take the reserved bytes past capacity.
// Addresses only break ties between cached blocks of equal size (lowest address
// wins). The driver tends to hand out each new segment below the previous ones, so
// the simulated address space grows downwards: among equal-size cached blocks the
// one in the most recently created segment is taken, as on the device (see
// docs/allocator.md; address reuse after a release is not modelled).
std::int32_t CachingAllocatorModel::create_segment(Pool pool, int stream, std::int64_t seg_size) {
  if (seg_size > opt_.capacity.v - reserved_) return -1;
  next_segment_addr_ -= seg_size;
  const std::int64_t addr = next_segment_addr_;
  Block b;
  b.addr = addr;
  b.size = seg_size;
  b.segment_base = addr;
  b.segment_size = seg_size;
  b.stream = stream;
  b.pool = pool;
  const std::int32_t slot = new_slot(b);
  segments_list_.push_back(slot);  // the lowest address so far: the end of the list
  reserved_ += seg_size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++segments_;
  return slot;
}

// Releases a cached whole segment (already out of its free set).
void CachingAllocatorModel::release_segment(std::int32_t slot) {
  const Block& b = slots_[static_cast<std::size_t>(slot)];
  reserved_ -= b.segment_size;
  --segments_;
  for (auto it = segments_list_.begin(); it != segments_list_.end(); ++it)
    if (*it == slot) {
      segments_list_.erase(it);
      break;
    }
  drop_slot(slot);
}

// With a max_split_size set: free cached oversize segments of this pool and stream,
// the smallest one that covers the request if there is one, else the largest ones
// until their total covers it. Returns whether enough was released.
bool CachingAllocatorModel::release_oversize_blocks(Pool pool, int stream, std::int64_t size) {
  const std::int64_t max_split = opt_.max_split_size.v;
  if (max_split == kNoLimit) return false;
  FreeIndex& set = free_index(pool, stream);
  const std::int64_t target = std::max(size, max_split);
  const std::size_t bucket = set.first_fit(target);
  if (bucket != FreeIndex::npos) {
    const FreeIndex::Key k = set.lowest(bucket);
    set.pop_lowest(bucket);
    release_segment(k.slot);
    return true;
  }
  // The largest cached blocks of this stream first (the highest address among equals).
  const std::vector<FreeIndex::Key> keys = set.sorted();
  std::int64_t released = 0;
  for (auto it = keys.rbegin(); it != keys.rend() && released < target && it->size >= max_split; ++it) {
    released += it->size;
    set.erase(it->size, it->addr);
    release_segment(it->slot);
  }
  return released >= target;
}

// Free every cached block that is a whole segment, in both pools and all streams.
void CachingAllocatorModel::release_all_cached() {
  for (auto& s : free_)
    for (FreeIndex* set : {&s.large, &s.small})
      set->remove_if([&](const FreeIndex::Key& k) {
        if (!slots_[static_cast<std::size_t>(k.slot)].whole_segment()) return false;
        release_segment(k.slot);
        return true;
      });
}

// Marks the block in `slot` allocated for `size` bytes, splitting off the remainder
// when PyTorch would. Returns the block's final size.
std::int64_t CachingAllocatorModel::take_block(std::int32_t slot, std::int64_t size) {
  Block& b = slots_[static_cast<std::size_t>(slot)];
  const std::int64_t remaining = b.size - size;
  const bool split = b.pool == Pool::small
                         ? remaining >= kMinBlockSize
                         : (size < opt_.max_split_size.v && remaining > kSmallSize);
  if (split) {
    Block rest = b;
    rest.addr = b.addr + size;
    rest.size = remaining;
    rest.prev = slot;
    rest.allocated = false;
    b.size = size;
    const std::int32_t r = new_slot(rest);  // may reallocate slots_: `b` is not used after
    Block& bb = slots_[static_cast<std::size_t>(slot)];
    if (bb.next >= 0) slots_[static_cast<std::size_t>(bb.next)].prev = r;
    bb.next = r;
    insert_free(r);
  }
  Block& bb = slots_[static_cast<std::size_t>(slot)];
  bb.allocated = true;
  live_.insert(bb.addr, slot);
  return bb.size;
}

std::optional<CachingAllocatorModel::Handle> CachingAllocatorModel::allocate(Bytes size, int stream) {
  if (size.v < 0) throw std::invalid_argument("caching allocator: negative allocation size");
  if (size.v == 0) return Handle{0};  // PyTorch hands out a null pointer without allocating
  const std::int64_t rounded = round_size(size).v;
  const Pool pool = rounded <= kSmallSize ? Pool::small : Pool::large;
  const std::int64_t seg = segment_size(Bytes{rounded}).v;

  std::int32_t slot = find_free_block(pool, stream, rounded);
  if (slot < 0) slot = create_segment(pool, stream, seg);
  if (slot < 0 && release_oversize_blocks(pool, stream, rounded)) slot = create_segment(pool, stream, seg);
  if (slot < 0) {
    release_all_cached();
    ++retries_;
    slot = create_segment(pool, stream, seg);
  }
  if (slot < 0) {
    ++ooms_;
    return std::nullopt;
  }
  allocated_ += take_block(slot, rounded);
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return Handle{slots_[static_cast<std::size_t>(slot)].addr};
}

void CachingAllocatorModel::free(Handle h) {
  if (h == 0) return;
  std::int32_t slot = live_.find(h);
  if (slot < 0)
    throw std::logic_error("caching allocator: free of a handle that is not allocated: " +
                           std::to_string(h));
  live_.erase(h);
  Block* b = &slots_[static_cast<std::size_t>(slot)];
  b->allocated = false;
  allocated_ -= b->size;
  // Coalesce with the cached neighbours of the same segment.
  if (b->prev >= 0 && !slots_[static_cast<std::size_t>(b->prev)].allocated) {
    const std::int32_t p = b->prev;
    Block& pb = slots_[static_cast<std::size_t>(p)];
    erase_free(p);
    pb.size += b->size;
    pb.next = b->next;
    if (b->next >= 0) slots_[static_cast<std::size_t>(b->next)].prev = p;
    drop_slot(slot);
    slot = p;
    b = &pb;
  }
  if (b->next >= 0 && !slots_[static_cast<std::size_t>(b->next)].allocated) {
    const std::int32_t n = b->next;
    Block& nb = slots_[static_cast<std::size_t>(n)];
    erase_free(n);
    b->size += nb.size;
    b->next = nb.next;
    if (nb.next >= 0) slots_[static_cast<std::size_t>(nb.next)].prev = slot;
    drop_slot(n);
  }
  insert_free(slot);
}

void CachingAllocatorModel::empty_cache() { release_all_cached(); }

Bytes CachingAllocatorModel::block_size(Handle h) const {
  const std::int32_t slot = live_.find(h);
  if (slot < 0) return Bytes{0};
  return Bytes{slots_[static_cast<std::size_t>(slot)].size};
}

CachingAllocatorModel::Place CachingAllocatorModel::place(Handle h) const {
  const std::int32_t slot = live_.find(h);
  if (slot < 0) throw std::logic_error("caching allocator: place of a handle that is not live");
  const Block& b = slots_[static_cast<std::size_t>(slot)];
  return {b.segment_base, b.segment_size, b.addr - b.segment_base};
}

std::vector<std::int64_t> CachingAllocatorModel::segment_ids() const {
  std::vector<std::int64_t> out;
  out.reserve(segments_list_.size());
  for (std::int32_t slot : segments_list_) out.push_back(slots_[static_cast<std::size_t>(slot)].segment_base);
  return out;
}

std::vector<CachingAllocatorModel::SegmentInfo> CachingAllocatorModel::segment_info() const {
  std::vector<SegmentInfo> out;
  out.reserve(segments_list_.size());
  for (std::int32_t first : segments_list_) {
    const Block& head = slots_[static_cast<std::size_t>(first)];
    SegmentInfo si;
    si.size = head.segment_size;
    si.stream = head.stream;
    si.small_pool = head.pool == Pool::small;
    std::int32_t lowest = first;
    while (slots_[static_cast<std::size_t>(lowest)].prev >= 0) lowest = slots_[static_cast<std::size_t>(lowest)].prev;
    for (std::int32_t s = lowest; s >= 0; s = slots_[static_cast<std::size_t>(s)].next)
      if (slots_[static_cast<std::size_t>(s)].allocated) si.allocated += slots_[static_cast<std::size_t>(s)].size;
    out.push_back(si);
  }
  return out;
}

// Same counters, then the same segments holding the same blocks (slot numbers may differ).
bool CachingAllocatorModel::same_state(const CachingAllocatorModel& o) const {
  if (!(opt_ == o.opt_) || next_segment_addr_ != o.next_segment_addr_ || allocated_ != o.allocated_ ||
      reserved_ != o.reserved_ || peak_allocated_ != o.peak_allocated_ || peak_reserved_ != o.peak_reserved_ ||
      segments_ != o.segments_ || retries_ != o.retries_ || ooms_ != o.ooms_ ||
      segments_list_.size() != o.segments_list_.size() || live_.count != o.live_.count)
    return false;
  for (std::size_t s = 0; s < segments_list_.size(); ++s) {
    std::int32_t a = segments_list_[s], b = o.segments_list_[s];
    while (a >= 0 && b >= 0) {
      const Block& x = slots_[static_cast<std::size_t>(a)];
      const Block& y = o.slots_[static_cast<std::size_t>(b)];
      if (x.addr != y.addr || x.size != y.size || x.segment_base != y.segment_base ||
          x.segment_size != y.segment_size || x.stream != y.stream || x.pool != y.pool ||
          x.allocated != y.allocated)
        return false;
      a = x.next;
      b = y.next;
    }
    if (a != b) return false;  // one segment has more blocks
  }
  return true;
}

Bytes CachingAllocatorModel::allocated() const { return Bytes{allocated_}; }
Bytes CachingAllocatorModel::reserved() const { return Bytes{reserved_}; }
Bytes CachingAllocatorModel::peak_allocated() const { return Bytes{peak_allocated_}; }
Bytes CachingAllocatorModel::peak_reserved() const { return Bytes{peak_reserved_}; }
std::int64_t CachingAllocatorModel::segments() const { return segments_; }
std::int64_t CachingAllocatorModel::num_oom_retries() const { return retries_; }
std::int64_t CachingAllocatorModel::num_ooms() const { return ooms_; }

}  // namespace zp::sim
