#pragma once
// Builder: appends events, buffers, labels and list entries to a step program. An event is
// open until the next begin(): what is allocated, freed, depended on and sliced in between
// belongs to it. Every byte of the program is sized here (`buffer`), from an element count
// and a dtype.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/program.hpp"

namespace zp::zero::lowering {

// Labels formatted once per (kind, index) and reused by every micro-step (Builder::cached).
enum class LabelKind : std::uint8_t {
  copy_to_bucket, accumulate_fp32, flatten, flatten_buf, cast_buf, all_reduce, reduce_to, copy_to_partition,
  gather, gather_buf, gather_copy, gather_h2d, release, interleave, rs_in, reduce_scatter,
  accumulate_partition, checkpoint_release,
};
constexpr std::size_t kNumLabelKinds = 18;

class Builder {
 public:
  explicit Builder(Program& p) : p_(p) {}

  // A new label. Callers that issue a name once per key keep the index themselves
  // (cached() and the per-op tables of Names).
  std::int32_t add_label(std::string s) {
    p_.labels.push_back(std::move(s));
    return static_cast<std::int32_t>(p_.labels.size() - 1);
  }
  // A name issued as it comes (every micro-step's "batch", the step's "optimizer") is
  // interned: issued again it gets the index it got first, so a program's labels do not
  // depend on how many micro-steps were lowered one by one (Program::repeat).
  std::int32_t label(std::string s) {
    auto [it, fresh] = interned_.try_emplace(s, static_cast<std::int32_t>(p_.labels.size()));
    if (fresh) p_.labels.push_back(std::move(s));
    return it->second;
  }

  // Labels repeat across micro-steps: format each (kind, index) once.
  // Indices are small (op, param, bucket or visit numbers): a flat table per kind, with a
  // map for the rare large or negative one.
  template <class Make>
  std::int32_t cached(LabelKind kind, std::int64_t index, Make&& make) {
    constexpr std::int64_t kFlat = std::int64_t{1} << 20;
    if (index >= 0 && index < kFlat) {
      auto& t = flat_[static_cast<std::size_t>(kind)];
      const auto i = static_cast<std::size_t>(index);
      if (i >= t.size()) t.resize(std::max<std::size_t>(i + 1, t.size() * 2), -1);
      if (t[i] < 0) t[i] = add_label(make());
      return t[i];
    }
    const std::uint64_t key = (static_cast<std::uint64_t>(kind) << 48) ^ static_cast<std::uint64_t>(index);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const std::int32_t l = add_label(make());
    cache_.emplace(key, l);
    return l;
  }

  // A buffer of `elements` of dtype `t`: bytes = elements × dtype_size(t).
  BufferId buffer(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                  std::int32_t name, std::int32_t ref = -1) {
    Buffer b;
    b.id = static_cast<BufferId>(p_.buffers.size());
    b.category = c;
    b.placement = where;
    b.role = role;
    b.dtype = t;
    b.elements = elements;
    b.bytes = Bytes{elements * dtype_size(t)};
    b.ref = ref;
    b.name = name;
    p_.buffers.push_back(b);
    return b.id;
  }
  BufferId buffer(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                  std::string name, std::int32_t ref = -1) {
    return buffer(c, where, role, t, elements, label(std::move(name)), ref);
  }

  Event& begin(EventKind k, Stream s, Phase ph, int micro, std::int32_t lbl) {
    close();
    const EventId waits = next_waits_for_;
    next_waits_for_ = -1;
    Event& e = p_.events.emplace_back();
    e.id = static_cast<EventId>(p_.events.size() - 1);
    e.kind = k;
    e.stream = s;
    e.phase = ph;
    e.micro_step = static_cast<std::int16_t>(micro);
    e.label = lbl;
    e.alloc_begin = e.alloc_end = static_cast<std::uint32_t>(p_.alloc_list.size());
    e.free_begin = e.free_end = static_cast<std::uint32_t>(p_.free_list.size());
    e.dep_begin = e.dep_end = static_cast<std::uint32_t>(p_.dep_list.size());
    e.slice_begin = e.slice_end = static_cast<std::uint32_t>(p_.slice_list.size());
    open_ = true;
    dep(waits);
    return e;
  }
  // The next event begun depends on `d` (the host event that issues it, for instance).
  void next_waits_for(EventId d) { next_waits_for_ = d; }
  Event& begin(EventKind k, Stream s, Phase ph, int micro, std::string lbl) {
    return begin(k, s, ph, micro, label(std::move(lbl)));
  }
  Event& cur() { return p_.events.back(); }
  EventId cur_id() const { return static_cast<EventId>(p_.events.size() - 1); }

  void alloc(BufferId b) { p_.alloc_list.push_back(b); }
  void free(BufferId b) { p_.free_list.push_back(b); }
  void dep(EventId d) {
    if (d >= 0 && d != cur_id()) p_.dep_list.push_back(d);
  }
  void slice(const BucketSlice& s) { p_.slice_list.push_back(s); }

  void close() {
    if (!open_) return;
    Event& e = p_.events.back();
    e.alloc_end = static_cast<std::uint32_t>(p_.alloc_list.size());
    e.free_end = static_cast<std::uint32_t>(p_.free_list.size());
    e.dep_end = static_cast<std::uint32_t>(p_.dep_list.size());
    e.slice_end = static_cast<std::uint32_t>(p_.slice_list.size());
    open_ = false;
  }

 private:
  Program& p_;
  bool open_ = false;
  EventId next_waits_for_ = -1;
  std::unordered_map<std::uint64_t, std::int32_t> cache_;
  std::unordered_map<std::string, std::int32_t> interned_;
  std::array<std::vector<std::int32_t>, kNumLabelKinds> flat_;  // one per LabelKind
};

}  // namespace zp::zero::lowering
