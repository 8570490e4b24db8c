// MalformedRequestInterceptorFactory: makes musterd answer a unary call
// whose request does not parse as its protobuf with INVALID_ARGUMENT naming
// the method, instead of the UNIMPLEMENTED (empty message) gRPC's callback
// API sends for it. Install with ServerBuilder::experimental()
// .SetInterceptorCreators.
//
// Thread-safe (one interceptor per call).
#ifndef MUSTER_DAEMON_ACCESS_MALFORMED_REQUEST_H_
#define MUSTER_DAEMON_ACCESS_MALFORMED_REQUEST_H_

#include <grpcpp/support/server_interceptor.h>

namespace muster {

class MalformedRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_ACCESS_MALFORMED_REQUEST_H_
