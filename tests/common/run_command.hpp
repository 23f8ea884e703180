#pragma once
// Runs a shell command for a test and keeps what it printed (stdout and stderr together).
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mesh::test {

struct command_result {
  int status = -1;  ///< exit status; 128 when it did not exit normally, -1 when it did not start
  std::string output;
};

inline command_result run_command(const std::string& command) {
  command_result r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

}  // namespace mesh::test
