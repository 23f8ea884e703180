#include "models/gguf.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace mesh::models {
namespace {

constexpr uint32_t default_alignment = 32;

// Bytes of a fixed-size value type; 0 for string and array.
size_t fixed_size(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16: return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32: return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64: return 8;
    case gguf_value_type::string:
    case gguf_value_type::array: return 0;
  }
  return 0;
}

// The fewest bytes a value of the type takes; what bounds the count of an array before any element
// is read (a string is at least its length, an array its type and count).
size_t min_size(gguf_value_type t) {
  if (t == gguf_value_type::string) return 8;
  if (t == gguf_value_type::array) return 12;
  return fixed_size(t);
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(gguf_value_type::f64); }

uint64_t read_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

std::string quoted(std::string_view s) { return quote_name(s); }

// Reads the file front to back; every read checks the bytes that remain.
class cursor {
 public:
  explicit cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  size_t position() const { return pos_; }
  size_t size() const { return bytes_.size(); }
  size_t remaining() const { return bytes_.size() - pos_; }
  bool read(size_t n, uint64_t& v) {
    if (remaining() < n) return false;
    v = read_le(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool u32(uint32_t& v) {
    uint64_t w;
    if (!read(4, w)) return false;
    v = static_cast<uint32_t>(w);
    return true;
  }
  bool u64(uint64_t& v) { return read(8, v); }
  bool skip(uint64_t n) {
    if (remaining() < n) return false;
    pos_ += static_cast<size_t>(n);
    return true;
  }
  bool string(std::string_view& s) {
    uint64_t n;
    const size_t start = pos_;
    if (!u64(n) || remaining() < n) {
      pos_ = start;
      return false;
    }
    s = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  std::span<const uint8_t> since(size_t start) const { return bytes_.subspan(start, pos_ - start); }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// Walks over one encoded value without allocating; `what` names it for messages.
expected<void> skip_value(cursor& c, gguf_value_type type, int depth, const std::string& source, const std::string& what) {
  auto truncated = [&] {
    return make_error(error_code::decode_error,
                      source + ": truncated: the file ends inside " + what + " (at byte " + std::to_string(c.position()) + " of " +
                          std::to_string(c.size()) + ")");
  };
  if (const size_t n = fixed_size(type)) return c.skip(n) ? expected<void>{} : truncated();
  if (type == gguf_value_type::string) {
    std::string_view s;
    return c.string(s) ? expected<void>{} : truncated();
  }
  uint32_t element;
  uint64_t count;
  if (!c.u32(element) || !c.u64(count)) return truncated();
  if (!valid_type(element))
    return make_error(error_code::decode_error, source + ": " + what + " is an array of unknown value type " + std::to_string(element));
  const auto et = static_cast<gguf_value_type>(element);
  if (et == gguf_value_type::array && depth + 1 >= gguf_view::max_array_depth)
    return make_error(error_code::limit_exceeded, source + ": " + what + " nests arrays deeper than " +
                                                      std::to_string(gguf_view::max_array_depth) + " levels");
  const size_t least = min_size(et);
  if (count > c.remaining() / least)
    return make_error(error_code::decode_error, source + ": " + what + " claims " + std::to_string(count) + " elements of type " +
                                                    to_string(et) + ", more than the " + std::to_string(c.remaining()) +
                                                    " bytes that remain can hold");
  if (const size_t n = fixed_size(et)) return c.skip(count * n) ? expected<void>{} : truncated();
  for (uint64_t i = 0; i < count; ++i)
    if (auto ok = skip_value(c, et, depth + 1, source, what); !ok) return ok;
  return {};
}

}  // namespace

const char* to_string(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8: return "u8";
    case gguf_value_type::i8: return "i8";
    case gguf_value_type::u16: return "u16";
    case gguf_value_type::i16: return "i16";
    case gguf_value_type::u32: return "u32";
    case gguf_value_type::i32: return "i32";
    case gguf_value_type::f32: return "f32";
    case gguf_value_type::boolean: return "bool";
    case gguf_value_type::string: return "string";
    case gguf_value_type::array: return "array";
    case gguf_value_type::u64: return "u64";
    case gguf_value_type::i64: return "i64";
    case gguf_value_type::f64: return "f64";
  }
  return "?";
}

// ---- gguf_value ----

bool gguf_value::is_integer() const {
  switch (type_) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::u16:
    case gguf_value_type::i16:
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::u64:
    case gguf_value_type::i64: return true;
    default: return false;
  }
}

bool gguf_value::is_float() const { return type_ == gguf_value_type::f32 || type_ == gguf_value_type::f64; }

uint64_t gguf_value::as_u64() const {
  const size_t n = fixed_size(type_);
  if (n == 0 || encoded_.size() < n) return 0;
  return read_le(encoded_.data(), n);
}

int64_t gguf_value::as_i64() const {
  const uint64_t u = as_u64();
  switch (type_) {
    case gguf_value_type::i8: return static_cast<int8_t>(u);
    case gguf_value_type::i16: return static_cast<int16_t>(u);
    case gguf_value_type::i32: return static_cast<int32_t>(u);
    case gguf_value_type::i64: return static_cast<int64_t>(u);
    case gguf_value_type::u64: return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(u);
    default: return static_cast<int64_t>(u);
  }
}

double gguf_value::as_f64() const {
  if (type_ == gguf_value_type::f32) {
    const auto u = static_cast<uint32_t>(as_u64());
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  if (type_ == gguf_value_type::f64) {
    const uint64_t u = as_u64();
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  if (type_ == gguf_value_type::u64) return static_cast<double>(as_u64());
  return static_cast<double>(as_i64());
}

bool gguf_value::as_bool() const { return as_u64() != 0; }

std::string_view gguf_value::as_string() const {
  if (type_ != gguf_value_type::string || encoded_.size() < 8) return {};
  return {reinterpret_cast<const char*>(encoded_.data() + 8), encoded_.size() - 8};
}

gguf_value_type gguf_value::element_type() const {
  if (type_ != gguf_value_type::array || encoded_.size() < 12) return gguf_value_type::u8;
  return static_cast<gguf_value_type>(read_le(encoded_.data(), 4));
}

uint64_t gguf_value::size() const {
  if (type_ != gguf_value_type::array || encoded_.size() < 12) return 0;
  return read_le(encoded_.data() + 4, 8);
}

std::vector<gguf_value> gguf_value::elements() const {
  std::vector<gguf_value> out;
  if (type_ != gguf_value_type::array || encoded_.size() < 12) return out;
  // The array was walked when the file was parsed: every element is known to fit.
  const auto et = element_type();
  const uint64_t count = size();
  cursor c(encoded_.subspan(12));
  out.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    const size_t start = c.position();
    if (!skip_value(c, et, 1, {}, {})) break;
    out.emplace_back(et, c.since(start));
  }
  return out;
}

// ---- gguf_view ----

expected<gguf_view> gguf_view::parse(std::span<const uint8_t> bytes, std::string source) {
  gguf_view g;
  g.source_ = std::move(source);
  const std::string& src = g.source_;
  cursor c(bytes);
  auto truncated = [&](const std::string& what) {
    return make_error(error_code::decode_error,
                      src + ": truncated: the file ends inside " + what + " (at byte " + std::to_string(c.position()) + " of " +
                          std::to_string(bytes.size()) + ")");
  };

  if (bytes.size() < 4 || std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    std::string magic(reinterpret_cast<const char*>(bytes.data()), std::min<size_t>(bytes.size(), 4));
    return make_error(error_code::decode_error, src + ": not a GGUF file (it starts with " + quoted(magic) + ", not \"GGUF\")");
  }
  c.skip(4);
  uint64_t tensor_count = 0, kv_count = 0;
  if (!c.u32(g.version_)) return truncated("the header's version");
  if (g.version_ != 2 && g.version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(g.version_);
    if (swapped == 2 || swapped == 3)
      return make_error(error_code::unsupported, src + ": a big-endian GGUF file (version " + std::to_string(swapped) +
                                                     "); only little-endian files are supported");
    return make_error(error_code::unsupported,
                      src + ": GGUF version " + std::to_string(g.version_) + " is not supported (versions 2 and 3 are)");
  }
  if (!c.u64(tensor_count)) return truncated("the header's tensor count");
  if (!c.u64(kv_count)) return truncated("the header's metadata count");

  // Smallest encodings: a key/value is an empty key (8), a type (4) and a one-byte value; a tensor
  // info an empty name (8), n_dims (4), a type (4) and an offset (8).
  if (kv_count > c.remaining() / 13)
    return make_error(error_code::decode_error, src + ": the header claims " + std::to_string(kv_count) +
                                                    " metadata entries, more than the file's " + std::to_string(bytes.size()) +
                                                    " bytes can hold");
  if (tensor_count > c.remaining() / 24)
    return make_error(error_code::decode_error, src + ": the header claims " + std::to_string(tensor_count) +
                                                    " tensors, more than the file's " + std::to_string(bytes.size()) +
                                                    " bytes can hold");

  g.metadata_.reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string_view key;
    uint32_t type;
    if (!c.string(key)) return truncated("the key of metadata entry " + std::to_string(i));
    const std::string what = "metadata key " + quoted(key);
    if (!c.u32(type)) return truncated("the value type of " + what);
    if (!valid_type(type))
      return make_error(error_code::decode_error, src + ": " + what + " has unknown value type " + std::to_string(type));
    const size_t start = c.position();
    if (auto ok = skip_value(c, static_cast<gguf_value_type>(type), 0, src, what); !ok) return tl::unexpected(ok.error());
    if (!g.metadata_index_.emplace(key, g.metadata_.size()).second)
      return make_error(error_code::decode_error, src + ": " + what + " appears twice");
    g.metadata_.emplace_back(key, gguf_value(static_cast<gguf_value_type>(type), c.since(start)));
  }

  if (const gguf_value* a = g.find("general.alignment")) {
    if (a->type() != gguf_value_type::u32)
      return make_error(error_code::decode_error, src + ": metadata key \"general.alignment\" is a " + std::string(to_string(a->type())) +
                                                      ", not a u32");
    const uint64_t v = a->as_u64();
    if (v == 0 || (v & (v - 1)) != 0)
      return make_error(error_code::decode_error,
                        src + ": general.alignment is " + std::to_string(v) + ", not a power of two");
    g.alignment_ = static_cast<uint32_t>(v);
  } else {
    g.alignment_ = default_alignment;
  }

  g.tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    gguf_tensor_info t;
    if (!c.string(t.name)) return truncated("the name of tensor " + std::to_string(i));
    const std::string what = "tensor " + quoted(t.name);
    if (!c.u32(t.n_dims)) return truncated("the dimension count of " + what);
    if (t.n_dims > max_dims)
      return make_error(error_code::limit_exceeded, src + ": " + what + " has " + std::to_string(t.n_dims) +
                                                        " dimensions; at most " + std::to_string(max_dims) + " are supported");
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      uint64_t ne;
      if (!c.u64(ne)) return truncated("the dimensions of " + what);
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return make_error(error_code::decode_error, src + ": " + what + " has dimension " + std::to_string(ne) + ", beyond int64");
      t.ne[d] = static_cast<int64_t>(ne);
    }
    uint32_t type;
    if (!c.u32(type)) return truncated("the type of " + what);
    if (!c.u64(t.offset)) return truncated("the offset of " + what);
    auto tt = tensor_type_from_gguf(type);
    if (!tt) return make_error(tt.error().code, src + ": " + what + ": " + tt.error().message);
    t.type = *tt;
    if (!g.tensor_index_.emplace(t.name, g.tensors_.size()).second)
      return make_error(error_code::decode_error, src + ": " + what + " appears twice");
    g.tensors_.push_back(t);
  }

  const uint64_t end_of_infos = c.position();
  g.data_offset_ = (end_of_infos + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  const uint64_t data_size = g.data_offset_ <= bytes.size() ? bytes.size() - g.data_offset_ : 0;

  for (auto& t : g.tensors_) {
    const std::string what = "tensor " + quoted(t.name);
    auto row = row_bytes(t.type, t.ne[0]);
    if (!row) return make_error(error_code::decode_error, src + ": " + what + ": " + row.error().message);
    // Every factor is bounded by the file before multiplying, so no product overflows: a tensor
    // with more bytes than the file is an error whatever its exact size.
    uint64_t size = static_cast<uint64_t>(*row);
    bool too_big = size > bytes.size();
    for (int d = 1; d < 4 && !too_big; ++d) {
      const auto ne = static_cast<uint64_t>(t.ne[static_cast<size_t>(d)]);
      if (ne != 0 && size > bytes.size() / ne) too_big = true;
      else size *= ne;
    }
    if (too_big)
      return make_error(error_code::decode_error, src + ": " + what + " (" + to_string(t.type) + ", ne " + std::to_string(t.ne[0]) +
                                                      " x " + std::to_string(t.ne[1]) + " x " + std::to_string(t.ne[2]) + " x " +
                                                      std::to_string(t.ne[3]) + ") has more bytes than the whole file");
    if (t.offset % g.alignment_ != 0)
      return make_error(error_code::decode_error, src + ": " + what + " starts at data offset " + std::to_string(t.offset) +
                                                      ", not a multiple of the alignment " + std::to_string(g.alignment_));
    if (size > 0 && (t.offset > data_size || size > data_size - t.offset))
      return make_error(error_code::decode_error, src + ": " + what + " occupies bytes " + std::to_string(g.data_offset_ + t.offset) +
                                                      ".." + std::to_string(g.data_offset_ + t.offset + size) +
                                                      ", past the end of the file (" + std::to_string(bytes.size()) + " bytes)");
    t.data = size > 0 ? bytes.subspan(static_cast<size_t>(g.data_offset_ + t.offset), static_cast<size_t>(size))
                      : std::span<const uint8_t>{};
  }
  return g;
}

const gguf_tensor_info* gguf_view::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const gguf_value* gguf_view::find(std::string_view key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

expected<const gguf_value*> gguf_view::typed(std::string_view key) const {
  if (const gguf_value* v = find(key)) return v;
  return make_error(error_code::not_found, source_ + ": metadata key " + quoted(key) + " is missing");
}

tl::unexpected<error> gguf_view::wrong_type(std::string_view key, const gguf_value& v, const char* wanted) const {
  std::string got = to_string(v.type());
  if (v.type() == gguf_value_type::array) got += " of " + std::string(to_string(v.element_type()));
  return make_error(error_code::dtype_mismatch, source_ + ": metadata key " + quoted(key) + " is " + got + ", not " + wanted);
}

namespace {

// An integer value's range check shared by the accessors: false when it is not within [lo, hi].
bool integer_in(const gguf_value& v, int64_t lo, uint64_t hi) {
  if (v.type() == gguf_value_type::u64) return v.as_u64() <= hi;
  const int64_t x = v.as_i64();
  return x >= lo && (x < 0 || static_cast<uint64_t>(x) <= hi);
}

}  // namespace

expected<uint32_t> gguf_view::get_u32(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if (!(*v)->is_integer()) return wrong_type(key, **v, "an integer");
  if (!integer_in(**v, 0, std::numeric_limits<uint32_t>::max()))
    return make_error(error_code::invalid_argument, source_ + ": metadata key " + quoted(key) + " is out of the u32 range");
  return static_cast<uint32_t>((*v)->as_u64());
}

expected<uint64_t> gguf_view::get_u64(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if (!(*v)->is_integer()) return wrong_type(key, **v, "an integer");
  if (!integer_in(**v, 0, std::numeric_limits<uint64_t>::max()))
    return make_error(error_code::invalid_argument, source_ + ": metadata key " + quoted(key) + " is negative");
  return (*v)->type() == gguf_value_type::u64 ? (*v)->as_u64() : static_cast<uint64_t>((*v)->as_i64());
}

expected<int64_t> gguf_view::get_i64(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if (!(*v)->is_integer()) return wrong_type(key, **v, "an integer");
  if (!integer_in(**v, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    return make_error(error_code::invalid_argument, source_ + ": metadata key " + quoted(key) + " is out of the i64 range");
  return (*v)->as_i64();
}

expected<double> gguf_view::get_f64(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if (!(*v)->is_float() && !(*v)->is_integer()) return wrong_type(key, **v, "a number");
  return (*v)->as_f64();
}

expected<float> gguf_view::get_f32(std::string_view key) const {
  auto v = get_f64(key);
  if (!v) return forward_error(v);
  return static_cast<float>(*v);
}

expected<bool> gguf_view::get_bool(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if ((*v)->type() != gguf_value_type::boolean) return wrong_type(key, **v, "a bool");
  return (*v)->as_bool();
}

expected<std::string_view> gguf_view::get_string(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if ((*v)->type() != gguf_value_type::string) return wrong_type(key, **v, "a string");
  return (*v)->as_string();
}

expected<std::vector<std::string_view>> gguf_view::get_array_strings(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if ((*v)->type() != gguf_value_type::array || (*v)->element_type() != gguf_value_type::string)
    return wrong_type(key, **v, "an array of strings");
  std::vector<std::string_view> out;
  for (const auto& e : (*v)->elements()) out.push_back(e.as_string());
  return out;
}

expected<std::vector<float>> gguf_view::get_array_f32(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if ((*v)->type() != gguf_value_type::array) return wrong_type(key, **v, "an array of numbers");
  const gguf_value_type et = (*v)->element_type();
  if (et == gguf_value_type::string || et == gguf_value_type::array || et == gguf_value_type::boolean)
    return wrong_type(key, **v, "an array of numbers");
  std::vector<float> out;
  for (const auto& e : (*v)->elements()) out.push_back(static_cast<float>(e.as_f64()));
  return out;
}

expected<std::vector<int64_t>> gguf_view::get_array_i64(std::string_view key) const {
  auto v = typed(key);
  if (!v) return forward_error(v);
  if ((*v)->type() != gguf_value_type::array) return wrong_type(key, **v, "an array of integers");
  std::vector<int64_t> out;
  const auto elements = (*v)->elements();
  for (const auto& e : elements) {
    if (!e.is_integer()) return wrong_type(key, **v, "an array of integers");
    if (e.type() == gguf_value_type::u64 && e.as_u64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return make_error(error_code::invalid_argument, source_ + ": metadata key " + quoted(key) + " holds a value beyond int64");
    out.push_back(e.as_i64());
  }
  return out;
}

}  // namespace mesh::models
