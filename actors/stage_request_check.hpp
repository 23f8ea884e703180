#pragma once
/// What a node checks in a peer's stage_open and stage_step before it touches a file or a device
/// (a model split over the mesh, docs/serving.md). Pure: no files, no device; the message fuzzer
/// runs it on every stage message it decodes.
#include <cstdint>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "models/layer_range.hpp"
#include "models/sequence_model.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

struct stage_limits {
  size_t max_path_bytes = 4096;         ///< PATH_MAX
  uint32_t max_context = 1u << 20;      ///< positions a stage may be asked to hold
  int64_t max_rows = int64_t{1} << 20;  ///< rows in one step
  uint32_t max_slots = 256;             ///< sequences a stage may be asked to hold (session_options::max_slots)
  size_t max_files = 1024;              ///< files offered for one checkpoint (the largest have ~200 shards)
  size_t max_ranges = 65536;            ///< byte ranges of one offered file (a stage's tensors in it)
};

/// The layer range of an open, or an invalid_argument error naming what is wrong: an empty or
/// over-long path or one with a NUL byte, an empty range, a context or a slot count of 0 or past
/// its limit, offered files past their limit, one with an empty name beside others, a name that
/// is not a plain file name (at most 255 bytes, no '/', NUL, "." or "..") or named twice, a
/// zero digest or size, ranges without a chunk list, past their limit or outside the file.
/// (Whether the model has those layers is known once its file is read.)
expected<models::layer_range> check_open(const msg::stage_open& o, const stage_limits& limits = {});

/// A step's input, as what local_stage::forward takes: token ids (i32 [rows]) for a stage that
/// `takes_tokens`, else f32 hidden rows [rows, hidden_size], and for a batched step each row's
/// slot and position. Errors name what came instead: the wrong kind of input, no rows, more than
/// max_rows, a slot outside the stage's `slots`, a start (or a row's position) past the context,
/// a batch whose rows do not match the input's or that names a slot twice.
struct stage_input {
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  std::vector<models::batch_row> rows;  ///< a batched step's rows; empty: a run of one slot's rows
};
expected<stage_input> check_step(const msg::stage_step& s, bool takes_tokens, int64_t hidden_size, int64_t context,
                                 int64_t slots, const stage_limits& limits = {});

}  // namespace mesh::generation
