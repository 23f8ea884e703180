#include "graph/safetensors.hpp"

#include "base/durable_file.hpp"

#include <cstring>
#include <fstream>

namespace mesh {
namespace {

const char* st_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
    default: break;  // safetensors has no block-quantized dtypes: such a tensor reads back as an error
  }
  return "?";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// A JSON reader for the subset a safetensors header uses: objects, arrays, strings, integers.
class json_reader {
 public:
  json_reader(const char* p, size_t n) : p_(p), end_(p + n) {}

  expected<void> expect(char c) {
    skip();
    if (p_ >= end_ || *p_ != c) return fail(std::string("expected '") + c + "'");
    ++p_;
    return {};
  }
  bool peek(char c) {
    skip();
    return p_ < end_ && *p_ == c;
  }
  expected<std::string> string() {
    if (auto ok = expect('"'); !ok) return tl::unexpected(ok.error());
    std::string out;
    while (p_ < end_ && *p_ != '"') {
      if (*p_ == '\\') {
        if (++p_ >= end_) break;
        const char e = *p_++;
        if (e == 'u') {
          if (end_ - p_ < 4) return fail("bad \\u escape");
          const unsigned v = static_cast<unsigned>(std::strtoul(std::string(p_, 4).c_str(), nullptr, 16));
          p_ += 4;
          if (v < 0x80) out += static_cast<char>(v);
          else if (v < 0x800) out += {static_cast<char>(0xc0 | (v >> 6)), static_cast<char>(0x80 | (v & 0x3f))};
          else out += {static_cast<char>(0xe0 | (v >> 12)), static_cast<char>(0x80 | ((v >> 6) & 0x3f)), static_cast<char>(0x80 | (v & 0x3f))};
        } else {
          out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
        }
      } else {
        out += *p_++;
      }
    }
    if (p_ >= end_) return fail("unterminated string");
    ++p_;
    return out;
  }
  expected<int64_t> integer() {
    skip();
    const char* start = p_;
    if (p_ < end_ && *p_ == '-') ++p_;
    int64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      if (v > (int64_t{1} << 53)) return fail("integer too large");
      v = v * 10 + (*p_++ - '0');
    }
    if (p_ == start || (p_ == start + 1 && *start == '-')) return fail("expected an integer");
    return *start == '-' ? -v : v;
  }
  expected<std::vector<int64_t>> integers() {
    std::vector<int64_t> out;
    if (auto ok = expect('['); !ok) return tl::unexpected(ok.error());
    if (peek(']')) return ++p_, out;
    for (;;) {
      auto v = integer();
      if (!v) return tl::unexpected(v.error());
      if (out.size() > 64) return fail("array too long");
      out.push_back(*v);
      if (peek(',')) { ++p_; continue; }
      if (auto ok = expect(']'); !ok) return tl::unexpected(ok.error());
      return out;
    }
  }
  bool at_end() {
    skip();
    return p_ >= end_;
  }
  size_t offset(const char* base) const { return static_cast<size_t>(p_ - base); }
  tl::unexpected<error> fail(const std::string& what) const {
    return make_error(error_code::decode_error, "safetensors header: " + what);
  }

 private:
  void skip() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  const char* p_;
  const char* end_;
};

expected<dtype> dtype_of(const std::string& s) {
  if (s == "F32") return dtype::f32;
  if (s == "F16") return dtype::f16;
  if (s == "BF16") return dtype::bf16;
  if (s == "I32") return dtype::i32;
  return make_error(error_code::unsupported, "safetensors dtype " + s + " is not one of F32, F16, BF16, I32");
}

}  // namespace

std::vector<uint8_t> encode_safetensors(const checkpoint& c) {
  std::string header = "{";
  bool first = true;
  if (!c.metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : c.metadata) {
      if (!first) header += ",";
      header += json_string(k) + ":" + json_string(v);
      first = false;
    }
    header += "}";
  }
  size_t offset = 0;
  for (const auto& [name, t] : c.tensors) {
    if (header.size() > 1) header += ",";
    header += json_string(name) + ":{\"dtype\":\"" + st_name(t.type) + "\",\"shape\":[";
    for (size_t i = 0; i < t.dims.size(); ++i) header += (i ? "," : "") + std::to_string(t.dims[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  header += "}";
  while (header.size() % 8) header += ' ';  // the format aligns the data to 8 bytes
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (const auto& [name, t] : c.tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

expected<checkpoint> decode_safetensors(const uint8_t* data, size_t size) {
  if (size < 8) return make_error(error_code::decode_error, "not a safetensors file: shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | data[i];
  if (n > size - 8) return make_error(error_code::decode_error, "safetensors header of " + std::to_string(n) + " bytes runs past the end of the file");
  const char* h = reinterpret_cast<const char*>(data + 8);
  const uint8_t* body = data + 8 + n;
  const size_t body_size = size - 8 - static_cast<size_t>(n);
  json_reader r(h, static_cast<size_t>(n));
  checkpoint c;
  if (auto ok = r.expect('{'); !ok) return tl::unexpected(ok.error());
  if (!r.peek('}')) {
    for (;;) {
      auto key = r.string();
      if (!key) return tl::unexpected(key.error());
      if (auto ok = r.expect(':'); !ok) return tl::unexpected(ok.error());
      if (auto ok = r.expect('{'); !ok) return tl::unexpected(ok.error());
      if (*key == "__metadata__") {
        while (!r.peek('}')) {
          auto k = r.string();
          if (!k) return tl::unexpected(k.error());
          if (auto ok = r.expect(':'); !ok) return tl::unexpected(ok.error());
          auto v = r.string();
          if (!v) return tl::unexpected(v.error());
          c.metadata[*k] = *v;
          if (r.peek(',')) (void)r.expect(',');
        }
        (void)r.expect('}');
      } else {
        std::string type_name;
        std::vector<int64_t> dims, offsets;
        bool has_type = false, has_shape = false, has_offsets = false;
        while (!r.peek('}')) {
          auto field = r.string();
          if (!field) return tl::unexpected(field.error());
          if (auto ok = r.expect(':'); !ok) return tl::unexpected(ok.error());
          if (*field == "dtype") {
            auto v = r.string();
            if (!v) return tl::unexpected(v.error());
            type_name = *v;
            has_type = true;
          } else if (*field == "shape" || *field == "data_offsets") {
            auto v = r.integers();
            if (!v) return tl::unexpected(v.error());
            (*field == "shape" ? dims : offsets) = *v;
            (*field == "shape" ? has_shape : has_offsets) = true;
          } else {
            return r.fail("unknown field \"" + *field + "\" of tensor \"" + *key + "\"");
          }
          if (r.peek(',')) (void)r.expect(',');
        }
        (void)r.expect('}');
        if (!has_type || !has_shape || !has_offsets || offsets.size() != 2)
          return r.fail("tensor \"" + *key + "\" needs dtype, shape and data_offsets [begin, end]");
        auto type = dtype_of(type_name);
        if (!type) return tl::unexpected(type.error());
        const int64_t count = bounded_element_count(dims, int64_t{1} << 40);
        if (count < 0) return r.fail("tensor \"" + *key + "\" has an absurd shape");
        const int64_t bytes = count * static_cast<int64_t>(size_of(*type));
        if (offsets[0] < 0 || offsets[1] < offsets[0] || static_cast<uint64_t>(offsets[1]) > body_size || offsets[1] - offsets[0] != bytes)
          return r.fail("tensor \"" + *key + "\": data_offsets do not match its shape or the file");
        if (c.tensors.count(*key)) return r.fail("tensor \"" + *key + "\" appears twice");
        tensor t;
        t.type = *type;
        t.dims = shape(dims.begin(), dims.end());
        t.bytes.assign(body + offsets[0], body + offsets[1]);
        c.tensors[*key] = std::move(t);
      }
      if (r.peek(',')) {
        (void)r.expect(',');
        continue;
      }
      break;
    }
  }
  if (auto ok = r.expect('}'); !ok) return tl::unexpected(ok.error());
  if (!r.at_end()) return r.fail("trailing characters");
  return c;
}

expected<void> save_safetensors(const std::filesystem::path& path, const checkpoint& c) {
  const auto bytes = encode_safetensors(c);
  // Temp file, fsync, rename, fsync the directory: a crash or power cut leaves the previous
  // checkpoint or this one, never a torn file under the checkpoint's name.
  return write_file_durably(path, std::span<const char>(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

expected<checkpoint> load_safetensors(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(error_code::io_error, "cannot read " + path.string());
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto c = decode_safetensors(bytes.data(), bytes.size());
  if (!c) return make_error(c.error().code, path.string() + ": " + c.error().message);
  return c;
}

}  // namespace mesh
