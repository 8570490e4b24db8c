#include "proto/trace_json.h"

#include "proto/state_names.h"

namespace muster {

void TraceRecordJson(JsonWriter& w, const v1::GroupTrace& g, const v1::RankTrace& r,
                     const v1::TraceRecord& t) {
  w.BeginObject()
      .Key("job")
      .String(g.job_id())
      .Key("group")
      .String(g.name())
      .Key("rank")
      .Int(r.global_rank())
      .Key("group_rank")
      .Int(r.group_rank())
      .Key("pid")
      .Int(r.pid())
      .Key("id")
      .Int(static_cast<int64_t>(t.id()))
      .Key("seq")
      .Int(t.seq())
      .Key("op")
      .String(t.op())
      .Key("dtype")
      .String(t.dtype())
      .Key("device")
      .String(t.device())
      .Key("count")
      .Int(t.count())
      .Key("root")
      .Int(t.root())
      .Key("tag")
      .Int(static_cast<int64_t>(t.tag()))
      .Key("state")
      .String(t.state())
      .Key("error")
      .String(t.error())
      .Key("submitted_unix_nanos")
      .Int(t.submitted_unix_nanos())
      .Key("started_unix_nanos")
      .Int(t.started_unix_nanos())
      .Key("completed_unix_nanos")
      .Int(t.completed_unix_nanos())
      .EndObject();
}

std::string TraceDumpJson(const v1::GroupTrace& g, const std::string& reason,
                          int64_t now_unix_nanos) {
  JsonWriter head;
  head.BeginObject()
      .Key("job")
      .String(g.job_id())
      .Key("group")
      .String(g.name())
      .Key("epoch")
      .Int(g.epoch())
      .Key("backend")
      .String(g.backend())
      .Key("state")
      .String(GroupStateName(g.state()))
      .Key("reason")
      .String(reason)
      .Key("dumped_unix_nanos")
      .Int(now_unix_nanos)
      .Key("size")
      .Int(g.size())
      .Key("members")
      .BeginArray();
  for (const v1::RankTrace& r : g.ranks()) {
    head.BeginObject()
        .Key("rank")
        .Int(r.global_rank())
        .Key("group_rank")
        .Int(r.group_rank())
        .Key("pid")
        .Int(r.pid())
        .Key("state")
        .String(r.state())
        .Key("records")
        .Int(r.records_size())
        .EndObject();
  }
  head.EndArray().EndObject();
  // The head's closing brace is reopened to append the records, one per
  // line (greppable, and each line a flat object).
  std::string out = head.str();
  out.pop_back();
  out += ",\"records\":[\n";
  bool first = true;
  for (const v1::RankTrace& r : g.ranks()) {
    for (const v1::TraceRecord& t : r.records()) {
      if (!first) out += ",\n";
      first = false;
      JsonWriter w;
      TraceRecordJson(w, g, r, t);
      out += w.str();
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace muster
