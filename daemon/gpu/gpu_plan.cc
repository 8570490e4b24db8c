#include "daemon/gpu/gpu_plan.h"

#include <nccl.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_mapping.h"

namespace muster {
namespace {

const char* OpName(v1::GpuOp op) {
  switch (op) {
    case v1::GPU_ALL_REDUCE:
      return "ALL_REDUCE";
    case v1::GPU_BROADCAST:
      return "BROADCAST";
    case v1::GPU_REDUCE:
      return "REDUCE";
    case v1::GPU_ALL_GATHER:
      return "ALL_GATHER";
    case v1::GPU_REDUCE_SCATTER:
      return "REDUCE_SCATTER";
    case v1::GPU_ALL_TO_ALL:
      return "ALL_TO_ALL";
    case v1::GPU_GATHER:
      return "GATHER";
    case v1::GPU_SCATTER:
      return "SCATTER";
    case v1::GPU_BARRIER:
      return "BARRIER";
    case v1::GPU_SEND_RECV:
      return "SEND_RECV";
    default:
      return "UNKNOWN";
  }
}

// Checks that buffer `i` of `list` holds at least `bytes`.
absl::Status NeedBytes(const google::protobuf::RepeatedPtrField<v1::GpuBuffer>& list, int i,
                       uint64_t bytes, const char* what) {
  if (i >= list.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " is missing"));
  }
  if (list[i].bytes() < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " has ", list[i].bytes(),
                                                   " bytes, the collective needs ", bytes));
  }
  return absl::OkStatus();
}

NcclPrimitive Move(NcclPrimitive::Kind kind, const void* send, void* recv, size_t bytes, int root) {
  NcclPrimitive p;
  p.kind = kind;
  p.send = send;
  p.recv = recv;
  p.count = bytes;
  p.type = ncclUint8;
  p.root = root;
  return p;
}

}  // namespace

std::string DescribeRequest(const v1::GpuCollectiveRequest& request) {
  std::string dtype = request.dtype() >= 0 && request.dtype() < kNumDTypes
                          ? DTypeName(static_cast<DType>(request.dtype()))
                          : absl::StrCat("dtype#", request.dtype());
  return absl::StrCat(OpName(request.op()), " ", dtype, " x ", request.count());
}

absl::StatusOr<std::vector<NcclPrimitive>> PlanCollective(const v1::GpuCollectiveRequest& request,
                                                          int group_rank, int group_size,
                                                          const std::vector<char*>& inputs,
                                                          const std::vector<char*>& outputs,
                                                          const std::vector<char*>& p2p,
                                                          void* scratch) {
  if (request.dtype() < 0 || request.dtype() >= kNumDTypes) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", request.dtype()));
  }
  if (inputs.size() != static_cast<size_t>(request.inputs_size()) ||
      outputs.size() != static_cast<size_t>(request.outputs_size()) ||
      p2p.size() != static_cast<size_t>(request.p2p_size())) {
    return absl::InternalError("buffer pointers do not match the request");
  }
  const DType dtype = static_cast<DType>(request.dtype());
  const size_t es = DTypeSize(dtype);
  const int n = group_size;
  // Every size below is a count times the element size, times at most the
  // group's size (all_to_all: a sum of n splits): a count past this would
  // wrap, pass the buffer checks and let NCCL run past the buffers.
  const uint64_t max_count = std::numeric_limits<uint64_t>::max() / es / std::max(n, 1);
  auto too_large = [&](uint64_t elements, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", elements, " of ", DTypeName(dtype),
                                                   " in a group of ", n,
                                                   " ranks is too large (bytes overflow)"));
  };
  if (request.count() > max_count) return too_large(request.count(), "count");
  for (uint64_t c : request.send_counts()) {
    if (c > max_count) return too_large(c, "send count");
  }
  for (uint64_t c : request.recv_counts()) {
    if (c > max_count) return too_large(c, "receive count");
  }
  const size_t count = request.count();
  const size_t bytes = count * es;
  const auto& in = request.inputs();
  const auto& out = request.outputs();
  const bool rooted = request.op() == v1::GPU_BROADCAST || request.op() == v1::GPU_REDUCE ||
                      request.op() == v1::GPU_GATHER || request.op() == v1::GPU_SCATTER;
  if (rooted && (request.root() < 0 || request.root() >= n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", request.root(), " is not a rank of a group of size ", n));
  }
  auto reduction = [&](size_t elements) -> absl::StatusOr<NcclReduction> {
    if (request.reduce_op() < 0 || request.reduce_op() >= kNumReduceOps) {
      return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", request.reduce_op()));
    }
    return MapReduction(dtype, static_cast<ReduceOp>(request.reduce_op()), elements,
                        request.scale());
  };
  auto reduce_primitive = [&](NcclPrimitive::Kind kind, const NcclReduction& r, const void* send,
                              void* recv, int root) {
    NcclPrimitive p;
    p.kind = kind;
    p.send = send;
    p.recv = recv;
    p.count = r.count;
    p.type = r.type;
    p.op = r.op;
    p.premul_sum = r.premul_sum;
    p.scale = r.scale;
    p.root = root;
    p.dtype = dtype;
    p.reduce_op = static_cast<ReduceOp>(request.reduce_op());
    return p;
  };

  std::vector<NcclPrimitive> plan;
  switch (request.op()) {
    case v1::GPU_ALL_REDUCE:
    case v1::GPU_REDUCE: {
      if (absl::Status s = NeedBytes(in, 0, bytes, "input"); !s.ok()) return s;
      auto r = reduction(count);
      if (!r.ok()) return r.status();
      void* target = inputs[0];  // in place
      if (!outputs.empty()) {
        if (absl::Status s = NeedBytes(out, 0, bytes, "output"); !s.ok()) return s;
        target = outputs[0];
      }
      plan.push_back(reduce_primitive(
          request.op() == v1::GPU_ALL_REDUCE ? NcclPrimitive::kAllReduce : NcclPrimitive::kReduce,
          *r, inputs[0], target, request.root()));
      break;
    }
    case v1::GPU_BROADCAST:
      if (absl::Status s = NeedBytes(in, 0, bytes, "input"); !s.ok()) return s;
      plan.push_back(Move(NcclPrimitive::kBroadcast, inputs[0], inputs[0], bytes, request.root()));
      break;
    case v1::GPU_ALL_GATHER:
      if (absl::Status s = NeedBytes(in, 0, bytes, "input"); !s.ok()) return s;
      if (outputs.size() == 1) {
        if (absl::Status s = NeedBytes(out, 0, bytes * n, "output"); !s.ok()) return s;
        plan.push_back(Move(NcclPrimitive::kAllGather, inputs[0], outputs[0], bytes, 0));
      } else if (outputs.size() == static_cast<size_t>(n)) {
        for (int i = 0; i < n; ++i) {
          if (absl::Status s = NeedBytes(out, i, bytes, "output"); !s.ok()) return s;
          plan.push_back(Move(NcclPrimitive::kBroadcast, inputs[0], outputs[i], bytes, i));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("all_gather needs 1 or ", n, " output buffers, got ", outputs.size()));
      }
      break;
    case v1::GPU_REDUCE_SCATTER: {
      if (absl::Status s = NeedBytes(out, 0, bytes, "output"); !s.ok()) return s;
      auto r = reduction(count);
      if (!r.ok()) return r.status();
      if (inputs.size() == 1) {
        if (absl::Status s = NeedBytes(in, 0, bytes * n, "input"); !s.ok()) return s;
        plan.push_back(
            reduce_primitive(NcclPrimitive::kReduceScatter, *r, inputs[0], outputs[0], 0));
      } else if (inputs.size() == static_cast<size_t>(n)) {
        for (int i = 0; i < n; ++i) {
          if (absl::Status s = NeedBytes(in, i, bytes, "input"); !s.ok()) return s;
          plan.push_back(reduce_primitive(NcclPrimitive::kReduce, *r, inputs[i], outputs[0], i));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("reduce_scatter needs 1 or ", n, " input buffers, got ", inputs.size()));
      }
      break;
    }
    case v1::GPU_ALL_TO_ALL: {
      if (request.send_counts_size() != n || request.recv_counts_size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("all_to_all needs ", n, " send and receive counts, got ",
                         request.send_counts_size(), " and ", request.recv_counts_size()));
      }
      const bool per_peer_in = inputs.size() == static_cast<size_t>(n) && n > 1;
      const bool per_peer_out = outputs.size() == static_cast<size_t>(n) && n > 1;
      uint64_t send_total = 0, recv_total = 0;
      for (int i = 0; i < n; ++i) {
        send_total += request.send_counts(i) * es;
        recv_total += request.recv_counts(i) * es;
      }
      if (!per_peer_in && (inputs.size() != 1 || in[0].bytes() < send_total)) {
        return absl::InvalidArgumentError(absl::StrCat("all_to_all input must be 1 buffer of ",
                                                       send_total, " bytes or ", n, " buffers"));
      }
      if (!per_peer_out && (outputs.size() != 1 || out[0].bytes() < recv_total)) {
        return absl::InvalidArgumentError(absl::StrCat("all_to_all output must be 1 buffer of ",
                                                       recv_total, " bytes or ", n, " buffers"));
      }
      uint64_t send_off = 0, recv_off = 0;
      for (int i = 0; i < n; ++i) {
        const uint64_t sb = request.send_counts(i) * es, rb = request.recv_counts(i) * es;
        if (per_peer_in) {
          if (absl::Status s = NeedBytes(in, i, sb, "input"); !s.ok()) return s;
        }
        if (per_peer_out) {
          if (absl::Status s = NeedBytes(out, i, rb, "output"); !s.ok()) return s;
        }
        const char* send = per_peer_in ? inputs[i] : inputs[0] + send_off;
        char* recv = per_peer_out ? outputs[i] : outputs[0] + recv_off;
        if (sb > 0) plan.push_back(Move(NcclPrimitive::kSend, send, nullptr, sb, i));
        if (rb > 0) plan.push_back(Move(NcclPrimitive::kRecv, nullptr, recv, rb, i));
        send_off += sb;
        recv_off += rb;
      }
      break;
    }
    case v1::GPU_GATHER: {
      if (absl::Status s = NeedBytes(in, 0, bytes, "input"); !s.ok()) return s;
      if (bytes > 0) {
        plan.push_back(Move(NcclPrimitive::kSend, inputs[0], nullptr, bytes, request.root()));
      }
      if (group_rank == request.root() && bytes > 0) {
        const bool contiguous = outputs.size() == 1 && n > 1;
        if (!contiguous && outputs.size() != static_cast<size_t>(n)) {
          return absl::InvalidArgumentError(absl::StrCat("gather at the root needs 1 or ", n,
                                                         " output buffers, got ", outputs.size()));
        }
        for (int i = 0; i < n; ++i) {
          if (absl::Status s =
                  NeedBytes(out, contiguous ? 0 : i, contiguous ? bytes * n : bytes, "output");
              !s.ok()) {
            return s;
          }
          char* recv = contiguous ? outputs[0] + i * bytes : outputs[i];
          plan.push_back(Move(NcclPrimitive::kRecv, nullptr, recv, bytes, i));
        }
      }
      break;
    }
    case v1::GPU_SCATTER: {
      if (absl::Status s = NeedBytes(out, 0, bytes, "output"); !s.ok()) return s;
      if (group_rank == request.root() && bytes > 0) {
        const bool contiguous = inputs.size() == 1 && n > 1;
        if (!contiguous && inputs.size() != static_cast<size_t>(n)) {
          return absl::InvalidArgumentError(absl::StrCat("scatter at the root needs 1 or ", n,
                                                         " input buffers, got ", inputs.size()));
        }
        for (int i = 0; i < n; ++i) {
          if (absl::Status s =
                  NeedBytes(in, contiguous ? 0 : i, contiguous ? bytes * n : bytes, "input");
              !s.ok()) {
            return s;
          }
          const char* send = contiguous ? inputs[0] + i * bytes : inputs[i];
          plan.push_back(Move(NcclPrimitive::kSend, send, nullptr, bytes, i));
        }
      }
      if (bytes > 0) {
        plan.push_back(Move(NcclPrimitive::kRecv, nullptr, outputs[0], bytes, request.root()));
      }
      break;
    }
    case v1::GPU_BARRIER: {
      NcclPrimitive p;
      p.kind = NcclPrimitive::kAllReduce;
      p.send = scratch;
      p.recv = scratch;
      p.count = 1;
      p.type = ncclFloat32;
      p.op = ncclSum;
      p.dtype = DType::kFloat32;
      plan.push_back(p);
      break;
    }
    case v1::GPU_SEND_RECV:
      if (request.p2p_size() == 0) {
        return absl::InvalidArgumentError("a point-to-point batch with no operations");
      }
      for (int i = 0; i < request.p2p_size(); ++i) {
        const auto& op = request.p2p(i);
        if (op.peer() < 0 || op.peer() >= n) {
          return absl::InvalidArgumentError(absl::StrCat("point-to-point peer ", op.peer(),
                                                         " is not a rank of a group of size ", n));
        }
        plan.push_back(
            op.send()
                ? Move(NcclPrimitive::kSend, p2p[i], nullptr, op.buffer().bytes(), op.peer())
                : Move(NcclPrimitive::kRecv, nullptr, p2p[i], op.buffer().bytes(), op.peer()));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown GPU collective ", static_cast<int>(request.op())));
  }
  return plan;
}

}  // namespace muster
