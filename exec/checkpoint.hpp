#pragma once
// Checkpoints of the executor, laid out as DeepSpeed lays out a ZeRO checkpoint:
//
//   <dir>/latest                                    the tag of the newest complete checkpoint
//   <dir>/global_step<N>/zero_pp_rank_<r>_mp_rank_00_optim_states.zpck
//                                                   rank r's fp32 master partition and
//                                                   optimizer states
//   <dir>/global_step<N>/zero_pp_rank_<r>_mp_rank_00_model_states.zpck
//                                                   the 16-bit params rank r holds
//
// Every file is replaced atomically (temporary file, fsync, rename, fsync of the
// directory), so a save interrupted at any point leaves the previous checkpoint, and
// `latest`, as they were. `latest` is written last, by rank 0, once every rank saved:
// a checkpoint that `latest` names is complete.
//
// Loading checks everything before trusting it (magic, version, sizes, CRC-32 of the
// header and of each blob, the run's identity, the blob table) and answers any problem
// with one InputError line naming the file and what is wrong. Resharding to another
// world size is not supported: such a checkpoint is refused.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zp::exec {

// How blob data is reached when the host cannot address it (a GPU's memory): a blob is
// written and restored in chunks of a few MiB through a host buffer, so a device's state
// is never copied whole into host memory. Without it, blob data is host memory.
struct BlobMemory {
  std::function<void(void* host, const void* data, std::size_t bytes)> to_host;    // data → host
  std::function<void(void* data, const void* host, std::size_t bytes)> from_host;  // host → data
};

// A named piece of state to save or restore (a persistent buffer of the step program).
struct CheckpointBlob {
  std::string name;        // e.g. "master_partition", "optimizer_state", "params"
  void* data = nullptr;    // restored in place on load
  std::int64_t bytes = 0;
  const BlobMemory* memory = nullptr;  // how `data` is reached; nullptr: host memory
};

// The identity of the run that wrote a checkpoint, and where it stopped.
struct CheckpointMeta {
  std::string model;           // model name
  std::string config_digest;   // hex digest of the canonical ds_config JSON ("" for the defaults)
  std::string model_digest;    // hex digest of the canonical model config.json ("": not recorded)
  nlohmann::json config;       // the canonical ds_config (null: defaults), to name the keys that differ
  nlohmann::json model_config; // the canonical model config.json (null: not recorded)
  std::string run_id;          // drawn when a run first starts, kept by every resume ("": not recorded)
  int stage = 0;
  int world_size = 1;
  int rank = 0;
  std::int64_t step = 0;       // optimizer steps completed
  std::uint64_t seed = 0;
  nlohmann::json extra;        // free-form (losses so far, ...), saved and returned as is
};

enum class CheckpointPart { model_states, optim_states };

// "global_step<step>".
std::string checkpoint_tag(std::int64_t step);

// <dir>/<tag>/zero_pp_rank_<rank>_mp_rank_00_<part>.zpck
std::string checkpoint_path(const std::string& dir, const std::string& tag, int rank, CheckpointPart part);

// A 64-bit FNV-1a digest of `text` as 16 hex digits (for CheckpointMeta::config_digest).
std::string config_digest(std::string_view text);

// Writes this rank's two files of step meta.step: `model_blobs` to the model_states file,
// `optim_blobs` to the optim_states file (in this order, each atomically). Blob names must
// be non-empty and distinct within a file, sizes >= 0; each blob's data is read as it is
// written, so a blob with no data and a non-zero size fails the save after the temporary
// file was created (std::invalid_argument, like the other caller errors). The temporary
// file is removed on any failure. A file that cannot be created or written → InputError
// naming it.
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                     std::span<const CheckpointBlob> model_blobs,
                     std::span<const CheckpointBlob> optim_blobs);

// Rank 0 calls this once every rank saved step `step` (the caller puts a barrier before
// it): replaces <dir>/latest atomically with "global_step<step>".
void write_latest(const std::string& dir, std::int64_t step);

// The step a tag names: "global_step12" → 12; nullopt for anything else.
std::optional<std::int64_t> step_of_tag(std::string_view tag);

// The tag <dir>/latest names (InputError when it is missing or not a tag).
std::string latest_tag(const std::string& dir);

// Whether <dir>/latest exists.
bool has_checkpoint(const std::string& dir);

// Restores this rank's (expect.rank) state from the checkpoint named by <dir>/latest, or
// by `tag` when it is not empty. Both files are checked completely (magic, version, sizes,
// header CRC, that they hold the step their folder names, meta against `expect`: model,
// config_digest and model_digest (naming the keys that differ when both sides recorded
// the config), stage, world_size, rank; blob names, order and sizes against the caller's)
// before any blob is touched; then the blobs
// are read in place (through their `memory` when they have one) and their CRC-32 checked. Returns the saved meta (step, seed, extra).
// Any problem → InputError naming the file. After an InputError raised by a blob's CRC
// mismatch the caller's buffers hold partial data (the run is over anyway).
CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect,
                               std::span<const CheckpointBlob> model_blobs,
                               std::span<const CheckpointBlob> optim_blobs,
                               const std::string& tag = "");

}  // namespace zp::exec
