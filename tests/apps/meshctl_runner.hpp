#pragma once
// Runs the meshctl binary the test target names (MESHCTL_BIN) against a local node's state
// directory, its standard output and standard error apart.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace mesh::test {

struct ctl_result {
  int status = -1;
  std::string out, err;  ///< standard output and standard error, apart
};

/// Runs meshctl with `args` (shell words) against the node whose state directory is `state`.
inline ctl_result meshctl(const std::filesystem::path& state, const std::string& args) {
  const auto err_file = state / "meshctl.err";
  const std::string cmd = std::string(MESHCTL_BIN) + " --state-dir " + state.string() + " " + args + " 2>" + err_file.string();
  ctl_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return r;
}

}  // namespace mesh::test
