#include "actors/stage_request_check.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>

namespace mesh::generation {

expected<models::layer_range> check_open(const msg::stage_open& o, const stage_limits& limits) {
  const auto bad = [](std::string what) { return make_error(error_code::invalid_argument, "stage_open: " + what); };
  if (o.path.empty() || o.path.size() > limits.max_path_bytes || o.path.find('\0') != std::string::npos)
    return bad("the path is empty, too long or has a NUL byte");
  if (o.end_layer <= o.first_layer) return bad(fmt::format("layers [{}, {}) are no layers", o.first_layer, o.end_layer));
  if (o.context == 0 || o.context > limits.max_context)
    return bad(fmt::format("a context of {} positions (1 to {})", o.context, limits.max_context));
  if (o.slots == 0 || o.slots > limits.max_slots) return bad(fmt::format("{} slots (1 to {})", o.slots, limits.max_slots));
  if (o.files.size() > limits.max_files) return bad(fmt::format("{} files offered (at most {})", o.files.size(), limits.max_files));
  std::set<std::string_view> names;
  for (const auto& f : o.files) {
    if (f.name.empty() && o.files.size() > 1) return bad("a file without a name beside others (only a single-file checkpoint has none)");
    if (!f.name.empty() && (f.name.size() > 255 || f.name == "." || f.name == ".." || f.name.find('/') != std::string::npos ||
                            f.name.find('\0') != std::string::npos))
      return bad(fmt::format("the offered file name \"{}\" is not a plain file name", f.name.substr(0, 64)));
    if (!names.insert(f.name).second) return bad(fmt::format("the file \"{}\" is offered twice", f.name.substr(0, 64)));
    if (std::all_of(f.id.begin(), f.id.end(), [](uint8_t b) { return b == 0; }) || f.size == 0) return bad(fmt::format("the file \"{}\" is offered without a digest or a size", f.name.substr(0, 64)));
    if (f.ranges.empty()) continue;
    if (std::all_of(f.chunk_list.begin(), f.chunk_list.end(), [](uint8_t b) { return b == 0; }))
      return bad(fmt::format("the file \"{}\" is offered in ranges without a chunk list", f.name.substr(0, 64)));
    if (f.ranges.size() > limits.max_ranges)
      return bad(fmt::format("the file \"{}\" is offered in {} ranges (at most {})", f.name.substr(0, 64), f.ranges.size(), limits.max_ranges));
    for (const auto& r : f.ranges)
      if (r.length == 0 || r.offset >= f.size || r.length > f.size - r.offset)
        return bad(fmt::format("the range [{}, +{}) of the file \"{}\" is not within its {} bytes", r.offset, r.length, f.name.substr(0, 64), f.size));
  }
  return models::layer_range{o.first_layer, o.end_layer, o.head};
}

expected<stage_input> check_step(const msg::stage_step& s, bool takes_tokens, int64_t hidden_size, int64_t context,
                                 int64_t slots, const stage_limits& limits) {
  const auto bad = [](std::string what) { return make_error(error_code::invalid_argument, "stage_step: " + what); };
  const auto& t = s.input;
  stage_input in;
  int64_t rows = 0;
  if (takes_tokens) {
    if (t.type != dtype::i32 || t.dims.size() != 1) return bad("the first stage takes token ids, i32 [rows]");
    rows = t.dims[0];
  } else {
    if (t.type != dtype::f32 || t.dims.size() != 2 || t.dims[1] != hidden_size)
      return bad(fmt::format("this stage takes hidden rows, f32 [rows, {}]", hidden_size));
    rows = t.dims[0];
  }
  if (rows < 1 || rows > limits.max_rows) return bad(fmt::format("{} rows (1 to {})", rows, limits.max_rows));
  if (s.rows.empty()) {
    if (s.slot >= slots) return bad(fmt::format("slot {} does not exist (the stage holds {})", s.slot, slots));
    if (static_cast<int64_t>(s.start) + rows > context)
      return bad(fmt::format("{} rows at position {} pass the context of {} positions", rows, s.start, context));
  } else {
    if (static_cast<int64_t>(s.rows.size()) != rows)
      return bad(fmt::format("a batched step names {} rows for {} rows of input", s.rows.size(), rows));
    std::vector<bool> named(static_cast<size_t>(slots), false);
    for (const auto& r : s.rows) {
      if (r.slot >= slots) return bad(fmt::format("slot {} does not exist (the stage holds {})", r.slot, slots));
      if (named[r.slot]) return bad(fmt::format("slot {} named twice in one batched step", r.slot));
      named[r.slot] = true;
      if (static_cast<int64_t>(r.position) >= context)
        return bad(fmt::format("slot {} at position {} passes the context of {} positions", r.slot, r.position, context));
      in.rows.push_back({r.slot, r.position});
    }
  }
  // The decoder checked that the bytes match dtype and shape (tensor::check); checked again, as
  // this copies them.
  const auto values = static_cast<size_t>(takes_tokens ? rows : rows * hidden_size);
  if (t.bytes.size() != values * 4) return bad(fmt::format("{} bytes for {} values", t.bytes.size(), values));
  if (takes_tokens) {
    in.tokens.resize(static_cast<size_t>(rows));
    std::memcpy(in.tokens.data(), t.bytes.data(), in.tokens.size() * sizeof(int32_t));
  } else {
    in.hidden.resize(static_cast<size_t>(rows * hidden_size));
    std::memcpy(in.hidden.data(), t.bytes.data(), in.hidden.size() * sizeof(float));
  }
  return in;
}

}  // namespace mesh::generation
