#pragma once
// Which Hugging Face transformers release's modelling code the op graph follows where
// releases differ in what autograd keeps (docs/deepspeed_fidelity.md, "transformers"):
//  - v5 (transformers 5.x; 4.57 reads the same): decoder models (GPT-2, the Llama family)
//    with use_cache — their config.json default — build a DynamicCache even in training,
//    and its update (cache_utils.DynamicLayer.update: torch.cat onto an empty tensor) copies
//    k and v into contiguous (B, K, T, D) tensors that attention then reads and saves;
//    sdpa runs grouped-query models with enable_gqa (k and v keep their K heads).
//  - v4_46 (transformers 4.46): the cache keeps the k and v views it is given (legacy
//    tuples for GPT-2, DynamicCache.update appends without a copy), and sdpa repeats k
//    and v to the query heads (repeat_kv) first.
// With gradient checkpointing both turn use_cache off (no cache at all). Both agree on
// the rest: the sdpa output is already in (B, T, H, D) order (no copy to merge the heads),
// and BERT passes no mask to sdpa when nothing is padded.
#include <string>
#include <vector>

namespace zp::models {

enum class Transformers { v4_46, v5 };

// What zeroplan models when nothing is asked for: transformers 5.
inline constexpr Transformers kDefaultTransformers = Transformers::v5;

// "4.46", "5".
const char* transformers_name(Transformers t);
const std::vector<std::string>& transformers_names();

// `value` must be one of transformers_names() ("5", "4.46"; "5.x"/"4.46.x" patch releases
// are accepted as their series). Anything else → zp::InputError naming `file` and `key`.
Transformers parse_transformers(const std::string& file, const std::string& key, const std::string& value);

}  // namespace zp::models
