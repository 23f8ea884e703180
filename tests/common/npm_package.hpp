#pragma once
// Installs an npm package into a test's build folder (once: later runs find it there), so that a
// test can run the ecosystem's own JavaScript code under Node.js against what meshnode made.
#include <filesystem>
#include <string>

#include "run_command.hpp"

namespace mesh::test {

struct npm_install_result {
  std::filesystem::path node_modules;  ///< set when the package is there
  std::string error;                   ///< otherwise why not (npm's output)
  bool unreachable = false;            ///< the registry could not be reached (a test may skip, saying so)
};

/// `name@range` installed under `dir` (npm install --prefix dir).
inline npm_install_result npm_package(const std::filesystem::path& dir, const std::string& name, const std::string& range) {
  npm_install_result r;
  if (std::filesystem::exists(dir / "node_modules" / name / "package.json")) {
    r.node_modules = dir / "node_modules";
    return r;
  }
  std::filesystem::create_directories(dir);
  auto npm = run_command("npm --version");
  if (npm.status != 0) {
    r.error = "npm is not installed (./dev.sh deps installs it): " + npm.output;
    return r;
  }
  auto install = run_command("cd '" + dir.string() + "' && npm install --no-audit --no-fund --no-save --prefix . '" + name + "@" + range +
                             "' --fetch-retries=1 --fetch-timeout=30000");
  if (install.status == 0 && std::filesystem::exists(dir / "node_modules" / name / "package.json")) {
    r.node_modules = dir / "node_modules";
    return r;
  }
  r.error = "npm install " + name + "@" + range + " failed:\n" + install.output;
  for (const char* sign : {"ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "ENETUNREACH", "network"})
    r.unreachable |= install.output.find(sign) != std::string::npos;
  return r;
}

}  // namespace mesh::test
