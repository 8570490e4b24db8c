// The JSON forms of the flight recorder (proto/groups.proto TraceRecord),
// shared by `musterctl trace --json` and musterd's dumps of broken groups so
// that the two cannot drift: every record is one flat object (job, group,
// rank, group_rank, pid, then the record's fields), which a reader of JSON
// Lines or common/json's flat parser takes as it is.
//
// Stateless; thread-safe.
#ifndef MUSTER_PROTO_TRACE_JSON_H_
#define MUSTER_PROTO_TRACE_JSON_H_

#include <string>

#include "common/json.h"
#include "proto/groups.pb.h"

namespace muster {

// Writes record `t` of rank `r` of group `g` as one flat object.
void TraceRecordJson(JsonWriter& w, const v1::GroupTrace& g, const v1::RankTrace& r,
                     const v1::TraceRecord& t);

// A dump: one JSON object with the group (job, name, backend, state, why it
// broke, when the dump was taken, its local members) and "records": every
// record of every local member, one per line, oldest first per rank.
std::string TraceDumpJson(const v1::GroupTrace& g, const std::string& reason,
                          int64_t now_unix_nanos);

}  // namespace muster

#endif  // MUSTER_PROTO_TRACE_JSON_H_
