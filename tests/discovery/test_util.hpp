#pragma once
// Helpers shared by discovery's unit tests.
#include <string>

#include "discovery/types.hpp"

namespace mesh::discovery::test {

/// A valid node id made of one repeated hex digit.
inline std::string node_id(char digit) { return std::string(64, digit); }

/// A valid announcement of mesh "mesh-a", protocol 1.
inline announcement make_announcement(char digit, uint16_t port = 4000, std::string mesh = "mesh-a") {
  return {node_id(digit), std::move(mesh), 1, port, "cpu test"};
}

}  // namespace mesh::discovery::test
