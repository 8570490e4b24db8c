// PlanCollective: turns one GPU collective request into the NCCL
// primitives that run it (one ncclGroupStart/End), after checking the
// request: ranks, roots, counts and that every buffer is large enough.
//  - all_reduce, broadcast, reduce, all_gather and reduce_scatter map to the
//    NCCL call of the same name; with one buffer per rank instead of one
//    contiguous buffer, all_gather becomes one broadcast per rank and
//    reduce_scatter one reduce per rank.
//  - all_to_all, gather and scatter become grouped send/recv (a rank's own
//    block goes through a send/recv to itself).
//  - barrier is an all_reduce of one word of daemon-owned scratch memory.
// Stateless; thread-safe.
#ifndef MUSTER_DAEMON_GPU_GPU_PLAN_H_
#define MUSTER_DAEMON_GPU_GPU_PLAN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "backends/nccl/gpu_runtime.h"
#include "proto/gpu.pb.h"

namespace muster {

// `inputs`/`outputs`: device pointers for request.inputs()/outputs(), in
// order (already offset). `p2p`: device pointers for request.p2p().
// `scratch`: 4 bytes of device memory (barrier).
absl::StatusOr<std::vector<NcclPrimitive>> PlanCollective(const v1::GpuCollectiveRequest& request,
                                                          int group_rank, int group_size,
                                                          const std::vector<char*>& inputs,
                                                          const std::vector<char*>& outputs,
                                                          const std::vector<char*>& p2p,
                                                          void* scratch);

// "ALL_REDUCE float32 x 1024" for messages and musterctl.
std::string DescribeRequest(const v1::GpuCollectiveRequest& request);

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_GPU_PLAN_H_
