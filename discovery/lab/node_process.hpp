#pragma once
// Runs discovery_node in a child process (own daemon through DBUS_SYSTEM_BUS_ADDRESS) and feeds
// its event lines into an event_log.
#include <sys/types.h>

#include <string>
#include <thread>

#include "discovery/lab/event_log.hpp"

namespace mesh::discovery::test {

class node_process {
 public:
  /// Starts `discovery_node <kind> <node id> <mesh id> <port> [name]` against `bus_address`;
  /// inside network namespace `netns` when given (as a node on that host would run).
  node_process(const std::string& kind, const announcement& self, const std::string& bus_address,
               const std::string& service_name = "", const std::string& netns = "");
  ~node_process();
  node_process(const node_process&) = delete;
  node_process& operator=(const node_process&) = delete;

  /// Closes its stdin (it withdraws and exits); waits, bounded, then kills it if need be.
  void stop();
  bool running() const { return pid_ > 0; }
  event_log& log() { return log_; }

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  std::thread reader_;
  event_log log_;
};

/// Path of the discovery_node executable (set at build time).
std::string discovery_node_path();

}  // namespace mesh::discovery::test
