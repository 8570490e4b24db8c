// CIDR ranges for --store-allow-unauthenticated ("10.0.0.0/8,::1/128").
// IPv4-mapped IPv6 peers (::ffff:a.b.c.d) match IPv4 ranges.
//
// Immutable after parsing; thread-safe.
#ifndef MUSTER_DAEMON_STORE_CIDR_H_
#define MUSTER_DAEMON_STORE_CIDR_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

class CidrSet {
 public:
  // Comma-separated list; "" is the empty set. InvalidArgument names the
  // bad entry.
  static absl::StatusOr<CidrSet> Parse(absl::string_view list);
  bool Contains(const sockaddr_storage& address) const;
  bool empty() const { return ranges_.empty(); }

 private:
  struct Range {
    std::array<uint8_t, 16> bytes{};  // IPv4 stored as v4-mapped IPv6
    int prefix_bits = 0;              // out of 128
  };
  std::vector<Range> ranges_;
};

// "1.2.3.4:5" or "[::1]:5".
std::string FormatPeer(const sockaddr_storage& address);

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_CIDR_H_
