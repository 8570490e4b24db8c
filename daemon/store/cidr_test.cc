#include "daemon/store/cidr.h"

#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cstring>

namespace muster {
namespace {

sockaddr_storage V4(const char* ip) {
  sockaddr_storage s{};
  auto& a = reinterpret_cast<sockaddr_in&>(s);
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  return s;
}

sockaddr_storage V6(const char* ip) {
  sockaddr_storage s{};
  auto& a = reinterpret_cast<sockaddr_in6&>(s);
  a.sin6_family = AF_INET6;
  ::inet_pton(AF_INET6, ip, &a.sin6_addr);
  return s;
}

TEST_CASE("CIDR sets match IPv4, IPv6 and v4-mapped peers") {
  auto set = CidrSet::Parse("10.0.0.0/8, 192.168.1.7, fd00::/8");
  REQUIRE(set.ok());
  CHECK(set->Contains(V4("10.1.2.3")));
  CHECK_FALSE(set->Contains(V4("11.0.0.1")));
  CHECK(set->Contains(V4("192.168.1.7")));
  CHECK_FALSE(set->Contains(V4("192.168.1.8")));
  CHECK(set->Contains(V6("::ffff:10.9.9.9")));
  CHECK(set->Contains(V6("fd12::1")));
  CHECK_FALSE(set->Contains(V6("fe80::1")));
  auto partial = CidrSet::Parse("172.16.0.0/12");
  REQUIRE(partial.ok());
  CHECK(partial->Contains(V4("172.31.255.255")));
  CHECK_FALSE(partial->Contains(V4("172.32.0.0")));
  CHECK(CidrSet::Parse("")->empty());
}

TEST_CASE("bad CIDR entries are named") {
  CHECK(CidrSet::Parse("10.0.0.0/33").status().message() ==
        "bad CIDR '10.0.0.0/33': prefix length");
  CHECK(CidrSet::Parse("1.2.3.4,banana").status().message() == "bad CIDR 'banana': not an address");
  CHECK_FALSE(CidrSet::Parse("::1/x").ok());
}

TEST_CASE("FormatPeer prints IPv4, mapped IPv4 and IPv6 peers") {
  auto v4 = V4("1.2.3.4");
  reinterpret_cast<sockaddr_in&>(v4).sin_port = htons(80);
  CHECK(FormatPeer(v4) == "1.2.3.4:80");
  auto mapped = V6("::ffff:1.2.3.4");
  CHECK(FormatPeer(mapped) == "1.2.3.4:0");
  auto v6 = V6("::1");
  reinterpret_cast<sockaddr_in6&>(v6).sin6_port = htons(9);
  CHECK(FormatPeer(v6) == "[::1]:9");
}

}  // namespace
}  // namespace muster
