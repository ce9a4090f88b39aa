package csi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// TestLogCalls: every call is logged with its method, volume and outcome, and never with the
// request's secrets; periodic successes only at debug level.
func TestLogCalls(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	intercept := logCalls(zap.New(core))
	req := &csipb.NodeStageVolumeRequest{VolumeId: "vol-1", Secrets: map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "hunter2"}}
	stage := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Node/NodeStageVolume"}
	_, _ = intercept(context.Background(), req, stage, func(context.Context, any) (any, error) { return nil, nil })
	_, _ = intercept(context.Background(), req, stage, func(context.Context, any) (any, error) {
		return nil, errf(codes.FailedPrecondition, "not now")
	})
	_, _ = intercept(context.Background(), &csipb.ProbeRequest{}, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Identity/Probe"},
		func(context.Context, any) (any, error) { return nil, nil })
	entries := logs.All()
	if len(entries) != 3 {
		t.Fatalf("%d log entries, want 3", len(entries))
	}
	for i, want := range []struct {
		level zapcore.Level
		code  string
	}{{zapcore.InfoLevel, ""}, {zapcore.WarnLevel, "FailedPrecondition"}, {zapcore.DebugLevel, ""}} {
		e := entries[i]
		fields := e.ContextMap()
		if e.Level != want.level || fields["method"] == nil || (i < 2 && fields["volume_id"] != "vol-1") {
			t.Errorf("entry %d: %v %v", i, e.Level, fields)
		}
		if want.code != "" && fmt.Sprint(fields["code"]) != want.code {
			t.Errorf("entry %d: code %v, want %s", i, fields["code"], want.code)
		}
		if s := fmt.Sprint(fields) + e.Message; strings.Contains(s, "hunter2") || strings.Contains(s, "alice") {
			t.Errorf("entry %d logs the credentials: %s", i, s)
		}
	}
}
