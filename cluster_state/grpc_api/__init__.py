"""The gRPC face of the allocation store: ``cluster_state.proto`` and its generated code
(``cluster_state_pb2*``, regenerated with ``python -m grpc_tools.protoc -I. --python_out=.
--grpc_python_out=. --pyi_out=. cluster_state/grpc_api/cluster_state.proto`` from the
repository root; a test checks the checked-in files are current)."""
