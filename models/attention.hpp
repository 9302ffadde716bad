#pragma once
// How attention is computed, named as Hugging Face transformers names its
// `attn_implementation`:
//  - eager: HF's eager path (scores, softmax, dropout and the probabilities are
//    materialised and saved: the 5·a·s²·b term);
//  - sdpa: torch.nn.functional.scaled_dot_product_attention with a flash /
//    memory-efficient kernel (what transformers picks when nothing is asked for);
//  - flash_attention_2: the flash-attn package's flash_attn_func, as transformers calls it
//    (no repeat_kv, (B, T, H, D) layout, fp16/bf16 only).
// docs/design.md ("Attention") says what each saves and which transformers release is modelled.
#include <optional>
#include <string>
#include <vector>

namespace zp::models {

enum class Attention { eager, sdpa, flash_attention_2 };

// What transformers picks when neither the caller nor the config.json asks: sdpa
// (transformers 5.25, PreTrainedModel.get_correct_attn_implementation: "sdpa" when none is
// requested, eager only where torch cannot dispatch it). README.md and docs/design.md say
// so, and tests/test_models.cpp checks that they do.
inline constexpr Attention kDefaultAttention = Attention::sdpa;

// "eager", "sdpa", "flash_attention_2".
const char* attention_name(Attention a);
const std::vector<std::string>& attention_names();

// `value` must be one of attention_names() (exactly, as transformers spells them).
// Anything else → zp::InputError naming `file` and `key` and the allowed names.
Attention parse_attention(const std::string& file, const std::string& key, const std::string& value);

}  // namespace zp::models
