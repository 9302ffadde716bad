#include "exec/safetensors.hpp"

#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "kernels/cpu/convert.hpp"

namespace zp::exec {

using nlohmann::json;

std::map<std::string, NamedTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(path, "", "cannot read the weights file (expected safetensors)");
  const auto size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0);
  unsigned char len8[8] = {};
  if (size < 8 || !in.read(reinterpret_cast<char*>(len8), 8))
    throw InputError(path, "", "not a safetensors file: shorter than its 8-byte header length");
  std::uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len8[i];
  if (hlen > static_cast<std::uint64_t>(size - 8) || hlen > (std::uint64_t{100} << 20))
    throw InputError(path, "", fmt::format("not a safetensors file: header length {} with {} bytes in the file", hlen, size));
  std::string header(static_cast<std::size_t>(hlen), '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  json h;
  try {
    h = json::parse(header);
  } catch (const json::exception& e) {
    throw InputError(path, "", fmt::format("not a safetensors file: its header is not JSON ({})", e.what()));
  }
  if (!h.is_object()) throw InputError(path, "", "not a safetensors file: its header is not a JSON object");
  const std::int64_t data0 = 8 + static_cast<std::int64_t>(hlen), data_bytes = size - data0;
  std::map<std::string, NamedTensor> out;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    const auto bad = [&](const std::string& why) { return InputError(path, name, why); };
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      throw bad("a tensor entry needs dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) throw bad("dtype must be a string");
    const std::string dt = t["dtype"].get<std::string>();
    const std::int64_t esz = dt == "F32" ? 4 : (dt == "BF16" || dt == "F16") ? 2 : 0;
    if (esz == 0) continue;  // integer and bool buffers are not parameters
    NamedTensor nt;
    nt.dtype = dt;
    std::int64_t n = 1;
    if (!t["shape"].is_array()) throw bad("shape must be an array");
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) throw bad("shape must hold non-negative integers");
      nt.shape.push_back(d.get<std::int64_t>());
      n *= nt.shape.back();
      if (n > (std::int64_t{1} << 40)) throw bad("shape too large");
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() || !off[1].is_number_integer())
      throw bad("data_offsets must be [begin, end]");
    const auto b = off[0].get<std::int64_t>(), e = off[1].get<std::int64_t>();
    if (b < 0 || e < b || e > data_bytes)
      throw bad(fmt::format("data_offsets [{}, {}] outside the {} data bytes", b, e, data_bytes));
    if (e - b != n * esz) throw bad(fmt::format("data_offsets hold {} bytes, shape and dtype need {}", e - b, n * esz));
    std::vector<unsigned char> raw(static_cast<std::size_t>(e - b));
    in.seekg(data0 + b);
    if (!in.read(reinterpret_cast<char*>(raw.data()), e - b)) throw bad("truncated data");
    nt.values.resize(static_cast<std::size_t>(n));
    if (dt == "F32") {
      std::memcpy(nt.values.data(), raw.data(), raw.size());
    } else {
      std::vector<std::uint16_t> h16(static_cast<std::size_t>(n));
      std::memcpy(h16.data(), raw.data(), raw.size());
      if (dt == "BF16") kernels::cpu::bf16_to_float(nt.values.data(), h16.data(), n);
      else kernels::cpu::fp16_to_float(nt.values.data(), h16.data(), n);
    }
    out.emplace(name, std::move(nt));
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, NamedTensor>>& tensors,
                       const std::string& flag) {
  json h = json::object();
  std::int64_t at = 0;
  for (const auto& [name, t] : tensors) {
    const auto bytes = static_cast<std::int64_t>(t.values.size()) * 4;
    h[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  h["__metadata__"] = {{"format", "pt"}, {"writer", "zeroplan train --save-weights"}};
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');  // the data 8-byte aligned, as safetensors pads
  std::string blob(8, '\0');
  const auto hl = static_cast<std::uint64_t>(header.size());
  for (int i = 0; i < 8; ++i) blob[static_cast<std::size_t>(i)] = static_cast<char>((hl >> (8 * i)) & 0xff);
  blob += header;
  blob.reserve(blob.size() + static_cast<std::size_t>(at));
  for (const auto& [name, t] : tensors)
    blob.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
  io::write_atomic(path, blob, flag);
}

}  // namespace zp::exec
