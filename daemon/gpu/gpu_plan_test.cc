// PlanCollective: which NCCL primitives each request becomes, and the
// checks on roots, counts and buffer sizes.
#include "daemon/gpu/gpu_plan.h"

#include <nccl.h>

#include <catch2/catch.hpp>

namespace muster {
namespace {

v1::GpuCollectiveRequest Request(v1::GpuOp op, DType dtype, uint64_t count) {
  v1::GpuCollectiveRequest r;
  r.set_op(op);
  r.set_dtype(static_cast<int>(dtype));
  r.set_count(count);
  return r;
}

void AddBuffer(google::protobuf::RepeatedPtrField<v1::GpuBuffer>* list, uint64_t bytes) {
  v1::GpuBuffer* b = list->Add();
  b->set_ipc_handle(std::string(64, 'h'));
  b->set_bytes(bytes);
}

char* P(uintptr_t v) { return reinterpret_cast<char*>(v); }

TEST_CASE("all_reduce is one in-place ncclAllReduce with the mapped type and op") {
  auto r = Request(v1::GPU_ALL_REDUCE, DType::kBFloat16, 100);
  r.set_reduce_op(static_cast<int>(ReduceOp::kAvg));
  AddBuffer(r.mutable_inputs(), 200);
  auto plan = PlanCollective(r, 0, 4, {P(0x1000)}, {}, {}, nullptr);
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 1);
  const NcclPrimitive& p = (*plan)[0];
  CHECK(p.kind == NcclPrimitive::kAllReduce);
  CHECK(p.send == P(0x1000));
  CHECK(p.recv == P(0x1000));
  CHECK(p.count == 100);
  CHECK(p.type == ncclBfloat16);
  CHECK(p.op == ncclAvg);
}

TEST_CASE("a buffer smaller than the collective needs is InvalidArgument naming sizes") {
  auto r = Request(v1::GPU_ALL_REDUCE, DType::kFloat32, 100);
  AddBuffer(r.mutable_inputs(), 399);
  auto plan = PlanCollective(r, 0, 2, {P(0x1000)}, {}, {}, nullptr);
  CHECK(absl::IsInvalidArgument(plan.status()));
  CHECK(plan.status().message() == "input 0 has 399 bytes, the collective needs 400");
}

// `r` with one 64-byte input and output buffer, planned for rank 0 of 2.
absl::Status PlanSmall(v1::GpuCollectiveRequest r) {
  AddBuffer(r.mutable_inputs(), 64);
  AddBuffer(r.mutable_outputs(), 64);
  return PlanCollective(r, 0, 2, {P(0x1000)}, {P(0x2000)}, {}, nullptr).status();
}

TEST_CASE("a count whose bytes would wrap is InvalidArgument, not a tiny buffer check") {
  // 2^62 float32 elements are 2^64 bytes: 0 after the wrap, which every
  // buffer would hold. Each op's sizes (times the group, sums of splits)
  // must be refused before they are computed.
  for (v1::GpuOp op : {v1::GPU_ALL_REDUCE, v1::GPU_BROADCAST, v1::GPU_REDUCE, v1::GPU_ALL_GATHER,
                       v1::GPU_REDUCE_SCATTER, v1::GPU_GATHER, v1::GPU_SCATTER}) {
    INFO(static_cast<int>(op));
    absl::Status s = PlanSmall(Request(op, DType::kFloat32, uint64_t{1} << 62));
    CHECK(absl::IsInvalidArgument(s));
    CHECK(s.message() ==
          "count 4611686018427387904 of float32 in a group of 2 ranks is too large (bytes "
          "overflow)");
  }
  // A count that fits alone but wraps times the group (all_gather's output).
  CHECK(absl::IsInvalidArgument(
      PlanSmall(Request(v1::GPU_ALL_GATHER, DType::kFloat32, (uint64_t{1} << 61) + 1))));
  // all_to_all splits whose sum wraps.
  auto a = Request(v1::GPU_ALL_TO_ALL, DType::kFloat32, 0);
  for (int i = 0; i < 2; ++i) {
    a.add_send_counts(uint64_t{1} << 61);
    a.add_recv_counts(1);
  }
  absl::Status s = PlanSmall(a);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message() ==
        "send count 2305843009213693952 of float32 in a group of 2 ranks is too large (bytes "
        "overflow)");
}

TEST_CASE("roots outside the group and bitwise ops are rejected") {
  auto b = Request(v1::GPU_BROADCAST, DType::kFloat32, 1);
  b.set_root(3);
  AddBuffer(b.mutable_inputs(), 4);
  auto plan = PlanCollective(b, 0, 3, {P(8)}, {}, {}, nullptr);
  CHECK(absl::IsInvalidArgument(plan.status()));
  CHECK(plan.status().message().find("root 3") != std::string::npos);
  auto x = Request(v1::GPU_ALL_REDUCE, DType::kInt32, 1);
  x.set_reduce_op(static_cast<int>(ReduceOp::kBxor));
  AddBuffer(x.mutable_inputs(), 4);
  CHECK(absl::IsInvalidArgument(PlanCollective(x, 0, 2, {P(8)}, {}, {}, nullptr).status()));
}

TEST_CASE("broadcast moves bytes, so every dtype works") {
  auto r = Request(v1::GPU_BROADCAST, DType::kComplex128, 3);
  r.set_root(1);
  AddBuffer(r.mutable_inputs(), 48);
  auto plan = PlanCollective(r, 0, 2, {P(0x10)}, {}, {}, nullptr);
  REQUIRE(plan.ok());
  CHECK((*plan)[0].kind == NcclPrimitive::kBroadcast);
  CHECK((*plan)[0].type == ncclUint8);
  CHECK((*plan)[0].count == 48);
  CHECK((*plan)[0].root == 1);
}

TEST_CASE("all_gather into one buffer is ncclAllGather; into a list, one broadcast per rank") {
  auto r = Request(v1::GPU_ALL_GATHER, DType::kInt32, 2);
  AddBuffer(r.mutable_inputs(), 8);
  AddBuffer(r.mutable_outputs(), 24);
  auto flat = PlanCollective(r, 1, 3, {P(0x100)}, {P(0x200)}, {}, nullptr);
  REQUIRE(flat.ok());
  REQUIRE(flat->size() == 1);
  CHECK((*flat)[0].kind == NcclPrimitive::kAllGather);
  CHECK((*flat)[0].count == 8);

  r.clear_outputs();
  for (int i = 0; i < 3; ++i) AddBuffer(r.mutable_outputs(), 8);
  auto list = PlanCollective(r, 1, 3, {P(0x100)}, {P(0x200), P(0x300), P(0x400)}, {}, nullptr);
  REQUIRE(list.ok());
  REQUIRE(list->size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK((*list)[i].kind == NcclPrimitive::kBroadcast);
    CHECK((*list)[i].root == i);
    CHECK((*list)[i].recv == P(0x200 + 0x100 * i));
  }
  r.clear_outputs();
  AddBuffer(r.mutable_outputs(), 8);
  AddBuffer(r.mutable_outputs(), 8);
  CHECK(absl::IsInvalidArgument(
      PlanCollective(r, 1, 3, {P(0x100)}, {P(1), P(2)}, {}, nullptr).status()));
}

TEST_CASE("reduce_scatter from a list is one reduce per rank, to that rank") {
  auto r = Request(v1::GPU_REDUCE_SCATTER, DType::kFloat64, 4);
  r.set_reduce_op(static_cast<int>(ReduceOp::kMax));
  for (int i = 0; i < 2; ++i) AddBuffer(r.mutable_inputs(), 32);
  AddBuffer(r.mutable_outputs(), 32);
  auto plan = PlanCollective(r, 0, 2, {P(0x100), P(0x200)}, {P(0x300)}, {}, nullptr);
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 2);
  CHECK((*plan)[1].kind == NcclPrimitive::kReduce);
  CHECK((*plan)[1].send == P(0x200));
  CHECK((*plan)[1].root == 1);
  CHECK((*plan)[1].op == ncclMax);
}

TEST_CASE("all_to_all with uneven splits is grouped send/recv at the right offsets") {
  auto r = Request(v1::GPU_ALL_TO_ALL, DType::kInt64, 0);
  for (uint64_t c : {1, 0, 3}) r.add_send_counts(c);
  for (uint64_t c : {2, 2, 0}) r.add_recv_counts(c);
  AddBuffer(r.mutable_inputs(), 32);
  AddBuffer(r.mutable_outputs(), 32);
  auto plan = PlanCollective(r, 0, 3, {P(0x1000)}, {P(0x2000)}, {}, nullptr);
  REQUIRE(plan.ok());
  // send 8 B to 0, recv 16 B from 0, recv 16 B from 1, send 24 B to 2.
  REQUIRE(plan->size() == 4);
  CHECK((*plan)[0].kind == NcclPrimitive::kSend);
  CHECK((*plan)[0].count == 8);
  CHECK((*plan)[1].kind == NcclPrimitive::kRecv);
  CHECK((*plan)[1].recv == P(0x2000));
  CHECK((*plan)[2].kind == NcclPrimitive::kRecv);
  CHECK((*plan)[2].recv == P(0x2010));
  CHECK((*plan)[3].kind == NcclPrimitive::kSend);
  CHECK((*plan)[3].send == P(0x1008));
  CHECK((*plan)[3].count == 24);

  r.mutable_inputs(0)->set_bytes(31);
  CHECK(absl::IsInvalidArgument(
      PlanCollective(r, 0, 3, {P(0x1000)}, {P(0x2000)}, {}, nullptr).status()));
  r.clear_send_counts();
  CHECK(absl::IsInvalidArgument(
      PlanCollective(r, 0, 3, {P(0x1000)}, {P(0x2000)}, {}, nullptr).status()));
}

TEST_CASE("gather: everyone sends to the root, the root receives from everyone") {
  auto r = Request(v1::GPU_GATHER, DType::kFloat32, 2);
  r.set_root(1);
  AddBuffer(r.mutable_inputs(), 8);
  auto leaf = PlanCollective(r, 0, 2, {P(0x10)}, {}, {}, nullptr);
  REQUIRE(leaf.ok());
  REQUIRE(leaf->size() == 1);
  CHECK((*leaf)[0].kind == NcclPrimitive::kSend);
  CHECK((*leaf)[0].root == 1);
  AddBuffer(r.mutable_outputs(), 16);
  auto root = PlanCollective(r, 1, 2, {P(0x10)}, {P(0x100)}, {}, nullptr);
  REQUIRE(root.ok());
  REQUIRE(root->size() == 3);
  CHECK((*root)[2].kind == NcclPrimitive::kRecv);
  CHECK((*root)[2].recv == P(0x108));
}

TEST_CASE("scatter and barrier and point-to-point batches") {
  auto s = Request(v1::GPU_SCATTER, DType::kUInt8, 4);
  s.set_root(0);
  AddBuffer(s.mutable_inputs(), 8);
  AddBuffer(s.mutable_outputs(), 4);
  auto root = PlanCollective(s, 0, 2, {P(0x10)}, {P(0x40)}, {}, nullptr);
  REQUIRE(root.ok());
  REQUIRE(root->size() == 3);
  CHECK((*root)[1].send == P(0x14));
  CHECK((*root)[2].kind == NcclPrimitive::kRecv);

  auto b = Request(v1::GPU_BARRIER, DType::kFloat32, 0);
  auto barrier = PlanCollective(b, 0, 2, {}, {}, {}, P(0x900));
  REQUIRE(barrier.ok());
  CHECK((*barrier)[0].kind == NcclPrimitive::kAllReduce);
  CHECK((*barrier)[0].send == P(0x900));

  auto p = Request(v1::GPU_SEND_RECV, DType::kFloat32, 0);
  auto* op = p.add_p2p();
  op->set_send(true);
  op->set_peer(5);
  op->mutable_buffer()->set_bytes(4);
  auto bad = PlanCollective(p, 0, 2, {}, {}, {P(0x10)}, nullptr);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message().find("peer 5") != std::string::npos);
  op->set_peer(1);
  auto ok = PlanCollective(p, 0, 2, {}, {}, {P(0x10)}, nullptr);
  REQUIRE(ok.ok());
  CHECK((*ok)[0].kind == NcclPrimitive::kSend);
  CHECK((*ok)[0].count == 4);
}

}  // namespace
}  // namespace muster
