#include "proto/state_names.h"

namespace muster {

const char* RankStateName(v1::RankState state) {
  switch (state) {
    case v1::RANK_STATE_ALIVE:
      return "alive";
    case v1::RANK_STATE_LEFT:
      return "left";
    case v1::RANK_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

const char* GroupStateName(v1::GroupState state) {
  switch (state) {
    case v1::GROUP_STATE_FORMING:
      return "forming";
    case v1::GROUP_STATE_READY:
      return "ready";
    case v1::GROUP_STATE_BROKEN:
      return "broken";
    case v1::GROUP_STATE_DESTROYED:
      return "destroyed";
    default:
      return "unknown";
  }
}

}  // namespace muster
