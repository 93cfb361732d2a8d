module argocd-agent-rs/tests/gopeer

go 1.24.6

require (
	github.com/cloudevents/sdk-go/binding/format/protobuf/v2 v2.16.2
	github.com/cloudevents/sdk-go/v2 v2.16.2
	github.com/coder/websocket v1.8.14
	github.com/go-redis/cache/v9 v9.0.0
	github.com/google/uuid v1.6.0
	github.com/redis/go-redis/v9 v9.20.1
	golang.org/x/net v0.46.1-0.20251013234738-63d1a5100f82
	google.golang.org/grpc v1.77.0
	google.golang.org/protobuf v1.36.10
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/vmihailenco/go-tinylfu v0.2.2 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.0 // indirect
	golang.org/x/sync v0.17.0 // indirect
	golang.org/x/sys v0.37.0 // indirect
	golang.org/x/text v0.30.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251022142026-3a174f9686a8 // indirect
)
