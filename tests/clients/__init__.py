"""Other clients on the proto: the Node.js example, the independent client, codegen, grpcurl."""
