#pragma once
// What the serving process tests share: a node's HTTP API address and meshctl against a node.
// Needs MESHCTL_BIN (the test target defines it).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "run_command.hpp"

namespace mesh::test {

/// The API's URL a node wrote to <state>/api, once it did (waits up to a minute).
inline std::string api_url(const std::filesystem::path& state) {
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(state / "api");
    std::string line;
    if (std::getline(f, line) && !line.empty()) return line;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("no " << (state / "api") << " was written");
  return {};
}

/// meshctl with `args` (shell words) against the node whose state directory is `state`; standard
/// output and standard error together.
inline command_result meshctl(const std::filesystem::path& state, const std::string& args) {
  return run_command(std::string(MESHCTL_BIN) + " --state-dir " + state.string() + " " + args + " 2>&1");
}

}  // namespace mesh::test
