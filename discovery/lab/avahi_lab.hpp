#pragma once
// Private dbus + avahi-daemon instances for tests and benchmarks, one per network namespace with
// a private /run, optionally joined by a bridge: several mDNS "hosts" on one machine without
// touching the machine's own daemon or network. Needs root and iproute2; reason_unavailable()
// says why not. Names start with "mnd-<pid>-" so that parallel runs do not collide; namespaces
// left by a crashed run (its pid gone) are removed by the next one.
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mesh::discovery::lab {

/// Why these labs cannot run here, or nullopt when they can.
std::optional<std::string> reason_unavailable();

/// One mDNS host: a network namespace with its own dbus-daemon and avahi-daemon.
class host {
 public:
  /// Creates namespace "mnd-<pid>-<name>". With `bridge` empty, avahi uses loopback only;
  /// otherwise the host gets eth0 = `address` (/24) on that bridge namespace. With `ipv6`,
  /// eth0 also gets `ipv6_address` (/64) and avahi uses IPv6 too.
  host(std::string name, std::string bridge = "", std::string address = "", std::string ipv6_address = "");
  ~host();
  host(const host&) = delete;
  host& operator=(const host&) = delete;

  /// Starts dbus (if not running) and avahi-daemon; true when both are up.
  bool start_daemon();
  /// Stops avahi-daemon: SIGTERM (goodbye packets sent) or SIGKILL (records linger).
  void stop_avahi(bool hard = false);
  /// Stops dbus-daemon (which avahi-daemon then loses too).
  void stop_dbus();
  /// D-Bus address a client outside the namespace uses to reach this host's daemon.
  std::string bus_address() const;
  const std::string& netns() const { return netns_; }

 private:
  void kill_pidfile(const std::string& path, int sig);
  std::string name_, netns_, dir_, bridge_;
  bool loopback_only_;
};

/// A bridge namespace that hosts attach to (10.77.0.0/24 by convention of the tests).
class bridge {
 public:
  explicit bridge(std::string name);
  ~bridge();
  bridge(const bridge&) = delete;
  bridge& operator=(const bridge&) = delete;
  const std::string& netns() const { return netns_; }

 private:
  std::string netns_;
};

/// Runs a shell command; returns its exit status (-1 if it could not run).
int sh(const std::string& command);

/// Starts a shell command in the background; returns its pid (0 on failure) to stop it with
/// ::kill(pid, SIGTERM).
int spawn(const std::string& command);

}  // namespace mesh::discovery::lab
