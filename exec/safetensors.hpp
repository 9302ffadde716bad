#pragma once
// Weights in the safetensors format (what transformers' save_pretrained writes): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the bytes. `train --init-weights` reads a model's parameters by their
// Hugging Face names (the graph's param names); `--save-weights` writes them back, so the
// same weights go into transformers and zeroplan.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zp::exec {

struct NamedTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // F32, BF16 and F16 read as fp32 (exact)
  std::string dtype;          // as the file names it: F32, BF16, F16
};

// Every floating-point tensor of the file by name; tensors of other dtypes (integer
// buffers such as position_ids) are skipped. A malformed file is an InputError naming the
// file and the tensor or header field.
std::map<std::string, NamedTensor> read_safetensors(const std::string& path);

// Writes F32 tensors in the given order (atomically: a failure leaves no partial file).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, NamedTensor>>& tensors,
                       const std::string& flag);

}  // namespace zp::exec
