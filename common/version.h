// The muster release version, reported by every binary and the Status RPC.
#ifndef MUSTER_COMMON_VERSION_H_
#define MUSTER_COMMON_VERSION_H_

namespace muster {
inline constexpr char kVersion[] = "0.1.0";
}  // namespace muster

#endif  // MUSTER_COMMON_VERSION_H_
