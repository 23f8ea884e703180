#include "models/safetensors_view.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace mesh::models {
namespace {

using json = nlohmann::json;

tl::unexpected<error> bad(const std::string& source, const std::string& what) {
  return make_error(error_code::decode_error, source + ": " + what);
}

// A JSON value as a non-negative integer; nlohmann stores JSON numbers as unsigned, signed or
// float depending on their text, and only a plain non-negative integer is a size or offset.
bool as_count(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

expected<tensor_type> dtype_of(const std::string& source, const std::string& name, const std::string& dtype) {
  if (dtype == "F32") return tensor_type::f32;
  if (dtype == "F16") return tensor_type::f16;
  if (dtype == "BF16") return tensor_type::bf16;
  return make_error(error_code::unsupported, source + ": tensor " + quote_name(name) + " has dtype " + quote_name(dtype) +
                                                 "; supported dtypes are F32, F16 and BF16");
}

}  // namespace

expected<safetensors_view> safetensors_view::parse(std::span<const uint8_t> bytes, std::string source) {
  safetensors_view v;
  v.source_ = std::move(source);
  const std::string& src = v.source_;
  if (bytes.size() < 8)
    return bad(src, "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length of a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | bytes[static_cast<size_t>(i)];
  if (n > max_header_bytes)
    return bad(src, "the header length is " + std::to_string(n) + " bytes, more than the format's limit of " +
                        std::to_string(max_header_bytes) + " (not a safetensors file?)");
  if (n > bytes.size() - 8)
    return bad(src, "truncated: the header of " + std::to_string(n) + " bytes runs past the end of the file (" +
                        std::to_string(bytes.size()) + " bytes)");
  const auto* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (n == 0 || text[0] != '{') return bad(src, "the header is not a JSON object (not a safetensors file?)");
  // allow_exceptions=false: a malformed header gives a discarded value instead of a throw.
  const json header = json::parse(text, text + n, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad(src, "the header is not valid JSON");
  v.data_offset_ = 8 + n;
  const uint64_t buffer_size = bytes.size() - v.data_offset_;
  const std::span<const uint8_t> buffer = bytes.subspan(static_cast<size_t>(v.data_offset_));

  v.tensors_.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad(src, "__metadata__ is not an object");
      for (const auto& [k, value] : entry.items()) {
        if (!value.is_string()) return bad(src, "__metadata__ value " + quote_name(k) + " is not a string");
        v.metadata_[k] = value.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor " + quote_name(name);
    if (!entry.is_object()) return bad(src, what + " is not an object");
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) return bad(src, what + " has no \"dtype\" string");
    if (shape == entry.end() || !shape->is_array()) return bad(src, what + " has no \"shape\" array");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2)
      return bad(src, what + " has no \"data_offsets\" pair [begin, end]");
    auto type = dtype_of(src, name, dtype->get<std::string>());
    if (!type) return forward_error(type);

    safetensors_tensor t;
    t.name = name;
    t.type = *type;
    // Elements times bytes per element, with every step bounded by the buffer so nothing
    // overflows: a shape larger than the buffer cannot match its range anyway.
    uint64_t size = static_cast<uint64_t>(*row_bytes(*type, 1));
    bool too_big = false;
    for (const auto& d : *shape) {
      uint64_t dim;
      if (!as_count(d, dim)) return bad(src, what + " has a shape entry that is not a non-negative integer");
      if (dim > static_cast<uint64_t>(INT64_MAX)) return bad(src, what + " has a dimension beyond int64");
      t.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && size > buffer_size / dim) too_big = true;
      else size *= dim;
    }
    if (t.shape.size() > 16) return bad(src, what + " has " + std::to_string(t.shape.size()) + " dimensions");
    uint64_t begin, end;
    if (!as_count((*offsets)[0], begin) || !as_count((*offsets)[1], end))
      return bad(src, what + " has data_offsets that are not non-negative integers");
    if (begin > end || end > buffer_size)
      return bad(src, what + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                          "] outside the data buffer of " + std::to_string(buffer_size) + " bytes (truncated file?)");
    if (too_big || end - begin != size) {
      std::string dims;
      for (const int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      return bad(src, what + " (" + to_string(t.type) + " [" + dims + "]) needs " + (too_big ? "more" : std::to_string(size)) +
                          " bytes but its data_offsets span " + std::to_string(end - begin));
    }
    t.data = buffer.subspan(static_cast<size_t>(begin), static_cast<size_t>(size));
    v.tensors_.push_back(std::move(t));
  }
  // nlohmann's objects iterate in key order already; sort anyway so find() never depends on it.
  std::sort(v.tensors_.begin(), v.tensors_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return v;
}

const safetensors_tensor* safetensors_view::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name, [](const auto& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

expected<safetensors_index> parse_safetensors_index(std::string_view text, const std::string& source) {
  const json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return bad(source, "not a JSON object");
  const auto map = doc.find("weight_map");
  if (map == doc.end() || !map->is_object()) return bad(source, "has no \"weight_map\" object");
  safetensors_index index;
  index.weight_map.reserve(map->size());
  for (const auto& [name, shard] : map->items()) {
    if (!shard.is_string()) return bad(source, "weight_map entry " + quote_name(name) + " is not a file name");
    const auto file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos || file.find('\\') != std::string::npos ||
        file.find('\0') != std::string::npos)
      return bad(source, "weight_map entry " + quote_name(name) + " names " + quote_name(file) +
                             ", not a file beside the index");
    if (std::find(index.shards.begin(), index.shards.end(), file) == index.shards.end()) index.shards.push_back(file);
    index.weight_map.emplace_back(name, file);
  }
  return index;
}

// ---- safetensors_shards ----

expected<void> safetensors_shards::add(mapped_file file) {
  auto view = safetensors_view::parse(file.bytes(), file.path().string());
  if (!view) return forward_error(view);
  const size_t index = views_.size();
  for (size_t i = 0; i < view->tensors().size(); ++i) {
    const auto& name = view->tensors()[i].name;
    const auto [it, fresh] = where_.emplace(name, std::pair{index, i});
    if (!fresh)
      return make_error(error_code::decode_error, "tensor " + quote_name(name) + " is in both " + views_[it->second.first].source() +
                                                      " and " + view->source());
  }
  file.advise(access_hint::random, file.bytes().first(std::min<size_t>(file.size(), static_cast<size_t>(view->data_offset()))));
  files_.push_back(std::move(file));
  views_.push_back(std::move(*view));
  return {};
}

expected<safetensors_shards> safetensors_shards::open_file(const std::filesystem::path& path) {
  auto file = mapped_file::open(path);
  if (!file) return forward_error(file);
  safetensors_shards s;
  if (auto ok = s.add(std::move(*file)); !ok) return tl::unexpected(ok.error());
  return s;
}

expected<safetensors_shards> safetensors_shards::open_index(const std::filesystem::path& index_path) {
  auto index_file = mapped_file::open(index_path);
  if (!index_file) return forward_error(index_file);
  const auto bytes = index_file->bytes();
  auto index = parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), index_path.string());
  if (!index) return forward_error(index);
  const auto dir = index_path.parent_path();
  safetensors_shards s;
  for (const auto& shard : index->shards) {
    const auto path = dir / shard;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      return make_error(error_code::not_found, index_path.string() + " names shard " + quote_name(shard) + ", which is missing (" +
                                                   path.string() + ")");
    auto file = mapped_file::open(path);
    if (!file) return forward_error(file);
    if (auto ok = s.add(std::move(*file)); !ok) return tl::unexpected(ok.error());
  }
  for (const auto& [name, shard] : index->weight_map) {
    const auto* t = s.find(name);
    const auto it = s.where_.find(name);
    if (!t || std::filesystem::path(s.views_[it->second.first].source()).filename() != shard)
      return make_error(error_code::not_found, index_path.string() + " places tensor " + quote_name(name) + " in " + quote_name(shard) +
                                                   ", which does not hold it");
  }
  return s;
}

const safetensors_tensor* safetensors_shards::find(std::string_view name) const {
  const auto it = where_.find(std::string(name));
  return it == where_.end() ? nullptr : &views_[it->second.first].tensors()[it->second.second];
}

}  // namespace mesh::models
