// The reference and the runner of communicator tests (see
// communicator_testing.h).
#include "backends/communicator_testing.h"

#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/shm/reduce.h"

namespace muster {
namespace conformance {
namespace {

// Scalar element i of `rank`'s buffer.
int Value(DType dtype, int rank, size_t i, int salt) {
  int v =
      static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3 + static_cast<size_t>(salt) * 5) % 6);
  if (dtype == DType::kBool) return v & 1;
  if (dtype == DType::kUInt8) return v % 4;
  return v - 2;
}

// `count` elements of `dtype` (complex: two scalars each).
std::string Values(DType dtype, size_t count, int rank, int salt) {
  std::string out(count * DTypeSize(dtype), '\0');
  char* p = out.data();
  size_t scalars = dtype == DType::kComplex64 || dtype == DType::kComplex128 ? 2 * count : count;
  for (size_t i = 0; i < scalars; ++i) {
    int v = Value(dtype, rank, i, salt);
    auto put = [&](auto x) { std::memcpy(p + i * sizeof(x), &x, sizeof(x)); };
    switch (dtype) {
      case DType::kFloat16:
        put(FloatToHalf(static_cast<float>(v)));
        break;
      case DType::kBFloat16:
        put(FloatToBFloat16(static_cast<float>(v)));
        break;
      case DType::kFloat32:
      case DType::kComplex64:
        put(static_cast<float>(v));
        break;
      case DType::kFloat64:
      case DType::kComplex128:
        put(static_cast<double>(v));
        break;
      case DType::kInt8:
        put(static_cast<int8_t>(v));
        break;
      case DType::kUInt8:
      case DType::kBool:
        put(static_cast<uint8_t>(v));
        break;
      case DType::kInt32:
        put(static_cast<int32_t>(v));
        break;
      case DType::kInt64:
        put(static_cast<int64_t>(v));
        break;
    }
  }
  return out;
}

// Elements [offset, offset + n) of every rank's input reduced in rank order.
std::string Reduced(const Case& c, int world, size_t offset, size_t n) {
  size_t es = DTypeSize(c.dtype);
  std::string acc(n * es, '\0');
  for (int j = 0; j < world; ++j) {
    std::string in = Input(c, world, j);
    const char* from = in.data() + offset * es;
    if (j == 0) {
      ReduceInit(acc.data(), from, n, c.dtype, c.op, kScale);
    } else {
      ReduceInto(acc.data(), from, n, c.dtype, c.op, kScale);
    }
  }
  ReduceFinish(acc.data(), n, c.dtype, c.op, world);
  return acc;
}

}  // namespace

std::string Case::Describe() const {
  std::string s = absl::StrCat(KindName(kind), "(", DTypeName(dtype), ", count ", count);
  if (Reduces(kind)) absl::StrAppend(&s, ", ", ReduceOpName(op));
  if (Rooted(kind)) absl::StrAppend(&s, ", root ", root);
  return s + ")";
}

bool Case::Valid() const { return !Reduces(kind) || CheckReduce(dtype, op).ok(); }

// all_to_all: elements rank `from` sends to rank `to` (uneven, some zero).
size_t Split(const Case& c, int from, int to) {
  return (c.count * static_cast<size_t>(from + 1) + static_cast<size_t>(to) * 5) % (c.count + 3);
}

// What `rank` contributes: the buffer it passes (in place: its data).
std::string Input(const Case& c, int world, int rank) {
  size_t n = c.count;
  if (c.kind == Kind::kScatter || c.kind == Kind::kReduceScatter) n = c.count * world;
  if (c.kind == Kind::kAllToAll) {
    n = 0;
    for (int j = 0; j < world; ++j) n += Split(c, rank, j);
  }
  return Values(c.dtype, n, rank, c.salt);
}

// What `rank`'s output buffer holds after `c` (c10d's semantics), or
// nothing where c10d leaves it unspecified (reduce and gather off the
// root). The output of in-place collectives is their data buffer.
std::optional<std::string> Expected(const Case& c, int world, int rank) {
  switch (c.kind) {
    case Kind::kBarrier:
      return std::string();
    case Kind::kAllReduce:
      return Reduced(c, world, 0, c.count);
    case Kind::kReduce:
      if (rank != c.root) return std::nullopt;
      return Reduced(c, world, 0, c.count);
    case Kind::kReduceScatter:
      return Reduced(c, world, rank * c.count, c.count);
    case Kind::kBroadcast:
      return Input(c, world, c.root);
    case Kind::kGather:
      if (rank != c.root) return std::nullopt;
      [[fallthrough]];
    case Kind::kAllGather: {
      std::string all;
      for (int j = 0; j < world; ++j) all += Input(c, world, j);
      return all;
    }
    case Kind::kScatter: {
      size_t bytes = c.count * DTypeSize(c.dtype);
      return Input(c, world, c.root).substr(rank * bytes, bytes);
    }
    case Kind::kAllToAll: {
      size_t es = DTypeSize(c.dtype);
      std::string out;
      for (int j = 0; j < world; ++j) {
        size_t offset = 0;
        for (int k = 0; k < rank; ++k) offset += Split(c, j, k);
        out += Input(c, world, j).substr(offset * es, Split(c, j, rank) * es);
      }
      return out;
    }
  }
  return std::nullopt;
}

absl::Status RunCase(Communicator& comm, const Case& c, absl::Time deadline, std::string* out,
                     const Allocate& allocate) {
  int world = comm.size(), rank = comm.rank();
  size_t es = DTypeSize(c.dtype);
  std::string in_data = Input(c, world, rank);
  std::deque<std::string> heap;  // references stay valid as it grows
  // A buffer holding `init`.
  auto buffer = [&](const std::string& init) -> char* {
    if (!allocate) return heap.emplace_back(init).data();
    char* p = allocate(init.size());
    if (!init.empty()) std::memcpy(p, init.data(), init.size());
    return p;
  };
  auto unset = [&](size_t elements) { return std::string(elements * es, '\xee'); };
  char* in = buffer(in_data);
  char* result = in;  // in place unless the case has an output buffer
  size_t result_bytes = in_data.size();
  auto output = [&](size_t elements) {
    result_bytes = elements * es;
    return result = buffer(unset(elements));
  };
  absl::Status s;
  switch (c.kind) {
    case Kind::kBarrier:
      s = comm.Barrier(deadline);
      break;
    case Kind::kAllReduce:
      s = comm.AllReduce(in, c.count, c.dtype, c.op, kScale, deadline);
      break;
    case Kind::kBroadcast:
      if (rank != c.root) std::memset(in, 0xee, result_bytes);
      s = comm.Broadcast(in, c.count, c.dtype, c.root, deadline);
      break;
    case Kind::kReduce:
      s = comm.Reduce(in, c.count, c.dtype, c.op, kScale, c.root, deadline);
      break;
    case Kind::kAllGather:
      s = comm.AllGather(in, output(c.count * world), c.count, c.dtype, deadline);
      break;
    case Kind::kGather:
      s = comm.Gather(in, output(c.count * world), c.count, c.dtype, c.root, deadline);
      break;
    case Kind::kScatter:
      if (rank != c.root) std::memset(in, 0xee, in_data.size());  // read at the root only
      s = comm.Scatter(in, output(c.count), c.count, c.dtype, c.root, deadline);
      break;
    case Kind::kReduceScatter:
      s = comm.ReduceScatter(in, output(c.count), c.count, c.dtype, c.op, kScale, deadline);
      break;
    case Kind::kAllToAll: {
      std::vector<size_t> send(world), recv(world);
      size_t total = 0;
      for (int j = 0; j < world; ++j) {
        send[j] = Split(c, rank, j);
        recv[j] = Split(c, j, rank);
        total += recv[j];
      }
      s = comm.AllToAll(in, send, output(total), recv, c.dtype, deadline);
      break;
    }
  }
  out->assign(result_bytes == 0 ? "" : std::string(result, result_bytes));
  return s;
}

}  // namespace conformance
}  // namespace muster
