#include "models/checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace mesh::models {
namespace {

// What a file holds, from its first bytes: GGUF starts with its magic, safetensors with an 8-byte
// length and then the '{' of its JSON header.
enum class sniffed { gguf, safetensors, unknown };

sniffed sniff(std::span<const uint8_t> b) {
  if (b.size() >= 4 && std::memcmp(b.data(), "GGUF", 4) == 0) return sniffed::gguf;
  if (b.size() >= 9 && b[8] == '{') return sniffed::safetensors;
  return sniffed::unknown;
}

const std::map<std::string, std::string> no_metadata;

}  // namespace

const char* to_string(checkpoint_format f) {
  switch (f) {
    case checkpoint_format::gguf: return "gguf";
    case checkpoint_format::safetensors: return "safetensors";
    case checkpoint_format::hf_directory: return "hf_directory";
  }
  return "?";
}

int64_t tensor_view::elements() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

checkpoint::~checkpoint() = default;

std::vector<uint64_t> checkpoint::header_bytes() const {
  if (format_ == checkpoint_format::gguf) return {gguf_->data_offset()};
  std::vector<uint64_t> out;
  std::error_code ec;
  if (!config_path_.empty()) out.push_back(config_json_.size());
  if (!index_path_.empty()) out.push_back(std::filesystem::file_size(index_path_, ec));
  if (shards_)
    for (const auto& v : shards_->views()) out.push_back(v.data_offset());
  return out;
}

std::optional<file_location> checkpoint::locate(std::span<const uint8_t> bytes) const {
  const auto inside = [&](std::span<const uint8_t> file) {
    return !file.empty() && bytes.data() >= file.data() && bytes.data() + bytes.size() <= file.data() + file.size();
  };
  if (format_ == checkpoint_format::gguf) {
    if (!inside(gguf_file_.bytes())) return std::nullopt;
    return file_location{0, static_cast<uint64_t>(bytes.data() - gguf_file_.bytes().data())};
  }
  if (!shards_) return std::nullopt;
  const size_t first = (config_path_.empty() ? 0 : 1) + (index_path_.empty() ? 0 : 1);
  const auto& mapped = shards_->files();
  for (size_t k = 0; k < mapped.size(); ++k)
    if (inside(mapped[k].bytes())) return file_location{first + k, static_cast<uint64_t>(bytes.data() - mapped[k].bytes().data())};
  return std::nullopt;
}

std::vector<std::filesystem::path> checkpoint::files() const {
  if (format_ == checkpoint_format::gguf) return {path_};
  std::vector<std::filesystem::path> out;
  if (!config_path_.empty()) out.push_back(config_path_);
  if (!index_path_.empty()) out.push_back(index_path_);
  if (shards_)
    for (const auto& f : shards_->files()) out.push_back(f.path());
  return out;
}

expected<checkpoint> checkpoint::open(const std::filesystem::path& path) {
  checkpoint c;
  c.path_ = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    c.format_ = checkpoint_format::hf_directory;
    c.config_path_ = path / "config.json";
    if (!std::filesystem::exists(c.config_path_, ec))
      return make_error(error_code::not_found, path.string() + " is a directory without config.json (not a Hugging Face checkpoint)");
    auto config = mapped_file::open(c.config_path_);
    if (!config) return forward_error(config);
    const auto bytes = config->bytes();
    c.config_json_.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const auto doc = nlohmann::json::parse(c.config_json_, nullptr, false);
    if (doc.is_discarded() || !doc.is_object())
      return make_error(error_code::decode_error, c.config_path_.string() + ": not a JSON object");
    const auto index = path / "model.safetensors.index.json";
    const auto single = path / "model.safetensors";
    if (!std::filesystem::exists(index, ec) && !std::filesystem::exists(single, ec))
      return make_error(error_code::not_found, path.string() + " holds neither model.safetensors.index.json nor model.safetensors");
    const bool sharded = std::filesystem::exists(index, ec);
    if (sharded) c.index_path_ = index;
    auto shards = sharded ? safetensors_shards::open_index(index) : safetensors_shards::open_file(single);
    if (!shards) return forward_error(shards);
    c.take_safetensors(std::move(*shards));
    return c;
  }

  auto file = mapped_file::open(path);
  if (!file) return forward_error(file);
  const auto kind = sniff(file->bytes());
  const auto ext = path.extension();
  if (kind == sniffed::gguf || (kind == sniffed::unknown && ext == ".gguf")) {
    c.format_ = checkpoint_format::gguf;
    auto g = gguf_view::parse(file->bytes(), path.string());
    if (!g) return forward_error(g);
    c.gguf_file_ = std::move(*file);
    c.gguf_ = std::make_unique<gguf_view>(std::move(*g));
    // Everything but the data section is read through once at open; the data is read when a
    // device loads it, a tensor at a time.
    c.gguf_file_.advise(access_hint::random, c.gguf_file_.bytes().first(std::min<size_t>(c.gguf_file_.size(), c.gguf_->data_offset())));
    for (const auto& t : c.gguf_->tensors()) {
      tensor_view v;
      v.name = std::string(t.name);
      v.type = t.type;
      v.shape.assign(t.ne.rend() - t.n_dims, t.ne.rend());
      v.data = t.data;
      c.tensors_.push_back(std::move(v));
    }
    c.index();
    return c;
  }
  if (kind == sniffed::safetensors || ext == ".safetensors") {
    c.format_ = checkpoint_format::safetensors;
    auto shards = safetensors_shards::open_file(path);
    if (!shards) return forward_error(shards);
    c.take_safetensors(std::move(*shards));
    return c;
  }
  return make_error(error_code::decode_error, path.string() + ": neither a GGUF file (magic \"GGUF\") nor a safetensors file");
}

void checkpoint::take_safetensors(safetensors_shards shards) {
  shards_ = std::make_unique<safetensors_shards>(std::move(shards));
  for (const auto& view : shards_->views())
    for (const auto& t : view.tensors()) tensors_.push_back(tensor_view{t.name, t.type, t.shape, t.data});
  index();
}

void checkpoint::index() {
  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
}

const tensor_view* checkpoint::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name, [](const auto& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

expected<void> checkpoint::replace(std::string_view name, tensor_type type, std::vector<uint8_t> bytes) {
  const tensor_view* found = find(name);
  if (!found) return make_error(error_code::not_found, path_.string() + ": tensor " + quote_name(name) + " is missing");
  auto& t = const_cast<tensor_view&>(*found);  // ours: tensors_ is this object's
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  auto row = row_bytes(type, cols);
  if (!row) return forward_error(row);
  const auto want = static_cast<uint64_t>(*row) * static_cast<uint64_t>(t.elements() / std::max<int64_t>(cols, 1));
  if (bytes.size() != want)
    return make_error(error_code::shape_mismatch, path_.string() + ": replacing tensor " + quote_name(name) + ": " +
                                                      std::to_string(bytes.size()) + " bytes of " + to_string(type) + ", its shape " +
                                                      shape_string(t.shape) + " needs " + std::to_string(want));
  owned_.push_back(std::make_unique<std::vector<uint8_t>>(std::move(bytes)));
  t.type = type;
  t.data = std::span<const uint8_t>(owned_.back()->data(), owned_.back()->size());
  return {};
}

expected<const tensor_view*> checkpoint::require(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const tensor_view* t = find(name);
  if (!t) return make_error(error_code::not_found, path_.string() + ": tensor " + quote_name(name) + " is missing");
  if (t->shape != expected_shape)
    return make_error(error_code::shape_mismatch, path_.string() + ": tensor " + quote_name(name) + " has shape " + shape_string(t->shape) +
                                                      ", but the model needs " + shape_string(expected_shape));
  return t;
}

const std::map<std::string, std::string>& checkpoint::safetensors_metadata() const {
  if (!shards_ || shards_->views().empty()) return no_metadata;
  return shards_->views().front().metadata();
}

}  // namespace mesh::models
