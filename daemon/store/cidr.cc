#include "daemon/store/cidr.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muster {
namespace {

std::array<uint8_t, 16> MappedV4(const in_addr& v4) {
  std::array<uint8_t, 16> b{};
  b[10] = 0xff;
  b[11] = 0xff;
  std::memcpy(b.data() + 12, &v4, 4);
  return b;
}

}  // namespace

absl::StatusOr<CidrSet> CidrSet::Parse(absl::string_view list) {
  CidrSet set;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::string addr(entry);
    int bits = -1;
    size_t slash = entry.find('/');
    if (slash != absl::string_view::npos) {
      addr = std::string(entry.substr(0, slash));
      if (!absl::SimpleAtoi(entry.substr(slash + 1), &bits)) bits = -2;
    }
    Range r;
    in_addr v4;
    in6_addr v6;
    if (::inet_pton(AF_INET, addr.c_str(), &v4) == 1) {
      if (bits == -1) bits = 32;
      if (bits < 0 || bits > 32) {
        return absl::InvalidArgumentError(absl::StrCat("bad CIDR '", entry, "': prefix length"));
      }
      r.bytes = MappedV4(v4);
      r.prefix_bits = 96 + bits;
    } else if (::inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
      if (bits == -1) bits = 128;
      if (bits < 0 || bits > 128) {
        return absl::InvalidArgumentError(absl::StrCat("bad CIDR '", entry, "': prefix length"));
      }
      std::memcpy(r.bytes.data(), &v6, 16);
      r.prefix_bits = bits;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("bad CIDR '", entry, "': not an address"));
    }
    set.ranges_.push_back(r);
  }
  return set;
}

bool CidrSet::Contains(const sockaddr_storage& address) const {
  std::array<uint8_t, 16> b{};
  if (address.ss_family == AF_INET) {
    b = MappedV4(reinterpret_cast<const sockaddr_in&>(address).sin_addr);
  } else if (address.ss_family == AF_INET6) {
    std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, 16);
  } else {
    return false;
  }
  for (const Range& r : ranges_) {
    int full = r.prefix_bits / 8, rest = r.prefix_bits % 8;
    if (std::memcmp(b.data(), r.bytes.data(), full) != 0) continue;
    if (rest != 0) {
      uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
      if ((b[full] & mask) != (r.bytes[full] & mask)) continue;
    }
    return true;
  }
  return false;
}

std::string FormatPeer(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(a.sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
      ::inet_ntop(AF_INET, reinterpret_cast<const uint8_t*>(&a.sin6_addr) + 12, host, sizeof(host));
      return absl::StrCat(host, ":", ntohs(a.sin6_port));
    }
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(a.sin6_port));
  }
  return "unknown";
}

}  // namespace muster
