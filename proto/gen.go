package proto

//go:generate protoc --proto_path=. --go_out=. --go_opt=module=skipper.dev/skipper/proto --go-grpc_out=. --go-grpc_opt=module=skipper.dev/skipper/proto skipper/v1/controller.proto
