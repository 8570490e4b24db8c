// muster's own CPU backends, registered by name like any third party's:
//
//   "gloo"  what c10d's gloo does, faster: a node-local group runs in the
//           shared-memory segment musterd made for it (ShmCommunicator,
//           point to point over its mailboxes); a group spanning nodes runs
//           hierarchically (shared memory within each node, Gloo among one
//           leader per node; point to point over a Gloo mesh of all
//           members); without a segment (musterd could not make one), or
//           with MUSTER_HIERARCHICAL=0 on a spanning group, Gloo over TCP
//           among all members (GlooCommunicator).
//   "shm"   node-local groups only, in shared memory (FAILED_PRECONDITION
//           for a group spanning nodes or without a segment).
//
// RegisterBuiltinCpuBackends is idempotent and thread-safe; the backends it
// creates are used as Backend documents (collectives from one thread at a
// time, Abort and point to point from any thread).
#ifndef MUSTER_BACKENDS_BUILTIN_CPU_BACKENDS_H_
#define MUSTER_BACKENDS_BUILTIN_CPU_BACKENDS_H_

#include "backends/backend.h"

namespace muster {

void RegisterBuiltinCpuBackends(BackendRegistry& registry = BackendRegistry::Global());

}  // namespace muster

#endif  // MUSTER_BACKENDS_BUILTIN_CPU_BACKENDS_H_
