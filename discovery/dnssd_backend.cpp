// The Bonjour dns_sd.h backend (macOS; on Linux it runs on avahi-compat-libdns_sd, which warns
// on stderr unless AVAHI_COMPAT_NOWARN=1 is set). A thin shell around browse_state: one thread
// owns every DNSServiceRef and polls their sockets; browse -> resolve (SRV+TXT) -> query A/AAAA
// of the target host -> browse_state. dns_sd refs are not thread-safe, hence the one thread.
//
// avahi-compat 0.8 (Debian 12) allocates each DNSServiceRef uninitialised (avahi_new, not
// avahi_new0). When the daemon goes away, the failure handler of a resolve or query ref
// (compat.c generic_client_callback) calls the first non-null of its callback pointers, and the
// browse callback it tries first is garbage there: the process jumps to it and crashes inside
// DNSServiceProcessResult. Any lookup open at the moment the daemon stops or restarts did that.
// Upstream fixed it after 0.8 (avahi commit dffd549f, "libdns_sd: Use allocator with memory set
// to zero"); for the releases without that fix, use_zeroing_avahi_allocator() below does the same
// from here. With it a failing lookup reports kDNSServiceErr_Unknown to its own callback, which
// releases it.
//
// Lookups are still one-shot (released once answered or failed, or after lookup_timeout): each
// ref costs a thread and a D-Bus connection in avahi-compat.
#include <arpa/inet.h>
#include <dns_sd.h>
#include <net/if.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#ifdef MESH_DNSSD_AVAHI_COMPAT
#include <avahi-common/malloc.h>
#endif

#include "discovery/backend.hpp"
#include "discovery/backoff.hpp"
#include "discovery/browse_state.hpp"
#include "discovery/txt_record.hpp"

namespace mesh::discovery {
namespace {

using clock_type = std::chrono::steady_clock;

class dnssd_backend;

// One browsed service instance and the lookups resolving it.
struct instance {
  dnssd_backend* owner = nullptr;
  std::string key, name, type, domain, host;
  uint32_t iface = 0;
  DNSServiceRef resolve = nullptr, query4 = nullptr, query6 = nullptr;
  std::vector<std::string> txt, addresses;
  uint16_t port = 0;
  bool txt_ok = false;
  bool rejected = false;  // its TXT record failed validation
  std::chrono::steady_clock::time_point lookup_started;
};

// How long a resolve or address query may stay unanswered before it is given up.
constexpr std::chrono::seconds lookup_timeout{5};

#ifdef MESH_DNSSD_AVAHI_COMPAT
void* zeroed_malloc(std::size_t size) { return std::calloc(1, size); }
void plain_free(void* p) { std::free(p); }
void* plain_realloc(void* p, std::size_t size) { return std::realloc(p, size); }
void* plain_calloc(std::size_t count, std::size_t size) { return std::calloc(count, size); }

/// Every allocation of libavahi-common (which avahi-compat allocates its refs with) zeroed, so
/// that the callback pointers a ref never set are null (see the top of this file). Backed by
/// libc like the default allocator, so memory allocated before the switch is freed correctly.
const AvahiAllocator zeroing_allocator{zeroed_malloc, plain_free, plain_realloc, plain_calloc};
#endif

/// Installs zeroing_allocator once per process, before the first dns_sd call (avahi reads the
/// allocator pointer without a lock: switch it before any avahi-compat ref exists).
void use_zeroing_avahi_allocator() {
#ifdef MESH_DNSSD_AVAHI_COMPAT
  static std::once_flag once;
  std::call_once(once, [] { avahi_set_allocator(&zeroing_allocator); });
#endif
}

// "name" -> "name #2" -> "name #3": the alternative after a name conflict (as Avahi does).
std::string alternative_name(const std::string& name) {
  const auto hash = name.rfind(" #");
  if (hash != std::string::npos && hash + 2 < name.size() &&
      name.find_first_not_of("0123456789", hash + 2) == std::string::npos && name.size() - hash < 8) {
    return name.substr(0, hash) + " #" + std::to_string(std::stoi(name.substr(hash + 2)) + 1);
  }
  return name + " #2";
}

class dnssd_backend final : public backend {
 public:
  explicit dnssd_backend(mdns_options options)
      : options_(std::move(options)), backoff_(options_.retry_initial, options_.retry_max) {}
  ~dnssd_backend() override { stop(); }

  expected<void> start(const announcement& self, event_callback on_event) override {
    if (thread_.joinable()) return make_error(error_code::invalid_argument, "dns_sd backend already started");
    if (!options_.announce)
      return make_error(error_code::invalid_argument, "dns_sd backend: browsing without announcing is not supported (use the avahi backend)");
    auto entries = encode_txt(self);
    if (!entries) return forward_error(entries);
    auto wire = txt_to_wire(*entries);
    if (!wire) return forward_error(wire);
    self_ = self;
    txt_wire_ = std::move(*wire);
    on_event_ = std::move(on_event);
    name_ = options_.service_name.empty() ? "meshnode-" + self.node_id.substr(0, 12) : options_.service_name;
    state_ = std::make_unique<browse_state>(self, "dnssd");
    use_zeroing_avahi_allocator();
    if (::pipe(wake_) != 0) return make_error(error_code::io_error, "dns_sd backend: cannot create a pipe");
    stopping_ = false;
    thread_ = std::thread([this] { run(); });
    return {};
  }

  void stop() override {
    if (!thread_.joinable()) return;
    stopping_ = true;
    const char c = 0;
    [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  // Callbacks (all on the backend thread, from DNSServiceProcessResult).
  static void on_register(DNSServiceRef, DNSServiceFlags, DNSServiceErrorType err, const char* name,
                          const char*, const char*, void* ctx) {
    auto* b = static_cast<dnssd_backend*>(ctx);
    if (err == kDNSServiceErr_NameConflict) {
      // avahi-compat renames by itself only on conflicts found by probing, not on local ones.
      const std::string alt = alternative_name(b->name_);
      spdlog::info("discovery/dnssd: service name '{}' is taken, now '{}'", b->name_, alt);
      b->name_ = alt;
      b->reregister_ = true;
      return;
    }
    if (err != kDNSServiceErr_NoError) {
      b->went_down("announcement failed (dns_sd error " + std::to_string(err) + ")");
      return;
    }
    if (name && b->name_ != name) spdlog::info("discovery/dnssd: service name '{}' is taken, now '{}'", b->name_, name);
    if (name) b->name_ = name;
    b->backoff_.reset();
    if (b->down_ || !b->up_) {
      b->down_ = false;
      b->up_ = true;
      b->emit({event::backend_up, {}, "announcing as '" + b->name_ + "'"});
    }
  }

  static void on_browse(DNSServiceRef, DNSServiceFlags flags, uint32_t iface, DNSServiceErrorType err,
                        const char* name, const char* type, const char* domain, void* ctx) {
    auto* b = static_cast<dnssd_backend*>(ctx);
    if (err != kDNSServiceErr_NoError) {
      b->went_down("browsing failed (dns_sd error " + std::to_string(err) + "): daemon gone?");
      return;
    }
    const std::string key = std::string(name) + "|" + std::to_string(iface) + "|" + domain;
    if (flags & kDNSServiceFlagsAdd) {
      if (b->instances_.count(key)) return;
      auto inst = std::make_unique<instance>();
      inst->owner = b;
      inst->key = key;
      inst->name = name;
      inst->domain = domain;
      inst->iface = iface;
      inst->type = type;
      b->start_resolve(*inst);
      b->instances_[key] = std::move(inst);
    } else {
      b->drop_instance(key);
      b->emit_all(b->state_->removed(key));
    }
  }

  static void on_resolve(DNSServiceRef, DNSServiceFlags, uint32_t iface, DNSServiceErrorType err,
                         const char*, const char* host, uint16_t port_be, uint16_t txt_len,
                         const unsigned char* txt, void* ctx) {
    auto* inst = static_cast<instance*>(ctx);
    dnssd_backend* b = inst->owner;
    if (err != kDNSServiceErr_NoError || !host) {
      spdlog::debug("discovery/dnssd: resolving '{}' failed ({})", inst->name, err);
      b->release(inst->resolve);
      return;
    }
    // Copy what the ref owns, then release it: one answer is all we wait for (see the top).
    const std::string host_name = host;
    auto entries = txt_from_wire(std::span<const uint8_t>(txt, txt_len));
    b->release(inst->resolve);
    inst->txt_ok = entries.has_value();
    inst->rejected = !entries.has_value();
    inst->txt = entries ? std::move(*entries) : std::vector<std::string>{};
    if (!entries) {
      b->emit({event::peer_rejected, {}, "instance '" + sanitize_device_summary(inst->name) + "': " +
                                              entries.error().message});
      b->emit_all(b->state_->removed(inst->key));
      return;
    }
    inst->port = ntohs(port_be);
    if (inst->host != host_name) {
      // A new target host: look its addresses up afresh.
      b->release(inst->query4);
      b->release(inst->query6);
      inst->addresses.clear();
      inst->host = host_name;
      inst->lookup_started = clock_type::now();
      for (auto [ref, type] : {std::pair{&inst->query4, kDNSServiceType_A}, {&inst->query6, kDNSServiceType_AAAA}}) {
        if (DNSServiceQueryRecord(ref, 0, iface, host_name.c_str(), type, kDNSServiceClass_IN, &dnssd_backend::on_query,
                                  inst) == kDNSServiceErr_NoError) {
          b->live_.insert(*ref);
        } else {
          *ref = nullptr;
        }
      }
    }
    b->report(*inst);
  }

  static void on_query(DNSServiceRef, DNSServiceFlags flags, uint32_t iface, DNSServiceErrorType err,
                       const char*, uint16_t rrtype, uint16_t, uint16_t rdlen, const void* rdata,
                       uint32_t, void* ctx) {
    auto* inst = static_cast<instance*>(ctx);
    if (err != kDNSServiceErr_NoError) {
      // A failed ref is never processed again (its daemon connection may be gone): release the
      // pair; expire_lookups() starts over if the instance is still unresolved.
      spdlog::debug("discovery/dnssd: address query for '{}' failed ({})", inst->name, err);
      inst->owner->release(inst->query4);
      inst->owner->release(inst->query6);
      return;
    }
    char text[INET6_ADDRSTRLEN] = {};
    std::string addr;
    if (rrtype == kDNSServiceType_A && rdlen == 4) {
      addr = inet_ntop(AF_INET, rdata, text, sizeof text);
    } else if (rrtype == kDNSServiceType_AAAA && rdlen == 16) {
      addr = inet_ntop(AF_INET6, rdata, text, sizeof text);
      const auto* b = static_cast<const uint8_t*>(rdata);
      char ifname[IF_NAMESIZE] = {};
      if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80 && if_indextoname(iface, ifname)) addr += std::string("%") + ifname;
    } else {
      return;
    }
    if (!(flags & kDNSServiceFlagsAdd)) return;
    auto& list = inst->addresses;
    if (std::find(list.begin(), list.end(), addr) != list.end()) return;
    list.push_back(addr);
    // The first address answers the lookup; collect what came with it, then stop asking.
    if (!(flags & kDNSServiceFlagsMoreComing)) {
      inst->owner->release(inst->query4);
      inst->owner->release(inst->query6);
    }
    inst->owner->report(*inst);
  }

 private:
  void emit(event e) {
    if (e.k == event::peer_rejected) spdlog::warn("discovery/dnssd: rejected announcement: {}", e.detail);
    if (on_event_) on_event_(std::move(e));
  }
  void emit_all(std::vector<event> events) {
    for (auto& e : events) emit(std::move(e));
  }

  void report(const instance& inst) {
    if (!inst.txt_ok || inst.addresses.empty()) return;  // not usable yet
    emit_all(state_->resolved(inst.key, inst.txt, inst.addresses, inst.port));
  }

  void release(DNSServiceRef& ref) {
    if (!ref) return;
    live_.erase(ref);
    DNSServiceRefDeallocate(ref);
    ref = nullptr;
  }

  void drop_instance(const std::string& key) {
    auto it = instances_.find(key);
    if (it == instances_.end()) return;
    release(it->second->resolve);
    release(it->second->query4);
    release(it->second->query6);
    instances_.erase(it);
  }

  // Called inside callbacks: only marks; the loop tears the refs down outside of them.
  void went_down(const std::string& why) {
    if (!teardown_) teardown_ = why;
  }

  void teardown(const std::string& why) {
    while (!instances_.empty()) drop_instance(instances_.begin()->first);
    release(browse_);
    release(register_);
    emit_all(state_->clear("dns_sd backend down: " + why));
    if (!down_) {
      down_ = true;
      up_ = false;
      spdlog::info("discovery/dnssd: backend down: {}", why);
      emit({event::backend_down, {}, why});
    }
    retry_at_ = clock_type::now() + backoff_.next();
  }

  // Resolved to something: a usable peer, or a record we rejected (not worth asking again).
  static bool settled(const instance& i) { return i.rejected || (i.txt_ok && !i.addresses.empty()); }

  void start_resolve(instance& inst) {
    inst.lookup_started = clock_type::now();
    if (DNSServiceResolve(&inst.resolve, 0, inst.iface, inst.name.c_str(), inst.type.c_str(),
                          inst.domain.c_str(), &dnssd_backend::on_resolve, &inst) != kDNSServiceErr_NoError) {
      inst.resolve = nullptr;
      spdlog::warn("discovery/dnssd: cannot resolve '{}' (will retry)", inst.name);
      return;
    }
    live_.insert(inst.resolve);
  }

  // Lookups in flight, or instances still to resolve: the loop must wake up for them.
  bool has_lookups() const {
    return std::any_of(instances_.begin(), instances_.end(), [](const auto& kv) {
      return kv.second->resolve || kv.second->query4 || kv.second->query6 || !settled(*kv.second);
    });
  }

  // Gives up lookups unanswered for lookup_timeout; an instance not resolved yet starts over
  // (packet loss, a host whose address is not published yet), until the browser removes it.
  void expire_lookups() {
    const auto now = clock_type::now();
    for (auto& [key, inst] : instances_) {
      if (now - inst->lookup_started < lookup_timeout) continue;
      if (inst->resolve || inst->query4 || inst->query6) {
        spdlog::debug("discovery/dnssd: lookup of '{}' unanswered, given up", inst->name);
      }
      release(inst->resolve);
      release(inst->query4);
      release(inst->query6);
      if (!settled(*inst)) {
        inst->host.clear();  // query the addresses again after the next resolve
        start_resolve(*inst);
      }
    }
  }

  void connect() {
    retry_at_.reset();
    DNSServiceErrorType err = kDNSServiceErr_NameConflict;
    for (int attempt = 0; attempt < 16 && err == kDNSServiceErr_NameConflict; ++attempt) {
      err = DNSServiceRegister(&register_, 0, 0, name_.c_str(), service_type, nullptr, nullptr,
                               htons(self_.port), static_cast<uint16_t>(txt_wire_.size()),
                               txt_wire_.data(), &dnssd_backend::on_register, this);
      if (err == kDNSServiceErr_NameConflict) {  // taken on this very daemon: reported at once
        const std::string alt = alternative_name(name_);
        spdlog::info("discovery/dnssd: service name '{}' is taken, now '{}'", name_, alt);
        name_ = alt;
      }
    }
    if (err != kDNSServiceErr_NoError) {
      register_ = nullptr;
      teardown("cannot announce (dns_sd error " + std::to_string(err) + "): is avahi-daemon running?");
      return;
    }
    live_.insert(register_);
    err = DNSServiceBrowse(&browse_, 0, 0, service_type, nullptr, &dnssd_backend::on_browse, this);
    if (err != kDNSServiceErr_NoError) {
      browse_ = nullptr;
      teardown("cannot browse (dns_sd error " + std::to_string(err) + ")");
      return;
    }
    live_.insert(browse_);
  }

  void run() {
    connect();
    const bool reminding = options_.remind_every.count() > 0;
    auto remind_at = clock_type::now() + options_.remind_every;
    while (!stopping_) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
      std::vector<DNSServiceRef> refs{nullptr};
      for (DNSServiceRef r : live_) {
        fds.push_back({DNSServiceRefSockFD(r), POLLIN, 0});
        refs.push_back(r);
      }
      int timeout = has_lookups() ? 1000 : -1;  // to expire unanswered lookups
      if (retry_at_) {
        timeout = static_cast<int>(std::max<long long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(*retry_at_ - clock_type::now()).count()));
      }
      if (reminding) {
        const auto until = static_cast<int>(std::max<long long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(remind_at - clock_type::now()).count()));
        timeout = timeout < 0 ? until : std::min(timeout, until);
      }
      if (::poll(fds.data(), fds.size(), timeout) < 0) continue;  // EINTR
      for (std::size_t i = 1; i < fds.size() && !teardown_; ++i) {
        // A callback may have released refs of this round: only process live ones.
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || !live_.count(refs[i])) continue;
        if (DNSServiceProcessResult(refs[i]) != kDNSServiceErr_NoError) went_down("lost the daemon connection");
      }
      if (teardown_) {
        const std::string why = *teardown_;
        teardown_.reset();
        teardown(why);
      }
      if (reregister_) {
        reregister_ = false;
        release(browse_);
        release(register_);
        connect();
      }
      expire_lookups();
      if (retry_at_ && clock_type::now() >= *retry_at_) connect();
      if (reminding && clock_type::now() >= remind_at) {
        for (auto& p : state_->members()) emit({event::peer_still_announced, std::move(p), ""});
        remind_at = clock_type::now() + options_.remind_every;
      }
    }
    // Deallocating the registration withdraws the announcement (peers see us leave).
    while (!instances_.empty()) drop_instance(instances_.begin()->first);
    release(browse_);
    release(register_);
  }

  mdns_options options_;
  backoff backoff_;
  announcement self_;
  std::vector<uint8_t> txt_wire_;
  event_callback on_event_;
  std::string name_;
  std::unique_ptr<browse_state> state_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  int wake_[2] = {-1, -1};
  DNSServiceRef register_ = nullptr, browse_ = nullptr;
  std::set<DNSServiceRef> live_;
  std::map<std::string, std::unique_ptr<instance>> instances_;
  std::optional<std::string> teardown_;
  std::optional<clock_type::time_point> retry_at_;
  bool up_ = false, down_ = false, reregister_ = false;
};

}  // namespace

std::unique_ptr<backend> make_dnssd_backend(mdns_options options) {
  return std::make_unique<dnssd_backend>(std::move(options));
}

}  // namespace mesh::discovery
