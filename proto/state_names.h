// The names musterd and musterctl use for rank and group states ("alive",
// "broken", …), in messages, tables and JSON.
//
// Stateless; thread-safe.
#ifndef MUSTER_PROTO_STATE_NAMES_H_
#define MUSTER_PROTO_STATE_NAMES_H_

#include "proto/groups.pb.h"
#include "proto/session.pb.h"

namespace muster {

const char* RankStateName(v1::RankState state);    // "alive", "left", "failed"
const char* GroupStateName(v1::GroupState state);  // "forming", "ready", "broken", "destroyed"

}  // namespace muster

#endif  // MUSTER_PROTO_STATE_NAMES_H_
