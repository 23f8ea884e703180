#pragma once
/// Encoding and decoding of any inspectable value with CAF's binary format, safe for hostile input.
///
/// CAF 0.17's binary_deserializer resizes strings and byte vectors to whatever length the input
/// claims before reading them, so 8 hostile bytes could make a node allocate terabytes. The
/// `bounded_deserializer` here refuses any sequence longer than the bytes that remain (every
/// element takes at least one byte), so memory stays bounded by the input size.
///
/// Floating-point values travel as their IEEE 754 bits (`ieee_serializer`). CAF 0.17's own
/// packing (pack754) halves a value until it is below 2, which never ends for infinity: a
/// training whose loss diverged, or a peer's message with an infinity that a node passed on,
/// hung the thread encoding it (found by fuzz_messages, which re-encodes what it decodes).
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/sec.hpp>

#include <string>
#include <utility>
#include <vector>

#include "graph/error.hpp"

namespace mesh {

/// What both codecs below leave to CAF's binary codec unchanged: the integers. `Base` is
/// caf::deserializer or caf::serializer (separate base classes in CAF 0.17, hence a template),
/// `Inner` the binary codec of that direction, built from `args` after its null context.
template <class Base, class Inner>
class integer_forwarding : public Base {
 protected:
  template <class... Args>
  explicit integer_forwarding(Args&&... args)
      : Base(static_cast<caf::execution_unit*>(nullptr)), inner_(nullptr, std::forward<Args>(args)...) {}

  caf::error apply_impl(int8_t& x) override { return inner_(x); }
  caf::error apply_impl(uint8_t& x) override { return inner_(x); }
  caf::error apply_impl(int16_t& x) override { return inner_(x); }
  caf::error apply_impl(uint16_t& x) override { return inner_(x); }
  caf::error apply_impl(int32_t& x) override { return inner_(x); }
  caf::error apply_impl(uint32_t& x) override { return inner_(x); }
  caf::error apply_impl(int64_t& x) override { return inner_(x); }
  caf::error apply_impl(uint64_t& x) override { return inner_(x); }

  Inner inner_;
};

/// A caf::deserializer over a byte span that never allocates more than the span's size.
class bounded_deserializer final : public integer_forwarding<caf::deserializer, caf::binary_deserializer> {
 public:
  bounded_deserializer(const char* data, size_t size);

  size_t remaining() const noexcept { return inner_.remaining(); }

  caf::error begin_object(uint16_t& typenr, std::string& name) override;
  caf::error end_object() override;
  caf::error begin_sequence(size_t& list_size) override;
  caf::error end_sequence() override;
  caf::error apply_raw(size_t num_bytes, void* data) override;

 protected:
  using integer_forwarding::apply_impl;
  caf::error apply_impl(float& x) override;   // IEEE 754 bits (see the file comment)
  caf::error apply_impl(double& x) override;  // IEEE 754 bits
  caf::error apply_impl(long double& x) override;
  caf::error apply_impl(std::string& x) override;
  caf::error apply_impl(std::u16string& x) override;
  caf::error apply_impl(std::u32string& x) override;
};

/// caf::binary_serializer's format, except that float and double are written as their IEEE 754
/// bits (what bounded_deserializer reads).
class ieee_serializer final : public integer_forwarding<caf::serializer, caf::binary_serializer> {
 public:
  explicit ieee_serializer(std::vector<char>& buf);

  caf::error begin_object(uint16_t& typenr, std::string& name) override { return inner_.begin_object(typenr, name); }
  caf::error end_object() override { return inner_.end_object(); }
  caf::error begin_sequence(size_t& list_size) override { return inner_.begin_sequence(list_size); }
  caf::error end_sequence() override { return inner_.end_sequence(); }
  caf::error apply_raw(size_t num_bytes, void* data) override { return inner_.apply_raw(num_bytes, data); }

 protected:
  using integer_forwarding::apply_impl;
  caf::error apply_impl(float& x) override;
  caf::error apply_impl(double& x) override;
  caf::error apply_impl(long double& x) override { return inner_(x); }
  caf::error apply_impl(std::string& x) override { return inner_(x); }
  caf::error apply_impl(std::u16string& x) override { return inner_(x); }
  caf::error apply_impl(std::u32string& x) override { return inner_(x); }
};

/// Serializes `xs...` (each with an inspect overload) into bytes.
template <class... Ts>
expected<std::vector<char>> caf_encode(Ts&... xs) {
  std::vector<char> buf;
  ieee_serializer sink{buf};
  if (auto err = sink(xs...)) return make_error(error_code::internal, "cannot encode: " + caf::to_string(err));
  return buf;
}

/// Deserializes `xs...` from `src`, which must be consumed exactly; `what` names the message in
/// errors ("WireGraph: truncated or malformed at byte 40 of 52").
template <class... Ts>
expected<void> caf_decode(bounded_deserializer& src, size_t total, const char* what, Ts&... xs) {
  if (auto err = src(xs...))
    return make_error(error_code::decode_error, std::string(what) + ": truncated or malformed input at byte " +
                                                    std::to_string(total - src.remaining()) + " of " + std::to_string(total));
  return {};
}

}  // namespace mesh
