#include <catch2/catch.hpp>

#include "gpu/allocator.hpp"

using mesh::gpu::block_allocator;

TEST_CASE("block allocator: first fit, alignment, coalescing, new blocks") {
  block_allocator a(256);
  CHECK_FALSE(a.allocate(10).has_value());  // no block yet
  a.add_block(1024);
  auto x = a.allocate(10), y = a.allocate(300), z = a.allocate(256);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  CHECK(x->offset == 0);
  CHECK(x->size == 256);
  CHECK(y->offset == 256);
  CHECK(y->size == 512);
  CHECK(z->offset == 768);
  CHECK_FALSE(a.allocate(1).has_value());  // full
  a.release(*y);
  CHECK(a.largest_free(0) == 512);
  a.release(*x);
  CHECK(a.largest_free(0) == 768);  // merged with the following free range
  auto w = a.allocate(700);
  REQUIRE(w);
  CHECK(w->offset == 0);
  a.release(*w);
  a.release(*z);
  CHECK(a.largest_free(0) == 1024);
  CHECK(a.used_bytes() == 0);
  a.add_block(4096);
  auto big = a.allocate(2000);
  REQUIRE(big);
  CHECK(big->block == 1);
  // Raised alignment leaves the padding free.
  block_allocator c(64);
  c.add_block(1 << 20);
  auto small = c.allocate(100);
  auto aligned = c.allocate(1000, 4096);
  REQUIRE(small);
  REQUIRE(aligned);
  CHECK(aligned->offset == 4096);
  auto fill = c.allocate(200);
  REQUIRE(fill);
  CHECK(fill->offset == 128);  // first fit reuses the padding
  c.release(*aligned);
  c.release(*small);
  c.release(*fill);
  CHECK(c.largest_free(0) == (1 << 20));
}
