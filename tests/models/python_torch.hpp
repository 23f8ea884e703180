#pragma once
// The python3 the PyTorch references (ref_llm.py, ref_train.py) run under.
#include <cstdlib>
#include <string>
#include <vector>

#include "run_command.hpp"

namespace mesh::test {

/// A python3 with torch and numpy, or "" and `why` there is none ($MESH_PYTHON is tried first).
inline std::string python_with_torch(std::string& why) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("MESH_PYTHON")) candidates.emplace_back(p);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const auto& p : candidates)
    // find_spec looks the modules up without importing them (importing torch takes seconds).
    if (run_command(p + " -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec(\"torch\") and "
                        "u.find_spec(\"numpy\")))'").status == 0)
      return p;
  why = "no python3 with torch and numpy (tried $MESH_PYTHON, python3, /usr/bin/python3; apt install python3-torch)";
  return {};
}

}  // namespace mesh::test
