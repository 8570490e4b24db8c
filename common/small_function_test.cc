#include "common/small_function.h"

#include <array>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

namespace muster {
namespace {

// Counts live copies of itself, so a test sees each callable destroyed once.
struct Counted {
  explicit Counted(int* live) : live(live) { ++*live; }
  Counted(Counted&& o) noexcept : live(o.live) { ++*live; }
  ~Counted() { --*live; }
  int* live;
};

TEST_CASE("a small callable runs inline and is destroyed once") {
  int live = 0;
  {
    Counted c(&live);
    int base = 40;
    SmallFunction<int(int)> f([c = std::move(c), base](int x) { return base + x; });
    REQUIRE(f);
    CHECK(f(2) == 42);
    SmallFunction<int(int)> g(std::move(f));
    CHECK_FALSE(f);
    CHECK(g(3) == 43);
    f = std::move(g);
    CHECK(f(1) == 41);
    CHECK(live == 2);  // c itself (moved from) and the one inside f
  }
  CHECK(live == 0);
}

TEST_CASE("a callable over the inline size goes to the heap and still works") {
  int live = 0;
  {
    std::array<char, 200> big{};
    big[199] = 'z';
    Counted c(&live);
    SmallFunction<char()> f([big, c = std::move(c)] { return big[199]; });
    static_assert(sizeof(big) > SmallFunction<char()>::kInlineBytes);
    CHECK(f() == 'z');
    SmallFunction<char()> g = std::move(f);
    CHECK_FALSE(f);
    CHECK(g() == 'z');
    CHECK(live == 2);
  }
  CHECK(live == 0);
}

TEST_CASE("move-only captures and reference arguments pass through") {
  auto owned = std::make_unique<std::string>("held");
  SmallFunction<size_t(std::string&)> f([p = std::move(owned)](std::string& out) {
    out = *p;
    return p->size();
  });
  std::string out;
  CHECK(f(out) == 4);
  CHECK(out == "held");
  SmallFunction<size_t(std::string&)> empty;
  CHECK_FALSE(empty);
  empty = std::move(f);
  CHECK(empty(out) == 4);
}

}  // namespace
}  // namespace muster
