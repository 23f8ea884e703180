#pragma once
// A serving node's blob_offers and a stage node's blob_fetcher on one simulated link, for tests:
// every message goes through the wire codec, and a thread answers the gets in order, as the
// serving node's actor does.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/blob_transfer.hpp"
#include "test_ids.hpp"

namespace mesh::test {

inline msg::message over_the_wire(const msg::message& m) {
  auto bytes = msg::encode_message(m);
  REQUIRE(bytes);
  auto back = msg::decode_message(bytes->data(), bytes->size());
  REQUIRE(back);
  return *back;
}

struct fetch_link {
  node_id srv = named("srv"), peer = named("peer");
  blobs::blob_offers offers{"srv"};
  std::mutex m;
  std::condition_variable cv;
  std::deque<msg::blob_get> gets;
  bool stop = false, connected = true;
  std::function<void(msg::blob_chunk&)> tamper;
  std::shared_ptr<blobs::blob_fetcher> fetcher = std::make_shared<blobs::blob_fetcher>(
      [this](const node_id& to, const msg::message& sent) {
        if (to != srv || !connected) return false;
        std::lock_guard<std::mutex> lock(m);
        gets.push_back(std::get<msg::blob_get>(over_the_wire(sent)));
        cv.notify_all();
        return true;
      },
      std::chrono::seconds(5));
  std::thread server{[this] {
    for (;;) {
      msg::blob_get g;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return stop || !gets.empty(); });
        if (stop) return;
        g = gets.front();
        gets.pop_front();
      }
      auto c = offers.serve(g);
      if (tamper) tamper(c);
      fetcher->deliver(srv, std::get<msg::blob_chunk>(over_the_wire(c)));
    }
  }};
  ~fetch_link() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv.notify_all();
    server.join();
  }
};

}  // namespace mesh::test
