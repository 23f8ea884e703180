#pragma once
/// Errors as values for every layer of meshnode.
///
/// Expected failures (bad input, network, device) travel as `mesh::expected<T>`; invariants are
/// asserts. `tl::expected` stands in for `std::expected`, which clang 14 with libstdc++ 12 lacks.
#include <string>
#include <tl/expected.hpp>

namespace mesh {

/// What kind of failure an error is; the message says what to do about it.
enum class error_code {
  invalid_argument,  ///< a caller passed something unusable
  shape_mismatch,    ///< tensor shapes do not fit the operation
  dtype_mismatch,    ///< tensor element types do not fit the operation
  invalid_graph,     ///< a graph breaks a structural rule (see validate())
  limit_exceeded,    ///< a size, count or rank bound was exceeded
  decode_error,      ///< bytes from a peer or file could not be parsed
  version_mismatch,  ///< a peer speaks another protocol version
  not_found,         ///< a named thing does not exist
  unsupported,       ///< valid, but this build or device cannot do it
  io_error,          ///< a file or socket operation failed
  network,           ///< a peer could not be reached or went away
  device,            ///< the compute device failed (lost, out of memory)
  timeout,           ///< something did not happen in time
  internal,          ///< a bug: please report it
  evicted,           ///< something cached on a peer is gone: send it again
  unavailable,       ///< cannot take the work now (stopping, busy elsewhere): try again later
};
/// Codes travel on the wire as their value: append only, and keep this the count.
inline constexpr int error_code_count = static_cast<int>(error_code::unavailable) + 1;

/// Short stable name of an error code, for logs and messages.
const char* to_string(error_code code);

/// An error a person can act on: a code and a sentence.
struct error {
  error_code code = error_code::internal;
  std::string message;

  /// "shape_mismatch: matmul: ..." for logs.
  std::string to_string() const;
};

template <class T>
using expected = tl::expected<T, error>;

/// `return make_error(error_code::x, "...")` from a function returning `expected<T>`.
inline tl::unexpected<error> make_error(error_code code, std::string message) {
  return tl::unexpected<error>(error{code, std::move(message)});
}

/// Converts an `expected<T>` holding an error into a return value of another `expected<U>`.
template <class T>
tl::unexpected<error> forward_error(const expected<T>& x) {
  return tl::unexpected<error>(x.error());
}

}  // namespace mesh
