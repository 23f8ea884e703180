// The Avahi backend: a thin shell around browse_state. Every Avahi object lives on the
// AvahiThreadedPoll thread; start() creates them before that thread runs and stop() frees them
// after it has stopped, so no call ever races a callback.
#include <net/if.h>
#include <spdlog/spdlog.h>

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/thread-watch.h>
#include <avahi-common/timeval.h>

#include <map>
#include <memory>

#include "discovery/backend.hpp"
#include "discovery/backoff.hpp"
#include "discovery/browse_state.hpp"
#include "discovery/txt_record.hpp"

namespace mesh::discovery {
namespace {

std::string instance_key(AvahiIfIndex iface, AvahiProtocol proto, const char* name, const char* domain) {
  return std::string(name) + "|" + std::to_string(iface) + "|" + std::to_string(proto) + "|" + domain;
}

class avahi_backend final : public backend {
 public:
  explicit avahi_backend(mdns_options options)
      : options_(std::move(options)), backoff_(options_.retry_initial, options_.retry_max) {}
  ~avahi_backend() override { stop(); }

  expected<void> start(const announcement& self, event_callback on_event) override {
    if (poll_) return make_error(error_code::invalid_argument, "avahi backend already started");
    if (options_.announce) {
      auto txt = encode_txt(self);
      if (!txt) return forward_error(txt);
      txt_ = std::move(*txt);
    }
    self_ = self;
    on_event_ = std::move(on_event);
    name_ = options_.service_name.empty() ? "meshnode-" + self.node_id.substr(0, 12) : options_.service_name;
    state_ = std::make_unique<browse_state>(self, "avahi");
    poll_ = avahi_threaded_poll_new();
    if (!poll_) return make_error(error_code::internal, "avahi: cannot create the threaded poll");
    const AvahiPoll* api = avahi_threaded_poll_get(poll_);
    retry_ = api->timeout_new(api, nullptr, &avahi_backend::on_retry, this);  // disarmed
    re_resolve_ = api->timeout_new(api, nullptr, &avahi_backend::on_re_resolve, this);
    remind_ = api->timeout_new(api, nullptr, &avahi_backend::on_remind, this);
    arm_reminder();
    connect();
    if (avahi_threaded_poll_start(poll_) < 0) {
      teardown_client();
      avahi_threaded_poll_free(poll_);
      poll_ = nullptr;
      return make_error(error_code::internal, "avahi: cannot start the poll thread");
    }
    return {};
  }

  void stop() override {
    if (!poll_) return;
    avahi_threaded_poll_stop(poll_);  // joins the thread: no callback runs after this
    teardown_client();
    // Freeing the poll frees its timeouts (retry_) too.
    avahi_threaded_poll_free(poll_);
    poll_ = nullptr;
    retry_ = nullptr;
    re_resolve_ = nullptr;
    remind_ = nullptr;
  }

 private:
  void emit(event e) {
    if (e.k == event::peer_rejected) spdlog::warn("discovery/avahi: rejected announcement: {}", e.detail);
    if (on_event_) on_event_(std::move(e));
  }
  void emit_all(std::vector<event> events) {
    for (auto& e : events) emit(std::move(e));
  }

  void connect() {
    int err = 0;
    // With NO_FAIL, a missing avahi-daemon is waited for (state CONNECTING); only a missing
    // D-Bus makes avahi_client_new fail, and then we retry on our timer.
    client_ = avahi_client_new(avahi_threaded_poll_get(poll_), AVAHI_CLIENT_NO_FAIL,
                               &avahi_backend::on_client, this, &err);
    if (!client_) went_down(std::string("cannot reach D-Bus/avahi-daemon: ") + avahi_strerror(err), true);
  }

  // The daemon's view is gone: report every peer it gave us lost and the backend down (once per
  // outage). With `retry`, the retry timer frees the client and its objects later, because this
  // may run inside one of their own callbacks; without, they are freed now (client callback).
  void went_down(const std::string& why, bool retry) {
    if (!retry) free_objects();
    emit_all(state_->clear("avahi backend down: " + why));
    if (!down_) {
      down_ = true;
      up_ = false;
      spdlog::info("discovery/avahi: backend down: {}", why);
      emit({event::backend_down, {}, why});
    }
    if (retry && retry_) {
      timeval tv;
      const auto wait = backoff_.next();
      avahi_threaded_poll_get(poll_)->timeout_update(
          retry_, avahi_elapse_time(&tv, static_cast<unsigned>(wait.count()), 0));
    }
  }

  void free_objects() {
    for (auto& [key, r] : resolvers_) avahi_service_resolver_free(r);
    resolvers_.clear();
    unresolved_.clear();
    client_for_lookups_ = nullptr;
    if (browser_) avahi_service_browser_free(browser_);
    browser_ = nullptr;
    if (group_) avahi_entry_group_free(group_);
    group_ = nullptr;
    announced_ = false;
  }

  void teardown_client() {
    free_objects();
    if (client_) avahi_client_free(client_);
    client_ = nullptr;
  }

  static void on_retry(AvahiTimeout*, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    b->teardown_client();
    b->emit_all(b->state_->clear("avahi backend reconnecting"));
    b->connect();
  }

  static void on_client(AvahiClient* c, AvahiClientState state, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    switch (state) {
      case AVAHI_CLIENT_S_RUNNING:
        b->backoff_.reset();
        if ((b->options_.announce && !b->register_service(c)) || !b->browse(c)) return;
        if (!b->up_) {
          b->up_ = true;
          b->down_ = false;
          emit_up(b);
        }
        break;
      case AVAHI_CLIENT_S_COLLISION:
      case AVAHI_CLIENT_S_REGISTERING:
        // The daemon's host name is (re)probing; our records go back up once it runs again.
        if (b->group_) avahi_entry_group_reset(b->group_);
        b->announced_ = false;
        break;
      case AVAHI_CLIENT_CONNECTING:
        // NO_FAIL mode: avahi-daemon is not on the bus; the client reconnects by itself.
        b->went_down("avahi-daemon is not running", false);
        break;
      case AVAHI_CLIENT_FAILURE:
        b->went_down(std::string("avahi client failed: ") + avahi_strerror(avahi_client_errno(c)), true);
        break;
    }
  }

  static void emit_up(avahi_backend* b) {
    if (!b->options_.announce) {
      spdlog::debug("discovery/avahi: browsing {} (not announcing)", service_type);
      b->emit({event::backend_up, {}, "browsing only"});
      return;
    }
    spdlog::info("discovery/avahi: announcing '{}' and browsing {}", b->name_, service_type);
    b->emit({event::backend_up, {}, "announcing as '" + b->name_ + "'"});
  }

  bool register_service(AvahiClient* c) {
    if (!group_) group_ = avahi_entry_group_new(c, &avahi_backend::on_group, this);
    if (!group_) {
      went_down(std::string("cannot create entry group: ") + avahi_strerror(avahi_client_errno(c)), true);
      return false;
    }
    if (announced_) return true;
    AvahiStringList* txt = nullptr;
    for (auto it = txt_.rbegin(); it != txt_.rend(); ++it) txt = avahi_string_list_add(txt, it->c_str());
    int ret = 0;
    for (int attempt = 0; attempt < 16; ++attempt) {
      ret = avahi_entry_group_add_service_strlst(group_, AVAHI_IF_UNSPEC, AVAHI_PROTO_UNSPEC,
                                                 static_cast<AvahiPublishFlags>(0), name_.c_str(), service_type,
                                                 nullptr, nullptr, self_.port, txt);
      if (ret != AVAHI_ERR_COLLISION) break;
      pick_alternative_name();
    }
    avahi_string_list_free(txt);
    if (ret >= 0) ret = avahi_entry_group_commit(group_);
    if (ret < 0) {
      went_down(std::string("cannot announce: ") + avahi_strerror(ret), true);
      return false;
    }
    announced_ = true;
    return true;
  }

  void pick_alternative_name() {
    char* alt = avahi_alternative_service_name(name_.c_str());
    spdlog::info("discovery/avahi: service name '{}' is taken, now '{}'", name_, alt);
    name_ = alt;
    avahi_free(alt);
  }

  static void on_group(AvahiEntryGroup* g, AvahiEntryGroupState state, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    if (state == AVAHI_ENTRY_GROUP_COLLISION) {
      // Another host announces our name: take "name #2" and announce again.
      b->pick_alternative_name();
      avahi_entry_group_reset(g);
      b->announced_ = false;
      b->register_service(avahi_entry_group_get_client(g));
    } else if (state == AVAHI_ENTRY_GROUP_FAILURE) {
      b->went_down(std::string("announcement failed: ") +
                       avahi_strerror(avahi_client_errno(avahi_entry_group_get_client(g))), true);
    }
  }

  bool browse(AvahiClient* c) {
    client_for_lookups_ = c;
    if (browser_) return true;
    browser_ = avahi_service_browser_new(c, AVAHI_IF_UNSPEC, AVAHI_PROTO_UNSPEC, service_type, nullptr,
                                         static_cast<AvahiLookupFlags>(0), &avahi_backend::on_browse, this);
    if (!browser_) {
      went_down(std::string("cannot browse: ") + avahi_strerror(avahi_client_errno(c)), true);
      return false;
    }
    return true;
  }

  static void on_browse(AvahiServiceBrowser* br, AvahiIfIndex iface, AvahiProtocol proto,
                        AvahiBrowserEvent ev, const char* name, const char* type, const char* domain,
                        AvahiLookupResultFlags, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    switch (ev) {
      case AVAHI_BROWSER_NEW: {
        // Not skipped on AVAHI_LOOKUP_RESULT_OUR_OWN: while we probe a name that turns out to
        // be taken, the other host's instance of it is flagged as ours and would never be
        // reported again. browse_state recognises ourselves by node id instead.
        b->resolve({iface, proto, name, type, domain});
        break;
      }
      case AVAHI_BROWSER_REMOVE: {
        const std::string key = instance_key(iface, proto, name, domain);
        b->unresolved_.erase(key);
        if (auto it = b->resolvers_.find(key); it != b->resolvers_.end()) {
          avahi_service_resolver_free(it->second);
          b->resolvers_.erase(it);
        }
        b->emit_all(b->state_->removed(key));
        break;
      }
      case AVAHI_BROWSER_FAILURE:
        b->went_down(std::string("browsing failed: ") +
                         avahi_strerror(avahi_client_errno(avahi_service_browser_get_client(br))), true);
        break;
      case AVAHI_BROWSER_ALL_FOR_NOW:
      case AVAHI_BROWSER_CACHE_EXHAUSTED:
        break;
    }
  }

  static void on_resolve(AvahiServiceResolver* r, AvahiIfIndex iface, AvahiProtocol proto,
                         AvahiResolverEvent ev, const char* name, const char* type, const char* domain,
                         const char*, const AvahiAddress* address, uint16_t port, AvahiStringList* txt,
                         AvahiLookupResultFlags, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    const std::string key = instance_key(iface, proto, name, domain);
    if (ev != AVAHI_RESOLVER_FOUND || !address) {
      // Unanswered (packet loss, a host without address records): try again later, until the
      // browser reports the instance removed.
      spdlog::debug("discovery/avahi: resolving '{}' failed, will retry", name);
      // Copy the names first: they belong to the resolver freed next.
      b->unresolved_[key] = instance_ref{iface, proto, name, type, domain};
      if (auto it = b->resolvers_.find(key); it != b->resolvers_.end() && it->second == r) {
        b->resolvers_.erase(it);
        avahi_service_resolver_free(r);
      }
      b->emit_all(b->state_->removed(key));
      timeval tv;
      avahi_threaded_poll_get(b->poll_)->timeout_update(
          b->re_resolve_, avahi_elapse_time(&tv, static_cast<unsigned>(re_resolve_after.count()), 0));
      return;
    }
    char text[AVAHI_ADDRESS_STR_MAX] = {};
    avahi_address_snprint(text, sizeof text, address);
    std::string addr = text;
    if (address->proto == AVAHI_PROTO_INET6 && address->data.ipv6.address[0] == 0xfe &&
        (address->data.ipv6.address[1] & 0xc0) == 0x80) {
      char ifname[IF_NAMESIZE] = {};
      if (if_indextoname(static_cast<unsigned>(iface), ifname)) addr += std::string("%") + ifname;
    }
    std::vector<std::string> entries;
    std::size_t count = 0;
    for (AvahiStringList* l = txt; l && count <= max_txt_entries; l = avahi_string_list_get_next(l), ++count) {
      entries.emplace_back(reinterpret_cast<const char*>(avahi_string_list_get_text(l)),
                           avahi_string_list_get_size(l));
    }
    b->emit_all(b->state_->resolved(key, entries, {addr}, port));
  }

  // What identifies a browsed instance to Avahi.
  struct instance_ref {
    AvahiIfIndex iface;
    AvahiProtocol proto;
    std::string name, type, domain;
  };

  void resolve(const instance_ref& i) {
    const std::string key = instance_key(i.iface, i.proto, i.name.c_str(), i.domain.c_str());
    if (resolvers_.count(key) || !client_for_lookups_) return;
    // Resolve with the protocol it was seen on: IPv4 records give IPv4 addresses, IPv6 IPv6.
    AvahiServiceResolver* r = avahi_service_resolver_new(
        client_for_lookups_, i.iface, i.proto, i.name.c_str(), i.type.c_str(), i.domain.c_str(), i.proto,
        static_cast<AvahiLookupFlags>(0), &avahi_backend::on_resolve, this);
    if (r) resolvers_[key] = r;
    else spdlog::warn("discovery/avahi: cannot resolve '{}': {}", i.name,
                      avahi_strerror(avahi_client_errno(client_for_lookups_)));
  }

  static void on_re_resolve(AvahiTimeout*, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    auto pending = std::move(b->unresolved_);
    b->unresolved_.clear();
    for (const auto& [key, ref] : pending) b->resolve(ref);
  }

  static constexpr std::chrono::milliseconds re_resolve_after{2000};

  void arm_reminder() {
    if (!remind_ || options_.remind_every.count() <= 0) return;
    timeval tv;
    avahi_threaded_poll_get(poll_)->timeout_update(
        remind_, avahi_elapse_time(&tv, static_cast<unsigned>(options_.remind_every.count()), 0));
  }

  static void on_remind(AvahiTimeout*, void* self) {
    auto* b = static_cast<avahi_backend*>(self);
    for (auto& p : b->state_->members()) b->emit({event::peer_still_announced, std::move(p), ""});
    b->arm_reminder();
  }

  mdns_options options_;
  backoff backoff_;
  announcement self_;
  std::vector<std::string> txt_;
  event_callback on_event_;
  std::string name_;
  std::unique_ptr<browse_state> state_;
  AvahiThreadedPoll* poll_ = nullptr;
  AvahiTimeout* retry_ = nullptr;
  AvahiClient* client_ = nullptr;
  AvahiEntryGroup* group_ = nullptr;
  AvahiServiceBrowser* browser_ = nullptr;
  std::map<std::string, AvahiServiceResolver*> resolvers_;
  std::map<std::string, instance_ref> unresolved_;  // resolution failed; retried on re_resolve_
  AvahiTimeout* re_resolve_ = nullptr;
  AvahiTimeout* remind_ = nullptr;  // reports the members again (remind_every)
  AvahiClient* client_for_lookups_ = nullptr;  // the client the browser belongs to
  bool announced_ = false;  // our service is added to group_ and committed
  bool up_ = false;
  bool down_ = false;
};

}  // namespace

std::unique_ptr<backend> make_avahi_backend(mdns_options options) {
  return std::make_unique<avahi_backend>(std::move(options));
}

}  // namespace mesh::discovery
