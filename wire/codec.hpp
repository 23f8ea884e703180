#pragma once
/// The byte codec of everything that crosses the wire: a writer and a bounded reader.
///
/// Format: integers little-endian at their fixed width, bool as one byte (0 or 1), float and
/// double as their IEEE 754 bits (NaN, infinities and subnormals travel bit for bit), enums as
/// their underlying integer, strings and sequences as a u32 element count followed by the
/// elements, structs as their fields in the order their `fields()` overload names them.
///
/// A type takes part by one function that names its fields for both directions:
///
///   template <class F> void fields(F& f, hello& x) { f(x.incarnation, x.device_name); }
///
/// The reader is built for hostile input: it never reads past its span, refuses a count larger
/// than the bytes left could hold, and charges every allocation it makes (elements times their
/// in-memory size, string bytes) to a budget. The budget is a fixed multiple of the encoded size
/// (so a message cannot decode to far more memory than it took on the wire: a list of empty
/// strings is 4 bytes each encoded but 32 in memory) capped by what the receiver allows.
/// Enums are range-checked through an `enum_limit(E)` overload next to each enum type.
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"

namespace mesh {
struct graph_limits;  // graph/validate.hpp: what a graph inside a message may be (graph_payload)
}

namespace mesh::wire {

/// Decoded memory may reach this many times the encoded size (plus `decode_slack`).
inline constexpr size_t max_amplification = 16;
/// Small messages may always decode to this much (a hello's strings are larger in memory than on
/// the wire, and a fixed overhead must not refuse them).
inline constexpr size_t decode_slack = 64 << 10;

/// The most memory decoding `encoded_size` bytes may allocate under a receiver's budget.
inline size_t decode_budget(size_t encoded_size, size_t receiver_budget) {
  const size_t by_size = encoded_size * max_amplification + decode_slack;
  return by_size < receiver_budget ? by_size : receiver_budget;
}

template <class T>
concept enum_type = std::is_enum_v<T>;
template <class T>
concept byte_type = std::is_same_v<T, uint8_t> || std::is_same_v<T, char> || std::is_same_v<T, int8_t>;

/// Appends encodings to a byte vector. The one thing that cannot be written is a count past the
/// format's u32 (a list or string of 2^32 elements or more: only a message over 4 GiB has one);
/// fits() says whether every count did, and the caller refuses the bytes when not.
class writer {
 public:
  explicit writer(std::vector<uint8_t>& out) : out_(out) {}

  template <class... Ts>
  void operator()(const Ts&... xs) {
    (put(xs), ...);
  }

  bool fits() const { return fits_; }
  /// For nested encodings (a WireGraph inside a message) that found a count too large themselves.
  void mark_too_large() { fits_ = false; }

 private:
  void raw(const void* p, size_t n) {
    if (n == 0) return;
    // resize + memcpy rather than insert(end, b, b + n): GCC 12 at -O2 reports a false
    // -Wstringop-overflow for the inlined range insert into an empty vector.
    const size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }
  template <class T>
  void fixed(T x) {
    uint8_t b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(x) >> (8 * i));
    raw(b, sizeof b);
  }
  void count(size_t n) {
    if (n > UINT32_MAX) fits_ = false;
    fixed(static_cast<uint32_t>(n));
  }

  void put(bool x) { out_.push_back(x ? 1 : 0); }
  template <class T>
    requires std::is_integral_v<T>
  void put(T x) {
    fixed(static_cast<std::make_unsigned_t<T>>(x));
  }
  void put(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    fixed(bits);
  }
  void put(double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    fixed(bits);
  }
  template <enum_type E>
  void put(E x) {
    put(static_cast<std::underlying_type_t<E>>(x));
  }
  void put(const std::string& s) {
    count(s.size());
    raw(s.data(), s.size());
  }
  template <byte_type B>
  void put(const std::vector<B>& v) {
    count(v.size());
    raw(v.data(), v.size());
  }
  template <byte_type B, size_t N>
  void put(const std::array<B, N>& a) {
    raw(a.data(), N);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    count(v.size());
    for (const auto& x : v) put(x);
  }
  template <class T>
    requires(std::is_class_v<T>)
  void put(const T& x) {
    fields(*this, const_cast<T&>(x));  // fields() names members for both directions; writing reads only
  }
  std::vector<uint8_t>& out_;
  bool fits_ = true;
};

/// Encodes values with fields() overloads (or plain ones) into fresh bytes.
template <class... Ts>
std::vector<uint8_t> encode_values(const Ts&... xs) {
  std::vector<uint8_t> out;
  writer w(out);
  w(xs...);
  return out;
}

/// The fewest bytes a T takes on the wire: what a default-constructed one takes (every variable
/// part of the format, a string or a list, is empty by default).
template <class T>
size_t min_encoded_size() {
  static const size_t size = [] {
    const size_t n = encode_values(T{}).size();
    return n > 0 ? n : size_t{1};
  }();
  return size;
}

/// Reads encodings from a byte span, within an allocation budget. The first failure sticks: later
/// reads do nothing, and `error()` says what failed at which byte.
class reader {
 public:
  reader(const uint8_t* data, size_t size, size_t budget) : begin_(data), p_(data), end_(data + size), budget_(budget) {}
  /// A reader for messages that carry graphs: they are validated against `limits` as they are
  /// decoded (wire/graph_payload.hpp).
  reader(const uint8_t* data, size_t size, size_t budget, const graph_limits* limits) : reader(data, size, budget) {
    limits_ = limits;
  }

  template <class... Ts>
  void operator()(Ts&... xs) {
    (get(xs), ...);
  }

  bool ok() const { return failure_.empty(); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  /// Bytes of memory charged so far.
  size_t allocated() const { return allocated_; }
  /// Charges `bytes` of memory a nested decoder will take to the budget (false: over it).
  bool spend(size_t bytes) { return charge(bytes); }
  /// The limits graphs inside the message are checked against (null: graph_limits{}).
  const graph_limits* limits() const { return limits_; }
  /// The next `n` bytes, in place (null when fewer remain: the input is then marked truncated).
  /// For a nested encoding decoded by its own reader, which bounds its own allocations.
  const uint8_t* view(size_t n) {
    if (!ok()) return nullptr;
    if (remaining() < n) {
      fail("truncated input");
      return nullptr;
    }
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  /// Marks the input bad (used by decoders for checks of their own); keeps the first failure.
  void fail(std::string why) {
    if (ok()) failure_ = std::move(why) + " at byte " + std::to_string(offset()) + " of " + std::to_string(offset() + remaining());
  }
  /// Why decoding failed, with the byte offset; error_code::limit_exceeded when the budget ran
  /// out, else decode_error.
  mesh::error error() const { return {over_budget_ ? error_code::limit_exceeded : error_code::decode_error, failure_}; }

 private:
  bool take(void* dst, size_t n) {
    if (!ok()) return false;
    if (remaining() < n) {
      fail("truncated input");
      return false;
    }
    if (n) std::memcpy(dst, p_, n);
    p_ += n;
    return true;
  }
  template <class T>
  bool fixed(T& x) {
    uint8_t b[sizeof(T)];
    if (!take(b, sizeof b)) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    x = static_cast<T>(v);
    return true;
  }
  /// Reads a count of elements that take at least `min_encoded` bytes each and `in_memory` bytes
  /// each once decoded; charges them to the budget.
  bool count(size_t& n, size_t min_encoded, size_t in_memory) {
    uint32_t c = 0;
    if (!fixed(c)) return false;
    n = c;
    if (min_encoded && n > remaining() / min_encoded) {
      fail("a count of " + std::to_string(n) + " elements is more than the input holds");
      return false;
    }
    return charge(n * in_memory);
  }
  bool charge(size_t bytes) {
    if (bytes > budget_ - allocated_) {
      over_budget_ = true;
      fail("decoding would allocate more than the budget of " + std::to_string(budget_) + " bytes");
      return false;
    }
    allocated_ += bytes;
    return true;
  }

  void get(bool& x) {
    uint8_t b = 0;
    if (!fixed(b)) return;
    if (b > 1) return fail("a bool of value " + std::to_string(b));
    x = b == 1;
  }
  template <class T>
    requires std::is_integral_v<T>
  void get(T& x) {
    std::make_unsigned_t<T> u{};
    if (fixed(u)) x = static_cast<T>(u);
  }
  void get(float& x) {
    uint32_t bits = 0;
    if (fixed(bits)) std::memcpy(&x, &bits, sizeof x);
  }
  void get(double& x) {
    uint64_t bits = 0;
    if (fixed(bits)) std::memcpy(&x, &bits, sizeof x);
  }
  template <enum_type E>
  void get(E& x) {
    std::underlying_type_t<E> u{};
    get(u);
    if (!ok()) return;
    if (static_cast<uint64_t>(u) >= static_cast<uint64_t>(enum_limit(E{})))
      return fail("enum value " + std::to_string(static_cast<uint64_t>(u)) + " out of range");
    x = static_cast<E>(u);
  }
  void get(std::string& s) {
    size_t n = 0;
    if (!count(n, 1, 1)) return;
    s.resize(n);
    take(s.data(), n);
  }
  template <byte_type B>
  void get(std::vector<B>& v) {
    size_t n = 0;
    if (!count(n, 1, 1)) return;
    v.resize(n);
    take(v.data(), n);
  }
  template <byte_type B, size_t N>
  void get(std::array<B, N>& a) {
    take(a.data(), N);
  }
  template <class T>
  void get(std::vector<T>& v) {
    size_t n = 0;
    // A count is checked against the least an element can take on the wire (what a default
    // element takes: fixed fields at their width, empty strings and lists at 4), so a false
    // count cannot make the reserve below larger than the memory its bytes could fill anyway.
    if (!count(n, min_encoded_size<T>(), sizeof(T))) return;
    v.clear();
    v.reserve(n);
    for (size_t i = 0; i < n && ok(); ++i) get(v.emplace_back());
  }
  template <class T>
    requires(std::is_class_v<T>)
  void get(T& x) {
    fields(*this, x);
  }

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  size_t budget_;
  size_t allocated_ = 0;
  const graph_limits* limits_ = nullptr;
  bool over_budget_ = false;
  std::string failure_;
};



/// A node id travels as its 32 key bytes.
template <class F>
void fields(F& f, node_id& x) {
  f(x.key);
}

}  // namespace mesh::wire
