#pragma once
// Structure-aware JSON mutation shared by the libFuzzer targets (see docs/fuzzing.md).
// Included once per target, after the target's own includes.

// ---------------------------------------------------------------------------------
// Structure-aware mutation: byte-level mutations of JSON mostly produce syntax errors,
// which never reach the reader. Most steps therefore parse the input, change one node
// (a known key added, removed or renamed, an interesting value, a nudged number, an
// array grown or shrunk) and serialise it again; one step in eight stays byte-level so
// the syntax-error path keeps being exercised.

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

class JsonMutator {
 public:
  JsonMutator(unsigned seed, const std::vector<std::string>& keys, const std::vector<nlohmann::json>& values)
      : rng_(seed), keys_(keys), values_(values) {}

  void mutate(nlohmann::json& root) {
    std::vector<nlohmann::json*> nodes;
    collect(root, nodes);
    nlohmann::json& n = *nodes[pick(nodes.size())];
    switch (pick(7)) {
      case 0: n = value(); break;
      case 1:
        if (!n.is_object()) n = nlohmann::json::object();
        n[key()] = value();
        break;
      case 2:
        if (n.is_object() && !n.empty()) {
          auto it = n.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(pick(n.size())));
          n.erase(it);
        } else if (n.is_array() && !n.empty()) {
          n.erase(pick(n.size()));
        }
        break;
      case 3:
        if (n.is_object() && !n.empty()) {
          auto it = n.begin();
          std::advance(it, static_cast<std::ptrdiff_t>(pick(n.size())));
          nlohmann::json v = *it;
          n.erase(it);
          n[key()] = std::move(v);
        }
        break;
      case 4: nudge(n); break;
      case 5:
        if (n.is_array()) n.push_back(value());
        else n = nlohmann::json::array({n});
        break;
      default:  // a nested section with one known key
        if (!n.is_object()) n = nlohmann::json::object();
        n[key()] = nlohmann::json::object({{key(), value()}});
        break;
    }
  }

  // Moves one member of `from` (an object) into `to` (an object).
  void cross(nlohmann::json& to, const nlohmann::json& from) {
    if (!to.is_object() || !from.is_object() || from.empty()) return;
    auto it = from.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(pick(from.size())));
    to[it.key()] = *it;
  }

 private:
  std::size_t pick(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }
  const std::string& key() { return keys_[pick(keys_.size())]; }
  const nlohmann::json& value() { return values_[pick(values_.size())]; }

  static void collect(nlohmann::json& j, std::vector<nlohmann::json*>& out) {
    out.push_back(&j);
    if (j.is_structured())
      for (auto& c : j) collect(c, out);
  }

  void nudge(nlohmann::json& n) {
    if (n.is_number_integer()) {
      // Unsigned arithmetic: wrap-around here is intended, not undefined.
      const auto v = static_cast<std::uint64_t>(n.get<std::int64_t>());
      const std::uint64_t options[] = {v + 1, v - 1, 0 - v, v * 2, v / 2, v * 3};
      n = static_cast<std::int64_t>(options[pick(6)]);
    } else if (n.is_number_float()) {
      const double d = n.get<double>();
      const double options[] = {d * 2, d / 2, -d, std::floor(d), d + 0.5, d * 1e10};
      n = options[pick(6)];
    } else if (n.is_boolean()) {
      n = !n.get<bool>();
    } else {
      n = value();
    }
  }

  std::mt19937_64 rng_;
  const std::vector<std::string>& keys_;
  const std::vector<nlohmann::json>& values_;
};

std::size_t write_back(const nlohmann::json& doc, std::uint8_t* data, std::size_t size, std::size_t max_size) {
  const std::string s = doc.dump();
  if (s.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, s.data(), s.size());
  return s.size();
}

}  // namespace

// A target with inputs that are not JSON documents (the checkpoint loader) defines
// ZEROPLAN_FUZZ_OWN_MUTATOR and uses JsonMutator inside its own entry points.
#ifndef ZEROPLAN_FUZZ_OWN_MUTATOR
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  if (seed % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  JsonMutator m(seed, fuzz_keys(), fuzz_values());
  m.mutate(doc);
  return write_back(doc, data, size, max_size);
}

extern "C" std::size_t LLVMFuzzerCustomCrossOver(const std::uint8_t* data1, std::size_t size1,
                                                 const std::uint8_t* data2, std::size_t size2,
                                                 std::uint8_t* out, std::size_t max_out_size, unsigned int seed) {
  nlohmann::json a, b;
  try {
    a = nlohmann::json::parse(data1, data1 + size1);
    b = nlohmann::json::parse(data2, data2 + size2);
  } catch (const nlohmann::json::exception&) {
    const std::size_t n = std::min(size1, max_out_size);
    std::memcpy(out, data1, n);
    return n;
  }
  JsonMutator m(seed, fuzz_keys(), fuzz_values());
  m.cross(a, b);
  const std::string s = a.dump();
  if (s.size() > max_out_size) {
    const std::size_t n = std::min(size1, max_out_size);
    std::memcpy(out, data1, n);
    return n;
  }
  std::memcpy(out, s.data(), s.size());
  return s.size();
}
#endif  // ZEROPLAN_FUZZ_OWN_MUTATOR
