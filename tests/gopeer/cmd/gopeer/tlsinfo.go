package main

import (
	"context"

	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
)

func credentialsFromContext(ctx context.Context) (credentials.TLSInfo, bool) {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return credentials.TLSInfo{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	return info, ok
}
