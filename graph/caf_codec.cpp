#include "graph/caf_codec.hpp"

#include <caf/error.hpp>

#include <cstring>

namespace mesh {

bounded_deserializer::bounded_deserializer(const char* data, size_t size)
    : integer_forwarding(data, size) {}

caf::error bounded_deserializer::begin_object(uint16_t& typenr, std::string& name) {
  // Only built-in type numbers are used by our messages; a type name would be read unbounded.
  if (auto err = inner_.apply(typenr)) return err;
  if (typenr != 0) return caf::none;
  return apply_impl(name);
}

caf::error bounded_deserializer::end_object() { return caf::none; }

caf::error bounded_deserializer::begin_sequence(size_t& list_size) {
  if (auto err = inner_.begin_sequence(list_size)) return err;
  if (list_size > inner_.remaining()) return caf::make_error(caf::sec::end_of_stream);
  return caf::none;
}

caf::error bounded_deserializer::end_sequence() { return caf::none; }

caf::error bounded_deserializer::apply_raw(size_t num_bytes, void* data) { return inner_.apply_raw(num_bytes, data); }

caf::error bounded_deserializer::apply_impl(long double& x) { return inner_(x); }

caf::error bounded_deserializer::apply_impl(float& x) {
  uint32_t bits = 0;
  if (auto err = inner_(bits)) return err;
  std::memcpy(&x, &bits, sizeof x);
  return caf::none;
}

caf::error bounded_deserializer::apply_impl(double& x) {
  uint64_t bits = 0;
  if (auto err = inner_(bits)) return err;
  std::memcpy(&x, &bits, sizeof x);
  return caf::none;
}

ieee_serializer::ieee_serializer(std::vector<char>& buf)
    : integer_forwarding(buf) {}

caf::error ieee_serializer::apply_impl(float& x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof x);
  return inner_(bits);
}

caf::error ieee_serializer::apply_impl(double& x) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof x);
  return inner_(bits);
}

caf::error bounded_deserializer::apply_impl(std::string& x) {
  size_t n = 0;
  if (auto err = begin_sequence(n)) return err;
  x.resize(n);
  return n ? inner_.apply_raw(n, x.data()) : caf::none;
}

caf::error bounded_deserializer::apply_impl(std::u16string& x) {
  size_t n = 0;
  if (auto err = begin_sequence(n)) return err;
  if (n > inner_.remaining() / 2) return caf::make_error(caf::sec::end_of_stream);
  x.resize(n);
  for (auto& c : x)
    if (auto err = inner_(c)) return err;
  return caf::none;
}

caf::error bounded_deserializer::apply_impl(std::u32string& x) {
  size_t n = 0;
  if (auto err = begin_sequence(n)) return err;
  if (n > inner_.remaining() / 4) return caf::make_error(caf::sec::end_of_stream);
  x.resize(n);
  for (auto& c : x)
    if (auto err = inner_(c)) return err;
  return caf::none;
}

}  // namespace mesh
