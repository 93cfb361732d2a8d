package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// resourceKey is upstream's resources.ResourceKey.
type resourceKey struct {
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
}

// resourceSetChecksum is upstream's resource-set checksum: SHA-256 over the sorted strings
// "<Kind>/<Name>/<UID>" of a set of keys, concatenated; nil for an empty set.
func resourceSetChecksum(keys []resourceKey) []byte {
	set := map[resourceKey]struct{}{}
	for _, k := range keys {
		set[k] = struct{}{}
	}
	if len(set) == 0 {
		return nil
	}
	strs := make([]string, 0, len(set))
	for k := range set {
		strs = append(strs, fmt.Sprintf("%s/%s/%s", k.Kind, k.Name, k.UID))
	}
	sort.Strings(strs)
	h := sha256.New()
	for _, s := range strs {
		h.Write([]byte(s))
	}
	return h.Sum(nil)
}

// specChecksum is upstream's spec checksum: SHA-256 of encoding/json's Marshal of the object's
// spec as an unstructured map (a Secret's or ConfigMap's data), the key "destination" deleted.
func specChecksum(raw json.RawMessage) ([]byte, error) {
	var obj map[string]any
	if err := decodeJSON(raw, &obj); err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	kind, _ := obj["kind"].(string)
	field := "spec"
	if kind == "Secret" || kind == "ConfigMap" {
		field = "data"
	}
	v, ok := obj[field]
	if !ok {
		if kind != "ConfigMap" {
			return nil, fmt.Errorf("%s has no %s", kind, field)
		}
		v = map[string]any{}
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s of %s is not an object", field, kind)
	}
	delete(m, "destination")
	b, err := json.Marshal(unstructuredNumbers(m))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// unstructuredNumbers turns json.Numbers into what Kubernetes' unstructured JSON decoder makes
// of them, int64 when integral and float64 otherwise, so encoding/json formats them itself.
func unstructuredNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = unstructuredNumbers(e)
		}
	case []any:
		for i, e := range t {
			t[i] = unstructuredNumbers(e)
		}
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		if f, err := t.Float64(); err == nil {
			return f
		}
	}
	return v
}

func hexOrNil(b []byte) any {
	if b == nil {
		return nil
	}
	return hex.EncodeToString(b)
}
