#include "discovery/backend.hpp"

namespace mesh::discovery {

backend::~backend() = default;

}  // namespace mesh::discovery
