package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	format "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	"github.com/cloudevents/sdk-go/binding/format/protobuf/v2/pb"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/google/uuid"
)

// The event types and targets, as upstream's internal/event package names them.
const (
	typePrefix      = "io.argoproj.argocd-agent.event"
	typeProcessed   = typePrefix + ".processed"
	typePing        = typePrefix + ".ping"
	typeError       = typePrefix + ".error"
	typeResponse    = typePrefix + ".response"
	typeRedisReq    = typePrefix + ".redis-request"
	typeRedisResp   = typePrefix + ".redis-response"
	typeSyncedList  = typePrefix + ".request-synced-resource-list"
	typeSyncedRes   = typePrefix + ".response-synced-resource"
	typeReqUpdate   = typePrefix + ".request-update"
	typeReqResync   = typePrefix + ".request-resource-resync"
	typeCacheInfo   = typePrefix + ".cluster-cache-info-update"
	typeTerminalReq = typePrefix + ".terminal-request"

	targetApplication    = "application"
	targetAppProject     = "appproject"
	targetApplicationSet = "applicationset"
	targetRepository     = "repository"
	targetGPGKey         = "gpgkey"
	targetResource       = "resource"
	targetContainerLog   = "containerlog"
	targetTerminal       = "terminal"
	targetRedis          = "redis"
	targetResourceResync = "resourceResync"
	targetCacheInfo      = "clusterCacheInfoUpdate"
	targetHeartbeat      = "heartbeat"
	targetEventAck       = "eventProcessed"

	extResourceID = "resourceid"
	extEventID    = "eventid"
)

// eventTarget is upstream's event.Target(): the target comes from DataSchema() alone, and an
// unknown (or empty) dataschema is "" (upstream: "unknown event target", the event is dropped).
func eventTarget(raw *cloudevents.Event) string {
	switch s := raw.DataSchema(); s {
	case targetApplication, targetAppProject, targetApplicationSet, targetRepository, targetGPGKey,
		targetResource, targetContainerLog, targetTerminal, targetRedis, targetResourceResync,
		targetCacheInfo, targetHeartbeat, targetEventAck:
		return s
	}
	return ""
}

// Payload structs with upstream's JSON tags (internal/event/event.go).

type groupVersionResource struct {
	Group    string `json:"group"`
	Version  string `json:"version"`
	Resource string `json:"resource"`
}

type resourceRequest struct {
	UUID        string            `json:"uuid"`
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name"`
	Subresource string            `json:"subresource,omitempty"`
	Method      string            `json:"method,omitempty"`
	Body        []byte            `json:"body,omitempty"`
	Params      map[string]string `json:"params,omitempty"`
	groupVersionResource
}

type resourceResponse struct {
	UUID     string `json:"uuid"`
	Status   int    `json:"status"`
	Resource string `json:"resource,omitempty"`
}

type redisRequest struct {
	UUID           string `json:"uuid"`
	ConnectionUUID string `json:"connectionUuid"`
	Body           struct {
		Get *struct {
			Key string `json:"key"`
		} `json:"get,omitempty"`
		Subscribe *struct {
			ChannelName string `json:"channel"`
		} `json:"subscribe,omitempty"`
		Ping *struct{} `json:"ping,omitempty"`
	} `json:"body"`
}

type redisResponse struct {
	UUID           string `json:"uuid"`
	ConnectionUUID string `json:"connectionUuid"`
	Body           struct {
		Get *struct {
			Bytes    []byte `json:"bytes"`
			CacheHit bool   `json:"cacheHit"`
			Error    string `json:"error"`
		} `json:"get,omitempty"`
		SubscribeResponse *struct {
			Error string `json:"error"`
		} `json:"subscribeResponse,omitempty"`
		PushFromSubscribe *struct {
			ChannelName string `json:"channelName"`
		} `json:"pushFromSubscribe,omitempty"`
		Pong *struct{} `json:"pong,omitempty"`
	} `json:"body"`
}

type containerLogRequest struct {
	UUID                         string `json:"uuid"`
	Namespace                    string `json:"namespace"`
	PodName                      string `json:"podName"`
	Container                    string `json:"container,omitempty"`
	Follow                       bool   `json:"follow,omitempty"`
	TailLines                    *int64 `json:"tailLines,omitempty"`
	SinceSeconds                 *int64 `json:"sinceSeconds,omitempty"`
	SinceTime                    string `json:"sinceTime,omitempty"`
	Timestamps                   bool   `json:"timestamps,omitempty"`
	Previous                     bool   `json:"previous,omitempty"`
	InsecureSkipTLSVerifyBackend bool   `json:"insecureSkipTLSVerifyBackend,omitempty"`
	LimitBytes                   *int64 `json:"limitBytes,omitempty"`
}

type containerTerminalRequest struct {
	UUID          string   `json:"uuid"`
	Namespace     string   `json:"namespace"`
	PodName       string   `json:"podName"`
	ContainerName string   `json:"containerName"`
	Command       []string `json:"command,omitempty"`
	TTY           bool     `json:"tty"`
	Stdin         bool     `json:"stdin"`
	Stdout        bool     `json:"stdout"`
	Stderr        bool     `json:"stderr"`
}

type requestSyncedResourceList struct {
	Checksum []byte `json:"checksum"`
}

type syncedResource struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	UID       string `json:"uid"`
	Kind      string `json:"kind"`
}

type requestUpdate struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	UID       string `json:"uid"`
	Kind      string `json:"kind"`
	Checksum  []byte `json:"checksum"`
}

type requestResourceResync struct{}

type clusterCacheInfo struct {
	ApplicationsCount int64 `json:"applicationsCount"`
	APIsCount         int64 `json:"apisCount"`
	ResourcesCount    int64 `json:"resourcesCount"`
}

type errorData struct {
	ResourceName      string `json:"resourceName"`
	ResourceNamespace string `json:"resourceNamespace"`
	Message           string `json:"message"`
}

// object is a Kubernetes object (Application, AppProject, Secret, ConfigMap, ApplicationSet):
// the peer has no Argo CD types, so it keeps the JSON, numbers verbatim.
type object map[string]any

func isObjectTarget(t string) bool {
	switch t {
	case targetApplication, targetAppProject, targetApplicationSet, targetRepository, targetGPGKey:
		return true
	}
	return false
}

func isHTTPMethod(t string) bool {
	switch t {
	case "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS":
		return true
	}
	return false
}

// payloadFor returns a pointer to the struct upstream decodes this (target, type) into; nil
// for events without data (ACKs, heartbeats).
func payloadFor(target, typ string) (any, error) {
	switch {
	case target == targetEventAck || target == targetHeartbeat:
		return nil, nil
	case target == targetApplication && typ == typeError:
		return &errorData{}, nil
	case isObjectTarget(target):
		return &object{}, nil
	case target == targetResource && typ == typeResponse:
		return &resourceResponse{}, nil
	case target == targetResource && isHTTPMethod(typ):
		return &resourceRequest{}, nil
	case target == targetContainerLog && isHTTPMethod(typ):
		return &containerLogRequest{}, nil
	case target == targetTerminal && typ == typeTerminalReq:
		return &containerTerminalRequest{}, nil
	case target == targetRedis && typ == typeRedisReq:
		return &redisRequest{}, nil
	case target == targetRedis && typ == typeRedisResp:
		return &redisResponse{}, nil
	case target == targetResourceResync && typ == typeSyncedList:
		return &requestSyncedResourceList{}, nil
	case target == targetResourceResync && typ == typeSyncedRes:
		return &syncedResource{}, nil
	case target == targetResourceResync && typ == typeReqUpdate:
		return &requestUpdate{}, nil
	case target == targetResourceResync && typ == typeReqResync:
		return &requestResourceResync{}, nil
	case target == targetCacheInfo && typ == typeCacheInfo:
		return &clusterCacheInfo{}, nil
	}
	return nil, fmt.Errorf("upstream has no payload for type %q on target %q", typ, target)
}

// decodeJSON decodes like encoding/json but keeps numbers verbatim (as Kubernetes'
// unstructured converter keeps integers).
func decodeJSON(data []byte, into any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return d.Decode(into)
}

// buildEvent builds an event the way upstream's EventSource constructors do: source,
// specversion 1.0, type, eventid and resourceid extensions, dataschema = target, and the
// payload (decoded into upstream's struct first, so Go's encoding is what goes out) as
// application/json. Object events take their ids from the object's metadata.
func buildEvent(source string, c command) (*cloudevents.Event, error) {
	cev := cloudevents.NewEvent()
	cev.SetSource(source)
	cev.SetSpecVersion("1.0")
	cev.SetType(c.Type)
	resID, evID := c.ResourceID, c.EventID
	payload, err := payloadFor(c.Target, c.Type)
	if err != nil && len(c.Data) > 0 {
		return nil, err
	}
	if payload != nil && len(c.Data) > 0 {
		if err := decodeJSON(c.Data, payload); err != nil {
			return nil, fmt.Errorf("data does not fit upstream's payload for %s/%s: %w", c.Target, c.Type, err)
		}
		if obj, ok := payload.(*object); ok && resID == "" {
			meta, _ := (*obj)["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			uid, _ := meta["uid"].(string)
			rv, _ := meta["resourceVersion"].(string)
			resID = fmt.Sprintf("%s_%s", name, uid)
			if evID == "" {
				evID = fmt.Sprintf("%s_%s_%s", name, uid, rv)
			}
		}
	}
	switch pl := payload.(type) {
	case *requestSyncedResourceList:
		if c.ChecksumKeys != nil {
			pl.Checksum = resourceSetChecksum(c.ChecksumKeys)
		}
	case *requestUpdate:
		if len(c.SpecChecksumOf) > 0 {
			sum, err := specChecksum(c.SpecChecksumOf)
			if err != nil {
				return nil, err
			}
			pl.Checksum = sum
		}
	}
	if resID == "" {
		resID = uuid.NewString()
	}
	if evID == "" {
		evID = resID
	}
	cev.SetExtension(extEventID, evID)
	cev.SetExtension(extResourceID, resID)
	cev.SetDataSchema(c.Target)
	if payload != nil && len(c.Data) > 0 {
		if err := cev.SetData(cloudevents.ApplicationJSON, payload); err != nil {
			return nil, err
		}
	}
	return &cev, nil
}

// processedEvent is upstream's EventSource.ProcessedEvent: type processed, target
// eventProcessed, every extension of the acked event copied, no data.
func processedEvent(source string, acked *cloudevents.Event) *cloudevents.Event {
	cev := cloudevents.NewEvent()
	cev.SetSource(source)
	cev.SetSpecVersion("1.0")
	cev.SetType(typeProcessed)
	for k, v := range acked.Extensions() {
		cev.SetExtension(k, v)
	}
	cev.SetDataSchema(targetEventAck)
	return &cev
}

// extString is upstream's ResourceID()/EventID(): the extension only if it is a string.
func extString(ev *cloudevents.Event, name string) string {
	s, _ := ev.Extensions()[name].(string)
	return s
}

// attrKind names the oneof case of a protobuf attribute value.
func attrKind(v *pb.CloudEventAttributeValue) string {
	switch v.GetAttr().(type) {
	case *pb.CloudEventAttributeValue_CeBoolean:
		return "ce_boolean"
	case *pb.CloudEventAttributeValue_CeInteger:
		return "ce_integer"
	case *pb.CloudEventAttributeValue_CeString:
		return "ce_string"
	case *pb.CloudEventAttributeValue_CeBytes:
		return "ce_bytes"
	case *pb.CloudEventAttributeValue_CeUri:
		return "ce_uri"
	case *pb.CloudEventAttributeValue_CeUriRef:
		return "ce_uri_ref"
	case *pb.CloudEventAttributeValue_CeTimestamp:
		return "ce_timestamp"
	}
	return "unset"
}

func attrText(v *pb.CloudEventAttributeValue) string {
	switch a := v.GetAttr().(type) {
	case *pb.CloudEventAttributeValue_CeString:
		return a.CeString
	case *pb.CloudEventAttributeValue_CeUri:
		return a.CeUri
	case *pb.CloudEventAttributeValue_CeUriRef:
		return a.CeUriRef
	case *pb.CloudEventAttributeValue_CeTimestamp:
		return a.CeTimestamp.AsTime().String()
	case *pb.CloudEventAttributeValue_CeBoolean:
		return fmt.Sprint(a.CeBoolean)
	case *pb.CloudEventAttributeValue_CeInteger:
		return fmt.Sprint(a.CeInteger)
	case *pb.CloudEventAttributeValue_CeBytes:
		return fmt.Sprintf("%x", a.CeBytes)
	}
	return ""
}

func dataKind(raw *pb.CloudEvent) string {
	switch raw.GetData().(type) {
	case *pb.CloudEvent_BinaryData:
		return "binary_data"
	case *pb.CloudEvent_TextData:
		return "text_data"
	case *pb.CloudEvent_ProtoData:
		return "proto_data"
	}
	return "none"
}

// roundTripDiff lists every way the received protobuf differs from what sdk-go writes for the
// event it read from it (FromProto then ToProto): an attribute sdk-go would type differently,
// lose, or add, and the data encoding. Empty means we encoded exactly as sdk-go does.
func roundTripDiff(raw *pb.CloudEvent, ev *cloudevents.Event) []string {
	again, err := format.ToProto(ev)
	if err != nil {
		return []string{fmt.Sprintf("sdk-go cannot re-encode the event: %v", err)}
	}
	var diffs []string
	for name, v := range raw.GetAttributes() {
		w, ok := again.GetAttributes()[name]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: sent as %s %q, lost by sdk-go's FromProto", name, attrKind(v), attrText(v)))
		case attrKind(v) != attrKind(w) || attrText(v) != attrText(w):
			diffs = append(diffs, fmt.Sprintf("%s: sent as %s %q, sdk-go writes %s %q", name, attrKind(v), attrText(v), attrKind(w), attrText(w)))
		}
	}
	for name, w := range again.GetAttributes() {
		if _, ok := raw.GetAttributes()[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: not sent, sdk-go writes %s %q", name, attrKind(w), attrText(w)))
		}
	}
	if dataKind(raw) != dataKind(again) {
		diffs = append(diffs, fmt.Sprintf("data: sent as %s, sdk-go writes %s", dataKind(raw), dataKind(again)))
	} else if !bytes.Equal(raw.GetBinaryData(), again.GetBinaryData()) {
		diffs = append(diffs, "data: binary_data bytes change in sdk-go's round trip")
	}
	for _, f := range []struct{ name, a, b string }{
		{"id", raw.GetId(), again.GetId()},
		{"source", raw.GetSource(), again.GetSource()},
		{"specversion", raw.GetSpecVersion(), again.GetSpecVersion()},
		{"type", raw.GetType(), again.GetType()},
	} {
		if f.a != f.b {
			diffs = append(diffs, fmt.Sprintf("%s: sent %q, sdk-go writes %q", f.name, f.a, f.b))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// received decodes one protobuf CloudEvent as upstream does and builds its report. It returns
// the sdk-go event (nil if FromProto failed) and upstream's target ("" when upstream would drop
// the event as "unknown event target").
func received(raw *pb.CloudEvent) (map[string]any, *cloudevents.Event, string) {
	rep := map[string]any{"kind": "event"}
	attrs := map[string]string{}
	for name, v := range raw.GetAttributes() {
		attrs[name] = attrKind(v)
	}
	rep["attr_types"] = attrs
	rep["data_kind"] = dataKind(raw)
	ev, err := format.FromProto(raw)
	if err != nil {
		rep["kind"] = "dropped"
		rep["reason"] = fmt.Sprintf("sdk-go FromProto: %v", err)
		return rep, nil, ""
	}
	target := eventTarget(ev)
	rep["type"] = ev.Type()
	rep["dataschema"] = ev.DataSchema()
	rep["target"] = target
	rep["source"] = ev.Source()
	rep["id"] = ev.ID()
	rep["subject"] = ev.Subject()
	rep["datacontenttype"] = ev.DataContentType()
	rep["resourceid"] = extString(ev, extResourceID)
	rep["eventid"] = extString(ev, extEventID)
	exts := map[string]any{}
	for k, v := range ev.Extensions() {
		exts[k] = fmt.Sprint(v)
	}
	rep["extensions"] = exts
	rep["roundtrip_diff"] = roundTripDiff(raw, ev)
	if target == "" {
		rep["kind"] = "dropped"
		rep["reason"] = fmt.Sprintf("unknown event target FromWire: dataschema %q", ev.DataSchema())
		return rep, ev, ""
	}
	payload, err := payloadFor(target, ev.Type())
	switch {
	case err != nil:
		rep["decode_error"] = err.Error()
	case payload != nil:
		if len(ev.Data()) == 0 {
			rep["decode_error"] = "no data"
		} else if err := decodeDataAs(ev, payload); err != nil {
			rep["decode_error"] = err.Error()
		} else if b, err := json.Marshal(payload); err != nil {
			rep["decode_error"] = err.Error()
		} else {
			rep["data"] = json.RawMessage(b)
		}
	}
	return rep, ev, target
}

// decodeDataAs is upstream's ev.event.DataAs(&payload), with numbers kept verbatim for objects.
func decodeDataAs(ev *cloudevents.Event, payload any) error {
	if _, ok := payload.(*object); ok {
		if ct := ev.DataContentType(); ct != "" && !strings.Contains(ct, "json") {
			return fmt.Errorf("data content type %q is not JSON", ct)
		}
		return decodeJSON(ev.Data(), payload)
	}
	return ev.DataAs(payload)
}
